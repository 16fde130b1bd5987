"""Dev: launch one dense (2,16,8192,128) fp16 call per schedule (for ncu)."""
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
L = bsk.BlockSparseLayout
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.float16) for _ in range(3))
lay = L.dense(8192).to("cuda")
for sched in (Schedule.COOPERATIVE,):
    cfg = default_config(128, torch.float16, lay, schedule=sched)
    for _ in range(3):
        bsk.sparse_attention(q, k, v, lay, config=cfg)
torch.cuda.synchronize()
