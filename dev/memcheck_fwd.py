"""Small forward cases to run under compute-sanitizer (memcheck, racecheck, synccheck): dual-schedule cases (64x64
blocks: two streams at D=128, three at D=64) and one split-KV case (global rows). Prints one line per case; the
sanitizer's report is the result. Arguments: only the cases whose name contains one of them.

    compute-sanitizer --tool memcheck --print-limit 0 python dev/memcheck_fwd.py [dual ...]
"""
import sys

import torch

sys.path.insert(0, "tests")
import blackwell_sparsek as bsk  # noqa: E402
from blackwell_sparsek.ops import default_config  # noqa: E402
from test_split_kv import global_rows  # noqa: E402

L = bsk.BlockSparseLayout
torch.manual_seed(0)
cases = {
    "dual 64x64 topk25% (1,2,1024,128) bf16": (L.random_topk(1000, 4, seed=1, block_m=64, block_n=64, num_heads=2),
                                                128, torch.bfloat16),
    "dual3 64x64 topk25% (1,2,1024,64) bf16": (L.random_topk(1000, 4, seed=2, block_m=64, block_n=64, num_heads=2),
                                                64, torch.bfloat16),
    "split global rows (1,2,5120,128) bf16": (global_rows(5120, band=0, n_random=1, seed=3), 128, torch.bfloat16),
}
for name, (lay, d, dt) in cases.items():
    if sys.argv[1:] and not any(a in name for a in sys.argv[1:]):
        continue
    lay = lay.to("cuda")
    q, k, v = (torch.randn(1, 2, lay.seq_q, d, device="cuda", dtype=dt) for _ in range(3))
    o = bsk.sparse_attention(q, k, v, lay)
    torch.cuda.synchronize()
    print(f"{name}: {default_config(d, dt, lay).kernel_name} finite={bool(torch.isfinite(o).all())}", flush=True)
