"""Block-sparse row (BSR) storage of a layout: the tensors, their validation, equality, device copies, the
transpose, and the schedules a kernel reads. Generic: nothing here knows what the element rule means (that is
``attention.py``); the rule is carried as two integers and the RULE bit.

Storage (CSR over block rows)
-----------------------------
``Hl`` is the number of layout heads: 1 (one layout shared by every head) or ``H`` (one per head). Batch always
broadcasts. ``nq = ceil(seq_q / block_m)`` block rows, ``nk = ceil(seq_k / block_n)`` block columns.

``row_ptr``    int32 ``[Hl, nq + 1]``; ``row_ptr[h, 0] == 0``, non-decreasing. Row ``r`` of head ``h`` lists its
               blocks at ``col_idx[h, row_ptr[h, r]:row_ptr[h, r + 1]]``.
``col_idx``    int32 ``[Hl, nnz_max]``, ``nnz_max = max(1, max_h row_ptr[h, -1])``; within a row sorted ascending,
               unique, in ``[0, nk)``; padding after ``row_ptr[h, -1]`` is 0.
``block_kind`` uint8, same shape as ``col_idx`` (padding 0), bit flags per listed block:
               ``FULL = 0`` (no element mask), ``BOUNDS = 1`` (the block reaches past ``seq_k``: mask ``k >= seq_k``),
               ``RULE = 2`` (apply the element rule). ``3`` = both. BOUNDS is set exactly on the listed blocks of the
               last column when ``seq_k % block_n != 0``; RULE only on a layout that has a rule.

What a kernel reads
-------------------
The row schedule (``schedule.py``: one 16-byte entry per block row, heaviest first) and the rows' blocks in
``col_idx`` / ``block_kind``; for a layout with a few long rows, the split schedule (``split.py``).

Views are derived from the one BSR on the layout's device and cached on it. On a CUDA device the views a kernel
reads (the row schedule, the transpose and its schedule) are built when the layout is built there or moved there,
never lazily inside a traced or captured region; elsewhere they are built on first use. Every tensor the layout
validated or derived itself is marked in ``blackwell_sparsek._trusted`` so the ops need not check its values again.

Layouts are immutable: attributes are read-only and the tensors must not be mutated in place (they are shared with
cached device copies and derived layouts). Every transform returns a new layout.
"""
from __future__ import annotations

from typing import Any

import torch

from .._trusted import mark as _mark_checked
from ..errors import LayoutError
from ._common import BOUNDS, FULL, MAX_DENSE_BLOCKS, RULE, as_int, as_window, cdiv, normalize_device, rule_desc
from .schedule import MAX_SCHEDULE_KBLOCKS, build_row_schedule, packed_first, row_facts, sort_rows
from .split import split_schedule as build_split_schedule
# device types on which the views a kernel reads are built with the layout (elsewhere lazily, on first use)
_EAGER_VIEW_DEVICES = ("cuda",)


