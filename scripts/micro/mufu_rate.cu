// Dev microbenchmark (docs/perf_notes.md): MUFU ex2 throughput per SM for 4..16 warps.
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mufu scripts/micro/mufu_rate.cu && /tmp/mufu
#include <cstdio>
#include <cuda_runtime.h>
// per warp: ITER x 64 independent ex2 (like one softmax tile row-pair), cycles per MUFU instruction per warp
template <int KIND>
__global__ void k(float* out, long long* cyc, int iters, float s) {
  float v[64];
  for (int i = 0; i < 64; ++i) v[i] = threadIdx.x * 1e-3f + i * 1e-2f;
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (KIND == 0) v[i] = exp2f(v[i] * s - 1.f);
      else { float e; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(v[i], s, -1.f))); v[i] = e; }
    }
  }
  long long t1 = clock64();
  float acc = 0; for (int i = 0; i < 64; ++i) acc += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
int main() {
  float* out; long long* cyc; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 32 * 8);
  int iters = 200;
  for (int warps : {4, 8, 12, 16}) {
    for (int rep = 0; rep < 2; ++rep) k<1><<<132, warps * 32>>>(out, cyc, iters, 0.5f);
    cudaError_t e = cudaDeviceSynchronize();
    long long h[32]; cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
    double mx = 0; for (int w = 0; w < warps; ++w) mx = h[w] > mx ? h[w] : mx;
    printf("%s warps/SM %2d: cycles per ex2 warp-instr per warp %.2f  -> SM rate %.1f lanes/clk\n", cudaGetErrorString(e), warps,
           mx / (iters * 64.0), warps * 32 * iters * 64.0 / mx);
  }
}
