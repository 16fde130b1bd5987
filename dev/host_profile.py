"""Host time of the Python paths around the kernels, on a GPU machine: per-call host microseconds (calls issued
back to back, no sync inside the loop) and the top functions of a cProfile of the same loop.

    python dev/host_profile.py [--top 25]

Cases: attention forward (eager, no grad), forward + backward through autograd (the bench-bwd D=64 case,
1x8x8192x64 fp16, 25 % top-k), the backward op alone, and bsr_matmul at N = 1024 (8192x8192, 25 %, fp16).
"""
import argparse
import cProfile
import io
import pstats

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.timing import host_us, kernel_us


def cases():
    L = bsk.BlockSparseLayout
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, 8192, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    lay = L.random_topk(8192, k=16, seed=0, num_heads=8).to("cuda")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = {"fwd eager": lambda: bsk.sparse_attention(q, k, v, lay),
           "fwd+bwd autograd": lambda: torch.autograd.grad(bsk.sparse_attention(qg, kg, vg, lay), (qg, kg, vg), do)}
    o = bsk.sparse_attention(qg, kg, vg, lay)
    out["bwd (autograd.grad, retain_graph)"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    layout = L.random_topk(8192, k=16, seed=1)  # 64 block rows, 16 of 64 blocks each
    w = bsk.BlockSparseMatrix.from_dense(torch.randn(8192, 8192, device="cuda", dtype=torch.float16, generator=g),
                                         block=128, mask=layout.to_dense_mask()[0].to("cuda"))
    x = torch.randn(8192, 1024, device="cuda", dtype=torch.float16, generator=g)
    out["bsr_matmul N=1024"] = lambda: bsk.bsr_matmul(w, x)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gpu-trace", action="store_true", help="also each case's kernels: device us per call")
    a = ap.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}")
    for name, fn in cases().items():
        issue, total = host_us(fn)
        print(f"== {name}: host {issue:.1f} us/call issuing, {total:.1f} us/call with the final sync")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(100):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
        print("\n".join(s.getvalue().splitlines()[6:]))
        if a.gpu_trace:
            gpu_trace(fn)


def gpu_trace(fn, n: int = 50) -> None:
    """Device time per call of each kernel (and memset/memcpy) of ``fn``, and their sum: a call whose host time
    exceeds the sum is host-bound; one whose device sum is far above the kernels it should run runs extra work."""
    rows = kernel_us(fn, n)
    for key, cnt, us in rows[:12]:
        print(f"   gpu {us:9.1f} us/call  x{cnt:.1f}  {key[:110]}")
    print(f"   gpu sum {sum(r[2] for r in rows):.1f} us/call")


if __name__ == "__main__":
    main()
