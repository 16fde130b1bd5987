// BlackwellSparseK backward (sm_90a): what the backward kernel reads of the TRANSPOSED layout, and its tile order.
//
// The backward walks key blocks (one CTA per 128-key tile) and, for each, the query blocks that list it: the
// transposed view of the forward's BSR layout, derived on the device by blackwell_sparsek.ops.attention_bwd
// (rows = key blocks, col_idx = query blocks, kinds carried over, BOUNDS also on the last query block when
// seq_q % block_m). Its schedule has the forward's packing: one int4 (key block, start, end, first query block |
// kind << 24) per key block, heaviest first.
//
// The block kinds, the schedule packing, the row cursor and the launcher's return codes and helpers are the
// forward's (bsk/common/): one statement of each for both directions.
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"
#include "cute/tensor.hpp"

#include "bsk/common/block_layout.hpp"
#include "bsk/common/launch.hpp"

namespace bsk::bwd {

using namespace cute;

// B, H, Sq, Sk, D (example 88's problem shape).
using ProblemShape = cute::tuple<int, int, int, int, int>;

// The transposed layout and the element rule.
struct TLayoutParams {
  const int* q_idx;        // [layout_heads][col_stride]: per key block, the query blocks that list it (ascending)
  const uint8_t* kind;     // same shape: block kind bits
  int layout_heads;        // 1 (shared by all heads) or heads_kv (per-head layouts, stacked per K/V head)
  int col_stride;          // row stride of q_idx / kind
  int heads_kv;
  int group;               // query heads per K/V head (GQA): the layout stacks them (see split_entry)
  int nq_head;             // query blocks per head: a stacked entry's stride between heads
  int window_left;         // element rule, -1 = unbounded
  int window_right;
  // Deterministic mode only (else null / 0):
  const int* rank;         // same shape as q_idx: this entry's turn among the query block's contributions
  int* sem;                // [B][H][n_qtiles]: contributions added so far to each 64-query dQ tile (zeroed)
  int n_qtiles;            // ceil(seq_q / 64)
};

// One key block's list of query blocks: the pointers, the count, and block 0 packed (column | kind << 24).
struct TColumn {
  const int* q_idx;
  const uint8_t* kind;
  const int* rank;
  int count;
  int first;
};

// blk_coord: (_0, 128-key tile, (b, K/V head), (start, end, first)) as BwdTileScheduler makes it.
template <class BlkCoord>
CUTLASS_DEVICE TColumn column_of(BlkCoord const& blk_coord, TLayoutParams const& l) {
  int h = get<2, 1>(blk_coord);
  int lh = l.layout_heads == 1 ? 0 : h;
  int start = get<3, 0>(blk_coord);
  size_t base = size_t(lh) * l.col_stride + start;
  return TColumn{l.q_idx + base, l.kind + base, l.rank != nullptr ? l.rank + base : nullptr,
                 get<3, 1>(blk_coord) - start, get<3, 2>(blk_coord)};
}

// A column entry -> (r, query block): under GQA the transposed layout stacks the query heads that share a K/V
// head (one CTA per key tile of a K/V head walks all of them), query block qb of the group's r-th head as
// qb + r * nq_head, ascending, so r changes at most group - 1 times along a column.
CUTLASS_DEVICE void split_entry(int entry, TLayoutParams const& l, int& r, int& qb) {
  r = l.group == 1 ? 0 : entry / l.nq_head;
  qb = entry - r * l.nq_head;
}

// blk_coord with query head h in place of its K/V head (the Q, dO, LSE2, delta and dQ coordinates).
template <class BlkCoord>
CUTLASS_DEVICE BlkCoord with_head(BlkCoord const& c, int h) {
  BlkCoord out = c;
  get<2, 1>(out) = h;
  return out;
}

// Deterministic dQ: the contributions to one dQ tile are added in one fixed order, the turns the layout gives them
// (rank: estimated arrival inside waves of CTAs, attention_bwd.det_ranks). A contributor waits until the tile's
// counter equals its rank, adds, waits until its TMA reduce has completed (writes, not only the shared-memory
// read), and bumps the counter with release semantics. Proxy fences order the generic-proxy counter against the async-proxy (TMA) global accesses.
CUTLASS_DEVICE void wait_turn(int const* sem, int rank) {
  int v;
  do {
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(sem) : "memory");
  } while (v != rank);
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

CUTLASS_DEVICE void pass_turn(int* sem) {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;" : : "l"(sem) : "memory");
}

// Backward-only kind bits of the transposed view: a layout of 64-wide key blocks runs as pairs (one 128-key
// column per two neighbouring key blocks, over the union of their query blocks), and an entry whose query block
// lists only one of the pair carries the other half's bit (attention_bwd_view.transposed_view writes them). The
// warpgroup of an unlisted half computes nothing for that entry (its P and dS would be 0).
enum : int { kPairNoLo = 4, kPairNoHi = 8 };

// Element mask of one S^T tile (keys x queries), only on blocks whose kind is not FULL: sequence ends (keys past
// seq_k, queries past seq_q) and, with the RULE bit, the bottom-right aligned window rule. Masked scores become
// -inf, so P = 0 there. tScS holds each accumulator element's (key, query) inside the tile. (The unlisted half of
// a pair is not masked: its warpgroup skips the entry, see BwdMainloop.)
template <class AccS, class CoordS>
CUTLASS_DEVICE void apply_mask(AccS& acc_s, CoordS const& tScS, int k0, int q0, int kind, int seq_q, int seq_k,
                               TLayoutParams const& l) {
  bool rule = (kind & kBlockRule) != 0;
  int wl = rule ? l.window_left : -1;
  int wr = rule ? l.window_right : -1;
  CUTLASS_PRAGMA_UNROLL
  for (int e = 0; e < size(acc_s); ++e) {
    int kk = k0 + int(get<0>(tScS(e)));
    int qq = q0 + int(get<1>(tScS(e)));
    int qd = qq + seq_k - seq_q;
    bool keep = kk < seq_k && qq < seq_q;
    if (wl >= 0) keep = keep && kk >= qd - wl;
    if (wr >= 0) keep = keep && kk <= qd + wr;
    if (!keep) acc_s(e) = -INFINITY;
  }
}

// Key tiles heaviest first across a group of (batch, K/V head)s whose Q/dO fit in half of L2, group after group:
// the transposed schedule is heaviest first within a head; ranks across the heads of a group interleave, so the
// longest columns start first everywhere (longest-processing-time-first on a one-CTA-per-tile grid). Under GQA a
// (batch, K/V head)'s column lists the blocks of all its query heads.
struct BwdTileScheduler {
  struct Params {
    int num_tiles;
    int n_tiles;        // 128-key tiles per (batch, head)
    int tiles_per_col;  // BlockN / 128
    int n_cols;         // key blocks (transposed rows; schedule stride)
    int layout_heads;
    cutlass::FastDivmod div_h;
    cutlass::FastDivmod div_group;
    cutlass::FastDivmod div_group_tiles;
    const int4* sched;  // [layout_heads][n_cols]: (key block, start, end, first query block | kind << 24)
  };

