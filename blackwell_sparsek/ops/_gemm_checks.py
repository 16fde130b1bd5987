"""Argument checks of the block-sparse GEMM ops (``ops/gemm.py``): every bad input raises a typed error naming the
fix, before anything runs. The CPU reference path and the CUDA kernels see exactly the same checks. Host-side only
(shapes, dtypes, devices, strides, layout facts known on the host): nothing here syncs a device, so the checks also
run while torch.compile traces.

The rules (one place for each fact):

- operands fp16 or bf16, all of one dtype; outputs in the operands' dtype or fp32; bias in the output dtype,
  ``[N]``;
- every size (M, N, K, nnz · block side) below 2^31 - 256 (int32 addressing in the kernels);
- dense operands 2-D, row-major contiguous (strides ``(cols, 1)``), on one CUDA device or all on the CPU, with rows
  of a multiple of 16 bytes at a 16-byte aligned start (TMA): the inner dimension K and N multiples of 8 for 16-bit
  data (M, the row count, is free);
- block shapes in ``BLOCK_SHAPES``; layouts with one head and no element rule (``matrix.check_matrix_layout``),
  sized ``seq_q x seq_k`` = the sparse operand's rows x columns;
- ``values [nnz, block_m, block_n]`` contiguous, ``nnz`` = the layout's listed blocks;
- ``alpha``/``beta`` finite; ``beta != 0`` needs ``out`` (it scales out's previous contents).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import InputError, LayoutError
from ..matrix import check_matrix_layout

IN_DTYPES = (torch.float16, torch.bfloat16)
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_SHAPES = ((64, 64), (128, 128))
ROW_ALIGN_BYTES = 16
INT_LIMIT = 2**31 - 1 - 256   # the kernels address rows, columns and value blocks in int32 (tiles past the end)


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_scalar(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        raise InputError(f"{name} must be a finite float, got {x!r}")
    return float(x)


def check_out_dtype(dt: Any, in_dtype: torch.dtype, name: str = "out_dtype") -> torch.dtype:
    """The result dtype: the operands' own or float32."""
    if dt not in OUT_DTYPES:
        raise InputError(f"{name} must be one of {_names(OUT_DTYPES)}, got {dt!r}")
    if dt not in (in_dtype, torch.float32):
        raise InputError(f"{name} is {dt} but the operands are {in_dtype}; the kernels write the operands' dtype or "
                         f"float32: pass {in_dtype} or torch.float32")
    return dt


def check_sizes(*sizes: int, nnz: int = 0, block: int = 0) -> None:
    if max(sizes) > INT_LIMIT or nnz * block > INT_LIMIT:
        raise InputError(f"sizes {sizes} (nnz {nnz} x block {block}) reach 2^31: the kernels address rows, columns "
                         "and value blocks in int32; split the product into smaller calls")


def check_block_shape(bm: int, bn: int, what: str = "layout") -> None:
    if (bm, bn) not in BLOCK_SHAPES:
        shapes = ", ".join(f"{a}x{b}" for a, b in BLOCK_SHAPES)
        raise LayoutError(f"{what} has {bm}x{bn} blocks; the GEMM kernels take {shapes}: rebuild the layout "
                          f"(or BlockSparseMatrix.from_dense(x, block=128)) with one of those")


