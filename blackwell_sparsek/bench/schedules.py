"""Which schedule is faster on which mask family, and how close the default comes: both two-warpgroup schedules
(cooperative, ping-pong) and the default choice timed in the same run on dense, causal, random top-k (shared and
per head), a causal 2K window, document (block-diagonal) and BigBird-style (global + band + random) masks.

    python -m blackwell_sparsek.bench.schedules [--json PATH] [--d 64 128] [--quick]

Prints one row per (mask, head dim): effective TFLOPS of each schedule, the default's pick and its ratio to the
faster schedule. Every output is checked against the other schedule's (relative error) before timing.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ..layout import BlockSparseLayout as L
from .report import finish_rows
from .timing import bench

BLOCK = 128


def _documents(s: int, seed: int, heads: int) -> Any:
    """Block-diagonal (document) mask, non-causal: documents of 1-16 blocks, drawn per layout."""
    import torch
    nb = -(-s // BLOCK)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(heads, nb, nb, dtype=torch.bool)
    for h in range(heads):
        at = 0
        while at < nb:
            n = min(int(torch.randint(1, 17, (1,), generator=gen)), nb - at)
            mask[h, at:at + n, at:at + n] = True
            at += n
    return L.from_block_mask(mask, seq_q=s, seq_k=s)


def _bigbird(s: int, seed: int, n_global: int = 2, band: int = 3, n_random: int = 3) -> Any:
    """Global rows and columns, a band of 2*band+1 blocks and n_random random blocks per row (all FULL)."""
    import torch
    nb = -(-s // BLOCK)
    gen = torch.Generator().manual_seed(seed)
    r = torch.arange(nb)
    mask = (r.unsqueeze(1) - r.unsqueeze(0)).abs() <= band
    mask[:n_global, :] = True
    mask[:, :n_global] = True
    cols = torch.randint(0, nb, (nb, n_random), generator=gen)
    mask[r.unsqueeze(1), cols] = True
    return L.from_block_mask(mask, seq_q=s, seq_k=s)


def masks(s: int, h: int) -> dict[str, Any]:
    k = max(1, (s // BLOCK) // 4)
    return {
        "dense": L.dense(s),
        "causal": L.causal(s),
        "topk25-shared": L.random_topk(s, k, seed=1),
        "topk25-per-head": L.random_topk(s, k, seed=2, num_heads=h),
        "window2K": L.sliding_window(s, 2048),
        "documents": _documents(s, 3, 1),
        "bigbird": _bigbird(s, 4),
    }


def run(shapes: list[tuple[int, int, int, int]], warmup_ms: float, rep_ms: float) -> list[dict[str, Any]]:
    import torch

    from .. import ops
    from ..families.attn_fwd import Schedule
    from ..reference import relative_error
    rows = []
    for b, h, s, d in shapes:
        gen = torch.Generator(device="cuda").manual_seed(b * 1000003 + h * 1009 + s + d)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
        for name, lay in masks(s, h).items():
            lay = lay.to("cuda")
            # nnz sums the layout's heads; a shared layout (1 head) serves all h query heads
            flops = 4.0 * b * d * BLOCK * BLOCK * lay.nnz * (h // lay.num_heads)
            times, outs = {}, {}
            for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
                fn = lambda sched=sched: ops.sparse_attention(q, k, v, lay, config=sched)  # noqa: E731
                outs[sched.value] = fn()
                times[sched.value] = bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms
            err = relative_error(outs["pingpong"], outs["cooperative"].float())
            pick = ops.default_config(d, torch.float16, lay).schedule.value
            fastest = min(times, key=times.get)
            row = {"mask": name, "b": b, "h": h, "s": s, "d": d, "nnz": lay.nnz, "layout_heads": lay.num_heads,
                   "row_stats": lay.row_stats(), "uniform_rows": lay.uniform_rows(),
                   **{f"tflops_{k_}": flops / (t * 1e-3) / 1e12 for k_, t in times.items()},
                   "default": pick, "fastest": fastest, "default_vs_fastest": times[fastest] / times[pick],
                   "rel_err_between_schedules": err}
            rows.append(row)
            print(f"  {name:<16} d={d:<3} coop {row['tflops_cooperative']:6.1f}  pp {row['tflops_pingpong']:6.1f}  "
                  f"default {pick:<11} {row['default_vs_fastest']:.3f} of the faster  (err {err:.1e})",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], gpu: str) -> str:
    out = [f"GPU: {gpu}", "| mask | D | cooperative | ping-pong | default | default / faster |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['mask']} | {r['d']} | {r['tflops_cooperative']:.0f} | {r['tflops_pingpong']:.0f} | "
                   f"{r['default']} | {r['default_vs_fastest']:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek.bench.schedules", description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims (default 64 128)")
    ap.add_argument("--json", help="write the rows as JSON to this path")
    ap.add_argument("--quick", action="store_true", help="shorter timings (a smoke run)")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [(2, 16, 8192, d) for d in a.d]
    rows = run(shapes, warmup_ms=100 if a.quick else 300, rep_ms=50 if a.quick else 200)
    return finish_rows(rows, table, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
