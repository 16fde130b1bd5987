"""Interop: FlashInfer/SciPy BSR in and out, FlexAttention ``BlockMask`` both ways, and a PNG picture."""
from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import InputError, LayoutError
from ._common import BOUNDS, RULE, as_int, as_tensor, as_window, rule_desc
from .attention import Geom


class Interop:
    """Mixin of ``BlockSparseLayout``: conversions to and from other libraries' block-sparse forms, and ``plot``."""

    __slots__ = ()

    def to_bsr(self, squeeze: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(indptr, indices) in FlashInfer/SciPy BSR form. With one layout head and ``squeeze``: 1-D
        ``[nq + 1]`` and ``[nnz]``; otherwise the stored ``row_ptr`` and ``col_idx`` ([Hl, ...], zero-padded)."""
        if squeeze and self.num_heads == 1:
            return self._row_ptr[0], self._col_idx[0, :self.nnz]
        return self._row_ptr, self._col_idx

    @classmethod
    def from_bsr(cls, indptr: Any, indices: Any, seq_q: int, seq_k: int | None = None, block_m: int = 128,
                 block_n: int = 128, *, window_left: int = -1, window_right: int = -1,
                 device: Any = None) -> "BlockSparseLayout":
        """From FlashInfer/SciPy-style BSR: ``indptr [nq + 1]`` + ``indices [>= nnz]`` (shared), or per head
        ``indptr [H, nq + 1]`` + ``indices [H, >= max nnz]``. Column indices may be unsorted and repeated within a
        row (they are sorted and merged). A rule intersects like in ``from_block_mask``."""
        ip = as_tensor("indptr", indptr)
        ix = as_tensor("indices", indices)
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
        g = Geom(seq_q, seq_k, block_m, block_n)
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
        wl, wr = as_window("window_left", window_left), as_window("window_right", window_right)
        lay = cls._build(g, ix.shape[0], h, rows[h, p], ix[h, p], wl, wr, presorted=False)
        return lay._placed(device)

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
        g = Geom(int(seq_q), int(seq_k), bm_q, bm_k)
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
        wl = as_window("window_left", -1 if window_left is None else window_left)
        wr = as_window("window_right", -1 if window_right is None else window_right)
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
        return lay._placed(device)

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
        hd = as_int("head", head, 0)
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
                              f"rule {rule_desc(self._window_left, self._window_right)}", fontsize=9)
        present = sorted(set(code.unique().tolist()) | {0, 1})
        ax.legend(handles=[Patch(color=colors[i], label=labels[i]) for i in present], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png")
        return os.fspath(path)


# elements of mask_mod evaluated at once by from_flex_block_mask (bool results plus int64 index temporaries)
_MASK_MOD_CHUNK = 1 << 20


def _mask_mod_keeps_all(block_mask: Any, g: Geom, h: torch.Tensor, r: torch.Tensor,
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
