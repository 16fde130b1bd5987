// BlackwellSparseK backward mainloop (sm_90a): dQ, dK, dV of block-sparse attention over the transposed layout.
//
// The shell is CUTLASS example 88's warp-specialized backward (by #include, from the nvidia-cutlass wheel): one CTA
// per 128-key tile, two MMA warpgroups of 64 keys each, a producer warp (K/V once, then Q, dO, LSE and delta per
// 64-query tile) and a reducer warp (dQ tiles to global through TMA reduce-add into an fp32 accumulator). Its
// types (shared-memory layouts, tiled MMAs, TMA atoms, pipelines) are reused as they are. What is ours:
//   * the loops visit only the query blocks that list this key block (the transposed layout's column), in all
//     three roles (loader, MMA warpgroups, reducer), through one cursor each;
//   * P = exp2(S * scale * log2(e) - LSE2) with LSE2 = LSE * log2(e) precomputed per row (+inf for rows with no
//     visible key, so P = 0 there, never NaN), element masks only on blocks whose kind asks for it;
//   * GQA in the CTA: a key tile of a K/V head walks the listed query blocks of every query head that shares it
//     (the stacked column, split_entry), so dK/dV sum over the group in registers and come out per K/V head;
//   * the caller's softmax scale (example 88 hard-codes 1/sqrt(D));
//   * pairs of 64-wide key blocks (Pairs): a warpgroup whose half the entry does not list skips it (idle_step);
//   * shared-memory hazards closed: a Q/dO stage is released only after the GEMMs that read it completed, a dQ
//     buffer only after its TMA reduce has read it, the epilogue (which overlays the mainloop's buffers) starts
//     only after both warpgroups' last GEMMs, and a key block with no listed query releases nothing it did not
//     take.
#pragma once

#include "collective/fmha_collective_bwd_tma_warpspecialized.hpp"
#include "collective/fmha_fusion.hpp"

#include "bsk/sm90/attn_bwd_common.hpp"
#include "bsk/sm90/attn_bwd_dq.hpp"

