// BSR GEMM on Hopper: one persistent, warp-specialized kernel for the three products over one BSR operand.
//   DSD   C[M, N]  = alpha * A · B + beta * C + bias, A block-sparse [nnz, BM, BK] (rows of blocks), B dense [K, N]
//   DSD_T C[K, N]  = alpha * Aᵀ · B + beta * C + bias, the same A read through its column view, B dense [M, N]
//   SDD   V[p]     = alpha * (A · B) on the listed blocks only (A [M, K], B [K, N] dense, V [nnz, BM, BN])
// Warp 0 (the producer) TMA-loads, per k step of 64, the A tile and the B tile the layout selects into a ring of
// Stages slots (mbarrier pipeline, CUTLASS PipelineTmaAsync); two MMA warpgroups run WGMMA on the slot (a 128-row
// tile split by rows, a 64-row tile split by columns) and store the fp32 accumulators straight from registers.
// DSD_T needs no transposed copy of the values: the A tile is the value block's rows (the GEMM's K) by its
// columns (the GEMM's M), loaded M-major, which WGMMA reads from shared memory as it is.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/numeric_types.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "cute/tensor.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"

#include "bsk/sm90/gemm_epilogue.hpp"
#include "bsk/sm90/gemm_work.hpp"

namespace bsk {

using namespace cute;

template <class Element_, class ElementOut_, int Op_, int TileM_, int TileN_, int BlockM_, int BlockN_, int Stages_,
          int Cluster_ = 1, bool TmaEpi_ = false>
struct GemmKernel {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr int Op = Op_;
  static constexpr int TileM = TileM_;
  static constexpr int TileN = TileN_;
  static constexpr int TileK = 64;
  static constexpr int Stages = Stages_;
  // CTAs per cluster (1, 2 or 4). The CTAs of a cluster share their A tile: each TMA-loads its 1/Cluster of it and
  // multicasts that to all (DSD/DSD_T: adjacent N tiles of one output block row; SDD, pairs only: two listed
  // blocks of one block row).
  static constexpr int Cluster = Cluster_;
  static_assert(Cluster == 1 || Cluster == 2 || Cluster == 4, "clusters of 1, 2 or 4 CTAs");
  static_assert(Op != kOpSdd || Cluster <= 2, "SDD runs single CTAs or pairs");
  // Epilogue: false stores straight from the accumulators; true writes each warpgroup's 64 x WgN part to shared
  // memory and TMA-stores it (asynchronous: the warpgroup goes back to MMAs while the copy engine drains it).
  static constexpr bool TmaEpi = TmaEpi_;
  // Rows of the reduction one listed block holds (DSD: its columns, DSD_T: its rows); SDD walks K densely.
  static constexpr int BlockK = Op == kOpDsd ? BlockN_ : BlockM_;
  static constexpr int StepsPerBlock = BlockK / TileK;
  static_assert(TileM == 64 || TileM == 128, "64- or 128-row tiles");
  static_assert(Op == kOpSdd || BlockK % TileK == 0, "a listed block is whole k steps");
  static_assert(TileM == (Op == kOpDsdT ? BlockN_ : BlockM_), "one output tile row = one block row");
  // SDD: a tile is one listed block, or (SddPair 2, TileN = 2 BlockN) two listed blocks of one block row side by
  // side: one A tile, B's two column blocks loaded into the two halves of the B tile, WGMMAs twice as wide.
  static constexpr int BlockN = BlockN_;
  static constexpr int SddPair = Op == kOpSdd ? TileN / BlockN : 1;
  static_assert(Op != kOpSdd || (TileN % BlockN == 0 && (SddPair == 1 || SddPair == 2)), "SDD: one or two blocks");
  static_assert(SddPair == 1 || (Cluster == 1 && TmaEpi_), "SDD pair tiles: single CTAs, the TMA-store epilogue");

  // 128 rows: each MMA warpgroup takes 64 rows; 64 rows: each takes half the columns.
  static constexpr int AtomM = TileM / 64;
  static constexpr int AtomN = 2 / AtomM;
  static constexpr int WgN = TileN / AtomN;
  static_assert(WgN % 16 == 0 && WgN <= 256, "a WGMMA N");
  static constexpr bool kAmn = Op == kOpDsdT;  // A's tile is M-major (the value block's columns are contiguous)
  static constexpr GMMA::Major MajorA = kAmn ? GMMA::Major::MN : GMMA::Major::K;

