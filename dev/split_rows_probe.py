"""Where the split global-rows case loses against uniform rows (issue 29, dev): the same layout without its global
rows, uniform rows of the same mean length (shared and per head), and the split kernels' device time by kernel.
One process, interleaved rounds of do_bench medians of the eager call and of its CUDA-graph replay (the device
work alone); effective TFLOPS over each layout's own listed blocks.

    python dev/split_rows_probe.py [--rounds 3] [--d 128]
"""
import argparse
import statistics

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.split_kv import global_layout
from blackwell_sparsek.bench.timing import bench, capture, kernel_us
from blackwell_sparsek.families.attn_fwd import Schedule
from blackwell_sparsek.layout import BlockSparseLayout as L
from blackwell_sparsek.ops import default_config

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--d", type=int, default=128)
args = ap.parse_args()

b, h, s, d = 1, 16, 32768, args.d
dtype = torch.bfloat16 if d == 128 else torch.float16
lays = {"global2": global_layout(s, "cpu"),
        "global2 rows cut": global_layout(s, "cpu", mask="global2-cut"),
        "uniform8 per-head": L.random_topk(s, 8, seed=1, num_heads=h),
        "uniform10 per-head": L.random_topk(s, 10, seed=1, num_heads=h),
        "uniform10 shared": L.random_topk(s, 10, seed=1)}
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
fns, flops = {}, {}
for name, lay in lays.items():
    lay = lay.to("cuda")
    f = 4.0 * b * d * 128 * 128 * lay.nnz * (h // lay.num_heads)
    print(f"{name}: row_stats {lay.row_stats()} split_plan {lay.split_plan()} nnz {lay.nnz}")
    cfgs = {"default": default_config(d, dtype, lay)}
    for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
        c = default_config(d, dtype, lay, schedule=sched)
        if c != cfgs["default"]:
            cfgs[sched.value] = c
    for cn, c in cfgs.items():
        key = f"{name} | {cn} ({c.name_facts()})"
        fns[key] = (lambda lay=lay, c=c: bsk.sparse_attention(q, k, v, lay, config=c))
        flops[key] = f
print(torch.cuda.get_device_name())


gfns = {n: capture(fn).replay for n, fn in fns.items()}  # replays time the device work without the host path
times = {n: [] for n in fns}
gtimes = {n: [] for n in fns}
for _ in range(args.rounds):
    for n, fn in fns.items():
        times[n].append(bench(fn, warmup_ms=200, rep_ms=150).median_ms)
        gtimes[n].append(bench(gfns[n], warmup_ms=200, rep_ms=150).median_ms)
for n in fns:
    ms = statistics.median(times[n])
    gms = statistics.median(gtimes[n])
    rounds = ", ".join(f"{t:.3f}" for t in times[n])
    print(f"{n:60s} {flops[n] / ms / 1e9:5.0f} TFLOPS  {ms:.3f} ms  (rounds {rounds})"
          f"  graph replay {flops[n] / gms / 1e9:5.0f} TFLOPS {gms:.3f} ms")
for n in [x for x in fns if x.startswith("global2 |") or x.startswith("global2 rows cut | default")]:
    ks = kernel_us(fns[n])
    print(f"kernels of {n}: " + "; ".join(f"{key[:60]} x{cnt:g} {us:.1f} us" for key, cnt, us in ks[:4]))
