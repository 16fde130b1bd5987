// Split-KV (config split_kv, layouts whose rows are skewed: layout/split.py): the schedule's first n_pieces entries
// of every layout head are pieces of long rows. The scheduler adds the entry's index to the block coordinate; the
// epilogue writes a piece's O (fp32, normalized by the piece's own sum) and LSE to a workspace instead of O and LSE,
// and a combine kernel, launched by the same launcher right after on the same stream, merges a row's pieces in a
// fixed order into O and LSE. The mainloops are unchanged: a piece is a row over a sub-range of its blocks (its
// real row, so masks and positions are the row's).
#pragma once

#include "bsk/common/launch.hpp"
#include "bsk/common/tile_scheduler.hpp"
#include "bsk/sm90/epilogue.hpp"

namespace bsk {

// BsrTileScheduler's order; mode 3 of the coordinate is (start, end, first, entry): entry = the schedule entry
// (the row's slot in heaviest-first order) the tile belongs to.
struct BsrSplitTileScheduler : BsrTileScheduler {
  CUTLASS_DEVICE BsrSplitTileScheduler(Params const& p) : BsrTileScheduler(p) {}

  CUTLASS_DEVICE auto get_block_coord() {
    Located t = locate();
    return cute::make_coord(t.m_block, cute::_0{}, cute::make_coord(t.b, t.h),
                            cute::make_coord(t.e.y, t.e.z, t.e.w, t.entry));
  }
};

// BsrEpilogue, except for pieces (entry < n_pieces): O fp32 straight from the accumulators (pairs of adjacent
// columns as float2) and LSE to the workspace tile of (b, h, entry, 64-row sub-tile), [B, H, n_pieces, BlockM, D]
// and [B, H, n_pieces, BlockM], rows past seq_q included (never read).
template <class Element, int HeadDim, int BlockM>
struct BsrSplitEpilogue : BsrEpilogue<Element, HeadDim> {
  using Base = BsrEpilogue<Element, HeadDim>;
  using typename Base::TensorStorage;
  static constexpr int kSubTiles = BlockM / 64;

  struct Arguments {
    Element* ptr_O;
    StrideQKV dO;
    float* ptr_LSE;
    StrideLSE dLSE;
    float* ws_o;
    float* ws_lse;
    int n_pieces;
  };
  struct Params : Base::Params {
    float* ws_o;
    float* ws_lse;
    int n_pieces;
  };

  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& a, void* = nullptr) {
    return Params{Base::to_underlying_arguments(ps, typename Base::Arguments{a.ptr_O, a.dO, a.ptr_LSE, a.dLSE}),
                  a.ws_o, a.ws_lse, a.n_pieces};
  }

  template <class TileShape, class BlkCoord, class ResultTuple, class TiledMma, class Pipeline>
  CUTLASS_DEVICE void operator()(TileShape const& tile_shape, BlkCoord const& blk_coord, ResultTuple const& result,
                                 TiledMma const& tiled_mma, ProblemShape const& ps, Params const& params,
                                 Pipeline& pipeline, TensorStorage& storage) {
    int entry = get<3, 3>(blk_coord);
    if (entry >= params.n_pieces) {
      Base::operator()(tile_shape, blk_coord, result, tiled_mma, ps, params, pipeline, storage);
      return;
    }
    auto const& acc = get<0>(result);
    auto const& lse = get<1>(result);
    int m = int(get<0>(blk_coord));
    int b = get<2, 0>(blk_coord), h = get<2, 1>(blk_coord);
    size_t tile = (size_t(b) * get<1>(ps) + h) * params.n_pieces + entry;
    tile = tile * kSubTiles + m % kSubTiles;
    auto thr_mma = tiled_mma.get_thread_slice(int(threadIdx.x));
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<_64, Int<HeadDim>>{}));
    static_assert(decltype(size(tOcO))::value % 2 == 0, "accumulator values come in column pairs");
    float* o = params.ws_o + tile * 64 * HeadDim;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      int r = int(get<0>(tOcO(i))), c = int(get<1>(tOcO(i)));
      *reinterpret_cast<float2*>(o + r * HeadDim + c) = make_float2(acc(i), acc(i + 1));
    }
    Tensor tOcO_mn = make_tensor(tOcO.data(), fmha_c::layout_acc_mn(tiled_mma, tOcO.layout()));
    if (get<1>(tOcO_mn(0, 0)) == 0) {
      float* l = params.ws_lse + tile * 64;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(tOcO_mn); ++i) l[int(get<0>(tOcO_mn(i, 0)))] = lse(i) == INFINITY ? -INFINITY : lse(i);
    }
  }
};

// The combine: every row of every split row's block (b, h, split row s, row r of the block) merges its split_k
// pieces, in piece order (bitwise deterministic, no atomics): m = max_i LSE_i, LSE = m + log sum_i exp(LSE_i - m),
// O = sum_i (exp(LSE_i - m) / sum) O_i in fp32, written in O's type. Pieces that see no key (LSE_i = -inf) are
// skipped; a row none of whose pieces sees a key gets O = 0, LSE = -inf; a NaN LSE_i makes the row NaN (a NaN in
// a seen piece's O propagates through the sum). kThreads (HeadDim / 8) threads a row, 8 columns each: two 16-byte
// workspace loads a piece, one 16-byte store of O.
struct SplitCombineParams {
  const float* ws_o;   // [B, H, n_pieces, BlockM, HeadDim]
  const float* ws_lse; // [B, H, n_pieces, BlockM]
  const int4* sched;   // the split schedule [layout_heads, n_entries]: entry s * split_k is split row s's first piece
  void* o;
  float* lse;
  long long o_stride_b, o_stride_h, o_stride_s, lse_stride_b, lse_stride_h;
  int heads, layout_heads, n_entries, split_rows, split_k;
  long long n_rows;    // B * H * split_rows * BlockM
};