  using SmemAtomA = std::conditional_t<kAmn, GMMA::Layout_MN_SW128_Atom<Element>, GMMA::Layout_K_SW128_Atom<Element>>;
  using SmemLayoutA = decltype(tile_to_shape(SmemAtomA{}, make_shape(Int<TileM>{}, Int<TileK>{}, Int<Stages>{}),
                                             std::conditional_t<kAmn, Step<_2, _1, _3>, Step<_1, _2, _3>>{}));
  // B [K, N] row-major is N-major; the swizzle atom is no wider than one warpgroup's columns.
  using SmemAtomB = std::conditional_t<
      WgN % 64 == 0, GMMA::Layout_MN_SW128_Atom<Element>,
      std::conditional_t<WgN % 32 == 0, GMMA::Layout_MN_SW64_Atom<Element>, GMMA::Layout_MN_SW32_Atom<Element>>>;
  using SmemLayoutB = decltype(tile_to_shape(SmemAtomB{}, make_shape(Int<TileN>{}, Int<TileK>{}, Int<Stages>{}),
                                             Step<_2, _1, _3>{}));
  // What one B load fills: the whole tile, or (SDD pairs) one half; half h of slot s is slot 2s + h here, the same
  // bytes as SmemLayoutB (its 64-column swizzle atoms are stacked along K first, then along N).
  using SmemLayoutBLoad = decltype(tile_to_shape(
      SmemAtomB{}, make_shape(Int<TileN / SddPair>{}, Int<TileK>{}, Int<Stages * SddPair>{}), Step<_2, _1, _3>{}));
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<WgN>, Int<TileK>>, MajorA, GMMA::Major::MN>(),
      Layout<Shape<Int<AtomM>, Int<AtomN>, _1>>{}));

  // Global views for the TMA descriptors (the host fills them; the device addresses tiles by coordinates).
  using StrideA = std::conditional_t<kAmn, Stride<_1, int64_t>, Stride<int64_t, _1>>;
  using StrideB = Stride<_1, int64_t>;
  static auto gmem_a(Element const* p, int rows, int cols, int64_t ld) {
    if constexpr (kAmn) return make_tensor(make_gmem_ptr(p), make_shape(rows, cols), StrideA{_1{}, ld});
    else return make_tensor(make_gmem_ptr(p), make_shape(rows, cols), StrideA{ld, _1{}});
  }
  static auto gmem_b(Element const* p, int n, int k, int64_t ld) {
    return make_tensor(make_gmem_ptr(p), make_shape(n, k), StrideB{_1{}, ld});
  }
  using TmaLoadA = std::conditional_t<(Cluster > 1), SM90_TMA_LOAD_MULTICAST, SM90_TMA_LOAD>;
  static auto tma_a(Element const* p, int rows, int cols, int64_t ld) {
    return make_tma_copy(TmaLoadA{}, gmem_a(p, rows, cols, ld), SmemLayoutA{}(_, _, 0), Int<Cluster>{});
  }
  static auto tma_b(Element const* p, int n, int k, int64_t ld) {
    return make_tma_copy(SM90_TMA_LOAD{}, gmem_b(p, n, k, ld), SmemLayoutBLoad{}(_, _, 0));
  }
  // The TMA-store epilogue (gemm_epilogue.hpp, GemmTmaEpilogue) stages 16-row slices of kSliceCols columns per MMA
  // warp, two buffers a warp: rows of kSliceCols * sizeof(ElementOut) bytes (128, or 64/32 for a narrow
  // warpgroup), swizzled at that width as the TMA store expects.
  static constexpr int kSliceCols = WgN * int(sizeof(ElementOut)) < 128 ? WgN : 128 / int(sizeof(ElementOut));
  static constexpr int kSliceRowBytes = kSliceCols * int(sizeof(ElementOut));
  using SmemAtomC = std::conditional_t<
      kSliceRowBytes == 128, GMMA::Layout_K_SW128_Atom<ElementOut>,
      std::conditional_t<kSliceRowBytes == 64, GMMA::Layout_K_SW64_Atom<ElementOut>,
                         GMMA::Layout_K_SW32_Atom<ElementOut>>>;
  using SmemLayoutC = decltype(tile_to_shape(SmemAtomC{}, make_shape(_16{}, Int<kSliceCols>{})));
  static constexpr int kTmaEpiBytes = 8 * 2 * 16 * kSliceRowBytes;  // 8 MMA warps x 2 buffers
  static auto tma_c(ElementOut* p, int rows, int cols, int64_t ld) {
    auto g = make_tensor(make_gmem_ptr(p), make_shape(rows, cols), make_stride(ld, _1{}));
    return make_tma_copy(SM90_TMA_STORE{}, g, SmemLayoutC{});
  }
  // The direct epilogue of DSD/DSD_T stages each warp's 16 x 64 output slices through shared memory (kStaged), so
  // that its global stores are 16 bytes a thread and whole 32-byte sectors (straight from the WGMMA accumulator
  // layout, a warp's store writes 4 bytes in each of 8 rows). Values are final (alpha, beta, bias, rounded)
  // before staging, as in the unstaged epilogue, so both give the same bits.
  static constexpr bool kStaged = !TmaEpi && Op != kOpSdd && WgN % 64 == 0;
  static constexpr int kStageRowBytes = 64 * int(sizeof(ElementOut));  // one 64-column slice row
  static constexpr int kStageWarpBytes = 16 * kStageRowBytes;
  static constexpr int kStageBytes = kStaged ? 8 * kStageWarpBytes : 16;
  using TmaA = decltype(tma_a(nullptr, 1, 1, 8));
  using TmaC = decltype(tma_c(nullptr, 1, 1, 8));
  using TmaB = decltype(tma_b(nullptr, 1, 1, 8));

  using Pipeline = cutlass::PipelineTmaAsync<Stages>;
  using PipelineState = cutlass::PipelineState<Stages>;
  static constexpr uint32_t kTxBytes = uint32_t((TileM + TileN) * TileK * sizeof(Element));

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutA>> a;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutB>> b;
    alignas(1024) cute::array_aligned<uint8_t, TmaEpi ? kTmaEpiBytes : kStageBytes> epi;  // epilogue staging
    typename Pipeline::SharedStorage pipe;
  };

  struct Params {
    TmaA tma_a;
    TmaB tma_b;
    TmaC tma_c;        // the output (DSD/DSD_T: [rows, N]; SDD: values as [nnz * TileM, TileN]); TmaEpi only
    int c_rows, c_cols;
    GemmWork work;
    GemmEpilogueParams epi;
  };

  static constexpr int SharedStorageSize = int(sizeof(SharedStorage));
  static constexpr int MaxThreadsPerBlock = 384;
  static constexpr int MinBlocksPerMultiprocessor = 1;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_raw) {
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem_raw);
    int wg = cutlass::canonical_warp_group_idx();
    int warp = cutlass::canonical_warp_idx_sync();
    int lane = cutlass::canonical_lane_idx();
    if (warp == 0 && lane == 0) {
      cute::prefetch_tma_descriptor(params.tma_a.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_b.get_tma_descriptor());
    }
    typename Pipeline::Params pp;
    pp.transaction_bytes = kTxBytes;
    pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = 256;
    Pipeline pipeline(s.pipe, pp, Shape<Int<Cluster>, _1, _1>{});
    if constexpr (Cluster > 1) {  // the peer's barriers are initialized before any multicast or remote arrive
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    Tensor sA = make_tensor(make_smem_ptr(s.a.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(s.b.data()), SmemLayoutB{});
    GemmWork const& work = params.work;

    if (wg == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (warp == 0) produce(params, work, pipeline, sA, sB, lane);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(params, work, pipeline, sA, sB, int(threadIdx.x) - 128, s.epi.data());
    }
  }

  template <class TA, class TB>
  CUTLASS_DEVICE void produce(Params const& params, GemmWork const& work, Pipeline& pipeline, TA& sA, TB& sB,
                              int lane) {
    auto const& tma_a = params.tma_a;
    auto const& tma_b = params.tma_b;
    Tensor mA = tma_a.get_tma_tensor(make_shape(work.a_rows, work.a_cols));
    Tensor mB = tma_b.get_tma_tensor(make_shape(work.n, work.b_k));
    Tensor gA = local_tile(mA, Shape<Int<TileM>, Int<TileK>>{}, make_coord(_, _));  // (TileM, 64, mt, kt)
    Tensor gB = local_tile(mB, Shape<Int<TileN / SddPair>, Int<TileK>>{}, make_coord(_, _));  // (.., 64, nt, kt)
    Tensor sBl = make_tensor(sB.data(), SmemLayoutBLoad{});
    int rank = Cluster > 1 ? int(cute::block_rank_in_cluster()) : 0;
    auto pa = tma_partition(tma_a, rank, Layout<Int<Cluster>>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
    auto pb = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sBl), group_modes<0, 2>(gB));
    Tensor tAgA = get<0>(pa);  // (TMA, mt, kt)
    Tensor tAsA = get<1>(pa);  // (TMA, Stages)
    Tensor tBgB = get<0>(pb);
    Tensor tBsB = get<1>(pb);
    PipelineState state = cutlass::make_producer_start_state<Pipeline>();
    bool leader = lane == 0;

    // bn2: an SDD pair's second column block (its B tile goes to the slot's second half)
    auto load = [&](int am, int ak, int bn, int bk, int bn2 = 0) {
      if (leader) {
        pipeline.producer_acquire(state);
        auto* bar = pipeline.producer_get_barrier(state);
        if constexpr (Cluster > 1) copy(tma_a.with(*bar, uint16_t((1u << Cluster) - 1)), tAgA(_, am, ak),
                                        tAsA(_, state.index()));
        else copy(tma_a.with(*bar), tAgA(_, am, ak), tAsA(_, state.index()));
        copy(tma_b.with(*bar), tBgB(_, bn, bk), tBsB(_, state.index() * SddPair));
        if constexpr (SddPair == 2) copy(tma_b.with(*bar), tBgB(_, bn2, bk), tBsB(_, state.index() * 2 + 1));
      }
      ++state;
    };

    for (int w = int(blockIdx.x) / Cluster; w < work.total; w += int(gridDim.x) / Cluster) {
      GemmItem it = work.template item<Op, Cluster, SddPair>(w, rank);
      if constexpr (Op == kOpSdd) {
        for (int ks = 0; ks < it.steps; ++ks) load(it.out_blk, ks, it.col_blk, ks, it.col_blk2);
      } else {
        // The row's block indices, 32 at a time, one per lane: no dependent global load per block.
        for (int j0 = 0; j0 < it.count; j0 += 32) {
          int j = it.start + j0 + lane;
          bool in = j0 + lane < it.count;
          int kb = in ? work.blk_b[j] : 0;                                         // B's block row
          int vb = Op == kOpDsdT ? (in ? work.blk_a[j] : 0) : j;                   // A's value block
          int n_here = min(32, it.count - j0);
          for (int jj = 0; jj < n_here; ++jj) {
            int kbj = __shfl_sync(0xffffffffu, kb, jj);
            int vbj = __shfl_sync(0xffffffffu, vb, jj);
            CUTLASS_PRAGMA_UNROLL
            for (int sub = 0; sub < StepsPerBlock; ++sub) {
              if constexpr (Op == kOpDsd) load(vbj, sub, it.nt, kbj * StepsPerBlock + sub);
              else load(0, vbj * StepsPerBlock + sub, it.nt, kbj * StepsPerBlock + sub);
            }
          }
        }
      }
    }
    if (leader) pipeline.producer_tail(state);
  }

  template <class TA, class TB>
  CUTLASS_DEVICE void consume(Params const& params, GemmWork const& work, Pipeline& pipeline, TA& sA, TB& sB,
                              int tidx, uint8_t* smem_epi) {
    TiledMma mma;
    auto thr = mma.get_thread_slice(tidx);
    Tensor tCrA = thr.partition_fragment_A(sA);  // (MMA, MMA_M, MMA_K, Stages) descriptors
    Tensor tCrB = thr.partition_fragment_B(sB);
    Tensor acc = partition_fragment_C(mma, Shape<Int<TileM>, Int<TileN>>{});
    Tensor tCcC = thr.partition_C(make_identity_tensor(Shape<Int<TileM>, Int<TileN>>{}));
    PipelineState read;
    int rank = Cluster > 1 ? int(cute::block_rank_in_cluster()) : 0;
    uint32_t slices = 0;  // TMA-store epilogue: slices this warp has stored (their parity picks the buffer)

    for (int w = int(blockIdx.x) / Cluster; w < work.total; w += int(gridDim.x) / Cluster) {
      GemmItem it = work.template item<Op, Cluster, SddPair>(w, rank);
      if (it.steps > 0) {
        // Only a row's last listed block can be the last block column; when the reduction length is not a
        // multiple of the block, that block's values past it are zeroed in shared memory before the MMA (the B
        // rows there are TMA zero fill, but padding values need not be finite).
        int pad_from = work.template pad_step_from<Op>(it);
        auto mma_step = [&](int ks) {
          pipeline.consumer_wait(read);
          int stage = read.index();
          if (ks >= pad_from) {
            int valid = work.k_valid_last - (ks - pad_from) * TileK;
            if (valid < TileK) zero_padding(sA, stage, valid, tidx);
          }
          warpgroup_fence_operand(acc);
          warpgroup_arrive();
          CUTLASS_PRAGMA_UNROLL
          for (int kb = 0; kb < size<2>(tCrA); ++kb) {
            cute::gemm(mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
            mma.accumulate_ = GMMA::ScaleOut::One;
          }
          warpgroup_commit_batch();
          ++read;
        };
        PipelineState release = read;
        mma.accumulate_ = GMMA::ScaleOut::Zero;
        mma_step(0);
        warpgroup_fence_operand(acc);
        CUTLASS_PRAGMA_NO_UNROLL
        for (int ks = 1; ks < it.steps; ++ks) {
          mma_step(ks);
          warpgroup_wait<1>();
          warpgroup_fence_operand(acc);
          pipeline.consumer_release(release);  // the previous step's slot
          ++release;
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc);
        pipeline.consumer_release(release);
      } else {
        clear(acc);  // a row with no blocks contributes alpha * 0
      }
      if constexpr (TmaEpi)
        GemmTmaEpilogue<GemmKernel>::run(params, work, it, acc, tCcC, smem_epi, tidx, slices);
      else if constexpr (kStaged)
        GemmStagedEpilogue<GemmKernel>::run(params.epi, work, it, acc, tCcC, smem_epi, tidx);
      else epilogue(params.epi, work, it, acc, tCcC);
    }
    if constexpr (TmaEpi) {
      if (tidx % 32 == 0) tma_store_wait<0>();  // the copy engine has read the staging buffers before the CTA ends
    }
  }

  // Zero A's k columns at and past `valid` (local to this 64-wide step) of slot `stage`, for both warpgroups.
  template <class TA>
  CUTLASS_DEVICE void zero_padding(TA& sA, int stage, int valid, int tidx) {
    Tensor a = sA(_, _, stage);
    for (int i = tidx; i < TileM * TileK; i += 256) {
      int m = i % TileM, k = i / TileM;
      if (k >= valid) a(m, k) = Element(0);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(256, kBarGemmPad);
  }

  // The output rule past alpha * acc for DSD/DSD_T, at an in-bounds (r, c) pair: + beta * C (p: C's element there,
  // read only when use_beta) + bias[c]. Every epilogue applies it, before rounding once.
  CUTLASS_DEVICE static void add_beta_bias(GemmEpilogueParams const& e, bool use_beta, ElementOut const* p, int c,
                                           float& v0, float& v1) {
    if (use_beta) {
      v0 += e.beta * float(p[0]);
      v1 += e.beta * float(p[1]);
    }
    if (e.bias != nullptr) {
      v0 += e.bias[c];
      v1 += e.bias[c + 1];
    }
  }

  template <class Acc, class Coord>
  CUTLASS_DEVICE void epilogue(GemmEpilogueParams const& e, GemmWork const& work, GemmItem const& it, Acc& acc,
                               Coord const& tCcC) {
    ElementOut* out;
    int ld, row0, col0, row_lim, col_lim;
    if constexpr (Op == kOpSdd) {
      if (it.value < 0) return;  // the partner slot of a pair (its block is another item's)
      out = static_cast<ElementOut*>(e.out) + int64_t(it.value) * TileM * TileN;
      ld = TileN, row0 = 0, col0 = 0, row_lim = TileM, col_lim = TileN;  // whole block (padding computes to 0)
    } else {
      out = static_cast<ElementOut*>(e.out);
      ld = work.n, row0 = it.out_blk * TileM, col0 = it.nt * TileN, row_lim = e.rows, col_lim = work.n;
    }
    bool use_beta = Op != kOpSdd && e.beta != 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // (i, i + 1): adjacent columns of one row (the WGMMA C layout)
      int r = row0 + get<0>(tCcC(i));
      int c = col0 + get<1>(tCcC(i));
      if (r < row_lim && c < col_lim) {  // col_lim is a multiple of 8: c + 1 < col_lim too
        float v0 = e.alpha * acc(i), v1 = e.alpha * acc(i + 1);
        ElementOut* p = out + int64_t(r) * ld + c;
        if constexpr (Op != kOpSdd) add_beta_bias(e, use_beta, p, c, v0, v1);
        store_pair(p, v0, v1);
      }
    }
  }

  CUTLASS_DEVICE static void store_pair_smem(uint32_t addr, float v0, float v1) {
    if constexpr (std::is_same_v<ElementOut, float>) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v0), "f"(v1));
    } else {
      cute::array<ElementOut, 2> v{ElementOut(v0), ElementOut(v1)};
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<uint32_t const*>(v.data())));
    }
  }

  CUTLASS_DEVICE static void store_pair(ElementOut* p, float v0, float v1) {
    if constexpr (std::is_same_v<ElementOut, float>) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      cute::array<ElementOut, 2> v{ElementOut(v0), ElementOut(v1)};
      *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<uint32_t const*>(v.data());
    }
  }
};

}  // namespace bsk
