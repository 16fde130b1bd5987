"""Dev: accuracy of whatever BSK_NVCC_FLAGS selects on the acceptance cases (float64 reference, poisoned output).

    BSK_NVCC_FLAGS=-D... python scripts/exp_check.py topk25-d64 dense-d64[:cooperative] ...
"""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.reference import attention_reference, relative_error
from _cases import CASES
for spec in sys.argv[1:]:
    name, _, sched = spec.partition(":")
    B, H, S, D, mk = CASES[name]
    H, S = min(H, 2), min(S, 4096)  # the float64 reference is dense: keep it small
    lay = mk(S, H).to("cuda")
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, H, lay.seq_k, D, device="cuda", dtype=torch.float16) for _ in range(2))
    cfg = default_config(D, torch.float16, lay, schedule=Schedule(sched) if sched else None)
    out = bsk.sparse_attention(q, k, v, lay, config=cfg)
    ref = attention_reference(q, k, v, lay)[0]
    err = relative_error(out, ref)
    print(f"check {os.environ.get('BSK_NVCC_FLAGS', '')!r:28s} {spec:20s} rel err {err:.2e} {'OK' if err < 1e-2 else 'FAIL'}",
          flush=True)
