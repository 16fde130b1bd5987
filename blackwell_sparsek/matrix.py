"""``BlockSparseMatrix``: a block-sparse matrix = block values + a ``BlockSparseLayout`` over its blocks.

The layout is the package's one BSR index structure (``blackwell_sparsek.layout``) used as a matrix layout: one
layout head, no element rule, ``seq_q = M`` rows, ``seq_k = K`` columns, blocks ``block_m x block_n``. ``values``
is ``[nnz, block_m, block_n]``, one block per listed entry in the layout's storage order (row-major over block
rows, ascending columns within a row: ``layout.col_idx[0]``). Where ``M`` or ``K`` is not a multiple of the block,
the last block row / column reaches past the matrix; those entries are zero (every constructor here and
``sampled_matmul`` write zeros there) and are never part of a product.

Conversions are exact: ``from_dense`` / ``to_dense``, ``from_torch`` / ``to_torch`` (``torch.sparse_bsr``, both
ways), ``t()`` (the transpose: the layout's cached ``transpose()`` and each block transposed).
"""
from __future__ import annotations

from typing import Any

import torch

from .errors import InputError, LayoutError

__all__ = ["BlockSparseMatrix"]


def _layout_cls():
    from .layout import BlockSparseLayout
    return BlockSparseLayout


def _block_pair(block: Any) -> tuple[int, int]:
    if isinstance(block, int) and not isinstance(block, bool):
        block = (block, block)
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
        raise InputError(f"block must be a positive int or a pair (block_m, block_n) of them, got {block!r}")
    return int(block[0]), int(block[1])


def check_matrix_layout(layout: Any, what: str = "layout") -> None:
    """A layout usable as a matrix layout: a BlockSparseLayout with one head and no element rule."""
    if not isinstance(layout, _layout_cls()):
        raise LayoutError(f"{what} must be a blackwell_sparsek.BlockSparseLayout, got {type(layout).__name__}; "
                          "build one with BlockSparseLayout.from_block_mask(mask, M, K, block_m, block_n)")
    if layout.num_heads != 1:
        raise LayoutError(f"{what} has {layout.num_heads} layout heads; a matrix layout has one: build it from a "
                          "2-D block mask [n_row_blocks, n_col_blocks]")
    if layout.has_rule:
        raise LayoutError(f"{what} has an element rule (window_left={layout.window_left}, window_right="
                          f"{layout.window_right}); a matrix layout lists whole blocks only: build it without "
                          "window_left/window_right")


