"""Short benchmark of the attention backward (dev; the harness integration comes with issue 26 item 4).

    python dev/bwd_bench.py [--quick] [--json OUT]

Backward alone = the blackwell_sparsek::attn_bwd op on a finished forward (prep + main kernel + dQ convert, as the
autograd backward runs it; the transposed layout view cached, as in training). Effective TFLOPS count listed
blocks only: 2.5 * 4 * B * H * D * (listed blocks * 128 * 128) / time (ANCHORS.md); forward + backward through
torch.autograd counts 3.5x. Peers in the same run: SDPA (cuDNN, dense / causal) backward where the case is dense.
do_bench-style medians (bench.timing.bench).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention_bwd as ab
from blackwell_sparsek.bench.timing import bench

L = bsk.BlockSparseLayout


def _inputs(B, H, S, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def _ours(name, layout, B, H, S, D, dtype, causal=False, det=False):
    q, k, v, do = _inputs(B, H, S, D, dtype)
    lay = (layout.with_causal() if causal else layout).to("cuda")
    o, lse = bsk.sparse_attention(q, k, v, lay, return_lse=True)
    from blackwell_sparsek.ops.attention import _eager_plan, _meta
    fwd_json, dlay = _eager_plan(lay, None, D, dtype, q.device)
    bjson = ab.bwd_config_json(fwd_json, det)
    args = (q, k, v, o, lse, do, None, dlay.col_idx, dlay.block_kind, dlay.row_schedule(), _meta(dlay),
            1.0 / math.sqrt(D), bjson)
    ab.attn_bwd(*args)  # builds, caches the view
    torch.cuda.synchronize()
    t = bench(lambda: ab.attn_bwd(*args), warmup_ms=300, rep_ms=300)
    if name == "topk25_d128" and dtype == torch.float16 and not det:
        _breakdown(lambda: ab.attn_bwd(*args))
    blocks = sum(dlay.nnz_per_head) * (H // dlay.num_heads) * B
    flops = 2.5 * 4 * D * blocks * 128 * 128
    return dict(case=name, impl="bsk-det" if det else "bsk", dtype=str(dtype).split(".")[-1], B=B, H=H, S=S, D=D,
                ms=t.median_ms, tflops=flops / t.median_ms / 1e9, density=dlay.density)


def _fwd_bwd(name, layout, B, H, S, D, dtype):
    """Forward + backward through torch.autograd (sparse_attention eager), 3.5x the forward's count."""
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    lay = layout.to("cuda")
    fn = lambda: torch.autograd.grad(bsk.sparse_attention(q, k, v, lay), (q, k, v), do)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    t = bench(fn, warmup_ms=300, rep_ms=300)
    blocks = sum(lay.nnz_per_head) * (H // lay.num_heads) * B
    flops = 3.5 * 4 * D * blocks * 128 * 128
    return dict(case=name, impl="bsk fwd+bwd", dtype=str(dtype).split(".")[-1], B=B, H=H, S=S, D=D,
                ms=t.median_ms, tflops=flops / t.median_ms / 1e9, density=lay.density)


def _flex_fwd_bwd(name, layout, B, H, S, D, dtype):
    """FlexAttention (torch.compile'd) forward + backward on the layout's own BlockMask, 3.5x count: the peer."""
    from torch.nn.attention.flex_attention import flex_attention
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    bm = layout.to("cuda").to_flex_block_mask()
    flex = torch.compile(flex_attention, dynamic=False)
    fn = lambda: torch.autograd.grad(flex(q, k, v, block_mask=bm), (q, k, v), do)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    t = bench(fn, warmup_ms=300, rep_ms=300)
    blocks = sum(layout.nnz_per_head) * (H // layout.num_heads) * B
    flops = 3.5 * 4 * D * blocks * 128 * 128
    return dict(case=name, impl="flex fwd+bwd", dtype=str(dtype).split(".")[-1], B=B, H=H, S=S, D=D,
                ms=t.median_ms, tflops=flops / t.median_ms / 1e9, density=layout.density)


def _breakdown(fn, n: int = 20) -> None:
    """Mean GPU time per kernel (and memset) of one backward call, from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    def dev_us(e):
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
    rows = [(e.key, dev_us(e) / n) for e in prof.key_averages() if dev_us(e) > 0]
    for key, us in sorted(rows, key=lambda r: -r[1])[:8]:
        print(f"  breakdown  {us:9.1f} us  {key[:90]}", file=sys.stderr)


def _sdpa(name, B, H, S, D, dtype, causal, density_blocks):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=1)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            fn = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            t = bench(fn, warmup_ms=300, rep_ms=300)
    except Exception as e:  # cuDNN attention not available in this torch build
        print(f"sdpa cudnn unavailable: {e}", file=sys.stderr)
        return None
    flops = 2.5 * 4 * B * H * D * density_blocks * 128 * 128
    return dict(case=name, impl="sdpa-cudnn", dtype=str(dtype).split(".")[-1], B=B, H=H, S=S, D=D,
                ms=t.median_ms, tflops=flops / t.median_ms / 1e9, density=None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the 25 % top-k headline cases")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    S = 8192
    topk = L.random_topk(seq_q=S, k=16, seed=0, num_heads=16)
    for dt in (torch.float16, torch.bfloat16):
        rows.append(_ours("topk25_d128", topk, 2, 16, S, 128, dt))
    rows.append(_ours("topk25_d128", topk, 2, 16, S, 128, torch.float16, det=True))
    rows.append(_fwd_bwd("topk25_d128", topk, 2, 16, S, 128, torch.float16))
    rows.append(_flex_fwd_bwd("topk25_d128", topk, 2, 16, S, 128, torch.float16))
    if not a.quick:
        rows.append(_ours("topk25_d64", L.random_topk(seq_q=S, k=16, seed=0, num_heads=8), 1, 8, S, 64,
                          torch.float16))
        dense = L.dense(S)
        rows.append(_ours("dense_d128", dense, 4, 16, S, 128, torch.float16))
        rows.append(_ours("dense_d128", dense, 4, 16, S, 128, torch.float16, det=True))
        rows.append(_sdpa("dense_d128", 4, 16, S, 128, torch.float16, False, 64 * 64))
        rows.append(_ours("causal_d128", dense, 4, 16, S, 128, torch.float16, causal=True))
        rows.append(_sdpa("causal_d128", 4, 16, S, 128, torch.float16, True, 64 * 65 // 2))
    rows = [r for r in rows if r is not None]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  backward alone (prep + main + dQ convert) unless fwd+bwd, medians")
    print(f"{'case':<14}{'impl':<14}{'dtype':<10}{'B,H,S,D':<18}{'ms':>9}{'eff TFLOPS':>12}")
    for r in rows:
        shape = f"{r['B']},{r['H']},{r['S']},{r['D']}"
        print(f"{r['case']:<14}{r['impl']:<14}{r['dtype']:<10}{shape:<18}{r['ms']:>9.3f}{r['tflops']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
