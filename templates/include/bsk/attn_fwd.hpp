// BlackwellSparseK: block-sparse attention forward for Hopper (sm_90a).
//
// The kernel shell (warp-specialized producer / two MMA warpgroups, register reallocation, pipelines) and the
// online-softmax collective come from CUTLASS example 88 (shipped in the nvidia-cutlass wheel) by #include.
// What is ours:
//   * BsrMainloop: the producer walks the row's col_idx[start .. end) and TMA-loads only those K/V tiles
//     (GQA/MQA through the K/V head index); the consumers run WGMMA QK^T, mask only blocks whose block_kind says
//     so (sequence end, element rule: causal / window edge), online softmax, WGMMA PV with P from registers, the
//     softmax of tile j under the PV GEMM of tile j-1;
//     rows with no blocks write O = 0 and LSE = -inf. BsrMainloopSingle: one warpgroup per CTA, loads its own.
//   * BsrEpilogue: O through shared memory and one TMA store per warpgroup that nobody waits on until the buffer
//     is needed again; LSE straight to global.
//   * BsrTileScheduler: uniform rows m fastest, so concurrent CTAs share a head's K/V in L2; rows of unequal length
//     heaviest first across a group of heads whose K/V fits in L2, group after group; one tile per CTA
//     (cooperative) or persistent (ping-pong). Each tile reads one 16-byte entry of the layout's row schedule
//     (row, start, end, first block's column | kind << 24), the only index load before the row's first K load.
//   * attn_fwd_launch: the extern "C" launcher body (plain argument struct -> Params, TMA descriptors, launch
//     on the caller's stream, every CUDA return code checked).
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

#ifdef BSK_TRACE
// Dev timeline (scripts/exp_trace.py; build with BSK_NVCC_FLAGS=-DBSK_TRACE): SM clock at fixed points of each
// row, per CTA (first 132) and row (first kTraceRows); roles count their own rows.
constexpr int kTraceCtas = 132, kTraceRows = 24, kTraceSlots = 16;
__device__ long long bsk_trace_buf[kTraceCtas][kTraceRows][kTraceSlots];
__device__ int bsk_trace_cnt[kTraceCtas][4];
CUTLASS_DEVICE void trace(int role, int slot, bool last = false) {
  int cta = int(blockIdx.x);
  if (cta >= kTraceCtas) return;
  int r = bsk_trace_cnt[cta][role];
  if (r < kTraceRows) bsk_trace_buf[cta][r][slot] = clock64();
  if (last) bsk_trace_cnt[cta][role] = r + 1;
}
// Per CTA: globaltimer (ns) and clock64 when the kernel starts (thread 0) and when each MMA warpgroup leaves
// (its first thread): where a launch's time goes outside the rows.
__device__ long long bsk_trace_span[kTraceCtas][6];
CUTLASS_DEVICE void trace_span(int at) {
  if (blockIdx.x >= kTraceCtas) return;
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  bsk_trace_span[blockIdx.x][at] = t;
  bsk_trace_span[blockIdx.x][at + 1] = clock64();
}
extern "C" int bsk_trace_span_dump(long long* out) {
  return int(cudaMemcpyFromSymbol(out, bsk_trace_span, sizeof(bsk_trace_span)));
}
extern "C" int bsk_trace_dump(long long* out, int* dims) {
  dims[0] = kTraceCtas; dims[1] = kTraceRows; dims[2] = kTraceSlots;
  cudaError_t e = cudaMemcpyFromSymbol(out, bsk_trace_buf, sizeof(bsk_trace_buf));
  return int(e);
}
// Per tile of one row per CTA (the CTA's second row; first 64 tiles), per MMA warpgroup: QK issued, QK done,
// P written (softmax and the previous PV done).
constexpr int kTraceTiles = 64;
__device__ long long bsk_loop_buf[kTraceCtas][2][kTraceTiles][3];
extern "C" int bsk_trace_reset() {
  static long long zb[kTraceCtas][kTraceRows][kTraceSlots];
  static long long zl[kTraceCtas][2][kTraceTiles][3];
  static int zc[kTraceCtas][4];
  cudaError_t e = cudaMemcpyToSymbol(bsk_trace_buf, zb, sizeof(zb));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(bsk_loop_buf, zl, sizeof(zl));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(bsk_trace_cnt, zc, sizeof(zc));
  return int(e);
}
#define BSK_TR(cond, role, slot, last) do { if (cond) trace(role, slot, last); } while (0)
CUTLASS_DEVICE void trace_loop(int wg, int row, int j, int at) {
  if (blockIdx.x < kTraceCtas && row == 1 && j < kTraceTiles) bsk_loop_buf[blockIdx.x][wg][j][at] = clock64();
}
extern "C" int bsk_trace_loop_dump(long long* out) {
  return int(cudaMemcpyFromSymbol(out, bsk_loop_buf, sizeof(bsk_loop_buf)));
}
#define BSK_TL(cond, wg, row, j, at) do { if (cond) trace_loop(wg, row, j, at); } while (0)
#define BSK_TR_SPAN(cond, at) do { if (cond) trace_span(at); } while (0)
#else
#define BSK_TL(cond, wg, row, j, at) do { } while (0)
#define BSK_TR_SPAN(cond, at) do { } while (0)
#define BSK_TR(cond, role, slot, last) do { } while (0)
#endif

// Block-kind bits, as BlockSparseLayout writes them.
enum : uint8_t { kBlockFull = 0, kBlockBounds = 1, kBlockRule = 2 };

// Launcher return codes beyond cudaError_t's range: invalid arguments caught before any CUDA call.
enum : int { kErrBadHeadDim = 10001, kErrStrideRange = 10002, kErrBadShape = 10003 };

// Q K D (B H): sequence stride, unit head-dim stride, (batch, head) strides.
using StrideQKV = cute::tuple<int, _1, cute::tuple<int, int>>;
using ProblemShape = cute::tuple<int, int, int, int, int>;  // B, H, Sq, Sk, D

// What the kernel needs of the sparsity layout and the element rule.
struct BsrParams {
  const int* col_idx;
  const uint8_t* block_kind;
  int layout_heads;
  int col_stride;
  int heads_kv;
  int group;          // query heads per K/V head
  int window_left;    // element rule, -1 = unbounded
  int window_right;
};

// Reads one query-block row's column indices and kinds 32 at a time (one coalesced load per warp per 32
// blocks), handing them out with warp shuffles: the index load leaves the per-tile critical path. Block 0's column
// and kind come from the row's schedule entry (first: column | kind << 24), so neither the row's first K load nor
// its first softmax waits for the chunk.
struct BsrRowCursor {
  const int* cols;
  const uint8_t* kinds;
  int count;
  int first;
  int chunk_col = 0;
  int chunk_kind = 0;

  CUTLASS_DEVICE BsrRowCursor(const int* cols_, const uint8_t* kinds_, int count_, int first_)
      : cols(cols_), kinds(kinds_), count(count_), first(first_) {}

  // Every lane of the warp must call this with the same block index, in increasing order.
  CUTLASS_DEVICE void at(int blk, int& col, int& kind) {
    int lane = threadIdx.x % 32;
    if (blk % 32 == 0) {
      int i = blk + lane;
      chunk_col = i < count ? __ldg(cols + i) : 0;
      chunk_kind = (kinds != nullptr && i < count) ? int(__ldg(kinds + i)) : 0;
    }
    if (blk == 0) {
      col = first & 0xffffff;
      kind = int(unsigned(first) >> 24);
      return;
    }
    col = __shfl_sync(0xffffffffu, chunk_col, blk % 32);
    kind = __shfl_sync(0xffffffffu, chunk_kind, blk % 32);
  }
};