  Params const& params;
  int idx;

  CUTLASS_DEVICE BwdTileScheduler(Params const& p) : params(p), idx(int(blockIdx.x)) {}

  static Params make(int batch, int heads, int n_cols, int tiles_per_col, int layout_heads, const int4* sched,
                     int group) {
    Params p;
    p.n_tiles = n_cols * tiles_per_col;
    p.num_tiles = p.n_tiles * heads * batch;
    p.tiles_per_col = tiles_per_col;
    p.n_cols = n_cols;
    p.layout_heads = layout_heads;
    p.div_h = cutlass::FastDivmod(heads);
    p.div_group = cutlass::FastDivmod(group);
    p.div_group_tiles = cutlass::FastDivmod(group * p.n_tiles);
    p.sched = sched;
    return p;
  }

  static dim3 get_grid_shape(Params const& p) { return dim3(p.num_tiles, 1, 1); }

  CUTLASS_DEVICE bool is_valid() { return idx < params.num_tiles; }

  CUTLASS_DEVICE auto get_block_coord() {
    int g, in_g, rank, rest, b, h;
    params.div_group_tiles(g, in_g, idx);
    params.div_group(rank, rest, in_g);
    rest += g * params.div_group.divisor;
    params.div_h(b, h, rest);
    int lh = params.layout_heads == 1 ? 0 : h;
    int4 e = __ldg(params.sched + size_t(lh) * params.n_cols + rank / params.tiles_per_col);
    int tile = e.x * params.tiles_per_col + rank % params.tiles_per_col;
    return make_coord(_0{}, tile, make_coord(b, h), make_coord(e.y, e.z, e.w));
  }

  CUTLASS_DEVICE BwdTileScheduler& operator++() {
    idx += int(gridDim.x);
    return *this;
  }
};

}  // namespace bsk::bwd
