"""Same-run A/B of the forward kernels of two source trees (e.g. main before and after a change), in alternating
processes (two builds of one kernel name cannot share a process), do_bench medians, effective TFLOPS.

    python dev/ab_forward.py OLD_TREE NEW_TREE [--rounds 3]      # each tree with its own BSK_CACHE_DIR=<tree>/.bskcache

A child (``--child``) imports the package of the tree it runs in and prints one JSON line of timings; the parent
alternates old, new, old, new, ... and prints the median per case and the ratio new / old.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = [  # name, (B, H, S, D), layout, schedule
    ("topk25-d128-pp", (2, 16, 8192, 128), "topk", "PINGPONG"),
    ("dense-d128-pp", (2, 16, 8192, 128), "dense", "PINGPONG"),
    ("causal-d128-coop", (2, 16, 8192, 128), "causal", "COOPERATIVE"),
    ("window2K-32K-d128-pp", (1, 16, 32768, 128), "window", "PINGPONG"),
    ("topk25-d64-pp", (1, 8, 8192, 64), "topk", "PINGPONG"),
    ("dense-d64-coop", (1, 8, 8192, 64), "dense", "COOPERATIVE"),
]


def child() -> None:
    import torch
    import triton.testing
    import blackwell_sparsek as bsk
    L = bsk.BlockSparseLayout
    out = {}
    for name, (b, h, s, d), pat, sched in CASES:
        lay = {"topk": lambda: L.random_topk(s, s // 128 // 4, seed=1, num_heads=h),
               "dense": lambda: L.dense(s), "causal": lambda: L.causal(s),
               "window": lambda: L.sliding_window(s, 2048)}[pat]().to("cuda")
        g = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        cfg = getattr(bsk.Schedule, sched)
        fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa: E731
        fn()
        ms = triton.testing.do_bench(fn, warmup=300, rep=200, return_mode="median")
        blocks = lay.nnz * (h // lay.num_heads) * b
        out[name] = 4.0 * d * 128 * 128 * blocks / (ms * 1e-3) / 1e12
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    runs = {t: [] for t in a.trees}
    for r in range(a.rounds):
        for t in a.trees:
            env = dict(os.environ, PYTHONPATH=f"{os.environ.get('SITE', '/tmp/site')}:{os.path.abspath(t)}",
                       BSK_CACHE_DIR=os.path.join(os.path.abspath(t), ".bskcache"))
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], cwd=t, env=env,
                               capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"{t} failed:\n{p.stderr[-3000:]}")
            runs[t].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r} {t}: " + " ".join(f"{k}={v:.0f}" for k, v in runs[t][-1].items()), flush=True)
    old, new = a.trees
    print(f"| case | {old} | {new} | new / old |\n|---|---|---|---|")
    for name, *_ in CASES:
        mo = statistics.median(x[name] for x in runs[old])
        mn = statistics.median(x[name] for x in runs[new])
        print(f"| {name} | {mo:.0f} | {mn:.0f} | {mn / mo:.3f} |")


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
