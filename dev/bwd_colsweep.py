"""Backward rate against column length at fixed shape: random top-k with k = 8..64 key blocks per 128-row query
block (so ~k listed query blocks per key column) and the dense layout, 2x16x8192x128 fp16, one process. If the
main kernel had no per-CTA fixed cost, its time per listed block would not depend on k.

    python dev/bwd_colsweep.py [--rounds 2]      # on the GPU
"""
import argparse
import statistics

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.backward import BwdCall, breakdown
from blackwell_sparsek.bench.timing import bench

L = bsk.BlockSparseLayout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--d", type=int, default=128)
    a = ap.parse_args()
    B, H, S, D = 2, 16, 8192, a.d
    cases = [(f"topk k={k}", L.random_topk(S, k, seed=1, num_heads=H)) for k in (8, 16, 32, 64)]
    cases.append(("dense", L.dense(S)))
    calls = [(name, BwdCall(lay, B, H, S, D, torch.float16)) for name, lay in cases]
    res = {name: [] for name, _ in calls}
    for _ in range(a.rounds):
        for name, c in calls:
            res[name].append(c.flops / (bench(c).median_ms * 1e-3) / 1e12)
    print(f"GPU: {torch.cuda.get_device_name()}  B,H,S,D = {B},{H},{S},{D} fp16, backward alone (prep+main+convert)")
    for name, c in calls:
        ks = breakdown(c, 10)
        main_us = next((us for key, us in ks if "device_kernel" in key or "Fmha" in key), float("nan"))
        blocks = c.flops / 2.5 / (4 * D * 128 * 128)
        print(f"{name:10s} {statistics.median(res[name]):6.1f} TFLOPS  main {main_us:8.1f} us  "
              f"main per listed block {main_us * 1e3 / blocks:7.2f} ns  | "
              + " ; ".join(f"{k[:40]} {us:.0f}" for k, us in ks[:3]))


if __name__ == "__main__":
    main()
