"""64-row layout blocks: the dual schedule (two or three MMA warpgroups, each on its own 64-row block) against the
single-warpgroup kernel and the default schedule of 128-row blocks, same run, interleaved rounds.

    python -m blackwell_sparsek.bench.blocks64 [--rounds 3] [--json PATH]   # on the GPU
    python -m blackwell_sparsek.bench.blocks64 --configs                      # the configs it runs, as JSON lines

Cases (issue 29): random key blocks per head at 25 % and 12.5 % of 2x16x8192, D=128 and 64, bf16, with 64x64,
64x128 and 128x64 blocks; at D=64 two streams against the default three. Effective TFLOPS = 4·D·bm·bn per listed
block (the same count as every other bench here), do_bench medians after warm-up; each kernel's output is checked
against SDPA with the layout's element mask on one head first.
"""
from __future__ import annotations

import argparse
import re
import json
import statistics
import sys

# (name, (B, H, S, D), (block_m, block_n), density, schedules to time). "dual" is the default dual config (three
# streams at D=64 with 64x64 blocks); "dualN[sM]": N streams (64-key tiles for 3) and M stages, as deep as the
# shared memory allows without sM.
CASES = [
    ("64x64 topk25% D128", (2, 16, 8192, 128), (64, 64), 0.25, ("dual", "single")),
    ("64x64 topk12.5% D128", (2, 16, 8192, 128), (64, 64), 0.125, ("dual", "single")),
    ("64x64 topk25% D64", (2, 16, 8192, 64), (64, 64), 0.25, ("dual", "dual2s8", "single")),
    ("64x64 topk12.5% D64", (2, 16, 8192, 64), (64, 64), 0.125, ("dual", "dual2s8")),
    ("64x128 topk25% D128", (2, 16, 8192, 128), (64, 128), 0.25, ("dual", "single")),
    ("64x128 topk25% D64", (2, 16, 8192, 64), (64, 128), 0.25, ("dual", "dual3")),
    ("128x64 topk25% D128", (2, 16, 8192, 128), (128, 64), 0.25, ("dual", None)),
]
DTYPE = "bf16"


def _layout(s, bm, bn, density, h, device="cuda"):
    from ..layout import BlockSparseLayout as L
    nk = s // bn
    return L.random_topk(s, max(1, round(density * nk)), seed=1, block_m=bm, block_n=bn, num_heads=h,
                         device=device)


def _configs(d, bm, bn, scheds, layout=None):
    import torch
    from ..ops import default_config
    from ..ops.dispatch import dual_variant
    from ..jit.spec import DType  # noqa: F401
    out = []
    for sc in scheds:
        if layout is None:
            from ..layout import BlockSparseLayout as L
            layout = L.dense(1024, block_m=bm, block_n=bn)
        m = re.fullmatch(r"dual(\d)(?:s(\d+))?", sc or "")
        if m:
            base = default_config(d, torch.bfloat16, layout, schedule="dual")
            out.append((sc, dual_variant(base, int(m[1]), int(m[2]) if m[2] else None)))
            continue
        out.append((sc or "default", default_config(d, torch.bfloat16, layout, schedule=sc)))
    return out


def print_configs() -> None:
    seen = set()
    for _, (_, _, _, d), (bm, bn), _, scheds in CASES:
        for _, cfg in _configs(d, bm, bn, scheds):
            if cfg.kernel_name not in seen:
                seen.add(cfg.kernel_name)
                print(cfg.to_json().replace("\n", ""))


def run(rounds: int, only: str | None = None, schedules: list[str] | None = None) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import triton.testing
    import blackwell_sparsek as bsk
    from . import metrics
    dt = torch.bfloat16
    prepared = []
    for name, (b, h, s, d), (bm, bn), dens, scheds in CASES:
        if only and only not in name:
            continue
        scheds = [sc for sc in scheds if not schedules or (sc or "default") in schedules]
        lay = _layout(s, bm, bn, dens, h)
        g = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
        flops = 4.0 * d * bm * bn * lay.nnz * b * (h // lay.num_heads)
        # correctness on (batch 0, head 0) against SDPA with the element mask
        # (random top-k: no rule, S a multiple of the blocks, so the block mask is the element mask)
        mask = lay.to_dense_mask()[0].repeat_interleave(bm, 0).repeat_interleave(bn, 1).to("cuda")
        ref = F.scaled_dot_product_attention(q[:1, :1].float(), k[:1, :1].float(), v[:1, :1].float(),
                                             attn_mask=mask)
        for sc, cfg in _configs(d, bm, bn, scheds, lay):
            fn = (lambda cfg=cfg, q=q, k=k, v=v, lay=lay: bsk.sparse_attention(q, k, v, lay, config=cfg))
            o = fn()
            torch.cuda.synchronize()
            err = metrics.rel_error(o[:1, :1], ref)["rel_err"]
            prepared.append(dict(case=name, schedule=sc, kernel=cfg.kernel_name, fn=fn, flops=flops,
                                 rel_err=err, tflops=[]))
    for r in range(rounds):
        for p in prepared:
            ms = triton.testing.do_bench(p["fn"], warmup=200, rep=200, return_mode="median")
            p["tflops"].append(p["flops"] / (ms * 1e-3) / 1e12)
    rows = []
    for p in prepared:
        rows.append({k: v for k, v in p.items() if k != "fn"} | {"median_tflops": statistics.median(p["tflops"])})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--configs", action="store_true")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    ap.add_argument("--schedules", default=None, help="comma-separated schedules to time (default: all)")
    a = ap.parse_args(argv)
    if a.configs:
        print_configs()
        return
    import torch
    rows = run(a.rounds, a.only, a.schedules.split(",") if a.schedules else None)
    gpu = torch.cuda.get_device_name()
    print(f"GPU: {gpu}")
    print("| case | schedule | kernel | rel err vs SDPA | effective TFLOPS (median of rounds) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['schedule']} | {r['kernel']} | {r['rel_err']:.1e} | {r['median_tflops']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": gpu, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