def check_dense(t: Any, name: str, *, dtypes=IN_DTYPES, shape: tuple[int, int] | None = None,
                dims: str = "[rows, cols]", device: torch.device | None = None, align: bool = True) -> None:
    """A dense 2-D operand: type, dtype, shape, device, row-major contiguity, TMA row alignment."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise InputError(f"{name} must be a dense tensor, got {t.layout}; pass {name}.to_dense()")
    if t.dtype not in dtypes:
        raise InputError(f"{name} must be {_names(dtypes)}, got {t.dtype}; pass {name}.to(torch.float16) "
                         "(or bfloat16)")
    if t.dim() != 2:
        raise InputError(f"{name} must be 2-D {dims}, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise InputError(f"{name} must be {dims} = {list(shape)}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise InputError(f"{name} is on {t.device} but the other operands are on {device}; move it there")
    rows, cols = t.shape
    if t.numel() and (t.stride(1) != 1 or (rows > 1 and t.stride(0) != cols)):
        raise InputError(f"{name} must be row-major contiguous (strides ({cols}, 1)), got strides {t.stride()}; "
                         f"pass {name}.contiguous()")
    if align:
        el = t.element_size()
        if (cols * el) % ROW_ALIGN_BYTES:
            raise InputError(f"{name} has rows of {cols} x {el} bytes; the kernels load rows with TMA, which needs a "
                             f"multiple of {ROW_ALIGN_BYTES} bytes: pad {name}'s last dimension to a multiple of "
                             f"{ROW_ALIGN_BYTES // el} (zeros)")
        # (the start is checked eagerly and inside the ops; dynamo cannot trace storage_offset)
        if not torch.compiler.is_compiling() and (t.storage_offset() * el) % ROW_ALIGN_BYTES:
            raise InputError(f"{name} starts {t.storage_offset() * el} bytes into its storage; TMA needs a "
                             f"{ROW_ALIGN_BYTES}-byte aligned start: pass {name}.clone()")


def check_layout(layout: Any, rows: int, cols: int, what: str, device: torch.device | None = None) -> None:
    """A matrix layout over ``rows x cols`` with a supported block shape (and on ``device`` when given)."""
    check_matrix_layout(layout, what)
    check_block_shape(layout.block_m, layout.block_n, what)
    if (layout.seq_q, layout.seq_k) != (rows, cols):
        raise LayoutError(f"{what} covers {layout.seq_q} x {layout.seq_k} (seq_q x seq_k) but the product needs "
                          f"{rows} x {cols}; build the layout for that shape")
    if device is not None and layout.device != device:
        raise LayoutError(f"{what} is on {layout.device}, the tensors on {device}; pass layout.to({str(device)!r})")


def check_values(values: Any, layout: Any) -> None:
    """Block values of a BlockSparseMatrix on ``layout``: dtype, shape, contiguity, device."""
    if not isinstance(values, torch.Tensor):
        raise InputError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if values.dtype not in IN_DTYPES:
        raise InputError(f"the sparse operand's values must be {_names(IN_DTYPES)}, got {values.dtype}; "
                         "pass a.to(dtype=torch.float16) (or bfloat16)")
    want = (layout.nnz, layout.block_m, layout.block_n)
    if tuple(values.shape) != want:
        raise InputError(f"values must be [nnz, block_m, block_n] = {list(want)}, got {list(values.shape)}")
    if not values.is_contiguous():
        raise InputError("values must be contiguous; pass values.contiguous()")
    if values.device != layout.device:
        raise LayoutError(f"the layout is on {layout.device}, values on {values.device}; pass "
                          f"layout.to({str(values.device)!r})")


def check_matmul(values: torch.Tensor, layout: Any, b: Any, *, transpose: bool, out_dtype: Any, alpha: Any,
                 beta: Any, out: Any, bias: Any) -> tuple[float, float, torch.dtype]:
    """Everything ``bsr_matmul`` (and the ``bsr_mm`` / ``bsr_mm_out`` ops) needs; returns (alpha, beta, out_dtype).
    A is ``[M, K]`` (values on layout); ``transpose`` computes ``Aᵀ·b``."""
    check_layout(layout, layout.seq_q, layout.seq_k, "a.layout")
    check_values(values, layout)
    m, k = layout.seq_q, layout.seq_k
    if not isinstance(transpose, bool):
        raise InputError(f"transpose_a must be a bool, got {transpose!r}")
    inner, rows = (m, k) if transpose else (k, m)
    if k % (ROW_ALIGN_BYTES // values.element_size()):
        raise InputError(f"a has K = {k} columns; the kernels (and the gradient of a, which reads bᵀ rows of K) "
                         f"need K to be a multiple of {ROW_ALIGN_BYTES // values.element_size()}: pad a's columns "
                         "and b's rows with zeros")
    if not isinstance(b, torch.Tensor):
        raise InputError(f"b must be a torch.Tensor, got {type(b).__name__}")
    n = b.shape[-1] if b.dim() == 2 else -1
    check_dense(b, "b", dtypes=(values.dtype,) if b.dtype in IN_DTYPES else IN_DTYPES,
                shape=(inner, n) if b.dim() == 2 else None, dims="[M, N] (transpose_a)" if transpose else "[K, N]",
                device=values.device)
    check_sizes(m, k, n, nnz=layout.nnz, block=max(layout.block_m, layout.block_n))
    alpha = check_scalar(alpha, "alpha")
    beta = check_scalar(beta, "beta")
    if out is None:
        if beta != 0.0:
            raise InputError(f"beta={beta} scales out's previous contents: pass out= (or beta=0)")
        out_dtype = values.dtype if out_dtype is None else check_out_dtype(out_dtype, values.dtype)
    else:
        if out_dtype is not None and isinstance(out, torch.Tensor) and out.dtype != out_dtype:
            raise InputError(f"out is {out.dtype} but out_dtype={out_dtype}; pass one of them, or make them agree")
        check_dense(out, "out", dtypes=OUT_DTYPES, shape=(rows, n), dims="[M, N]" if not transpose else "[K, N]",
                    device=values.device)
        out_dtype = check_out_dtype(out.dtype, values.dtype, "out's dtype")
        if out.requires_grad:
            raise InputError("out= is for inference and does not record gradients; drop out= to differentiate")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.layout != torch.strided or bias.dim() != 1:
            raise InputError(f"bias must be a dense 1-D tensor [N] = [{n}], got "
                             f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
        if bias.dtype != out_dtype:
            raise InputError(f"bias must be in the output dtype {out_dtype}, got {bias.dtype}; pass "
                             f"bias.to({out_dtype})")
        if bias.shape[0] != n:
            raise InputError(f"bias must be [N] = [{n}], got {list(bias.shape)}")
        if bias.device != values.device:
            raise InputError(f"bias is on {bias.device}, the operands on {values.device}; move it there")
        if bias.stride(0) != 1 or (not torch.compiler.is_compiling()
                                   and (bias.storage_offset() * bias.element_size()) % ROW_ALIGN_BYTES):
            raise InputError("bias must be contiguous with a 16-byte aligned start; pass bias.contiguous().clone()")
    return alpha, beta, out_dtype


def check_sampled(a: Any, b: Any, layout: Any, *, alpha: Any, out_dtype: Any) -> tuple[float, torch.dtype]:
    """Everything ``sampled_matmul`` (and the ``sdd`` op) needs: ``a [M, K] @ b [K, N]`` sampled on ``layout``
    over ``(M, N)``; returns (alpha, out_dtype)."""
    check_dense(a, "a", dims="[M, K]")
    m, k = a.shape
    n = b.shape[-1] if isinstance(b, torch.Tensor) and b.dim() == 2 else -1
    check_dense(b, "b", dtypes=(a.dtype,) if getattr(b, "dtype", None) in IN_DTYPES else IN_DTYPES,
                shape=(k, n) if n >= 0 else None, dims="[K, N]", device=a.device)
    check_layout(layout, m, n, "layout", device=a.device)
    check_sizes(m, k, n, nnz=layout.nnz, block=max(layout.block_m, layout.block_n))
    alpha = check_scalar(alpha, "alpha")
    out_dtype = a.dtype if out_dtype is None else check_out_dtype(out_dtype, a.dtype)
    return alpha, out_dtype


def check_index_tensors(row_ptr: Any, col_idx: Any, block_kind: Any, geom: Any, device: torch.device) -> None:
    """The raw ops' index arguments (a layout's ``row_ptr``, ``col_idx``, ``block_kind`` and
    ``geom = [rows, cols, block_m, block_n, nnz]``): types, dtypes, one head, shapes, device. Their values are
    validated by building the layout from them (ops/gemm.py), unless they are a known layout's own tensors."""
    if not isinstance(geom, (list, tuple)) or len(geom) != 5 or not all(isinstance(g, int) for g in geom) \
            or min(geom[:4]) < 1 or geom[4] < 0:
        raise InputError(f"geom must be [rows, cols, block_m, block_n, nnz] (ints, sizes >= 1), got {geom!r}")
    rows, cols, bm, bn, _ = geom
    nq = -(-rows // bm)
    for name, t, dt in (("row_ptr", row_ptr, torch.int32), ("col_idx", col_idx, torch.int32),
                        ("block_kind", block_kind, torch.uint8)):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or t.dim() != 2 or t.shape[0] != 1:
            raise LayoutError(f"{name} must be a {dt} tensor [1, ...] of a one-head layout, got "
                              f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}; pass "
                              f"layout.{name}")
        if t.device != device:
            raise LayoutError(f"{name} is on {t.device}, the operands on {device}; pass layout.to(device)'s tensors")
    if row_ptr.shape[1] != nq + 1:
        raise LayoutError(f"row_ptr must be [1, ceil({rows}/{bm}) + 1] = [1, {nq + 1}], got {list(row_ptr.shape)}")
    if col_idx.shape != block_kind.shape or col_idx.shape[1] != max(1, geom[4]):
        raise LayoutError(f"col_idx and block_kind must both be [1, max(1, nnz)] = [1, {max(1, geom[4])}], got "
                          f"{list(col_idx.shape)} and {list(block_kind.shape)}")
