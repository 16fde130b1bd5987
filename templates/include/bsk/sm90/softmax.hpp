// The online-softmax steps of the two-warpgroup mainloop: every tile after a row's first (softmax_rescale_step),
// kept apart from the mainloop because its variant decides how the exp2 stream overlaps the tile GEMMs (the
// mainloop picks a mode per head dim, this file says what each mode computes), and a row's first tile
// (softmax_first_step). The tail is example 88's CollectiveSoftmax.
#pragma once

#include "bsk/sm90/base.hpp"

namespace bsk {

// The max of a row across the threads that hold it (the MMA layout's reduction target: shuffles within a quad).
template <class TiledMmaQK>
CUTLASS_DEVICE float max_across_row_threads(float mx, TiledMmaQK const& tiled_mma_qk) {
  auto red = fmha_c::reduction_target_n(tiled_mma_qk);
  for_each(make_seq<decltype(rank(red))::value>{}, [&](auto r) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 1; k < shape<r>(red); k *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, stride<r>(red) * k));
  });
  return mx;
}

// New row max (thread-local, then across the threads that share a row), the running sum rescaled by
// corr = 2^((old max - new max) * scale), P = 2^(s * scale - max * scale). Returns whether O must be rescaled by
// corr (rescale_o), which the caller does once the PV GEMM in flight has completed. Modes:
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
  constexpr int kRows = decltype(size<0>(s))::value;
  auto& row_max = get<0>(state);
  auto& row_sum = get<1>(state);
  auto tile_max = [&](int i) {
    float mx = row_max(i);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(s); ++j) mx = fmaxf(mx, s(i, j));
    return max_across_row_threads(mx, tiled_mma_qk);
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

// A row's first tile: its max by a pairwise tree, then P = 2^(s * scale - max * scale) over S and the thread's
// partial sums: the state example 88's first step (CollectiveSoftmax::step) leaves, max across the row's threads
// and sums per thread. Example 88's max is one dependent chain over the thread's columns, and on a row's first tile
// nothing of the warpgroup's can run until it is done: on rows of a few blocks that chain is on every row's path.
template <class AccQK, class TiledMmaQK, class State>
CUTLASS_DEVICE void softmax_first_step(AccQK& acc_qk, TiledMmaQK const& tiled_mma_qk, State& state, float scale_log2) {
  Tensor s = make_tensor(acc_qk.data(), fmha_c::layout_acc_mn(tiled_mma_qk, acc_qk.layout()));
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr int kCols = decltype(size<1>(s))::value;
  auto& row_max = get<0>(state);
  auto& row_sum = get<1>(state);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    float m[kCols];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols; ++j) m[j] = s(i, j);
    CUTLASS_PRAGMA_UNROLL
    for (int w = 1; w < kCols; w *= 2) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j + w < kCols; j += 2 * w) m[j] = fmaxf(m[j], m[j + w]);
    }
    row_max(i) = max_across_row_threads(m[0], tiled_mma_qk);
  }
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    float sub = (row_max(i) == -INFINITY ? 0.f : row_max(i)) * scale_log2;
    float sum = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols; ++j) {
      float e = ::exp2f(fmaf(s(i, j), scale_log2, -sub));
      s(i, j) = e;
      sum += e;
    }
    row_sum(i) = sum;
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

}  // namespace bsk