// Online-softmax step for every tile after the first (the first tile and the tail use example 88's
// CollectiveSoftmax): new row max (thread-local, then across the threads that share a row), the running sum
// rescaled by corr = 2^((old max - new max) * scale), P = 2^(s * scale - max * scale). Returns whether O must be
// rescaled by corr (rescale_o), which the caller does once the PV GEMM in flight has completed. Modes:
// * kEager: every tile takes its new max; P written over S.
// * kLazy: a warp rescales only when one of its rows' max has grown by more than 2^kLazyLog2 since its last
//   rescale; otherwise it keeps the stale max, so P <= 2^kLazyLog2 (fine in 16 bits) and the tail normalizes with
//   the same max: exact, minus most of the O rescales (with random data, all after the first few tiles). P over S.
// * kSpec: P = 2^(s * scale - stale max * scale) straight away (no max first: the exp2 stream starts when QK is
//   done), written as Element into p (S kept); a warp whose rows' partial sums stay <= kSpecMaxSum (so every
//   P <= 2^12; the test also fails for inf/NaN) keeps it. Otherwise (and for rows with no finite max yet) the
//   eager step runs from S into p. Exact like kLazy; no max, shuffles or O rescale on the common path.
// exp_done() runs once the common path's exp2 stream has been issued (kSpec: before its sums are checked; the
// other modes: at the end).
enum class SoftmaxMode { kEager, kLazy, kSpec };
constexpr float kLazyLog2 = 8.f;
constexpr float kSpecMaxSum = 4096.f;  // 2^12
template <SoftmaxMode kMode, class AccQK, class TiledMmaQK, class State, class Corr, class PFrag, class ExpDone>
CUTLASS_DEVICE bool softmax_rescale_step(AccQK& acc_qk, TiledMmaQK const& tiled_mma_qk, State& state,
                                         float scale_log2, Corr& corr, PFrag& p_frag, ExpDone&& exp_done) {
  Tensor s = make_tensor(acc_qk.data(), fmha_c::layout_acc_mn(tiled_mma_qk, acc_qk.layout()));
  Tensor p = make_tensor(p_frag.data(), s.layout());  // kSpec's destination (same element order as S)
  auto red = fmha_c::reduction_target_n(tiled_mma_qk);
  constexpr int kRanks = decltype(rank(red))::value;
  constexpr int kRows = decltype(size<0>(s))::value;
  auto& row_max = get<0>(state);
  auto& row_sum = get<1>(state);
  auto tile_max = [&](int i) {
    float mx = row_max(i);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(s); ++j) mx = fmaxf(mx, s(i, j));
    for_each(make_seq<kRanks>{}, [&](auto r) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 1; k < shape<r>(red); k *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, stride<r>(red) * k));
    });
    return mx;
  };
  auto rescale = [&](int i, float mx) {  // a row masked so far (max -inf) keeps P = 0, O = 0
    float prev = row_max(i);
    row_max(i) = mx;
    corr[i] = ::exp2f((prev - (mx == -INFINITY ? 0.f : mx)) * scale_log2);
    row_sum(i) *= corr[i];
  };
  // Row i's P for the current row max; returns the row's partial sum (not yet added to row_sum).
  auto exponentiate = [&](int i) {
    float sub = (row_max(i) == -INFINITY ? 0.f : row_max(i)) * scale_log2;
    float sum = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(s); ++j) {
      float e = ::exp2f(fmaf(s(i, j), scale_log2, -sub));
      if constexpr (kMode == SoftmaxMode::kSpec) p(i, j) = static_cast<typename PFrag::value_type>(e);
      else s(i, j) = e;
      sum += e;
    }
    return sum;
  };
  if constexpr (kMode == SoftmaxMode::kSpec) {
    float sum[kRows];
    bool keep = true;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) sum[i] = exponentiate(i);
    exp_done();
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) keep &= sum[i] <= kSpecMaxSum && row_max(i) != -INFINITY;
    bool redo = !__all_sync(0xffffffffu, keep);
    if (redo) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRows; ++i) rescale(i, tile_max(i));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRows; ++i) sum[i] = exponentiate(i);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) row_sum(i) += sum[i];
    return redo;
  } else if constexpr (kMode == SoftmaxMode::kLazy) {
    float mx[kRows];
    bool grow = false;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      mx[i] = tile_max(i);
      grow |= (mx[i] - row_max(i)) * scale_log2 > kLazyLog2;  // -inf -> finite counts as growth
    }
    bool any = __any_sync(0xffffffffu, grow);
    if (any) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRows; ++i) rescale(i, mx[i]);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) row_sum(i) += exponentiate(i);
    exp_done();
    return any;
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      rescale(i, tile_max(i));
      row_sum(i) += exponentiate(i);
    }
    exp_done();
    return true;
  }
}

// O (rows x cols of the PV accumulator) *= corr per row: the O half of softmax_rescale_step, applied once the PV
// GEMM that accumulates into O has completed.
template <class AccPV, class TiledMmaPV, class Corr>
CUTLASS_DEVICE void rescale_o(AccPV& acc_pv, TiledMmaPV const& tiled_mma_pv, Corr const& corr) {
  Tensor o = make_tensor(acc_pv.data(), fmha_c::layout_acc_mn(tiled_mma_pv, acc_pv.layout()));
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size<0>(o); ++i) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(o); ++j) o(i, j) *= corr[i];
  }
}

// What both mainloops share: Params with the layout, K/V descriptors over the K/V heads (GQA), the row lookup
// and the element mask.
template <class Base, int TileM, int BlockM>
struct BsrCommon {
  using Element = typename Base::Element;
  using CollectiveMmaQK = typename Base::CollectiveMmaQK;
  using CollectiveMmaPV = typename Base::CollectiveMmaPV;
  using TiledMmaQK = typename Base::TiledMmaQK;

  struct Arguments {
    const Element* ptr_Q; StrideQKV dQ;
    const Element* ptr_K; StrideQKV dK;
    const Element* ptr_V; StrideQKV dV;
    float scale;
    BsrParams bsr;
  };

