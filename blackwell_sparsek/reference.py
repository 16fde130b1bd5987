"""Dense-masked reference attention: the definition every kernel is checked against.

Also the block-sparse GEMM references (bsr_to_dense, bsr_matmul_reference, sampled_matmul_reference).

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


def attention_backward_reference(q, k, v, o, lse, do, grad_lse, visible: torch.Tensor, scale: float):
    """dQ, dK, dV of attention (O, LSE) for upstream gradients (dO, g_lse or None), analytically in float64, in
    q/k/v's dtypes: P = exp(S·scale − LSE) on visible keys (0 where LSE = −inf), dV = Pᵀ·dO,
    dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O) + g_lse), dQ = scale·dS·K, dK = scale·dSᵀ·Q, GQA heads summed. ``visible``:
    bool [Hl, Sq, Sk] (Hl 1 or H) of the keys each query sees. The same values as attention_reference's autograd;
    a row whose LSE is NaN gets NaN gradients, as in the kernel."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    g = H // Hkv
    qd, kd, vd, od, dod = (t.double() for t in (q, k, v, o, do))
    kd, vd = kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1)
    lse_d = lse.double().unsqueeze(-1)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale
    empty = lse_d == float("-inf")  # a NaN LSE (a row that saw an infinite logit) keeps its NaN gradients
    p = torch.where(visible.unsqueeze(0) & ~empty, torch.exp(s - lse_d.masked_fill(empty, 0.0)), 0.0)
    delta = (dod * od).sum(-1, keepdim=True)
    if grad_lse is not None:
        delta = delta - grad_lse.double().unsqueeze(-1)
    ds = p * (torch.matmul(dod, vd.transpose(-1, -2)) - delta)
    dq = torch.matmul(ds, kd) * scale
    dk = (torch.matmul(ds.transpose(-1, -2), qd) * scale).view(B, Hkv, g, Sk, D).sum(2)
    dv = torch.matmul(p.transpose(-1, -2), dod).view(B, Hkv, g, Sk, D).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere in out gives inf)."""
    o = out.double()
    r = ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den > 0 else num


# -- block-sparse GEMM (blackwell_sparsek.matrix.BlockSparseMatrix, blackwell_sparsek.ops.gemm) ------------------

def bsr_to_dense(values: torch.Tensor, layout, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dense ``[M, K]`` matrix of block values ``[nnz, bm, bk]`` (col_idx order) on a one-head layout, in
    ``dtype`` (default: values'); entries past the matrix edge are dropped. Differentiable in ``values``."""
    lay = layout.to(values.device)
    nq, nk, bm, bk = lay.n_qblocks, lay.n_kblocks, lay.block_m, lay.block_n
    _, r, c, _ = lay._coo()
    v = values if dtype is None else values.to(dtype)
    grid = v.new_zeros(nq * nk, bm, bk).index_put((r * nk + c,), v)
    return grid.reshape(nq, nk, bm, bk).transpose(1, 2).reshape(nq * bm, nk * bk)[:lay.seq_q, :lay.seq_k]


def bsr_matmul_reference(values: torch.Tensor, layout, b: torch.Tensor, *, transpose: bool = False,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``A @ b`` (or ``Aᵀ @ b``) in ``dtype`` with A the block-sparse matrix (values, layout)."""
    a = bsr_to_dense(values, layout, dtype)
    return (a.t() if transpose else a) @ b.to(dtype)


def sampled_matmul_reference(a: torch.Tensor, b: torch.Tensor, layout,
                             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The blocks ``[nnz, bm, bn]`` of ``a @ b`` that the one-head ``layout`` over ``(M, N)`` lists, in ``dtype``;
    zero past the matrix edge."""
    lay = layout.to(a.device)
    nq, nk, bm, bn = lay.n_qblocks, lay.n_kblocks, lay.block_m, lay.block_n
    c = a.to(dtype) @ b.to(dtype)
    c = torch.nn.functional.pad(c, (0, nk * bn - c.shape[1], 0, nq * bm - c.shape[0]))
    _, r, col, _ = lay._coo()
    return c.reshape(nq, bm, nk, bn).transpose(1, 2)[r, col]