class BsrBase:
    """The generic part of ``BlockSparseLayout`` (storage, validation, equality, devices, transpose, schedules).
    Not used alone: ``BlockSparseLayout`` adds the attention rule, the constructors and interop. Methods that make a
    new layout make one of ``type(self)``, so derived layouts (device copies, transposes) keep the public type.
    """

    __slots__ = ("_row_ptr", "_col_idx", "_block_kind", "_seq_q", "_seq_k", "_block_m", "_block_n",
                 "_window_left", "_window_right", "_nnz_per_head", "_copies", "_cache", "_frozen")

    FULL = FULL
    BOUNDS = BOUNDS
    RULE = RULE

    def __init__(self, row_ptr: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor, *,
                 seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
                 window_left: int = -1, window_right: int = -1):
        sq = as_int("seq_q", seq_q, 1)
        sk = as_int("seq_k", sq if seq_k is None else seq_k, 1)
        self._init(row_ptr, col_idx, block_kind, sq, sk, as_int("block_m", block_m, 1),
                   as_int("block_n", block_n, 1), as_window("window_left", window_left),
                   as_window("window_right", window_right), None)
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

    @classmethod
    def _trusted(cls, row_ptr, col_idx, block_kind, sizes: tuple[int, int, int, int], wl: int, wr: int, *,
                 check: bool = True, nnz_per_head: list[int] | None = None, cache: dict | None = None):
        """A layout from tensors this package made: validated unless ``check=False`` (for tensors derived from a
        validated layout); ``sizes`` = (seq_q, seq_k, block_m, block_n); ``cache`` seeds views already known."""
        self = cls.__new__(cls)
        self._init(row_ptr, col_idx, block_kind, *sizes, wl, wr, nnz_per_head)
        if check:
            self.validate()
        if nnz_per_head is None:
            self._set_nnz()
        if cache:
            self._cache.update(cache)
        self._finish()
        return self

    def _finish(self) -> None:
        """Freeze; mark the (validated or derived) kernel tensors as checked; on a CUDA device build the views a
        kernel reads now. Building them lazily on first use would, under torch.compile or CUDA-graph capture,
        make them intermediates of the traced region (overwritten by a later replay) instead of inputs."""
        object.__setattr__(self, "_frozen", True)
        _mark_checked(self._row_ptr, self._col_idx, self._block_kind)
        if self.device.type != "meta" and "row_stats" not in self._cache:
            self._row_facts()  # one small sync now, so later calls (and traced code) read numbers
        if self.device.type in _EAGER_VIEW_DEVICES:
            self._build_kernel_views()

    def _build_kernel_views(self) -> None:
        """The row schedule, the transpose and its schedule (for a backward pass), and the row statistics the
        ops read (for the transpose: one small host sync here rather than inside a traced region)."""
        for lay in (self, self.transpose()):
            if lay.n_kblocks <= MAX_SCHEDULE_KBLOCKS:  # beyond, no kernel can take it: row_schedule() says why
                lay.row_schedule()
            if lay.device.type != "meta":  # no values to count on meta
                lay.row_stats()
        if self.device.type != "meta" and self.split_plan() is not None:
            self.split_schedule()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (cannot set {name!r}); build a new layout instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

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
        return cdiv(self._seq_q, self._block_m)

    @property
    def n_kblocks(self) -> int:
        return cdiv(self._seq_k, self._block_n)

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

    def _sizes(self) -> tuple[int, int, int, int]:
        return (self._seq_q, self._seq_k, self._block_m, self._block_n)

    # -- validation ---------------------------------------------------------------------------------------------
    def validate(self):
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

    # -- equality, repr -------------------------------------------------------------------------------------------
    def _key(self) -> tuple:
        return (self._seq_q, self._seq_k, self._block_m, self._block_n, self._window_left, self._window_right,
                tuple(self._nnz_per_head))

    def _with_values(self) -> "BsrBase | None":
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
        if not isinstance(other, BsrBase):
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
        return (f"{type(self).__name__}(seq_q={self._seq_q}, seq_k={self._seq_k}, "
                f"block={self._block_m}x{self._block_n}, blocks={self.n_qblocks}x{self.n_kblocks}, "
                f"heads={self.num_heads}, nnz={self.nnz}, density={self.density:.2%}, "
                f"rule={rule_desc(self._window_left, self._window_right)}, device={self.device})")

    # -- devices --------------------------------------------------------------------------------------------------
    def to(self, device: Any):
        """This layout on ``device``. Copies are cached and shared: ``.to(d)`` twice returns the same object, and
        ``.to(self.device)`` returns self."""
        dev = normalize_device(device)
        if dev == self.device:
            return self
        copies = self._copies
        if copies is None:
            copies = {self.device: self}
            object.__setattr__(self, "_copies", copies)
        other = copies.get(dev)
        if other is None:
            known = {key: self._cache[key] for key in ("uniform_rows", "row_stats", "split_plan") if key in self._cache}
            other = type(self)._trusted(self._row_ptr.to(dev), self._col_idx.to(dev), self._block_kind.to(dev),
                                        self._sizes(), self._window_left, self._window_right, check=False,
                                        nnz_per_head=self._nnz_per_head, cache=known)
            object.__setattr__(other, "_copies", copies)
            copies[dev] = other
        return other

    def _placed(self, device: Any):
        """``to(device)``, where None (accepted by every constructor) keeps the layout where it was built."""
        return self if device is None else self.to(device)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device: Any = None):
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
        """True when every query-block row (of every head) lists the same number of blocks. Cached with
        row_stats(). The kernel's scheduler keeps a head's rows together when rows are equal (K/V reuse in L2)
        and orders tiles heaviest-first across heads when they are not (load balance)."""
        if "uniform_rows" not in self._cache:
            self._row_facts()
        return self._cache["uniform_rows"]

    def row_stats(self) -> tuple[float, float, float]:
        """(mean, cv, short) of the rows' block counts over every layout head: the mean, the coefficient of
        variation (std / mean) and the fraction of rows shorter than the longest, rounded to 1e-4. Cached;
        computed with the layout (one small host sync there), so the ops and traced code only read numbers.
        sparse_attention's default schedule keys on it (ops/dispatch.py)."""
        if "row_stats" not in self._cache:
            self._row_facts()
        return self._cache["row_stats"]

    def _row_facts(self) -> None:
        """uniform_rows(), row_stats() and split_plan() from one reduction and one host sync."""
        facts = row_facts(self.row_counts(), self._partial_last())
        self._cache["uniform_rows"], self._cache["row_stats"], self._cache["split_plan"] = facts

    def _partial_last(self) -> bool:
        return self._seq_q % self._block_m != 0

    def split_plan(self) -> tuple[int, int] | None:
        """(S, K): the S longest rows of every head run as K pieces each (split-KV, layout/split.py), or None when
        the rows' lengths are not skewed enough. Cached with row_stats()."""
        if "split_plan" not in self._cache:
            self._row_facts()
        return self._cache["split_plan"]

    def split_schedule(self) -> torch.Tensor:
        """int32 [Hl, nq - S + S * K, 4]: the row schedule with the S longest rows of every head as K pieces each,
        pieces first (layout/split.py). Cached; built with the layout on CUDA. LayoutError without a split_plan()."""
        got = self._cache.get("split_schedule")
        if got is None:
            sk = self.split_plan()
            if sk is None:
                raise LayoutError("this layout's rows are not skewed enough to split (split_plan() is None); use "
                                  "row_schedule()")
            got = build_split_schedule(self.row_counts(), self.row_ptr, self.row_schedule(),
                                        packed_first(self.col_idx, self.block_kind), *sk,
                                        self._partial_last())
            _mark_checked(got)
            self._cache["split_schedule"] = got
        return got

    def row_order(self) -> torch.Tensor:
        """int32 [Hl, nq]: query-block rows by descending block count, ties in row order (the kernel's). Cached."""
        got = self._cache.get("row_order")
        if got is None:
            got = sort_rows(self.row_counts())
            self._cache["row_order"] = got
        return got

    def row_schedule(self) -> torch.Tensor:
        """int32 [Hl, nq, 4], contiguous: (row, start, end, first) per query-block row in ``row_order()``
        (``schedule.py``), what the kernel's tile scheduler reads, one 16-byte entry a tile. Cached."""
        got = self._cache.get("row_schedule")
        if got is None:
            got = build_row_schedule(self.row_ptr, self.col_idx, self.block_kind, self.row_order(),
                                         self.n_kblocks)
            _mark_checked(got)
            self._cache["row_schedule"] = got
        return got

    def to_dense_mask(self) -> torch.Tensor:
        """bool [Hl, nq, nk]: which blocks are listed."""
        hl, nq, nk = self.num_heads, self.n_qblocks, self.n_kblocks
        if hl * nq * nk > MAX_DENSE_BLOCKS:
            raise LayoutError(f"to_dense_mask() would hold {hl * nq * nk} entries (> {MAX_DENSE_BLOCKS}); "
                              "use larger blocks or iterate row_ptr/col_idx")
        h, r, c, _ = self._coo()
        out = torch.zeros(hl, nq, nk, dtype=torch.bool, device=self.device)
        out[h, r, c] = True
        return out

    def to_kind_grid(self) -> torch.Tensor:
        """int8 [Hl, nq, nk]: the block kind of each listed block, -1 where no block is listed."""
        hl, nq, nk = self.num_heads, self.n_qblocks, self.n_kblocks
        if hl * nq * nk > MAX_DENSE_BLOCKS:
            raise LayoutError(f"to_kind_grid() would hold {hl * nq * nk} entries (> {MAX_DENSE_BLOCKS})")
        h, r, c, k = self._coo()
        grid = torch.full((hl, nq, nk), -1, dtype=torch.int8, device=self.device)
        grid[h, r, c] = k.to(torch.int8)
        return grid

    def transpose(self):
        """The same layout over the other axis, as the same type: rows are key blocks, ``seq_q``/``seq_k`` and
        ``block_m``/``block_n`` swapped, and row ``c`` lists the query blocks that list key block ``c`` here
        (ascending), with their kinds. Cached both ways: ``x.transpose().transpose() is x``.

        The element rule swaps too: with ``q' = q + seq_k - seq_q`` the rule keeps ``q' - wl <= k <= q' + wr``, i.e.
        ``k' - wr <= q <= k' + wl`` with ``k' = k + seq_q - seq_k``, so ``window_left' = window_right`` and
        ``window_right' = window_left``, exactly. RULE bits are kept (the same elements are cut); BOUNDS is
        recomputed for the new last column (the query end, when ``seq_q % block_m != 0``). Computed on the
        layout's device with no host sync (the per-head block counts are already known on the host), so the
        heaviest-key-columns-first ``row_schedule()`` of the result serves a backward pass or a GEMM with the same
        scheduler and cursor as the forward pass."""
        got = self._cache.get("transpose")
        if got is None:
            got = self._make_transpose()
            self._cache["transpose"] = got
        return got

    def _make_transpose(self):
        rp, ci, bk = self._row_ptr.long(), self._col_idx, self._block_kind
        hl, m = ci.shape
        nq, nk = self.n_qblocks, self.n_kblocks
        dev = ci.device
        pos = torch.arange(m, device=dev).expand(hl, m).contiguous()
        valid = pos < rp[:, -1:]                                  # the first nnz_h positions of each head
        rows = torch.searchsorted(rp, pos, right=True) - 1        # block row of every listed entry
        # Entries are stored row-major with ascending columns; a stable sort on the column alone gives
        # column-major order with ascending rows within a column. Padding sorts last (key nk), so the first nnz_h
        # positions of each head stay the listed ones.
        key = torch.where(valid, ci.long(), nk)
        sorted_key, order = torch.sort(key, dim=1, stable=True)
        new_idx = torch.where(valid, torch.gather(rows, 1, order), 0).to(torch.int32)
        kind = torch.gather(bk, 1, order) & RULE                  # BOUNDS belonged to the old last column
        if self._seq_q % self._block_m:
            kind = kind | (new_idx == nq - 1).to(torch.uint8) * BOUNDS
        new_kind = torch.where(valid, kind, 0).to(torch.uint8)
        # new row_ptr[h, c] = entries with column < c: a search in the sorted keys (no atomics, deterministic)
        cols = torch.arange(nk + 1, device=dev).expand(hl, nk + 1).contiguous()
        new_ptr = torch.searchsorted(sorted_key, cols).to(torch.int32)
        sizes = (self._seq_k, self._seq_q, self._block_n, self._block_m)
        return type(self)._trusted(new_ptr, new_idx, new_kind, sizes, self._window_right, self._window_left,
                                   check=False, nnz_per_head=self._nnz_per_head, cache={"transpose": self})

    def _repeat_heads(self, num_heads: int):
        n = as_int("num_heads", num_heads, 1)
        if n == 1:
            return self
        return type(self)._trusted(self._row_ptr.repeat(n, 1), self._col_idx.repeat(n, 1),
                                   self._block_kind.repeat(n, 1), self._sizes(), self._window_left,
                                   self._window_right, check=False, nnz_per_head=self._nnz_per_head * n)
