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

    Keys the layout masks are never looked at (as the kernel, which does not read unlisted blocks). Rows whose LSE
    is -inf (no visible key, or only -inf logits) give O = 0 and LSE = -inf. A visible +inf or NaN logit gives a
    NaN row (O and LSE), as torch.nn.functional.scaled_dot_product_attention does (SDPA also turns a *masked*
    +inf/NaN logit into NaN, because it adds the -inf mask to it; here masked keys are simply absent).
    """
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if causal:
        layout = layout.with_causal()
    hidden = ~layout.to_element_mask().to(q.device).unsqueeze(0)  # [1, Hl, Sq, Sk]
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    if Hkv != H:
        kd = kd.repeat_interleave(H // Hkv, dim=1)
        vd = vd.repeat_interleave(H // Hkv, dim=1)
    # [B, H, Sq, Sk] scores, updated in place (one copy fewer) unless autograd needs the intermediates
    inplace = not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    s = torch.matmul(qd, kd.transpose(-1, -2))
    s = s.mul_(scale).masked_fill_(hidden, float("-inf")) if inplace else (s * scale).masked_fill(hidden,
                                                                                                    float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                             # -inf: empty; +inf or NaN: a bad visible logit
    # +inf - +inf = NaN where a row sees +inf, like SDPA's softmax; empty rows subtract 0 and give exp(-inf) = 0
    shift = lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1)
    p = s.sub_(shift).exp_().masked_fill_(hidden, 0.0) if inplace else (s - shift).exp().masked_fill(hidden, 0.0)
    o = torch.matmul(p, vd)
    return o, lse.masked_fill(lse == float("inf"), float("nan")).float()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere in out gives inf)."""
    o = out.double()
    r = ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den > 0 else num
