// What both mainloops share (the two-warpgroup and the single-warpgroup one): Params with the layout, TMA
// descriptors for K/V over the K/V heads (GQA), the row of the layout a tile walks, and the element mask of
// partial blocks. One copy, so the two kernels cannot disagree on the layout or the rule.
#pragma once

#include "bsk/common/block_layout.hpp"
#include "bsk/sm90/base.hpp"

namespace bsk {

// A CUTLASS collective MMA with other gmem stride types, everything else equal. Example 88's single-warpgroup
// mainloop fixes its strides to int; only the host reads them (into TMA descriptors, whose types do not depend on
// the stride type), so the descriptors are built through a copy of its collectives with 64-bit strides.
template <class Mma, class StrideA, class StrideB>
struct WithStrides;
template <class Policy, class Tile, class EA, class SA0, class EB, class SB0, class TiledMma, class GA, class LA,
          class CA, class TA, class GB, class LB, class CB, class TB, class StrideA, class StrideB>
struct WithStrides<cutlass::gemm::collective::CollectiveMma<Policy, Tile, EA, SA0, EB, SB0, TiledMma, GA, LA, CA, TA,
                                                            GB, LB, CB, TB>,
                   StrideA, StrideB> {
  using type = cutlass::gemm::collective::CollectiveMma<Policy, Tile, EA, StrideA, EB, StrideB, TiledMma, GA, LA, CA,
                                                        TA, GB, LB, CB, TB>;
};

template <class Base, int TileM, int BlockM>
struct BsrCommon {
  using Element = typename Base::Element;
  using CollectiveMmaQK = typename WithStrides<typename Base::CollectiveMmaQK, StrideQKV, StrideQKV>::type;
  using CollectiveMmaPV =
      typename WithStrides<typename Base::CollectiveMmaPV, StrideQKV, decltype(select<1, 0, 2>(StrideQKV{}))>::type;
  using TiledMmaQK = typename Base::TiledMmaQK;
  static_assert(std::is_same_v<typename CollectiveMmaQK::Params::TMA_A, typename Base::TMA_Q> &&
                    std::is_same_v<typename CollectiveMmaQK::Params::TMA_B, typename Base::TMA_K> &&
                    std::is_same_v<typename CollectiveMmaPV::Params::TMA_B, typename Base::TMA_V>,
                "the kernel's TMA types must not depend on the gmem stride type");

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
    int h_kv, rest;
    params.bsr.group(h_kv, rest, int(get<2, 1>(blk_coord)));
    return make_coord(get<0>(blk_coord), get<1>(blk_coord), make_coord(get<2, 0>(blk_coord), h_kv));
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

  // Example 88's softmax tail reports +inf for a row whose sum is 0 (no visible key) and for one whose sum is
  // NaN (a visible +inf or NaN logit); the epilogue turns +inf into our empty-row LSE, -inf. A NaN row must stay
  // NaN, as in SDPA, not read as empty: after tail() the state's sum is the row's full sum.
  template <class Lse, class State>
  CUTLASS_DEVICE static void nan_lse_where_sum_is_nan(Lse& lse, State const& state) {
    auto const& row_sum = get<1>(state);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(lse); ++i) lse(i) = row_sum(i) != row_sum(i) ? NAN : lse(i);
  }
};

}  // namespace bsk
