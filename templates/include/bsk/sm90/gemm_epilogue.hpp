// The BSR GEMM's staged epilogues. Both have each MMA warp write 16-row slices of its part of the output tile,
// final values (alpha, beta, bias, rounded), to its own staging area in shared memory, swizzled by row so that
// neither the pair writes nor the reads conflict; no barrier beyond the warp.
//   GemmStagedEpilogue (DSD/DSD_T's direct epilogue, GemmKernel::kStaged): the warp reads the slice back as row
//     segments of 8 columns a thread and stores them with 16-byte stores (whole 32-byte sectors, where stores
//     straight from the WGMMA accumulator layout write 4 bytes in each of 8 rows a warp instruction).
//   GemmTmaEpilogue (GemmKernel::TmaEpi): lane 0 TMA-stores the slice, and the warp goes on (to its next slice, or
//     the next tile's MMAs) while the copy engine drains it. Two buffers a warp: a buffer is written again once the
//     store issued from it two slices before has read it.
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/arch/barrier.h"
#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_tma.hpp"

#include "bsk/sm90/gemm_work.hpp"

namespace bsk {

using namespace cute;

// K: the GemmKernel (its tile, warpgroup width, output type, staging sizes, add_beta_bias and store_pair_smem).
template <class K>
struct GemmStagedEpilogue {
  using Out = typename K::ElementOut;
  // The same values as GemmKernel::epilogue(), written per 64-column slice to this warp's staging area (16 rows;
  // 16-byte chunks XOR-swizzled by row, so neither the pair writes nor the row reads conflict). A tile wholly
  // inside the output with beta = 0 and no bias (the common case) takes its own straight-line path, without
  // per-element bounds, loads or branches: with them, the unrolled epilogue was ~2500 instructions a thread and
  // ran for a quarter of the kernel's time, the MMAs idle meanwhile.
  template <class Acc, class Coord>
  CUTLASS_DEVICE static void run(GemmEpilogueParams const& e, GemmWork const& work, GemmItem const& it, Acc& acc,
                                 Coord const& tCcC, uint8_t* smem_stage, int tidx) {
    bool plain = e.beta == 0.f && e.bias == nullptr && (it.out_blk + 1) * K::TileM <= e.rows &&
                 (it.nt + 1) * K::TileN <= work.n;
    if (plain) body<true>(e, work, it, acc, tCcC, smem_stage, tidx);
    else body<false>(e, work, it, acc, tCcC, smem_stage, tidx);
  }

  template <bool kPlain, class Acc, class Coord>
  CUTLASS_DEVICE static void body(GemmEpilogueParams const& e, GemmWork const& work, GemmItem const& it, Acc& acc,
                                  Coord const& tCcC, uint8_t* smem_stage, int tidx) {
    constexpr int E = int(sizeof(Out));
    constexpr int kGroups = decltype(size(acc))::value / 4;  // 8-column groups of the accumulator ((2, 2, G))
    static_assert(kGroups * 8 == K::WgN && kGroups % 8 == 0, "the accumulator is ((2, 2, WgN / 8)) per thread");
    int lane = tidx % 32;
    uint32_t stage = cute::cast_smem_ptr_to_uint(smem_stage) + uint32_t((tidx / 32) * K::kStageWarpBytes);
    // rows and columns of this warp's part: element 0 of the fragment is (warp row 0 + lane / 4, 2 * (lane % 4))
    int wrow = int(get<0>(tCcC(0))) - lane / 4;
    int wcol = int(get<1>(tCcC(0))) - 2 * (lane % 4);
    Out* out = static_cast<Out*>(e.out);
    int row0 = it.out_blk * K::TileM + wrow, col0 = it.nt * K::TileN + wcol;
    int row_lim = e.rows, col_lim = work.n, ld = work.n;
    CUTLASS_PRAGMA_UNROLL
    for (int sl = 0; sl < kGroups / 8; ++sl) {  // 64-column slices
      __syncwarp();  // the previous slice's reads are done
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        CUTLASS_PRAGMA_UNROLL
        for (int g8 = 0; g8 < 8; ++g8) {
          int i = 2 * h + 4 * (sl * 8 + g8);  // acc(i), acc(i + 1): row lane / 4 + 8h, columns 8g + 2 (lane % 4)
          int lr = lane / 4 + 8 * h;
          int cc = 8 * g8 + 2 * (lane % 4);
          float v0 = e.alpha * acc(i), v1 = e.alpha * acc(i + 1);
          if constexpr (!kPlain) {
            int r = row0 + lr, c = col0 + sl * 64 + cc;
            if (r < row_lim && c < col_lim) K::add_beta_bias(e, e.beta != 0.f, out + int64_t(r) * ld + c, c, v0, v1);
          }
          int byte = cc * E;  // 16-byte chunk byte / 16 of the row, XOR the row's low 3 bits
          uint32_t off = uint32_t(lr * K::kStageRowBytes + (((byte / 16) ^ (lr & 7)) * 16) + byte % 16);
          K::store_pair_smem(stage + off, v0, v1);
        }
      }
      __syncwarp();
      // read back: lane handles row lane / 8 + 4 q, columns 8 (lane % 8) .. + 7 (E / 2 chunks of 16 bytes)
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < 4; ++q) {
        int lr = lane / 8 + 4 * q;
        int j = lane % 8;
        int r = row0 + lr, c = col0 + sl * 64 + 8 * j;
        uint4 v[E / 2];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < E / 2; ++k) {
          uint32_t addr = stage + uint32_t(lr * K::kStageRowBytes + (((j * (E / 2) + k) ^ (lr & 7)) * 16));
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "r"(addr));
        }
        if (kPlain || (r < row_lim && c < col_lim)) {  // col_lim is a multiple of 8: the 8 columns are all in
          uint4* p = reinterpret_cast<uint4*>(out + int64_t(r) * ld + c);
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < E / 2; ++k) p[k] = v[k];
        }
      }
    }
  }
};

