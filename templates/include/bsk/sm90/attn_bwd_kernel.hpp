// BlackwellSparseK backward (sm_90a): kernel type and the extern "C" launcher body.
//
// Kernel = example 88's warp-specialized shell (FmhaKernelTmaWarpSpecialized: producer warpgroup with a loader
// warp and a dQ reducer warp, two MMA warpgroups, register reallocation) around bsk::bwd::BwdMainloop, example
// 88's dK/dV epilogue (TMA stores, clipped at seq_k), and BwdTileScheduler (one CTA per 128-key tile, heaviest
// key blocks first). The launcher takes the plain argument struct rendered from AttnBwdConfig.abi and runs the
// whole backward on the caller's stream: prep (delta, LSE2, zero the fp32 dQ accumulator, or the deterministic
// kernel's turn counters), the main kernel, and the dQ convert.
#pragma once

#include "bsk/common/tma_driver.hpp"  // first: CUTLASS's TMA encoding without a driver lookup per descriptor

#include <algorithm>
#include <utility>

#include "cutlass/device_kernel.h"
#include "collective/fmha_epilogue_bwd.hpp"
#include "kernel/fmha_kernel_tma_warpspecialized.hpp"

#include "bsk/sm90/attn_bwd_mainloop.hpp"
#include "bsk/sm90/attn_bwd_prep.hpp"

namespace bsk::bwd {

namespace fmha_k = cutlass::fmha::kernel;

template <class Element_, int HeadDim, int BlockM, int BlockN, bool Deterministic, bool Pairs = false>
struct AttnBwdTraits {
  using Element = Element_;
  using Mainloop = BwdMainloop<Element, HeadDim, BlockM, BlockN, Deterministic, Pairs>;
  using Epilogue = fmha_c::FmhaBwdEpilogueKV<Element, float, typename Mainloop::TileShapePV>;
  using Kernel = fmha_k::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, BwdTileScheduler>;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kTilesPerCol = BlockN / Mainloop::kTileK;
  static constexpr bool kDeterministic = Deterministic;

