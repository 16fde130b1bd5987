"""The bench-gemm DSD cases (8192x8192 A, 25 % of its 128-blocks at uniformly random places, fp16; N = 1024 and
8192) timed three ways in one process: bsr_matmul (the API, as `bench gemm` runs it), the kernel entry
_gemm_cuda.dsd on the same operands, and the kernel on a layout with exactly 16 blocks in every row
(dev/gemm_kernel_bench.py's). --sdd: the SDD headline case (8192^3, 25 % of the output's blocks) the same three
ways (sampled_matmul, _gemm_cuda.sdd, the kernel on the 16-per-row layout). Tells a host-bound API from a kernel
slowed by the layout's uneven rows.

    python dev/gemm_api_gap.py [--sdd [--groups]]
"""
import sys

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.gemm import _mask
from blackwell_sparsek.bench.timing import bench
from blackwell_sparsek.ops import _gemm_cuda as g


def main():
    print(f"GPU: {torch.cuda.get_device_name()}")
    for n in (1024, 8192):
        gen = torch.Generator(device="cuda").manual_seed(8192 + 7 * 8192 + 13 * n + 128 + 250)
        mask = _mask(64, 64, 0.25, gen)
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16, generator=gen)
        b = torch.randn(8192, n, device="cuda", dtype=torch.float16, generator=gen)
        a = bsk.BlockSparseMatrix.from_dense(x, 128, mask=mask)
        del x
        counts = mask.sum(1)
        top = bsk.BlockSparseLayout.random_topk(8192, 16, seed=1, block_m=128, block_n=128, device="cuda")
        vt = torch.randn(top.nnz, 128, 128, device="cuda", dtype=torch.float16)
        out = torch.empty(8192, n, device="cuda", dtype=torch.float16)
        flops = 2.0 * a.layout.nnz * 128 * 128 * n
        ft = 2.0 * top.nnz * 128 * 128 * n
        print(f"N={n}: rows hold {int(counts.min())}..{int(counts.max())} blocks (mean {float(counts.float().mean()):.1f})")
        for rnd in range(2):
            t_api = bench(lambda: bsk.bsr_matmul(a, b, out=out)).median_ms
            t_k = bench(lambda: g.dsd(a.values, a.layout, b, out)).median_ms
            t_top = bench(lambda: g.dsd(vt, top, b, out)).median_ms
            print(f"  round {rnd}: bsr_matmul {t_api * 1e3:6.1f} us {flops / t_api / 1e9:6.1f} TF | kernel entry "
                  f"{t_k * 1e3:6.1f} us {flops / t_k / 1e9:6.1f} TF | kernel, 16 per row {t_top * 1e3:6.1f} us "
                  f"{ft / t_top / 1e9:6.1f} TF", flush=True)


def main_sdd():
    print(f"GPU: {torch.cuda.get_device_name()}")
    n = 8192
    gen = torch.Generator(device="cuda").manual_seed(8192 + 7 * 8192 + 13 * n + 128 + 250)
    mask = _mask(64, 64, 0.25, gen)
    lay = bsk.BlockSparseLayout.from_block_mask(mask, 8192, n, 128, 128)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(8192, n, device="cuda", dtype=torch.float16, generator=gen)
    top = bsk.BlockSparseLayout.random_topk(8192, 16, seed=1, block_m=128, block_n=128, device="cuda")
    vals = torch.empty(lay.nnz, 128, 128, device="cuda", dtype=torch.float16)
    vt = torch.empty(top.nnz, 128, 128, device="cuda", dtype=torch.float16)
    flops, ft = 2.0 * lay.nnz * 128 * 128 * 8192, 2.0 * top.nnz * 128 * 128 * 8192
    counts = mask.sum(1)
    print(f"SDD 8192^3: rows hold {int(counts.min())}..{int(counts.max())} blocks (mean {float(counts.float().mean()):.1f}); "
          f"config {g.config_for(g.Op.SDD, x.dtype, x.dtype, 128, 128, n, lay.nnz, 132).kernel_name}")
    for rnd in range(2):
        t_api = bench(lambda: bsk.sampled_matmul(x, b, lay)).median_ms
        t_k = bench(lambda: g.sdd(x, b, lay, vals)).median_ms
        t_top = bench(lambda: g.sdd(x, b, top, vt)).median_ms
        print(f"  round {rnd}: sampled_matmul {t_api * 1e3:6.1f} us {flops / t_api / 1e9:6.1f} TF | kernel entry "
              f"{t_k * 1e3:6.1f} us {flops / t_k / 1e9:6.1f} TF | kernel, 16 per row {t_top * 1e3:6.1f} us "
              f"{ft / t_top / 1e9:6.1f} TF", flush=True)
    if "--groups" in sys.argv:  # the SDD order's rows per group (default about sqrt(SMs / density)), both layouts
        from blackwell_sparsek.layout import matrix as lm
        default = lm.sdd_group_rows
        for grp in (4, 8, 16, 23, 32, 64):
            lm.sdd_group_rows = lambda layout, sm_count, grp=grp: grp
            t_k = bench(lambda: g.sdd(x, b, lay, vals)).median_ms
            t_top = bench(lambda: g.sdd(x, b, top, vt)).median_ms
            print(f"  group {grp:3d} rows: kernel entry {t_k * 1e3:6.1f} us {flops / t_k / 1e9:6.1f} TF | "
                  f"kernel, 16 per row {t_top * 1e3:6.1f} us {ft / t_top / 1e9:6.1f} TF", flush=True)
        lm.sdd_group_rows = default
    # the single-block tiles (CTA pairs, the default before two-block tiles) on both layouts
    from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig
    single = BsrGemmConfig(op="sdd", tile_n=128, stages=6, cluster=2, epilogue="tma")
    for rnd in range(2):
        t_k = bench(lambda: g.sdd(x, b, lay, vals, config=single)).median_ms
        t_top = bench(lambda: g.sdd(x, b, top, vt, config=single)).median_ms
        print(f"  round {rnd}, {single.name_facts()}: kernel entry {t_k * 1e3:6.1f} us {flops / t_k / 1e9:6.1f} TF | "
              f"kernel, 16 per row {t_top * 1e3:6.1f} us {ft / t_top / 1e9:6.1f} TF", flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:  # what a call launches
        for _ in range(5):
            bsk.sampled_matmul(x, b, lay)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main_sdd() if "--sdd" in sys.argv else main()
