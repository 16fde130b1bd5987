"""Dev A/B: the acceptance shapes for whatever BSK_NVCC_FLAGS selects; sustained (do_bench) and burst protocols.
BSK_AB_GRAPH=1: do_bench of a CUDA graph of 10 calls instead (kernel time, no host path in it)."""
import dataclasses, os, sys
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.bench import metrics
from blackwell_sparsek.bench.timing import loop_bench
from _cases import CASES, effective_flops, graph_ms, inputs
tag = os.environ.get("BSK_AB_TAG") or os.environ.get("BSK_NVCC_FLAGS", "") or "default"
only = os.environ.get("BSK_AB_CASES")
for key in (key for key in CASES if not only or key in only.split(",")):
    name = key.split("-")[0]
    B, H, S, D, lay, q, k, v = inputs(key)
    flops = effective_flops(B, H, D, lay)
    if name.startswith("causal"):
        flops = metrics.dense_flops(B, H, S, S, D, causal=True)  # example 88's count (dense half)
    # BSK_AB_SCHEDS="cooperative,pingpong,single:6" (schedule[:stages]); configs that do not fit are skipped
    for spec in os.environ.get("BSK_AB_SCHEDS", "cooperative,pingpong").split(","):
        sname, _, st = spec.partition(":")
        sched = Schedule(sname)
        if sched is Schedule.SINGLE and D != 64:
            continue
        cfg = default_config(D, torch.float16, lay, schedule=sched)
        if st:
            cfg = dataclasses.replace(cfg, stages=int(st))
        if cfg.problems():
            continue
        fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa
        if os.environ.get("BSK_AB_GRAPH"):  # kernel time only: 10 calls replayed from a CUDA graph
            ms = graph_ms(fn, calls=10)
            print(f"{tag:10s} {name:7s} B{B} H{H} S{S} D{D} {sched.value[:6]}/s{cfg.stages} graph {flops/ms/1e9:6.1f} "
                  f"TFLOPS", flush=True)
            continue
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        bt = loop_bench(fn, n=20, reps=3, idle_s=1.0).median_ms
        print(f"{tag:10s} {name:7s} B{B} H{H} S{S} D{D} {sched.value[:6]}/s{cfg.stages} sustained {flops/ms/1e9:6.1f}  "
              f"burst {flops/bt/1e9:6.1f} TFLOPS", flush=True)