  // One CTA per tile (not persistent): the epilogue's buffers share shared memory with the mainloop's, from
  // offset 0. The MMA warpgroups meet at a named barrier once all their GEMMs are done (end of compute()), so
  // only the dQ reducer may still be reading shared memory (its dQ buffers) when an epilogue starts: the
  // epilogue buffers must end before them.
  using MainStorage = typename Mainloop::SharedStorage;
  static_assert(sizeof(typename Epilogue::TensorStorage) * Mainloop::NumMmaWarpGroups <=
                    sizeof(std::declval<MainStorage&>().smem_k) + sizeof(std::declval<MainStorage&>().smem_ds) +
                        sizeof(std::declval<MainStorage&>().smem_q),
                "dK/dV epilogue buffers must not reach the dQ buffers");
};

template <class Named>
int attn_bwd_smem_bytes() {
  return int(Named::SharedStorageSize);
}

template <class Traits, class Named, class Args>
int attn_bwd_launch(Args const& a, cudaStream_t stream) {
  using Mainloop = typename Traits::Mainloop;
  using Epilogue = typename Traits::Epilogue;
  using Element = typename Traits::Element;
  using StrideQKV = typename Mainloop::StrideQKV;

  if (a.head_dim != Traits::kHeadDim) return kErrBadHeadDim;
  if (a.batch <= 0 || a.heads <= 0 || a.heads_kv <= 0 || a.heads % a.heads_kv != 0 || a.seq_q <= 0 ||
      a.seq_k <= 0 || a.n_kblocks <= 0 || (long long)a.n_kblocks * Traits::kBlockN < a.seq_k ||
      (a.layout_heads != 1 && a.layout_heads != a.heads_kv) || a.head_group < 1 ||
      (a.batch * a.heads_kv) % a.head_group != 0 ||
      (Traits::kDeterministic && (a.t_rank == nullptr || a.dq_sem == nullptr)))
    return kErrBadShape;
  long long strides[] = {a.q_stride_b,  a.q_stride_h,  a.q_stride_s,  a.k_stride_b,   a.k_stride_h,
                         a.k_stride_s,  a.v_stride_b,  a.v_stride_h,  a.v_stride_s,   a.o_stride_b,
                         a.o_stride_h,  a.o_stride_s,  a.do_stride_b, a.do_stride_h,  a.do_stride_s,
                         a.dq_stride_b, a.dq_stride_h, a.dq_stride_s, a.dk_stride_b,  a.dk_stride_h,
                         a.dk_stride_s, a.dv_stride_b, a.dv_stride_h, a.dv_stride_s,  a.lse_stride_b,
                         a.lse_stride_h, a.ws_stride_b, a.ws_stride_h};
  for (long long s : strides)
    if (!fits_int(s)) return kErrStrideRange;
  // The fp32 dQ accumulator is (B, H, Sq, D) contiguous.
  long long dq_acc_b = (long long)a.heads * a.seq_q * a.head_dim;
  if (!fits_int(dq_acc_b)) return kErrStrideRange;

  ProblemShape ps{a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim};
  auto qkv = [](long long sb, long long sh, long long ss) {
    return StrideQKV{int(ss), _1{}, make_tuple(int(sb), int(sh))};
  };
  int n_qtiles = (a.seq_q + Mainloop::kTileQ - 1) / Mainloop::kTileQ;
  int nq_head = (a.seq_q + Traits::kBlockM - 1) / Traits::kBlockM;
  TLayoutParams lay{a.t_q_idx, a.t_kind, a.layout_heads, a.col_stride, a.heads_kv, a.heads / a.heads_kv,
                    nq_head, a.window_left, a.window_right,
                    Traits::kDeterministic ? a.t_rank : nullptr, Traits::kDeterministic ? a.dq_sem : nullptr,
                    n_qtiles};
  typename Mainloop::Arguments margs{
      static_cast<const Element*>(a.q),  qkv(a.q_stride_b, a.q_stride_h, a.q_stride_s),
      static_cast<const Element*>(a.k),  qkv(a.k_stride_b, a.k_stride_h, a.k_stride_s),
      static_cast<const Element*>(a.v),  qkv(a.v_stride_b, a.v_stride_h, a.v_stride_s),
      static_cast<const Element*>(a.do_), qkv(a.do_stride_b, a.do_stride_h, a.do_stride_s),
      a.lse2, a.delta, make_tuple(int(a.ws_stride_b), int(a.ws_stride_h)),
      a.dq_acc, qkv(dq_acc_b, (long long)a.seq_q * a.head_dim, a.head_dim),
      a.scale, lay};
  // dK/dV per K/V head (B, Hkv, Sk, D): one CTA sums a key tile's over the query heads of its group.
  ProblemShape ps_kv{a.batch, a.heads_kv, a.seq_q, a.seq_k, a.head_dim};
  typename Epilogue::Arguments eargs{
      static_cast<Element*>(a.dk), make_tuple(int(a.dk_stride_b), int(a.dk_stride_h), int(a.dk_stride_s), _1{}),
      static_cast<Element*>(a.dv), make_tuple(int(a.dv_stride_b), int(a.dv_stride_h), int(a.dv_stride_s), _1{})};

  // Prep first: the GPU runs it while the host encodes the main kernel's TMA descriptors.
  long long rows = (long long)a.batch * a.heads * a.seq_q;
  PrepParams pp{a.o, a.do_, a.lse, a.glse, a.lse2, a.delta, a.dq_acc,
                Traits::kDeterministic ? a.dq_sem : nullptr, n_qtiles,
                a.o_stride_b, a.o_stride_h, a.o_stride_s, a.do_stride_b, a.do_stride_h, a.do_stride_s,
                a.lse_stride_b, a.lse_stride_h, a.ws_stride_b, a.ws_stride_h,
                a.heads, a.seq_q, rows};
  constexpr int kPrepRows = 256 / (Traits::kHeadDim / 8);  // rows per prep block
  attn_bwd_prep_kernel<Element, Traits::kHeadDim>
      <<<dim3(unsigned((rows + kPrepRows - 1) / kPrepRows)), dim3(256), 0, stream>>>(pp);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return int(err);

  int device = 0;
  err = cudaGetDevice(&device);
  if (err != cudaSuccess) return int(err);
  // Tile order: groups of head_group (batch, K/V head)s (the caller's choice, attention_bwd.tile_group: those
  // whose Q and dO fit in half of L2), key blocks in schedule order, the group's heads interleaved. The
  // deterministic kernel's turns (t_rank, attention_bwd.det_ranks) were computed for this order.
  int group = a.head_group;

  typename Named::Params params{
      ps, Mainloop::to_underlying_arguments(ps, margs, nullptr), Epilogue::to_underlying_arguments(ps_kv, eargs),
      BwdTileScheduler::make(a.batch, a.heads_kv, a.n_kblocks, Traits::kTilesPerCol, a.layout_heads,
                             reinterpret_cast<const int4*>(a.t_sched), group)};

  int smem = int(Named::SharedStorageSize);
  err = allow_dynamic_smem(cutlass::device_kernel<Named>, device, smem);
  if (err != cudaSuccess) return int(err);

  dim3 grid = BwdTileScheduler::get_grid_shape(params.tile_scheduler);
  dim3 block(Named::MaxThreadsPerBlock, 1, 1);
  cutlass::device_kernel<Named><<<grid, block, smem, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) return int(err);

  ConvertParams cp{a.dq_acc, a.dq, a.dq_stride_b, a.dq_stride_h, a.dq_stride_s,
                   a.heads, a.seq_q, a.head_dim, rows * a.head_dim / 8,
                   Traits::kDeterministic ? a.dq_sem : nullptr, n_qtiles};
  attn_bwd_convert_kernel<Element><<<dim3(unsigned((cp.chunks + 255) / 256)), dim3(256), 0, stream>>>(cp);
  return int(cudaGetLastError());
}

}  // namespace bsk::bwd
