// The sm90 attention forward as the template instantiates it: which mainloop, epilogue and kernel shell a config
// picks (AttnFwdTraits), and the body of the extern "C" launcher (plain argument struct -> Params and TMA
// descriptors -> launch on the caller's stream, every CUDA return code checked).
#pragma once

#include "bsk/common/block_layout.hpp"
#include "bsk/common/launch.hpp"
#include "bsk/common/tile_scheduler.hpp"
#include "bsk/sm90/base.hpp"
#include "bsk/sm90/epilogue.hpp"
#include "bsk/sm90/kernel_dual.hpp"
#include "bsk/sm90/kernel_single.hpp"
#include "bsk/sm90/mainloop_single.hpp"
#include "bsk/sm90/mainloop_ws.hpp"
#include "bsk/sm90/split_kv.hpp"
#include "bsk/sm90/tile_claim.hpp"

namespace bsk {

// TileM 128: two MMA warpgroups and a producer warp (cooperative, or persistent ping-pong); TileM 64: one
// warpgroup per CTA that loads for itself (BsrMainloopSingle), or (Dual) Streams independent 64-row streams per
// persistent CTA (BsrKernelDual). SplitKV (two-warpgroup shells only): pieces of long rows write to a workspace,
// which a second kernel, launched right after, merges into O and LSE (split_kv.hpp).
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, int BlockM, int BlockN,
          bool Persistent, int CtasPerSm, bool Dual = false, bool SplitKV = false, int Streams = 2,
          int MmaRegisters = 0, int LoadRegisters = 0, bool ClaimTiles = false>
struct AttnFwdTraits {
  static_assert(!Dual || (TileM == 64 && QStages == 1), "dual: one 64-row tile and one Q slot per stream");
  static_assert(!Dual || (MmaRegisters > 0 && LoadRegisters > 0), "dual: the config's setmaxnreg split");
  static_assert(!SplitKV || (TileM == 128 && !Dual), "split-KV: the two-warpgroup shells");
  static_assert(!ClaimTiles || (Persistent && !Dual), "tiles are claimed in the persistent two-warpgroup shell");
  static constexpr bool kSplit = SplitKV;
  static constexpr bool kClaim = ClaimTiles;
  using StaticScheduler = std::conditional_t<SplitKV, BsrSplitTileScheduler, BsrTileScheduler>;
  using Scheduler = std::conditional_t<ClaimTiles, BsrClaimScheduler<StaticScheduler>, StaticScheduler>;
  static constexpr bool kSingle = TileM == 64 && !Dual;
  static constexpr bool kDual = Dual;
  static constexpr int kStreams = Streams;
  using Mainloop = std::conditional_t<
      kSingle, BsrMainloopSingle<Element, HeadDim, TileN, Stages, BlockM, BlockN>,
      BsrMainloop<Element, HeadDim, TileM, TileN, Stages, QStages, BlockM, BlockN, Persistent || Dual, Dual>>;
  using Epilogue = std::conditional_t<SplitKV, BsrSplitEpilogue<Element, HeadDim, BlockM>, BsrEpilogue<Element, HeadDim>>;
  using Kernel = std::conditional_t<
      kSingle, BsrKernelSingle<Mainloop, Epilogue, CtasPerSm>,
      std::conditional_t<Dual, BsrKernelDual<Mainloop, Epilogue, Streams, MmaRegisters, LoadRegisters>, std::conditional_t<
          Persistent,
          fmha_k::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, Scheduler,
                                               fmha_k::Option<fmha_k::Tag::kLoadsQSeparately, cute::true_type>>,
          fmha_k::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, Scheduler>>>>;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kTileM = TileM;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr bool kPersistent = Persistent;
};

template <class Traits, class Named>
int attn_fwd_smem_bytes() {
  if constexpr (Traits::kClaim) return Traits::Scheduler::smem_bytes(int(Named::SharedStorageSize));
  return int(Named::SharedStorageSize);
}

template <class Traits, class Args>
auto epilogue_arguments(ProblemShape const& ps, Args const& a, StrideQKV const& dO, StrideLSE const& dLSE) {
  using Epilogue = typename Traits::Epilogue;
  using Element = typename Traits::Mainloop::Element;
  if constexpr (Traits::kSplit) {
    return Epilogue::to_underlying_arguments(
        ps, typename Epilogue::Arguments{static_cast<Element*>(a.o), dO, a.lse, dLSE, a.ws_o, a.ws_lse, a.n_pieces});
  } else {
    return Epilogue::to_underlying_arguments(ps, typename Epilogue::Arguments{static_cast<Element*>(a.o), dO, a.lse, dLSE});
  }
}

template <class Traits, class Named, class Args>
int attn_fwd_launch(Args const& a, cudaStream_t stream) {
  using Mainloop = typename Traits::Mainloop;
  using Element = typename Mainloop::Element;

  if (a.head_dim != Traits::kHeadDim) return kErrBadHeadDim;
  if (a.batch <= 0 || a.heads <= 0 || a.heads_kv <= 0 || a.heads % a.heads_kv != 0 || a.seq_q <= 0 ||
      a.seq_k <= 0 || a.n_qblocks <= 0 || (long long)a.n_qblocks * Traits::kBlockM < a.seq_q ||
      (a.layout_heads != 1 && a.layout_heads != a.heads))
    return kErrBadShape;
  // The device keeps query tile ids and positions in int32: tiles of all (batch, head)s, and the element rule's
  // offsets (within seq_q + seq_k of a tile's first key, padded rows of the last query block included).
  if ((long long)a.n_qblocks * (Traits::kBlockM / Traits::kTileM) * a.heads * a.batch > kIntMax ||
      (long long)a.seq_q + a.seq_k + Traits::kBlockM > kIntMax)
    return kErrBadShape;
  long long qkvo_strides[] = {a.q_stride_b, a.q_stride_h, a.q_stride_s, a.k_stride_b, a.k_stride_h,
                              a.k_stride_s, a.v_stride_b, a.v_stride_h, a.v_stride_s, a.o_stride_b,
                              a.o_stride_h, a.o_stride_s};
  for (long long s : qkvo_strides)
    if (!tma_stride_ok(s, sizeof(Element))) return kErrStrideRange;
  if (!fits_int(a.lse_stride_b) || !fits_int(a.lse_stride_h)) return kErrStrideRange;
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.o) || !aligned16(a.row_sched))
    return kErrMisaligned;

  if constexpr (Traits::kClaim) {
    if (a.counter == nullptr) return kErrBadShape;  // the claiming scheduler's tile counter
  }
  // split-KV: n_pieces schedule entries per layout head are pieces (split_k for each split row), each a workspace
  // tile of BlockM rows
  if constexpr (Traits::kSplit) {
    if (a.n_pieces < 1 || a.n_pieces > a.n_qblocks || a.split_k < 1 || a.n_pieces % a.split_k != 0 ||
        a.ws_o == nullptr || a.ws_lse == nullptr)
      return kErrBadShape;
    if (!aligned16(a.ws_o) || !aligned16(a.ws_lse)) return kErrMisaligned;
  }

  ProblemShape ps{a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim};
  StrideQKV dQ{a.q_stride_s, _1{}, make_tuple(int64_t(a.q_stride_b), int64_t(a.q_stride_h))};
  StrideQKV dK{a.k_stride_s, _1{}, make_tuple(int64_t(a.k_stride_b), int64_t(a.k_stride_h))};
  StrideQKV dV{a.v_stride_s, _1{}, make_tuple(int64_t(a.v_stride_b), int64_t(a.v_stride_h))};
  StrideQKV dO{a.o_stride_s, _1{}, make_tuple(int64_t(a.o_stride_b), int64_t(a.o_stride_h))};
  StrideLSE dLSE{_1{}, make_tuple(int(a.lse_stride_b), int(a.lse_stride_h))};

  // A window wider than the sequences is unbounded; clamping it keeps the kernel's int32 mask arithmetic
  // (query position minus window_left, plus window_right) from overflowing for windows near 2^31.
  int window_left = a.window_left < 0 ? -1 : std::min(a.window_left, a.seq_k);
  int window_right = a.window_right < 0 ? -1 : std::min(a.window_right, a.seq_q);
  BsrParams bsr{a.col_idx, a.block_kind, a.layout_heads, a.col_stride,
                a.heads_kv, a.heads / a.heads_kv, window_left, window_right};

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return int(err);
  int l2 = 0;
  err = device_l2_bytes(device, l2);
  if (err != cudaSuccess) return int(err);
  // K and V of one (batch, head); heads that share a K/V head (GQA) count their share
  long long kv_bytes = 2LL * a.seq_k * a.head_dim * (long long)sizeof(Element) * a.heads_kv / a.heads;
  int group = head_group(a.batch * a.heads, kv_bytes, l2);

  typename Named::Params params{
      ps,
      Mainloop::to_underlying_arguments(
          ps,
          typename Mainloop::Arguments{static_cast<const Element*>(a.q), dQ, static_cast<const Element*>(a.k), dK,
                                       static_cast<const Element*>(a.v), dV, a.scale, bsr},
          nullptr),
      epilogue_arguments<Traits>(ps, a, dO, dLSE),
      BsrTileScheduler::make(a.batch, a.heads, a.n_qblocks, Traits::kBlockM / Traits::kTileM, a.layout_heads,
                             reinterpret_cast<const int4*>(a.row_sched), Traits::kPersistent, a.sm_count, a.rank_major,
                             group)};
  if constexpr (Traits::kDual) {
    // persistent: one CTA per SM at most, kStreams tiles (streams) per CTA at a time
    int sms = a.sm_count > 0 ? a.sm_count : 132;
    int s = Traits::kStreams;
    params.tile_scheduler.grid = std::min((params.tile_scheduler.num_tiles + s - 1) / s, sms);
  }

  if constexpr (Traits::kClaim) {
    // the tile counter (ABI field counter: 4 bytes the op allocates per call), zeroed on the launch's stream
    params.tile_scheduler.counter = a.counter;
    params.tile_scheduler.ring_offset = Traits::Scheduler::ring_offset(int(Named::SharedStorageSize));
    err = cudaMemsetAsync(a.counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return int(err);
  }

  int smem = attn_fwd_smem_bytes<Traits, Named>();
  err = allow_dynamic_smem(cutlass::device_kernel<Named>, device, smem);
  if (err != cudaSuccess) return int(err);
  dim3 grid = BsrTileScheduler::get_grid_shape(params.tile_scheduler);
  dim3 block(Named::MaxThreadsPerBlock, 1, 1);
  cutlass::device_kernel<Named><<<grid, block, smem, stream>>>(params);
  err = cudaGetLastError();
  if constexpr (Traits::kSplit) {
    if (err != cudaSuccess) return int(err);
    return split_combine_launch<Element, Traits::kHeadDim, Traits::kBlockM>(a, stream);  // merge the pieces
  }
  return int(err);
}

}  // namespace bsk
