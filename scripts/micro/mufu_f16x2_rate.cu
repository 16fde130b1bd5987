// Dev microbenchmark (docs/perf_notes.md): ex2.approx.f16x2 throughput (it compiles to two MUFU.EX2.F16).
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mufu16 scripts/micro/mufu_f16x2_rate.cu && /tmp/mufu16
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
// ex2.approx.f16x2 throughput: 32 independent half2 chains per thread (= 64 exps), cycles per instruction per warp
__global__ void k(unsigned* out, long long* cyc, int iters) {
  unsigned v[32];
  for (int i = 0; i < 32; ++i) { __half2 h = __floats2half2_rn(-(threadIdx.x % 7) * 0.1f - i * 0.01f, -0.5f); v[i] = *(unsigned*)&h; }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      unsigned r;
      asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(v[i]));
      v[i] = r ^ 0x80008000u;  // keep it negative (sign flip), dependent chain
    }
  }
  long long t1 = clock64();
  unsigned acc = 0; for (int i = 0; i < 32; ++i) acc ^= v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
int main() {
  unsigned* out; long long* cyc; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 32 * 8);
  int iters = 200;
  for (int warps : {4, 8, 16}) {
    for (int rep = 0; rep < 2; ++rep) k<<<132, warps * 32>>>(out, cyc, iters);
    cudaError_t e = cudaDeviceSynchronize();
    long long h[32]; cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
    double mx = 0; for (int w = 0; w < warps; ++w) mx = h[w] > mx ? h[w] : mx;
    printf("%s f16x2 warps/SM %2d: cycles per ex2.f16x2 warp-instr per warp %.2f -> %.1f exps/clk/SM\n", cudaGetErrorString(e), warps,
           mx / (iters * 32.0), 2 * warps * 32 * iters * 32.0 / mx);
  }
}
