"""Backward of block-sparse attention: the ``blackwell_sparsek::attn_bwd`` custom op and the autograd formula of
``blackwell_sparsek::attn_fwd``.

Importing this module registers both (``torch.library.register_autograd`` on the forward op). The forward op's
arguments are all the backward gets of the layout (col_idx, block_kind, row_sched, meta), so the transposed view
the kernel walks (per key block, the query blocks that list it) is derived from them (``attention_bwd_view``), on
their device, with torch ops only (no host sync), and cached by the identity of those tensors (a layout keeps its
device tensors, so training steps reuse one view).

The backward kernel (family ``attn_bwd``, ``blackwell_sparsek.families.attn_bwd``) does everything in one launcher
call on torch's current stream: prep (delta = rowsum(dO * O) - g_lse in fp32, LSE2 = LSE * log2(e), +inf on rows
with no visible key, and the fp32 dQ accumulator zeroed, or the deterministic kernel's turn counters), the main
kernel, and the dQ convert. Under GQA the
transposed view stacks the query heads that share a K/V head, so the kernel sums their dK/dV in registers and
writes them per K/V head. On tensors that are not on a CUDA device the op computes the same formulas
densely in float64 (tests; the public API's CPU fallback is the reference's own autograd).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import attention as _fwd  # noqa: F401  (defines blackwell_sparsek::attn_fwd, whose autograd this registers)
from ..errors import InputError, InvalidConfigError
from ..families import attn_bwd as _family
from ..families.attn_bwd import AttnBwdConfig
from ..families.attn_fwd import AttentionConfig
from ..jit.spec import DType, KernelConfig
from ._checks import check_backward_limits
from .attention_bwd_view import _transposed_cached, element_mask, transposed_view

_DTYPES = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}


# -- configs ---------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def bwd_config_json(fwd_config_json: str, deterministic: bool = False) -> str:
    """The backward kernel's config (JSON) for the forward config that produced O and LSE."""
    fwd = KernelConfig.from_json(fwd_config_json)
    if not isinstance(fwd, AttentionConfig):
        raise InvalidConfigError(f"attention backward needs an attn_fwd config, got family {fwd.family!r}")
    return _family.config_for(fwd.head_dim, fwd.dtype, fwd.block_m, fwd.block_n, deterministic).to_json()


@lru_cache(maxsize=None)
def _bwd_config(text: str) -> AttnBwdConfig:
    cfg = AttnBwdConfig.from_json(text)
    if not isinstance(cfg, AttnBwdConfig):
        raise InvalidConfigError(f"not an attn_bwd config: {text}")
    return cfg.validate()


@lru_cache(maxsize=None)
def _kernel_for(text: str):
    from ..jit.kernels import build
    return build(_bwd_config(text))


def _poison() -> bool:
    from .. import _env
    return _env.flag("BSK_POISON")


# -- the op --------------------------------------------------------------------------------------------------

# (batch, K/V head)s per group of the kernel's tile order: 0 = tile_group's choice; else the largest divisor of
# B * Hkv up to it. A module setting so a benchmark can compare values.
HEAD_GROUP = 0


def tile_group(bh: int, qdo_bytes: int, l2_bytes: int, want: int = 0, cap: int = 0) -> int:
    """(batch, K/V head)s per group of the backward's tile order (the launcher takes it as given): ``want`` > 0,
    else those whose Q and dO (read for every key block; all query heads of a K/V head: ``qdo_bytes``) fit in half
    of L2 (the forward's launcher applies the same rule to K/V); at most ``cap`` when given; the largest divisor
    of ``bh`` up to that."""
    g = want if want > 0 else (l2_bytes // 2) // max(1, qdo_bytes)
    g = max(1, min(bh, g, cap or bh))
    while bh % g:
        g -= 1
    return g


def _tma_ready(t: torch.Tensor) -> bool:
    es = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(t.stride(d) * es % 16 == 0 or t.shape[d] == 1 for d in range(3)))


