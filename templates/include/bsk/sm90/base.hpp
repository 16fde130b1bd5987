// What every sm90 piece of the attention forward builds on: CUTLASS example 88 (shipped in the nvidia-cutlass
// wheel; its kernel shell, pipelines, TMA loads and online-softmax collective come in by #include, not by copy),
// the problem and stride types all pieces agree on, and the named-barrier ids they share out.
#pragma once

#include <cmath>
#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/fast_math.h"
#include "cute/tensor.hpp"

#include "collective/fmha_collective_tma.hpp"
#include "collective/fmha_collective_tma_warpspecialized.hpp"
#include "collective/fmha_epilogue.hpp"
#include "collective/fmha_fusion.hpp"
#include "kernel/fmha_kernel_tma_warpspecialized.hpp"
#include "kernel/fmha_options.hpp"

namespace bsk {

using namespace cute;
namespace fmha_c = cutlass::fmha::collective;
namespace fmha_k = cutlass::fmha::kernel;

// Named barriers, as CUTLASS user ids (NamedBarrier::sync/arrive add the reserved count; hardware has 16):
// the epilogue's per-warpgroup syncs (two ids), the softmax turns of the two MMA warpgroups (two ids).
enum : uint32_t { kBarEpilogue = 0, kBarSoftmaxTurn = 2 };

// Q K D (B H): sequence stride, unit head-dim stride, (batch, head) strides.
using StrideQKV = cute::tuple<int, _1, cute::tuple<int, int>>;
using ProblemShape = cute::tuple<int, int, int, int, int>;  // B, H, Sq, Sk, D

}  // namespace bsk
