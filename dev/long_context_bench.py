"""Time per listed block of a causal 2K sliding window at long context (issue 24, item 27).

    python dev/long_context_bench.py [--cases 256K:8,1M:16,1M:32] [--window 2048] [--head-dim 128]

For each (sequence length, heads) case: bf16 q, k, v of shape (1, H, S, D), BlockSparseLayout.sliding_window(S,
window) (causal), the kernel sparse_attention picks, timed with triton.testing.do_bench (median). Prints the time,
the listed blocks (layout nnz x heads), the time per listed block and its ratio to the first case (the target:
1M with 16 and 32 heads within 3 % of 256K with 8), and effective TFLOPS (4 * D * visible (query, key) pairs).
Needs a GPU with room for four (1, H, S, D) tensors (32 GiB at 1M x 32 heads); a case that does not fit is
reported and skipped.
"""
from __future__ import annotations

import argparse

import torch

import blackwell_sparsek as bsk


def _parse_cases(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        seq, heads = item.split(":")
        seq = seq.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(seq[-1], 1)
        out.append((int(seq.rstrip("KM")) * mult, int(heads)))
    return out


def _visible_pairs(seq: int, window: int) -> int:
    """(query, key) pairs of a causal window of `window` keys including the query's own."""
    full = max(0, seq - window + 1) * window
    ramp = min(seq, window - 1)
    return full + ramp * (ramp + 1) // 2


def run_case(seq: int, heads: int, head_dim: int, window: int, do_bench) -> dict | None:
    need = 4 * heads * seq * head_dim * 2 + heads * seq * 4
    free, _ = torch.cuda.mem_get_info()
    if free < need + (1 << 30):
        print(f"S={seq:>8} H={heads:>3}: skipped, needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        return None
    g = torch.Generator(device="cuda").manual_seed(seq + heads)
    q, k, v = (torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    layout = bsk.BlockSparseLayout.sliding_window(seq_q=seq, window=window, device="cuda")
    fn = lambda: bsk.sparse_attention(q, k, v, layout)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    ms = do_bench(fn, warmup=500, rep=300, return_mode="median")  # 0.5 s: the sustained clock
    blocks = layout.nnz * heads  # the layout is shared by the heads (num_heads == 1)
    tflops = 4 * head_dim * _visible_pairs(seq, window) * heads / (ms * 1e-3) / 1e12
    del q, k, v
    torch.cuda.empty_cache()
    return {"seq": seq, "heads": heads, "ms": ms, "blocks": blocks, "ns_per_block": ms * 1e6 / blocks,
            "tflops": tflops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="256K:8,1M:16,1M:32,256K:8",
                    help="SEQ:HEADS,... (K = 2^10, M = 2^20); the first case is the reference, repeated last to "
                         "show the drift of the GPU's clock over the run")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the case list, interleaved; print medians")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()}, bf16, D={args.head_dim}, causal window {args.window}, "
          f"do_bench median")
    print(f"{'S':>8} {'H':>3} {'ms':>9} {'blocks':>10} {'ns/block':>9} {'vs first':>9} {'TFLOPS':>7}")
    base = None
    per_case: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.rounds):
        for seq, heads in _parse_cases(args.cases):
            r = run_case(seq, heads, args.head_dim, args.window, do_bench)
            if r is None:
                continue
            per_case.setdefault((seq, heads), []).append(r["ns_per_block"])
            base = base or r["ns_per_block"]
            ratio = r["ns_per_block"] / base
            print(f"{seq:>8} {heads:>3} {r['ms']:>9.3f} {r['blocks']:>10} {r['ns_per_block']:>9.3f} "
                  f"{(ratio - 1) * 100:>+8.1f}% {r['tflops']:>7.0f}", flush=True)
    if args.rounds > 1:  # the clock drifts between cases: medians over interleaved rounds
        import statistics
        meds = {c: statistics.median(v) for c, v in per_case.items()}
        ref = next(iter(meds.values()))
        print("medians over rounds (ns per listed block, vs the first case):")
        for (seq, heads), m in meds.items():
            print(f"{seq:>8} {heads:>3} {m:>9.3f} {(m / ref - 1) * 100:>+8.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
