"""Benchmark of the attention backward: ``python -m blackwell_sparsek bench-bwd [--quick] [--out DIR]``.

Backward alone = the ``blackwell_sparsek::attn_bwd`` op on a finished forward, as autograd runs it (one launcher
call: prep, main kernel, dQ convert; the transposed layout view cached, as in training). Forward + backward =
``torch.autograd.grad`` through ``sparse_attention``. Peers, timed in the same process and run:

* FlexAttention (``torch.compile``'d ``flex_attention``) forward + backward on the layout's own BlockMask
  (``to_flex_block_mask``, the same blocks and element mask; 64-wide blocks, which Flex refuses, as the same
  element mask at 128x128 blocks: ``flex_block_mask``);
* SDPA with the cuDNN backend, backward alone (``autograd.grad`` of a finished forward), dense and causal.

Effective TFLOPS count the listed blocks only (ANCHORS.md): backward 2.5 x, forward + backward 3.5 x the forward's
4 * B * H * D * blocks * 128 * 128; a peer on the same mask gets the same count. Times are ``bench.timing.bench``
medians (triton do_bench, L2 flushed). Also measured: the deterministic mode's cost, the extra device memory of one
backward call (``torch.cuda.max_memory_allocated`` over the inputs, O, LSE and dO, minus the dQ/dK/dV outputs),
where the time goes (torch profiler, per kernel), the same call replayed from a CUDA graph (no host overhead), and
the fast kernel's tile-order head group (``attention_bwd.HEAD_GROUP``). Writes ``bwd_bench.json`` and
``bwd_bench.md`` to --out.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .timing import REP_MS, WARMUP_MS, bench, capture, host_us, kernel_us


def _dt(dtype) -> str:
    return str(dtype).split(".")[-1]


def _inputs(B, H, S, D, dtype, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def _blocks(layout, B, H) -> int:
    return sum(layout.nnz_per_head) * (H // layout.num_heads) * B


def _flops(layout, B, H, D, mult) -> float:
    return mult * 4 * D * _blocks(layout, B, H) * layout.block_m * layout.block_n


def pair_fill(layout) -> float:
    """Key blocks that are not whole 128-key tiles (64, 192, ...) run as 64-key halves of 128-key columns over the
    union of the halves' query blocks: listed halves / (2 x column entries), the share of the backward's 128-key
    work that is listed (1.0 when both halves of every entry are listed)."""
    from ..ops.attention_bwd_view import transposed_view
    t_sched = transposed_view(layout.col_idx, layout.block_kind, layout.row_schedule(), layout.n_kblocks,
                              layout.seq_q, layout.block_m, block_n=layout.block_n)[2]
    entries = int((t_sched[..., 2] - t_sched[..., 1]).sum())
    return sum(layout.nnz_per_head) * (layout.block_n // 64) / (2 * entries)


def _time(fn: Callable[[], Any]) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    return bench(fn, warmup_ms=WARMUP_MS, rep_ms=REP_MS).median_ms


class BwdCall:
    """One backward call on a finished forward (inputs, O, LSE, dO kept), ready to time: the op's body, as an eager
    autograd backward runs it (attention_bwd.EagerAttention)."""

    def __init__(self, layout, B, H, S, D, dtype, det=False, seed=0, hkv=None):
        import torch
        import blackwell_sparsek as bsk
        import blackwell_sparsek.ops.attention_bwd as ab
        from blackwell_sparsek.ops.attention import _eager_plan, _meta
        self.q, self.k, self.v, self.do = _inputs(B, H, S, D, dtype, seed)
        if hkv is not None:  # GQA: hkv K/V heads, each serving H // hkv query heads
            self.k, self.v = self.k[:, :hkv].contiguous(), self.v[:, :hkv].contiguous()
        self.layout = layout.to("cuda")
        self.o, self.lse = bsk.sparse_attention(self.q, self.k, self.v, self.layout, return_lse=True)
        fwd_json, dlay = _eager_plan(self.layout, None, D, dtype, self.q.device)
        self.args = (self.q, self.k, self.v, self.o, self.lse, self.do, None, dlay.col_idx, dlay.block_kind,
                     dlay.row_schedule(), _meta(dlay), 1.0 / math.sqrt(D), ab.bwd_config_json(fwd_json, det))
        self.op = ab._attn_bwd_impl
        self.flops = _flops(dlay, B, H, D, 2.5)
        self.op(*self.args)  # builds the kernel, caches the transposed view
        torch.cuda.synchronize()

    def __call__(self):
        return self.op(*self.args)

    def extra_memory(self) -> dict[str, int]:
        """Peak device memory of one call over what was allocated before it, minus its dQ, dK, dV outputs."""
        import torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = self()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        outs = sum(t.numel() * t.element_size() for t in out)
        acc = self.q.numel() * 4
        return {"peak_over_inputs": peak, "outputs": outs, "extra": peak - outs, "fp32_dq_accumulator": acc}

    def graph(self):
        """The same call captured in a CUDA graph (after one warm-up call on a side stream)."""
        return capture(self)

    def graph_ms(self) -> float | None:
        """The same call replayed from a CUDA graph: GPU time without the host's per-call work."""
        try:
            return _time(self.graph().replay)
        except Exception as e:  # capture not possible here: report, do not fail the run
            print(f"cuda graph capture failed: {e}", file=sys.stderr)
            return None

    def host_us(self, n: int = 200) -> float:
        """Host time per call (no synchronization inside the loop), microseconds."""
        return host_us(self, n)[0]


