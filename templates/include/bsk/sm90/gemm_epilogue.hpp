// The BSR GEMM's staged direct epilogue (DSD/DSD_T, GemmKernel::kStaged): each MMA warp writes its 16 x 64 slices
// of the output tile, final values (alpha, beta, bias, rounded), to its own staging area in shared memory, reads
// them back as row segments of 8 columns a thread and stores those with 16-byte stores: whole 32-byte sectors,
// where stores straight from the WGMMA accumulator layout write 4 bytes in each of 8 rows a warp instruction.
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"

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

}  // namespace bsk
