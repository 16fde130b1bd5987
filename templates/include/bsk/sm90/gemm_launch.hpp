// The BSR GEMM's extern "C" launcher body: plain argument struct -> work list, TMA descriptors and epilogue
// parameters -> launch on the caller's stream. Every limit a TMA descriptor or the device's int32 arithmetic has is
// checked before any CUDA call (launch.hpp's codes; Python names them).
#pragma once

#include <algorithm>

#include "cutlass/device_kernel.h"

#include "bsk/common/launch.hpp"
#include "bsk/sm90/gemm_kernel.hpp"

namespace bsk {

template <class Named>
int gemm_smem_bytes() {
  return Named::SharedStorageSize;
}

namespace {
int max_clusters[kMaxDevices] = {};  // per device: clusters of this kernel's shape that fit at once, queried once

// Clusters of `cluster` CTAs of this kernel that can be resident at once (a persistent grid must not exceed it: a
// cluster that waits for a free GPC would run as a second wave). 0 on error.
template <class Named>
cudaError_t gemm_max_clusters(int device, int cluster, int threads, int smem, int& out) {
  bool known = device >= 0 && device < kMaxDevices;
  out = known ? max_clusters[device] : 0;
  if (out > 0) return cudaSuccess;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(unsigned(cluster), 1, 1);
  cfg.blockDim = dim3(unsigned(threads), 1, 1);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err = cudaOccupancyMaxActiveClusters(&out, cutlass::device_kernel<Named>, &cfg);
  if (err == cudaSuccess && known && out > 0) max_clusters[device] = out;
  return err;
}
}  // namespace

// a: values [nnz, BM, BN] (DSD, DSD_T) or a [m, k] (SDD); b: [k, n]; out: [m, n] (DSD, DSD_T) or values (SDD).
// m: output rows; k: the reduction length (DSD: K, DSD_T: M, SDD: K); n_items: schedule entries.
template <class Kernel, class Named, class Args>
int gemm_launch(Args const& a, cudaStream_t stream) {
  using Element = typename Kernel::Element;
  constexpr int Op = Kernel::Op;
  constexpr int TileM = Kernel::TileM, TileN = Kernel::TileN, TileK = Kernel::TileK;
  constexpr int BlockK = Kernel::BlockK;
  constexpr bool kSdd = Op == kOpSdd;
  constexpr int Cluster = Kernel::Cluster;

  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.nnz < 0 || a.n_items < 0 || a.strip < 0) return kErrBadShape;
  // TMA: b's (and SDD a's) rows must be 16-byte multiples; the epilogue stores column pairs below n.
  if (a.n % 8 != 0 || (kSdd && a.k % 8 != 0)) return kErrStrideRange;
  if (!tma_stride_ok(a.n, sizeof(Element)) || (kSdd && !tma_stride_ok(a.k, sizeof(Element)))) return kErrStrideRange;
  // Element offsets in TMA coordinates and the tile walk are int32.
  long long value_rows = (long long)a.nnz * (Op == kOpDsd ? TileM : BlockK);
  if (value_rows > kIntMax || (long long)a.m + TileM > kIntMax || (long long)a.k + BlockK + TileK > kIntMax ||
      (long long)a.n + 2LL * Cluster * TileN > kIntMax)
    return kErrBadShape;
  if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.out) || !aligned16(a.sched)) return kErrMisaligned;
  if (!kSdd && (long long)a.n_items * TileM < a.m) return kErrBadShape;  // the schedule covers every row
  // SDD pairs (CTA pairs or pair tiles): entries 2i, 2i + 1 run as one item
  constexpr int kPer = Cluster * Kernel::SddPair;
  if (kSdd && a.n_items % kPer != 0) return kErrBadShape;

  // With CTA pairs an item is a pair of N tiles (DSD/DSD_T) or of SDD entries.
  int n_tiles = kSdd ? 1 : (a.n + TileN * Cluster - 1) / (TileN * Cluster);
  int n_items = kSdd ? a.n_items / kPer : a.n_items;
  long long total = (long long)n_items * n_tiles;
  if (total > kIntMax) return kErrBadShape;
  if (total == 0) return 0;

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return int(err);
  int l2 = 0;
  err = device_l2_bytes(device, l2);
  if (err != cudaSuccess) return int(err);

  GemmWork w{};
  w.sched = reinterpret_cast<const int4*>(a.sched);
  w.blk_b = a.blk_b;
  w.blk_a = a.blk_a;
  w.total = int(total);
  w.n_items = n_items;
  w.n_tiles = n_tiles;
  long long strip_bytes = (long long)a.k * TileN * Cluster * (long long)sizeof(Element);  // B's columns per item
  long long strip = a.strip > 0 ? a.strip : (l2 / 2) / std::max(1LL, strip_bytes);
  w.strip = int(std::max(1LL, std::min<long long>(n_tiles, strip)));
  w.n = a.n;
  w.b_k = a.k;
  if constexpr (kSdd) {
    w.steps_per_block = (a.k + TileK - 1) / TileK;
    w.last_blk = -1;
    w.k_valid_last = 0;
    w.a_rows = a.m;
    w.a_cols = a.k;
  } else {
    int n_blk = (a.k + BlockK - 1) / BlockK;
    w.steps_per_block = BlockK / TileK;
    w.last_blk = a.k % BlockK ? n_blk - 1 : -1;
    w.k_valid_last = a.k - (n_blk - 1) * BlockK;
    int value_rows_ = std::max(1, int(value_rows));  // no blocks: a descriptor never used
    if constexpr (Op == kOpDsd) {
      w.a_rows = value_rows_;  // values as [nnz * BM, BK], K-major
      w.a_cols = BlockK;
    } else {
      w.a_rows = TileM;        // values as (BN, nnz * BM), M-major: a block's columns are the GEMM's M
      w.a_cols = value_rows_;
    }
  }

  // The output as the TMA-store epilogue's descriptor sees it (SDD: the values as [nnz * TileM, TileN]).
  int c_rows = kSdd ? int(std::max(1LL, (long long)a.nnz * TileM)) : a.m;
  int c_cols = kSdd ? Kernel::BlockN : a.n;
  if (kSdd && (long long)a.nnz * TileM > kIntMax) return kErrBadShape;
  auto const* pa = static_cast<Element const*>(a.a);
  auto const* pb = static_cast<Element const*>(a.b);
  typename Named::Params params{
      kSdd ? Kernel::tma_a(pa, a.m, a.k, a.k)
           : Kernel::tma_a(pa, w.a_rows, w.a_cols, Op == kOpDsd ? BlockK : TileM),
      Kernel::tma_b(pb, a.n, a.k, a.n),
      Kernel::TmaEpi ? Kernel::tma_c(static_cast<typename Kernel::ElementOut*>(a.out), c_rows, c_cols, c_cols)
                     : typename Kernel::TmaC{},
      c_rows,
      c_cols,
      w,
      GemmEpilogueParams{a.out, a.bias, a.alpha, a.beta, a.m}};

  int smem = Kernel::SharedStorageSize;
  err = allow_dynamic_smem(cutlass::device_kernel<Named>, device, smem);
  if (err != cudaSuccess) return int(err);
  dim3 block(Kernel::MaxThreadsPerBlock, 1, 1);
  if constexpr (Cluster == 1) {
    dim3 grid(unsigned(std::min<long long>(total, std::max(1, a.sm_count))), 1, 1);
    cutlass::device_kernel<Named><<<grid, block, smem, stream>>>(params);
    return int(cudaGetLastError());
  } else {
    int fit = 0;
    err = gemm_max_clusters<Named>(device, Cluster, Kernel::MaxThreadsPerBlock, smem, fit);
    if (err != cudaSuccess) return int(err);
    long long clusters = std::min<long long>({total, std::max(1, a.sm_count / Cluster), std::max(1, fit)});
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(Cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(unsigned(clusters * Cluster), 1, 1);
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, cutlass::device_kernel<Named>, params);
    if (err != cudaSuccess) return int(err);
    return int(cudaGetLastError());
  }
}

}  // namespace bsk
