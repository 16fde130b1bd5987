// Host-side pieces every extern "C" launcher shares: its own return codes (beyond cudaError_t's range, so one int
// carries both), argument range checks, the L2-aware head grouping of the tile order, and per-device caches of
// what a launch would otherwise query each time. Python names the return codes (keep the two lists equal).
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

namespace bsk {

// Launcher return codes beyond cudaError_t's range: invalid arguments caught before any CUDA call.
enum : int { kErrBadHeadDim = 10001, kErrStrideRange = 10002, kErrBadShape = 10003 };

inline bool fits_int(long long v) { return v >= 0 && v <= 0x7fffffffLL; }

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
