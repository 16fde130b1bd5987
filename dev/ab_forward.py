"""Same-run A/B of the forward (and backward: the bwd-* cases) kernels of several source trees (e.g. main before
and after a change), in alternating processes (two builds of one kernel name cannot share a process), do_bench
medians (--graph: medians of CUDA-graph replays, for kernels shorter than the Python call's host time),
effective TFLOPS.

    python dev/ab_forward.py TREE[=CACHE][@FLAGS] TREE[=CACHE][@FLAGS] ... [--rounds 3] [--cases SUBSTR]

Each tree runs with its own kernel cache (CACHE, default <tree>/.bskcache) and, after '@', its own BSK_NVCC_FLAGS
(a measurement build, e.g. '.@-DBSK_EXP_POLY_EVERY=8'). A child (``--child``) imports the package of the tree it
runs in and prints one JSON line of timings; the parent alternates the trees round by round and prints the median
per case and each tree's ratio to the first. --cases: only the cases whose name contains SUBSTR (or one of
SUBSTR,SUBSTR,...; 'NAME$' selects that case alone).
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
    ("causal-d128-pp", (2, 16, 8192, 128), "causal", "PINGPONG"),
    ("window2K-32K-d128-pp", (1, 16, 32768, 128), "window", "PINGPONG"),
    ("topk25-d64-pp", (1, 8, 8192, 64), "topk", "PINGPONG"),
    ("dense-d64-coop", (1, 8, 8192, 64), "dense", "COOPERATIVE"),
    ("dense-d64-pp", (1, 8, 8192, 64), "dense", "PINGPONG"),
    ("window2K-32K-d64-pp", (1, 16, 32768, 64), "window", "PINGPONG"),
    ("causal-1K-d64-pp", (16, 16, 1024, 64), "causal", "PINGPONG"),
    ("topk25-b64-d128-dual-bf16", (2, 16, 8192, 128), "topk64", "DUAL"),  # issue 29: 64x64 blocks at D=128
    ("topk12-b64-d128-dual-bf16", (2, 16, 8192, 128), "topk64e", "DUAL"),
    ("topk25-b64-d64-dual", (2, 16, 8192, 64), "topk64", "DUAL"),  # 64x64 blocks: three streams
    ("topk25-b64-d64-dual-bf16", (2, 16, 8192, 64), "topk64", "DUAL"),  # issue 29's case
    ("topk12-b64-d64-dual-bf16", (2, 16, 8192, 64), "topk64e", "DUAL"),  # 12.5 %
    # issue 29's rows of mixed length (bench.split_kv's global2 layout): split-KV on the persistent kernel
    ("global2-32k-d128-pp-bf16", (1, 16, 32768, 128), "global2", "PINGPONG"),
    ("global2-32k-d64-pp", (1, 16, 32768, 64), "global2", "PINGPONG"),
    # issue 29's short rows (bench.short_rows: random top-k, k blocks a row, at 32K tokens)
    ("short2-d64-pp", (1, 16, 32768, 64), "topk2", "PINGPONG"),
    ("short4-d64-pp", (1, 16, 32768, 64), "topk4", "PINGPONG"),
    ("short2-d128-pp", (1, 16, 32768, 128), "topk2", "PINGPONG"),
    ("short4-d128-pp", (1, 16, 32768, 128), "topk4", "PINGPONG"),
    # backward alone on a finished forward (bench.backward.BwdCall: the op's body, as an eager backward runs it)
    ("bwd-topk25-d128", (2, 16, 8192, 128), "topk", "BWD"),
    ("bwd-topk25-d128-det", (2, 16, 8192, 128), "topk", "BWD"),  # the deterministic kernel
    ("bwd-dense-d128", (2, 16, 8192, 128), "dense", "BWD"),
    ("bwd-topk25-b64-d128", (2, 16, 8192, 128), "topk64", "BWD"),  # 64x64 blocks: pairs of key blocks
    ("bwd-topk25-b64-d128-det", (2, 16, 8192, 128), "topk64", "BWD"),  # the same, deterministic
]


def _selected(name: str, cases: str) -> bool:
    """--cases / AB_CASES: comma-separated substrings of case names (one ending in '$': that whole name); empty
    selects every case."""
    return not cases or any(name == x[:-1] if x.endswith("$") else x in name for x in cases.split(",") if x)


def child() -> None:
    import torch
    import triton.testing
    import blackwell_sparsek as bsk
    from blackwell_sparsek.bench.split_kv import global_layout
    L = bsk.BlockSparseLayout
    out = {}
    only = os.environ.get("AB_CASES", "")
    for name, (b, h, s, d), pat, sched in CASES:
        if not _selected(name, only):
            continue
        lay = {"topk": lambda: L.random_topk(s, s // 128 // 4, seed=1, num_heads=h),
               "topk64": lambda: L.random_topk(s, s // 64 // 4, seed=1, num_heads=h, block_m=64, block_n=64),
               "topk64e": lambda: L.random_topk(s, s // 64 // 8, seed=1, num_heads=h, block_m=64, block_n=64),
               "topk2": lambda: L.random_topk(s, 2, seed=1, num_heads=h),
               "topk4": lambda: L.random_topk(s, 4, seed=1, num_heads=h),
               "dense": lambda: L.dense(s), "causal": lambda: L.causal(s),
               "window": lambda: L.sliding_window(s, 2048),
               "global2": lambda: global_layout(s, "cpu")}[pat]().to("cuda")
        if sched == "BWD":  # its own inputs, forward and dO
            from blackwell_sparsek.bench.backward import BwdCall
            fn, mult = BwdCall(lay, b, h, s, d, torch.float16, det=name.endswith("-det")), 2.5
        else:
            g = torch.Generator(device="cuda").manual_seed(7)
            dt = torch.bfloat16 if name.endswith("-bf16") else torch.float16
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
            cfg = getattr(bsk.Schedule, sched)
            fn, mult = (lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)), 1.0  # noqa: E731
        fn()
        if os.environ.get("AB_GRAPH") == "1":  # --graph: replays of 20 captured calls, no host time between
            from blackwell_sparsek.bench.timing import loop_bench
            triton.testing.do_bench(fn, warmup=300, rep=50)  # to the sustained clock first
            ms = loop_bench(fn, n=20, reps=15, graph=True).median_ms
        else:
            ms = triton.testing.do_bench(fn, warmup=300, rep=200, return_mode="median")
        blocks = lay.nnz * (h // lay.num_heads) * b
        out[name] = mult * 4.0 * d * lay.block_m * lay.block_n * blocks / (ms * 1e-3) / 1e12
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=None, help="only the cases whose name contains one of these (comma-separated)")
    ap.add_argument("--graph", action="store_true",
                    help="time CUDA-graph replays of 20 calls (no host time between launches) instead of do_bench")
    a = ap.parse_args()
    caches, flags = {}, {}
    for spec in a.trees:
        spec, _, fl = spec.partition("@")
        tree, _, cache = spec.partition("=")
        key = tree + ("@" + fl if fl else "")
        caches[key] = (tree, os.path.abspath(cache or os.path.join(tree, ".bskcache")))
        flags[key] = fl
    trees = list(caches)
    runs = {t: [] for t in trees}
    for r in range(a.rounds):
        for t in trees:
            tree, cache = caches[t]
            env = dict(os.environ, PYTHONPATH=f"{os.environ.get('SITE', '/tmp/site')}:{os.path.abspath(tree)}",
                       BSK_CACHE_DIR=cache, BSK_NVCC_FLAGS=flags[t], AB_CASES=a.cases or "",
                       AB_GRAPH="1" if a.graph else "0")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], cwd=tree, env=env,
                               capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"{t} failed:\n{p.stderr[-3000:]}")
            runs[t].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r} {t}: " + " ".join(f"{k}={v:.0f}" for k, v in runs[t][-1].items()), flush=True)
    first = trees[0]
    print("| case | " + " | ".join(trees) + " | " + " | ".join(f"{t} / {first}" for t in trees[1:]) + " |")
    print("|---" * (2 * len(trees)) + "|")
    for name, *_ in CASES:
        if not _selected(name, a.cases or ""):
            continue
        med = [statistics.median(x[name] for x in runs[t]) for t in trees]
        print(f"| {name} | " + " | ".join(f"{m:.0f}" for m in med) + " | "
              + " | ".join(f"{m / med[0]:.3f}" for m in med[1:]) + " |")


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
