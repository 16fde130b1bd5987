"""GQA backward speed and memory, one tree per process (run it from two trees, alternating, for an A/B):
25 % random top-k per head at 8K, D=128, for several (B, H, Hkv), the op body on a finished forward (BwdCall).

    python dev/bwd_gqa_ab.py [--label NAME] [--det]

Prints, per case, effective TFLOPS (median of three do_bench medians) and the call's peak memory beyond its dQ/dK/dV
(torch.cuda.max_memory_allocated), next to one fp32 dQ accumulator of all query heads (issue 26's bound).
"""
import argparse
import statistics

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.backward import BwdCall, _time

ap = argparse.ArgumentParser()
ap.add_argument("--label", default="")
ap.add_argument("--det", action="store_true")
args = ap.parse_args()
S, D = 8192, 128
print(f"{args.label} {bsk.__file__} {torch.cuda.get_device_name()}")
for B, H, hkv in ((2, 16, 16), (2, 16, 4), (2, 16, 2), (1, 32, 4), (1, 16, 1)):
    lay = bsk.BlockSparseLayout.random_topk(S, 16, seed=1, num_heads=H)
    call = BwdCall(lay, B, H, S, D, torch.float16, det=args.det, hkv=hkv)
    ms = statistics.median(_time(call) for _ in range(3))
    mem = call.extra_memory()
    print(f"B{B} H{H} Hkv{hkv} S{S}{' det' if args.det else ''}: {call.flops / ms / 1e9:.0f} TFLOPS ({ms:.3f} ms), "
          f"extra memory {mem['extra'] >> 20} MiB (one fp32 dQ acc {mem['fp32_dq_accumulator'] >> 20} MiB)")
    del call
    torch.cuda.empty_cache()