  struct Params : Base::Params {
    BsrParams bsr;
  };

  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args, void* /*workspace*/) {
    int B = get<0>(ps), H = get<1>(ps), Sq = get<2>(ps), Sk = get<3>(ps), D = get<4>(ps);
    // Q descriptor over (Sq, D, (B, H)); K and V descriptors over the K/V heads (GQA: fewer of them).
    auto shape_q = make_shape(Sq, Sk, D, make_shape(B, H));
    auto shape_kv = make_shape(Sq, Sk, D, make_shape(B, args.bsr.heads_kv));
    auto p_q = CollectiveMmaQK::to_underlying_arguments(
        shape_q, typename CollectiveMmaQK::Arguments{args.ptr_Q, args.dQ, args.ptr_K, args.dK}, nullptr);
    Params p;
    p.tma_load_q = p_q.tma_load_a;
    if (args.bsr.heads_kv == H) {
      p.tma_load_k = p_q.tma_load_b;  // same head count: the Q call's K descriptor is the one we need
    } else {
      p.tma_load_k = CollectiveMmaQK::to_underlying_arguments(
          shape_kv, typename CollectiveMmaQK::Arguments{args.ptr_Q, args.dQ, args.ptr_K, args.dK}, nullptr)
          .tma_load_b;
    }
    auto p_v = CollectiveMmaPV::to_underlying_arguments(
        select<0, 2, 1, 3>(shape_kv),
        typename CollectiveMmaPV::Arguments{args.ptr_K, args.dK, args.ptr_V, select<1, 0, 2>(args.dV)}, nullptr);
    p.tma_load_v = p_v.tma_load_b;
    p.scale_softmax = args.scale;
    p.scale_softmax_log2 = args.scale * 1.4426950408889634f;
    p.rp_dropout = 1.0f;
    p.bsr = args.bsr;
    return p;
  }

  // K/V live in heads_kv heads: address them as (b, h / group) of a (B, Hkv) problem.
  template <class BlkCoord>
  CUTLASS_DEVICE static auto kv_coord(BlkCoord const& blk_coord, Params const& params) {
    return make_coord(get<0>(blk_coord), get<1>(blk_coord),
                      make_coord(get<2, 0>(blk_coord), get<2, 1>(blk_coord) / params.bsr.group));
  }
  CUTLASS_DEVICE static auto kv_problem(ProblemShape const& ps, Params const& params) {
    return make_shape(get<0>(ps), params.bsr.heads_kv, get<2>(ps), get<3>(ps), get<4>(ps));
  }

  // This thread's WGMMA operands over the shared-memory Q, K and V (all stages), and the (row, col) of each of
  // its S elements inside a 64 x TileN tile: (tSrQ, tSrK, tOrV, tPcP).
  template <class Storage>
  CUTLASS_DEVICE static auto operands(Storage& storage, int thread_idx) {
    auto thr_qk = typename Base::TiledMmaQK{}.get_thread_slice(thread_idx);
    auto thr_pv = typename Base::TiledMmaPV{}.get_thread_slice(thread_idx);
    Tensor sQ = make_tensor(make_smem_ptr(storage.smem_q.data()), typename Base::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.smem_k.data()), typename Base::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(storage.smem_v.data()), typename Base::SmemLayoutV{});
    return make_tuple(thr_qk.make_fragment_A(thr_qk.partition_A(sQ)), thr_qk.make_fragment_B(thr_qk.partition_B(sK)),
                      thr_pv.make_fragment_B(thr_pv.partition_B(sV)),
                      thr_qk.partition_C(make_identity_tensor(take<0, 2>(typename Base::TileShapeQK{}))));
  }

  // This (batch, head, query-tile)'s row of the layout, from the schedule entry that the tile scheduler put into
  // the block coordinate (mode 3: start, end, first block's column | kind << 24), so no index load stands before
  // the row's first K load or its first softmax.
  struct Row {
    const int* cols;
    const uint8_t* kinds;
    int count;  // blocks in the row
    int first;  // block 0: column | kind << 24
  };

  template <class BlkCoord>
  CUTLASS_DEVICE static Row row_of(BlkCoord const& blk_coord, Params const& params) {
    BsrParams const& l = params.bsr;
    int h = get<2, 1>(blk_coord);
    int lh = l.layout_heads == 1 ? 0 : h;
    int start = get<3, 0>(blk_coord);
    size_t base = size_t(lh) * l.col_stride + start;
    return Row{l.col_idx + base, l.block_kind + base, get<3, 1>(blk_coord) - start, get<3, 2>(blk_coord)};
  }

  // Sequence-end and element-rule mask for one QK tile (only called on blocks whose kind asks for it). Per row the
  // kept keys are one interval [lo, hi] (relative to the tile's first key k0), so each element costs two compares
  // and a select, no branches.
  template <class AccQK, class CoordQK>
  CUTLASS_DEVICE static void apply_mask(AccQK& acc_qk, CoordQK const& tPcP, int q0, int k0, int kind,
                                        ProblemShape const& ps, BsrParams const& l) {
    TiledMmaQK tiled_mma_qk;
    Tensor acc_mn = make_tensor(acc_qk.data(), fmha_c::layout_acc_mn(tiled_mma_qk, acc_qk.layout()));
    Tensor c_mn = make_tensor(tPcP.data(), fmha_c::layout_acc_mn(tiled_mma_qk, tPcP.layout()));
    int seq_q = get<2>(ps), seq_k = get<3>(ps);
    int diag = seq_k - seq_q - k0;  // bottom-right aligned, relative to k0
    bool rule = (kind & kBlockRule) != 0;
    // Columns are compared relative to this thread's first column (c0): kk - c0 folds to a constant per
    // element, so no per-element column index stays live in registers across the tile loop.
    int c0 = int(get<1>(c_mn(0, 0)));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(acc_mn); ++i) {
      int qd = q0 + int(get<0>(c_mn(i, 0))) + diag;
      int lo = 0;
      int hi = seq_k - 1 - k0;
      if (rule && l.window_left >= 0) lo = max(lo, qd - l.window_left);
      if (rule && l.window_right >= 0) hi = min(hi, qd + l.window_right);
      lo -= c0;
      hi -= c0;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(acc_mn); ++j) {
        int kk = int(get<1>(c_mn(i, j))) - c0;
        acc_mn(i, j) = (kk >= lo && kk <= hi) ? acc_mn(i, j) : -INFINITY;
      }
    }
  }

};

// QStages: Q slots, one per MMA warpgroup (the config derives it; a persistent CTA loads the next tile's Q
// once a warpgroup releases its slot).
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, int BlockM, int BlockN,
          bool Persistent>
