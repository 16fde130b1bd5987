"""Smoke check of the attention backward on a GPU: five small cases against the float64 reference, printed.
Run first by dev/gpu_check.sh under a timeout, so a hang or a launch error stops the session early. seq 700
leaves the last 128-row query block 60 rows: its second dQ tile lies past seq_q (the deterministic case once hung
there). Also run under compute-sanitizer (memcheck, racecheck, synccheck)."""
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention_bwd  # noqa: F401  (registers the autograd of attn_fwd)
from blackwell_sparsek.reference import attention_reference, relative_error

L = bsk.BlockSparseLayout
for D, dt, causal, det, blk in ((64, torch.float16, False, False, 128), (128, torch.bfloat16, True, False, 128),
                                (128, torch.bfloat16, False, True, 128), (128, torch.float16, False, False, 64),
                                (128, torch.float16, False, True, 64)):
    # blk 64: 64x64 blocks, whose backward runs pairs of key blocks with a warpgroup idle on unlisted halves
    lay = L.random_topk(seq_q=700, k=3 * 128 // blk, seed=1, num_heads=2, block_m=blk, block_n=blk).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(D)
    q, k, v, do = (torch.randn(1, 2, 700, D, device="cuda", generator=g).to(dt) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    bsk.sparse_attention(qg, kg, vg, lay, causal=causal, deterministic=det).backward(do)
    torch.cuda.synchronize()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    attention_reference(qd, kd, vd, lay, causal=causal)[0].backward(do.double())
    errs = [relative_error(a, b) for a, b in ((qg.grad, qd.grad), (kg.grad, kd.grad), (vg.grad, vd.grad))]
    print(f"smoke D={D} {dt} causal={causal} deterministic={det} blocks {blk}: rel err dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e}",
          flush=True)
