"""Block-sparse attention layouts: which (query block, key block) tiles a kernel visits, and how it masks them.

A :class:`BlockSparseLayout` is runtime data (DESIGN.md, convention 5): small index tensors handed to the CUDA kernel
as arguments, never template parameters, so a new mask never triggers a compile.

Storage (BSR / CSR over query-block rows)
-----------------------------------------
``Hl`` is the number of layout heads: 1 (one layout shared by every head) or ``H`` (one per head). Batch always
broadcasts. ``nq = ceil(seq_q / block_m)``, ``nk = ceil(seq_k / block_n)``.

``row_ptr``    int32 ``[Hl, nq + 1]``; ``row_ptr[h, 0] == 0``, non-decreasing. Row ``r`` of head ``h`` lists its key
               blocks at ``col_idx[h, row_ptr[h, r]:row_ptr[h, r + 1]]``.
``col_idx``    int32 ``[Hl, nnz_max]``, ``nnz_max = max(1, max_h row_ptr[h, -1])``; within a row sorted ascending,
               unique, in ``[0, nk)``; padding after ``row_ptr[h, -1]`` is 0.
``block_kind`` uint8, same shape as ``col_idx`` (padding 0), bit flags per listed block:
               ``FULL = 0`` (no element mask), ``BOUNDS = 1`` (the block reaches past ``seq_k``: mask ``k >= seq_k``),
               ``RULE = 2`` (apply the element rule below). ``3`` = both.

What the kernel reads
---------------------
Not ``row_ptr``: the kernel's tile scheduler reads ``row_schedule()``, int32 ``[Hl, nq, 4]``, one 16-byte entry per
query-block row in heaviest-first order ``(row, start, end, first)`` with ``first = column | kind << 24`` of the
row's first block, and then the row's blocks ``col_idx[h, start:end]`` and ``block_kind[h, start:end]``. The schedule
is derived from ``row_ptr`` on the layout's device and cached; on a CUDA device it is built as soon as the layout
is (never lazily inside a traced or captured region).

Element rule (``window_left``, ``window_right``; ``-1`` = unbounded), bottom-right aligned like FlashAttention: with
``q' = q + (seq_k - seq_q)``, element ``(q, k)`` is kept iff ``(window_left < 0 or k >= q' - window_left)`` and
``(window_right < 0 or k <= q' + window_right)``. Causal is ``(-1, 0)``; a causal sliding window of ``W`` keys is
``(W - 1, 0)``. The rule is applied only inside blocks whose RULE bit is set.

Invariants every constructor keeps (FlexAttention's full/partial split): RULE is set exactly on the listed blocks
the rule cuts through (keeps some but not all of their valid elements) among those the pattern subjects to the rule
(``global_local``'s global blocks are not: they are FULL), such blocks the rule masks entirely are not listed, and
BOUNDS is set exactly on the listed blocks of the last key column when ``seq_k % block_n != 0``.
``validate()`` checks the structural part of this (and that BOUNDS is exact, and that RULE is never set on a layout
without a rule).

Layouts are immutable: attributes are read-only and the tensors must not be mutated in place (they are shared with
cached device copies and derived layouts). Every transform returns a new layout.

The "diagonal block" of query-block row ``r`` (used by ``strided``, ``dilated`` and ``from_scores``) is the key block
holding the bottom-right aligned position of the row's last query:
``diag(r) = clamp((min((r + 1) * block_m, seq_q) - 1 + seq_k - seq_q) // block_n, 0, nk - 1)``.
"""
from __future__ import annotations

import dataclasses
import operator
import os
from typing import Any

import torch

from ._trusted import mark as _mark_checked
from .errors import InputError, LayoutError

__all__ = ["BlockSparseLayout", "BlockSparseCSC", "FULL", "BOUNDS", "RULE"]

FULL = 0
BOUNDS = 1
RULE = 2

# to_element_mask / plot refuse beyond this many elements: they are for tests, references and pictures.
_MAX_ELEMENT_MASK = 1 << 26  # 64M
_MAX_DENSE_BLOCKS = 1 << 26
# the row schedule packs a block column in 24 bits (column | kind << 24)
_MAX_SCHEDULE_KBLOCKS = 1 << 24
# device types on which the views a kernel reads are built with the layout (elsewhere lazily, on first use)
_EAGER_VIEW_DEVICES = ("cuda",)