struct BsrMainloop
    : fmha_c::FmhaMainloopTmaWarpSpecialized<
          Element, float, float, Shape<Int<TileM>, Int<TileN>, Int<HeadDim>>, StrideQKV, StrideQKV, StrideQKV,
          fmha_c::DefaultFusion,
          fmha_k::Option<fmha_k::Tag::kIsPersistent, cute::bool_constant<Persistent>>,
          fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>,
          fmha_k::Option<fmha_k::Tag::kStagesQ, Int<QStages>>> {
  using Base = fmha_c::FmhaMainloopTmaWarpSpecialized<
      Element, float, float, Shape<Int<TileM>, Int<TileN>, Int<HeadDim>>, StrideQKV, StrideQKV, StrideQKV,
      fmha_c::DefaultFusion,
      fmha_k::Option<fmha_k::Tag::kIsPersistent, cute::bool_constant<Persistent>>,
      fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>,
      fmha_k::Option<fmha_k::Tag::kStagesQ, Int<QStages>>>;

  using typename Base::TileShapeQK;
  using typename Base::TileShapePV;
  using typename Base::TiledMmaQK;
  using typename Base::TiledMmaPV;
  using typename Base::MainloopPipeline;
  using typename Base::MainloopPipelineQ;
  using typename Base::PipelineState;
  using typename Base::PipelineStateQ;
  using typename Base::SharedStorage;
  using typename Base::LoadQ;
  using typename Base::LoadK;
  using typename Base::LoadV;
  using Base::NumMmaWarpGroups;
  using Base::kIsPersistent;

  static_assert(TileM == 64 * NumMmaWarpGroups, "one 64-row WGMMA tile per MMA warpgroup");
  static_assert(BlockM % TileM == 0 && BlockN % TileN == 0, "layout blocks are whole kernel tiles");
  static constexpr int kTilesPerBlockN = BlockN / TileN;
  // Softmax step (softmax_rescale_step): kSpec where its second P fragment fits the registers (head_dim <= 128;
  // at 256 ptxas spills), kLazy above that. kSoftmaxTurns (compute(): the MMA warpgroups take turns at the
  // softmax step) at head_dim 64, where the exp2 stream is as long as the tile's GEMMs: without the turns the two
  // warpgroups fall into step there (kSpec alone 11-14 % slower than the eager step, with the turns 5-7 % faster);
  // at 128 the turns cost 1-3 %. kOrderTiles: the MMA warpgroups issue their tile GEMMs in turn (the order barrier,
  // every tile): with kSpec the cooperative kernel needs it (causal -9 % without, +5 to +12 % with), the
  // persistent one runs ~1 % faster without. docs/perf_notes.md has the A/Bs. BSK_SOFTMAX_MODE (0 eager, 1 lazy,
  // 2 spec), BSK_ORDER_TILES (0/1) and BSK_SOFTMAX_TURNS (0/1) override them for experiments.
#ifdef BSK_SOFTMAX_MODE
  static constexpr SoftmaxMode kSoftmaxMode = SoftmaxMode(BSK_SOFTMAX_MODE);
#else
  static constexpr SoftmaxMode kSoftmaxMode = HeadDim <= 128 ? SoftmaxMode::kSpec : SoftmaxMode::kLazy;
#endif
#ifdef BSK_ORDER_TILES
  static constexpr bool kOrderTiles = BSK_ORDER_TILES;
#else
  static constexpr bool kOrderTiles = kSoftmaxMode == SoftmaxMode::kSpec && !Persistent;
#endif
#ifdef BSK_SOFTMAX_TURNS
  static constexpr bool kSoftmaxTurns = BSK_SOFTMAX_TURNS;
#else
  static constexpr bool kSoftmaxTurns = HeadDim == 64;
#endif

  using Common = BsrCommon<Base, TileM, BlockM>;
  using Arguments = typename Common::Arguments;
  using Params = typename Common::Params;
  using Row = typename Common::Row;
  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args, void* workspace) {
    return Common::to_underlying_arguments(ps, args, workspace);
  }
  // Producer warp: Q (unless a separate warp loads it), then K and V tiles of the listed blocks only.
  template <bool kLoadQ, class BlkCoord, class LoadWarpBarrier>
  CUTLASS_DEVICE void load_kv_maybe_q(int block_rank_in_cluster, BlkCoord const& blk_coord, Params const& params,
                                      ProblemShape const& problem_size, MainloopPipeline& pipeline,
                                      PipelineState& smem_pipe_write, MainloopPipelineQ& pipeline_q,
                                      PipelineStateQ& smem_pipe_write_q, SharedStorage& storage,
                                      LoadWarpBarrier& load_warp_barrier, bool do_barrier) {
    int lane_predicate = cute::elect_one_sync();
    BSK_TR(lane_predicate, 2, 6, false);
    Row row = Common::row_of(blk_coord, params);
    int n_tiles = row.count * kTilesPerBlockN;

    auto kv_coord = Common::kv_coord(blk_coord, params);
    auto kv_problem = Common::kv_problem(problem_size, params);

    LoadQ load_q{params.tma_load_q, pipeline_q, storage.smem_q};
    auto q_state = load_q.init_state(_0{}, problem_size, TileShapeQK{}, blk_coord, NumMmaWarpGroups);
    auto q_iter = cute::make_coord_iterator(Int<NumMmaWarpGroups>{});
    int q_count = NumMmaWarpGroups;

    LoadK load_k{params.tma_load_k, pipeline, storage.smem_k};
    auto k_state = load_k.init_state(block_rank_in_cluster, kv_problem, TileShapeQK{}, kv_coord, n_tiles);
    LoadV load_v{params.tma_load_v, pipeline, storage.smem_v};
    auto v_state = load_v.init_state(block_rank_in_cluster, kv_problem, TileShapePV{}, kv_coord, n_tiles);

    BsrRowCursor cursor{row.cols, nullptr, row.count, row.first};
    int kv_count = 2 * n_tiles;  // one K and one V load per tile

    if constexpr (kLoadQ) load_q.step(q_iter, q_state, smem_pipe_write_q, lane_predicate, q_count);

    for (int j = 0; j < n_tiles; ++j) {
      int col, kind;
      cursor.at(j / kTilesPerBlockN, col, kind);
      int tile = col * kTilesPerBlockN + j % kTilesPerBlockN;
      auto it = &tile;  // a one-element "iterator": step() reads *it
      load_k.template step<false>(it, k_state, smem_pipe_write, lane_predicate, kv_count);
      BSK_TR(j == 0 && lane_predicate, 2, 7, true);
      if (j == 0) {
        if constexpr (kLoadQ) {
          while (q_count > 0) load_q.step(q_iter, q_state, smem_pipe_write_q, lane_predicate, q_count);
        } else if (do_barrier) {
          load_warp_barrier.arrive();
          load_warp_barrier.wait(/*phase=*/0);
          do_barrier = false;
        }
      }
      load_v.template step<false>(it, v_state, smem_pipe_write, lane_predicate, kv_count);
    }
    // Empty row: Q still goes to the consumers (they release it), and the one-time handshake still happens.
    if constexpr (kLoadQ) {
      while (q_count > 0) load_q.step(q_iter, q_state, smem_pipe_write_q, lane_predicate, q_count);
    } else if (do_barrier) {
      load_warp_barrier.arrive();
      load_warp_barrier.wait(/*phase=*/0);
    }
  }

  template <class BlkCoord, class MainloopPipelineReducer, class PipelineStateReducer, class MathWgOrderBarrier>
  CUTLASS_DEVICE auto compute(BlkCoord const& blk_coord, BlkCoord const& wg_coord, Params const& params,
                              ProblemShape const& problem_size, MainloopPipeline& pipeline,
                              PipelineState& smem_pipe_read, MainloopPipelineQ& pipeline_q,
                              PipelineStateQ& smem_pipe_read_q, MainloopPipelineReducer&, PipelineStateReducer&,
                              SharedStorage& storage, MathWgOrderBarrier& math_wg_order_barrier) {
    int thread_idx = int(threadIdx.x);
#ifdef BSK_TRACE
    int tr_wg = int(get<0>(wg_coord)) & 1;
    bool tr_on = thread_idx % 128 == 0;
    int tr_row = blockIdx.x < kTraceCtas ? bsk_trace_cnt[blockIdx.x][tr_wg] : 0;
#endif
    [[maybe_unused]] int tr_j = 0;  // tile index, for the trace only
    BSK_TR(tr_on, tr_wg, tr_wg ? 4 : 0, false);

    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto ops = Common::operands(storage, thread_idx);
    Tensor tSrQ = get<0>(ops);
    Tensor tSrK = get<1>(ops);
    Tensor tOrV = get<2>(ops);
    Tensor tPcP = get<3>(ops);
    int q0 = int(get<0>(wg_coord)) * get<0>(TileShapeQK{});
    [[maybe_unused]] int wg_idx = cutlass::canonical_warp_group_idx() - 1;  // MMA warpgroup 0 or 1

    Tensor acc_pv = partition_fragment_C(tiled_mma_pv, take<0, 2>(TileShapePV{}));
    fmha_c::CollectiveSoftmax<float, fmha_c::DefaultFusion, Params> softmax{params};
    auto softmax_state = softmax.init(acc_pv, tiled_mma_pv);

    Row row = Common::row_of(blk_coord, params);
    int n_tiles = row.count * kTilesPerBlockN;
    BSK_TR(tr_on && !tr_wg && n_tiles > 0, 0, 9, false);
    BsrRowCursor cursor{row.cols, row.kinds, row.count, row.first};

    pipeline_q.consumer_wait(smem_pipe_read_q);
    BSK_TR(tr_on && !tr_wg, 0, 1, false);
    auto sQ_stage = tSrQ(_, _, _, smem_pipe_read_q.index());

    if (n_tiles == 0) {
      // Nothing to attend: O = 0, LSE = -inf. Keep the warpgroup order barrier's sequence and release Q.
      math_wg_order_barrier.wait();
      math_wg_order_barrier.arrive();
      if constexpr (kIsPersistent) pipeline_q.consumer_release(smem_pipe_read_q);
      clear(acc_pv);
      auto lse = make_fragment_like(get<1>(softmax_state));
      fill(lse, -INFINITY);
      return make_tuple(acc_pv, lse);
    }

    // Tiles overlap inside the warpgroup (FlashAttention-3's order): tile j issues QK_j, then PV of tile j-1 (its P
    // kept in tOrP), waits for QK_j only, and runs tile j's mask and online softmax while PV_{j-1} is still on the
    // tensor cores; O is rescaled, and tOrP overwritten with P_j, once PV_{j-1} has completed. Masks are a
    // compile-time branch (full blocks carry no mask code); the block's kind is read while QK_j runs (at a row
    // start it is a global load). Tile 0 orders its QK between the warpgroups and initializes the running max/sum.
    Tensor tOrP = make_fragment_like<Element>(fmha_c::convert_c_layout_to_a_layout(
        partition_fragment_C(tiled_mma_qk, take<0, 2>(TileShapeQK{})).layout(),
        shape<1>(typename TiledMmaPV::LayoutA_TV{})));
    auto corr = make_fragment_like(get<0>(softmax_state));  // per-row O rescale factor of the current tile
    auto p_next = make_fragment_like(tOrP);  // kSpec: tile j's P while PV_{j-1} still reads tOrP
    PipelineState read_v = smem_pipe_read;                  // V of the previous tile
    clear(acc_pv);

    auto issue_qk = [&](auto first) {
      constexpr bool kFirst = decltype(first)::value;
      Tensor acc_qk = partition_fragment_C(tiled_mma_qk, take<0, 2>(TileShapeQK{}));
      pipeline.consumer_wait(smem_pipe_read);
      if constexpr (kFirst || kOrderTiles) math_wg_order_barrier.wait();
      warpgroup_fence_operand(acc_qk);
      warpgroup_arrive();
      fmha_c::gemm_zero_acc(tiled_mma_qk, sQ_stage, tSrK(_, _, _, smem_pipe_read.index()), acc_qk);
      warpgroup_commit_batch();
      BSK_TL(tr_on, tr_wg, tr_row, tr_j, 0);
      if constexpr (kFirst) math_wg_order_barrier.arrive();
      return acc_qk;
    };
    auto issue_pv = [&]() {  // O += P V of the previous tile
      pipeline.consumer_wait(read_v);
      warpgroup_fence_operand(acc_pv);
      warpgroup_fence_operand(tOrP);
      warpgroup_arrive();
      cute::gemm(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), acc_pv);
      warpgroup_commit_batch();
    };
    auto to_p = [&](auto& src) {  // P into the PV operand registers; the tile's V becomes read_v
      if constexpr (std::is_same_v<typename std::decay_t<decltype(src)>::value_type, Element>) {
        Tensor from = recast<uint32_t>(src);  // kSpec: already Element, same order
        Tensor to = recast<uint32_t>(tOrP);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(to); ++i) to(i) = from(i);
      } else {
        Tensor p_as_acc = make_tensor(tOrP.data(), src.layout());
        cute::copy(src, p_as_acc);
      }
      warpgroup_fence_operand(tOrP);
      BSK_TL(tr_on, tr_wg, tr_row, tr_j, 2);
      read_v = smem_pipe_read;
      ++smem_pipe_read;
    };
    // QK of the tile is done (waited for with `pending` GEMMs still in flight) and K's ring slot goes back.
    auto qk_done = [&](auto pending, auto& acc_qk) {
      PipelineState read_k = smem_pipe_read;
      ++smem_pipe_read;
      warpgroup_wait<decltype(pending)::value>();
      warpgroup_fence_operand(acc_qk);
      BSK_TL(tr_on, tr_wg, tr_row, tr_j, 1);
      pipeline.consumer_release(read_k);
    };
    // Softmax turns (kSoftmaxTurns): the two MMA warpgroups take turns at the softmax step of every tile, warpgroup
    // 0 first in a row, so one's exp2 stream runs under the other's GEMMs instead of sharing the MUFU with its exp2.
    // Both walk the same row, so the turns pair up; warpgroup 1 does not pass its last turn of a row on, and each
    // row starts afresh. The wait goes before the QK wait: ptxas moves register arithmetic above a named barrier,
    // not above that.
    auto turn_wait = [&](int j) {
      if constexpr (kSoftmaxTurns) {
        if (wg_idx == 1 || j > 0)
          cutlass::arch::NamedBarrier::sync(2 * cutlass::NumThreadsPerWarpGroup, kBarSoftmaxTurn + wg_idx);
      }
    };
    auto turn_pass = [&](int j) {
      if constexpr (kSoftmaxTurns) {
        if (wg_idx == 0 || j < n_tiles - 1)
          cutlass::arch::NamedBarrier::arrive(2 * cutlass::NumThreadsPerWarpGroup, kBarSoftmaxTurn + 1 - wg_idx);
      }
    };
    // Tile j >= 1 after its QK has been issued (and PV_{j-1} after it).
    auto finish = [&](auto masked, auto& acc_qk, int k0, int kind, int j) {
      constexpr bool kMasked = decltype(masked)::value;
      turn_wait(j);
      qk_done(cute::Int<1>{}, acc_qk);  // QK_j (PV_{j-1} may still run)
      if constexpr (kMasked) Common::apply_mask(acc_qk, tPcP, q0, k0, kind, problem_size, params.bsr);
      bool rescale = softmax_rescale_step<kSoftmaxMode>(acc_qk, tiled_mma_qk, softmax_state,
                                                        params.scale_softmax_log2, corr, p_next,
                                                        [&] { turn_pass(j); });
      warpgroup_wait<0>();  // PV_{j-1}
      warpgroup_fence_operand(acc_pv);
      warpgroup_fence_operand(tOrP);
      pipeline.consumer_release(read_v);
      if (rescale) rescale_o(acc_pv, tiled_mma_pv, corr);
      if constexpr (kSoftmaxMode == SoftmaxMode::kSpec) to_p(p_next);
      else to_p(acc_qk);
    };

    {
      auto acc_qk = issue_qk(cute::true_type{});
      int col, kind;
      cursor.at(0, col, kind);  // the kind's global load overlaps QK_0
      BSK_TR(tr_on && !tr_wg && kind >= 0, 0, 10, false);
      turn_wait(0);
      qk_done(cute::Int<0>{}, acc_qk);
      if (kind != kBlockFull) Common::apply_mask(acc_qk, tPcP, q0, col * BlockN, kind, problem_size, params.bsr);
      softmax.step(acc_qk, tiled_mma_qk, tPcP, softmax_state, problem_size);
      turn_pass(0);
      to_p(acc_qk);
    }
    BSK_TR(tr_on && !tr_wg, 0, 2, false);

    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 1; j < n_tiles; ++j) {
      tr_j = j;
      auto acc_qk = issue_qk(cute::false_type{});
      issue_pv();
      if constexpr (kOrderTiles) math_wg_order_barrier.arrive();
      int col, kind;
      cursor.at(j / kTilesPerBlockN, col, kind);
      if (kind != kBlockFull) {
        finish(cute::true_type{}, acc_qk, col * BlockN + (j % kTilesPerBlockN) * TileN, kind, j);
      } else {
        finish(cute::false_type{}, acc_qk, 0, 0, j);
      }
    }
    issue_pv();  // the last tile's

    if constexpr (kIsPersistent) pipeline_q.consumer_release(smem_pipe_read_q);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_pv);
    BSK_TR(tr_on, tr_wg, tr_wg ? 5 : 3, tr_wg);
    if constexpr (kIsPersistent) pipeline.consumer_release(read_v);  // V of the last tile

    auto lse = softmax.tail(softmax_state, acc_pv, tiled_mma_pv);
    BSK_TR(tr_on && !tr_wg && lse(0) != 1.f, 0, 8, true);
    return make_tuple(acc_pv, lse);
  }
};

