"""Split-KV piece length (issue 29, rows of mixed length): the global-rows cases of bench.split_kv under other
piece rules, one process, interleaved rounds (dev). Only the split plan changes (layout.split's piece = max(MIN_PIECE,
factor * mean row length) blocks); the kernels are the default configs.

    python dev/split_piece_ab.py [--rounds 3] [--schedule cooperative|pingpong] [--rules NAME ...]
"""
import argparse
import statistics

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.split_kv import global_layout
from blackwell_sparsek.bench.timing import bench
from blackwell_sparsek.layout import schedule, split
from blackwell_sparsek.ops import default_config

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--schedule", choices=["cooperative", "pingpong"], help="force this schedule (default: the default)")
ap.add_argument("--rules", nargs="+", help="only these piece rules (names below)")
ap.add_argument("--cases", nargs="+", help="only these cases ('global2 D128', 'global2 D64', 'bigbird D128')")
args = ap.parse_args()
shipped = split.facts


def rule(min_piece, factor):
    def facts(counts, mean):
        piece = torch.clamp(torch.ceil(factor * mean), min=float(min_piece))
        long_rows = (counts > piece).sum(dim=1).amax().double()
        return [counts.amax(), piece, long_rows]
    return facts


RULES = {"shipped (16, 2x mean)": shipped, "8, 1x": rule(8, 1.0), "8, 2x": rule(8, 2.0), "16, 1x": rule(16, 1.0),
         "32, 4x": rule(32, 4.0), "64, 8x": rule(64, 8.0), "8, 1.5x": rule(8, 1.5), "4, 0.75x": rule(4, 0.75)}
if args.rules:
    RULES = {"shipped (16, 2x mean)": shipped, **{n: RULES[n] for n in args.rules}}
print(torch.cuda.get_device_name(), "schedule:", args.schedule or "default")
for mask, (b, h, s, d), dtype in (("global2", (1, 16, 32768, 128), torch.bfloat16),
                                  ("global2", (1, 16, 32768, 64), torch.float16),
                                  ("bigbird", (2, 16, 8192, 128), torch.bfloat16)):
    if args.cases and f"{mask} D{d}" not in args.cases:
        continue
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    fns, plans = {}, {}
    for name, fn in RULES.items():
        schedule.split_facts = fn
        lay = global_layout(s, mask=mask)
        lay.row_stats()  # the plan is cached with the row statistics, under this rule
        plans[name] = lay.split_plan()
        cfg = None if args.schedule is None else default_config(d, dtype, lay, schedule=args.schedule)
        fns[name] = (lambda lay=lay, cfg=cfg: bsk.sparse_attention(q, k, v, lay, config=cfg))
        flops = 4.0 * b * d * 128 * 128 * lay.nnz * (h // lay.num_heads)
    schedule.split_facts = shipped
    ref = fns["shipped (16, 2x mean)"]().float()
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            times[name].append(bench(fn, warmup_ms=100, rep_ms=100).median_ms)
    for name, fn in fns.items():
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        ms = statistics.median(times[name])
        print(f"{mask} B{b} H{h} S{s // 1024}K D{d}: {name:22s} plan {plans[name]}  {flops / ms / 1e9:5.0f} TFLOPS "
              f"({ms:.3f} ms, err vs shipped {err:.1e})")
