"""The bench-gemm N = 1024 DSD case (8192x8192 A, 25 % of its 128-blocks at uniformly random places, fp16) timed
three ways in one process: bsr_matmul (the API, as `bench gemm` runs it), the kernel entry _gemm_cuda.dsd on the
same operands, and the kernel on a layout with exactly 16 blocks in every row (dev/gemm_kernel_bench.py's).
Tells a host-bound API from a kernel slowed by the layout's uneven rows.

    python dev/gemm_api_gap.py
"""
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


if __name__ == "__main__":
    main()