// One MMA warpgroup per CTA (64 query rows) and no producer warp: warp 0 issues the K/V TMA loads of the listed
// blocks itself, Stages/2 tiles ahead, and up to three CTAs share an SM so one's softmax overlaps the others'
// WGMMAs.
// Within a tile, P is exponentiated one k-slice of the PV GEMM at a time (example 88's interleaved softmax step).
// The shape example 88 runs fastest at head_dim 64.
template <class Element, int HeadDim, int TileN, int Stages, int BlockM, int BlockN>
struct BsrMainloopSingle
    : fmha_c::FmhaMainloopTma<Element, float, Shape<_64, Int<TileN>, Int<HeadDim>>, fmha_c::DefaultFusion,
                              fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>> {
  using Base = fmha_c::FmhaMainloopTma<Element, float, Shape<_64, Int<TileN>, Int<HeadDim>>, fmha_c::DefaultFusion,
                                       fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>>;
  using typename Base::TileShapeQK;
  using typename Base::TileShapePV;
  using typename Base::TiledMmaQK;
  using typename Base::TiledMmaPV;
  using typename Base::MainloopPipeline;
  using typename Base::MainloopPipelineQ;
  using typename Base::PipelineState;
  using typename Base::PipelineStateQ;
  using typename Base::SharedStorage;
  using typename Base::LoadQ;
  using typename Base::LoadK;
  using typename Base::LoadV;

  static_assert(Stages % 2 == 0 && Stages >= 4, "K and V of Stages/2 tiles in flight");
  static_assert(BlockM % 64 == 0 && BlockN % TileN == 0, "layout blocks are whole kernel tiles");
  static constexpr int kTilesPerBlockN = BlockN / TileN;
  static constexpr int kLookahead = Stages / 2;  // tiles whose K/V are in flight

  using Common = BsrCommon<Base, 64, BlockM>;
  using Arguments = typename Common::Arguments;
  using Params = typename Common::Params;
  using Row = typename Common::Row;
  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args, void* workspace) {
    return Common::to_underlying_arguments(ps, args, workspace);
  }

  template <class BlkCoord>
  CUTLASS_DEVICE auto compute(BlkCoord const& blk_coord, Params const& params, ProblemShape const& problem_size,
                              MainloopPipeline& pipeline, PipelineState& smem_pipe_read,
                              PipelineState& smem_pipe_write, MainloopPipelineQ& pipeline_q,
                              PipelineStateQ& smem_pipe_read_q, PipelineStateQ& smem_pipe_write_q,
                              SharedStorage& storage) {
    int thread_idx = int(threadIdx.x);
    bool load_warp = cutlass::canonical_warp_idx_sync() == 0;
    int lane_predicate = cute::elect_one_sync();
    PipelineState smem_pipe_release = smem_pipe_read;

    Row row = Common::row_of(blk_coord, params);
    int n_tiles = row.count * kTilesPerBlockN;

    auto kv_coord = Common::kv_coord(blk_coord, params);
    auto kv_problem = Common::kv_problem(problem_size, params);
    LoadQ load_q{params.tma_load_q, pipeline_q, storage.smem_q};
    auto q_state = load_q.init_state(_0{}, problem_size, TileShapeQK{}, blk_coord, 1);
    LoadK load_k{params.tma_load_k, pipeline, storage.smem_k};
    auto k_state = load_k.init_state(0, kv_problem, TileShapeQK{}, kv_coord, n_tiles);
    LoadV load_v{params.tma_load_v, pipeline, storage.smem_v};
    auto v_state = load_v.init_state(0, kv_problem, TileShapePV{}, kv_coord, n_tiles);

    // Warp 0's view of the row: the K/V tile of load step t (monotonic t, as BsrRowCursor requires).
    BsrRowCursor load_cursor{row.cols, nullptr, row.count, row.first};
    int kv_count = 2 * n_tiles;
    int load_tile = 0;
    auto load_kv = [&](auto is_v, int t) {
      if (!load_warp || t >= n_tiles) return;
      if constexpr (!decltype(is_v)::value) {
        int col, kind;
        load_cursor.at(t / kTilesPerBlockN, col, kind);
        load_tile = col * kTilesPerBlockN + t % kTilesPerBlockN;
        auto it = &load_tile;
        load_k.template step<false>(it, k_state, smem_pipe_write, lane_predicate, kv_count);
      } else {
        auto it = &load_tile;  // V of the tile whose K went just before
        load_v.template step<false>(it, v_state, smem_pipe_write, lane_predicate, kv_count);
      }
    };

    Tensor acc_pv = partition_fragment_C(TiledMmaPV{}, take<0, 2>(TileShapePV{}));
    fmha_c::CollectiveSoftmax<float, fmha_c::DefaultFusion, Params> softmax{params};
    auto softmax_state = softmax.init(acc_pv, TiledMmaPV{});
    if (n_tiles == 0) {
      // Nothing to attend: O = 0, LSE = -inf. No load is issued: the epilogue reuses this shared memory, so no
      // TMA write may still be in flight when it starts.
      clear(acc_pv);
      auto lse = make_fragment_like(get<1>(softmax_state));
      fill(lse, -INFINITY);
      return make_tuple(acc_pv, lse);
    }

    if (load_warp) {
      int q_count = 1;
      auto q_iter = cute::make_coord_iterator(1);
      load_q.step(q_iter, q_state, smem_pipe_write_q, lane_predicate, q_count);
    }
    // Prologue: K and V of the first kLookahead tiles (V_t reuses K_t's load_tile, so they stay paired).
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kLookahead; ++t) {
      load_kv(cute::false_type{}, t);
      load_kv(cute::true_type{}, t);
    }

    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto ops = Common::operands(storage, thread_idx);
    Tensor tSrQ = get<0>(ops);
    Tensor tSrK = get<1>(ops);
    Tensor tOrV = get<2>(ops);
    Tensor tPcP = get<3>(ops);
    int q0 = int(get<0>(blk_coord)) * 64;

    BsrRowCursor cursor{row.cols, row.kinds, row.count, row.first};

    pipeline_q.consumer_wait(smem_pipe_read_q);

    // Every tile, the first included, runs the same step from a running state that starts empty (O = 0,
    // max = -inf, sum = 0): one code path per mask kind keeps the kernel within 168 registers, so three CTAs
    // share an SM without ptxas serializing the WGMMAs (a separate first-tile path measured C7512).
    clear(acc_pv);
    fill(get<0>(softmax_state), -INFINITY);
    fill(get<1>(softmax_state), 0.f);

    auto tile = [&](auto masked, int j, int k0, int kind) {
      Tensor acc_qk = partition_fragment_C(tiled_mma_qk, take<0, 2>(TileShapeQK{}));
      pipeline.consumer_wait(smem_pipe_read);
      warpgroup_fence_operand(acc_qk);
      warpgroup_arrive();
      fmha_c::gemm_zero_acc(tiled_mma_qk, tSrQ(_, _, _, _0{}), tSrK(_, _, _, smem_pipe_read.index()), acc_qk);
      warpgroup_commit_batch();
      ++smem_pipe_read;
      if (j > 0) load_kv(cute::false_type{}, j + kLookahead - 1);  // into K_{j-1}'s released slot
      warpgroup_wait<0>();  // this QK and the previous PV
      warpgroup_fence_operand(acc_qk);
      warpgroup_fence_operand(acc_pv);
      if constexpr (decltype(masked)::value) {
        Common::apply_mask(acc_qk, tPcP, q0, k0, kind, problem_size, params.bsr);
      }
      softmax.template step_interleave_begin<false>(acc_qk, tiled_mma_qk, tPcP, softmax_state, acc_pv,
                                                    tiled_mma_pv, problem_size);
      if (j > 0) {
        pipeline.consumer_release(smem_pipe_release);  // V of the previous tile
        ++smem_pipe_release;
      }
      pipeline.consumer_wait(smem_pipe_read);
      auto layout_p = fmha_c::convert_c_layout_to_a_layout(acc_qk.layout(),
                                                            shape<1>(typename TiledMmaPV::LayoutA_TV{}));
      Tensor s_slices = make_tensor(acc_qk.data(), layout_p);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<2>(tOrV); ++i) {
        Tensor p_i = make_fragment_like<Element>(layout_p(_, _0{}, _0{}));
        Tensor p_i_mk = fmha_c::tensor_op_mk_v(tiled_mma_pv, p_i);
        Tensor s_i_mk = fmha_c::tensor_op_mk_v(tiled_mma_pv, s_slices(_, _0{}, i));
        softmax.step_interleave_step(s_i_mk, softmax_state);
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < size(p_i_mk); ++e) p_i_mk(e) = static_cast<Element>(s_i_mk(e));
        warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int n = 0; n < size<1>(tOrV); ++n) {
          cute::gemm(tiled_mma_pv, p_i, tOrV(_, n, i, smem_pipe_read.index()), acc_pv(_, _0{}, n));
        }
      }
      warpgroup_commit_batch();
      pipeline.consumer_release(smem_pipe_release);  // K of this tile
      ++smem_pipe_release;
      ++smem_pipe_read;
      if (j > 0) load_kv(cute::true_type{}, j + kLookahead - 1);  // into V_{j-1}'s released slot
    };

    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 0; j < n_tiles; ++j) {
      int col, kind;
      cursor.at(j / kTilesPerBlockN, col, kind);
      if (kind != kBlockFull) {
        tile(cute::true_type{}, j, col * BlockN + (j % kTilesPerBlockN) * TileN, kind);
      } else {
        tile(cute::false_type{}, j, 0, 0);
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_pv);

    return make_tuple(acc_pv, softmax.tail(softmax_state, acc_pv, tiled_mma_pv));
  }
};

