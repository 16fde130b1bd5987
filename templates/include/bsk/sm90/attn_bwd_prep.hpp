// BlackwellSparseK backward (sm_90a): the two small kernels around the main one.
//
//   * prep: per query row, delta = rowsum(dO * O) in fp32 (minus the LSE's own gradient when the caller passes
//     one: d lse / d s = P folds into dS = P (dP - delta + g_lse)), and LSE2 = LSE * log2(e), +inf where the
//     forward's LSE is -inf (a row with no visible key), so the main kernel's exp2(S * scale * log2(e) - LSE2) is
//     0 there instead of NaN; and the row's fp32 dQ accumulator zeroed (fast kernel; the deterministic one stores
//     each tile's first contribution and zeroes its turn counters instead). 16-byte loads, D / 8 threads per row.
//   * convert: the fp32 dQ accumulator ((B, H, Sq, D), contiguous) into dQ in the caller's element type and
//     strides, 8 elements per thread; deterministic: zeros for a 64-query tile whose counter took no turn.
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

namespace bsk::bwd {

struct PrepParams {
  const void* o;
  const void* dO;
  const float* lse;        // (B, H, Sq) strides lse_b, lse_h, 1
  const float* glse;       // same layout as lse, or null
  float* lse2;             // (B, H, >= Sq) strides out_b, out_h, 1
  float* delta;            // same layout as lse2
  float* dq_acc;           // (B, H, Sq, D) contiguous: zeroed here (fast kernel), before the main kernel adds into it
  int* dq_sem;             // deterministic kernels: (B, H, n_qtiles) dQ turn counters, zeroed here; else null
  int n_qtiles;            // ceil(Sq / 64)
  long long o_b, o_h, o_s, do_b, do_h, do_s, lse_b, lse_h, out_b, out_h;
  int heads, seq_q;
  long long rows;          // B * H * Sq
};

// HeadDim / 8 threads per row, 8 elements (16 bytes of O and of dO) each, a shuffle reduction within the row's
// threads; each also zeroes its 8 floats of the row's fp32 dQ accumulator (fast kernel), or the first thread of
// each 64-query tile's first row its turn counter (deterministic): no separate memset pass.
template <class Element, int HeadDim>
__global__ void __launch_bounds__(256) attn_bwd_prep_kernel(PrepParams p) {
  constexpr int kThreadsPerRow = HeadDim / 8;
  static_assert(HeadDim % 8 == 0 && 32 % kThreadsPerRow == 0, "a row's threads sit inside one warp");
  constexpr int kRowsPerBlock = 256 / kThreadsPerRow;
  long long row = (long long)blockIdx.x * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  int c = (threadIdx.x % kThreadsPerRow) * 8;
  bool valid = row < p.rows;
  int s = 0, h = 0;
  long long b = 0;
  float acc = 0.f;
  if (valid) {
    s = int(row % p.seq_q);
    long long bh = row / p.seq_q;
    h = int(bh % p.heads);
    b = bh / p.heads;
    auto o = static_cast<const Element*>(p.o) + b * p.o_b + h * p.o_h + s * p.o_s + c;
    auto d = static_cast<const Element*>(p.dO) + b * p.do_b + h * p.do_h + s * p.do_s + c;
    uint4 ov = *reinterpret_cast<const uint4*>(o);
    uint4 dv = *reinterpret_cast<const uint4*>(d);
    const Element* oe = reinterpret_cast<const Element*>(&ov);
    const Element* de = reinterpret_cast<const Element*>(&dv);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) acc += float(oe[i]) * float(de[i]);
    if (p.dq_sem == nullptr) {
      float4* z = reinterpret_cast<float4*>(p.dq_acc + row * HeadDim + c);
      z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else if (c == 0 && s % 64 == 0) {
      p.dq_sem[bh * p.n_qtiles + s / 64] = 0;
    }
  }
  CUTLASS_PRAGMA_UNROLL
  for (int m = kThreadsPerRow / 2; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (valid && c == 0) {
    long long in = b * p.lse_b + h * p.lse_h + s;
    long long out = b * p.out_b + h * p.out_h + s;
    float lse = p.lse[in];
    float g = p.glse != nullptr ? p.glse[in] : 0.f;
    p.lse2[out] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    p.delta[out] = acc - g;
  }
}

struct ConvertParams {
  const float* src;        // (B, H, Sq, D) contiguous
  void* dst;
  long long dst_b, dst_h, dst_s;
  int heads, seq_q, head_dim;
  long long chunks;        // B * H * Sq * D / 8
  const int* dq_sem;       // deterministic kernels: turns taken per (B, H, 64-query tile); else null
  int n_qtiles;
};

template <class Element>
__global__ void __launch_bounds__(256) attn_bwd_convert_kernel(ConvertParams p) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.chunks) return;
  int per_row = p.head_dim / 8;
  int c = int(i % per_row) * 8;
  long long row = i / per_row;
  int s = int(row % p.seq_q);
  long long bh = row / p.seq_q;
  int h = int(bh % p.heads);
  long long b = bh / p.heads;
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f), y = x;
  if (p.dq_sem == nullptr || p.dq_sem[bh * p.n_qtiles + s / 64] != 0) {  // else no contribution was stored
    const float4* src = reinterpret_cast<const float4*>(p.src + i * 8);
    x = src[0];
    y = src[1];
  }
  alignas(16) Element out[8] = {Element(x.x), Element(x.y), Element(x.z), Element(x.w),
                    Element(y.x), Element(y.y), Element(y.z), Element(y.w)};
  auto dst = static_cast<Element*>(p.dst) + b * p.dst_b + h * p.dst_h + s * p.dst_s + c;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
}

}  // namespace bsk::bwd
