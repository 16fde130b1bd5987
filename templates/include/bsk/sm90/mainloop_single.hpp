// The single-MMA-warpgroup mainloop (64 query rows per tile). Apart from the two-warpgroup one because it has no
// producer warp: it loads for itself and runs in its own shell (kernel_single.hpp).
#pragma once

#include "bsk/common/block_layout.hpp"
#include "bsk/sm90/base.hpp"
#include "bsk/sm90/mainloop_common.hpp"

namespace bsk {

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

    auto lse = softmax.tail(softmax_state, acc_pv, tiled_mma_pv);
    Common::nan_lse_where_sum_is_nan(lse, softmax_state);
    return make_tuple(acc_pv, lse);
  }
};

}  // namespace bsk