// Query tiles in heaviest-row-first order. When every row has the same length, linear tile id -> (m rank fastest,
// head, batch): CTAs running at the same time work on the same head, so its K/V tiles are shared through L2.
// When rows differ (causal, windows at the edges, learned top-k), id -> (rank slowest, head, batch): the heaviest
// rows of every head go first, which a static round-robin (persistent) or in-order (one tile per CTA) dispatch
// turns into longest-processing-time-first load balance.
struct BsrTileScheduler {
  struct Params {
    int num_tiles;
    int m_tiles;       // query tiles per (batch, head)
    int tiles_per_row; // BlockM / TileM
    int n_rows;        // layout rows (row_sched stride)
    int layout_heads;
    cutlass::FastDivmod div_m;
    cutlass::FastDivmod div_h;
    cutlass::FastDivmod div_group;        // heaviest-first order: (batch, head)s per group
    cutlass::FastDivmod div_group_tiles;  // tiles per group
    const int4* row_sched;  // [layout heads][n_rows]: (row, start, end, column | kind << 24 of the first block)
    int grid;
    int rank_major;
  };

  Params const& params;
  int idx;

  CUTLASS_DEVICE BsrTileScheduler(Params const& p) : params(p), idx(int(blockIdx.x)) {
    BSK_TR_SPAN(threadIdx.x == 0, 0);
  }

  // rank_major (rows differ in length): heaviest rows first across the (batch, head)s of a group of `group` of
  // them (a divisor of batch * heads that the launcher picks so that a group's K/V fits in L2), group after group.
  // With every head in one group the tiles in flight would each read another head's K/V once the heads' K/V
  // outgrow L2 (causal rows over 1K keys at 16 x 16 heads: DRAM-bound); with none, the order within a head.
  static Params make(int batch, int heads, int n_rows, int tiles_per_row, int layout_heads, const int4* row_sched,
                     bool persistent, int sm_count, int rank_major, int group) {
    Params p;
    p.m_tiles = n_rows * tiles_per_row;
    p.num_tiles = p.m_tiles * heads * batch;
    p.tiles_per_row = tiles_per_row;
    p.n_rows = n_rows;
    p.layout_heads = layout_heads;
    p.div_m = cutlass::FastDivmod(p.m_tiles);
    p.div_h = cutlass::FastDivmod(heads);
    p.div_group = cutlass::FastDivmod(group);
    p.div_group_tiles = cutlass::FastDivmod(group * p.m_tiles);
    p.rank_major = rank_major;
    p.row_sched = row_sched;
    p.grid = persistent ? std::min(p.num_tiles, sm_count > 0 ? sm_count : 132) : p.num_tiles;
    return p;
  }

