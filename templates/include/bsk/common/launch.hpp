// Host-side pieces every extern "C" launcher shares: its own return codes (beyond cudaError_t's range, so one int
// carries both), argument range checks, the L2-aware head grouping of the tile order, and per-device caches of
// what a launch would otherwise query each time. Python names the return codes (keep the two lists equal).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace bsk {

// Launcher return codes beyond cudaError_t's range: invalid arguments caught before any CUDA call. A bad TMA
// descriptor would not fail here (CUTLASS reports cuTensorMapEncodeTiled errors only through assert, compiled out
// under NDEBUG) but at run time, as a sticky fault that ends the CUDA context; hence every limit is checked first.
enum : int {
  kErrBadHeadDim = 10001,   // head_dim is not the one this kernel was compiled for
  kErrStrideRange = 10002,  // a Q/K/V/O stride is negative, not a multiple of 16 bytes or >= 2^40 bytes (TMA),
                            // or an LSE stride is negative or over 2^31 - 1
  kErrBadShape = 10003,     // a size is not positive, heads % heads_kv != 0, the layout does not cover seq_q or
                            // has neither 1 nor `heads` heads, or positions / tile ids would overflow int32
  kErrMisaligned = 10004,   // a Q/K/V/O base address or the row schedule is not 16-byte aligned
};

constexpr long long kIntMax = 0x7fffffffLL;
inline bool fits_int(long long v) { return v >= 0 && v <= kIntMax; }

// A stride TMA can encode (cuTensorMapEncodeTiled): in bytes, a multiple of 16 and below 2^40.
constexpr long long kTmaStrideLimit = 1LL << 40;
inline bool tma_stride_ok(long long elems, long long elem_bytes) {
  return elems >= 0 && elems < kTmaStrideLimit / elem_bytes && (elems * elem_bytes) % 16 == 0;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// (batch, head)s per group of the heaviest-first tile order (BsrTileScheduler::make): the largest divisor of
// batch * heads whose K/V (bytes per (batch, head): kv_bytes) fits in half of L2.
inline int head_group(int bh, long long kv_bytes, long long l2_bytes) {
  long long fit = kv_bytes > 0 ? (l2_bytes / 2) / kv_bytes : bh;
  int g = int(std::max(1LL, std::min<long long>(bh, fit)));
  while (bh % g != 0) --g;
  return g;
}

namespace {
// Devices on which this library's kernel has its shared-memory attribute set. Internal linkage on purpose: a
// function-local static in the launcher template would be a GNU-unique symbol, which the dynamic loader merges
// across every loaded library (RTLD_LOCAL or not), so a second build of the same kernel name in one process
// (another BSK_NVCC_FLAGS, a rebuilt cache entry) would skip setting its own attribute and fail to launch.
constexpr int kMaxDevices = 64;  // devices with a slot below; others take the uncached path
bool smem_set[kMaxDevices] = {};
int l2_bytes[kMaxDevices] = {};  // per device, read once

// The current device's L2 size in bytes, queried once per device.
inline cudaError_t device_l2_bytes(int device, int& l2) {
  bool known = device >= 0 && device < kMaxDevices;
  l2 = known ? l2_bytes[device] : 0;
  if (l2 > 0) return cudaSuccess;
  cudaError_t err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  if (err == cudaSuccess && known) l2_bytes[device] = l2;
  return err;
}

// Opts `kernel` into `smem` bytes of dynamic shared memory on `device`, once per device.
template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel* kernel, int device, int smem) {
  bool known = device >= 0 && device < kMaxDevices;
  if (known && smem_set[device]) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess && known) smem_set[device] = true;
  return err;
}
}  // namespace

}  // namespace bsk
