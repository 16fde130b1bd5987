"""Block-sparse GEMM: ``bsr_matmul`` (DSD: sparse A times dense B, or Aᵀ·B) and ``sampled_matmul`` (SDD: the
blocks of a dense product that a layout lists), as torch custom ops with fakes and autograd.

Ops (``torch.ops.blackwell_sparsek.*``); a sparse operand is passed as its layout's ``row_ptr``, ``col_idx``,
``block_kind`` + ``geom = [rows, cols, block_m, block_n, nnz]`` and its values:

``bsr_mm``      out = alpha · op(A) · b (+ bias), a new tensor; op(A) = A or Aᵀ (``transpose``). Differentiable:
                dA = alpha · SDD(dC, bᵀ) on A's layout (transposed: SDD(b, dCᵀ)), db = alpha · Aᵀ·dC (A·dC).
``bsr_mm_out``  the same into ``out`` with ``+ beta · out`` (mutates out; no autograd).
``sdd``         values [nnz, bm, bn] of alpha · (a · b) on a layout over (M, N). Differentiable:
                da = alpha · S·bᵀ (a DSD), db = alpha · (Sᵀ·a)ᵀ (the transposed DSD).

On CUDA tensors the kernels of ``_gemm_cuda`` run (family ``bsr_gemm``); elsewhere, or when nvcc is missing (with
a one-time warning), the float64 reference of ``blackwell_sparsek.reference``, after the very same
checks (``_gemm_checks``). A raw op call rebuilds (and so validates) the layout from its tensors unless they are
the tensors of a layout the public API handed to it recently.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Optional

import torch

from .. import _env, _trusted
from ..errors import InputError, LayoutError, ToolchainError
from ..matrix import BlockSparseMatrix
from . import _gemm_checks as chk

__all__ = ["bsr_matmul", "sampled_matmul"]

# -- layouts of raw op calls -------------------------------------------------------------------------------------

_RECENT: "OrderedDict[int, Any]" = OrderedDict()
_RECENT_MAX = 64


def _remember(lay) -> None:
    """Let the ops find ``lay`` from its own tensors (strong reference; the 64 most recent layouts)."""
    _RECENT[id(lay.row_ptr)] = lay
    _RECENT.move_to_end(id(lay.row_ptr))
    while len(_RECENT) > _RECENT_MAX:
        _RECENT.popitem(last=False)


def _geom(lay) -> list[int]:
    return [lay.seq_q, lay.seq_k, lay.block_m, lay.block_n, lay.nnz]


def _op_layout(row_ptr, col_idx, block_kind, geom, device):
    """The layout behind a raw op call: a known layout whose own (unmodified) tensors these are, else one built
    from them by the validating constructor (one host sync; then remembered)."""
    chk.check_index_tensors(row_ptr, col_idx, block_kind, geom, device)
    lay = _RECENT.get(id(row_ptr))
    if (lay is None or lay.col_idx is not col_idx or lay.block_kind is not block_kind or _geom(lay) != list(geom)
            or not all(_trusted.is_marked(t) for t in (row_ptr, col_idx, block_kind))):
        from ..layout import BlockSparseLayout
        lay = BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=geom[0], seq_k=geom[1], block_m=geom[2],
                                block_n=geom[3])
        if lay.nnz != geom[4]:
            raise LayoutError(f"geom says nnz={geom[4]} but row_ptr lists {lay.nnz} blocks; pass the layout's nnz")
        _remember(lay)
    return lay


# -- the kernels, or the reference ---------------------------------------------------------------------------------

_warned = False


def _fallback_warning(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"blackwell_sparsek: {reason}; bsr_matmul/sampled_matmul run the (slow, dense float64) "
                      f"reference instead", RuntimeWarning, stacklevel=4)


_KERNEL_CAPABILITY = (9, 0)   # the kernels are built for sm_90a (H100/H200)


def _kernel(t: torch.Tensor):
    """The kernel module for tensors on t's device, or None (the reference runs; off the CPU with a warning)."""
    if not t.is_cuda:
        return None
    from . import _gemm_cuda as mod
    from .dispatch import device_facts
    cap = tuple(device_facts(t.device.index).compute_capability)
    if cap != _KERNEL_CAPABILITY:
        _fallback_warning(f"the GEMM kernels run on sm_90 (H100/H200), this device is sm_{cap[0]}{cap[1]}")
        return None
    return mod


