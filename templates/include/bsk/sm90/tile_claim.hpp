// Tiles claimed at run time (config: AttentionConfig.claims_tiles, the persistent ping-pong kernel at head_dim 128
// and every split-KV one): CTA c runs tile c first, then grid + the next value of a counter in global memory, which
// the launcher zeroes before each launch. Rows of unequal length (causal, windows at the edges, documents,
// split-KV pieces 2.5x longer than the rows around them) leave a static round-robin's CTAs unevenly loaded; a CTA
// that drew long tiles now takes fewer. The order of claims follows the tile order (heaviest rows first), so the
// CTAs running at once still share K/V through L2. Which CTA runs a tile does not change its result: outputs
// stay bitwise deterministic.
//
// The example-88 shell runs the scheduler in four roles that each iterate the tiles: the K/V producer warp
// (warp 1) claims each tile and publishes its id in a ring in shared memory; the Q producer (warp 2), the reducer
// (warp 0, idle in the forward) and both MMA warpgroups read it there, every thread arriving on the slot's empty
// barrier (no lane-predicated code on the MMA warps' path: it makes ptxas treat their tile loop as divergent).
// Warp 3 never iterates. The ring sits past the shell's SharedStorage in dynamic shared memory: a static
// __shared__ one moves the dynamic base off the 1024-byte alignment the 128-byte-swizzled TMA tiles need.
#pragma once

#include "cutlass/arch/barrier.h"
#include "cute/arch/util.hpp"

namespace bsk {

template <class BaseScheduler>
struct BsrClaimScheduler : BaseScheduler {
  using BaseScheduler::idx;
  using BaseScheduler::params;

  struct Params : BaseScheduler::Params {
    int* counter = nullptr;  // zeroed by the launcher before each launch
    int ring_offset = 0;     // the Ring's byte offset in dynamic shared memory
    Params() = default;
    Params(typename BaseScheduler::Params const& p) : BaseScheduler::Params(p) {}
  };
  static constexpr int kRing = 8;  // ids in flight: the K/V producer runs at most a few short tiles ahead
  static constexpr int kClaimWarp = 1;
  struct Ring {
    uint64_t full[kRing];
    uint64_t empty[kRing];
    int ids[kRing];
  };

  static int ring_offset(int storage_bytes) { return (storage_bytes + 15) / 16 * 16; }
  static int smem_bytes(int storage_bytes) { return ring_offset(storage_bytes) + int(sizeof(Ring)); }

  Params const& claim_params;
  int slot = 0;
  uint32_t pass = 0;  // completed trips around the ring
  bool fetched = false;
  bool claimer;

  // Runs in every thread before the shell's __syncthreads, which publishes the barriers' init.
  CUTLASS_DEVICE BsrClaimScheduler(Params const& p)
      : BaseScheduler(p),
        claim_params(p),
        claimer(cutlass::canonical_warp_idx_sync() == kClaimWarp) {
    if (threadIdx.x == 0) {
      Ring& r = ring();
      for (int i = 0; i < kRing; ++i) {
        cutlass::arch::ClusterBarrier::init(&r.full[i], 1);
        cutlass::arch::ClusterBarrier::init(&r.empty[i], blockDim.x - 2 * 32);  // all but the claim and idle warps
      }
      cutlass::arch::fence_barrier_init();
    }
  }

  CUTLASS_DEVICE bool is_valid() {
    if (!fetched) fetch();
    return BaseScheduler::is_valid();
  }

  CUTLASS_DEVICE BsrClaimScheduler& operator++() {
    fetched = false;
    if (++slot == kRing) {
      slot = 0;
      ++pass;
    }
    return *this;
  }

 private:
  CUTLASS_DEVICE Ring& ring() const {
    extern __shared__ char bsk_dynamic_smem[];
    return *reinterpret_cast<Ring*>(bsk_dynamic_smem + claim_params.ring_offset);
  }
  static CUTLASS_DEVICE uint32_t addr(uint64_t const& b) { return cute::cast_smem_ptr_to_uint(&b); }
  static CUTLASS_DEVICE void arrive(uint64_t const& b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr(b)) : "memory");
  }
  static CUTLASS_DEVICE void wait(uint64_t const& b, uint32_t parity) {
    asm volatile(
        "{\n\t.reg .pred P1;\n\tWAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
        "@!P1 bra WAIT;\n\t}\n" ::"r"(addr(b)),
        "r"(parity)
        : "memory");
  }

  CUTLASS_DEVICE void fetch() {
    Ring& r = ring();
    if (claimer) {
      if (pass > 0) wait(r.empty[slot], (pass - 1) & 1);  // every reader took the id this slot held
      int id = 0;
      if (threadIdx.x % 32 == 0) {  // the producer warp: a lane predicate costs nothing here
        id = (pass == 0 && slot == 0) ? int(blockIdx.x) : params.grid + atomicAdd(claim_params.counter, 1);
        r.ids[slot] = id;
        arrive(r.full[slot]);  // release: the id is visible to whoever waits on the slot
      }
      idx = __shfl_sync(0xffffffff, id, 0);
    } else {
      wait(r.full[slot], pass & 1);
      idx = *reinterpret_cast<volatile int*>(&r.ids[slot]);
      arrive(r.empty[slot]);
    }
    fetched = true;
  }
};

}  // namespace bsk
