// Kernel shell of the 'dual' schedule: two (or three) independent 64-row streams per persistent CTA. Example 88's shells
// give both MMA warpgroups one query tile (one K/V stream, shared); with 64-row layout blocks the two 64-row
// halves of a 128-row tile have different rows of the layout, so each warpgroup gets its own tile, its own
// producer warp, Q slot, K/V ring and O buffer. Ours.
#pragma once

#include "bsk/common/tile_scheduler.hpp"
#include "bsk/sm90/base.hpp"

namespace bsk {

// The tile order of BsrTileScheduler, dealt to Streams x gridDim.x streams: stream s of CTA c takes tiles
// Streams * c + s, Streams * c + s + Streams * gridDim.x, ... (neighbouring tiles, hence the same head's K/V, run
// side by side).
template <int Streams>
struct BsrDualScheduler : BsrTileScheduler {
  CUTLASS_DEVICE BsrDualScheduler(Params const& p, int stream) : BsrTileScheduler(p) {
    idx = Streams * int(blockIdx.x) + stream;
  }
  CUTLASS_DEVICE BsrDualScheduler& operator++() {
    idx += Streams * int(gridDim.x);
    return *this;
  }
};

// (Streams + 1) x 128 threads: warpgroup 0 holds the producer warps (warp s loads stream s: Q, then the K/V tiles
// of its rows; the other warps idle) at LoadRegisters a thread, warpgroup 1 + s is the MMA warpgroup of stream s
// with the rest of the register file, MmaRegisters (both from the config: families/attn_fwd.mma_registers). A
// stream's pipelines run across its rows, so the next row's first K/V loads go out while this row finishes.
template <class Mainloop, class Epilogue, int Streams, int MmaRegisters, int LoadRegisters>
struct BsrKernelDual {
  using Element = typename Mainloop::Element;
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using MainloopPipelineQ = typename Mainloop::MainloopPipelineQ;
  using PipelineState = typename Mainloop::PipelineState;
  using PipelineStateQ = typename Mainloop::PipelineStateQ;
  static constexpr int kStreams = Streams;
  static_assert(Streams == 2 || Streams == 3, "two or three streams (one producer warp each)");

  struct alignas(1024) StreamTensors {  // swizzled tiles: every stream's start 1024-byte aligned
    typename Mainloop::SharedStorage mainloop;
    typename Epilogue::TensorStorage epilogue;
  };
  struct StreamPipes {
    alignas(16) typename MainloopPipeline::SharedStorage kv;
    alignas(16) typename MainloopPipelineQ::SharedStorage q;
  };
  struct SharedStorage {
    StreamTensors tensors[kStreams];
    StreamPipes pipes[kStreams];
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static const int MaxThreadsPerBlock = (Streams + 1) * cutlass::NumThreadsPerWarpGroup;
  static const int MinBlocksPerMultiprocessor = 1;
  using ArchTag = cutlass::arch::Sm90;
  static constexpr uint32_t kLoadRegisters = LoadRegisters;
  static constexpr uint32_t kMmaRegisters = MmaRegisters;
  static_assert(kLoadRegisters % 8 == 0 && kMmaRegisters % 8 == 0 &&
                    128 * (kLoadRegisters + Streams * kMmaRegisters) <= 64 * 1024,
                "setmaxnreg: multiples of 8 that fit the register file");

  struct Params {
    ProblemShape problem_size;
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    typename BsrTileScheduler::Params tile_scheduler;
  };

  // The mainloop's hooks for example 88's warpgroup order barrier and load-warp handshake: unused here (the
  // warpgroups walk different rows, so no step of one may wait for the other).
  struct NoBarrier {
    CUTLASS_DEVICE void wait() {}
    CUTLASS_DEVICE void wait(int) {}
    CUTLASS_DEVICE void arrive() {}
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem) {
    auto& storage = *reinterpret_cast<SharedStorage*>(smem);
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int wg = cutlass::canonical_warp_group_idx();
    int lane_predicate = cute::elect_one_sync();
    if (warp_idx == 0 && lane_predicate) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
      Epilogue::prefetch_tma_descriptors(params.epilogue);
    }
    bool producer = wg == 0;
    int stream = producer ? warp_idx : wg - 1;
    bool active = stream < kStreams;  // producer warps past the streams have none
    int s = active ? stream : 0;

    // Each stream's barriers are initialized by its own producer warp (initializing_warp = s); an idle producer
    // warp initializes nothing.
    using Cat = typename MainloopPipeline::ThreadCategory;
    using CatQ = typename MainloopPipelineQ::ThreadCategory;
    typename MainloopPipelineQ::Params pq;
    pq.transaction_bytes = Mainloop::kOuterLoadBytes;
    pq.role = !active ? CatQ::NonParticipant : producer ? CatQ::Producer : CatQ::Consumer;
    pq.is_leader = producer && active && lane_predicate;
    pq.num_consumers = cutlass::NumThreadsPerWarpGroup;
    pq.initializing_warp = s;
    typename MainloopPipeline::Params pkv;
    pkv.transaction_bytes = Mainloop::kInnerLoadBytes;
    pkv.role = !active ? Cat::NonParticipant : producer ? Cat::Producer : Cat::Consumer;
    pkv.is_leader = producer && active && lane_predicate;
    pkv.num_consumers = cutlass::NumThreadsPerWarpGroup;
    pkv.initializing_warp = s;
    MainloopPipelineQ pipeline_q(storage.pipes[s].q, pq, Shape<_1, _1, _1>{});
    MainloopPipeline pipeline(storage.pipes[s].kv, pkv, Shape<_1, _1, _1>{});
    __syncthreads();  // barrier init visible to the whole CTA

    BsrDualScheduler<Streams> scheduler{params.tile_scheduler, s};
    Mainloop mainloop;
    NoBarrier no_barrier;
    if (producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();
      if (!active) return;
      auto write = cutlass::make_producer_start_state<MainloopPipeline>();
      auto write_q = cutlass::make_producer_start_state<MainloopPipelineQ>();
      CUTLASS_PRAGMA_NO_UNROLL
      for (; scheduler.is_valid(); ++scheduler) {
        auto blk_coord = scheduler.get_block_coord();
        mainloop.template load_kv_maybe_q<true>(0, blk_coord, params.mainloop, params.problem_size, pipeline, write,
                                                pipeline_q, write_q, storage.tensors[s].mainloop, no_barrier, false);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kMmaRegisters>();
      PipelineState read;
      PipelineStateQ read_q;
      int no_reducer = 0;
      CUTLASS_PRAGMA_NO_UNROLL
      for (; scheduler.is_valid(); ++scheduler) {
        auto blk_coord = scheduler.get_block_coord();
        auto result = mainloop.compute(blk_coord, blk_coord, params.mainloop, params.problem_size, pipeline, read,
                                       pipeline_q, read_q, no_reducer, no_reducer, storage.tensors[s].mainloop,
                                       no_barrier);
        ++read_q;
        Epilogue epilogue;
        int no_pipeline = 0;
        epilogue(typename Mainloop::TileShapePV{}, blk_coord, result, typename Mainloop::TiledMmaPV{},
                 params.problem_size, params.epilogue, no_pipeline, storage.tensors[s].epilogue);
      }
    }
  }
};

}  // namespace bsk