def breakdown(fn, n: int = 20) -> list[tuple[str, float]]:
    """Mean GPU time per kernel (and memset) of one call, from the torch profiler, microseconds."""
    return [(key, us) for key, _, us in kernel_us(fn, n)[:8]]


def fwd_bwd_ours(layout, B, H, S, D, dtype) -> float:
    import torch
    import blackwell_sparsek as bsk
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    lay = layout.to("cuda")
    return _time(lambda: torch.autograd.grad(bsk.sparse_attention(q, k, v, lay), (q, k, v), do))


def fwd_bwd_flex(layout, B, H, S, D, dtype) -> float:
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    bm = flex_block_mask(layout.to("cuda"))
    flex = torch.compile(flex_attention, dynamic=False)
    return _time(lambda: torch.autograd.grad(flex(q, k, v, block_mask=bm), (q, k, v), do))


def flex_block_mask(layout):
    """The layout's BlockMask for FlexAttention; for blocks Flex's kernels refuse (64-wide: its tiles are 128), the
    same element mask at 128x128 granularity, as a Flex user would build it (create_block_mask over the layout's
    exact mask_mod)."""
    if layout.block_m % 128 == 0 and layout.block_n % 128 == 0:
        return layout.to_flex_block_mask()
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(layout.to_flex_block_mask().mask_mod, None, layout.num_heads, layout.seq_q,
                             layout.seq_k, device=layout.device, BLOCK_SIZE=128)


