"""Dev: run one sparse_attention call (for ncu / compute-sanitizer).  one_kernel.py D SCHED [STAGES] [dense|topk]"""
import dataclasses, sys
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
D, sched = int(sys.argv[1]), Schedule(sys.argv[2])
pat = sys.argv[4] if len(sys.argv) > 4 else "dense"
B, H, S = (1, 8, 8192) if D == 64 else (2, 16, 8192)
L = bsk.BlockSparseLayout
lay = (L.dense(S) if pat == "dense" else L.random_topk(S, k=16, seed=0, num_heads=H)).to("cuda")
cfg = default_config(D, torch.float16, lay, schedule=sched)
if len(sys.argv) > 3 and sys.argv[3] != "-":
    cfg = dataclasses.replace(cfg, stages=int(sys.argv[3]))
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
for _ in range(3):
    bsk.sparse_attention(q, k, v, lay, config=cfg)
torch.cuda.synchronize()
print(cfg.kernel_name)
