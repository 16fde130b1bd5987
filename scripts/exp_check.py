"""Dev: accuracy of whatever BSK_NVCC_FLAGS selects on the acceptance cases (float64 reference, poisoned output).

    BSK_NVCC_FLAGS=-D... python scripts/exp_check.py topk25-d64 dense-d64[:cooperative] ...
BSK_CHECK_CTAS=N launches persistent kernels on N CTAs (default: one per SM), so each walks many rows.
"""
import os, sys
import blackwell_sparsek as bsk
from blackwell_sparsek.reference import attention_reference, relative_error
from _cases import inputs, persistent_ctas, spec_config
ctas = int(os.environ.get("BSK_CHECK_CTAS") or 0) or None
for spec in sys.argv[1:]:
    # the float64 reference is dense: keep it small
    B, H, S, D, lay, q, k, v = inputs(spec.partition(":")[0], max_heads=2, max_seq=4096)
    cfg = spec_config(spec, D, lay)
    with persistent_ctas(ctas):
        out = bsk.sparse_attention(q, k, v, lay, config=cfg)
    ref = attention_reference(q, k, v, lay)[0]
    err = relative_error(out, ref)
    print(f"check {os.environ.get('BSK_NVCC_FLAGS', '')!r:28s} {spec:20s} rel err {err:.2e} {'OK' if err < 1e-2 else 'FAIL'}",
          flush=True)
