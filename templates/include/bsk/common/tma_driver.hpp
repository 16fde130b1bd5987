// Host side: CUTLASS's TMA descriptor encoding without a driver-symbol lookup per descriptor.
//
// Without -lcuda (the .so must link on hosts with no driver library), CUTLASS calls cuTensorMapEncodeTiled through
// cudaGetDriverEntryPointByVersion on EVERY descriptor it encodes (cutlass/cuda_host_adapter.hpp), and that lookup
// costs tens of microseconds: a launcher that encodes nine descriptors per call spent ~290 us of host time per
// backward call on an H100 host (NVIDIA/cutlass#3003 reports the same). Included before any CUTLASS header, this
// switches CUTLASS to a direct call and defines that symbol here, resolving the driver's entry point once per
// process. Should the dynamic loader bind the call to the driver's own definition instead, that is the same
// function. Include it first in a launcher's translation unit (it must precede cutlass/cuda_host_adapter.hpp).
#pragma once

#ifndef CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#endif

#include <cuda.h>
#include <cuda_runtime.h>

namespace bsk::detail {
using EncodeTiledFn = decltype(&::cuTensorMapEncodeTiled);

inline EncodeTiledFn encode_tiled_entry() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<EncodeTiledFn>(fn);
}
}  // namespace bsk::detail

extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  static const bsk::detail::EncodeTiledFn fn = bsk::detail::encode_tiled_entry();  // once per process
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return fn(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, boxDim, elementStrides,
            interleave, swizzle, l2Promotion, oobFill);
}