// K: the GemmKernel (tile, warpgroup width, output type, slice layout and TMA store descriptor, add_beta_bias).
template <class K>
struct GemmTmaEpilogue {
  using Out = typename K::ElementOut;
  static constexpr int E = int(sizeof(Out));
  static constexpr int SW = K::kSliceCols;      // columns of a slice
  static constexpr int R = K::kSliceRowBytes;   // its row bytes = the swizzle width (128, 64 or 32)
  static constexpr int kBufBytes = 16 * R;

  // Byte offset of (row r, byte cb of the row) in a slice: the TMA swizzle of width R (16-byte chunk index XOR-ed
  // with the row bits above it); buffers are aligned to the swizzle's repeat.
  CUTLASS_DEVICE static uint32_t offset(int r, int cb) {
    uint32_t o = uint32_t(r * R + cb);
    return o ^ (((o >> 7) & uint32_t(R / 16 - 1)) << 4);
  }

  template <class Params, class Acc, class Coord>
  CUTLASS_DEVICE static void run(Params const& params, GemmWork const& work, GemmItem const& it, Acc& acc,
                                 Coord const& tCcC, uint8_t* smem, int tidx, uint32_t& slices) {
    GemmEpilogueParams const& e = params.epi;
    constexpr int kGroups = decltype(size(acc))::value / 4;  // 8-column groups of the accumulator ((2, 2, G))
    static_assert(kGroups * 8 == K::WgN && (8 * kGroups) % SW == 0, "the accumulator is ((2, 2, WgN / 8))");
    int row0 = 0, col0 = 0, row_lim = INT_MAX, col_lim = INT_MAX;
    if constexpr (K::Op == kOpSdd) {
      if (it.value < 0 && it.value2 < 0) return;  // a pair's partner slot (its block is another item's) or padding
    } else {
      row0 = it.out_blk * K::TileM, col0 = it.nt * K::TileN, row_lim = e.rows, col_lim = work.n;
    }
    int lane = tidx % 32;
    uint8_t* bufs = smem + (tidx / 32) * 2 * kBufBytes;  // this warp's two buffers
    // this warp's 16 rows and its warpgroup's first column: element 0 is (wrow + lane / 4, wcol + 2 (lane % 4))
    int wrow = int(get<0>(tCcC(0))) - lane / 4;
    int wcol = int(get<1>(tCcC(0))) - 2 * (lane % 4);
    Out const* cin = static_cast<Out const*>(e.out);
    // Without beta or bias (always for SDD) the staging loop is straight-line: the TMA store drops what lies past
    // the output, so no element needs a bounds check.
    bool plain = K::Op == kOpSdd || (e.beta == 0.f && e.bias == nullptr);
    Tensor mC = params.tma_c.get_tma_tensor(make_shape(params.c_rows, params.c_cols));
    auto s2g = params.tma_c.get_slice(Int<0>{});
    CUTLASS_PRAGMA_UNROLL
    for (int sl = 0; sl < 8 * kGroups / SW; ++sl) {
      // the slice's first output element: (grow, gcol) of the output (SDD: of the values as [nnz * BM, BN])
      int grow = row0 + wrow, gcol = col0 + wcol + sl * SW;
      if constexpr (K::Op == kOpSdd) {
        int h = K::SddPair == 2 ? (wcol + sl * SW) / K::BlockN : 0;  // which block of a pair tile
        int v = h ? it.value2 : it.value;
        if (v < 0) continue;  // not stored, no buffer taken
        grow = v * K::TileM + wrow, gcol = wcol + sl * SW - h * K::BlockN;
      }
      uint8_t* bufp = bufs + (slices & 1u) * kBufBytes;
      uint32_t buf = cute::cast_smem_ptr_to_uint(bufp);
      if (lane == 0) tma_store_wait<1>();  // the store issued from this buffer two slices ago has read it
      __syncwarp();
      auto stage = [&](auto kplain) {
        CUTLASS_PRAGMA_UNROLL
        for (int g8 = 0; g8 < SW / 8; ++g8) {
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h) {
            int i = 2 * h + 4 * (sl * (SW / 8) + g8);  // acc(i), acc(i + 1): row lane / 4 + 8h, cols 8g + 2 (lane % 4)
            int lr = lane / 4 + 8 * h, cc = 8 * g8 + 2 * (lane % 4);
            float v0 = e.alpha * acc(i), v1 = e.alpha * acc(i + 1);
            if constexpr (!decltype(kplain)::value) {
              int r = grow + lr, c = gcol + cc;
              if (r < row_lim && c < col_lim) K::add_beta_bias(e, e.beta != 0.f, cin + int64_t(r) * work.n + c, c, v0, v1);
            }
            K::store_pair_smem(buf + offset(lr, cc * E), v0, v1);
          }
        }
      };
      if (plain) stage(cute::true_type{});
      else stage(cute::false_type{});
      cutlass::arch::fence_view_async_shared();  // this thread's writes, seen by the copy engine
      __syncwarp();
      if (lane == 0) {
        Tensor sS = make_tensor(make_smem_ptr(reinterpret_cast<Out*>(bufp)), typename K::SmemLayoutC{});
        Tensor gS = local_tile(mC, Shape<_16, Int<SW>>{}, make_coord(grow / 16, gcol / SW));
        copy(params.tma_c, s2g.partition_S(sS), s2g.partition_D(gS));
        tma_store_arrive();
      }
      ++slices;
    }
  }
};

}  // namespace bsk
