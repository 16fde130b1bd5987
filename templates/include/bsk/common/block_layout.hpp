// What a kernel reads of a BlockSparseLayout: the block kinds, the packing of a row-schedule entry, the layout
// and element-rule parameters, and a cursor over one query-block row. These constants are restated in Python
// (blackwell_sparsek.layout); tests/test_headers.py parses this file and fails when the two sides disagree.
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"

namespace bsk {

// Block-kind bits, as BlockSparseLayout writes them: FULL needs no element mask; BOUNDS reaches past seq_k;
// RULE is cut by the element rule (causal / window edge). A block may be BOUNDS | RULE.
enum : uint8_t { kBlockFull = 0, kBlockBounds = 1, kBlockRule = 2 };

// Row-schedule entry, one int4 per query-block row (row, start, end, first): first = column | kind << shift of
// the row's first block, so neither the row's first K load nor its first softmax waits on an index load.
constexpr int kSchedKindShift = 24;
constexpr int kSchedColMask = 0xffffff;
static_assert(kSchedColMask == (1 << kSchedKindShift) - 1, "the column takes every bit below the kind");

CUTLASS_HOST_DEVICE int sched_col(int first) { return first & kSchedColMask; }
CUTLASS_HOST_DEVICE int sched_kind(int first) { return int(unsigned(first) >> kSchedKindShift); }

// What the kernel needs of the sparsity layout and the element rule.
struct BsrParams {
  const int* col_idx;
  const uint8_t* block_kind;
  int layout_heads;
  int col_stride;
  int heads_kv;
  cutlass::FastDivmod group;  // query heads per K/V head (the loaders divide a head by it at every row)
  int window_left;            // element rule, -1 = unbounded
  int window_right;
};

// Reads one query-block row's column indices and kinds 32 at a time (one coalesced load per warp per 32
// blocks), handing them out with warp shuffles: the index load leaves the per-tile critical path. Block 0's column
// and kind come from the row's schedule entry, so neither the row's first K load nor its first softmax waits for
// the chunk.
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
      col = sched_col(first);
      kind = sched_kind(first);
      return;
    }
    col = __shfl_sync(0xffffffffu, chunk_col, blk % 32);
    kind = __shfl_sync(0xffffffffu, chunk_kind, blk % 32);
  }
};

}  // namespace bsk