class BlockSparseMatrix:
    """A block-sparse ``[M, K]`` matrix: ``values [nnz, block_m, block_n]`` + a one-head, rule-free layout.

    ``values`` may require grad (``bsr_matmul`` / ``sampled_matmul`` differentiate through it). The layout is
    immutable and shared; ``values`` is held as given (no copy), so it must be contiguous.
    """

    __slots__ = ("_values", "_layout")

    def __init__(self, values: torch.Tensor, layout: Any):
        check_matrix_layout(layout)
        if not isinstance(values, torch.Tensor):
            raise InputError(f"values must be a torch.Tensor, got {type(values).__name__}")
        want = (layout.nnz, layout.block_m, layout.block_n)
        if tuple(values.shape) != want:
            raise InputError(f"values must be [nnz, block_m, block_n] = {list(want)} for this layout, got "
                             f"{list(values.shape)}; one block per listed layout entry, in col_idx order")
        if values.device != layout.device:
            raise InputError(f"values are on {values.device} and the layout on {layout.device}; move one: "
                             f"BlockSparseMatrix(values, layout.to(values.device))")
        if not values.is_contiguous():
            raise InputError("values must be contiguous; pass values.contiguous()")
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_layout", layout)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"BlockSparseMatrix is immutable (cannot set {name!r}); build a new one")

    values = property(lambda self: self._values, doc="[nnz, block_m, block_n], col_idx order")
    layout = property(lambda self: self._layout, doc="the BlockSparseLayout (one head, no rule)")
    shape = property(lambda self: torch.Size((self._layout.seq_q, self._layout.seq_k)))
    dtype = property(lambda self: self._values.dtype)
    device = property(lambda self: self._values.device)
    block_size = property(lambda self: (self._layout.block_m, self._layout.block_n))
    nnz = property(lambda self: self._layout.nnz, doc="listed blocks")
    density = property(lambda self: self._layout.density, doc="listed blocks / all blocks")
    requires_grad = property(lambda self: self._values.requires_grad)

    def __repr__(self) -> str:
        m, k = self.shape
        return (f"BlockSparseMatrix(shape=({m}, {k}), block={self.block_size[0]}x{self.block_size[1]}, "
                f"nnz={self.nnz}, density={self.density:.2%}, dtype={self.dtype}, device={self.device})")

    def __matmul__(self, other: Any) -> torch.Tensor:
        from .ops.gemm import bsr_matmul
        return bsr_matmul(self, other)

    # -- constructors -------------------------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, x: torch.Tensor, block: Any = 128, *, mask: Any = None,
                   threshold: float | None = None) -> "BlockSparseMatrix":
        """The blocks of a dense 2-D ``x`` picked by ``mask`` (bool ``[ceil(M/bm), ceil(K/bk)]``), else those whose
        largest ``|x|`` exceeds ``threshold``, else (both None) every block with a nonzero. Values are ``x``'s
        blocks (zero past the matrix edge), in ``x``'s dtype and on its device; differentiable in ``x``."""
        bm, bk = _block_pair(block)
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise InputError(f"x must be a 2-D tensor [M, K], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.layout != torch.strided:
            raise InputError(f"x must be a dense (strided) tensor, got {x.layout}; for torch.sparse_bsr use "
                             "BlockSparseMatrix.from_torch")
        m, k = x.shape
        if m < 1 or k < 1:
            raise InputError(f"x must have at least one row and column, got {tuple(x.shape)}")
        nq, nk = -(-m // bm), -(-k // bk)
        padded = torch.nn.functional.pad(x, (0, nk * bk - k, 0, nq * bm - m))   # zeros past the edge
        blocks = padded.reshape(nq, bm, nk, bk).transpose(1, 2)                  # [nq, nk, bm, bk] view
        if mask is not None:
            if threshold is not None:
                raise InputError("pass mask or threshold, not both")
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (nq, nk):
                raise InputError(f"mask must be a bool tensor [ceil(M/{bm}), ceil(K/{bk})] = [{nq}, {nk}], got "
                                 f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
            mask = mask.to(x.device)
        else:
            mag = blocks.detach().abs().amax(dim=(2, 3))
            if threshold is None:
                mask = mag != 0
            else:
                if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
                    raise InputError(f"threshold must be a number >= 0, got {threshold!r}")
                mask = mag > threshold
        layout = _layout_cls().from_block_mask(mask, m, k, bm, bk)
        _, r, c, _ = layout._coo()
        return cls(blocks[r, c].contiguous(), layout)

    @classmethod
    def from_torch(cls, t: torch.Tensor) -> "BlockSparseMatrix":
        """From a 2-D ``torch.sparse_bsr`` tensor (no batch or dense dims), exactly: its blocks and values.
        Column indices may be unsorted within a row (they are sorted with their values); duplicates are refused."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.sparse_bsr:
            raise InputError(f"from_torch takes a torch.sparse_bsr tensor, got "
                             f"{t.layout if isinstance(t, torch.Tensor) else type(t).__name__}; make one with "
                             "x.to_sparse_bsr((bm, bk))")
        if t.dim() != 2 or t.values().dim() != 3:
            raise InputError(f"only 2-D sparse_bsr tensors without batch or dense dims are supported, got shape "
                             f"{tuple(t.shape)} with values {tuple(t.values().shape)}")
        crow, col, vals = t.crow_indices().long(), t.col_indices().long(), t.values()
        m, k = t.shape
        bm, bk = vals.shape[1:]
        nq, nk = m // bm, k // bk
        nnz = vals.shape[0]
        rows = torch.repeat_interleave(torch.arange(nq, device=crow.device), crow[1:] - crow[:-1])
        key = rows * nk + col
        order = torch.sort(key, stable=True).indices
        skey = key[order]
        if nnz > 1 and bool((skey[1:] == skey[:-1]).any()):
            raise LayoutError("the sparse_bsr tensor lists a block twice; coalesce it first, e.g. "
                              "t.to_dense().to_sparse_bsr(blocksize)")
        layout = _layout_cls().from_bsr(crow, col[order], m, k, bm, bk)
        return cls(vals[order].contiguous(), layout)

    # -- conversions ----------------------------------------------------------------------------------------------
    def to_torch(self) -> torch.Tensor:
        """As a ``torch.sparse_bsr`` tensor (same values, same order). torch needs M and K to be multiples of the
        block size."""
        m, k = self.shape
        bm, bk = self.block_size
        if m % bm or k % bk:
            raise InputError(f"torch.sparse_bsr needs the shape ({m}, {k}) to be a multiple of the block "
                             f"({bm}, {bk}); use to_dense(), or pad the matrix to whole blocks")
        lay = self._layout
        return torch.sparse_bsr_tensor(lay.row_ptr[0].long(), lay.col_idx[0, :lay.nnz].long(), self._values,
                                       size=(m, k), dtype=self.dtype, device=self.device,
                                       check_invariants=False)

    def to_dense(self) -> torch.Tensor:
        """The dense ``[M, K]`` matrix in ``values``' dtype (differentiable in ``values``)."""
        from .reference import bsr_to_dense
        return bsr_to_dense(self._values, self._layout)

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> "BlockSparseMatrix":
        """On ``device`` (the layout's cached device copy) and/or in ``dtype``."""
        dev = self.device if device is None else torch.device(device)
        vals = self._values.to(device=dev, dtype=dtype if dtype is not None else self.dtype)
        if vals is self._values:
            return self
        return BlockSparseMatrix(vals.contiguous(), self._layout.to(dev))

    def cuda(self) -> "BlockSparseMatrix":
        return self.to("cuda")

    def cpu(self) -> "BlockSparseMatrix":
        return self.to("cpu")

    def detach(self) -> "BlockSparseMatrix":
        return BlockSparseMatrix(self._values.detach(), self._layout)

    def requires_grad_(self, flag: bool = True) -> "BlockSparseMatrix":
        self._values.requires_grad_(flag)
        return self

    def t(self) -> "BlockSparseMatrix":
        """The transpose ``[K, M]``: the layout's (cached) ``transpose()`` and each block transposed; one gather
        and copy of the values (differentiable)."""
        lay = self._layout
        _, r, c, _ = lay._coo()
        order = torch.sort(c * lay.n_qblocks + r, stable=True).indices    # column-major = the transpose's order
        return BlockSparseMatrix(self._values[order].transpose(1, 2).contiguous(), lay.transpose())

    T = property(t)
