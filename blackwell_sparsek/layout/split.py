"""Split-KV plan of a layout whose row lengths are skewed: a few long rows (global tokens) among short ones.

A long row is one CTA's serial loop; when it is much longer than the average row it ends last and leaves SMs idle.
The plan splits the ``S`` longest rows of every layout head into ``K`` pieces each, over fixed sub-ranges of the
row's blocks, and the kernel runs every piece as its own tile, writing a partial O (fp32, normalized by the piece's
own sum) and the piece's LSE to a workspace; a fixed-order combine kernel (``bsk/sm90/split_kv.hpp``, launched
with it) merges the ``K`` pieces of a row into O and LSE. Exact (fp32 partials, the LSE-weighted sum) and
deterministic (fixed split points, fixed combine order, no atomics).

The split schedule, int32 ``[Hl, E, 4]`` with ``E = nq - S + S * K``, has the row schedule's entries
``(row, start, end, first)``: entries ``[s * K, s * K + K)`` are the pieces of split row ``s`` (rows by descending
length, ties by row), piece ``i`` covering ``[start + i * n // K, start + (i + 1) * n // K)`` of the row's ``n``
blocks (empty when ``n < K``: O = 0, LSE = -inf, weight 0 in the combine); then the other rows, heaviest first.
Every head splits exactly ``S`` rows (its ``S`` longest), so the schedule is rectangular. The last block row is
never split when ``seq_q % block_m != 0`` (the combine writes whole blocks of rows).

The decision is the layout's, from its row lengths (one host sync with the row statistics): split when the longest
row is more than ``SKEW`` times the mean and longer than two pieces; pieces of ``max(MIN_PIECE, 2 * mean)`` blocks;
the split rows (those longer than a piece, counted per head, the most of any head) at most a ``MAX_SPLIT_ROWS``
fraction of the rows.
"""
from __future__ import annotations

import torch

SKEW = 4.0             # longest row / mean row length above which rows are split
MIN_PIECE = 16         # blocks per piece, at least (a piece's fixed cost: Q load, epilogue, combine)
MAX_SPLIT_ROWS = 0.125  # at most this fraction of a head's rows are split (the workspace holds them in fp32)


def facts(counts: torch.Tensor, mean: torch.Tensor) -> list[torch.Tensor]:
    """Device scalars (longest row, piece length, most rows per head longer than a piece) for plan(); stacked with
    the row statistics so one host sync serves both."""
    piece = torch.clamp(torch.ceil(2.0 * mean), min=float(MIN_PIECE))
    long_rows = (counts > piece).sum(dim=1).amax().double()
    return [counts.amax(), piece, long_rows]


def plan(nq: int, mean: float, top: float, piece: float, long_rows: float, partial_last: bool
         ) -> tuple[int, int] | None:
    """(S rows split per head, K pieces per split row), or None when the rows are not skewed enough to split."""
    if mean <= 0 or top <= SKEW * mean or top <= 2 * piece or long_rows < 1:
        return None
    s = int(long_rows)
    if s > MAX_SPLIT_ROWS * nq or s > nq - int(partial_last):
        return None
    return s, int(-(-int(top) // int(piece)))


def split_schedule(row_counts: torch.Tensor, row_ptr: torch.Tensor, row_schedule: torch.Tensor,
                   packed_first: torch.Tensor, s: int, k: int, partial_last: bool) -> torch.Tensor:
    """The split schedule (module docstring) on the layout's device, without a host sync. ``packed_first``:
    ``col_idx | block_kind << 24`` [Hl, M]; ``row_schedule``: the layout's (heaviest first)."""
    hl, nq = row_counts.shape
    dev = row_counts.device
    key = row_counts.long()
    if partial_last:
        key = key.clone()
        key[:, nq - 1] = -1
    split_rows = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :s]            # [Hl, S]
    start = torch.gather(row_ptr[:, :-1].long(), 1, split_rows)
    n = torch.gather(row_ptr[:, 1:].long(), 1, split_rows) - start
    i = torch.arange(k + 1, device=dev)
    bounds = start.unsqueeze(2) + (n.unsqueeze(2) * i) // k                                    # [Hl, S, K+1]
    p_start, p_end = bounds[..., :-1].reshape(hl, s * k), bounds[..., 1:].reshape(hl, s * k)
    at = p_start.clamp(max=packed_first.shape[1] - 1)
    p_first = torch.where(p_end > p_start, torch.gather(packed_first.long(), 1, at), torch.zeros_like(at))
    p_row = split_rows.repeat_interleave(k, dim=1)
    pieces = torch.stack([p_row, p_start, p_end, p_first], dim=2)
    # the other rows in the row schedule's order: a stable sort puts the unsplit ones first
    is_split = torch.zeros(hl, nq, dtype=torch.int32, device=dev)
    is_split.scatter_(1, split_rows, 1)
    sched_rows = row_schedule[..., 0].long()
    keep = torch.sort(torch.gather(is_split, 1, sched_rows), dim=1, stable=True).indices[:, :nq - s]
    rest = torch.gather(row_schedule.long(), 1, keep.unsqueeze(2).expand(hl, nq - s, 4))
    return torch.cat([pieces, rest], dim=1).to(torch.int32).contiguous()
