"""Host cost of an eager training step (GPU): whether a sparse_attention fwd+bwd step synchronizes the host (torch's
sync debug mode over one step), and host / do_bench times of that step, of its forward with autograd recording and
of a trivial autograd step ((x * 2).sum(): the engine's own cost on this host).   python dev/autograd_host_probe.py"""
import warnings

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.timing import host_us
from triton.testing import do_bench

L = bsk.BlockSparseLayout
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(1, 8, 8192, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
lay = L.random_topk(8192, k=16, seed=0, num_heads=8).to("cuda")
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
step = lambda: torch.autograd.grad(bsk.sparse_attention(qg, kg, vg, lay), (qg, kg, vg), do)  # noqa: E731
x = torch.randn(1024, device="cuda", requires_grad=True)
trivial = lambda: torch.autograd.grad((x * 2).sum(), x)  # noqa: E731
fwd = lambda: bsk.sparse_attention(qg, kg, vg, lay)  # noqa: E731
for _ in range(3):
    step()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    step()
    torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode(0)
print(f"sync warnings in one step: {len(w)}")
for x_ in w[:5]:
    print("  ", str(x_.message)[:200], x_.filename, x_.lineno)
for name, fn in (("fwd+bwd step", step), ("fwd (grad-recording)", fwd), ("trivial autograd.grad", trivial)):
    issue, total = host_us(fn)
    print(f"{name:24s} host {issue:7.1f} us issuing, {total:7.1f} with sync; do_bench {do_bench(fn) * 1e3:7.1f} us")
from blackwell_sparsek.bench.backward import fwd_bwd_flex, fwd_bwd_ours  # noqa: E402

topk = L.random_topk(8192, k=16, seed=0, num_heads=8)
ours = fwd_bwd_ours(topk, 1, 8, 8192, 64, torch.float16)
flex = fwd_bwd_flex(topk, 1, 8, 8192, 64, torch.float16)
print(f"bench-bwd's fwd+bwd (do_bench ms): ours {ours:.3f}, flex {flex:.3f}, ours vs flex {flex / ours:.2f}x")
