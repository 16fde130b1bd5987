// Split-KV (config split_kv, layouts whose rows are skewed: layout/split.py): the schedule's first n_pieces entries
// of every layout head are pieces of long rows. The scheduler adds the entry's index to the block coordinate; the
// epilogue writes a piece's O (fp32, normalized by the piece's own sum) and LSE to a workspace instead of O and LSE,
// and the op's combine (ops/attention_split.py) merges a row's pieces in a fixed order. The mainloops are unchanged:
// a piece is a row over a sub-range of its blocks (its real row, so masks and positions are the row's).
#pragma once

#include "bsk/common/tile_scheduler.hpp"
#include "bsk/sm90/epilogue.hpp"

namespace bsk {

// BsrTileScheduler's order; mode 3 of the coordinate is (start, end, first, entry): entry = the schedule entry
// (the row's slot in heaviest-first order) the tile belongs to.
struct BsrSplitTileScheduler : BsrTileScheduler {
  CUTLASS_DEVICE BsrSplitTileScheduler(Params const& p) : BsrTileScheduler(p) {}

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
    int entry = rank / params.tiles_per_row;
    int4 e = __ldg(params.row_sched + size_t(lh) * params.n_rows + entry);
    int m_block = e.x * params.tiles_per_row + rank % params.tiles_per_row;
    return cute::make_coord(m_block, cute::_0{}, cute::make_coord(b, h), cute::make_coord(e.y, e.z, e.w, entry));
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

}  // namespace bsk