def bwd_sdpa_cudnn(B, H, S, D, dtype, causal) -> float | None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, do = _inputs(B, H, S, D, dtype, seed=1)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return _time(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    except Exception as e:  # cuDNN attention not available in this torch build
        print(f"sdpa cudnn unavailable: {e}", file=sys.stderr)
        return None


def cases(quick: bool) -> list[dict[str, Any]]:
    """The case list: name, layout factory, shape, dtypes, which measurements and peers."""
    import torch
    import blackwell_sparsek as bsk
    L = bsk.BlockSparseLayout
    S = 8192
    topk = lambda h: L.random_topk(seq_q=S, k=16, seed=0, num_heads=h)  # noqa: E731  25 % of the blocks
    topk64 = lambda h: L.random_topk(seq_q=S, k=32, seed=0, num_heads=h, block_m=64, block_n=64)  # noqa: E731
    out = [
        dict(name="topk25_d128", layout=lambda: topk(16), B=2, H=16, S=S, D=128, dtype=torch.float16,
             det=True, flex=True, extras=True),
        dict(name="topk25_d128", layout=lambda: topk(16), B=2, H=16, S=S, D=128, dtype=torch.bfloat16,
             flex=True),
    ]
    if quick:
        return out
    out += [
        dict(name="causal_d128", layout=lambda: L.causal(S), B=4, H=16, S=S, D=128, dtype=torch.float16,
             sdpa="causal"),
        dict(name="dense_d128", layout=lambda: L.dense(S), B=4, H=16, S=S, D=128, dtype=torch.float16,
             det=True, sdpa="dense"),
        dict(name="topk25_d64", layout=lambda: topk(8), B=1, H=8, S=S, D=64, dtype=torch.float16, flex=True,
             host=True),
        dict(name="window2k_32k", layout=lambda: L.sliding_window(32768, 2048), B=1, H=16, S=32768, D=128,
             dtype=torch.float16, flex=True),
        dict(name="topk25_b64_d128", layout=lambda: topk64(16), B=2, H=16, S=S, D=128, dtype=torch.float16,
             det=True, flex=True),
        dict(name="causal_b64_d128", layout=lambda: L.causal(S, block_m=64, block_n=64), B=4, H=16, S=S, D=128,
             dtype=torch.float16, sdpa="causal"),
        dict(name="topk25_gqa4", layout=lambda: topk(16), B=2, H=16, S=S, D=128, dtype=torch.float16, hkv=4,
             memory=True),
    ]
    return out


def run_case(c: dict[str, Any], rows: list[dict[str, Any]], notes: dict[str, Any], head_groups: bool) -> None:
    import blackwell_sparsek.ops.attention_bwd as ab
    layout = c["layout"]()
    B, H, S, D, dt = c["B"], c["H"], c["S"], c["D"], c["dtype"]
    base = dict(case=c["name"], dtype=_dt(dt), B=B, H=H, S=S, D=D, density=layout.density)

    def add(impl, ms, flops, **kw):
        if ms is not None:
            rows.append({**base, "impl": impl, "ms": ms, "tflops": flops / ms / 1e9, **kw})

    call = BwdCall(layout, B, H, S, D, dt, hkv=c.get("hkv"))
    t_ours = _time(call)
    add("bsk bwd", t_ours, call.flops)
    key = f"{c['name']}_{_dt(dt)}"
    if layout.block_n % 128:
        notes[f"{key}_pair_fill"] = pair_fill(layout)
    if c.get("extras") or c.get("host"):
        notes[f"{key}_graph_ms"] = call.graph_ms()
        notes[f"{key}_host_us_per_call"] = call.host_us()
    if c.get("extras") or c.get("memory"):
        notes[f"{key}_memory_bytes"] = call.extra_memory()
    if c.get("extras"):
        notes[f"{key}_breakdown_us"] = breakdown(call)
        if head_groups:
            for g in (1, 2):
                ab.HEAD_GROUP = g
                add(f"bsk bwd group{g}", _time(call), call.flops)
            ab.HEAD_GROUP = 0
    if c.get("det"):
        dcall = BwdCall(layout, B, H, S, D, dt, det=True)
        t_det = _time(dcall)
        add("bsk bwd det", t_det, dcall.flops, det_cost=t_det / t_ours - 1)
        del dcall
    del call
    if c.get("flex"):
        f35 = _flops(layout, B, H, D, 3.5)
        ours = fwd_bwd_ours(layout, B, H, S, D, dt)
        add("bsk fwd+bwd", ours, f35)
        try:
            flex = fwd_bwd_flex(layout, B, H, S, D, dt)
        except Exception as e:
            print(f"flex failed: {e}", file=sys.stderr)
            flex = None
        add("flex fwd+bwd", flex, f35)
        if flex:
            rows[-2]["vs_flex"] = flex / ours
    if c.get("sdpa"):
        t = bwd_sdpa_cudnn(B, H, S, D, dt, c["sdpa"] == "causal")
        add("sdpa-cudnn bwd", t, _flops(layout, B, H, D, 2.5))
        if t:
            next(r for r in rows if r["case"] == c["name"] and r["impl"] == "bsk bwd")["vs_cudnn"] = t / t_ours


def markdown(gpu: str, rows: list[dict[str, Any]], notes: dict[str, Any]) -> str:
    lines = [f"# Attention backward, {gpu}", "",
             "Effective TFLOPS over listed blocks (backward 2.5x, fwd+bwd 3.5x the forward count), do_bench medians, "
             "peers in the same run.", "",
             "| case | impl | dtype | B,H,S,D | ms | eff TFLOPS | vs peer |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        peer = ""
        if "vs_flex" in r:
            peer = f"{r['vs_flex']:.2f}x Flex"
        elif "vs_cudnn" in r:
            peer = f"{r['vs_cudnn']:.2f}x cuDNN"
        elif "det_cost" in r:
            peer = f"det cost {100 * r['det_cost']:+.1f} %"
        lines.append(f"| {r['case']} | {r['impl']} | {r['dtype']} | {r['B']},{r['H']},{r['S']},{r['D']} | "
                     f"{r['ms']:.3f} | {r['tflops']:.1f} | {peer} |")
    lines += ["", "```", json.dumps(notes, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek bench-bwd", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the 25 %% top-k D=128 cases")
    ap.add_argument("--no-head-groups", action="store_true", help="skip the head-group comparison")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip the remaining cases after this many s")
    ap.add_argument("--out", default=None, help="directory for bwd_bench.json and bwd_bench.md")
    ap.add_argument("--only", default="", help="comma-separated case names to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    a = ap.parse_args(argv)
    if a.list:
        for c in cases(a.quick):
            print(f"{c['name']:<14} {_dt(c['dtype']):<9} {c['B']},{c['H']},{c['S']},{c['D']}")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench-bwd needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    rows: list[dict[str, Any]] = []
    notes: dict[str, Any] = {"skipped": []}
    t0 = time.time()
    only = {n for n in a.only.split(",") if n}
    for c in cases(a.quick):
        if only and c["name"] not in only:
            continue
        if time.time() - t0 > a.budget_s:
            notes["skipped"].append(f"{c['name']} {_dt(c['dtype'])}")
            continue
        run_case(c, rows, notes, not a.no_head_groups)
        torch.cuda.empty_cache()
        if out:  # after every case, so a cut-off run keeps what it measured
            (out / "bwd_bench.json").write_text(json.dumps({"gpu": gpu, "rows": rows, "notes": notes}, indent=1,
                                                           default=str))
            (out / "bwd_bench.md").write_text(markdown(gpu, rows, notes))
    print(markdown(gpu, rows, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