def _dsd(values, lay, b, out, transpose: bool, alpha: float, beta: float, bias) -> None:
    """out = alpha · op(A)·b + beta · out (+ bias), all arguments checked."""
    mod = _kernel(values)
    if mod is not None:
        if beta == 0.0 and _env.flag("BSK_POISON"):
            out.fill_(float("nan"))
        try:
            mod.dsd(values, lay, b, out, transpose=transpose, alpha=alpha, beta=beta, bias=bias)
            return
        except ToolchainError as e:
            _fallback_warning(f"the GEMM kernel cannot be built ({str(e).splitlines()[0]})")
    from ..reference import bsr_matmul_reference
    with torch.no_grad():
        ref = bsr_matmul_reference(values, lay, b, transpose=transpose) * alpha
        if beta != 0.0:
            ref += beta * out.double()
        if bias is not None:
            ref += bias.double()
        out.copy_(ref)


def _sdd(a, b, lay, out_values, alpha: float) -> None:
    """out_values = alpha · (a·b) on lay's blocks, all arguments checked."""
    mod = _kernel(a)
    if mod is not None:
        if _env.flag("BSK_POISON"):
            out_values.fill_(float("nan"))
        try:
            mod.sdd(a, b, lay, out_values, alpha=alpha)
            return
        except ToolchainError as e:
            _fallback_warning(f"the GEMM kernel cannot be built ({str(e).splitlines()[0]})")
    from ..reference import sampled_matmul_reference
    with torch.no_grad():
        out_values.copy_(sampled_matmul_reference(a, b, lay) * alpha)


# -- the custom ops ------------------------------------------------------------------------------------------------

def _out_rows(geom, transpose: bool) -> int:
    return geom[1] if transpose else geom[0]


@torch.library.custom_op("blackwell_sparsek::bsr_mm", mutates_args=())
def _bsr_mm(values: torch.Tensor, row_ptr: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
            b: torch.Tensor, bias: Optional[torch.Tensor], geom: list[int], alpha: float, transpose: bool,
            out_dtype: torch.dtype) -> torch.Tensor:
    """alpha · op(A)·b (+ bias) as a new [rows, N] tensor in out_dtype; A = (values, layout tensors, geom)."""
    lay = _op_layout(row_ptr, col_idx, block_kind, geom, values.device)
    alpha, _, out_dtype = chk.check_matmul(values, lay, b, transpose=transpose, out_dtype=out_dtype, alpha=alpha,
                                           beta=0.0, out=None, bias=bias)
    out = torch.empty(_out_rows(geom, transpose), b.shape[1], dtype=out_dtype, device=b.device)
    _dsd(values, lay, b, out, transpose, alpha, 0.0, bias)
    return out


@_bsr_mm.register_fake
def _bsr_mm_fake(values, row_ptr, col_idx, block_kind, b, bias, geom, alpha, transpose, out_dtype):
    return b.new_empty(_out_rows(geom, transpose), b.shape[1], dtype=out_dtype)


@torch.library.custom_op("blackwell_sparsek::bsr_mm_out", mutates_args=("out",))
def _bsr_mm_out(values: torch.Tensor, row_ptr: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
                b: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor], geom: list[int], alpha: float,
                beta: float, transpose: bool) -> None:
    """out = alpha · op(A)·b + beta · out (+ bias), in place."""
    lay = _op_layout(row_ptr, col_idx, block_kind, geom, values.device)
    alpha, beta, _ = chk.check_matmul(values, lay, b, transpose=transpose, out_dtype=None, alpha=alpha,
                                      beta=beta, out=out, bias=bias)
    _dsd(values, lay, b, out, transpose, alpha, beta, bias)


@_bsr_mm_out.register_fake
def _bsr_mm_out_fake(values, row_ptr, col_idx, block_kind, b, out, bias, geom, alpha, beta, transpose):
    return None


@torch.library.custom_op("blackwell_sparsek::sdd", mutates_args=())
def _sdd_op(a: torch.Tensor, b: torch.Tensor, row_ptr: torch.Tensor, col_idx: torch.Tensor,
            block_kind: torch.Tensor, geom: list[int], alpha: float, out_dtype: torch.dtype) -> torch.Tensor:
    """alpha · (a·b) on the blocks of the layout (tensors + geom over (M, N)): values [nnz, bm, bn]."""
    lay = _op_layout(row_ptr, col_idx, block_kind, geom, a.device)
    alpha, out_dtype = chk.check_sampled(a, b, lay, alpha=alpha, out_dtype=out_dtype)
    vals = torch.empty(lay.nnz, lay.block_m, lay.block_n, dtype=out_dtype, device=a.device)
    _sdd(a, b, lay, vals, alpha)
    return vals


