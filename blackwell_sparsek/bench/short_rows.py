"""Short rows at 128x128 blocks (issue 29): random top-k with k key blocks per query block against CUTLASS example
88 on dense attention with K = k·128 keys (the same work per row), same run, same protocol.

    python -m blackwell_sparsek.bench.short_rows [--k 2 4 8] [--d 128 64] [--json PATH]   # on the GPU
    python -m blackwell_sparsek.bench.short_rows --configs                                   # configs, JSON lines

Case: (1, 16, 32768, D) fp16, per-head random top-k. Both sides count 4·B·H·Sq·(k·128)·D flops, so ratios are
time ratios. Ours is timed three ways: like example 88 (1 s idle, one warm-up call, 20 back-to-back launches
between two events, median of 3) with the 20 calls replayed from a CUDA graph (the ratio uses this: example 88's
C++ loop has no host time between launches, while a Python call's, 80-140 us on the GPU hosts, is as long as
these 0.1 ms kernels), the same with eager calls, and with do_bench (sustained, L2 flushed). Example 88's best kernel
comes from its own timer (`ex88.measure`). Each of our kernels is checked against SDPA with the element mask on
one head first.
"""
from __future__ import annotations

import argparse
import sys

from .report import finish_rows

B, H, S = 1, 16, 32768


def _configs(d: int, k: int):
    import torch
    from ..families.attn_fwd import Schedule
    from ..layout import BlockSparseLayout as L
    from ..ops import default_config
    from ..ops.dispatch import dual_variant
    lay = L.random_topk(S, k, seed=k, num_heads=H)
    default = default_config(d, torch.float16, lay)
    out = {"default": default}
    for s in Schedule:  # the other schedules, 64-row tiles (single, dual) included
        cfg = default_config(d, torch.float16, lay, schedule=s)
        if cfg != default:
            out[s.value] = cfg
    if d == 64:  # the dual schedule's three streams of 64-key tiles
        cfg = dual_variant(default_config(d, torch.float16, lay, schedule=Schedule.DUAL), 3)
        if cfg != default:
            out["dual3"] = cfg
    return lay, out


def run(ks, ds, repeats: int = 3) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from .. import ops
    from . import ex88, metrics
    from .timing import bench, loop_bench
    binary = ex88.locate(build_if_missing=True)
    rows = []
    for d in ds:
        for k in ks:
            lay, cfgs = _configs(d, k)
            lay = lay.to("cuda")
            gen = torch.Generator(device="cuda").manual_seed(k * 1000 + d)
            q, kk, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
            flops = 4.0 * B * H * S * (k * 128) * d
            row = {"d": d, "k": k, "shape": [B, H, S, d], "flops": flops, "ours": {}}
            # the first 1024 query rows of head 0 against SDPA with their element mask (top-k: the block mask)
            mask = lay.to_dense_mask()[0, :8].repeat_interleave(128, 0).repeat_interleave(128, 1).to("cuda")
            ref = F.scaled_dot_product_attention(q[:, :1, :1024].float(), kk[:, :1].float(), v[:, :1].float(),
                                                 attn_mask=mask)
            for name, cfg in cfgs.items():
                fn = (lambda c=cfg: ops.sparse_attention(q, kk, v, lay, config=c))
                err = metrics.rel_error(fn()[:, :1, :1024], ref)["rel_err"]
                loop = loop_bench(fn, n=20, reps=repeats, idle_s=1.0).median_ms
                graph = loop_bench(fn, n=20, reps=repeats, idle_s=1.0, graph=True).median_ms
                sus = bench(fn).median_ms
                row["ours"][name] = {"kernel": cfg.kernel_name, "rel_err": err, "ms_loop": loop, "ms_graph": graph,
                                     "ms": sus, "tflops_loop": flops / loop / 1e9,
                                     "tflops_graph": flops / graph / 1e9, "tflops": flops / sus / 1e9}
            m = ex88.measure(binary, b=B, h=H, q=S, k=k * 128, d=d, repeats=repeats)
            best = m.get("best") or {}
            row["ex88"] = {"best_kernel": best.get("kernel"), "tflops": best.get("tflops"),
                           "kernels": [(r.get("kernel"), r.get("tflops")) for r in m.get("kernels", [])]}
            t88 = best.get("tflops")
            row["ratio"] = row["ours"]["default"]["tflops_graph"] / t88 if t88 else None
            row["ratio_eager"] = row["ours"]["default"]["tflops_loop"] / t88 if t88 else None
            rows.append(row)
            print(f"  D{d} k={k}: ours {row['ours']['default']['tflops_graph']:.0f} (graph) / "
                  f"{row['ours']['default']['tflops_loop']:.0f} (eager burst) / "
                  f"{row['ours']['default']['tflops']:.0f} (do_bench), ex88 {t88}", file=sys.stderr, flush=True)
            del q, kk, v
    return rows


def table(rows, gpu: str) -> str:
    out = [f"GPU: {gpu}; (1,16,32768,D) fp16, random top-k k blocks per row vs example 88 dense with K = k*128",
           "| D | k | ours default graph / eager burst / do_bench | other schedules graph | ex88 best (its timer) "
           "| ours/ex88 graph (eager) | err |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["ours"]
        e = r["ex88"]
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f} ({r['ratio_eager']:.3f})"
        other = " ".join(f"{n} {x['tflops_graph']:.0f}" for n, x in o.items() if n != "default")
        dflt = o["default"]
        out.append(f"| {r['d']} | {r['k']} | {dflt['tflops_graph']:.0f} / {dflt['tflops_loop']:.0f} / "
                   f"{dflt['tflops']:.0f} | "
                   f"{other} | {e['tflops'] or 0:.0f} ({e['best_kernel']}) | {ratio} | "
                   f"{max(x['rel_err'] for x in o.values()):.1e} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek.bench.short_rows",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--d", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--configs", action="store_true", help="print the configs as JSON lines and exit")
    a = ap.parse_args(argv)
    if a.configs:
        for d in a.d:
            for k in a.k:
                for c in _configs(d, k)[1].values():
                    print(c.to_json())
        return 0
    import torch
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(a.k, a.d, a.repeats)
    return finish_rows(rows, table, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
