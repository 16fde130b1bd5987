"""Rows of mixed length (issue 29): a few global rows among short ones, split-KV against the unsplit kernels,
same run, interleaved rounds; uniform short rows (random top-k, 8 blocks a row) as the yardstick.

    python -m blackwell_sparsek.bench.split_kv [--rounds 3] [--json PATH]   # on the GPU
    python -m blackwell_sparsek.bench.split_kv --configs                      # the configs it runs, as JSON lines

Cases: (1, 16, 32768, D) with 2 global rows and columns, a 3-block band and 3 random blocks per row (all FULL,
128x128 blocks: the global rows list all 256 blocks, the others ~8), and the schedule sweep's BigBird mask at
(2, 16, 8192, D) (a 7-block band: rows of ~13 blocks, the global rows 64). Effective TFLOPS = 4·D·128·128 per listed
block, do_bench medians after warm-up. Every output is checked against the unsplit kernel's first, and the split
output for bitwise equality across two calls; the device time of the split configs' combine kernel (launched by
the same launcher call) is read from the torch profiler.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from .report import finish_rows

SHAPES = [("global2", (1, 16, 32768, 128), "bf16"), ("global2", (1, 16, 32768, 64), "fp16"),
          ("bigbird", (2, 16, 8192, 128), "bf16"), ("bigbird", (2, 16, 8192, 64), "fp16")]


def global_layout(s: int, device: str = "cuda", mask: str = "global2"):
    """The bench's masks: 'global2' (2 global rows and columns, a 3-block band, 3 random blocks a row),
    'global2-cut' (the same without its global rows: the schedule sweep's 'bigbird-noglobal'), 'bigbird' (the
    schedule sweep's BigBird)."""
    from .schedules import _bigbird
    if mask == "bigbird":  # the schedule sweep's mask (bench.schedules.masks)
        return _bigbird(s, 4).to(device)
    return _bigbird(s, 4, n_global=2, band=1, n_random=3, global_rows=mask != "global2-cut").to(device)


def _configs(d, dtype, lay):
    from ..families.attn_fwd import Schedule
    from ..ops import default_config
    out = {"default": default_config(d, dtype, lay)}
    for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
        sp = default_config(d, dtype, lay, schedule=sched)
        out[f"split-{sched.value}"] = sp
        out[f"plain-{sched.value}"] = dataclasses.replace(sp, split_kv=False)
    return out


def combine_kernel_ms(fn, calls: int = 20) -> float | None:
    """Mean device time (ms) of the combine kernel in one call of fn, from the torch profiler (None: no such
    kernel ran, or the profiler saw no CUDA kernels)."""
    from .timing import kernel_us
    us = [t for key, cnt, t in kernel_us(fn, calls) if "split_combine" in key and cnt]
    return us[0] / 1e3 if len(us) == 1 else None


def run(rounds: int, warmup_ms: float, rep_ms: float) -> list[dict]:
    import torch
    from .. import ops
    from ..layout import BlockSparseLayout as L
    from ..reference import relative_error
    from .timing import bench
    rows = []
    for mask, (b, h, s, d), dt in SHAPES:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        gen = torch.Generator(device="cuda").manual_seed(s + d)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
        lay = global_layout(s, mask=mask)
        uni = L.random_topk(s, 8, seed=1, num_heads=h, device="cuda")
        cfgs = _configs(d, dtype, lay)
        fns = {name: (lambda c=c: ops.sparse_attention(q, k, v, lay, config=c)) for name, c in cfgs.items()}
        fns["uniform8 (default)"] = lambda: ops.sparse_attention(q, k, v, uni)
        flops = {name: 4.0 * b * d * 128 * 128 * lay.nnz * (h // lay.num_heads) for name in cfgs}
        flops["uniform8 (default)"] = 4.0 * b * d * 128 * 128 * uni.nnz * (h // uni.num_heads)
        ref = fns["plain-cooperative"]()
        errs = {name: relative_error(fn(), ref.float()) for name, fn in fns.items() if name in cfgs}
        a, b_ = fns["default"](), fns["default"]()
        deterministic = bool(torch.equal(a, b_))
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms)
        comb = {name: combine_kernel_ms(fns[name]) for name in cfgs if cfgs[name].split_kv}
        for name in fns:
            ms = statistics.median(times[name])
            row = {"case": f"{mask} B{b} H{h} S{s // 1024}K D{d} {dt}", "kernel": name,
                   "config": cfgs[name].kernel_name if name in cfgs else "default", "ms": ms,
                   "tflops": flops[name] / (ms * 1e-3) / 1e12, "rel_err_vs_plain_coop": errs.get(name),
                   "split_plan": list(lay.split_plan()), "row_stats": list(lay.row_stats()),
                   "deterministic_default": deterministic, "combine_kernel_ms": comb.get(name)}
            rows.append(row)
            print(f"  {row['case']:<32} {name:<22} {row['tflops']:6.1f} TFLOPS  {ms:.3f} ms", file=sys.stderr,
                  flush=True)
    return rows


def table(rows, gpu: str) -> str:
    out = [f"GPU: {gpu}", "| case | kernel | ms | eff. TFLOPS | err vs unsplit | combine kernel ms |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        err = "" if r["rel_err_vs_plain_coop"] is None else f"{r['rel_err_vs_plain_coop']:.1e}"
        comb = "" if r["combine_kernel_ms"] is None else f"{r['combine_kernel_ms']:.4f}"
        out.append(f"| {r['case']} | {r['kernel']} | {r['ms']:.3f} | {r['tflops']:.0f} | {err} | {comb} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek.bench.split_kv", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--configs", action="store_true", help="print the configs as JSON lines and exit")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    import torch
    if a.configs:
        for mask, (b, h, s, d), dt in SHAPES:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
            for c in _configs(d, dtype, global_layout(s, "cpu", mask)).values():
                print(c.to_json())
        return 0
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(a.rounds, 100 if a.quick else 300, 50 if a.quick else 200)
    return finish_rows(rows, table, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
