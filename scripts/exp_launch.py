"""Dev: host overhead. 25 % top-k at (1, H, 8192, D) for several H: do_bench of the op and of a CUDA graph replay of
it (no host overhead), and a straight-line fit time = a + b * H. The intercept a mixes in wave quantization (rows per
CTA), so it is not a launch cost; exp_trace.py's launch span measures that directly."""
import os, sys
import torch
from triton.testing import do_bench
import blackwell_sparsek as bsk
sys.path.insert(0, os.path.dirname(__file__))
from _cases import graph_ms
L = bsk.BlockSparseLayout
D = int(sys.argv[1]) if len(sys.argv) > 1 else 64
pts = []
for H in (4, 8, 16, 32):
    lay = L.random_topk(8192, k=16, seed=0, num_heads=H).to("cuda")
    q, k, v = (torch.randn(1, H, 8192, D, device="cuda", dtype=torch.float16) for _ in range(3))
    f = lambda: bsk.sparse_attention(q, k, v, lay)  # noqa
    ms = do_bench(f, warmup=50, rep=300, return_mode="median")
    msg = graph_ms(f)
    flops = 4 * D * lay.nnz * 128 * 128
    pts.append((H, msg))
    print(f"D{D} H{H:3d}: op {ms * 1e3:8.1f} us ({flops / ms / 1e9:5.1f} TFLOPS)  graph {msg * 1e3:8.1f} us "
          f"({flops / msg / 1e9:5.1f})", flush=True)
n = len(pts); mx = sum(h for h, _ in pts) / n; my = sum(t for _, t in pts) / n
b = sum((h - mx) * (t - my) for h, t in pts) / sum((h - mx) ** 2 for h, _ in pts)
print(f"D{D} fit (graph): fixed {1e3 * (my - b * mx):.1f} us + {1e3 * b:.2f} us per head")
