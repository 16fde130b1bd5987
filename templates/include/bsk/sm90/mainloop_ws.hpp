// The two-MMA-warpgroup mainloop (128 query rows per tile, cooperative or persistent ping-pong) that runs in
// example 88's FmhaKernelTmaWarpSpecialized shell. Ours is the walk over the layout and the order of the work:
// the producer warp TMA-loads only the listed K/V tiles (GQA/MQA through the K/V head index); the consumers run
// WGMMA QK^T, mask only blocks whose kind asks for it, the online softmax, and WGMMA PV with P from registers,
// the softmax of tile j under the PV GEMM of tile j-1. Rows with no blocks give O = 0 and LSE = -inf.
#pragma once

#include "bsk/common/block_layout.hpp"
#include "bsk/sm90/base.hpp"
#include "bsk/sm90/mainloop_common.hpp"
#include "bsk/sm90/softmax.hpp"

namespace bsk {

// The example-88 collective a BsrMainloop builds on. Dual (schedule 'dual', kernel_dual.hpp): one 64-row MMA
// warpgroup per mainloop (NumMmaWarpGroups 1), two such streams per CTA; otherwise the exact type of before.
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, bool Persistent, bool Dual>
using BsrWsBase = std::conditional_t<
    Dual,
    fmha_c::FmhaMainloopTmaWarpSpecialized<
        Element, float, float, Shape<Int<TileM>, Int<TileN>, Int<HeadDim>>, StrideQKV, StrideQKV, StrideQKV,
        fmha_c::DefaultFusion,
        fmha_k::Option<fmha_k::Tag::kIsPersistent, cute::true_type>,
        fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>,
        fmha_k::Option<fmha_k::Tag::kStagesQ, Int<QStages>>,
        fmha_k::Option<fmha_k::Tag::kNumMmaWarpGroups, Int<1>>>,
    fmha_c::FmhaMainloopTmaWarpSpecialized<
        Element, float, float, Shape<Int<TileM>, Int<TileN>, Int<HeadDim>>, StrideQKV, StrideQKV, StrideQKV,
        fmha_c::DefaultFusion,
        fmha_k::Option<fmha_k::Tag::kIsPersistent, cute::bool_constant<Persistent>>,
        fmha_k::Option<fmha_k::Tag::kStagesKV, Int<Stages>>,
        fmha_k::Option<fmha_k::Tag::kStagesQ, Int<QStages>>>>;

// QStages: Q slots, one or two per MMA warpgroup (the config derives it; a persistent CTA loads a warpgroup's
// next tile's Q once a slot is free, so with two the next row's Q loads during this row). Dual: a 64-row tile
// (TileM 64), one warpgroup, its own K/V ring; its row's first K load goes before its Q (which waits for the
// previous row's Q to be released), and no softmax turns (the CTA's two warpgroups walk different rows).
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, int BlockM, int BlockN,
          bool Persistent, bool Dual = false>
struct BsrMainloop : BsrWsBase<Element, HeadDim, TileM, TileN, Stages, QStages, Persistent, Dual> {
  using Base = BsrWsBase<Element, HeadDim, TileM, TileN, Stages, QStages, Persistent, Dual>;

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
  // compute(): the dual schedule's QK GEMM takes Q from registers at head_dim 64 (H200, blocks64 bench, same-run
  // A/B: D=64 64x64 blocks 376-377 vs 354-355 effective TFLOPS; at 128 it measured 2-5 % slower, so Q stays in
  // shared memory there).
  static constexpr bool kQInRegs = Dual && HeadDim == 64;
  // Softmax step (softmax_rescale_step): kSpec where its second P fragment fits the registers (head_dim <= 128;
  // at 256 ptxas spills), kLazy above that. kSoftmaxTurns (compute(): the MMA warpgroups take turns at the
  // softmax step) at head_dim 64, where the exp2 stream is as long as the tile's GEMMs: without the turns the two
  // warpgroups fall into step there (kSpec alone 11-14 % slower than the eager step, with the turns 5-7 % faster);
  // at 128 the turns cost 1-3 %. kOrderTiles: the MMA warpgroups issue their tile GEMMs in turn (the order barrier,
  // every tile): with kSpec the cooperative kernel needs it (causal -9 % without, +5 to +12 % with), the
  // persistent one runs ~1 % faster without (H100 A/Bs).
  static constexpr SoftmaxMode kSoftmaxMode = HeadDim <= 128 ? SoftmaxMode::kSpec : SoftmaxMode::kLazy;
  static constexpr bool kOrderTiles = kSoftmaxMode == SoftmaxMode::kSpec && !Persistent;
  static constexpr bool kSoftmaxTurns = HeadDim == 64 && !Dual;
  // A row's first softmax step: ours (softmax_first_step, a tree max) in the 128-row kernels; the dual kernel keeps
  // example 88's, which measured faster there (three D=64 streams, docs/kernels/sm90_attn_fwd.md).
  static constexpr bool kTreeFirst = !Dual;

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

