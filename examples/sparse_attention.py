#!/usr/bin/env python
"""Call ``sparse_attention`` on a few layouts and check every output (and LSE) against the float64 reference.

    python examples/sparse_attention.py            # fp16 and bf16, head dims 64 and 128
    python examples/sparse_attention.py --quick    # one dtype, one head dim

Prints one line per case (layout, density, relative error of O, max |error| of O and of the LSE) and exits 1
if any case is outside tolerance or produced NaN. Skips (exit 0) without a CUDA GPU.
"""
from __future__ import annotations

import argparse
import sys

from _gpu import torch_or_skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # 'cpu' only tests this script
    a = ap.parse_args()
    torch = torch_or_skip(a.device, "sparse_attention's kernels need an H100/H200 (sm_90)")
    if torch is None:
        return 0

    import blackwell_sparsek as bsk
    from blackwell_sparsek import BlockSparseLayout as L
    from blackwell_sparsek.reference import attention_reference

    dev = a.device
    B, H, S = 2, 4, 1024
    layouts = [
        ("dense", lambda s, h: L.dense(s, device=dev), False),
        ("causal (layout)", lambda s, h: L.causal(s, device=dev), False),
        ("dense + causal=True", lambda s, h: L.dense(s, device=dev), True),
        ("sliding window 300", lambda s, h: L.sliding_window(s, 300, device=dev), False),
        ("random top-k 3/row, per head", lambda s, h: L.random_topk(s, 3, seed=1, num_heads=h, device=dev), False),
        ("global 1 + window 256", lambda s, h: L.global_local(s, 1, 256, device=dev), False),
    ]
    dtypes = [torch.float16] if a.quick else [torch.float16, torch.bfloat16]
    dims = [128] if a.quick else [64, 128]
    tol = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
    gen = torch.Generator(device=dev).manual_seed(0)
    failures = 0
    gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "none (cpu: reference fallback)"
    print(f"GPU: {gpu}; B={B} H={H} S={S} (and S=1000: a partial last block)")
    print(f"{'layout':32s} {'dtype':9s} {'D':>4s} {'S':>5s} {'density':>8s} {'rel err O':>10s} "
          f"{'max|dO|':>9s} {'max|dLSE|':>10s}  result")
    for dt in dtypes:
        for d in dims:
            for s in (S, 1000):
                for name, make, causal in layouts:
                    if s != S and name not in ("dense", "causal (layout)", "sliding window 300"):
                        continue
                    try:
                        lay = make(s, H)
                    except Exception as e:  # noqa: BLE001
                        print(f"{name:32s} layout construction failed: {type(e).__name__}: {e}")
                        failures += 1
                        continue
                    q, k, v = (torch.randn(B, H, s, d, device=dev, dtype=dt, generator=gen) for _ in range(3))
                    try:
                        o, lse = bsk.sparse_attention(q, k, v, lay, causal=causal, return_lse=True)
                        if dev == "cuda":
                            torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        print(f"{name:32s} {str(dt)[6:]:9s} {d:4d} {s:5d}  ERROR {type(e).__name__}: {e}")
                        failures += 1
                        continue
                    ro, rlse = attention_reference(q, k, v, lay, causal=causal)
                    err = (o.double() - ro).norm().item() / max(ro.norm().item(), 1e-30)
                    mx = (o.double() - ro).abs().max().item()
                    fin = torch.isfinite(rlse)
                    lse_err = (lse[fin].double() - rlse[fin].double()).abs().max().item() if fin.any() else 0.0
                    lse_ok = bool(torch.equal(torch.isinf(lse), ~fin))  # empty rows: -inf in both
                    ok = (torch.isfinite(o).all().item() and err <= tol[dt] and lse_err <= 1e-2 and lse_ok)
                    failures += not ok
                    dens = lay.with_causal().density if causal else lay.density
                    print(f"{name:32s} {str(dt)[6:]:9s} {d:4d} {s:5d} {dens:8.1%} {err:10.2e} {mx:9.2e} "
                          f"{lse_err:10.2e}  {'ok' if ok else 'FAIL'}")
    print("all cases within tolerance" if not failures else f"{failures} case(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
