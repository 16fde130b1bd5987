"""The row schedule a kernel reads, from a layout's BSR tensors (``bsr.py`` caches it on the layout).

Not ``row_ptr``: a kernel's tile scheduler reads ``row_schedule()``, int32 ``[Hl, nq, 4]``, one 16-byte entry per
block row in heaviest-first order ``(row, start, end, first)`` with ``first = column | kind << 24`` of the row's
first block (0 for an empty row), and then the row's blocks ``col_idx[h, start:end]`` and
``block_kind[h, start:end]``: no dependent index load stands before a row's first K/V load or its first softmax
step. The same holds for ``transpose()`` (the same type over the key axis: rows are key
blocks), whose schedule runs the heaviest key columns first, for a backward pass or a GEMM walking columns. The
split schedule (``split.py``) has the same entries, with the longest rows cut into pieces.
"""
from __future__ import annotations

import torch

from ..errors import LayoutError
from .split import facts as split_facts, plan as split_plan

# the row schedule packs a block column in 24 bits (column | kind << 24)
MAX_SCHEDULE_KBLOCKS = 1 << 24


def row_facts(row_counts: torch.Tensor, partial_last: bool
              ) -> tuple[bool, tuple[float, float, float], tuple[int, int] | None]:
    """(uniform rows, (mean, cv, short) rounded to 1e-4, split plan) of the rows' block counts over every layout
    head, from one reduction and one host sync (the layout's uniform_rows(), row_stats(), split_plan())."""
    c = row_counts.double()
    if c.numel() == 0:
        return True, (0.0, 0.0, 0.0), None
    mean, top = c.mean(), c.amax()
    cv = torch.where(mean > 0, c.std(unbiased=False) / mean.clamp(min=1e-30), torch.zeros_like(mean))
    got = torch.stack([mean, cv, (c < top).double().mean(), c.amin() - top, *split_facts(c, mean)]).tolist()
    mean_, cv_, short_, low = got[:4]
    plan = split_plan(row_counts.shape[1], mean_, *got[4:], partial_last)
    return low == 0, tuple(round(x, 4) for x in (mean_, cv_, short_)), plan


def packed_first(col_idx: torch.Tensor, block_kind: torch.Tensor) -> torch.Tensor:
    """``column | kind << 24`` of every stored block, int32 like col_idx."""
    return col_idx | (block_kind.to(col_idx.dtype) << 24)


def sort_rows(row_counts: torch.Tensor) -> torch.Tensor:
    """int32 [Hl, nq]: block rows by descending block count (stable: ties keep row order)."""
    return torch.sort(row_counts, dim=1, descending=True, stable=True).indices.to(torch.int32)


def build_row_schedule(row_ptr: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor, order: torch.Tensor,
                 n_kblocks: int) -> torch.Tensor:
    """int32 [Hl, nq, 4], contiguous: (row, start, end, first) per block row in ``order``; on the tensors' device,
    no host sync. LayoutError when a block column does not fit the entry's 24 bits."""
    if n_kblocks > MAX_SCHEDULE_KBLOCKS:
        raise LayoutError(f"{n_kblocks} key blocks: the kernel's row schedule holds a block column in "
                          f"24 bits (at most {MAX_SCHEDULE_KBLOCKS}); use larger blocks")
    order = order.long()
    start = torch.gather(row_ptr[:, :-1], 1, order)
    end = torch.gather(row_ptr[:, 1:], 1, order)
    at = start.clamp(max=col_idx.shape[1] - 1).long()  # an empty last row starts past the end
    first = torch.where(end > start, torch.gather(packed_first(col_idx, block_kind), 1, at), torch.zeros_like(start))
    return torch.stack([order.to(torch.int32), start, end, first], dim=2)  # int32 like row_ptr, contiguous