    if constexpr (kLoadQ && !Dual) load_q.step(q_iter, q_state, smem_pipe_write_q, lane_predicate, q_count);

    for (int j = 0; j < n_tiles; ++j) {
      int col, kind;
      cursor.at(j / kTilesPerBlockN, col, kind);
      int tile = col * kTilesPerBlockN + j % kTilesPerBlockN;
      auto it = &tile;  // a one-element "iterator": step() reads *it
      load_k.template step<false>(it, k_state, smem_pipe_write, lane_predicate, kv_count);
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
    BsrRowCursor cursor{row.cols, row.kinds, row.count, row.first};

    pipeline_q.consumer_wait(smem_pipe_read_q);
    auto sQ_stage = tSrQ(_, _, _, smem_pipe_read_q.index());
    // kQInRegs: Q in registers for the QK GEMM (RS), read once per row. The dual schedule's 64 x 64 QK tiles read
    // A and B from shared memory about as fast as the tensor cores consume them, and the CTA's two streams share
    // that bandwidth.
    auto q_regs = [&] {
      if constexpr (kQInRegs) {
        using TiledMmaQKrs = decltype(fmha_c::convert_to_gmma_rs(TiledMmaQK{}));
        auto thr = TiledMmaQKrs{}.get_thread_slice(thread_idx);
        auto sQ = make_tensor(make_smem_ptr(storage.smem_q.data()), typename Base::SmemLayoutQ{});
        auto sK = make_tensor(make_smem_ptr(storage.smem_k.data()), typename Base::SmemLayoutK{});
        Tensor tSsQ = thr.partition_A(sQ(_, _, smem_pipe_read_q.index()));
        Tensor tSrQr = thr.make_fragment_A(tSsQ);
        cute::copy(tSsQ, tSrQr);
        warpgroup_fence_operand(tSrQr);
        return make_tuple(TiledMmaQKrs{}, tSrQr, thr.make_fragment_B(thr.partition_B(sK)));
      } else {
        return 0;
      }
    }();

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
      if constexpr (kQInRegs) {
        fmha_c::gemm_zero_acc(get<0>(q_regs), get<1>(q_regs), get<2>(q_regs)(_, _, _, smem_pipe_read.index()),
                              acc_qk);
      } else {
        fmha_c::gemm_zero_acc(tiled_mma_qk, sQ_stage, tSrK(_, _, _, smem_pipe_read.index()), acc_qk);
      }
      warpgroup_commit_batch();
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
      read_v = smem_pipe_read;
      ++smem_pipe_read;
    };
    // QK of the tile is done (waited for with `pending` GEMMs still in flight) and K's ring slot goes back.
    auto qk_done = [&](auto pending, auto& acc_qk) {
      PipelineState read_k = smem_pipe_read;
      ++smem_pipe_read;
      warpgroup_wait<decltype(pending)::value>();
      warpgroup_fence_operand(acc_qk);
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
      turn_wait(0);
      qk_done(cute::Int<0>{}, acc_qk);
      if (kind != kBlockFull) Common::apply_mask(acc_qk, tPcP, q0, col * BlockN, kind, problem_size, params.bsr);
      if constexpr (kTreeFirst) {
        softmax_first_step(acc_qk, tiled_mma_qk, softmax_state, params.scale_softmax_log2);
      } else {
        softmax.step(acc_qk, tiled_mma_qk, tPcP, softmax_state, problem_size);
      }
      turn_pass(0);
      to_p(acc_qk);
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 1; j < n_tiles; ++j) {
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
    if constexpr (kIsPersistent) pipeline.consumer_release(read_v);  // V of the last tile

    auto lse = softmax.tail(softmax_state, acc_pv, tiled_mma_pv);
    Common::nan_lse_where_sum_is_nan(lse, softmax_state);
    return make_tuple(acc_pv, lse);
  }
};

}  // namespace bsk
