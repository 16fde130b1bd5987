"""Layout constructors: attention patterns (dense, causal, sliding windows, strided, dilated, global + local,
random top-k) and layouts from a block mask or block scores. All build O(listed blocks) index data on the CPU
(from_block_mask / from_scores: on the input's device) and never an ``[nq, nk]`` mask for a pattern.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError, LayoutError
from ._common import BOUNDS, RULE, as_int, as_tensor, as_window, compress
from .attention import Geom, ranges


class Patterns:
    """Mixin of ``BlockSparseLayout``: its classmethod constructors."""

    __slots__ = ()

    @classmethod
    def _rule_layout(cls, g: Geom, wl: int, wr: int, num_heads: int, device: Any) -> "BlockSparseLayout":
        r, c, cut = g.band(wl, wr)
        kind = cut.to(torch.uint8) * RULE
        if g.seq_k % g.bn:
            kind |= (c == g.nk - 1).to(torch.uint8) * BOUNDS
        ptr, idx, kinds = compress(1, g.nq, g.nk, torch.zeros_like(r), r, c, kind, presorted=True)
        lay = cls._trusted(ptr, idx, kinds, g.sizes, wl, wr)
        return lay._repeat_heads(num_heads)._placed(device)

    @classmethod
    def dense(cls, seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
              num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """Every block; no rule (BOUNDS on the last key column when seq_k % block_n != 0)."""
        return cls._rule_layout(Geom(seq_q, seq_k, block_m, block_n), -1, -1, num_heads, device)

    @classmethod
    def causal(cls, seq_q: int, seq_k: int | None = None, block_m: int = 128, block_n: int = 128,
               num_heads: int = 1, device: Any = "cpu") -> "BlockSparseLayout":
        """Bottom-right aligned causal: rule (-1, 0), keep k <= q + seq_k - seq_q."""
        return cls._rule_layout(Geom(seq_q, seq_k, block_m, block_n), -1, 0, num_heads, device)

    @classmethod
    def sliding_window(cls, seq_q: int, window: int, seq_k: int | None = None, block_m: int = 128,
                       block_n: int = 128, causal: bool = True, num_heads: int = 1,
                       device: Any = "cpu") -> "BlockSparseLayout":
        """Sliding window of ``window`` keys per query, bottom-right aligned.

        ``causal=True``: rule (window - 1, 0), i.e. keys q' - window + 1 .. q' (``window`` keys including itself).
        ``causal=False``: rule (window - 1, window - 1), i.e. keys q' - window + 1 .. q' + window - 1."""
        w = as_int("window", window, 1)
        wr = 0 if causal else w - 1
        return cls._rule_layout(Geom(seq_q, seq_k, block_m, block_n), w - 1, wr, num_heads, device)

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
        g = Geom(seq_q, seq_k, block_m, block_n)
        s = as_int("stride", stride, 1)
        loc = as_int("local", local, 0)
        rows = torch.arange(g.nq)
        d = g.diag(rows)
        lo_off = -(loc - 1) if loc else 0
        hi_off = 0 if causal else max(loc - 1, 0)
        width = hi_off - lo_off + 1 if loc else 0
        r1, c1 = ranges(d + lo_off, torch.full_like(d, width))
        strided_cols = torch.arange(0, g.nk, s)
        r2 = rows.repeat_interleave(strided_cols.numel())
        c2 = strided_cols.repeat(g.nq)
        if causal:
            ok2 = c2 <= d[r2]
            r2, c2 = r2[ok2], c2[ok2]
        r, c = torch.cat([r1, r2]), torch.cat([c1, c2])
        return cls._from_candidates(g, r, c, causal, num_heads, device)

    @classmethod
    def _from_candidates(cls, g: Geom, r: torch.Tensor, c: torch.Tensor, causal: bool, num_heads: int,
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
        g = Geom(seq_q, seq_k, block_m, block_n)
        n = as_int("n_blocks", n_blocks, 1)
        dil = as_int("dilation", dilation, 1)
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
        g = Geom(seq_q, seq_k, block_m, block_n)
        ng = as_int("n_global", n_global, 0)
        w = as_int("window", window, 1)
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
        g = Geom(seq_q, seq_k, block_m, block_n)
        kk = min(as_int("k", k, 1), g.nk)
        hl = as_int("num_heads", num_heads, 1)
        gen = torch.Generator().manual_seed(as_int("seed", seed, 0))
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
        m = as_tensor("mask", mask)
        if m.dtype != torch.bool:
            raise InputError(f"mask must be a bool tensor, got {m.dtype}; pass mask.bool() or mask != 0")
        if m.dim() == 2:
            m = m.unsqueeze(0)
        if m.dim() != 3 or m.shape[0] < 1 or m.shape[1] < 1 or m.shape[2] < 1:
            raise InputError(f"mask must be [nq, nk] or [H, nq, nk] with non-zero sizes, got {tuple(m.shape)}")
        hl, nq, nk = m.shape
        g = _geom_for_blocks(nq, nk, seq_q, seq_k, block_m, block_n, "mask")
        h, r, c = m.nonzero(as_tuple=True)
        wl, wr = as_window("window_left", window_left), as_window("window_right", window_right)
        lay = cls._build(g, hl, h, r, c, wl, wr, presorted=True)
        return lay._placed(device)

    @classmethod
    def from_scores(cls, scores: torch.Tensor, k: int, keep_diagonal: bool = True, seq_q: int | None = None,
                    seq_k: int | None = None, block_m: int = 128, block_n: int = 128) -> "BlockSparseLayout":
        """Top-k key blocks per row from block scores ``[nq, nk]`` or ``[H, nq, nk]`` (float), via ``torch.topk``
        on the scores' device (the layout lives there). No rule.

        ``keep_diagonal=False``: exactly ``torch.topk(scores, k, dim=-1).indices``.
        ``keep_diagonal=True``: the diagonal block ``diag(r)`` plus ``torch.topk`` (k - 1) over the row's other
        blocks. ``k`` is clamped to nk. Every selected block is listed, whatever its score (-inf included).
        Extra memory O(H * nq * k) plus a bounded chunk of rows: the scores are never copied."""
        s = as_tensor("scores", scores)
        if not s.is_floating_point():
            raise InputError(f"scores must be a floating-point tensor, got {s.dtype}; pass scores.float()")
        if s.dim() == 2:
            s = s.unsqueeze(0)
        if s.dim() != 3 or min(s.shape) < 1:
            raise InputError(f"scores must be [nq, nk] or [H, nq, nk] with non-zero sizes, got {tuple(s.shape)}")
        hl, nq, nk = s.shape
        g = _geom_for_blocks(nq, nk, seq_q, seq_k, block_m, block_n, "scores")
        kk = min(as_int("k", k, 1), nk)
        dev = s.device
        if keep_diagonal:
            cols = _diag_plus_topk(s, g.diag(torch.arange(nq, device=dev)), kk)
        else:
            cols = torch.topk(s, kk, dim=2).indices
        cols = torch.sort(cols, dim=2).values
        ncol = cols.shape[2]
        flat = torch.arange(hl * nq, device=dev).repeat_interleave(ncol)
        return cls._build(g, hl, flat // nq, flat % nq, cols.reshape(-1), -1, -1, presorted=True)


def _geom_for_blocks(nq: int, nk: int, seq_q: int | None, seq_k: int | None, block_m: int, block_n: int,
                     what: str) -> Geom:
    bm = as_int("block_m", block_m, 1)
    bn = as_int("block_n", block_n, 1)
    g = Geom(nq * bm if seq_q is None else seq_q, nk * bn if seq_k is None else seq_k, bm, bn)
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
