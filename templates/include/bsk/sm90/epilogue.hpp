// The epilogue both kernel shells share: O through shared memory and one TMA store per warpgroup that nobody
// waits on until the buffer is needed again; LSE straight to global.
#pragma once

#include "bsk/sm90/base.hpp"

namespace bsk {

// Epilogue, per MMA warpgroup: LSE straight to global; O converted into this warpgroup's 64 x HeadDim shared
// buffer and written by one TMA store that is not waited for here. The buffer is reused one tile later, after
// the store has read it (checked then, long done by that time); the scheduler's is_valid() waits for the last one
// before the CTA exits. Example 88's epilogue drains four sub-tile stores per tile with the tensor cores idle.
template <class Element, int HeadDim>
struct BsrEpilogue {
  using SmemLayoutO = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_64, Int<HeadDim>>{}));
  using TmaStoreO = decltype(make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), make_shape(0, 0, make_shape(0, 0)), StrideQKV{}),
      SmemLayoutO{}));

  struct TensorStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutO>, 128> smem_o;
  };
  // The kernel shell constructs an epilogue load pipeline; this epilogue loads nothing.
  using LoadPipeline = cutlass::PipelineTransactionAsync<1>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  static constexpr int TmaTransactionBytes = 0;

  struct Arguments {
    Element* ptr_O;
    StrideQKV dO;
    float* ptr_LSE;
    StrideLSE dLSE;
  };
  struct Params {
    TmaStoreO tma_store_o;
    float* ptr_LSE;
    StrideLSE dLSE;
  };

  static Params to_underlying_arguments(ProblemShape const& ps, Arguments const& args, void* = nullptr) {
    auto shape_o = make_shape(get<2>(ps), get<4>(ps), make_shape(get<0>(ps), get<1>(ps)));
    auto tma = make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(args.ptr_O), shape_o, args.dO),
                             SmemLayoutO{});
    return Params{tma, args.ptr_LSE, args.dLSE};
  }

  static CUTLASS_DEVICE void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_store_o.get_tma_descriptor());
  }

  // blk_coord: (64-row tile, _0, (b, h)).
  template <class TileShape, class BlkCoord, class ResultTuple, class TiledMma, class Pipeline>
  CUTLASS_DEVICE void operator()(TileShape const&, BlkCoord const& blk_coord, ResultTuple const& result,
                                 TiledMma const& tiled_mma, ProblemShape const& ps, Params const& params, Pipeline&,
                                 TensorStorage& storage) {
    auto const& acc = get<0>(result);
    auto const& lse = get<1>(result);
    int thread_idx = int(threadIdx.x);
    int wg_thread = thread_idx % cutlass::NumThreadsPerWarpGroup;
    int m = int(get<0>(blk_coord));
    int b = get<2, 0>(blk_coord), h = get<2, 1>(blk_coord);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);

    // LSE: the threads that hold column 0 write their rows. A row whose every key was masked comes out of the
    // softmax collective as +inf; our contract is -inf (and O = 0).
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<_64, Int<HeadDim>>{}));
    Tensor tOcO_mn = make_tensor(tOcO.data(), fmha_c::layout_acc_mn(tiled_mma, tOcO.layout()));
    if (get<1>(tOcO_mn(0, 0)) == 0) {
      float* lse_bh = params.ptr_LSE + size_t(b) * get<1, 0>(params.dLSE) + size_t(h) * get<1, 1>(params.dLSE);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(tOcO_mn); ++i) {
        int row = m * 64 + int(get<0>(tOcO_mn(i, 0)));
        if (row < get<2>(ps)) lse_bh[row] = lse(i) == INFINITY ? -INFINITY : lse(i);
      }
    }

    // O: convert, wait until the previous tile's store has read the buffer, fill it with stmatrix (four 8x8
    // matrices per instruction), hand it to the TMA unit.
    Tensor tOrO = make_fragment_like<Element>(acc);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) tOrO(i) = static_cast<Element>(acc(i));
    int barrier_id = kBarEpilogue + thread_idx / cutlass::NumThreadsPerWarpGroup;  // the warpgroup's own
    bool leader = wg_thread == 0;
    if (leader) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, barrier_id);
    Tensor sO = make_tensor(make_smem_ptr(storage.smem_o.data()), SmemLayoutO{});
    auto store_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma);
    auto thr_store_o = store_o.get_thread_slice(wg_thread);
    copy(store_o, thr_store_o.retile_S(tOrO), thr_store_o.partition_D(sO));
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, barrier_id);
    if (leader) {
      Tensor mO = params.tma_store_o.get_tma_tensor(
          make_shape(get<2>(ps), get<4>(ps), make_shape(get<0>(ps), get<1>(ps))));
      Tensor gO = local_tile(mO(_, _, make_coord(b, h)), Shape<_64, Int<HeadDim>>{}, make_coord(m, _0{}));
      auto cta_tma = params.tma_store_o.get_slice(_0{});
      copy(params.tma_store_o, cta_tma.partition_S(sO), cta_tma.partition_D(gO));
      tma_store_arrive();
    }
  }
};

}  // namespace bsk
