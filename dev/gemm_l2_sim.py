"""An LRU model of the DSD kernel's DRAM reads under its work order (a model for choosing what to measure, not a
result).

    python dev/gemm_l2_sim.py [--cap-mb 25] [--strips 1,2,3,4,6,8,32] [--orders row,col] [--seeds 3]

Replays gemm_work.hpp's item order (N-strips of `strip` tiles, block rows row-major inside a strip, or column-major
with --orders col) for 132 persistent CTAs in lockstep, one k step a time unit: each CTA touches its A tile (a value
block's 64 columns) and its B tile (64 rows of B x tile_n), and writes its C tile when its item ends. An LRU of
--cap-mb holds them; a miss reads the tile from DRAM. The layout is bench's headline: M = N = K = 8192, 128x128
blocks, 16 random columns of 64 per block row, tile 128x256.

Checked against Nsight Compute on an H100 (bench/results/h100/ncu/ncu_dsd_head.txt, 653 / 731 / 1590 MB of DRAM
reads at strips 6 / 1 / 32): the model matches with ~25 MB of L2 (666 / 730 / 1538 MB), not with the H100's 50 MB
(425 / 667 / 1496).
"""
from __future__ import annotations

import argparse
import random
from collections import OrderedDict


def dram_reads_mb(strip: int, cap_mb: float = 25, sms: int = 132, seed: int = 0, order: str = "row",
                  blocks: int = 64, per_row: int = 16, n: int = 8192, tile_n: int = 256) -> float:
    rnd = random.Random(seed)
    cols = [sorted(rnd.sample(range(blocks), per_row)) for _ in range(blocks)]
    n_tiles = n // tile_n
    strip = max(1, min(n_tiles, strip))
    total = blocks * n_tiles

    def item(w: int) -> tuple[int, int]:  # (block row, N tile) of item w, as GemmWork::item walks it
        per_strip = blocks * strip
        s, rem = divmod(w, per_strip)
        width = min(strip, n_tiles - s * strip)
        if order == "row":
            return rem // width, s * strip + rem % width
        return rem % blocks, s * strip + rem // blocks

    cap, used, reads = cap_mb * 2 ** 20, 0, 0
    lru: OrderedDict = OrderedDict()

    def touch(key, size: int, write: bool = False) -> None:
        nonlocal used, reads
        if key in lru:
            lru.move_to_end(key)
            return
        reads += 0 if write else size
        lru[key] = size
        used += size
        while used > cap:
            used -= lru.popitem(last=False)[1]

    a_tile, b_tile, c_tile = 128 * 64 * 2, 64 * tile_n * 2, 128 * tile_n * 2
    for wave in range(-(-total // sms)):
        items = [item(w) for w in range(wave * sms, min(total, (wave + 1) * sms))]
        for step in range(2 * per_row):
            blk, sub = divmod(step, 2)
            for r, nt in items:
                touch(("A", r, blk, sub), a_tile)
                touch(("B", 2 * cols[r][blk] + sub, nt), b_tile)
        for r, nt in items:
            touch(("C", r, nt), c_tile, write=True)
    return reads / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap-mb", type=float, default=25)
    ap.add_argument("--strips", default="1,2,3,4,6,8,32")
    ap.add_argument("--orders", default="row,col")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    for order in a.orders.split(","):
        res = []
        for s in (int(x) for x in a.strips.split(",")):
            mb = sum(dram_reads_mb(s, a.cap_mb, seed=sd, order=order) for sd in range(a.seeds)) / a.seeds
            res.append(f"s{s}={mb:.0f}")
        print(f"L2 {a.cap_mb:g} MB, {order}-major inside a strip, DRAM reads (MB):", " ".join(res), flush=True)


if __name__ == "__main__":
    main()
