"""The attention element rule (causal / sliding windows), block geometry, and the transforms built on them.

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

The "diagonal block" of query-block row ``r`` (used by ``strided``, ``dilated`` and ``from_scores``) is the key block
holding the bottom-right aligned position of the row's last query:
``diag(r) = clamp((min((r + 1) * block_m, seq_q) - 1 + seq_k - seq_q) // block_n, 0, nk - 1)``.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import LayoutError
from ._common import BOUNDS, FULL, MAX_ELEMENT_MASK, RULE, as_int, cdiv, compress, normalize_device


def element_rule(seq_q: int, seq_k: int, wl: int, wr: int, device: Any) -> torch.Tensor:
    """bool [seq_q, seq_k]: the element rule, bottom-right aligned."""
    qp = torch.arange(seq_q, device=device).unsqueeze(1) + (seq_k - seq_q)
    k = torch.arange(seq_k, device=device).unsqueeze(0)
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if wl >= 0:
        keep &= k >= qp - wl
    if wr >= 0:
        keep &= k <= qp + wr
    return keep



class Geom:
    """Sizes shared by constructors."""

    def __init__(self, seq_q: Any, seq_k: Any, block_m: Any, block_n: Any):
        self.seq_q = as_int("seq_q", seq_q, 1)
        self.seq_k = as_int("seq_k", self.seq_q if seq_k is None else seq_k, 1)
        self.bm = as_int("block_m", block_m, 1)
        self.bn = as_int("block_n", block_n, 1)
        self.nq = cdiv(self.seq_q, self.bm)
        self.nk = cdiv(self.seq_k, self.bn)
        self.off = self.seq_k - self.seq_q

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return (self.seq_q, self.seq_k, self.bm, self.bn)

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
        rows, cols = ranges(c_lo, width)
        if wl < 0 and wr < 0:
            cut = torch.zeros(cols.shape, dtype=torch.bool, device=device)
        else:
            cut = (cols < f_lo[rows]) | (cols > f_hi[rows])
        return rows, cols, cut


def ranges(start: torch.Tensor, width: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For row i the values start[i] .. start[i] + width[i] - 1, flattened row-major: (row ids, values)."""
    total = int(width.sum())
    rows = torch.repeat_interleave(torch.arange(width.numel(), device=width.device), width, output_size=total)
    first = torch.cumsum(width, 0) - width
    vals = torch.arange(total, device=width.device) - first[rows] + start[rows]
    return rows, vals


class AttentionRule:
    """Mixin of ``BlockSparseLayout``: what the element rule means for a layout (its exact element mask, the
    causal intersection, the inputs it fits) and ``_build``, which intersects candidate blocks with a rule."""

    __slots__ = ()

    def _geom(self) -> Geom:
        return Geom(*self._sizes())

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
        if device is not None and normalize_device(device) != self.device:
            raise LayoutError(f"layout is on {self.device} but the inputs are on {torch.device(device)}; "
                              f"use layout.to({str(torch.device(device))!r})")

    def to_element_mask(self) -> torch.Tensor:
        """bool [Hl, seq_q, seq_k]: the exact element mask implied by blocks, kinds, rule and bounds.
        For tests and references; refused (LayoutError) above 64M elements."""
        hl, sq, sk = self.num_heads, self._seq_q, self._seq_k
        if hl * sq * sk > MAX_ELEMENT_MASK:
            raise LayoutError(f"to_element_mask() would hold {hl}x{sq}x{sk} = {hl * sq * sk} elements "
                              f"(> {MAX_ELEMENT_MASK}); it is meant for tests and references on small sizes")
        grid = self.to_kind_grid()
        dev = self.device
        qb = torch.arange(sq, device=dev) // self._block_m
        kb = torch.arange(sk, device=dev) // self._block_n
        g = grid[:, qb][:, :, kb]
        rule = element_rule(sq, sk, self._window_left, self._window_right, dev)
        return (g >= 0) & (((g & RULE) == 0) | rule)

    def with_causal(self):
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
        ptr, idx, kinds = compress(self.num_heads, g.nq, g.nk, h[sel], r[sel], c[sel], new_kind[sel],
                                   presorted=True)
        got = type(self)._trusted(ptr, idx, kinds, g.sizes, wl, 0)
        self._cache["causal"] = got
        return got

    @classmethod
    def _build(cls, g: Geom, n_heads: int, h: torch.Tensor, r: torch.Tensor, c: torch.Tensor,
               wl: int, wr: int, *, ruled: torch.Tensor | bool = True,
               presorted: bool = False):
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
        ptr, idx, kinds = compress(n_heads, g.nq, g.nk, h, r, c, kind, presorted=presorted)
        return cls._trusted(ptr, idx, kinds, g.sizes, wl, wr)
