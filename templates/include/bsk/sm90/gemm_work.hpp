// The BSR GEMM's work list: which output tile a persistent CTA's w-th item is, and which A and B tiles its k
// steps read. Items are output block rows (DSD: block rows of A, heaviest first from the layout's row schedule;
// DSD_T: block columns of A, heaviest first from the transposed layout's schedule) times N tiles, or (SDD) the
// listed output blocks in a column-grouped order; DSD/DSD_T waves alternate direction. N tiles are walked in
// strips: the CTAs running at one time share a strip of B's columns (strip * TileN wide, K deep, sized in the
// launcher to fit half of L2) and each A row of blocks is read once per strip.
#pragma once

#include <climits>
#include <cstdint>

#include "cutlass/cutlass.h"

namespace bsk {

enum : int { kOpDsd = 0, kOpDsdT = 1, kOpSdd = 2 };
// Named barrier (CUTLASS user id): the two MMA warpgroups meet at kBarGemmPad after zeroing a padded A tile.
enum : uint32_t { kBarGemmPad = 0 };

struct GemmItem {
  int out_blk;  // output block row (DSD, SDD: block row of A; DSD_T: block column of A)
  int nt;       // N tile (SDD: 0)
  int start;    // first listed block of the row (DSD/DSD_T)
  int count;    // listed blocks of the row (DSD/DSD_T)
  int steps;    // k steps of 64
  int col_blk;  // SDD: the output block's column
  int value;    // SDD: the output block's index in the values (< 0: computed, not stored)
  int col_blk2; // SDD pair tiles: the second block's column and value index
  int value2;
};

struct GemmWork {
  const int4* sched;   // DSD/DSD_T: row schedule (row, start, end, first); SDD: (row, col, value, 0)
  const int* blk_b;    // per listed block, B's block row (DSD: col_idx; DSD_T: the transpose's col_idx)
  const int* blk_a;    // DSD_T: per listed block of the transpose, its index in the values
  int total;           // items (of a cluster: a CTA pair runs one item, each CTA its own N tile / entry)
  int n_items;         // schedule entries (SDD: entry pairs when the kernel runs CTA pairs or pair tiles)
  int n_tiles;         // N tiles (SDD: 1); with CTA pairs, pairs of N tiles
  int strip;           // N tiles (pairs) per strip
  int steps_per_block; // k steps per listed block (DSD/DSD_T); SDD: k steps of the dense K
  int last_blk;        // the last block along the reduction when it is partial, else -1
  int k_valid_last;    // its valid rows of the reduction (< the block), else the block
  int n;               // N
  int a_rows, a_cols;  // A's TMA view (rows x cols as the descriptor has them)
  int b_k;             // B's reduction length (rows of b)

  // Item w of the (cluster's) work list as CTA `rank` of the cluster runs it; SDD: each CTA takes Pair entries.
  template <int Op, int Cluster, int Pair = 1>
  CUTLASS_DEVICE GemmItem item(int w, int rank) const {
    GemmItem it{};
    int grid = int(gridDim.x) / Cluster;  // the persistent CTAs (clusters) walking the items
    if (Op != kOpSdd && total <= 3 * grid) {
      // CTA c runs items c, c + grid, ... of a heaviest-first list; with few waves every other wave walks
      // backwards, so the CTA that ran a wave's heaviest item runs the next wave's lightest (rows of unequal
      // length). Over many waves the CTAs drift apart anyway, and the reversed waves spread the items running at
      // one time over more rows and strips (L2): hence up to 3 waves only.
      int wave = w / grid;
      if (wave & 1) {
        int first = wave * grid;
        w = first + (min(grid, total - first) - 1 - (w - first));
      }
    }
    int per_strip = n_items * strip;
    int s = w / per_strip;
    int rem = w - s * per_strip;
    int wcur = min(strip, n_tiles - s * strip);
    int r = rem / wcur;
    it.nt = (s * strip + (rem - r * wcur)) * Cluster + rank;
    int entry = Op == kOpSdd ? (r * Cluster + rank) * Pair : r;  // SDD: the first of the CTA's Pair entries
    int4 e = sched[entry];
    it.out_blk = e.x;
    if constexpr (Op == kOpSdd) {
      // (row, col, value, skip): value < 0 marks a pair's partner slot (computed, not stored; its row is its
      // partner's, so the shared A tile is right); skip = 1 on both slots of a padding pair (nothing runs).
      it.nt = 0;
      it.col_blk = e.y;
      it.value = e.z;
      if constexpr (Pair == 2) {
        int4 e2 = sched[entry + 1];
        it.col_blk2 = e2.y;
        it.value2 = e2.z;
      } else {
        it.col_blk2 = 0;
        it.value2 = -1;
      }
      it.steps = e.w ? 0 : steps_per_block;
      it.start = 0;
      it.count = 0;
    } else {
      it.start = e.y;
      it.count = e.z - e.y;
      it.steps = it.count * steps_per_block;
    }
    return it;
  }

  // The first k step of the row's last block when that block is the partial last one, else INT_MAX.
  template <int Op>
  CUTLASS_DEVICE int pad_step_from(GemmItem const& it) const {
    if (Op == kOpSdd || last_blk < 0 || it.count == 0) return INT_MAX;
    return blk_b[it.start + it.count - 1] == last_blk ? it.steps - steps_per_block : INT_MAX;
  }
};

struct GemmEpilogueParams {
  void* out;          // DSD/DSD_T: [rows, N] row-major; SDD: values [nnz, TileM, TileN]
  const float* bias;  // [N] fp32 or null
  float alpha, beta;
  int rows;           // output rows (DSD: M, DSD_T: K)
};

}  // namespace bsk
