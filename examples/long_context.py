#!/usr/bin/env python
"""Long context: a causal sliding window of 2048 keys over 128K tokens (or more), timed, with its memory.

    python examples/long_context.py                         # S = 131072, B=1, H=16, D=128, fp16
    python examples/long_context.py --seq 262144 --window 4096 --heads 8 --dim 64 --schedule pingpong

Prints the layout (blocks, density), the median time, the effective TFLOPS (listed blocks x 128 x 128 x 4D),
the peak GPU memory of the call next to what a dense S x S score matrix would take, and checks the first and the
last 256 query rows against an exact float32 windowed reference. Exit 1 on a failed check; skips (exit 0)
without a CUDA GPU.
"""
from __future__ import annotations

import argparse
import math
import sys

from _gpu import torch_or_skip


def window_reference(q, k, v, rows: tuple[int, int], window: int, scale: float):
    """Exact attention of query rows [r0, r1) under the causal window rule (keys q-window+1 .. q), float32."""
    import torch
    r0, r1 = rows
    k0 = max(0, r0 - window + 1)
    qs = q[:, :, r0:r1].float()
    ks = k[:, :, k0:r1].float()
    vs = v[:, :, k0:r1].float()
    s = torch.matmul(qs, ks.transpose(-1, -2)) * scale
    qi = torch.arange(r0, r1, device=q.device).unsqueeze(1)
    kj = torch.arange(k0, r1, device=q.device).unsqueeze(0)
    keep = (kj <= qi) & (kj >= qi - window + 1)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), vs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=128 * 1024)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128, choices=[64, 128])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--schedule", default=None, choices=["cooperative", "pingpong"],
                    help="default: what sparse_attention picks")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # 'cpu' only tests this script
    a = ap.parse_args()
    torch = torch_or_skip(a.device)
    if torch is None:
        return 0

    import blackwell_sparsek as bsk
    from blackwell_sparsek import BlockSparseLayout, Schedule
    from blackwell_sparsek.bench import metrics
    from blackwell_sparsek.bench.timing import bench, peak_memory

    dev = a.device
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    B, H, S, D, W = a.batch, a.heads, a.seq, a.dim, a.window
    scale = 1.0 / math.sqrt(D)
    layout = BlockSparseLayout.sliding_window(S, W, causal=True, device=dev)
    config = None
    if a.schedule:
        from blackwell_sparsek.ops import default_config
        config = default_config(D, dt, layout, schedule=Schedule(a.schedule))
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=dt, generator=gen) for _ in range(3))
    in_bytes = 3 * q.numel() * q.element_size()
    print(f"device      : {torch.cuda.get_device_name(0) if dev == 'cuda' else dev}")
    print(f"problem     : B={B} H={H} S={S} ({S / 1024:.0f}K tokens) D={D} {a.dtype}, causal window {W} keys")
    print(f"layout      : {layout}")

    def fn():
        return bsk.sparse_attention(q, k, v, layout, scale=scale, config=config)

    peak, extra, o = peak_memory(fn, dev)
    if not torch.isfinite(o).all():
        print("FAIL: output has NaN/inf")
        return 1
    tm = bench(fn, device=dev)
    pairs = metrics.block_pairs_total(layout.nnz, layout.num_heads, B, H)
    fl = metrics.effective_flops(pairs, layout.block_m, layout.block_n, D)
    exact = 4.0 * B * H * D * metrics.window_pairs(S, W)
    print(f"time        : {tm.median_ms:.3f} ms median ({tm.reps} reps, {tm.method}; p20 {tm.p20_ms:.3f}, "
          f"p80 {tm.p80_ms:.3f}); {tm.median_ms * 1e3 / (B * H):.1f} us per head")
    print(f"throughput  : {metrics.tflops(fl, tm.median_ms):.1f} effective TFLOPS ({pairs} block pairs); "
          f"{metrics.tflops(exact, tm.median_ms):.1f} TFLOPS counting only unmasked elements")
    if peak is not None:
        dense_scores = B * H * S * S * 4
        print(f"memory      : peak {peak / 2**30:.2f} GiB during the call ({extra / 2**20:.0f} MiB above q/k/v of "
              f"{in_bytes / 2**30:.2f} GiB); a dense fp32 score matrix alone would be {dense_scores / 2**40:.2f} TiB")
    worst = 0.0
    for rows in ((0, min(256, S)), (max(0, S - 256), S)):
        ref = window_reference(q, k, v, rows, W, scale)
        got = o[:, :, rows[0]:rows[1]].float()
        err = (got - ref).norm().item() / max(ref.norm().item(), 1e-30)
        worst = max(worst, err)
        print(f"check       : rows {rows[0]}..{rows[1] - 1}: relative error {err:.2e} vs exact float32")
    tol = 5e-3 if a.dtype == "fp16" else 3e-2
    if worst > tol:
        print(f"FAIL: relative error {worst:.2e} > {tol}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