namespace bsk::bwd {

namespace fmha_c = cutlass::fmha::collective;

// Named barrier (CUTLASS user id; NamedBarrier adds the reserved count): both MMA warpgroups done with the mainloop.
enum : uint32_t { kBarMmaDone = 0 };

template <class Element, int HeadDim, int BlockM, int BlockN, bool Deterministic, bool Pairs = false>
struct BwdMainloop
    : fmha_c::FmhaBwdMainloopTmaWarpSpecialized<Element, float, Shape<_64, _128, Int<HeadDim>>,
                                                fmha_c::DefaultFusion> {
  using Base = fmha_c::FmhaBwdMainloopTmaWarpSpecialized<Element, float, Shape<_64, _128, Int<HeadDim>>,
                                                         fmha_c::DefaultFusion>;
  using typename Base::TileShape;
  using typename Base::TileShapeNM;
  using typename Base::TileShapeND;
  using typename Base::TileShapeMD;
  using typename Base::TiledMmaNM;
  using typename Base::TiledMmaND;
  using typename Base::TiledMmaND_SS;
  using typename Base::TiledMmaMD;
  using typename Base::CollectiveMmaNM;
  using typename Base::SmemLayoutQ;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutV;
  using typename Base::SmemLayoutDO;
  using typename Base::SmemLayoutDS;
  using typename Base::SmemLayoutKp;
  using typename Base::SmemLayoutQp;
  using typename Base::SmemLayoutDOp;
  using typename Base::SmemLayoutDQ;
  using typename Base::SmemLayoutLSE;
  using typename Base::MainloopPipeline;
  using typename Base::MainloopPipelineQ;
  using typename Base::PipelineState;
  using typename Base::PipelineStateQ;
  using typename Base::SharedStorage;
  using typename Base::LoadQ;
  using typename Base::LoadK;
  using typename Base::LoadV;
  using typename Base::LoadDO;
  using typename Base::LoadLSE;
  using typename Base::LoadODO;
  using typename Base::TMA_LSE;
  using typename Base::TMA_DQ;
  using Base::NumMmaWarpGroups;
  using Base::StageCount;

  static_assert(NumMmaWarpGroups == 2, "two MMA warpgroups of 64 keys make one 128-key tile");
  static_assert(BlockM % 64 == 0 && BlockN % 128 == 0, "layout blocks are whole kernel tiles");
  static constexpr int kTileQ = 64;                  // queries per inner step
  static constexpr int kTileK = 128;                 // keys per CTA
  static constexpr int kTilesPerBlockM = BlockM / kTileQ;
  static constexpr int kTilesPerBlockN = BlockN / kTileK;
  static constexpr bool kDeterministic = Deterministic;

  using StrideQKV = cute::tuple<int, _1, cute::tuple<int, int>>;  // (seq, head_dim, (batch, head))

  struct Arguments {
    const Element* ptr_Q; StrideQKV dQ;
    const Element* ptr_K; StrideQKV dK;
    const Element* ptr_V; StrideQKV dV;
    const Element* ptr_dO; StrideQKV dDO;
    const float* ptr_LSE2;     // (B, H, Sq): LSE * log2(e), +inf on rows with no visible key
    const float* ptr_delta;    // (B, H, Sq): rowsum(dO * O) (minus the LSE gradient)
    cute::tuple<int, int> dLSE;  // (batch, head) strides of both; the sequence stride is 1
    float* ptr_dQacc;          // (B, H, Sq, D) fp32, zeroed by the caller (fast kernel; the deterministic one stores
                               // each tile's first contribution)
    StrideQKV dDQ;
    float scale;
    TLayoutParams lay;
  };

  // The deterministic kernel's first contributor to a dQ tile stores it (the accumulator is not zeroed for it):
  // the same tensor as the reduce-add's, a plain TMA store.
  using TMA_DQ_ST = decltype(make_tma_copy(SM90_TMA_STORE{},
                                           make_tensor((float*)nullptr, make_shape(1, 1, 1, 1),
                                                       make_stride(0, _1{}, 0, 0)),
                                           SmemLayoutDQ{}(_, _, _0{})));

  struct Params : Base::Params {
    TLayoutParams lay;
    TMA_DQ_ST tma_st_dq;
  };

  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& a, void* /*workspace*/) {
    int B = get<0>(ps), H = get<1>(ps), Sq = get<2>(ps), Sk = get<3>(ps), D = get<4>(ps);
    // S^T = K Q^T: A = K/V over the K/V heads (GQA), B = Q/dO over the query heads.
    auto shape_q = make_shape(Sk, Sq, D, make_shape(B, H));
    auto shape_kv = make_shape(Sk, Sq, D, make_shape(B, a.lay.heads_kv));
    auto p_q = CollectiveMmaNM::to_underlying_arguments(
        shape_q, typename CollectiveMmaNM::Arguments{a.ptr_K, a.dK, a.ptr_Q, a.dQ}, nullptr);
    auto p_do = CollectiveMmaNM::to_underlying_arguments(
        shape_q, typename CollectiveMmaNM::Arguments{a.ptr_V, a.dV, a.ptr_dO, a.dDO}, nullptr);
    auto p_k = CollectiveMmaNM::to_underlying_arguments(
        shape_kv, typename CollectiveMmaNM::Arguments{a.ptr_K, a.dK, a.ptr_Q, a.dQ}, nullptr);
    auto p_v = CollectiveMmaNM::to_underlying_arguments(
        shape_kv, typename CollectiveMmaNM::Arguments{a.ptr_V, a.dV, a.ptr_dO, a.dDO}, nullptr);
    auto shape_lse = make_shape(Sq, B, H);
    auto stride_lse = make_stride(_1{}, get<0>(a.dLSE), get<1>(a.dLSE));
    Params p;
    p.tma_load_q = p_q.tma_load_b;
    p.tma_load_k = p_k.tma_load_a;
    p.tma_load_v = p_v.tma_load_a;
    p.tma_load_do = p_do.tma_load_b;
    p.tma_load_lse = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(a.ptr_LSE2, shape_lse, stride_lse),
                                   SmemLayoutLSE{}(_, _0{}));
    p.tma_load_odo = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(a.ptr_delta, shape_lse, stride_lse),
                                   SmemLayoutLSE{}(_, _0{}));
    auto dq_acc = make_tensor(a.ptr_dQacc, make_shape(Sq, D, B, H),
                              make_stride(get<0>(a.dDQ), _1{}, get<2, 0>(a.dDQ), get<2, 1>(a.dDQ)));
    p.tma_red_dq = make_tma_copy(SM90_TMA_REDUCE_ADD{}, dq_acc, SmemLayoutDQ{}(_, _, _0{}));
    if constexpr (Deterministic) p.tma_st_dq = make_tma_copy(SM90_TMA_STORE{}, dq_acc, SmemLayoutDQ{}(_, _, _0{}));
    p.scale_softmax = a.scale;
    p.scale_softmax_log2 = a.scale * 1.4426950408889634f;
    p.lay = a.lay;
    return p;
  }

  // Producer warp: K and V of this CTA's two 64-key tiles, then (Q + LSE2, dO + delta) of every 64-query tile of
  // the listed query blocks, in the order example 88 interleaves them (K0 Q0 V0 K1 dO0 V1 Q1 dO1 ...).
  template <bool kLoadOuter, class BlkCoord, class LoadWarpBarrier>
  CUTLASS_DEVICE void load_kv_maybe_q(int block_rank_in_cluster, BlkCoord const& blk_coord, Params const& params,
                                      ProblemShape const& problem_size, MainloopPipeline& pipeline_inner,
                                      PipelineState& smem_pipe_write_inner, MainloopPipelineQ& pipeline_outer,
                                      PipelineStateQ& smem_pipe_write_outer, SharedStorage& storage,
                                      LoadWarpBarrier&, bool) {
    static_assert(kLoadOuter, "this warp loads K and V too");
    int lane_predicate = cute::elect_one_sync();
    TColumn col = column_of(blk_coord, params.lay);
    int n_inner = col.count * kTilesPerBlockM;

    // blk_coord's head is a K/V head; the group's query heads start at hq0 (one state per head in turn).
    auto kv_problem = make_shape(get<0>(problem_size), params.lay.heads_kv, get<2>(problem_size),
                                 get<3>(problem_size), get<4>(problem_size));
    int hq0 = get<2, 1>(blk_coord) * params.lay.group;
    auto q_c = with_head(blk_coord, hq0);

    LoadQ load_q{params.tma_load_q, pipeline_inner, storage.smem_q};
    auto st_q = load_q.init_state(block_rank_in_cluster, problem_size, TileShapeNM{}, q_c, n_inner);
    LoadDO load_do{params.tma_load_do, pipeline_inner, storage.smem_do};
    auto st_do = load_do.init_state(block_rank_in_cluster, problem_size, TileShapeNM{}, q_c, n_inner);
    LoadLSE load_lse{params.tma_load_lse, pipeline_inner, storage.smem_lse};
    auto st_lse = load_lse.init_state(_0{}, problem_size, TileShapeNM{}, q_c, 1);
    LoadODO load_odo{params.tma_load_odo, pipeline_inner, storage.smem_sumOdO};
    auto st_odo = load_odo.init_state(_0{}, problem_size, TileShapeNM{}, q_c, 1);

    int outer_count = NumMmaWarpGroups;
    auto outer_iter = cute::make_coord_iterator(outer_count);
    LoadK load_k{params.tma_load_k, pipeline_outer, storage.smem_k};
    auto st_k = load_k.init_state(_0{}, kv_problem, TileShapeNM{}, blk_coord, outer_count);
    LoadV load_v{params.tma_load_v, pipeline_outer, storage.smem_v};
    auto st_v = load_v.init_state(_0{}, kv_problem, TileShapeNM{}, blk_coord, outer_count);
    outer_count *= 2;  // K and V

    BsrRowCursor cursor{col.q_idx, col.kind, col.count, col.first};  // the forward's cursor, over a column
    int inner_count = 4 * n_inner;  // Q, LSE2, dO, delta per tile (each step counts one)
    int q_tile = 0;
    int cur_r = 0;
    auto it = &q_tile;  // a one-element iterator that is never advanced: step() reads *it
    auto load_inner = [&](int i, bool with_q, bool with_do) {
      if (i >= n_inner) return;
      if (with_q) {
        int entry, kind, r, qb;
        cursor.at(i / kTilesPerBlockM, entry, kind);
        split_entry(entry, params.lay, r, qb);
        if (r != cur_r) {  // the next query head of the group
          cur_r = r;
          q_c = with_head(blk_coord, hq0 + r);
          st_q = load_q.init_state(block_rank_in_cluster, problem_size, TileShapeNM{}, q_c, n_inner);
          st_do = load_do.init_state(block_rank_in_cluster, problem_size, TileShapeNM{}, q_c, n_inner);
          st_lse = load_lse.init_state(_0{}, problem_size, TileShapeNM{}, q_c, 1);
          st_odo = load_odo.init_state(_0{}, problem_size, TileShapeNM{}, q_c, 1);
        }
        q_tile = qb * kTilesPerBlockM + i % kTilesPerBlockM;
        load_q.template step<false, false, true>(it, st_q, smem_pipe_write_inner, lane_predicate, inner_count);
        load_lse.template step<false, true, false>(it, st_lse, smem_pipe_write_inner, lane_predicate, inner_count);
      }
      if (with_do) {
        load_do.template step<false, false, true>(it, st_do, smem_pipe_write_inner, lane_predicate, inner_count);
        load_odo.template step<false, true, false>(it, st_odo, smem_pipe_write_inner, lane_predicate, inner_count);
      }
    };

    load_k.template step<false>(outer_iter, st_k, smem_pipe_write_outer, lane_predicate, outer_count);
    load_inner(0, true, false);
    load_v.template step<true>(outer_iter, st_v, smem_pipe_write_outer, lane_predicate, outer_count);
    load_k.template step<false>(outer_iter, st_k, smem_pipe_write_outer, lane_predicate, outer_count);
    load_inner(0, false, true);
    load_v.template step<true>(outer_iter, st_v, smem_pipe_write_outer, lane_predicate, outer_count);

    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = 1; i < n_inner; ++i) load_inner(i, true, true);
  }

  // Reducer warp: each 64-query dQ tile to the fp32 accumulator (bsk::bwd::reduce_dq, attn_bwd_dq.hpp).
  template <class BlkCoord, class PipelineReducer, class StateReducer>
  CUTLASS_DEVICE void reduce(BlkCoord const& blk_coord, Params const& params, ProblemShape const& problem_size,
                             PipelineReducer& pipeline_reducer, StateReducer& smem_pipe_read_reducer,
                             SharedStorage& storage) {
    reduce_dq<BwdMainloop>(blk_coord, params, problem_size, pipeline_reducer, smem_pipe_read_reducer, storage);
  }

  // Pairs of 64-wide key blocks: this warpgroup's half of the key tile is not listed by the entry's query block, so
  // its P and dS would be 0. It computes nothing but keeps the order barrier's turns, and the dQ tile still goes to
  // the reducer: warpgroup 1 (its half idle) multiplies only warpgroup 0's half of dS; with warpgroup 0 idle,
  // warpgroup 1's full step multiplies only its own half (compute()), so warpgroup 0 stores nothing. The listed
  // warpgroup otherwise runs the 128-key kernel's step.
  template <class StateK, class TDS, class TK, class TSDQ, class MmaMD, class PipelineReducer, class StateReducer,
            class OrderBarrier>
  CUTLASS_DEVICE void idle_step(int wg_idx, StateK const& read_k_other, TDS const& tDQrDS, TK const& tDQrK,
                                TSDQ& tDQsDQ_full, MmaMD& tiled_mma_md,
                                PipelineReducer& pipeline_reducer, StateReducer& smem_pipe_write_reducer,
                                OrderBarrier& math_wg_order_barrier) {
    math_wg_order_barrier.wait();  // the exp turn
    math_wg_order_barrier.arrive();
    if (wg_idx == 0) {
      math_wg_order_barrier.wait();  // the dS turn: nothing to store, warpgroup 1 multiplies only its own half
      math_wg_order_barrier.arrive();
      pipeline_reducer.producer_acquire(smem_pipe_write_reducer);
      pipeline_reducer.producer_commit(smem_pipe_write_reducer);
    } else {
      math_wg_order_barrier.wait();  // warpgroup 0's dS is in shared memory
      Tensor acc_DQ = partition_fragment_C(tiled_mma_md, take<0, 2>(TileShapeMD{}));
      warpgroup_fence_operand(acc_DQ);
      warpgroup_arrive();
      fmha_c::gemm_zero_acc(tiled_mma_md, tDQrDS(_, _, _, 0), tDQrK(_, _, _, read_k_other.index()), acc_DQ);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_DQ);
      math_wg_order_barrier.arrive();  // warpgroup 0 may overwrite its half of dS
      pipeline_reducer.producer_acquire(smem_pipe_write_reducer);
      store_dq(tDQsDQ_full(_, _, _, smem_pipe_write_reducer.index()), acc_DQ);
      pipeline_reducer.producer_commit(smem_pipe_write_reducer);
    }
    ++smem_pipe_write_reducer;
  }

  // One MMA warpgroup: 64 keys (get<1>(wg_coord) is this warpgroup's 64-key tile), dK and dV in registers over
  // every listed 64-query tile. Per tile: S^T = K Q^T and dP^T = V dO^T; P^T from LSE2 (masked blocks only get the
  // element mask); dS^T = P^T (dP^T - delta) * scale; dV += P^T dO; dK += dS^T Q; dQ = dS K over both warpgroups'
  // dS (shared memory) goes to the reducer. Both exponentiate in turn (example 88's order barrier). dQ: example
  // 88's sequence (warpgroup 0 stores dS, warpgroup 1 runs the whole dQ GEMM). Splitting dQ's columns between the
  // warpgroups, as FlashAttention-3 does, measured 7-10 % slower here (H100, H200): warpgroup 0 then waits for
  // warpgroup 1's dS every tile.
  template <class BlkCoord, class PipelineReducer, class StateReducer, class OrderBarrier>
  CUTLASS_DEVICE auto compute(BlkCoord const& blk_coord, BlkCoord const& wg_coord, Params const& params,
                              ProblemShape const& problem_size, MainloopPipeline& pipeline_inner,
                              PipelineState& smem_pipe_read_inner, MainloopPipelineQ& pipeline_outer,
                              PipelineStateQ& smem_pipe_read_outer, PipelineReducer& pipeline_reducer,
                              StateReducer& smem_pipe_write_reducer, SharedStorage& storage,
                              OrderBarrier& math_wg_order_barrier) {
    int thread_idx = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
    int seq_q = get<2>(problem_size), seq_k = get<3>(problem_size);

    TiledMmaNM tiled_mma_nm;
    TiledMmaND tiled_mma_nd;
    TiledMmaMD tiled_mma_md;
    Tensor acc_DV = partition_fragment_C(tiled_mma_nd, take<0, 2>(TileShapeND{}));
    Tensor acc_DK = partition_fragment_C(tiled_mma_nd, take<0, 2>(TileShapeND{}));
    clear(acc_DV);
    clear(acc_DK);

    PipelineState release_inner = smem_pipe_read_inner;
    pipeline_outer.consumer_wait(smem_pipe_read_outer);
    PipelineStateQ read_k = smem_pipe_read_outer;
    ++smem_pipe_read_outer;
    pipeline_outer.consumer_wait(smem_pipe_read_outer);
    PipelineStateQ read_v = smem_pipe_read_outer;
    PipelineStateQ read_k_other = read_k;  // warpgroup 1: warpgroup 0's K (stage 0 of the four K/V stages)
    read_k_other.advance(2);

    auto thr_nm = tiled_mma_nm.get_thread_slice(thread_idx);
    auto thr_nd = tiled_mma_nd.get_thread_slice(thread_idx);
    auto thr_md = tiled_mma_md.get_thread_slice(thread_idx);
    auto thr_nd_ss = TiledMmaND_SS{}.get_thread_slice(thread_idx);

    Tensor sK = make_tensor(make_smem_ptr(storage.smem_k.data()), SmemLayoutK{});
    Tensor sQ = make_tensor(make_smem_ptr(storage.smem_q.data()), SmemLayoutQ{});
    Tensor sV = make_tensor(make_smem_ptr(storage.smem_v.data()), SmemLayoutV{});
    Tensor sDO = make_tensor(make_smem_ptr(storage.smem_do.data()), SmemLayoutDO{});
    Tensor tSrK = thr_nm.make_fragment_A(thr_nm.partition_A(sK));
    Tensor tSrQ = thr_nm.make_fragment_B(thr_nm.partition_B(sQ));
    Tensor tDPrV = thr_nm.make_fragment_A(thr_nm.partition_A(sV));
    Tensor tDPrDO = thr_nm.make_fragment_B(thr_nm.partition_B(sDO));

    Tensor sDOp = make_tensor(make_smem_ptr(storage.smem_dop.data()), SmemLayoutDOp{});
    Tensor tDVrDO = thr_nd.make_fragment_B(thr_nd.partition_B(sDOp));
    Tensor sQp = make_tensor(make_smem_ptr(storage.smem_qp.data()), SmemLayoutQp{});
    Tensor tDKrQ = thr_nd.make_fragment_B(thr_nd.partition_B(sQp));

    Tensor sDS = make_tensor(make_smem_ptr(storage.smem_ds.data()), SmemLayoutDS{});
    Tensor tDQrDS = thr_md.make_fragment_A(thr_md.partition_A(sDS));
    Tensor sKp = make_tensor(make_smem_ptr(storage.smem_kp.data()), SmemLayoutKp{});
    Tensor tDQrK = thr_md.make_fragment_B(thr_md.partition_B(sKp));

    // LSE2 and delta per query column, broadcast over the keys of the tile (stride 0 along mode 0).
    auto lse_layout = make_layout(make_shape(get<0>(TileShapeNM{}), get<1>(TileShapeNM{}), Int<StageCount>{}),
                                  make_stride(_0{}, _1{}, get<1>(TileShapeNM{})));
    Tensor tSsLSE = thr_nm.partition_C(make_tensor(make_smem_ptr(storage.smem_lse.data()), lse_layout));
    Tensor tDPsODO = thr_nm.partition_C(make_tensor(make_smem_ptr(storage.smem_sumOdO.data()), lse_layout));
    Tensor tScS = thr_nm.partition_C(make_identity_tensor(take<0, 2>(TileShapeNM{})));  // (key, query) in tile

    // dS^T as the NM accumulator writes it, and as the ND (dK) GEMM reads it.
    Tensor sDSp = sDS.compose(make_layout(make_shape(size<1>(sDS), size<0>(sDS), size<2>(sDS)),
                                          make_stride(size<0>(sDS), _1{}, size<1>(sDS) * size<0>(sDS))));
    Tensor tDPsDS = thr_nm.partition_C(sDSp);
    Tensor tDKrDSp = thr_nd_ss.make_fragment_A(thr_nd_ss.partition_A(sDSp));
    Tensor sDQ = make_tensor(make_smem_ptr(storage.smem_dq.data()), SmemLayoutDQ{});
    Tensor tDQsDQ_full = thr_md.partition_C(sDQ);

    int wg_idx = __shfl_sync(0xffffffffu, int(get<1>(wg_coord)) % NumMmaWarpGroups, 0);
    int k0 = int(get<1>(wg_coord)) * get<0>(TileShapeNM{});  // this warpgroup's first key

    TColumn col = column_of(blk_coord, params.lay);
    int n_inner = col.count * kTilesPerBlockM;
    BsrRowCursor cursor{col.q_idx, col.kind, col.count, col.first};  // the forward's cursor, over a column

    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = 0; i < n_inner; ++i) {
      int entry, kind, r, qb;
      cursor.at(i / kTilesPerBlockM, entry, kind);
      split_entry(entry, params.lay, r, qb);
      int q0 = (qb * kTilesPerBlockM + i % kTilesPerBlockM) * kTileQ;

      pipeline_inner.consumer_wait(smem_pipe_read_inner);
      PipelineState read_q = smem_pipe_read_inner;
      ++smem_pipe_read_inner;
      PipelineState read_do = smem_pipe_read_inner;
      ++smem_pipe_read_inner;

      if constexpr (Pairs) {
        if (kind & (wg_idx == 0 ? kPairNoLo : kPairNoHi)) {
          idle_step(wg_idx, read_k_other, tDQrDS, tDQrK, tDQsDQ_full, tiled_mma_md, pipeline_reducer,
                    smem_pipe_write_reducer, math_wg_order_barrier);
          pipeline_inner.consumer_release(release_inner);
          ++release_inner;
          pipeline_inner.consumer_release(release_inner);
          ++release_inner;
          continue;
        }
      }

      Tensor acc_S = partition_fragment_C(tiled_mma_nm, take<0, 2>(TileShapeNM{}));
      warpgroup_fence_operand(acc_S);
      warpgroup_arrive();
      fmha_c::gemm_zero_acc(tiled_mma_nm, tSrK(_, _, _, read_k.index()), tSrQ(_, _, _, read_q.index()), acc_S);
      warpgroup_commit_batch();

      pipeline_inner.consumer_wait(read_do);
      Tensor acc_DP = partition_fragment_C(tiled_mma_nm, take<0, 2>(TileShapeNM{}));
      warpgroup_fence_operand(acc_DP);
      warpgroup_arrive();
      fmha_c::gemm_zero_acc(tiled_mma_nm, tDPrV(_, _, _, read_v.index()), tDPrDO(_, _, _, read_do.index()),
                            acc_DP);
      warpgroup_commit_batch();

      Tensor reg_LSE = make_fragment_like<float>(acc_S);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(reg_LSE); ++e) reg_LSE(e) = tSsLSE(_, _, _, read_q.index())(e);

      warpgroup_wait<1>();  // S
      warpgroup_fence_operand(acc_S);

      math_wg_order_barrier.wait();
      // A pair entry's PAIR_NO bits concern the other warpgroup (idle_step): only sequence ends and the rule here.
      int mask_kind = Pairs ? (kind & (kBlockBounds | kBlockRule)) : kind;
      if (mask_kind != kBlockFull) apply_mask(acc_S, tScS, k0, q0, mask_kind, seq_q, seq_k, params.lay);
      auto acc_P = make_fragment_like<float>(acc_S);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(acc_P); ++e) {
        acc_P(e) = ::exp2f(params.scale_softmax_log2 * acc_S(e) - reg_LSE(e));
      }
      math_wg_order_barrier.arrive();

      Tensor reg_ODO = make_fragment_like<float>(acc_S);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(reg_ODO); ++e) reg_ODO(e) = tDPsODO(_, _, _, read_do.index())(e);

      warpgroup_wait<0>();  // dP
      warpgroup_fence_operand(acc_DP);

      auto acc_DS = make_fragment_like<Element>(acc_DP);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(acc_DS); ++e) {
        acc_DS(e) = static_cast<Element>(acc_P(e) * params.scale_softmax * (acc_DP(e) - reg_ODO(e)));
      }

      // dV += P^T dO (P from registers)
      auto op_P = fmha_c::make_acc_into_op<Element>(acc_P, typename TiledMmaND::LayoutA_TV{});
      warpgroup_fence_operand(acc_DV);
      warpgroup_fence_operand(op_P);
      warpgroup_arrive();
      cute::gemm(tiled_mma_nd, op_P, tDVrDO(_, _, _, read_do.index()), acc_DV);
      warpgroup_commit_batch();

      // dS^T into this warpgroup's half of shared memory (warpgroup 1 needs both halves for dQ).
      if (wg_idx == 0) math_wg_order_barrier.wait();
      store_ds<Element>(tDPsDS, acc_DS, wg_idx);
      if (wg_idx == 0) math_wg_order_barrier.arrive();

      if (wg_idx == 1) {
        math_wg_order_barrier.wait();  // warpgroup 0's dS is in shared memory
        Tensor acc_DQ = partition_fragment_C(tiled_mma_md, take<0, 2>(TileShapeMD{}));
        warpgroup_fence_operand(acc_DQ);
        warpgroup_arrive();
        if (Pairs && (kind & kPairNoLo)) {  // warpgroup 0 idles on this entry (idle_step): its half of dS is zero
          fmha_c::gemm_zero_acc(tiled_mma_md, tDQrDS(_, _, _, 1), tDQrK(_, _, _, read_k.index()), acc_DQ);
        } else {
          fmha_c::gemm_zero_acc(tiled_mma_md, tDQrDS(_, _, _, 0), tDQrK(_, _, _, read_k_other.index()), acc_DQ);
          cute::gemm(tiled_mma_md, tDQrDS(_, _, _, 1), tDQrK(_, _, _, read_k.index()), acc_DQ);
        }
        warpgroup_commit_batch();

        warpgroup_fence_operand(acc_DK);
        warpgroup_arrive();
        cute::gemm(TiledMmaND_SS{}, tDKrDSp(_, _, _, wg_idx), tDKrQ(_, _, _, read_q.index()), acc_DK);
        warpgroup_commit_batch();

        warpgroup_wait<1>();  // dV and dQ done (dK may still run)
        warpgroup_fence_operand(acc_DQ);
        math_wg_order_barrier.arrive();  // both halves of dS read: warpgroup 0 may overwrite its half

        pipeline_reducer.producer_acquire(smem_pipe_write_reducer);
        store_dq(tDQsDQ_full(_, _, _, smem_pipe_write_reducer.index()), acc_DQ);
        pipeline_reducer.producer_commit(smem_pipe_write_reducer);
        ++smem_pipe_write_reducer;
      } else {
        warpgroup_fence_operand(acc_DK);
        warpgroup_arrive();
        cute::gemm(TiledMmaND_SS{}, tDKrDSp(_, _, _, wg_idx), tDKrQ(_, _, _, read_q.index()), acc_DK);
        warpgroup_commit_batch();
        pipeline_reducer.producer_acquire(smem_pipe_write_reducer);
        pipeline_reducer.producer_commit(smem_pipe_write_reducer);
        ++smem_pipe_write_reducer;
      }

      // Every GEMM that read this tile's Q and dO stages has completed before they go back to the loader.
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_DK);
      warpgroup_fence_operand(acc_DV);
      pipeline_inner.consumer_release(release_inner);
      ++release_inner;
      pipeline_inner.consumer_release(release_inner);
      ++release_inner;
    }

    pipeline_outer.consumer_release(read_k);
    pipeline_outer.consumer_release(read_v);
    ++smem_pipe_read_outer;
    pipeline_reducer.producer_tail(smem_pipe_write_reducer);

    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_DK);
    warpgroup_fence_operand(acc_DV);
    // The epilogue's buffers overlay the mainloop's shared memory: neither warpgroup starts writing them before
    // both have finished every GEMM (the other's last dK GEMM reads dS and Q).
    cutlass::arch::NamedBarrier::sync(NumMmaWarpGroups * cutlass::NumThreadsPerWarpGroup, kBarMmaDone);
    return make_tuple(acc_DK, acc_DV);
  }
};

}  // namespace bsk::bwd