@_sdd_op.register_fake
def _sdd_fake(a, b, row_ptr, col_idx, block_kind, geom, alpha, out_dtype):
    return a.new_empty(geom[4], geom[2], geom[3], dtype=out_dtype)


# -- autograd ------------------------------------------------------------------------------------------------------

def _bsr_mm_setup(ctx, inputs, output) -> None:
    values, row_ptr, col_idx, block_kind, b, bias, geom, alpha, transpose, _ = inputs
    ctx.save_for_backward(values, row_ptr, col_idx, block_kind, b)
    ctx.geom, ctx.alpha, ctx.transpose = list(geom), alpha, transpose
    ctx.bias_dtype = None if bias is None else bias.dtype


def _bsr_mm_backward(ctx, g):
    values, row_ptr, col_idx, block_kind, b = ctx.saved_tensors
    idx, geom, alpha = (row_ptr, col_idx, block_kind), ctx.geom, ctx.alpha
    g16 = g.to(values.dtype).contiguous()
    dv = db = dbias = None
    if ctx.needs_input_grad[0]:
        if ctx.transpose:   # out = Aᵀ·b: dA = b·dCᵀ sampled on A
            dv = _sdd_op(b, g16.t().contiguous(), *idx, geom, alpha, values.dtype)
        else:               # out = A·b: dA = dC·bᵀ sampled on A
            dv = _sdd_op(g16, b.t().contiguous(), *idx, geom, alpha, values.dtype)
    if ctx.needs_input_grad[4]:
        db = _bsr_mm(values, *idx, g16, None, geom, alpha, not ctx.transpose, b.dtype)
    if ctx.needs_input_grad[5]:
        dbias = g.sum(0).to(ctx.bias_dtype)
    return dv, None, None, None, db, dbias, None, None, None, None


_bsr_mm.register_autograd(_bsr_mm_backward, setup_context=_bsr_mm_setup)


def _sdd_setup(ctx, inputs, output) -> None:
    a, b, row_ptr, col_idx, block_kind, geom, alpha, _ = inputs
    ctx.save_for_backward(a, b, row_ptr, col_idx, block_kind)
    ctx.geom, ctx.alpha = list(geom), alpha


def _sdd_backward(ctx, g):
    a, b, row_ptr, col_idx, block_kind = ctx.saved_tensors
    idx, geom, alpha = (row_ptr, col_idx, block_kind), ctx.geom, ctx.alpha
    g16 = g.to(a.dtype).contiguous()
    da = db = None
    if ctx.needs_input_grad[0]:   # da = S·bᵀ
        da = _bsr_mm(g16, *idx, b.t().contiguous(), None, geom, alpha, False, a.dtype)
    if ctx.needs_input_grad[1]:   # db = aᵀ·S = (Sᵀ·a)ᵀ
        db = _bsr_mm(g16, *idx, a, None, geom, alpha, True, b.dtype).t()
    return da, db, None, None, None, None, None, None


_sdd_op.register_autograd(_sdd_backward, setup_context=_sdd_setup)


# -- public API ----------------------------------------------------------------------------------------------------

def _as_matrix(a: Any) -> BlockSparseMatrix:
    if isinstance(a, BlockSparseMatrix):
        return a
    if isinstance(a, torch.Tensor) and a.layout == torch.sparse_bsr:
        if a.requires_grad:
            raise InputError("gradients through a torch.sparse_bsr operand are not supported: use "
                             "BlockSparseMatrix.from_torch(a) and make its values the parameter")
        return BlockSparseMatrix.from_torch(a)
    raise InputError(f"a must be a blackwell_sparsek.BlockSparseMatrix or a 2-D torch.sparse_bsr tensor, got "
                     f"{type(a).__name__}{'' if not isinstance(a, torch.Tensor) else ' with layout ' + str(a.layout)}"
                     "; build one with BlockSparseMatrix.from_dense(x, block=128)")


