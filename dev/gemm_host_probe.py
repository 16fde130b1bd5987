"""Where a bsr_matmul call's host time goes, on a GPU machine: each layer of the eager path timed alone, calls
issued back to back (8192x8192 A at 25 %, 128-blocks, fp16, N = 64 so that the kernel is shorter than the host
work and every figure is host microseconds per call).

    python dev/gemm_host_probe.py
"""
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.timing import host_us
from blackwell_sparsek.families.bsr_gemm import launch_args
from blackwell_sparsek.ops import _gemm_checks as chk
from blackwell_sparsek.ops import _gemm_cuda as g
from blackwell_sparsek.ops import gemm


def per_call_us(fn, n=3000):
    for _ in range(200):
        fn()
    return host_us(fn, n)[0]


def main():
    print(f"GPU: {torch.cuda.get_device_name()}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    lay = bsk.BlockSparseLayout.random_topk(8192, k=16, seed=1)
    w = bsk.BlockSparseMatrix.from_dense(torch.randn(8192, 8192, device="cuda", dtype=torch.float16, generator=gen),
                                         block=128, mask=lay.to_dense_mask()[0].to("cuda"))
    values, lay = w.values, w.layout
    x = torch.randn(8192, 64, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(8192, 64, device="cuda", dtype=torch.float16)
    dev = values.device
    sched = lay.row_schedule()[0]
    cfg = g.config_for(g.Op.DSD, values.dtype, out.dtype, 128, 128, 64, sched.shape[0], g._sm_count(dev))
    fields = launch_args(a=values, b=x, out=out, bias=None, sched=sched, blk_b=lay.col_idx[0], blk_a=None, m=8192,
                         n=64, k=8192, nnz=lay.nnz, alpha=1.0, beta=0.0, sm_count=132)
    g.dsd(values, lay, x, out)
    kernel = g._KERNELS[cfg]
    struct = kernel.Args(**fields)
    a16, b16 = torch.randn(64, 64, device="cuda", dtype=torch.float16), torch.randn(64, 64, device="cuda",
                                                                                     dtype=torch.float16)
    steps = {
        "torch.mm 64x64 (a launch through torch)": lambda: torch.mm(a16, b16),
        "bsr_matmul(w, x)": lambda: bsk.bsr_matmul(w, x),
        "bsr_matmul(w, x, out=out)": lambda: bsk.bsr_matmul(w, x, out=out),
        "  check_matmul": lambda: chk.check_matmul(values, lay, x, transpose=False, out_dtype=None, alpha=1.0,
                                                   beta=0.0, out=out, bias=None),
        "  _direct_ok": lambda: gemm._direct_ok(values, x, out, None),
        "  _remember": lambda: gemm._remember(lay),
        "  _dsd": lambda: gemm._dsd(values, lay, x, out, False, 1.0, 0.0, None),
        "    _kernel": lambda: gemm._kernel(values),
        "    g.dsd": lambda: g.dsd(values, lay, x, out),
        "      row_schedule": lambda: lay.row_schedule(),
        "      _sm_count": lambda: g._sm_count(dev),
        "      config_for": lambda: g.config_for(g.Op.DSD, values.dtype, out.dtype, 128, 128, 64, sched.shape[0],
                                                 132),
        "      launch_args": lambda: launch_args(a=values, b=x, out=out, bias=None, sched=sched,
                                                 blk_b=lay.col_idx[0], blk_a=None, m=8192, n=64, k=8192,
                                                 nnz=lay.nnz, alpha=1.0, beta=0.0, sm_count=132),
        "      Args(**fields)": lambda: kernel.Args(**fields),
        "      launch_on(struct)": lambda: kernel.launch_on(struct, 0),
    }
    for rnd in range(2):
        for name, fn in steps.items():
            print(f"round {rnd}  {name:42s} {per_call_us(fn):7.2f} us/call", flush=True)


if __name__ == "__main__":
    main()
