// Kernel shell of the single-warpgroup mainloop: example 88's shells assume a producer warp, this one has none
// (the consumer warpgroup issues its own loads), so it is ours.
#pragma once

#include "bsk/common/tile_scheduler.hpp"
#include "bsk/sm90/base.hpp"

namespace bsk {

// Kernel shell for BsrMainloopSingle: one CTA per 64-row query tile (heaviest rows first), 128 threads, CtasPerSm
// CTAs per SM (as many as shared memory allows, up to 3 = 168 registers a thread); pipelines the same warpgroup
// produces and consumes; BsrEpilogue in the mainloop's shared memory once the mainloop is done.
template <class Mainloop, class Epilogue, int CtasPerSm>
struct BsrKernelSingle {
  using Element = typename Mainloop::Element;
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using MainloopPipelineQ = typename Mainloop::MainloopPipelineQ;

  struct SharedStorage {
    union {
      typename Mainloop::SharedStorage mainloop;
      typename Epilogue::TensorStorage epilogue;
    };
    alignas(16) typename MainloopPipeline::SharedStorage pipeline_storage;
    alignas(16) typename MainloopPipelineQ::SharedStorage pipeline_storage_q;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static const int MaxThreadsPerBlock = cutlass::NumThreadsPerWarpGroup;
  static const int MinBlocksPerMultiprocessor = CtasPerSm;
  using ArchTag = cutlass::arch::Sm90;

  struct Params {
    ProblemShape problem_size;
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    typename BsrTileScheduler::Params tile_scheduler;
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem) {
    BsrTileScheduler scheduler{params.tile_scheduler};
    if (!scheduler.is_valid()) return;
    auto& storage = *reinterpret_cast<SharedStorage*>(smem);
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int lane_predicate = cute::elect_one_sync();
    bool leader = threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
    if (warp_idx == 0 && lane_predicate) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
      Epilogue::prefetch_tma_descriptors(params.epilogue);
    }

    typename MainloopPipelineQ::Params pq;
    pq.transaction_bytes = size(typename Mainloop::SmemLayoutQ{}(_, _, _0{})) * sizeof(Element);
    pq.role = MainloopPipelineQ::ThreadCategory::ProducerConsumer;
    pq.is_leader = leader;
    pq.num_consumers = cutlass::NumThreadsPerWarpGroup;
    typename MainloopPipeline::Params pkv;
    pkv.transaction_bytes = size(typename Mainloop::SmemLayoutK{}(_, _, _0{})) * sizeof(Element);
    pkv.role = MainloopPipeline::ThreadCategory::ProducerConsumer;
    pkv.is_leader = leader;
    pkv.num_consumers = cutlass::NumThreadsPerWarpGroup;
    MainloopPipelineQ pipeline_q(storage.pipeline_storage_q, pq, Shape<_1, _1, _1>{});
    MainloopPipeline pipeline(storage.pipeline_storage, pkv, Shape<_1, _1, _1>{});

    typename Mainloop::PipelineState smem_pipe_read;
    auto smem_pipe_write = cutlass::make_producer_start_state<MainloopPipeline>();
    typename Mainloop::PipelineStateQ smem_pipe_read_q;
    auto smem_pipe_write_q = cutlass::make_producer_start_state<MainloopPipelineQ>();
    __syncthreads();  // barrier init visible to the whole CTA

    auto blk_coord = scheduler.get_block_coord();
    Mainloop mainloop;
    auto result = mainloop.compute(blk_coord, params.mainloop, params.problem_size, pipeline, smem_pipe_read,
                                   smem_pipe_write, pipeline_q, smem_pipe_read_q, smem_pipe_write_q,
                                   storage.mainloop);
    Epilogue epilogue;
    int no_pipeline = 0;
    epilogue(typename Mainloop::TileShapePV{}, blk_coord, result, typename Mainloop::TiledMmaPV{},
             params.problem_size, params.epilogue, no_pipeline, storage.epilogue);
    tma_store_wait<0>();  // O read out of shared memory before the CTA exits
  }
};

}  // namespace bsk