def _overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two contiguous tensors (checked so before) have bytes in common."""
    x0, y0 = x.data_ptr(), y.data_ptr()
    return x0 < y0 + y.numel() * y.element_size() and y0 < x0 + x.numel() * x.element_size()


def _direct_ok(*tensors) -> bool:
    """An eager call may skip the dispatcher (its arguments are checked and the layout is known) when it would only
    forward to the implementation: plain tensors, no dispatch or function mode, nothing that needs autograd."""
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors if t is not None):
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def bsr_matmul(a: Any, b: torch.Tensor, *, out_dtype: torch.dtype | None = None, alpha: float = 1.0,
               beta: float = 0.0, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               transpose_a: bool = False) -> torch.Tensor:
    """``alpha · A @ b + beta · out + bias`` with A block-sparse (a ``BlockSparseMatrix`` or a 2-D
    ``torch.sparse_bsr`` tensor) and b dense ``[K, N]``; ``transpose_a`` computes ``Aᵀ @ b`` with b ``[M, N]``.

    fp16/bf16 operands of one dtype; the result in ``out_dtype`` (fp16, bf16 or fp32; default: a's dtype, or
    out's); ``bias [N]`` in the result's dtype; ``beta != 0`` needs ``out=`` (written in place and returned; no
    gradients then). Blocks 64x64 or 128x128; K and N multiples of 8 (16-byte rows); M free. Gradients flow to
    ``a.values``, ``b`` and ``bias``. Every argument is checked first, on the CPU exactly as on the GPU.
    """
    a = _as_matrix(a)
    values, lay = a.values, a.layout
    alpha, beta, out_dtype = chk.check_matmul(values, lay, b, transpose=transpose_a, out_dtype=out_dtype,
                                              alpha=alpha, beta=beta, out=out, bias=bias)
    if not torch.compiler.is_compiling():
        _remember(lay)
        if out is not None:
            for name, t in (("b", b), ("a.values", values)) + ((("bias", bias),) if bias is not None else ()):
                if _overlap(out, t):
                    raise InputError(f"out shares memory with {name}; pass a separate output tensor")
    geom = _geom(lay)
    if out is not None:
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (values, b, bias)):
            raise InputError("out= is for inference and does not record gradients; drop out= (or run under "
                             "torch.no_grad())")
        if _direct_ok(values, b, out, bias):
            _dsd(values, lay, b, out, transpose_a, alpha, beta, bias)
        else:
            _bsr_mm_out(values, lay.row_ptr, lay.col_idx, lay.block_kind, b, out, bias, geom, alpha, beta,
                        transpose_a)
        return out
    if _direct_ok(values, b, bias):
        res = torch.empty(_out_rows(geom, transpose_a), b.shape[1], dtype=out_dtype, device=b.device)
        _dsd(values, lay, b, res, transpose_a, alpha, 0.0, bias)
        return res
    return _bsr_mm(values, lay.row_ptr, lay.col_idx, lay.block_kind, b, bias, geom, alpha, transpose_a, out_dtype)


def sampled_matmul(a: torch.Tensor, b: torch.Tensor, layout: Any, *, alpha: float = 1.0,
                   out_dtype: torch.dtype | None = None) -> BlockSparseMatrix:
    """The blocks of ``alpha · a @ b`` that ``layout`` lists (a ``BlockSparseLayout`` over ``(M, N)``, or a
    ``BlockSparseMatrix`` whose layout is taken), as a ``BlockSparseMatrix``. a ``[M, K]``, b ``[K, N]`` dense
    fp16/bf16 of one dtype; values in ``out_dtype`` (default a's). Differentiable in a and b."""
    if isinstance(layout, BlockSparseMatrix):
        layout = layout.layout
    if not torch.compiler.is_compiling() and isinstance(a, torch.Tensor):
        from ..matrix import check_matrix_layout
        check_matrix_layout(layout)
        layout = layout.to(a.device)
    alpha, out_dtype = chk.check_sampled(a, b, layout, alpha=alpha, out_dtype=out_dtype)
    if _direct_ok(a, b):
        _remember(layout)
        vals = torch.empty(layout.nnz, layout.block_m, layout.block_n, dtype=out_dtype, device=a.device)
        _sdd(a, b, layout, vals, alpha)
    else:
        if not torch.compiler.is_compiling():
            _remember(layout)
        vals = _sdd_op(a, b, layout.row_ptr, layout.col_idx, layout.block_kind, _geom(layout), alpha, out_dtype)
    return BlockSparseMatrix(vals, layout)
