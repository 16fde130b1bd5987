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
// the epilogue's per-warpgroup syncs (one id per warpgroup of the CTA: four), the softmax turns of the two MMA
// warpgroups (two ids).
enum : uint32_t { kBarEpilogue = 0, kBarSoftmaxTurn = 4 };

// Q K V O, (S D (B H)): sequence stride, unit head-dim stride, (batch, head) strides, in elements. 64-bit: a
// (1, 16, 1M, 128) tensor's batch stride is 2^31. Only the host reads them (into TMA descriptors, which take
// 64-bit byte strides); the device addresses Q/K/V/O by TMA coordinates, so its code does not depend on them.
using StrideQKV = cute::tuple<int64_t, _1, cute::tuple<int64_t, int64_t>>;
// LSE (B, H, Sq) float, (batch, head) strides: 32-bit, read on the device. The op allocates LSE contiguous, so
// they reach 2^31 only once H * Sq does, when Q alone would take 2^31 * head_dim * 2 bytes (>= 256 GiB).
using StrideLSE = cute::tuple<_1, cute::tuple<int, int>>;
using ProblemShape = cute::tuple<int, int, int, int, int>;  // B, H, Sq, Sk, D

}  // namespace bsk
