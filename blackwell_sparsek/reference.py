"""Dense-masked reference attention: the definition every kernel is checked against.

Computes in float64 (or a given dtype) from the layout's exact element mask, so it is the ground truth for the
block structure, block kinds, the element rule and sequence ends. Memory is O(B·H·Sq·Sk): for tests and small
checks, and the op's fallback when no GPU or nvcc is available.
"""
from __future__ import annotations

import math

import torch


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout, *, causal: bool = False,
                        scale: float | None = None, dtype: torch.dtype = torch.float64):
    """O and LSE (natural log, float32) of masked softmax attention, q/k/v (B, H, S, D), GQA by head repeat.

    Rows with no visible key give O = 0 and LSE = -inf.
    """
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if causal:
        layout = layout.with_causal()
    mask = layout.to_element_mask().to(q.device)  # [Hl, Sq, Sk]
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    if Hkv != H:
        kd = kd.repeat_interleave(H // Hkv, dim=1)
        vd = vd.repeat_interleave(H // Hkv, dim=1)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale          # [B, H, Sq, Sk]
    s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                             # -inf on empty rows
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    p = p.masked_fill(~mask.unsqueeze(0), 0.0)
    o = torch.matmul(p, vd)
    return o, lse.float()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere in out gives inf)."""
    o = out.double()
    r = ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den > 0 else num