  static dim3 get_grid_shape(Params const& p) { return dim3(p.grid, 1, 1); }

  // Past this CTA's last tile every thread leaves the kernel: the epilogue's last O store (issued, not waited for)
  // must have read shared memory first. A no-op for threads that issued none.
  CUTLASS_DEVICE bool is_valid() {
    bool valid = idx < params.num_tiles;
    if (!valid) {
      tma_store_wait<0>();
      BSK_TR_SPAN(threadIdx.x == 128 || threadIdx.x == 256, threadIdx.x == 128 ? 2 : 4);
    }
    return valid;
  }

  CUTLASS_DEVICE auto get_block_coord() {
    int rank, rest, h, b;
    if (params.rank_major) {
      int g, in_g;
      params.div_group_tiles(g, in_g, idx);
      params.div_group(rank, rest, in_g);
      rest += g * params.div_group.divisor;
    } else {
      params.div_m(rest, rank, idx);
    }
    params.div_h(b, h, rest);
    int lh = params.layout_heads == 1 ? 0 : h;
    int4 e = __ldg(params.row_sched + size_t(lh) * params.n_rows + rank / params.tiles_per_row);
    int m_block = e.x * params.tiles_per_row + rank % params.tiles_per_row;
    return make_coord(m_block, _0{}, make_coord(b, h), make_coord(e.y, e.z, e.w));
  }

  CUTLASS_DEVICE BsrTileScheduler& operator++() {
    idx += int(gridDim.x);
    return *this;
  }
};

// Epilogue, per MMA warpgroup: LSE straight to global; O converted into this warpgroup's 64 x HeadDim shared
// buffer and written by one TMA store that is not waited for here. The buffer is reused one tile later, after
// the store has read it (checked then, long done by that time); the scheduler's is_valid() waits for the last one
// before the CTA exits. Example 88's epilogue drains four sub-tile stores per tile with the tensor cores idle.
template <class Element, int HeadDim>
struct BsrEpilogue {
  using SmemLayoutO = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_64, Int<HeadDim>>{}));
  using TmaStoreO = decltype(make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), make_shape(0, 0, make_shape(0, 0)), StrideQKV{}),
      SmemLayoutO{}));

  struct TensorStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutO>, 128> smem_o;
  };
  // The kernel shell constructs an epilogue load pipeline; this epilogue loads nothing.
  using LoadPipeline = cutlass::PipelineTransactionAsync<1>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  static constexpr int TmaTransactionBytes = 0;

  struct Arguments {
    Element* ptr_O;
    StrideQKV dO;
    float* ptr_LSE;
    cute::tuple<_1, cute::tuple<int, int>> dLSE;
  };
  struct Params {
    TmaStoreO tma_store_o;
    float* ptr_LSE;
    cute::tuple<_1, cute::tuple<int, int>> dLSE;
  };

  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args, void* = nullptr) {
    auto shape_o = make_shape(get<2>(ps), get<4>(ps), make_shape(get<0>(ps), get<1>(ps)));
    auto tma = make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(args.ptr_O), shape_o, args.dO),
                             SmemLayoutO{});
    return Params{tma, args.ptr_LSE, args.dLSE};
  }

  static CUTLASS_DEVICE void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_store_o.get_tma_descriptor());
  }

  // blk_coord: (64-row tile, _0, (b, h)).
  template <class TileShape, class BlkCoord, class ResultTuple, class TiledMma, class Pipeline>
  CUTLASS_DEVICE void operator()(TileShape const&, BlkCoord const& blk_coord, ResultTuple const& result,
                                 TiledMma const& tiled_mma, ProblemShape const& ps, Params const& params, Pipeline&,
                                 TensorStorage& storage) {
    auto const& acc = get<0>(result);
    auto const& lse = get<1>(result);
    int thread_idx = int(threadIdx.x);
    int wg_thread = thread_idx % cutlass::NumThreadsPerWarpGroup;
    int m = int(get<0>(blk_coord));
    int b = get<2, 0>(blk_coord), h = get<2, 1>(blk_coord);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
#ifdef BSK_TRACE
    int tr_wg = m & 1;
    bool tr_on = wg_thread == 0;
#endif
    BSK_TR(tr_on, tr_wg, tr_wg ? 14 : 11, false);

    // LSE: the threads that hold column 0 write their rows. A row whose every key was masked comes out of the
    // softmax collective as +inf; our contract is -inf (and O = 0).
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<_64, Int<HeadDim>>{}));
    Tensor tOcO_mn = make_tensor(tOcO.data(), fmha_c::layout_acc_mn(tiled_mma, tOcO.layout()));
    if (get<1>(tOcO_mn(0, 0)) == 0) {
      float* lse_bh = params.ptr_LSE + size_t(b) * get<1, 0>(params.dLSE) + size_t(h) * get<1, 1>(params.dLSE);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(tOcO_mn); ++i) {
        int row = m * 64 + int(get<0>(tOcO_mn(i, 0)));
        if (row < get<2>(ps)) lse_bh[row] = lse(i) == INFINITY ? -INFINITY : lse(i);
      }
    }

    // O: convert, wait until the previous tile's store has read the buffer, fill it with stmatrix (four 8x8
    // matrices per instruction), hand it to the TMA unit.
    Tensor tOrO = make_fragment_like<Element>(acc);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) tOrO(i) = static_cast<Element>(acc(i));
    int barrier_id = kBarEpilogue + (thread_idx / cutlass::NumThreadsPerWarpGroup) % 2;
    bool leader = wg_thread == 0;
    if (leader) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, barrier_id);
    BSK_TR(tr_on && !tr_wg, 0, 12, false);
    Tensor sO = make_tensor(make_smem_ptr(storage.smem_o.data()), SmemLayoutO{});
    auto store_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma);
    auto thr_store_o = store_o.get_thread_slice(wg_thread);
    copy(store_o, thr_store_o.retile_S(tOrO), thr_store_o.partition_D(sO));
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, barrier_id);
    if (leader) {
      Tensor mO = params.tma_store_o.get_tma_tensor(
          make_shape(get<2>(ps), get<4>(ps), make_shape(get<0>(ps), get<1>(ps))));
      Tensor gO = local_tile(mO(_, _, make_coord(b, h)), Shape<_64, Int<HeadDim>>{}, make_coord(m, _0{}));
      auto cta_tma = params.tma_store_o.get_slice(_0{});
      copy(params.tma_store_o, cta_tma.partition_S(sO), cta_tma.partition_D(gO));
      tma_store_arrive();
    }
    BSK_TR(tr_on, tr_wg, tr_wg ? 15 : 13, false);
  }
};

// Kernel shell for BsrMainloopSingle: one CTA per 64-row query tile (heaviest rows first), 128 threads, CtasPerSm
// CTAs per SM (as many as shared memory allows, up to 3 = 168 registers a thread); pipelines the same warpgroup
// produces and consumes; BsrEpilogue in the mainloop's shared memory once the mainloop is done.
template <class Mainloop, class Epilogue, int CtasPerSm>
struct BsrKernelSingle {
  using Element = typename Mainloop::Element;
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using MainloopPipelineQ = typename Mainloop::MainloopPipelineQ;

  struct SharedStorage {
    union {
      typename Mainloop::SharedStorage mainloop;
      typename Epilogue::TensorStorage epilogue;
    };
    alignas(16) typename MainloopPipeline::SharedStorage pipeline_storage;
    alignas(16) typename MainloopPipelineQ::SharedStorage pipeline_storage_q;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static const int MaxThreadsPerBlock = cutlass::NumThreadsPerWarpGroup;
  static const int MinBlocksPerMultiprocessor = CtasPerSm;
  using ArchTag = cutlass::arch::Sm90;

