"""Views of a BSR layout that the BSR GEMM kernels read (families/bsr_gemm.py), derived on the layout's device
with no host sync and cached on the layout, like its row schedule and transpose (DESIGN.md, convention 5).

* ``transposed_value_index(layout)``: for each listed block of ``layout.transpose()`` (column-major order), its
  index in the original values (row-major order) -- so Aᵀ·B reads A's values where they are, with no transposed
  copy. ``layout.transpose().col_idx`` gives the block's row in A at the same positions.
* ``sdd_schedule(layout, sm_count)``: the SDD work list, int32 ``[nnz, 4]`` entries ``(row, col, value, 0)`` in an
  order that keeps the output blocks running at one time on few block rows and block columns (L2 reuse of A's row
  strips and B's column strips).
"""
from __future__ import annotations

import math

import torch

from .._trusted import mark as _mark_checked


def transposed_value_index(layout) -> torch.Tensor:
    """int32 ``[Hl, nnz_max]``: position ``q`` of ``layout.transpose()``'s listed blocks -> the index of that block in
    ``layout``'s values (``col_idx`` order). Padding positions hold 0. The same stable sort on the block column that
    builds the transpose (bsr.py), so the positions agree exactly (a test checks)."""
    cache = layout._cache  # the layout's view cache (bsr.py): derived tensors live and die with the layout
    got = cache.get("gemm_transposed_value_index")
    if got is None:
        rp, ci = layout.row_ptr.long(), layout.col_idx
        hl, m = ci.shape
        pos = torch.arange(m, device=ci.device).expand(hl, m)
        valid = pos < rp[:, -1:]
        key = torch.where(valid, ci.long(), layout.n_kblocks)
        order = torch.sort(key, dim=1, stable=True).indices
        # the transpose lists as many blocks per head, first: its valid positions are these
        got = torch.where(valid, order, 0).to(torch.int32).contiguous()
        _mark_checked(got)
        cache["gemm_transposed_value_index"] = got
    return got


def dsd_operands(layout, transpose: bool) -> tuple:
    """What a DSD (``transpose``: DSD_T) launch reads from the layout, cached with it: (row schedule [n_items, 4],
    per listed block B's block row, DSD_T's value index or None, output rows, reduction length). One head; views,
    so that a call indexes nothing."""
    key = "gemm_dsd_t_operands" if transpose else "gemm_dsd_operands"
    got = layout._cache.get(key)
    if got is None:
        if transpose:
            t = layout.transpose()
            got = (t.row_schedule()[0], t.col_idx[0], transposed_value_index(layout)[0], layout.seq_k,
                   layout.seq_q)
        else:
            got = (layout.row_schedule()[0], layout.col_idx[0], None, layout.seq_q, layout.seq_k)
        layout._cache[key] = got
    return got


def block_rows(layout) -> torch.Tensor:
    """int64 ``[Hl, nnz_max]``: the block row of each listed block (padding: the last row + 1)."""
    rp, ci = layout.row_ptr.long(), layout.col_idx
    hl, m = ci.shape
    pos = torch.arange(m, device=ci.device).expand(hl, m).contiguous()
    return torch.searchsorted(rp, pos, right=True) - 1


def sdd_group_rows(layout, sm_count: int) -> int:
    """Block rows per group of the SDD order: about sqrt(sm_count / density), so the ``sm_count`` blocks running at
    once span about as many block rows as block columns."""
    density = max(layout.density, 1e-9)
    return max(1, min(layout.n_qblocks, round(math.sqrt(sm_count / density))))


def sdd_schedule(layout, sm_count: int = 132, pairs: bool = False) -> torch.Tensor:
    """int32 ``[nnz, 4]`` (head 0; the GEMM layouts have one head): ``(row, col, value, 0)`` per listed block,
    ordered by (row group, column, row) with ``sdd_group_rows`` rows per group. Cached per group size.
    ``pairs``: the CTA-pair kernels' list instead (``sdd_pair_schedule``)."""
    if pairs:
        return sdd_pair_schedule(layout, sm_count)
    group = sdd_group_rows(layout, sm_count)
    key_name = f"gemm_sdd_schedule_{group}"
    cache = layout._cache
    got = cache.get(key_name)
    if got is None:
        nnz = layout.nnz_per_head[0]
        ci = layout.col_idx[0, :nnz].long()
        rows = block_rows(layout)[0, :nnz]
        key = (rows // group) * layout.n_kblocks + ci
        order = torch.sort(key, stable=True).indices  # rows ascend within a key: entries are row-major
        got = torch.stack([rows[order], ci[order], order, torch.zeros_like(order)], dim=1).to(torch.int32)
        got = got.contiguous()
        _mark_checked(got)
        cache[key_name] = got
    return got


def sdd_pair_schedule(layout, sm_count: int = 132) -> torch.Tensor:
    """int32 ``[2 * P, 4]``, P = (nnz + block rows) // 2: entries ``2i, 2i + 1`` are one item of the CTA-pair SDD
    kernel, two listed blocks of ONE block row (they share A's row strip, multicast). A row's blocks pair up in
    column order; a row with an odd count pairs its last block with a partner slot ``(row, col, -1, 0)`` (computed
    on the same tiles, never stored). Items are ordered by (row group, first column, row) like ``sdd_schedule``;
    the list is padded to a size known without a host sync with ``(0, 0, -1, 1)`` slots (skip: nothing runs).
    Cached per group size."""
    group = sdd_group_rows(layout, sm_count)
    key_name = f"gemm_sdd_pair_schedule_{group}"
    cache = layout._cache
    got = cache.get(key_name)
    if got is None:
        nnz = layout.nnz_per_head[0]
        n_rows = layout.n_qblocks
        n_pairs = (nnz + n_rows) // 2  # >= sum over rows of ceil(count / 2)
        dev = layout.col_idx.device
        rp = layout.row_ptr[0].long()
        ci = layout.col_idx[0, :nnz].long()
        rows = block_rows(layout)[0, :nnz]
        counts = rp[1:] - rp[:-1]
        pair_ptr = torch.cumsum(torch.div(counts + 1, 2, rounding_mode="floor"), 0) - torch.div(
            counts + 1, 2, rounding_mode="floor")                  # first pair of each row
        j = torch.arange(nnz, device=dev) - rp[rows]               # position in the row
        pid = pair_ptr[rows] + torch.div(j, 2, rounding_mode="floor")
        lane = j % 2
        ent = torch.zeros(n_pairs, 2, 4, dtype=torch.long, device=dev)
        ent[:, :, 2] = -1
        ent[:, :, 3] = 1
        key = torch.full((n_pairs,), (n_rows // group + 1) * layout.n_kblocks, dtype=torch.long, device=dev)
        first = lane == 0
        key[pid[first]] = (rows[first] // group) * layout.n_kblocks + ci[first]
        vals = torch.stack([rows, ci, torch.arange(nnz, device=dev), torch.zeros_like(ci)], dim=1)
        ent[pid, lane] = vals
        # odd rows: the last block's partner slot computes on the same tiles and is not stored
        odd = first & (j == counts[rows] - 1)
        ent[pid[odd], 1] = torch.stack([rows[odd], ci[odd], torch.full_like(ci[odd], -1), torch.zeros_like(ci[odd])],
                                       dim=1)
        # stable sort by key, then row (pids ascend with the row within one key)
        order = torch.sort(key, stable=True).indices
        got = ent[order].reshape(2 * n_pairs, 4).to(torch.int32).contiguous()
        _mark_checked(got)
        cache[key_name] = got
    return got
