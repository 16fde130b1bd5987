// Dev microbenchmark (docs/perf_notes.md): MUFU exp2 throughput per SM for 4..16 warps, f32 (ex2.approx.ftz.f32)
// and two at a time in half precision (ex2.approx.f16x2, which compiles to two MUFU.EX2.F16).
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mufu scripts/micro/mufu_rate.cu && /tmp/mufu
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
constexpr int kChains = 64;  // independent exp2 chains per thread (like one softmax tile row-pair)
// F16x2 = false: kChains f32 ex2 per iteration; true: kChains / 2 half2 ex2 (kChains exps).
template <bool F16x2>
__global__ void k(float* out, long long* cyc, int iters) {
  constexpr int n = F16x2 ? kChains / 2 : kChains;
  unsigned v[n];
  for (int i = 0; i < n; ++i) {
    if (F16x2) { __half2 h = __floats2half2_rn(-(threadIdx.x % 7) * 0.1f - i * 0.01f, -0.5f); v[i] = *(unsigned*)&h; }
    else v[i] = __float_as_uint(threadIdx.x * 1e-3f + i * 1e-2f);
  }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
      unsigned r;
      if (F16x2) {
        asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(v[i]));
        v[i] = r ^ 0x80008000u;  // keep it negative (sign flip), dependent chain
      } else {
        float e;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(__uint_as_float(v[i]), 0.5f, -1.f)));
        v[i] = __float_as_uint(e);
      }
    }
  }
  long long t1 = clock64();
  unsigned acc = 0;
  for (int i = 0; i < n; ++i) acc ^= v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = __uint_as_float(acc);
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
template <bool F16x2>
void run(float* out, long long* cyc) {
  constexpr int iters = 200, instrs = F16x2 ? kChains / 2 : kChains;  // warp instructions per iteration
  for (int warps : {4, 8, 12, 16}) {
    for (int rep = 0; rep < 2; ++rep) k<F16x2><<<132, warps * 32>>>(out, cyc, iters);
    cudaError_t e = cudaDeviceSynchronize();
    long long h[32];
    if (e == cudaSuccess) e = cudaMemcpy(h, cyc, sizeof(h), cudaMemcpyDeviceToHost);
    double mx = 0;
    for (int w = 0; w < warps && e == cudaSuccess; ++w) mx = h[w] > mx ? h[w] : mx;
    printf("%s %s warps/SM %2d: cycles per ex2 warp-instr per warp %.2f -> %.1f exps/clk/SM\n", cudaGetErrorString(e),
           F16x2 ? "f16x2" : "f32  ", warps, mx / (iters * double(instrs)), warps * 32.0 * iters * kChains / mx);
  }
}
int main() {
  float* out;
  long long* cyc;
  if (cudaMalloc(&out, 132 * 1024 * 4) != cudaSuccess || cudaMalloc(&cyc, 132 * 32 * 8) != cudaSuccess) return 1;
  run<false>(out, cyc);
  run<true>(out, cyc);
}
