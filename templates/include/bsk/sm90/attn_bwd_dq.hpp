// BlackwellSparseK backward (sm_90a): the dQ path. The MMA warpgroups' stores of dS^T and of dQ tiles into shared
// memory, and the reducer warp that adds each 64-query dQ tile into the fp32 accumulator with TMA reduce-add.
#pragma once

#include "bsk/sm90/attn_bwd_common.hpp"

namespace bsk::bwd {

// This warpgroup's dS^T (Element pairs) into its half of the dS buffer, visible to the GEMMs that read it.
template <class Element, class TS, class TA>
CUTLASS_DEVICE void store_ds(TS& tDPsDS, TA const& acc_DS, int wg_idx) {
  using Vec = uint_bit_t<sizeof_bits_v<Element> * 2>;
  auto tDPsDS_v = recast<Vec>(tDPsDS);
  auto acc_DS_v = recast<Vec>(acc_DS);
  CUTLASS_PRAGMA_UNROLL
  for (int e = 0; e < size(acc_DS_v); ++e) tDPsDS_v(_, _, _, wg_idx)(e) = acc_DS_v(e);
  cutlass::arch::fence_view_async_shared();
}

// A dQ accumulator (fp32 pairs) into a dQ buffer the reducer's TMA reduce-add reads.
template <class TD, class TA>
CUTLASS_DEVICE void store_dq(TD&& tDQsDQ, TA const& acc_DQ) {
  using VecQ = uint_bit_t<sizeof_bits_v<float> * 2>;
  auto tDQsDQ_v = recast<VecQ>(tDQsDQ);
  auto acc_DQ_v = recast<VecQ>(acc_DQ);
  CUTLASS_PRAGMA_UNROLL
  for (int e = 0; e < size(acc_DQ_v); ++e) tDQsDQ_v(e) = acc_DQ_v(e);
  cutlass::arch::fence_view_async_shared();
}

// Reducer warp: each 64-query dQ tile the MMA warpgroups leave in shared memory goes to the fp32 accumulator by
// TMA reduce-add. A buffer is handed back only once its reduce has read it (bulk wait_group.read 1 after the
// next issue), so at most one reduce is in flight while the warpgroups fill the other buffer. Deterministic:
// each add waits for its turn on the tile's counter (wait_turn / pass_turn), so fp32 sums run in one order, and
// the first turn stores instead of adding (the prep kernel does not zero the accumulator for this kernel; the
// convert kernel writes zeros where no turn was taken).
template <class Mainloop, class BlkCoord, class PipelineReducer, class StateReducer>
CUTLASS_DEVICE void reduce_dq(BlkCoord const& blk_coord, typename Mainloop::Params const& params,
                              ProblemShape const& problem_size, PipelineReducer& pipeline_reducer,
                              StateReducer& smem_pipe_read_reducer, typename Mainloop::SharedStorage& storage) {
  constexpr int kTilesPerBlockM = Mainloop::kTilesPerBlockM;
  constexpr int kTilesPerBlockN = Mainloop::kTilesPerBlockN;
  using TileShapeMD = typename Mainloop::TileShapeMD;
  using SmemLayoutDQ = typename Mainloop::SmemLayoutDQ;
  int lane_predicate = cute::elect_one_sync();
  TColumn col = column_of(blk_coord, params.lay);
  int n_inner = col.count * kTilesPerBlockM;

  // blk_coord's head is a K/V head; the tiles of its group's query heads (hq0 + r) come in r order.
  int b = get<2, 0>(blk_coord);
  int hq0 = get<2, 1>(blk_coord) * params.lay.group;
  Tensor mDQ = params.tma_red_dq.get_tma_tensor(select<2, 4, 0, 1>(problem_size));  // (Sq, D, B, H)
  Tensor gDQ_full = local_tile(mDQ, TileShapeMD{}, make_coord(_, _, _), Step<_1, _1, Underscore>{});
  Tensor sDQ = make_tensor(make_smem_ptr(storage.smem_dq.data()), SmemLayoutDQ{});
  auto block_tma = params.tma_red_dq.get_slice(_0{});
  Tensor tDQsDQ = block_tma.partition_S(sDQ);
  auto dq_of = [&](int h) { return block_tma.partition_D(gDQ_full(_, _, _, _0{}, b, h)); };
  auto tDQgDQ = dq_of(hq0);
  int cur_r = 0;
  BsrRowCursor cursor{col.q_idx, col.kind, col.count, col.first};  // the forward's cursor, over a column
  auto next_tile = [&](int i) {  // this step's 64-query tile, with tDQgDQ on its head
    int entry, kind, r, qb;
    cursor.at(i / kTilesPerBlockM, entry, kind);
    split_entry(entry, params.lay, r, qb);
    if (r != cur_r) {
      cur_r = r;
      tDQgDQ = dq_of(hq0 + r);
    }
    return qb * kTilesPerBlockM + i % kTilesPerBlockM;
  };

  if constexpr (Mainloop::kDeterministic) {
    Tensor mDQst = params.tma_st_dq.get_tma_tensor(select<2, 4, 0, 1>(problem_size));
    Tensor gDQst_full = local_tile(mDQst, TileShapeMD{}, make_coord(_, _, _), Step<_1, _1, Underscore>{});
    auto block_st = params.tma_st_dq.get_slice(_0{});
    Tensor tDQsDQst = block_st.partition_S(sDQ);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = 0; i < n_inner; ++i) {
      int q_tile = next_tile(i);
      int* sem_bh = params.lay.sem + (size_t(b) * get<1>(problem_size) + hq0 + cur_r) * params.lay.n_qtiles;
      // A key block of BlockN keys is BlockN / 128 CTAs: they take consecutive turns.
      int rank = __ldg(col.rank + i / kTilesPerBlockM) * kTilesPerBlockN +
                 int(get<1>(blk_coord)) % kTilesPerBlockN;
      pipeline_reducer.consumer_wait(smem_pipe_read_reducer);
      // A tile wholly past seq_q (the last query block's second half when seq_q % 128 is 1..64) has no rows and no
      // counter: q_tile would index the next head's counters, bump them out of order and deadlock that head.
      if (lane_predicate && q_tile * Mainloop::kTileQ < get<2>(problem_size)) {
        wait_turn(sem_bh + q_tile, rank);
        if (rank == 0) {
          Tensor tDQgDQst = block_st.partition_D(gDQst_full(_, _, _, _0{}, b, hq0 + cur_r));
          copy(params.tma_st_dq, tDQsDQst(_, _, _, smem_pipe_read_reducer.index()), tDQgDQst(_, _, _, q_tile));
        } else {
          copy(params.tma_red_dq, tDQsDQ(_, _, _, smem_pipe_read_reducer.index()), tDQgDQ(_, _, _, q_tile));
        }
        tma_store_arrive();
        pass_turn(sem_bh + q_tile);  // the reduce has completed: its buffer is free too
      }
      __syncwarp();
      pipeline_reducer.consumer_release(smem_pipe_read_reducer);
      ++smem_pipe_read_reducer;
    }
    return;
  }
  StateReducer release = smem_pipe_read_reducer;
  CUTLASS_PRAGMA_NO_UNROLL
  for (int i = 0; i < n_inner; ++i) {
    int q_tile = next_tile(i);
    pipeline_reducer.consumer_wait(smem_pipe_read_reducer);
    if (lane_predicate) {
      copy(params.tma_red_dq, tDQsDQ(_, _, _, smem_pipe_read_reducer.index()), tDQgDQ(_, _, _, q_tile));
      tma_store_arrive();
      tma_store_wait<1>();  // the previous tile's reduce has read its buffer
    }
    __syncwarp();
    if (i > 0) {
      pipeline_reducer.consumer_release(release);
      ++release;
    }
    ++smem_pipe_read_reducer;
  }
  if (lane_predicate) tma_store_wait<0>();
  __syncwarp();
  if (n_inner > 0) {
    pipeline_reducer.consumer_release(release);
    ++release;
  }
}

}  // namespace bsk::bwd
