"""Which schedule is faster on which mask family, and how close the default comes: both two-warpgroup schedules
(cooperative, ping-pong) and the default choice timed in the same run on dense, causal, random top-k (shared and
per head), rows of random length (learned top-k with a threshold), a causal 2K window, document (block-diagonal),
BigBird-style (global + band + random) masks and BigBird without its global rows.

    python -m blackwell_sparsek.bench.schedules [--json PATH] [--d 64 128] [--s 8192] [--b 2] [--masks causal ...]
                                                [--rounds 2] [--quick]

Prints one row per (mask, head dim): effective TFLOPS of each schedule, the default's pick and its ratio to the
faster schedule. Every output is checked against the other schedule's (relative error) before timing.
"""
from __future__ import annotations

import argparse
import statistics
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


def _varlen(s: int, seed: int, heads: int, lo: int, hi: int) -> Any:
    """Rows of lo..hi random key blocks, the length drawn per head and row (learned top-k with a threshold)."""
    import torch
    nb = -(-s // BLOCK)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(heads, nb, nb, generator=gen)
    n = torch.randint(lo, hi + 1, (heads, nb, 1), generator=gen).clamp(max=nb)
    rank = scores.argsort(dim=2).argsort(dim=2)
    return L.from_block_mask(rank < n, seq_q=s, seq_k=s)


def _bigbird(s: int, seed: int, n_global: int = 2, band: int = 3, n_random: int = 3, global_rows: bool = True
             ) -> Any:
    """Global rows and columns, a band of 2*band+1 blocks and n_random random blocks per row (all FULL);
    without global_rows only the global columns."""
    import torch
    nb = -(-s // BLOCK)
    gen = torch.Generator().manual_seed(seed)
    r = torch.arange(nb)
    mask = (r.unsqueeze(1) - r.unsqueeze(0)).abs() <= band
    if global_rows:
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
        "bigbird-noglobal": _bigbird(s, 4, band=1, global_rows=False),
        "varlen25": _varlen(s, 5, h, k // 2, k + k // 2),
        "varlen-short": _varlen(s, 6, h, 4, 12),
    }


def run(shapes: list[tuple[int, int, int, int]], warmup_ms: float, rep_ms: float, rounds: int = 1,
        only: list[str] | None = None) -> list[dict[str, Any]]:
    import torch

    from .. import ops
    from ..families.attn_fwd import Schedule
    from ..reference import relative_error
    rows = []
    for b, h, s, d in shapes:
        gen = torch.Generator(device="cuda").manual_seed(b * 1000003 + h * 1009 + s + d)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
        for name, lay in masks(s, h).items():
            if only and name not in only:
                continue
            lay = lay.to("cuda")
            # nnz sums the layout's heads; a shared layout (1 head) serves all h query heads
            flops = 4.0 * b * d * BLOCK * BLOCK * lay.nnz * (h // lay.num_heads)
            fns = {sched.value: (lambda sched=sched: ops.sparse_attention(q, k, v, lay, config=sched))
                   for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG)}
            outs = {sched: fn() for sched, fn in fns.items()}
            runs: dict[str, list[float]] = {sched: [] for sched in fns}
            for i in range(rounds):  # interleaved, the order alternating: neither schedule always runs warmer
                for sched in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
                    runs[sched].append(bench(fns[sched], warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms)
            times = {sched: statistics.median(t) for sched, t in runs.items()}
            err = relative_error(outs["pingpong"], outs["cooperative"].float())
            pick = ops.default_config(d, torch.float16, lay).schedule.value
            fastest = min(times, key=times.get)
            row = {"mask": name, "b": b, "h": h, "s": s, "d": d, "nnz": lay.nnz, "layout_heads": lay.num_heads,
                   "row_stats": lay.row_stats(), "uniform_rows": lay.uniform_rows(),
                   **{f"tflops_{k_}": flops / (t * 1e-3) / 1e12 for k_, t in times.items()},
                   "default": pick, "fastest": fastest, "default_vs_fastest": times[fastest] / times[pick],
                   "rel_err_between_schedules": err}
            rows.append(row)
            print(f"  {name:<16} s={s:<6} d={d:<3} stats {row['row_stats']} coop {row['tflops_cooperative']:6.1f}  "
                  f"pp {row['tflops_pingpong']:6.1f}  default {pick:<11} {row['default_vs_fastest']:.3f} of faster  "
                  f"(err {err:.1e})",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], gpu: str) -> str:
    out = [f"GPU: {gpu}",
           "| mask | B | S | D | rows: mean, cv, short | cooperative | ping-pong | default | default / faster |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stats = ", ".join(f"{x:g}" for x in r["row_stats"])
        out.append(f"| {r['mask']} | {r['b']} | {r['s']} | {r['d']} | {stats} | {r['tflops_cooperative']:.0f} | "
                   f"{r['tflops_pingpong']:.0f} | "
                   f"{r['default']} | {r['default_vs_fastest']:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek.bench.schedules", description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims (default 64 128)")
    ap.add_argument("--s", type=int, nargs="+", default=[8192], help="sequence lengths (default 8192)")
    ap.add_argument("--b", type=int, default=2,
                    help="batch (default 2; 16 heads): short sequences need more for a GPU-bound call")
    ap.add_argument("--masks", nargs="+", choices=sorted(masks(256, 1)), help="only these mask families")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per case (median)")
    ap.add_argument("--json", help="write the rows as JSON to this path")
    ap.add_argument("--quick", action="store_true", help="shorter timings (a smoke run)")
    a = ap.parse_args(argv)
    if a.b < 1:
        ap.error("--b must be at least 1")
    import torch
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [(a.b, 16, s, d) for s in a.s for d in a.d]
    rows = run(shapes, warmup_ms=100 if a.quick else 300, rep_ms=50 if a.quick else 200, rounds=a.rounds,
               only=a.masks)
    return finish_rows(rows, table, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