  struct Params {
    ProblemShape problem_size;
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    typename BsrTileScheduler::Params tile_scheduler;
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem) {
    BsrTileScheduler scheduler{params.tile_scheduler};
    if (!scheduler.is_valid()) return;
    auto& storage = *reinterpret_cast<SharedStorage*>(smem);
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int lane_predicate = cute::elect_one_sync();
    bool leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
    if (warp_idx == 0 && lane_predicate) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
      Epilogue::prefetch_tma_descriptors(params.epilogue);
    }

    typename MainloopPipelineQ::Params pq;
    pq.transaction_bytes = size(typename Mainloop::SmemLayoutQ{}(_, _, _0{})) * sizeof(Element);
    pq.role = MainloopPipelineQ::ThreadCategory::ProducerConsumer;
    pq.is_leader = leader;
    pq.num_consumers = cutlass::NumThreadsPerWarpGroup;
    typename MainloopPipeline::Params pkv;
    pkv.transaction_bytes = size(typename Mainloop::SmemLayoutK{}(_, _, _0{})) * sizeof(Element);
    pkv.role = MainloopPipeline::ThreadCategory::ProducerConsumer;
    pkv.is_leader = leader;
    pkv.num_consumers = cutlass::NumThreadsPerWarpGroup;
    MainloopPipelineQ pipeline_q(storage.pipeline_storage_q, pq, Shape<_1, _1, _1>{});
    MainloopPipeline pipeline(storage.pipeline_storage, pkv, Shape<_1, _1, _1>{});

    typename Mainloop::PipelineState smem_pipe_read;
    auto smem_pipe_write = cutlass::make_producer_start_state<MainloopPipeline>();
    typename Mainloop::PipelineStateQ smem_pipe_read_q;
    auto smem_pipe_write_q = cutlass::make_producer_start_state<MainloopPipelineQ>();
    __syncthreads();  // barrier init visible to the whole CTA

    auto blk_coord = scheduler.get_block_coord();
    Mainloop mainloop;
    auto result = mainloop.compute(blk_coord, params.mainloop, params.problem_size, pipeline, smem_pipe_read,
                                   smem_pipe_write, pipeline_q, smem_pipe_read_q, smem_pipe_write_q,
                                   storage.mainloop);
    Epilogue epilogue;
    int no_pipeline = 0;
    epilogue(typename Mainloop::TileShapePV{}, blk_coord, result, typename Mainloop::TiledMmaPV{},
             params.problem_size, params.epilogue, no_pipeline, storage.epilogue);
    tma_store_wait<0>();  // O read out of shared memory before the CTA exits
  }
};

// TileM 128: two MMA warpgroups and a producer warp (cooperative, or persistent ping-pong); TileM 64: one
// warpgroup per CTA that loads for itself (BsrMainloopSingle).
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, int BlockM, int BlockN,
          bool Persistent, int CtasPerSm>
struct AttnFwdTraits {
  static constexpr bool kSingle = TileM == 64;
  using Mainloop = std::conditional_t<
      kSingle, BsrMainloopSingle<Element, HeadDim, TileN, Stages, BlockM, BlockN>,
      BsrMainloop<Element, HeadDim, TileM, TileN, Stages, QStages, BlockM, BlockN, Persistent>>;
  using Epilogue = BsrEpilogue<Element, HeadDim>;
  using Kernel = std::conditional_t<
      kSingle, BsrKernelSingle<Mainloop, Epilogue, CtasPerSm>,
      std::conditional_t<
          Persistent,
          fmha_k::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, BsrTileScheduler,
                                               fmha_k::Option<fmha_k::Tag::kLoadsQSeparately, cute::true_type>>,
          fmha_k::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, BsrTileScheduler>>>;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kTileM = TileM;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr bool kPersistent = Persistent;
};

template <class Named>
int attn_fwd_smem_bytes() {
  return int(Named::SharedStorageSize);
}

inline bool fits_int(long long v) { return v >= 0 && v <= 0x7fffffffLL; }

// (batch, head)s per group of the heaviest-first tile order (BsrTileScheduler::make): the largest divisor of
// batch * heads whose K/V (bytes per (batch, head): kv_bytes) fits in half of L2.
inline int head_group(int bh, long long kv_bytes, long long l2_bytes) {
  long long fit = kv_bytes > 0 ? (l2_bytes / 2) / kv_bytes : bh;
  int g = int(std::max(1LL, std::min<long long>(bh, fit)));
  while (bh % g != 0) --g;
  return g;
}

namespace {
// Devices on which this library's kernel has its shared-memory attribute set. Internal linkage on purpose: a
// function-local static in the launcher template would be a GNU-unique symbol, which the dynamic loader merges
// across every loaded library (RTLD_LOCAL or not), so a second build of the same kernel name in one process
// (another BSK_NVCC_FLAGS, a rebuilt cache entry) would skip setting its own attribute and fail to launch.
constexpr int kMaxDevices = 64;  // devices with a slot below; others take the uncached path
bool smem_set[kMaxDevices] = {};
int l2_bytes[kMaxDevices] = {};  // per device, read once
}  // namespace

template <class Traits, class Named, class Args>
int attn_fwd_launch(Args const& a, cudaStream_t stream) {
  using Mainloop = typename Traits::Mainloop;
  using Epilogue = typename Traits::Epilogue;
  using Element = typename Mainloop::Element;

  if (a.head_dim != Traits::kHeadDim) return kErrBadHeadDim;
  if (a.batch <= 0 || a.heads <= 0 || a.heads_kv <= 0 || a.heads % a.heads_kv != 0 || a.seq_q <= 0 ||
      a.seq_k <= 0 || a.n_qblocks * Traits::kBlockM < a.seq_q || a.n_qblocks <= 0)
    return kErrBadShape;
  long long strides[] = {a.q_stride_b, a.q_stride_h, a.q_stride_s, a.k_stride_b, a.k_stride_h, a.k_stride_s,
                         a.v_stride_b, a.v_stride_h, a.v_stride_s, a.o_stride_b, a.o_stride_h, a.o_stride_s,
                         a.lse_stride_b, a.lse_stride_h};
  for (long long s : strides)
    if (!fits_int(s)) return kErrStrideRange;

  ProblemShape ps{a.batch, a.heads, a.seq_q, a.seq_k, a.head_dim};
  StrideQKV dQ{int(a.q_stride_s), _1{}, make_tuple(int(a.q_stride_b), int(a.q_stride_h))};
  StrideQKV dK{int(a.k_stride_s), _1{}, make_tuple(int(a.k_stride_b), int(a.k_stride_h))};
  StrideQKV dV{int(a.v_stride_s), _1{}, make_tuple(int(a.v_stride_b), int(a.v_stride_h))};
  StrideQKV dO{int(a.o_stride_s), _1{}, make_tuple(int(a.o_stride_b), int(a.o_stride_h))};
  cute::tuple<_1, cute::tuple<int, int>> dLSE{_1{}, make_tuple(int(a.lse_stride_b), int(a.lse_stride_h))};

  BsrParams bsr{a.col_idx, a.block_kind, a.layout_heads, a.col_stride,
                a.heads_kv, a.heads / a.heads_kv, a.window_left, a.window_right};

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return int(err);
  bool known = device >= 0 && device < kMaxDevices;
  int l2 = known ? l2_bytes[device] : 0;
  if (l2 <= 0) {
    err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    if (err != cudaSuccess) return int(err);
    if (known) l2_bytes[device] = l2;
  }
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
      Epilogue::to_underlying_arguments(ps, typename Epilogue::Arguments{static_cast<Element*>(a.o), dO, a.lse, dLSE}),
      BsrTileScheduler::make(a.batch, a.heads, a.n_qblocks, Traits::kBlockM / Traits::kTileM, a.layout_heads,
                             reinterpret_cast<const int4*>(a.row_sched), Traits::kPersistent, a.sm_count, a.rank_major,
                             group)};

  int smem = int(Named::SharedStorageSize);
  if (!known || !smem_set[device]) {
    err = cudaFuncSetAttribute(cutlass::device_kernel<Named>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return int(err);
    if (known) smem_set[device] = true;
  }
  dim3 grid = BsrTileScheduler::get_grid_shape(params.tile_scheduler);
  dim3 block(Named::MaxThreadsPerBlock, 1, 1);
  cutlass::device_kernel<Named><<<grid, block, smem, stream>>>(params);
  return int(cudaGetLastError());
}

}  // namespace bsk
