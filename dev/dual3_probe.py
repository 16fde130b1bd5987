"""Where three 64-row streams (the dual schedule, 64-key tiles) beat the 128-row schedules at head_dim 64 on
128x128-block layouts: the schedules bench's mask families (2x16x8192) and short top-k rows (1x16x32768, k = 2 /
4 / 8), fp16, do_bench medians, interleaved rounds, each output checked against ping-pong's first.

    python dev/dual3_probe.py [--rounds 2] [--configs]
"""
import argparse
import statistics
import sys

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.schedules import masks
from blackwell_sparsek.families.attn_fwd import Schedule
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.ops.dispatch import dual_variant

L = bsk.BlockSparseLayout
D = 64


def variants(lay):
    pp = default_config(D, torch.float16, lay, schedule=Schedule.PINGPONG)
    coop = default_config(D, torch.float16, lay, schedule=Schedule.COOPERATIVE)
    dual = default_config(D, torch.float16, lay, schedule=Schedule.DUAL)
    dual3 = dual_variant(dual, 3)
    return {"pingpong": pp, "cooperative": coop, "dual2": dual, "dual3": dual3}


def cases():
    out = [(f"{n} 2x16x8K", (2, 16, 8192), lay) for n, lay in masks(8192, 16).items()]
    out += [(f"topk k={k} 1x16x32K", (1, 16, 32768), L.random_topk(32768, k, seed=k, num_heads=16)) for k in (2, 4, 8)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", action="store_true")
    a = ap.parse_args()
    if a.configs:
        seen = set()
        for _, _, lay in cases():
            for c in variants(lay).values():
                if c.kernel_name not in seen:
                    seen.add(c.kernel_name)
                    print(c.to_json())
        return
    import triton.testing
    prepared = []
    for name, (b, h, s), lay in cases():
        lay = lay.to("cuda")
        g = torch.Generator(device="cuda").manual_seed(s + h)
        q, k, v = (torch.randn(b, h, s, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        flops = 4.0 * b * D * 128 * 128 * lay.nnz * (h // lay.num_heads)
        ref = None
        for vn, cfg in variants(lay).items():
            fn = (lambda cfg=cfg, q=q, k=k, v=v, lay=lay: bsk.sparse_attention(q, k, v, lay, config=cfg))
            o = fn().float()
            ref = o if ref is None else ref
            err = ((o - ref).norm() / ref.norm()).item()
            prepared.append(dict(case=name, variant=vn, fn=fn, flops=flops, err=err, t=[]))
    for _ in range(a.rounds):
        for p in prepared:
            ms = triton.testing.do_bench(p["fn"], warmup=200, rep=200, return_mode="median")
            p["t"].append(p["flops"] / ms / 1e9)
    print(f"GPU: {torch.cuda.get_device_name()}; D=64 fp16, 128x128 blocks, effective TFLOPS (median of rounds)")
    names = list(dict.fromkeys(p["variant"] for p in prepared))
    print("| case | " + " | ".join(names) + " | dual3 / best other | max err vs pp |")
    print("|---" * (len(names) + 3) + "|")
    for case in dict.fromkeys(p["case"] for p in prepared):
        ps = {p["variant"]: p for p in prepared if p["case"] == case}
        med = {n: statistics.median(ps[n]["t"]) for n in names}
        best = max(med[n] for n in names if n != "dual3")
        print(f"| {case} | " + " | ".join(f"{med[n]:.0f}" for n in names) +
              f" | {med['dual3'] / best:.3f} | {max(p['err'] for p in ps.values()):.1e} |")


if __name__ == "__main__":
    sys.exit(main())
