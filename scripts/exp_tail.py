"""Dev: what the partial last wave of the persistent kernel costs. The same rows (16 blocks each, or dense) at a
sequence length whose query tiles fill the last wave exactly (S = 8448: 66 tiles a head, 2112 = 16 x 132 at
(2, 16), 528 = 4 x 132 at (1, 8)) against S = 8192 (2048 / 512 tiles: 15.5 / 3.9 waves), and the 8192 case on a
grid of 128 CTAs (every CTA the same number of rows). Sustained (do_bench) effective TFLOPS, alternating rounds.

    python scripts/exp_tail.py [rounds]
"""
import os, sys
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
from _cases import effective_flops, persistent_ctas

L = bsk.BlockSparseLayout
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
cases = []
for B, H, D in ((2, 16, 128), (1, 8, 64)):
    for pat in ("topk", "dense"):
        for S, ctas in ((8192, None), (8448, None), (8192, 128)):
            lay = (L.random_topk(S, k=16, seed=0, num_heads=H) if pat == "topk" else L.dense(S)).to("cuda")
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
            cases.append((f"{pat:5s} D{D} B{B} H{H} S{S} tiles {B * H * S // 128:5d} ctas {ctas or 'all'}",
                          ctas, effective_flops(B, H, D, lay), (q, k, v, lay)))
print(torch.cuda.get_device_name(), flush=True)
for r in range(rounds):
    for name, ctas, flops, (q, k, v, lay) in cases:
        with persistent_ctas(ctas):
            ms = do_bench(lambda: bsk.sparse_attention(q, k, v, lay), warmup=300, rep=300, return_mode="median")
        print(f"round {r} {name} {flops / ms / 1e9:6.1f} TFLOPS", flush=True)
