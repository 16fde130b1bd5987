"""Deterministic backward: the cost of its dQ turns under variants of det_ranks, one process (dev).

    python dev/bwd_det_ab.py [--rounds 2] [--block 64]

Variants change only the turns (attention_bwd_view.det_ranks: wave size, arrival estimate) and the tile-order head group
(attention_bwd.HEAD_GROUP), never the kernel; 'unsafe' variants give up the deadlock argument and are measured, not
shipped. 25 % random top-k per head (--block 64: 64x64 blocks, the pair kernels, MHA only), 8K, D=128, fp16, the op
body on a finished forward (BwdCall); effective TFLOPS (median of do_bench medians) and the cost over the fast
kernel in the same round.
"""
import argparse
import statistics

import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention_bwd as ab
import blackwell_sparsek.ops.attention_bwd_view as abv
from blackwell_sparsek.bench.backward import BwdCall, _time

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--block", type=int, default=128, choices=[64, 128])
args = ap.parse_args()
shipped = abv.det_ranks


def variant(wave_div=2):
    """det_ranks with waves of sms // wave_div CTAs."""
    def ranks(t_q, tcol, tptr, korder, tiles_m, tiles_n, sms, interleave=1):
        return shipped(t_q, tcol, tptr, korder, tiles_m, tiles_n, sms, interleave, wave_ctas=max(1, sms // wave_div))
    return ranks


VARIANTS = {
    "shipped (waves sms/2, group auto)": (variant(), 0),
    "group 1": (variant(), 1),
    "group 2": (variant(), 2),
    "group 8": (variant(), 8),
    "waves sms (unsafe)": (variant(wave_div=1), 0),
    "waves sms/4": (variant(wave_div=4), 0),
}
S, D = 8192, 128
print(torch.cuda.get_device_name())
bk = args.block
for B, H, hkv in ((2, 16, 16), (2, 16, 4))[:1 if bk == 64 else 2]:
    lay = bsk.BlockSparseLayout.random_topk(S, S // bk // 4, seed=1, num_heads=H, block_m=bk, block_n=bk)
    fast = BwdCall(lay, B, H, S, D, torch.float16, hkv=hkv)
    res = {}
    for r in range(args.rounds):
        t_fast = _time(fast)
        res.setdefault("fast", []).append(t_fast)
        for name, (fn, group) in VARIANTS.items():
            abv.det_ranks, ab.HEAD_GROUP = fn, group
            abv._TCACHE.clear()
            call = BwdCall(lay, B, H, S, D, torch.float16, det=True, hkv=hkv)
            res.setdefault(name, []).append(_time(call))
            del call
        abv.det_ranks, ab.HEAD_GROUP = shipped, 0
        abv._TCACHE.clear()
    t0 = statistics.median(res["fast"])
    for name, ts in res.items():
        t = statistics.median(ts)
        print(f"B{B} H{H} Hkv{hkv} b{bk} {name:36s} {fast.flops / t / 1e9:5.0f} TFLOPS  "
              f"+{(t / t0 - 1) * 100:5.1f} %  "
              f"({', '.join(f'{x:.3f}' for x in ts)} ms)")