# ----------------------------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _as_int(name: str, value: Any, minimum: int, err: type = LayoutError) -> int:
    if isinstance(value, bool):
        raise err(f"{name} must be an int, got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise err(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if v < minimum:
        raise err(f"{name} must be >= {minimum}, got {v}")
    return v


def _window(name: str, value: Any) -> int:
    return _as_int(name, value, -1)


def _normalize_device(device: Any) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _rule_desc(wl: int, wr: int) -> str:
    if wl < 0 and wr < 0:
        return "none"
    if wl < 0 and wr == 0:
        return "causal"
    if wr == 0:
        return f"causal window {wl + 1} keys (left={wl}, right=0)"
    return f"window(left={wl}, right={wr})"


def _element_rule(seq_q: int, seq_k: int, wl: int, wr: int, device: Any) -> torch.Tensor:
    """bool [seq_q, seq_k]: the element rule, bottom-right aligned."""
    qp = torch.arange(seq_q, device=device).unsqueeze(1) + (seq_k - seq_q)
    k = torch.arange(seq_k, device=device).unsqueeze(0)
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if wl >= 0:
        keep &= k >= qp - wl
    if wr >= 0:
        keep &= k <= qp + wr
    return keep


class _Geom:
    """Sizes shared by constructors."""

    def __init__(self, seq_q: Any, seq_k: Any, block_m: Any, block_n: Any):
        self.seq_q = _as_int("seq_q", seq_q, 1)
        self.seq_k = _as_int("seq_k", self.seq_q if seq_k is None else seq_k, 1)
        self.bm = _as_int("block_m", block_m, 1)
        self.bn = _as_int("block_n", block_n, 1)
        self.nq = _cdiv(self.seq_q, self.bm)
        self.nk = _cdiv(self.seq_k, self.bn)
        self.off = self.seq_k - self.seq_q

    # per query-block row r: first/last aligned query position q' (valid queries only)
    def qp_range(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = r * self.bm + self.off
        hi = torch.clamp((r + 1) * self.bm, max=self.seq_q) - 1 + self.off
        return lo, hi

    def k_range(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = c * self.bn
        hi = torch.clamp((c + 1) * self.bn, max=self.seq_k) - 1
        return lo, hi

    def diag(self, r: torch.Tensor) -> torch.Tensor:
        _, hi = self.qp_range(r)
        return torch.clamp(torch.div(hi, self.bn, rounding_mode="floor"), 0, self.nk - 1)

    def classify(self, r: torch.Tensor, c: torch.Tensor, wl: int, wr: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(any_kept, all_kept) of the rule over the valid elements of blocks (r, c); vectorized."""
        qlo, qhi = self.qp_range(r)
        klo, khi = self.k_range(c)
        any_ = torch.ones(r.shape, dtype=torch.bool, device=r.device)
        all_ = torch.ones(r.shape, dtype=torch.bool, device=r.device)
        # For each q the kept keys are the interval [q' - wl, q' + wr]; the union over the row's queries is
        # [q'_lo - wl, q'_hi + wr] (contiguous: every interval holds q'), so "some element kept" is an overlap test.
        if wl >= 0:
            any_ &= khi >= qlo - wl
            all_ &= klo >= qhi - wl
        if wr >= 0:
            any_ &= klo <= qhi + wr
            all_ &= khi <= qlo + wr
        return any_, all_

    def band(self, wl: int, wr: int, device: Any = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every block the rule keeps something in, row-major, sorted, unique, O(result) memory:
        (rows, cols, cut) with ``cut`` True where the rule cuts the block (False: it keeps the whole block).

        Per row the kept blocks are the contiguous range [c_lo, c_hi] (the overlap test of ``classify``) and the
        fully kept ones the sub-range [f_lo, f_hi], so only per-row bounds are computed and compared."""
        r = torch.arange(self.nq, device=device, dtype=torch.int64)
        qlo, qhi = self.qp_range(r)
        floor = lambda x: torch.div(x, self.bn, rounding_mode="floor")  # noqa: E731
        if wl >= 0:
            c_lo = torch.clamp(floor(qlo - wl), min=0)                  # first block with k_hi >= q'_lo - wl
            f_lo = torch.clamp(floor(qhi - wl + self.bn - 1), min=0)     # first block with k_lo >= q'_hi - wl
        else:
            c_lo = torch.zeros_like(r)
            f_lo = torch.zeros_like(r)
        if wr >= 0:
            c_hi = torch.clamp(floor(qhi + wr), max=self.nk - 1)         # last block with k_lo <= q'_hi + wr
            # last block with k_hi <= q'_lo + wr (the last key block ends at seq_k - 1, the others at (c+1)*bn - 1)
            f_hi = torch.where(qlo + wr >= self.seq_k - 1, self.nk - 1, floor(qlo + wr + 1) - 1)
        else:
            c_hi = torch.full_like(r, self.nk - 1)
            f_hi = torch.full_like(r, self.nk - 1)
        width = torch.clamp(c_hi - c_lo + 1, min=0)
        rows, cols = _ranges(c_lo, width)
        if wl < 0 and wr < 0:
            cut = torch.zeros(cols.shape, dtype=torch.bool, device=device)
        else:
            cut = (cols < f_lo[rows]) | (cols > f_hi[rows])
        return rows, cols, cut


def _ranges(start: torch.Tensor, width: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For row i the values start[i] .. start[i] + width[i] - 1, flattened row-major: (row ids, values)."""
    total = int(width.sum())
    rows = torch.repeat_interleave(torch.arange(width.numel(), device=width.device), width, output_size=total)
    first = torch.cumsum(width, 0) - width
    vals = torch.arange(total, device=width.device) - first[rows] + start[rows]
    return rows, vals


def _compress(n_heads: int, n_major: int, n_minor: int, h: torch.Tensor, major: torch.Tensor,
              minor: torch.Tensor, kind: torch.Tensor, presorted: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """COO entries -> (ptr int32 [H, n_major+1], idx int32 [H, M], kind uint8 [H, M]).

    Unless presorted (sorted by (h, major, minor) and unique), entries are sorted and duplicates merged with the
    smallest kind winning: a block listed both FULL and RULE is FULL (the union of the two element sets).
    """
    device = major.device
    h, major, minor = h.long(), major.long(), minor.long()
    kind = kind.to(torch.uint8)
    if not presorted and h.numel() > 0:
        key = (h * n_major + major) * n_minor + minor
        order = torch.argsort(key * 4 + kind.long())
        key = key[order]
        first = torch.ones_like(key, dtype=torch.bool)
        first[1:] = key[1:] != key[:-1]
        order = order[first]
        h, major, minor, kind = h[order], major[order], minor[order], kind[order]
    if n_heads == 1:
        counts = torch.bincount(major, minlength=n_major).view(1, n_major)
    else:
        counts = torch.bincount(h * n_major + major, minlength=n_heads * n_major).view(n_heads, n_major)
    ptr = torch.zeros(n_heads, n_major + 1, dtype=torch.int64, device=device)
    ptr[:, 1:] = torch.cumsum(counts, 1)
    per_head = ptr[:, -1]
    m = max(1, int(per_head.max()))
    if m > torch.iinfo(torch.int32).max:
        raise LayoutError(f"{m} blocks in one head overflow int32 row_ptr; use larger blocks or fewer blocks")
    if n_heads == 1:  # entries are already in order: no scatter
        n = major.numel()
        idx = torch.zeros(1, max(1, n), dtype=torch.int32, device=device)
        kinds = torch.zeros(1, max(1, n), dtype=torch.uint8, device=device)
        idx[0, :n] = minor
        kinds[0, :n] = kind
        return ptr.to(torch.int32), idx, kinds
    head_start = torch.cumsum(per_head, 0) - per_head
    pos = torch.arange(h.numel(), device=device) - head_start[h]
    idx = torch.zeros(n_heads, m, dtype=torch.int32, device=device)
    kinds = torch.zeros(n_heads, m, dtype=torch.uint8, device=device)
    idx[h, pos] = minor.to(torch.int32)
    kinds[h, pos] = kind
    return ptr.to(torch.int32), idx, kinds


# ----------------------------------------------------------------------------------------------------------------
# the CSC view
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class BlockSparseCSC:
    """Column-major (CSC) view of a layout, for a backward pass that walks key blocks (dK, dV).

    ``col_ptr`` int32 ``[Hl, nk + 1]``, ``row_idx`` int32 ``[Hl, nnz_max]`` (rows ascending within a column, padding 0),
    ``block_kind`` uint8 aligned with ``row_idx``. Lists exactly the (row, col, kind) triples of the layout it came
    from; the element rule and sizes are the same. Immutable like the layout.
    """

    col_ptr: torch.Tensor
    row_idx: torch.Tensor
    block_kind: torch.Tensor
    _layout: "BlockSparseLayout" = dataclasses.field(repr=False)

    # Sizes and the rule are the layout's own: read through, never copied.
    seq_q = property(lambda self: self._layout.seq_q)
    seq_k = property(lambda self: self._layout.seq_k)
    block_m = property(lambda self: self._layout.block_m)
    block_n = property(lambda self: self._layout.block_n)
    window_left = property(lambda self: self._layout.window_left)
    window_right = property(lambda self: self._layout.window_right)
    num_heads = property(lambda self: self._layout.num_heads)
    n_qblocks = property(lambda self: self._layout.n_qblocks)
    n_kblocks = property(lambda self: self._layout.n_kblocks)
    nnz = property(lambda self: self._layout.nnz)
    device = property(lambda self: self.col_ptr.device)

    def col_order(self) -> torch.Tensor:
        """int32 [Hl, nk]: key-block columns by descending number of blocks (stable), heaviest first."""
        counts = self.col_ptr[:, 1:] - self.col_ptr[:, :-1]
        return torch.sort(counts, dim=1, descending=True, stable=True).indices.to(torch.int32)

    def transpose(self) -> "BlockSparseLayout":
        """Back to the row-major layout this view came from."""
        return self._layout

    def to_dense_mask(self) -> torch.Tensor:
        return self._layout.to_dense_mask()

    def __repr__(self) -> str:
        return f"BlockSparseCSC(of {self._layout!r})"


# ----------------------------------------------------------------------------------------------------------------
# the layout
# ----------------------------------------------------------------------------------------------------------------

class BlockSparseLayout:
    """Block-sparse attention layout in BSR/CSR form (see the module docstring for the exact kernel contract).

    Build one with a classmethod constructor (``dense``, ``causal``, ``sliding_window``, ``strided``, ``dilated``,
    ``global_local``, ``random_topk``, ``from_block_mask``, ``from_scores``, ``from_bsr``, ``from_flex_block_mask``)
    or directly from tensors: ``BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=..., seq_k=..., block_m=...,
    block_n=..., window_left=-1, window_right=-1)``, which validates them.

    Immutable: attributes are read-only and the tensors must never be modified in place (device copies, the causal
    variant, the CSC view, ``row_order()`` and ``row_schedule()`` are cached on the object).
    """

    __slots__ = ("_row_ptr", "_col_idx", "_block_kind", "_seq_q", "_seq_k", "_block_m", "_block_n",
                 "_window_left", "_window_right", "_nnz_per_head", "_copies", "_cache", "_frozen")

    FULL = FULL
    BOUNDS = BOUNDS
    RULE = RULE

    def __init__(self, row_ptr: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor, *,
                 seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
                 window_left: int = -1, window_right: int = -1):
        g = _Geom(seq_q, seq_k, block_m, block_n)
        self._init(row_ptr, col_idx, block_kind, g.seq_q, g.seq_k, g.bm, g.bn,
                   _window("window_left", window_left), _window("window_right", window_right), None)
        self.validate()
        self._set_nnz()
        self._finish()

    def _init(self, row_ptr, col_idx, block_kind, seq_q, seq_k, bm, bn, wl, wr, nnz_per_head) -> None:
        s = object.__setattr__
        for name, t in (("row_ptr", row_ptr), ("col_idx", col_idx), ("block_kind", block_kind)):
            if not isinstance(t, torch.Tensor):
                raise LayoutError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        s(self, "_row_ptr", row_ptr.contiguous())
        s(self, "_col_idx", col_idx.contiguous())
        s(self, "_block_kind", block_kind.contiguous())
        s(self, "_seq_q", seq_q)
        s(self, "_seq_k", seq_k)
        s(self, "_block_m", bm)
        s(self, "_block_n", bn)
        s(self, "_window_left", wl)
        s(self, "_window_right", wr)
        s(self, "_nnz_per_head", nnz_per_head)
        s(self, "_copies", None)
        s(self, "_cache", {})
        s(self, "_frozen", False)

    def _set_nnz(self) -> None:
        object.__setattr__(self, "_nnz_per_head", [int(x) for x in self._row_ptr[:, -1].tolist()])
        self.balanced_rows()  # small syncs while constructing, so later calls (and torch.compile) read bools

    @classmethod
    def _trusted(cls, row_ptr, col_idx, block_kind, g: _Geom, wl: int, wr: int, *, check: bool = True,
                 nnz_per_head: list[int] | None = None) -> "BlockSparseLayout":
        self = cls.__new__(cls)
        self._init(row_ptr, col_idx, block_kind, g.seq_q, g.seq_k, g.bm, g.bn, wl, wr, nnz_per_head)
        if check:
            self.validate()
        if nnz_per_head is None:
            self._set_nnz()
        self._finish()
        return self

    def _finish(self) -> None:
        """Freeze; mark the (validated or derived) kernel tensors as checked; on a CUDA device build the views a
        kernel reads now. Building them lazily on first use would, under torch.compile or CUDA-graph capture,
        make them intermediates of the traced region (overwritten by a later replay) instead of inputs."""
        object.__setattr__(self, "_frozen", True)
        _mark_checked(self._row_ptr, self._col_idx, self._block_kind)
        if self.device.type in _EAGER_VIEW_DEVICES:
            self._build_kernel_views()

    def _build_kernel_views(self) -> None:
        if self.n_kblocks <= _MAX_SCHEDULE_KBLOCKS:  # beyond, no kernel can take it: row_schedule() says why
            self.row_schedule()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"BlockSparseLayout is immutable (cannot set {name!r}); build a new layout instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("BlockSparseLayout is immutable")

    def __reduce__(self):
        return (_rebuild, (self._row_ptr, self._col_idx, self._block_kind, self._seq_q, self._seq_k, self._block_m,
                           self._block_n, self._window_left, self._window_right))

    # -- attributes ---------------------------------------------------------------------------------------------
    row_ptr = property(lambda self: self._row_ptr, doc="int32 [Hl, nq + 1]")
    col_idx = property(lambda self: self._col_idx, doc="int32 [Hl, nnz_max]")
    block_kind = property(lambda self: self._block_kind, doc="uint8 [Hl, nnz_max]: FULL 0 | BOUNDS 1 | RULE 2")
    seq_q = property(lambda self: self._seq_q)
    seq_k = property(lambda self: self._seq_k)
    block_m = property(lambda self: self._block_m)
    block_n = property(lambda self: self._block_n)
    window_left = property(lambda self: self._window_left)
    window_right = property(lambda self: self._window_right)

    @property
    def num_heads(self) -> int:
        """Hl: 1 = one layout shared by every head, else one layout per head."""
        return self._row_ptr.shape[0]

    @property
    def n_qblocks(self) -> int:
        return _cdiv(self._seq_q, self._block_m)

    @property
    def n_kblocks(self) -> int:
        return _cdiv(self._seq_k, self._block_n)

    @property
    def nnz_max(self) -> int:
        return self._col_idx.shape[1]

    @property
    def nnz_per_head(self) -> list[int]:
        return list(self._nnz_per_head)

    @property
    def nnz(self) -> int:
        """Listed blocks, summed over layout heads."""
        return sum(self._nnz_per_head)

    @property
    def density(self) -> float:
        """Listed blocks / (Hl * nq * nk)."""
        return self.nnz / (self.num_heads * self.n_qblocks * self.n_kblocks)

    @property
    def device(self) -> torch.device:
        return self._row_ptr.device

    @property
    def has_rule(self) -> bool:
        return self._window_left >= 0 or self._window_right >= 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the three kernel tensors."""
        return sum(t.numel() * t.element_size() for t in (self._row_ptr, self._col_idx, self._block_kind))

    def _geom(self) -> _Geom:
        return _Geom(self._seq_q, self._seq_k, self._block_m, self._block_n)

    # -- validation ---------------------------------------------------------------------------------------------
    def validate(self) -> "BlockSparseLayout":
        """Check the kernel contract with vectorized torch ops; raise LayoutError naming the fix. Returns self."""
        rp, ci, bk = self._row_ptr, self._col_idx, self._block_kind
        nq, nk = self.n_qblocks, self.n_kblocks
        if rp.dtype != torch.int32:
            raise LayoutError(f"row_ptr must be torch.int32, got {rp.dtype}; pass row_ptr.to(torch.int32)")
        if ci.dtype != torch.int32:
            raise LayoutError(f"col_idx must be torch.int32, got {ci.dtype}; pass col_idx.to(torch.int32)")
        if bk.dtype != torch.uint8:
            raise LayoutError(f"block_kind must be torch.uint8, got {bk.dtype}; pass block_kind.to(torch.uint8)")
        if not (rp.device == ci.device == bk.device):
            raise LayoutError(f"row_ptr, col_idx and block_kind are on different devices ({rp.device}, {ci.device}, "
                              f"{bk.device}); move them to one device")
        if rp.dim() != 2 or rp.shape[0] < 1:
            raise LayoutError(f"row_ptr must be 2-D [num_heads, n_qblocks + 1] with num_heads >= 1, got shape "
                              f"{tuple(rp.shape)}; use row_ptr.unsqueeze(0) for a layout shared by all heads")
        hl = rp.shape[0]
        if rp.shape[1] != nq + 1:
            raise LayoutError(f"row_ptr must have n_qblocks + 1 = ceil({self._seq_q}/{self._block_m}) + 1 = {nq + 1} "
                              f"columns, got shape {tuple(rp.shape)}; check seq_q and block_m")
        if ci.dim() != 2 or ci.shape[0] != hl or ci.shape[1] < 1:
            raise LayoutError(f"col_idx must be 2-D [num_heads={hl}, nnz_max >= 1], got shape {tuple(ci.shape)}; "
                              "pad with at least one 0 column when a head is empty")
        if bk.shape != ci.shape:
            raise LayoutError(f"block_kind must have col_idx's shape {tuple(ci.shape)}, got {tuple(bk.shape)}")
        m = ci.shape[1]
        if bool((rp[:, 0] != 0).any()):
            raise LayoutError("row_ptr[h, 0] must be 0 for every head; subtract row_ptr[:, :1]")
        if bool((rp[:, 1:] < rp[:, :-1]).any()):
            raise LayoutError("row_ptr must be non-decreasing along each head (row r's blocks are "
                              "col_idx[h, row_ptr[h, r]:row_ptr[h, r+1]]); rebuild it as a cumulative sum of counts")
        end = rp[:, -1:].long()
        if bool((end > m).any()):
            raise LayoutError(f"row_ptr[h, -1] (blocks in head h, max {int(end.max())}) exceeds col_idx's width "
                              f"nnz_max={m}; col_idx must be [num_heads, max_h row_ptr[h, -1]]")
        pos = torch.arange(m, device=ci.device).unsqueeze(0)
        valid = pos < end
        if bool(((ci != 0) & ~valid).any()) or bool(((bk != 0) & ~valid).any()):
            raise LayoutError("col_idx/block_kind padding (positions >= row_ptr[h, -1]) must be 0")
        if bool((((ci < 0) | (ci >= nk)) & valid).any()):
            raise LayoutError(f"col_idx must lie in [0, n_kblocks={nk}) (n_kblocks = ceil(seq_k={self._seq_k} / "
                              f"block_n={self._block_n})); found {int(ci[valid].min())}..{int(ci[valid].max())}")
        if bool((bk > 3).any()):
            raise LayoutError("block_kind values must be in 0..3 (FULL=0, BOUNDS=1, RULE=2, both=3), got "
                              f"max {int(bk.max())}")
        if m > 1:
            starts = torch.zeros(hl, m + 1, dtype=torch.bool, device=ci.device)
            starts.scatter_(1, rp.long(), True)
            same_row = valid[:, 1:] & ~starts[:, 1:m]
            if bool((same_row & (ci[:, 1:] <= ci[:, :-1])).any()):
                raise LayoutError("col_idx must be sorted ascending and unique within each row; sort each row's "
                                  "slice and drop duplicates (or build with from_bsr, which does)")
        want_bounds = valid & (ci == nk - 1) if self._seq_k % self._block_n else torch.zeros_like(valid)
        if bool((((bk & BOUNDS) != 0) != want_bounds).any()):
            raise LayoutError(f"block_kind's BOUNDS bit (1) must be set exactly on listed blocks of the last key "
                              f"column ({nk - 1}) when seq_k % block_n != 0 (here {self._seq_k} % {self._block_n} = "
                              f"{self._seq_k % self._block_n}), and nowhere else")
        if not self.has_rule and bool(((bk & RULE) != 0).any()):
            raise LayoutError("block_kind has RULE bits (2) but the layout has no rule (window_left == window_right "
                              "== -1); clear bit 2 or pass window_left/window_right")
        return self

    def validate_for(self, batch: int, heads: int, seq_q: int, seq_k: int, device: Any = None) -> None:
        """Raise LayoutError unless this layout fits attention with these sizes (batch always broadcasts)."""
        if seq_q != self._seq_q or seq_k != self._seq_k:
            raise LayoutError(f"layout is for seq_q={self._seq_q}, seq_k={self._seq_k} but the inputs have "
                              f"seq_q={seq_q}, seq_k={seq_k}; build the layout with the inputs' sequence lengths")
        if batch < 1 or heads < 1:
            raise LayoutError(f"batch and heads must be >= 1, got batch={batch}, heads={heads}")
        if self.num_heads not in (1, heads):
            raise LayoutError(f"layout has {self.num_heads} heads; it must have 1 (shared) or {heads} (one per query "
                              f"head); build it with num_heads=1 or num_heads={heads}")
        if device is not None and _normalize_device(device) != self.device:
            raise LayoutError(f"layout is on {self.device} but the inputs are on {torch.device(device)}; "
                              f"use layout.to({str(torch.device(device))!r})")

    # -- equality, repr -------------------------------------------------------------------------------------------
    def _key(self) -> tuple:
        return (self._seq_q, self._seq_k, self._block_m, self._block_n, self._window_left, self._window_right,
                tuple(self._nnz_per_head))

    def _with_values(self) -> "BlockSparseLayout | None":
        """This layout, or for one on ``meta`` (shapes without values) a device copy of it that holds values;
        None when it has none."""
        if self.device.type != "meta":
            return self
        for copy in (self._copies or {}).values():
            if copy.device.type != "meta":
                return copy
        return None

    def __eq__(self, other: object) -> bool:
        """Same sizes, rule and tensors (compared on this layout's device). A layout on ``meta`` has no values:
        it is compared through a device copy of the same layout that has them (``lay.to('meta') == lay``), and
        without one it equals only itself and its own device copies (never a merely look-alike layout)."""
        if not isinstance(other, BlockSparseLayout):
            return NotImplemented
        if self is other or (self._copies is not None and self._copies is other._copies):
            return True  # one layout and its device copies: the same data
        if self._key() != other._key() or self._col_idx.shape != other._col_idx.shape:
            return False
        a, b = self._with_values(), other._with_values()
        if a is None or b is None:
            return False
        if a is not self or b is not other:
            return a == b
        dev = self.device
        return (torch.equal(self._row_ptr, other._row_ptr.to(dev))
                and torch.equal(self._col_idx, other._col_idx.to(dev))
                and torch.equal(self._block_kind, other._block_kind.to(dev)))

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"BlockSparseLayout(seq_q={self._seq_q}, seq_k={self._seq_k}, block={self._block_m}x{self._block_n}, "
                f"blocks={self.n_qblocks}x{self.n_kblocks}, heads={self.num_heads}, nnz={self.nnz}, "
                f"density={self.density:.2%}, rule={_rule_desc(self._window_left, self._window_right)}, "
                f"device={self.device})")

    # -- devices --------------------------------------------------------------------------------------------------
    def to(self, device: Any) -> "BlockSparseLayout":
        """This layout on ``device``. Copies are cached and shared: ``.to(d)`` twice returns the same object, and
        ``.to(self.device)`` returns self."""
        dev = _normalize_device(device)
        if dev == self.device:
            return self
        copies = self._copies
        if copies is None:
            copies = {self.device: self}
            object.__setattr__(self, "_copies", copies)
        other = copies.get(dev)
        if other is None:
            other = BlockSparseLayout._trusted(self._row_ptr.to(dev), self._col_idx.to(dev),
                                               self._block_kind.to(dev), self._geom(), self._window_left,
                                               self._window_right, check=False, nnz_per_head=self._nnz_per_head)
            for key in ("uniform_rows", "balanced_rows"):
                if key in self._cache:
                    other._cache[key] = self._cache[key]
            object.__setattr__(other, "_copies", copies)
            copies[dev] = other
        return other

    def _placed(self, device: Any) -> "BlockSparseLayout":
        """``to(device)``, where None (accepted by every constructor) keeps the layout where it was built."""
        return self if device is None else self.to(device)

    def cpu(self) -> "BlockSparseLayout":
        return self.to("cpu")

    def cuda(self, device: Any = None) -> "BlockSparseLayout":
        if device is None:
            return self.to("cuda")
        return self.to(torch.device("cuda", device) if isinstance(device, int) else device)

    # -- derived views --------------------------------------------------------------------------------------------
    def _coo(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, r, c, kind) of every listed block, int64 (kind uint8), row-major order."""
        got = self._cache.get("coo")
        if got is None:
            rp, ci = self._row_ptr.long(), self._col_idx
            hl, m = ci.shape
            pos = torch.arange(m, device=ci.device).expand(hl, m).contiguous()
            rows = torch.searchsorted(rp, pos, right=True) - 1
            valid = pos < rp[:, -1:]
            h, p = valid.nonzero(as_tuple=True)
            got = (h, rows[h, p], ci[h, p].long(), self._block_kind[h, p])
            self._cache["coo"] = got
        return got

    def row_counts(self) -> torch.Tensor:
        """int32 [Hl, nq]: blocks per query-block row."""
        return self._row_ptr[:, 1:] - self._row_ptr[:, :-1]

    def uniform_rows(self) -> bool:
        """True when every query-block row (of every head) lists the same number of blocks. Cached.
        The kernel's scheduler keeps a head's rows together when rows are equal (K/V reuse in L2) and orders
        tiles heaviest-first across heads when they are not (load balance)."""
        got = self._cache.get("uniform_rows")
        if got is None:
            c = self.row_counts()
            got = bool((c.amin() == c.amax()).item()) if c.numel() else True
            self._cache["uniform_rows"] = got
        return got

    def balanced_rows(self) -> bool:
        """True when no query-block row lists more than 1.25x the mean row's blocks (dense, top-k, sliding
        windows; not causal). Cached. sparse_attention's default schedule keys on it: persistent ping-pong CTAs
        win when rows cost about the same, one CTA per tile in heaviest-first order when they do not."""
        got = self._cache.get("balanced_rows")
        if got is None:
            c = self.row_counts()
            got = True
            if not self.uniform_rows() and c.numel():
                got = bool((c.amax().double() <= 1.25 * c.double().mean()).item())
            self._cache["balanced_rows"] = got
        return got

    def row_order(self) -> torch.Tensor:
        """int32 [Hl, nq]: query-block rows by descending block count (stable: ties keep row order). Cached.
        The kernel's scheduler runs the heaviest rows first."""
        got = self._cache.get("row_order")
        if got is None:
            got = torch.sort(self.row_counts(), dim=1, descending=True, stable=True).indices.to(torch.int32)
            self._cache["row_order"] = got
        return got

    def row_schedule(self) -> torch.Tensor:
        """int32 [Hl, nq, 4], contiguous: per query-block row in ``row_order()``, (row, start, end, first), with
        ``col_idx[start:end]`` the row's blocks and first = column | kind << 24 of its first block (0 for an empty
        row). Cached. The kernel's tile scheduler reads one 16-byte entry per tile, so no dependent index load stands
        before a row's first K/V load or its first softmax step."""
        got = self._cache.get("row_schedule")
        if got is None:
            if self.n_kblocks > _MAX_SCHEDULE_KBLOCKS:
                raise LayoutError(f"{self.n_kblocks} key blocks: the kernel's row schedule holds a block column in "
                                  f"24 bits (at most {_MAX_SCHEDULE_KBLOCKS}); use larger blocks")
            order = self.row_order().long()
            start = torch.gather(self.row_ptr[:, :-1], 1, order)
            end = torch.gather(self.row_ptr[:, 1:], 1, order)
            at = start.clamp(max=self.col_idx.shape[1] - 1).long()  # an empty last row starts past the end
            packed = self.col_idx | (self.block_kind.to(self.col_idx.dtype) << 24)
            first = torch.where(end > start, torch.gather(packed, 1, at), torch.zeros_like(start))
            got = torch.stack([order.to(torch.int32), start, end, first], dim=2)  # int32 like row_ptr, contiguous
            _mark_checked(got)
            self._cache["row_schedule"] = got
        return got

    def to_dense_mask(self) -> torch.Tensor:
        """bool [Hl, nq, nk]: which blocks are listed."""
        hl, nq, nk = self.num_heads, self.n_qblocks, self.n_kblocks
        if hl * nq * nk > _MAX_DENSE_BLOCKS:
            raise LayoutError(f"to_dense_mask() would hold {hl * nq * nk} entries (> {_MAX_DENSE_BLOCKS}); "
                              "use larger blocks or iterate row_ptr/col_idx")
        h, r, c, _ = self._coo()
        out = torch.zeros(hl, nq, nk, dtype=torch.bool, device=self.device)
        out[h, r, c] = True
        return out

    def to_kind_grid(self) -> torch.Tensor:
        """int8 [Hl, nq, nk]: the block kind of each listed block, -1 where no block is listed."""
        hl, nq, nk = self.num_heads, self.n_qblocks, self.n_kblocks
        if hl * nq * nk > _MAX_DENSE_BLOCKS:
            raise LayoutError(f"to_kind_grid() would hold {hl * nq * nk} entries (> {_MAX_DENSE_BLOCKS})")
        h, r, c, k = self._coo()
        grid = torch.full((hl, nq, nk), -1, dtype=torch.int8, device=self.device)
        grid[h, r, c] = k.to(torch.int8)
        return grid

    def to_element_mask(self) -> torch.Tensor:
        """bool [Hl, seq_q, seq_k]: the exact element mask implied by blocks, kinds, rule and bounds.
        For tests and references; refused (LayoutError) above 64M elements."""
        hl, sq, sk = self.num_heads, self._seq_q, self._seq_k
        if hl * sq * sk > _MAX_ELEMENT_MASK:
            raise LayoutError(f"to_element_mask() would hold {hl}x{sq}x{sk} = {hl * sq * sk} elements "
                              f"(> {_MAX_ELEMENT_MASK}); it is meant for tests and references on small sizes")
        grid = self.to_kind_grid()
        dev = self.device
        qb = torch.arange(sq, device=dev) // self._block_m
        kb = torch.arange(sk, device=dev) // self._block_n
        g = grid[:, qb][:, :, kb]
        rule = _element_rule(sq, sk, self._window_left, self._window_right, dev)
        return (g >= 0) & (((g & RULE) == 0) | rule)

    def to_bsr(self, squeeze: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(indptr, indices) in FlashInfer/SciPy BSR form. With one layout head and ``squeeze``: 1-D
        ``[nq + 1]`` and ``[nnz]``; otherwise the stored ``row_ptr`` and ``col_idx`` ([Hl, ...], zero-padded)."""
        if squeeze and self.num_heads == 1:
            return self._row_ptr[0], self._col_idx[0, :self.nnz]
        return self._row_ptr, self._col_idx

    def transpose(self) -> BlockSparseCSC:
        """CSC view (col_ptr, row_idx, block_kind) listing the same (row, col, kind) triples. Cached."""
        got = self._cache.get("csc")
        if got is None:
            h, r, c, k = self._coo()
            ptr, idx, kinds = _compress(self.num_heads, self.n_kblocks, self.n_qblocks, h, c, r, k, presorted=False)
            got = BlockSparseCSC(ptr, idx, kinds, self)
            self._cache["csc"] = got
        return got

    def with_causal(self) -> "BlockSparseLayout":
        """This layout intersected with bottom-right aligned causal masking. Cached.

        Drops blocks entirely above the diagonal, sets ``window_right = 0`` (``min`` with 0; -1 becomes 0), marks
        RULE on blocks the new rule cuts, keeps BOUNDS. Exact: ``to_element_mask()`` of the result is this layout's
        element mask AND causal. One case cannot be expressed with a single rule per layout and raises LayoutError:
        a FULL block cut by the diagonal whose valid elements the layout's ``window_left`` would also cut (e.g.
        ``global_local`` global blocks near the diagonal with a small window)."""
        got = self._cache.get("causal")
        if got is not None:
            return got
        g = self._geom()
        wl = self._window_left
        h, r, c, kind = self._coo()
        is_rule = (kind & RULE) != 0
        # RULE blocks: old set = block & rule(wl, wr); new = block & rule(wl, 0).
        any_r, all_r = g.classify(r, c, wl, 0)
        # FULL blocks: new = block & causal, which rule(wl, 0) reproduces only if wl keeps the whole block.
        any_f, all_f = g.classify(r, c, -1, 0)
        keep = torch.where(is_rule, any_r, any_f)
        cut = torch.where(is_rule, ~all_r, ~all_f)
        if wl >= 0:
            _, inside_left = g.classify(r, c, wl, -1)
            bad = ~is_rule & any_f & ~all_f & ~inside_left
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise LayoutError(
                    f"with_causal(): FULL block (head {int(h[i])}, row {int(r[i])}, col {int(c[i])}) is cut by the "
                    f"causal diagonal, but the layout's rule window_left={wl} would also mask part of it; one rule "
                    "per layout cannot express both. Use a window_left >= block_m + block_n, or build the layout "
                    "from an explicit block mask/rule (from_block_mask(..., window_left=..., window_right=0))")
        new_kind = (kind & BOUNDS) | torch.where(cut, RULE, 0).to(torch.uint8)
        sel = keep
        ptr, idx, kinds = _compress(self.num_heads, g.nq, g.nk, h[sel], r[sel], c[sel], new_kind[sel],
                                    presorted=True)
        got = BlockSparseLayout._trusted(ptr, idx, kinds, g, wl, 0)
        self._cache["causal"] = got
        return got

    # -- constructors -----------------------------------------------------------------------------------------------
    @classmethod
    def _build(cls, g: _Geom, n_heads: int, h: torch.Tensor, r: torch.Tensor, c: torch.Tensor,
               wl: int, wr: int, *, ruled: torch.Tensor | bool = True,
               presorted: bool = False) -> "BlockSparseLayout":
        """Entries (h, r, c) -> layout. ``ruled`` entries are intersected with the rule (dropped where it keeps
        nothing, RULE where it cuts); unruled ones are FULL. Adds BOUNDS. Duplicates merge (FULL wins)."""
        h, r, c = h.long(), r.long(), c.long()
        dev = r.device
        if isinstance(ruled, bool):
            ruled = torch.full(r.shape, ruled, dtype=torch.bool, device=dev)
        if wl >= 0 or wr >= 0:
            any_, all_ = g.classify(r, c, wl, wr)
            keep = ~ruled | any_
            cut = ruled & ~all_
            if not bool(keep.all()):
                h, r, c, cut = h[keep], r[keep], c[keep], cut[keep]
        else:
            cut = torch.zeros(r.shape, dtype=torch.bool, device=dev)
        kind = torch.where(cut, RULE, FULL).to(torch.uint8)
        if g.seq_k % g.bn:
            kind |= (c == g.nk - 1).to(torch.uint8) * BOUNDS
        ptr, idx, kinds = _compress(n_heads, g.nq, g.nk, h, r, c, kind, presorted=presorted)
        return cls._trusted(ptr, idx, kinds, g, wl, wr)

    @classmethod
    def _rule_layout(cls, g: _Geom, wl: int, wr: int, num_heads: int, device: Any) -> "BlockSparseLayout":
        r, c, cut = g.band(wl, wr)
        kind = cut.to(torch.uint8) * RULE
        if g.seq_k % g.bn:
            kind |= (c == g.nk - 1).to(torch.uint8) * BOUNDS
        ptr, idx, kinds = _compress(1, g.nq, g.nk, torch.zeros_like(r), r, c, kind, presorted=True)
        lay = cls._trusted(ptr, idx, kinds, g, wl, wr)
        return lay._repeat_heads(num_heads)._placed(device)

    def _repeat_heads(self, num_heads: int) -> "BlockSparseLayout":
        n = _as_int("num_heads", num_heads, 1)
        if n == 1:
            return self
        return BlockSparseLayout._trusted(self._row_ptr.repeat(n, 1), self._col_idx.repeat(n, 1),
                                          self._block_kind.repeat(n, 1), self._geom(), self._window_left,
                                          self._window_right, check=False, nnz_per_head=self._nnz_per_head * n)

    @classmethod
    def dense(cls, seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
              num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """Every block; no rule (BOUNDS on the last key column when seq_k % block_n != 0)."""
        return cls._rule_layout(_Geom(seq_q, seq_k, block_m, block_n), -1, -1, num_heads, device)

    @classmethod
    def causal(cls, seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
               num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """Bottom-right aligned causal: rule (-1, 0), keep k <= q + seq_k - seq_q."""
        return cls._rule_layout(_Geom(seq_q, seq_k, block_m, block_n), -1, 0, num_heads, device)

    @classmethod
    def sliding_window(cls, seq_q: int, window: int, seq_k: int | None = None, block_m: int = 128,
                       block_n: int = 128, causal: bool = True, num_heads: int = 1,
                       device: Any = "cpu") -> "BlockSparseLayout":
        """Sliding window of ``window`` keys per query, bottom-right aligned.

        ``causal=True``: rule (window - 1, 0), i.e. keys q' - window + 1 .. q' (``window`` keys including itself).
        ``causal=False``: rule (window - 1, window - 1), i.e. keys q' - window + 1 .. q' + window - 1."""
        w = _as_int("window", window, 1)
        wr = 0 if causal else w - 1
        return cls._rule_layout(_Geom(seq_q, seq_k, block_m, block_n), w - 1, wr, num_heads, device)

    @classmethod
    def strided(cls, seq_q: int, stride: int, local: int = 1, seq_k: int | None = None, block_m: int = 128,
                block_n: int = 128, causal: bool = True, num_heads: int = 1,
                device: Any = "cpu") -> "BlockSparseLayout":
        """Sparse-Transformer style strided pattern, defined on blocks (``diag(r)``: see the module docstring).

        Row ``r`` lists key blocks ``c`` with ``diag(r) - local < c <= diag(r)`` (the ``local`` blocks ending at the
        diagonal block) or ``c % stride == 0`` (every stride-th block, starting with block 0).
        ``causal=True``: then intersected with the causal rule (-1, 0): blocks above the diagonal are dropped, RULE
        on the blocks the diagonal cuts. ``causal=False``: the local part is ``|c - diag(r)| < local`` and there is
        no rule (all blocks FULL)."""
        g = _Geom(seq_q, seq_k, block_m, block_n)
        s = _as_int("stride", stride, 1)
        loc = _as_int("local", local, 0)
        rows = torch.arange(g.nq)
        d = g.diag(rows)
        lo_off = -(loc - 1) if loc else 0
        hi_off = 0 if causal else max(loc - 1, 0)
        width = hi_off - lo_off + 1 if loc else 0
        r1, c1 = _ranges(d + lo_off, torch.full_like(d, width))
        strided_cols = torch.arange(0, g.nk, s)
        r2 = rows.repeat_interleave(strided_cols.numel())
        c2 = strided_cols.repeat(g.nq)
        if causal:
            ok2 = c2 <= d[r2]
            r2, c2 = r2[ok2], c2[ok2]
        r, c = torch.cat([r1, r2]), torch.cat([c1, c2])
        return cls._from_candidates(g, r, c, causal, num_heads, device)

    @classmethod
    def _from_candidates(cls, g: "_Geom", r: torch.Tensor, c: torch.Tensor, causal: bool, num_heads: int,
                         device: Any) -> "BlockSparseLayout":
        """A shared-head layout from candidate (row, col) blocks, columns outside [0, nk) dropped; ``causal``
        intersects with the causal rule (-1, 0), else no rule."""
        ok = (c >= 0) & (c < g.nk)
        r, c = r[ok], c[ok]
        wl, wr = (-1, 0) if causal else (-1, -1)
        lay = cls._build(g, 1, torch.zeros_like(r), r, c, wl, wr)
        return lay._repeat_heads(num_heads)._placed(device)

    @classmethod
    def dilated(cls, seq_q: int, n_blocks: int, dilation: int, seq_k: int | None = None, block_m: int = 128,
                block_n: int = 128, causal: bool = True, num_heads: int = 1,
                device: Any = "cpu") -> "BlockSparseLayout":
        """Dilated blocks: row ``r`` lists ``diag(r) - i * dilation`` for ``0 <= i < n_blocks`` (and, if
        ``causal=False``, also ``diag(r) + i * dilation``), clipped to ``[0, nk)``. ``causal=True`` intersects with
        the causal rule (-1, 0) (RULE on blocks the diagonal cuts); ``causal=False`` has no rule."""
        g = _Geom(seq_q, seq_k, block_m, block_n)
        n = _as_int("n_blocks", n_blocks, 1)
        dil = _as_int("dilation", dilation, 1)
        d = g.diag(torch.arange(g.nq))
        steps = torch.arange(n) * dil
        offs = -steps if causal else torch.cat([-steps, steps[1:]])
        c = (d.unsqueeze(1) + offs.unsqueeze(0))
        r = torch.arange(g.nq).unsqueeze(1).expand_as(c)
        return cls._from_candidates(g, r, c, causal, num_heads, device)

    @classmethod
    def global_local(cls, seq_q: int, n_global: int, window: int, seq_k: int | None = None, block_m: int = 128,
                     block_n: int = 128, num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """Longformer/BigBird style, non-causal.

        * global columns: key blocks ``0 .. n_global - 1`` are attended by every query (FULL blocks);
        * global rows: query-block rows ``0 .. n_global - 1`` attend every key block (FULL blocks);
        * local band: every query also sees keys ``q' - (window - 1) .. q' + (window - 1)`` (the rule
          ``(window - 1, window - 1)``, same as ``sliding_window(window, causal=False)``): band blocks are FULL inside
          the band and RULE where its edge cuts them.
        The layout's rule is ``(window - 1, window - 1)``; it applies only to band blocks that are not global."""
        g = _Geom(seq_q, seq_k, block_m, block_n)
        ng = _as_int("n_global", n_global, 0)
        w = _as_int("window", window, 1)
        rb, cb, _ = g.band(w - 1, w - 1)
        gc = min(ng, g.nk)
        gr = min(ng, g.nq)
        r_gc = torch.arange(g.nq).repeat_interleave(gc)
        c_gc = torch.arange(gc).repeat(g.nq)
        r_gr = torch.arange(gr).repeat_interleave(g.nk)
        c_gr = torch.arange(g.nk).repeat(gr)
        r = torch.cat([rb, r_gc, r_gr])
        c = torch.cat([cb, c_gc, c_gr])
        ruled = torch.cat([torch.ones(rb.numel(), dtype=torch.bool),
                           torch.zeros(r_gc.numel() + r_gr.numel(), dtype=torch.bool)])
        lay = cls._build(g, 1, torch.zeros_like(r), r, c, w - 1, w - 1, ruled=ruled)
        return lay._repeat_heads(num_heads)._placed(device)

    @classmethod
    def random_topk(cls, seq_q: int, k: int, seed: int = 0, seq_k: int | None = None, block_m: int = 128,
                    block_n: int = 128, num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """``k`` distinct uniformly random key blocks per row and head (``k`` clamped to nk), sorted, no rule.
        Reproducible: a ``torch.Generator`` seeded with ``seed`` draws, row by row, a random score per key block
        and takes the top k (rows are processed in chunks so memory stays O(chunk * nk), never [nq, nk])."""
        g = _Geom(seq_q, seq_k, block_m, block_n)
        kk = min(_as_int("k", k, 1), g.nk)
        hl = _as_int("num_heads", num_heads, 1)
        gen = torch.Generator().manual_seed(_as_int("seed", seed, 0))
        n_rows = hl * g.nq
        chunk = max(1, (1 << 22) // g.nk)
        parts = []
        for start in range(0, n_rows, chunk):
            n = min(chunk, n_rows - start)
            scores = torch.rand(n, g.nk, generator=gen)
            parts.append(torch.sort(torch.topk(scores, kk, dim=1).indices, dim=1).values)
        cols = torch.cat(parts)  # [hl * nq, kk]
        flat = torch.arange(n_rows).repeat_interleave(kk)
        lay = cls._build(g, hl, flat // g.nq, flat % g.nq, cols.reshape(-1), -1, -1, presorted=True)
        return lay._placed(device)

    @classmethod
    def from_block_mask(cls, mask: Any, seq_q: int | None = None, seq_k: int | None = None, block_m: int = 128,
                        block_n: int = 128, *, window_left: int = -1, window_right: int = -1,
                        device: Any = None) -> "BlockSparseLayout":
        """From a bool block mask ``[nq, nk]`` (shared) or ``[H, nq, nk]`` (per head).

        ``seq_q``/``seq_k`` default to ``nq * block_m`` / ``nk * block_n`` and must give the mask's block counts.
        With a rule (``window_left``/``window_right``), the masked blocks are intersected with it: blocks the rule
        masks entirely are dropped, RULE on blocks it cuts. Runs on the mask's device (``device`` moves the result).
        """
        m = _as_tensor("mask", mask)
        if m.dtype != torch.bool:
            raise InputError(f"mask must be a bool tensor, got {m.dtype}; pass mask.bool() or mask != 0")
        if m.dim() == 2:
            m = m.unsqueeze(0)
        if m.dim() != 3 or m.shape[0] < 1 or m.shape[1] < 1 or m.shape[2] < 1:
            raise InputError(f"mask must be [nq, nk] or [H, nq, nk] with non-zero sizes, got {tuple(m.shape)}")
        hl, nq, nk = m.shape
        g = _geom_for_blocks(nq, nk, seq_q, seq_k, block_m, block_n, "mask")
        h, r, c = m.nonzero(as_tuple=True)
        wl, wr = _window("window_left", window_left), _window("window_right", window_right)
        lay = cls._build(g, hl, h, r, c, wl, wr, presorted=True)
        return lay if device is None else lay.to(device)

    @classmethod
    def from_scores(cls, scores: torch.Tensor, k: int, keep_diagonal: bool = True, seq_q: int | None = None,
                    seq_k: int | None = None, block_m: int = 128, block_n: int = 128) -> "BlockSparseLayout":
        """Top-k key blocks per row from block scores ``[nq, nk]`` or ``[H, nq, nk]`` (float), via ``torch.topk``
        on the scores' device (the layout lives there). No rule.

        ``keep_diagonal=False``: exactly ``torch.topk(scores, k, dim=-1).indices``.
        ``keep_diagonal=True``: the diagonal block ``diag(r)`` plus ``torch.topk`` (k - 1) over the row's other
        blocks. ``k`` is clamped to nk. Every selected block is listed, whatever its score (-inf included).
        Extra memory O(H * nq * k) plus a bounded chunk of rows: the scores are never copied."""
        s = _as_tensor("scores", scores)
        if not s.is_floating_point():
            raise InputError(f"scores must be a floating-point tensor, got {s.dtype}; pass scores.float()")
        if s.dim() == 2:
            s = s.unsqueeze(0)
        if s.dim() != 3 or min(s.shape) < 1:
            raise InputError(f"scores must be [nq, nk] or [H, nq, nk] with non-zero sizes, got {tuple(s.shape)}")
        hl, nq, nk = s.shape
        g = _geom_for_blocks(nq, nk, seq_q, seq_k, block_m, block_n, "scores")
        kk = min(_as_int("k", k, 1), nk)
        dev = s.device
        if keep_diagonal:
            cols = _diag_plus_topk(s, g.diag(torch.arange(nq, device=dev)), kk)
        else:
            cols = torch.topk(s, kk, dim=2).indices
        cols = torch.sort(cols, dim=2).values
        ncol = cols.shape[2]
        flat = torch.arange(hl * nq, device=dev).repeat_interleave(ncol)
        return cls._build(g, hl, flat // nq, flat % nq, cols.reshape(-1), -1, -1, presorted=True)

    @classmethod
    def from_bsr(cls, indptr: Any, indices: Any, seq_q: int, seq_k: int | None = None, block_m: int = 128,
                 block_n: int = 128, *, window_left: int = -1, window_right: int = -1,
                 device: Any = None) -> "BlockSparseLayout":
        """From FlashInfer/SciPy-style BSR: ``indptr [nq + 1]`` + ``indices [>= nnz]`` (shared), or per head
        ``indptr [H, nq + 1]`` + ``indices [H, >= max nnz]``. Column indices may be unsorted and repeated within a
        row (they are sorted and merged). A rule intersects like in ``from_block_mask``."""
        ip = _as_tensor("indptr", indptr)
        ix = _as_tensor("indices", indices)
        for name, t in (("indptr", ip), ("indices", ix)):
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise InputError(f"{name} must be an integer tensor, got {t.dtype}")
        if ip.dim() != ix.dim() or ip.dim() not in (1, 2) or (ip.dim() == 2 and ip.shape[0] != ix.shape[0]):
            raise InputError(f"indptr/indices must be 1-D [nq+1]/[nnz] or 2-D [H, nq+1]/[H, nnz_max], got "
                             f"{tuple(ip.shape)} and {tuple(ix.shape)}")
        if ip.device != ix.device:
            raise InputError(f"indptr and indices are on different devices ({ip.device}, {ix.device})")
        if ip.dim() == 1:
            ip, ix = ip.unsqueeze(0), ix.unsqueeze(0)
        ip, ix = ip.long(), ix.long()
        g = _Geom(seq_q, seq_k, block_m, block_n)
        if ip.shape[1] != g.nq + 1:
            raise LayoutError(f"indptr must have nq + 1 = ceil(seq_q={g.seq_q} / block_m={g.bm}) + 1 = {g.nq + 1} "
                              f"entries per head, got {ip.shape[1]}")
        if bool((ip[:, 0] != 0).any()) or bool((ip[:, 1:] < ip[:, :-1]).any()):
            raise LayoutError("indptr must start at 0 and be non-decreasing")
        m = ix.shape[1]
        if bool((ip[:, -1] > m).any()):
            raise LayoutError(f"indptr[-1] = {int(ip[:, -1].max())} exceeds the {m} available indices")
        pos = torch.arange(m, device=ix.device).expand(ix.shape[0], m).contiguous()
        valid = pos < ip[:, -1:]
        if bool((((ix < 0) | (ix >= g.nk)) & valid).any()):
            raise LayoutError(f"indices must lie in [0, nk={g.nk}) (nk = ceil(seq_k={g.seq_k} / block_n={g.bn}))")
        rows = torch.searchsorted(ip, pos, right=True) - 1
        h, p = valid.nonzero(as_tuple=True)
        wl, wr = _window("window_left", window_left), _window("window_right", window_right)
        lay = cls._build(g, ix.shape[0], h, rows[h, p], ix[h, p], wl, wr, presorted=False)
        return lay if device is None else lay.to(device)

    # -- FlexAttention interop --------------------------------------------------------------------------------------
    @classmethod
    def from_flex_block_mask(cls, block_mask: Any, *, window_left: int | None = None,
                             window_right: int | None = None, device: Any = None) -> "BlockSparseLayout":
        """From a ``torch.nn.attention.flex_attention.BlockMask`` (batch dim must be 1 or all batches equal).

        Flex's full blocks become FULL. A BlockMask carries no rule we can read (its mask_mod is arbitrary code),
        so Flex's partial blocks become FULL when no rule is given - the layout then keeps every element of them,
        i.e. it over-approximates the Flex mask. With ``window_left``/``window_right`` given, partial blocks are
        intersected with that rule like ``from_block_mask`` does (RULE where it cuts, FULL where it keeps all,
        dropped where it keeps nothing); pass the rule your mask_mod implements.

        One exception: Flex never lists a block of the last key column (query row) as full when ``seq_k``
        (``seq_q``) ends inside it, so there "partial" may mean "cut by the mask_mod" or only "cut by the sequence
        end" (e.g. a global block of ``global_local``). For those blocks the rule would cut or drop, the
        BlockMask's own ``mask_mod`` is evaluated on the block (like Flex's ``create_mask``, O(block) work each):
        a block it keeps whole (over ``q < seq_q``, ``k < seq_k``) is FULL (with BOUNDS on the last key column).

        The round trip ``from_flex_block_mask(layout.to_flex_block_mask(), window_left=layout.window_left,
        window_right=layout.window_right) == layout`` is exact for layouts from every constructor (and any layout
        whose RULE bits sit only on blocks the rule cuts)."""
        bm = block_mask
        try:
            kv_num, kv_idx = bm.kv_num_blocks, bm.kv_indices
            full_num, full_idx = bm.full_kv_num_blocks, bm.full_kv_indices
            bsz = bm.BLOCK_SIZE
            seq_q, seq_k = bm.seq_lengths
        except AttributeError as e:
            raise InputError(f"expected a flex_attention BlockMask, got {type(bm).__name__} ({e})") from None
        bm_q, bm_k = (bsz, bsz) if isinstance(bsz, int) else (int(bsz[0]), int(bsz[1]))
        g = _Geom(int(seq_q), int(seq_k), bm_q, bm_k)
        if kv_idx.dim() != 4:
            raise InputError(f"BlockMask.kv_indices must be [B, H, nq, nk], got {tuple(kv_idx.shape)}")

        def batch0(t: torch.Tensor, name: str) -> torch.Tensor:
            if t.shape[0] > 1 and not bool((t == t[:1]).all()):
                raise LayoutError(f"BlockMask.{name} differs across the batch; a layout broadcasts over batch, so "
                                  "build one layout per batch element")
            return t[0]

        def entries(num: torch.Tensor, idx: torch.Tensor, name: str):
            num, idx = batch0(num, name + "_num_blocks").long(), batch0(idx, name + "_indices").long()
            if idx.shape[1] != g.nq:
                raise LayoutError(f"BlockMask.{name}_indices has {idx.shape[1]} query-block rows, expected "
                                  f"ceil({g.seq_q}/{g.bm}) = {g.nq}")
            valid = torch.arange(idx.shape[2], device=idx.device) < num.unsqueeze(-1)
            h, r, j = valid.nonzero(as_tuple=True)
            c = idx[h, r, j]
            if bool(((c < 0) | (c >= g.nk)).any()):
                raise LayoutError(f"BlockMask.{name}_indices has key blocks outside [0, {g.nk})")
            return h, r, c, idx.shape[0]

        hp, rp, cp, hl = entries(kv_num, kv_idx, "kv")
        parts_h, parts_r, parts_c, parts_ruled = [hp], [rp], [cp], []
        have_rule = window_left is not None or window_right is not None
        wl = _window("window_left", -1 if window_left is None else window_left)
        wr = _window("window_right", -1 if window_right is None else window_right)
        ruled = torch.full(hp.shape, have_rule, dtype=torch.bool, device=hp.device)
        if wl >= 0 or wr >= 0:
            # Flex cannot call a block of the last key column (or query row) full when it reaches past seq_k
            # (seq_q): such a block is partial whether the mask_mod cuts it or only the sequence end does. The
            # ones the rule would cut or drop are ambiguous (a global block vs a band block); Flex's own semantics
            # decide: where the mask_mod keeps every valid element the block is FULL (BOUNDS is added below).
            edge = torch.zeros_like(ruled)
            if g.seq_k % g.bn:
                edge |= cp == g.nk - 1
            if g.seq_q % g.bm:
                edge |= rp == g.nq - 1
            _, rule_all = g.classify(rp, cp, wl, wr)
            amb = (edge & ~rule_all).nonzero().flatten()
            if amb.numel():
                whole = _mask_mod_keeps_all(bm, g, hp[amb], rp[amb], cp[amb])
                ruled[amb[whole]] = False
        parts_ruled.append(ruled)
        if full_num is not None:
            hf, rf, cf, hl_f = entries(full_num, full_idx, "full_kv")
            if hl_f != hl:
                raise LayoutError(f"BlockMask full and partial lists disagree on heads ({hl_f} vs {hl})")
            parts_h.append(hf)
            parts_r.append(rf)
            parts_c.append(cf)
            parts_ruled.append(torch.zeros(hf.shape, dtype=torch.bool, device=hf.device))
        lay = cls._build(g, hl, torch.cat(parts_h), torch.cat(parts_r), torch.cat(parts_c), wl, wr,
                         ruled=torch.cat(parts_ruled))
        return lay if device is None else lay.to(device)

    def to_flex_block_mask(self) -> Any:
        """A ``flex_attention.BlockMask`` with the same blocks: FULL blocks in Flex's full list, every block that
        needs an element mask (RULE and/or BOUNDS) in its partial list, and a ``mask_mod`` that computes this
        layout's exact element mask (listed block, ``k < seq_k``, and the rule on RULE blocks). Shape
        ``[1, Hl, nq, nk]`` (batch broadcasts). Holds O(Hl * nq * nk) like any BlockMask. Cached."""
        got = self._cache.get("flex")
        if got is None:
            got = self._cache["flex"] = self._make_flex_block_mask()
        return got

    def _make_flex_block_mask(self) -> Any:
        from torch.nn.attention.flex_attention import BlockMask

        hl, nq, nk = self.num_heads, self.n_qblocks, self.n_kblocks
        grid = self.to_kind_grid()                                  # int8, -1 = not listed
        dev = self.device
        order = torch.arange(nk, device=dev)

        def ordered(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            num = sel.sum(-1).to(torch.int32)
            # selected columns first, ascending; the rest after (as create_block_mask does)
            key = torch.where(sel, order, order + nk)
            idx = torch.sort(key, dim=-1).values % nk
            return num.unsqueeze(0), idx.to(torch.int32).unsqueeze(0)

        kv_num, kv_idx = ordered(grid > 0)
        full_num, full_idx = ordered(grid == 0)
        bm, bn, sq, sk = self._block_m, self._block_n, self._seq_q, self._seq_k
        wl, wr, off = self._window_left, self._window_right, self._seq_k - self._seq_q
        shared = hl == 1

        def mask_mod(b, h, q_idx, kv_idx):
            qb = q_idx // bm
            kb = torch.clamp(kv_idx // bn, max=nk - 1)
            qb = torch.clamp(qb, max=nq - 1)
            g = grid[0][qb, kb] if shared else grid[h, qb, kb]
            keep = (g >= 0) & (kv_idx < sk) & (q_idx < sq)
            qp = q_idx + off
            rule = (g & RULE) == 0
            ok = torch.ones_like(keep)
            if wl >= 0:
                ok = ok & (kv_idx >= qp - wl)
            if wr >= 0:
                ok = ok & (kv_idx <= qp + wr)
            return keep & (rule | ok)

        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bm, bn),
                                        mask_mod=mask_mod, seq_lengths=(sq, sk))

    # -- plotting ---------------------------------------------------------------------------------------------------
    def plot(self, path: str | os.PathLike, head: int = 0, *, title: str | None = None,
             dpi: int = 100) -> str:
        """Write a PNG heatmap of the block mask of layout head ``head``: FULL, RULE (partial: the rule cuts it),
        BOUNDS-only and empty blocks in different colors. Needs matplotlib (``pip install matplotlib``); uses the
        Agg canvas directly and leaves the global matplotlib backend alone. Returns the path."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.colors import ListedColormap
            from matplotlib.figure import Figure
            from matplotlib.patches import Patch
        except ImportError:
            raise ImportError("BlockSparseLayout.plot() needs matplotlib, an optional dependency: "
                              "pip install matplotlib") from None
        hd = _as_int("head", head, 0)
        if hd >= self.num_heads:
            raise LayoutError(f"head={hd} out of range: layout has {self.num_heads} head(s)")
        grid = self.cpu().to_kind_grid()[hd].to(torch.int64)
        # 0 not listed, 1 FULL, 2 BOUNDS, 3 RULE, 4 RULE + BOUNDS
        code = torch.where(grid < 0, 0, torch.where(grid == 0, 1, torch.where(grid == BOUNDS, 2, grid + 1)))
        colors = ["#f4f4f4", "#1f4e9c", "#8fb8e8", "#f28e2b", "#b5561a"]
        labels = ["not listed", "FULL", "BOUNDS (seq_k end)", "RULE (partial)", "RULE + BOUNDS"]
        nq, nk = code.shape
        fig = Figure(figsize=(min(9.0, 4.5 + 0.25 * nk), min(8.0, 2.0 + 0.25 * nq)), dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ax.imshow(code.numpy(), cmap=ListedColormap(colors), vmin=0, vmax=4, interpolation="nearest",
                  aspect="auto")
        ax.set_xlabel(f"key block (block_n={self._block_n}, seq_k={self._seq_k})")
        ax.set_ylabel(f"query block (block_m={self._block_m}, seq_q={self._seq_q})")
        ax.set_title(title or f"{self.nnz_per_head[hd]} blocks, density {self.density:.1%}, "
                              f"rule {_rule_desc(self._window_left, self._window_right)}", fontsize=9)
        present = sorted(set(code.unique().tolist()) | {0, 1})
        ax.legend(handles=[Patch(color=colors[i], label=labels[i]) for i in present], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png")
        return os.fspath(path)


# ----------------------------------------------------------------------------------------------------------------
# module helpers that need the class
# ----------------------------------------------------------------------------------------------------------------

def _as_tensor(name: str, x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:  # noqa: BLE001 - report any conversion failure the same way
        raise InputError(f"{name} must be a tensor or array, got {type(x).__name__} ({e})") from None


def _geom_for_blocks(nq: int, nk: int, seq_q: int | None, seq_k: int | None, block_m: int, block_n: int,
                     what: str) -> _Geom:
    bm = _as_int("block_m", block_m, 1)
    bn = _as_int("block_n", block_n, 1)
    g = _Geom(nq * bm if seq_q is None else seq_q, nk * bn if seq_k is None else seq_k, bm, bn)
    if g.nq != nq or g.nk != nk:
        raise LayoutError(f"{what} has {nq}x{nk} blocks but seq_q={g.seq_q}, seq_k={g.seq_k} with blocks "
                          f"{bm}x{bn} give {g.nq}x{g.nk}; pass matching seq_q/seq_k/block sizes")
    return g


# score elements from_scores(keep_diagonal=True) gathers at once (a float copy plus int64 column numbers)
_SCORES_CHUNK = 1 << 18


def _diag_plus_topk(s: torch.Tensor, d: torch.Tensor, kk: int) -> torch.Tensor:
    """int64 [H, nq, kk]: per row the column ``d[r]`` followed by ``torch.topk`` (kk - 1) of the row's other
    columns (taken from the row without column d, in column order).

    Rows are processed in chunks of about ``_SCORES_CHUNK`` score elements, so the extra memory is O(H * nq * kk)
    plus one chunk, never a copy of the scores: each chunk runs the very same gather + topk on its rows as a single
    pass over all rows would, and topk selects per row, so the result (ties included) does not depend on the
    chunking."""
    hl, nq, nk = s.shape
    dev = s.device
    out = torch.empty(hl, nq, kk, dtype=torch.int64, device=dev)
    out[:, :, 0] = d.unsqueeze(0)
    if kk == 1:
        return out
    step = max(1, _SCORES_CHUNK // max(1, hl * (nk - 1)))
    base = torch.arange(nk - 1, device=dev).unsqueeze(0)                          # [1, nk-1]
    for r0 in range(0, nq, step):
        dd = d[r0:r0 + step].unsqueeze(1)
        other = (base + (base >= dd).long()).unsqueeze(0).expand(hl, -1, -1)    # [H, n, nk-1]: columns but d
        sub = torch.gather(s[:, r0:r0 + step], 2, other)
        top = torch.topk(sub, kk - 1, dim=2).indices
        out[:, r0:r0 + step, 1:] = torch.gather(other, 2, top)
    return out


# elements of mask_mod evaluated at once by from_flex_block_mask (bool results plus int64 index temporaries)
_MASK_MOD_CHUNK = 1 << 20


def _mask_mod_keeps_all(block_mask: Any, g: _Geom, h: torch.Tensor, r: torch.Tensor,
                        c: torch.Tensor) -> torch.Tensor:
    """bool [n]: whether ``block_mask.mask_mod`` keeps every valid element (q < seq_q, k < seq_k) of the blocks
    (h, r, c). Evaluated like Flex does (``create_mask``, vmapped), in chunks of blocks; indices past the
    sequence ends are clamped so a mask_mod indexing per-position tensors stays in range (those elements are
    ignored)."""
    mask_mod = getattr(block_mask, "mask_mod", None)
    if mask_mod is None:
        return torch.ones(h.shape, dtype=torch.bool, device=h.device)
    from torch.nn.attention.flex_attention import create_mask

    dev = h.device
    out = torch.empty(h.shape, dtype=torch.bool, device=dev)
    step = max(1, _MASK_MOD_CHUNK // (g.bm * g.bn))
    qi, ki = torch.arange(g.bm, device=dev), torch.arange(g.bn, device=dev)
    for s in range(0, h.numel(), step):
        hh, q0, k0 = h[s:s + step], r[s:s + step] * g.bm, c[s:s + step] * g.bn

        def one_block(b, i, q, k, hh=hh, q0=q0, k0=k0):
            return mask_mod(b, hh[i], torch.clamp(q0[i] + q, max=g.seq_q - 1),
                            torch.clamp(k0[i] + k, max=g.seq_k - 1))

        try:
            got = create_mask(one_block, 1, hh.numel(), g.bm, g.bn, device=dev)[0].bool()
        except Exception as e:  # noqa: BLE001 - any failure of user code is reported the same way
            raise InputError(f"evaluating the BlockMask's mask_mod on its boundary blocks failed ({e!r}); "
                             "it must work under torch.vmap like flex_attention's create_mask needs") from None
        valid = (((q0.unsqueeze(1) + qi) < g.seq_q).unsqueeze(2)
                 & ((k0.unsqueeze(1) + ki) < g.seq_k).unsqueeze(1))
        out[s:s + step] = (got | ~valid).flatten(1).all(1)
    return out


def _rebuild(row_ptr, col_idx, block_kind, seq_q, seq_k, block_m, block_n, wl, wr) -> BlockSparseLayout:
    return BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=seq_q, seq_k=seq_k, block_m=block_m,
                             block_n=block_n, window_left=wl, window_right=wr)


# torch.load's default (weights_only=True) unpickles only allow-listed globals: a saved layout rebuilds through
# _rebuild, which validates every tensor like the public constructor, so it is safe to allow.
torch.serialization.add_safe_globals([_rebuild])