template <class Element, int HeadDim, int BlockM>
struct SplitCombine {
  static constexpr int kVec = 8;
  static constexpr int kThreadsPerRow = HeadDim / kVec;
  static constexpr int kThreads = 256;
  static_assert(HeadDim % kVec == 0 && kThreads % kThreadsPerRow == 0, "whole rows per CTA");

  static CUTLASS_DEVICE void run(SplitCombineParams const& p) {
    long long t = (long long)blockIdx.x * kThreads + threadIdx.x;
    long long g = t / kThreadsPerRow;
    if (g >= p.n_rows) return;
    int c = int(t % kThreadsPerRow) * kVec;
    int r = int(g % BlockM);
    long long rest = g / BlockM;
    int s = int(rest % p.split_rows);
    rest /= p.split_rows;
    int h = int(rest % p.heads), b = int(rest / p.heads);
    int lh = p.layout_heads == 1 ? 0 : h;
    int row = __ldg(&p.sched[size_t(lh) * p.n_entries + size_t(s) * p.split_k].x);
    size_t piece0 = (size_t(b) * p.heads + h) * size_t(p.split_rows) * p.split_k + size_t(s) * p.split_k;
    const float* l = p.ws_lse + piece0 * BlockM + r;
    const float* o = p.ws_o + (piece0 * BlockM + r) * HeadDim + c;

    float m = -INFINITY;
    bool nan = false;
    for (int i = 0; i < p.split_k; ++i) {
      float x = __ldg(l + size_t(i) * BlockM);
      nan |= x != x;
      m = fmaxf(m, x);
    }
    float acc[kVec];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kVec; ++j) acc[j] = nan ? NAN : 0.f;
    float row_lse = nan ? NAN : -INFINITY;
    if (!nan && m != -INFINITY) {
      float sum = 0.f;
      for (int i = 0; i < p.split_k; ++i) {
        float x = __ldg(l + size_t(i) * BlockM);
        if (x != -INFINITY) sum += expf(x - m);
      }
      row_lse = m + logf(sum);
      float inv = 1.f / sum;
#pragma unroll 4
      for (int i = 0; i < p.split_k; ++i) {
        float x = __ldg(l + size_t(i) * BlockM);
        if (x == -INFINITY) continue;
        float w = expf(x - m) * inv;
        float4 lo = __ldcs(reinterpret_cast<const float4*>(o + size_t(i) * BlockM * HeadDim));
        float4 hi = __ldcs(reinterpret_cast<const float4*>(o + size_t(i) * BlockM * HeadDim + 4));
        acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
        acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
      }
    }
    cutlass::Array<float, kVec> in;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kVec; ++j) in[j] = acc[j];
    cutlass::Array<Element, kVec> out = cutlass::NumericArrayConverter<Element, float, kVec>{}(in);
    long long q = (long long)row * BlockM + r;
    Element* dst = static_cast<Element*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + q * p.o_stride_s + c;
    uint32_t const* w = reinterpret_cast<uint32_t const*>(&out);
    // one 16-byte store (nvcc splits a uint4 assignment from this array into four 4-byte ones)
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
    if (c == 0) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] = row_lse;
  }
};

template <class Element, int HeadDim, int BlockM>
__global__ void __launch_bounds__(SplitCombine<Element, HeadDim, BlockM>::kThreads)
    bsk_split_combine(SplitCombineParams p) {
  SplitCombine<Element, HeadDim, BlockM>::run(p);
}

// Launch the combine after the split kernel, on its stream. Args: the launcher's argument struct (checked by
// attn_fwd_launch); split_k pieces per split row, n_pieces / split_k split rows per layout head.
template <class Element, int HeadDim, int BlockM, class Args>
int split_combine_launch(Args const& a, cudaStream_t stream) {
  using C = SplitCombine<Element, HeadDim, BlockM>;
  SplitCombineParams p{static_cast<const float*>(a.ws_o), static_cast<const float*>(a.ws_lse),
                       reinterpret_cast<const int4*>(a.row_sched), a.o, a.lse, a.o_stride_b, a.o_stride_h,
                       a.o_stride_s, a.lse_stride_b, a.lse_stride_h, a.heads, a.layout_heads, a.n_qblocks,
                       a.n_pieces / a.split_k, a.split_k,
                       (long long)a.batch * a.heads * (a.n_pieces / a.split_k) * BlockM};
  long long blocks = (p.n_rows * C::kThreadsPerRow + C::kThreads - 1) / C::kThreads;
  if (blocks > kIntMax) return kErrBadShape;
  bsk_split_combine<Element, HeadDim, BlockM><<<unsigned(blocks), C::kThreads, 0, stream>>>(p);
  return int(cudaGetLastError());
}

}  // namespace bsk
