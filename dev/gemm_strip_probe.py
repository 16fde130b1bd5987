"""DSD's work order: effective TFLOPS against the N-strip width (N tiles of 256 whose B columns the CTAs running at
once share; 0 = the launcher's choice, B's strip in half of L2) on several layouts and sizes, fp16, 128-blocks, 25 %,
N = M = K. Layouts: 16 blocks in every row (dev/gemm_kernel_bench.py's) and bench gemm's (25 % of the blocks at
uniformly random places, rows of unequal length; three seeds). Two rounds. --n: N other than M = K.

    python dev/gemm_strip_probe.py [--sizes 4096 8192 16384] [--n N] [--strips 0 1 2 3 4 6 8]
"""
import argparse

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.gemm import _mask
from blackwell_sparsek.bench.timing import bench
from blackwell_sparsek.ops import _gemm_cuda as g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--strips", type=int, nargs="+", default=[0, 1, 2, 3, 4, 6, 8])
    ap.add_argument("--n", type=int, default=0)
    args = ap.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}")
    for S in args.sizes:
        nb = S // 128
        lays = {"16 a row": bsk.BlockSparseLayout.random_topk(S, nb // 4, seed=1, block_m=128, block_n=128,
                                                              device="cuda")}
        for seed in range(3):
            gen = torch.Generator(device="cuda").manual_seed(S + seed)
            lays[f"random {seed}"] = bsk.BlockSparseLayout.from_block_mask(_mask(nb, nb, 0.25, gen), S, S, 128, 128)
        n = args.n or S
        b = torch.randn(S, n, device="cuda", dtype=torch.float16)
        out = torch.empty(S, n, device="cuda", dtype=torch.float16)
        for name, lay in lays.items():
            vals = torch.randn(lay.nnz, 128, 128, device="cuda", dtype=torch.float16)
            fl = 2.0 * lay.nnz * 128 * 128 * n
            for rnd in range(2):
                res = [f"{fl / bench(lambda: g.dsd(vals, lay, b, out, strip=s)).median_ms / 1e9:5.1f}"
                       for s in args.strips]
                print(f"S={S:5d} N={n:5d} {name:9s} r{rnd}: " + " ".join(f"s{s}={r}" for s, r in zip(args.strips, res)),
                      flush=True)


if __name__ == "__main__":
    main()
