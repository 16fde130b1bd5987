"""Dev A/B: the acceptance shapes for whatever BSK_NVCC_FLAGS selects; sustained (do_bench) and burst protocols."""
import os, sys
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.bench.timing import loop_bench
L = bsk.BlockSparseLayout
tag = os.environ.get("BSK_NVCC_FLAGS", "") or "default"
cases = [
    ("dense", 2, 16, 8192, 128, lambda S, H: L.dense(S)),
    ("topk25", 2, 16, 8192, 128, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    ("causal", 2, 16, 8192, 128, lambda S, H: L.causal(S)),
    ("dense", 1, 8, 8192, 64, lambda S, H: L.dense(S)),
    ("topk25", 1, 8, 8192, 64, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    ("win2K", 1, 16, 32768, 128, lambda S, H: L.sliding_window(S, window=2048)),
]
for name, B, H, S, D, mk in cases:
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    lay = mk(S, H).to("cuda")
    blocks = lay.nnz * (H // lay.num_heads)
    flops = 4 * B * D * blocks * 128 * 128
    if name == "causal":
        flops = 2 * B * H * S * S * D  # example 88's count (dense half)
    for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
        cfg = default_config(D, torch.float16, lay, schedule=sched)
        fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        bt = loop_bench(fn, n=20, reps=3, idle_s=1.0).median_ms
        print(f"{tag:22s} {name:7s} B{B} H{H} S{S} D{D} {sched.value:11s} sustained {flops/ms/1e9:6.1f}  "
              f"burst {flops/bt/1e9:6.1f} TFLOPS", flush=True)