def _check(q, k, v, o, lse, do, cfg: AttnBwdConfig) -> None:
    if q.dtype not in _DTYPES or not (q.dtype == k.dtype == v.dtype == o.dtype):
        raise InputError(f"q, k, v, o must share one dtype, float16 or bfloat16; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {o.dtype}")
    if _DTYPES[q.dtype] is not cfg.dtype or q.shape[-1] != cfg.head_dim:
        raise InvalidConfigError(f"{cfg.kernel_name} is for head_dim={cfg.head_dim}, {cfg.dtype.value}; the "
                                 f"inputs have head_dim={q.shape[-1]}, {q.dtype}")
    if do.shape != o.shape or lse.shape != o.shape[:3] or lse.dtype != torch.float32:
        raise InputError(f"grad_o {tuple(do.shape)} must match O {tuple(o.shape)} and LSE must be float32 "
                         f"{tuple(o.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}")


def _attn_bwd_cuda(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json,
                   trusted: bool = False):
    """``trusted``: q, k, v were checked by the eager forward and o is its output (TMA-ready, strides in range)."""
    cfg = _bwd_config(config_json)
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    if not _tma_ready(do):
        do = do.contiguous()
    for name, t in () if trusted else (("q", q), ("k", k), ("v", v), ("o", o)):
        if not _tma_ready(t):
            raise InputError(f"{name} strides {t.stride()} (or its address) are not 16-byte aligned for TMA")
    lse = lse.contiguous()
    glse = None if grad_lse is None else grad_lse.to(torch.float32).contiguous()
    det = cfg.deterministic
    kernel = _kernel_for(config_json)
    dev = q.device.index
    from . import dispatch
    dispatch.check_device(config_json, dev)  # arch and shared memory, once per (config, device)
    facts = dispatch.device_facts(dev)
    # deterministic: a wave of det_ranks must hold one key block of every head in the group
    cap = max(1, facts.sm_count // 2 // (cfg.tile_block_n // 128)) if det else 0
    group = tile_group(B * Hkv, 2 * H * Sq * D * q.element_size() // Hkv, facts.l2_bytes, HEAD_GROUP, cap)
    # GQA: the view stacks the query heads of each K/V head, so one CTA per key tile of a K/V head sums dK/dV over
    # its whole group in registers (dK/dV come out per K/V head; no per-query-head buffer, no second pass).
    t_q_idx, t_kind, t_sched, t_rank = _transposed_cached(col_idx, block_kind, row_sched, meta[2], Sq, cfg.block_m,
                                                          det, H // Hkv, cfg.block_n, facts.sm_count, group)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    work = _Workspace(B, H, Sq, D, det, q.device)
    if _poison():
        for t in (work.poisonable, dq, dk, dv):
            t.fill_(float("nan"))
    fields = _family.launch_args(q=q, k=k, v=v, o=o, do=do, lse=lse, glse=glse, lse2=work.ws[0], delta=work.ws[1],
                                 dq_acc=work.dq_acc, dq=dq, dk=dk, dv=dv, t_q_idx=t_q_idx, t_kind=t_kind,
                                 t_sched=t_sched, t_rank=t_rank if det else None, dq_sem=work.dq_sem,
                                 window_left=meta[0], window_right=meta[1], scale=scale,
                                 head_group=group)
    kernel.launch_on(kernel.Args(**fields), dev)  # torch's current stream on q's device
    return dq, dk, dv


class _Workspace:
    """One fp32 buffer for the LSE2 and delta rows (16-byte rows for their TMA loads), the dQ accumulator and the
    deterministic turn counters (one per 64-query dQ tile); the launcher's prep kernel zeroes the last two."""

    def __init__(self, B: int, H: int, Sq: int, D: int, det: bool, device):
        sq_pad = (Sq + 3) // 4 * 4
        n_ws, n_acc = 2 * B * H * sq_pad, B * H * Sq * D
        n_sem = B * H * ((Sq + 63) // 64) if det else 0
        self.buf = torch.empty(n_ws + n_acc + n_sem, dtype=torch.float32, device=device)
        self.ws = self.buf[:n_ws].view(2, B, H, sq_pad)
        self.dq_acc = self.buf[n_ws:n_ws + n_acc].view(B, H, Sq, D)
        self.dq_sem = self.buf[n_ws + n_acc:].view(torch.int32) if det else None
        self.poisonable = self.buf[:n_ws + n_acc]  # the turn counters stay as they are: prep must zero them


def _attn_bwd_dense(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json):
    """The kernel's formulas densely in float64 (reference.attention_backward_reference) on the element mask the
    op's layout arguments describe."""
    cfg = _bwd_config(config_json)
    mask = element_mask(col_idx.cpu(), block_kind.cpu(), row_sched.cpu(), meta, q.shape[2], k.shape[2], cfg.block_m,
                        cfg.block_n).to(q.device)
    from ..reference import attention_backward_reference
    return attention_backward_reference(q, k, v, o, lse, do, grad_lse, mask, scale)


@torch.library.custom_op("blackwell_sparsek::attn_bwd", mutates_args=())
def attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
             do: torch.Tensor, grad_lse: Optional[torch.Tensor], col_idx: torch.Tensor, block_kind: torch.Tensor,
             row_sched: torch.Tensor, meta: list[int], scale: float,
             config_json: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of blackwell_sparsek::attn_fwd. meta = [window_left, window_right, n_kblocks, rank_major] as the
    forward got it; config_json: the attn_bwd config (bwd_config_json of the forward's)."""
    return _attn_bwd_impl(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json)


def _attn_bwd_impl(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json,
                   trusted: bool = False):
    """attn_bwd's body: what the op runs, and what an eager backward calls without the dispatcher (``trusted``:
    the arguments of a forward sparse_attention checked, so only dO and the config are checked again)."""
    _check(q, k, v, o, lse, do, _bwd_config(config_json))
    if not trusted:
        check_backward_limits(q, k, v)
    if q.is_cuda:
        return _attn_bwd_cuda(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale,
                              config_json, trusted=trusted)
    return _attn_bwd_dense(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale,
                           config_json)


@attn_bwd.register_fake
def _attn_bwd_fake(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# -- autograd of the forward op ----------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output) -> None:
    q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, col_idx, block_kind, row_sched)
    ctx.meta = list(meta)
    ctx.scale = float(scale)
    ctx.config_json = config_json


def deterministic_from_meta(meta) -> bool:
    """The backward's mode: meta[4] when the forward got one (1 deterministic, 0 fast; -1 or absent: follow
    torch.use_deterministic_algorithms). The forward kernel reads meta[0:4] only."""
    if len(meta) > 4 and meta[4] >= 0:
        return bool(meta[4])
    return torch.are_deterministic_algorithms_enabled()


def _grads(ctx, grad_o, grad_lse, bwd=attn_bwd):
    """dQ, dK, dV of the saved forward through ``bwd`` (the attn_bwd op, or its body for an eager call); the
    deterministic kernel (bitwise-identical gradients run to run) when deterministic_from_meta says so."""
    q, k, v, o, lse, col_idx, block_kind, row_sched = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    det = deterministic_from_meta(ctx.meta)
    return bwd(q, k, v, o, lse, grad_o, grad_lse, col_idx, block_kind, row_sched, ctx.meta, ctx.scale,
               bwd_config_json(ctx.config_json, det))


def _backward(ctx, grad_o, grad_lse):
    return (*_grads(ctx, grad_o, grad_lse), None, None, None, None, None, None)


torch.library.register_autograd("blackwell_sparsek::attn_fwd", _backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """Forward and backward of an eager sparse_attention call that needs gradients, without the dispatcher: the
    op's autograd (which torch.compile, dispatch modes, subclasses and torch.func use) costs some hundred
    microseconds of host time a step, more than a short kernel. ``launch(q, k, v) -> (o, lse)`` runs the forward
    kernel on arguments sparse_attention has checked; the rest are the forward op's arguments (row_sched: the
    layout's row_schedule(), which the backward reads)."""

    @staticmethod
    def forward(ctx, q, k, v, launch, col_idx, block_kind, row_sched, meta, scale, config_json):
        o, lse = launch(q, k, v)
        ctx.set_materialize_grads(False)  # an unused LSE costs no zero-filled gradient
        _setup_context(ctx, (q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json), (o, lse))
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_o, grad_lse):
        return (*_grads(ctx, grad_o, grad_lse, partial(_attn_bwd_impl, trusted=True)), None, None, None, None, None,
                None, None)


__all__ = ["attn_bwd", "transposed_view", "element_mask", "bwd_config_json", "deterministic_from_meta"]
