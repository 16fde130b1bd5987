"""Arithmetic of the benchmark: flop counts, bytes moved, TFLOPS, errors and the linear-scaling fit.

Pure Python (no torch, no numpy) except :func:`rel_error`, so the CPU tests cover every formula.

Conventions (docs/benchmarks.md):

* **Effective flops** of a block-sparse forward = 4 · D · block_m · block_n · (listed blocks summed over every
  (batch, head) pair). A layout shared by all heads (``layout.num_heads == 1``) lists ``nnz`` blocks per pair; a
  per-head layout lists ``nnz`` blocks over its ``num_heads`` heads, i.e. ``nnz / num_heads`` per pair on average.
  Forward + backward counts 3.5× the forward.
* **Dense flops** (example 88's own count) = 4 · B · H · Q · K · D, × 0.5 for causal.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

FWD_BWD_FACTOR = 3.5


def block_pairs_total(nnz: int, layout_heads: int, batch: int, heads: int) -> int:
    """Listed blocks summed over all (batch, head) pairs: ``batch * heads * nnz / layout_heads``."""
    if layout_heads == 1:
        return batch * heads * nnz
    if layout_heads <= 0 or heads % layout_heads:
        raise ValueError(f"a layout with {layout_heads} heads cannot serve {heads} heads")
    # per-head layout (layout_heads == heads), or grouped: each layout head serves heads/layout_heads heads
    return batch * (heads // layout_heads) * nnz


def effective_flops(block_pairs: int, block_m: int, block_n: int, head_dim: int, *, backward: bool = False) -> float:
    f = 4.0 * head_dim * block_m * block_n * block_pairs
    return f * FWD_BWD_FACTOR if backward else f


def dense_flops(b: int, h: int, q: int, k: int, d: int, *, causal: bool = False, backward: bool = False) -> float:
    f = 4.0 * b * h * q * k * d * (0.5 if causal else 1.0)
    return f * FWD_BWD_FACTOR if backward else f


def window_pairs(seq: int, window: int) -> int:
    """Exact (query, key) pairs of a causal sliding window of ``window`` keys (key in (q - window, q])."""
    w = min(window, seq)
    # rows 0..w-1 see q+1 keys; the rest see w keys
    return w * (w + 1) // 2 + (seq - w) * w


def tflops(flops: float, ms: float | None) -> float | None:
    if not ms or ms <= 0 or not math.isfinite(ms):
        return None
    return flops / (ms * 1e-3) / 1e12


def io_bytes(b: int, h: int, sq: int, sk: int, d: int, itemsize: int = 2, h_kv: int | None = None,
             lse: bool = False) -> int:
    """Bytes a forward must move at least once: read Q, K, V, write O (and LSE in float32 when returned)."""
    h_kv = h if h_kv is None else h_kv
    n = (2 * b * h * sq * d + 2 * b * h_kv * sk * d) * itemsize
    if lse:
        n += b * h * sq * 4
    return n


def gbps(nbytes: float, ms: float | None) -> float | None:
    if not ms or ms <= 0 or not math.isfinite(ms):
        return None
    return nbytes / (ms * 1e-3) / 1e9


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Least squares for ``y = a + b x`` and for ``y = c x`` (proportional), and how far the points are from
    proportionality: ``max_dev_from_proportional = max_i |y_i / (c x_i) - 1|``; ``per_unit_spread`` =
    max(y/x) / min(y/x) - 1. Needs at least two points with x > 0."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x is not None and y is not None and x > 0
           and math.isfinite(float(y))]
    n = len(pts)
    if n < 2:
        return {"n": n, "ok": False, "reason": "need at least two points"}
    sx = sum(x for x, _ in pts)
    sy = sum(y for _, y in pts)
    sxx = sum(x * x for x, _ in pts)
    sxy = sum(x * y for x, y in pts)
    den = n * sxx - sx * sx
    slope = (n * sxy - sx * sy) / den if den else float("nan")
    intercept = (sy - slope * sx) / n if den else float("nan")
    mean_y = sy / n
    ss_tot = sum((y - mean_y) ** 2 for _, y in pts)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    c = sxy / sxx
    devs = [y / (c * x) - 1.0 for x, y in pts]
    ratios = [y / x for x, y in pts]
    return {
        "n": n, "ok": True,
        "slope": slope, "intercept": intercept, "r2": r2,
        "proportional_slope": c,
        "max_dev_from_proportional": max(abs(d) for d in devs),
        "deviations": devs,
        "per_unit_spread": max(ratios) / min(ratios) - 1.0 if min(ratios) > 0 else float("inf"),
    }


def rel_error(a: Any, b: Any, *, chunk_rows: int = 1 << 22) -> dict[str, float]:
    """‖a − b‖ / ‖b‖ and max |a − b| in float32, computed in chunks (large outputs never get a full fp32 copy).
    ``nonfinite`` counts NaN/inf in ``a``."""
    import torch
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    af = a.reshape(-1)
    bf = b.reshape(-1)
    num = 0.0
    den = 0.0
    mx = 0.0
    bad = 0
    n = af.numel()
    step = max(1, chunk_rows)
    for i in range(0, n, step):
        x = af[i:i + step].float()
        y = bf[i:i + step].float()
        bad += int((~torch.isfinite(x)).sum().item())
        diff = (x - y).nan_to_num(nan=float("inf"))
        num += float(diff.double().pow(2).sum().item()) if bad == 0 else float("inf")
        den += float(y.double().pow(2).sum().item())
        if bad == 0:
            mx = max(mx, float(diff.abs().max().item()) if diff.numel() else 0.0)
        else:
            mx = float("inf")
    rel = math.sqrt(num) / math.sqrt(den) if den > 0 else (0.0 if num == 0 else float("inf"))
    return {"rel_err": rel, "max_abs_err": mx, "nonfinite": bad}


# Tolerances for the checks: fp16 keeps ~11 bits, bf16 ~8; attention outputs are averages, so errors stay small.
REL_TOL = {"fp16": 5e-3, "bf16": 3e-2}


def tolerance(dtype: str) -> float:
    return REL_TOL.get(dtype, 3e-2)
