// Which query tile each CTA runs, in what order: the order decides L2 reuse of K/V and the load balance across
// SMs, so it lives in one place that every kernel shell of every arch shares.
//
// Query tiles run in heaviest-row-first order. When every row has the same length, linear tile id -> (m rank
// fastest, head, batch): CTAs running at the same time work on the same head, so its K/V tiles are shared through
// L2. When rows differ (causal, windows at the edges, learned top-k), id -> (rank slowest, head, batch): the
// heaviest rows of every head go first, which a static round-robin (persistent) or in-order (one tile per CTA)
// dispatch turns into longest-processing-time-first load balance. Each tile reads one 16-byte entry of the
// layout's row schedule (row, start, end, first block), the only index load before the row's first K load.
#pragma once

#include <algorithm>

#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"
#include "cute/tensor.hpp"

namespace bsk {

struct BsrTileScheduler {
  struct Params {
    int num_tiles;
    int m_tiles;       // query tiles per (batch, head)
    // BlockM / TileM. A FastDivmod: every role splits each tile's rank into (row, sub-tile) on the way to the
    // row's first load, where a runtime integer division is a dependent chain of ~20 instructions.
    cutlass::FastDivmod div_tpr;
    int n_rows;        // layout rows (row_sched stride)
    int layout_heads;
    cutlass::FastDivmod div_m;
    cutlass::FastDivmod div_h;
    cutlass::FastDivmod div_group;        // heaviest-first order: (batch, head)s per group
    cutlass::FastDivmod div_group_tiles;  // tiles per group
    const int4* row_sched;  // [layout heads][n_rows]: (row, start, end, first block: column | kind << shift)
    int grid;
    int rank_major;
  };

  Params const& params;
  int idx;

  CUTLASS_DEVICE BsrTileScheduler(Params const& p) : params(p), idx(int(blockIdx.x)) {}

  // rank_major (rows differ in length): heaviest rows first across the (batch, head)s of a group of `group` of
  // them (a divisor of batch * heads that the launcher picks so that a group's K/V fits in L2), group after group.
  // With every head in one group the tiles in flight would each read another head's K/V once the heads' K/V
  // outgrow L2 (causal rows over 1K keys at 16 x 16 heads: DRAM-bound); with none, the order within a head.
  static Params make(int batch, int heads, int n_rows, int tiles_per_row, int layout_heads, const int4* row_sched,
                     bool persistent, int sm_count, int rank_major, int group) {
    Params p;
    p.m_tiles = n_rows * tiles_per_row;
    p.num_tiles = p.m_tiles * heads * batch;
    p.div_tpr = cutlass::FastDivmod(tiles_per_row);
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
      cute::tma_store_wait<0>();
    }
    return valid;
  }

  // This tile's (batch, head), its row's schedule entry, the entry's index and the 64/128-row m block.
  struct Located {
    int4 e;
    int entry;
    int m_block;
    int b;
    int h;
  };
  CUTLASS_DEVICE Located locate() const {
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
    int entry, sub;
    params.div_tpr(entry, sub, rank);
    // int32 offsets: the launcher bounds the tile count (every head's rows) by INT_MAX
    int4 e = __ldg(params.row_sched + (lh * params.n_rows + entry));
    return Located{e, entry, e.x * params.div_tpr.divisor + sub, b, h};
  }

  CUTLASS_DEVICE auto get_block_coord() {
    Located t = locate();
    return cute::make_coord(t.m_block, cute::_0{}, cute::make_coord(t.b, t.h), cute::make_coord(t.e.y, t.e.z, t.e.w));
  }

  CUTLASS_DEVICE BsrTileScheduler& operator++() {
    idx += int(gridDim.x);
    return *this;
  }
};

}  // namespace bsk
