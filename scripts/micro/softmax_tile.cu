// Dev microbenchmark (docs/perf_notes.md): one online-softmax step of a 64x128 S tile per warp, alone (4 warps/SM)
// and two warps per scheduler (8 warps/SM). nvcc -O3 --use_fast_math -gencode=arch=compute_90a,code=sm_90a
// -o /tmp/smx scripts/micro/softmax_tile.cu && /tmp/smx
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
// One softmax tile step per iteration per warp: 2 rows x 32 values per thread, row max (chain + 2 shuffles),
// rescale 16 o values per row, exp2 of fma, row sum, pack to half2. Cycles per iteration per warp.
__global__ void k(float* out, long long* cyc, int iters, float s) {
  float v[64], o[32], m[2] = {-1e30f, -1e30f}, l[2] = {0, 0};
  for (int i = 0; i < 64; ++i) v[i] = threadIdx.x * 1e-3f + i * 1e-2f;
  for (int i = 0; i < 32; ++i) o[i] = 1.f;
  unsigned pk[32];
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int j = 0; j < 32; ++j) mx = fmaxf(mx, v[r * 32 + j]);
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
      float corr = exp2f((m[r] - mx) * s);
      m[r] = mx;
      l[r] *= corr;
#pragma unroll
      for (int j = 0; j < 16; ++j) o[r * 16 + j] *= corr;
      float sum = 0, sub = mx * s;
#pragma unroll
      for (int j = 0; j < 32; ++j) { float e = exp2f(fmaf(v[r * 32 + j], s, -sub)); v[r * 32 + j] = e; sum += e; }
      l[r] += sum;
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) { __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]); pk[j] = *(unsigned*)&h; }
    // feed back (keeps the dependency across iterations, like S = QK^T of the next tile)
#pragma unroll
    for (int j = 0; j < 64; ++j) v[j] = __uint_as_float(pk[j / 2] ^ (j & 1)) * 1e-30f + v[j] * 3.f;
  }
  long long t1 = clock64();
  float acc = l[0] + l[1];
  for (int i = 0; i < 32; ++i) acc += o[i] + __uint_as_float(pk[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
int main() {
  float* out; long long* cyc; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 32 * 8);
  int iters = 200;
  for (int warps : {4, 8}) {
    for (int rep = 0; rep < 2; ++rep) k<<<132, warps * 32>>>(out, cyc, iters, 0.125f);
    cudaError_t e = cudaDeviceSynchronize();
    long long h[32]; cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
    double mx = 0; for (int w = 0; w < warps; ++w) mx = h[w] > mx ? h[w] : mx;
    printf("%s warps/SM %2d: cycles per softmax tile per warp %.0f\n", cudaGetErrorString(e), warps, mx / iters);
  }
}
