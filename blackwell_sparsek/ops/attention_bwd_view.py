"""The attention backward's view of a layout, derived from the forward op's layout tensors on their device with
torch ops only (no host sync): per 128-key column of the kernel, the query blocks that list it (the transposed
layout, GQA-stacked, 64-key halves for key blocks that are not whole 128-key tiles), the deterministic kernel's dQ
turns, a cache of views by tensor identity, and the dense element mask the CPU path uses. The op and its
autograd are ``blackwell_sparsek.ops.attention_bwd``."""
from __future__ import annotations

import weakref

import torch

from ..errors import InputError
from ..layout._common import BOUNDS as _BOUNDS, RULE as _RULE
# The view's own bits for pairs of 64-wide key blocks: the half a query block does not list (attn_bwd_common.hpp)
PAIR_NO_LO, PAIR_NO_HI = 4, 8


# -- the transposed view -----------------------------------------------------------------------------------------

def _slot_rows(col_idx: torch.Tensor, row_sched: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, valid) per col_idx slot [Hl, W]: the query-block row each slot belongs to, and whether it is a listed
    block (padding after the head's last row is not). From the schedule entries (row, start, end, first)."""
    hl, w = col_idx.shape
    nq = row_sched.shape[1]
    dev = col_idx.device
    rows = row_sched[..., 0].long()
    counts = torch.zeros(hl, nq, dtype=torch.long, device=dev)
    counts.scatter_(1, rows, (row_sched[..., 2] - row_sched[..., 1]).long())
    ptr = torch.zeros(hl, nq + 1, dtype=torch.long, device=dev)
    ptr[:, 1:] = torch.cumsum(counts, 1)
    pos = torch.arange(w, device=dev).expand(hl, w).contiguous()
    row = (torch.searchsorted(ptr, pos, right=True) - 1).clamp_(0, nq - 1)
    return row, pos < ptr[:, -1:]


def transposed_view(col_idx: torch.Tensor, block_kind: torch.Tensor, row_sched: torch.Tensor, n_kblocks: int,
                    seq_q: int, block_m: int, deterministic: bool = False, group: int = 1, block_n: int = 128,
                    sms: int = 132, interleave: int = 1
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout's transpose as the backward kernel reads it: (t_q_idx int32 [Hl, W], t_kind uint8 [Hl, W],
    t_sched int32 [Hl, nk, 4], t_rank int32 [Hl, W]). Row j of the transpose (key block j) lists, ascending, the
    query blocks whose row lists j; kinds are carried over, with BOUNDS added on the last query block when
    seq_q % block_m (its rows past seq_q): BlockSparseLayout.transpose()'s col_idx, block_kind and row_schedule()
    plus the forward's key-end BOUNDS bits (the kernel masks keys past seq_k as well; unmasked, S = 0 there and
    P = 2^-LSE2 overflows once LSE < -88). t_sched has the forward's packing: (key block, start, end, first query
    block | kind << 24), heaviest key blocks first (stable). t_rank: each entry's turn among the contributions to
    its query block's dQ, the order in which the deterministic kernel adds them (det_ranks(), for ``sms`` SMs and
    tile-order groups of ``interleave`` heads; without ``deterministic``, the entry's position in its query
    block's own list). W = col_idx's width (each head's nnz
    fits). Device ops only, no host sync.

    ``group`` > 1 (GQA: query heads per K/V head) stacks the rows of each group's heads into one layout per K/V
    head (query block qb of the group's r-th head becomes qb + r * nq): the kernel walks, per key block, every
    listed query block of all the heads that share its K/V and sums their dK/dV in registers. A shared layout
    (one head) stays shared; a per-head one gets Hl / group rows. W becomes group * W.

    ``block_n`` not a multiple of 128 (64, 192, ...): the kernel's CTA covers 128 keys, so the view's columns are
    128-key tiles, each two 64-key halves of one or two key blocks (64-wide blocks 2j and 2j + 1 make column j),
    listing the union of the query blocks of both halves (ceil(nk * block_n / 128) columns, W = col_idx's width
    * block_n / 64); an entry whose query block lists only one half carries PAIR_NO_HI or PAIR_NO_LO (that half's
    warpgroup skips it) and the other bits of the block it lists, an entry listing both halves the OR of their
    kinds (each rule is exact per element). The rest as above, the 128-key tile being the key block."""
    hl, w = col_idx.shape
    nq = row_sched.shape[1]
    nk = int(n_kblocks)
    dev = col_idx.device
    row, valid = _slot_rows(col_idx, row_sched)
    col = col_idx.long()
    pairs = block_n % 128 != 0
    if pairs:
        if block_n <= 0 or block_n % 64:
            raise InputError(f"block_n {block_n}: the backward takes key blocks of a multiple of 64 columns")
        m = block_n // 64  # 64-key units per key block; unit u is half u % 2 of the kernel's 128-key column u // 2
        unit = col.unsqueeze(-1) * m + torch.arange(m, device=dev)
        no_other = torch.where(unit % 2 == 0, PAIR_NO_HI, PAIR_NO_LO).to(torch.uint8)
        block_kind = (block_kind.unsqueeze(-1) | no_other).reshape(hl, w * m)
        row, valid = (t.unsqueeze(-1).expand(hl, w, m).reshape(hl, w * m) for t in (row, valid))
        col, nk, w = (unit // 2).reshape(hl, w * m), (nk * m + 1) // 2, w * m
    if group * nq >= 1 << 24:  # the schedule packs a stacked query block in 24 bits (entry | kind << 24)
        raise InputError(f"{group} query heads per K/V head x {nq} query blocks do not fit the backward's 24-bit "
                         f"block index: split the call over query heads (each K/V head with its own group)")
    if group > 1:
        if hl > 1:
            if hl % group:
                raise InputError(f"a per-head layout of {hl} heads cannot be grouped by {group}")
            hl //= group
        else:
            row, valid, col, block_kind = (t.expand(group, w) for t in (row, valid, col, block_kind))
        r = torch.arange(group, device=dev).repeat(hl).view(hl * group, 1)
        row = row + r * nq
        row, valid, col, block_kind = (t.reshape(hl, group * w) for t in (row, valid, col, block_kind))
        nq_head, nq, w = nq, nq * group, w * group
    else:
        nq_head = nq
    end_key = nk * nq
    key = torch.where(valid, col * nq + row, torch.full_like(col, end_key))
    skey, order = torch.sort(key, dim=1, stable=True)
    kind = torch.gather(block_kind, 1, order)
    if pairs:
        skey, kind = _merge_pairs(skey, kind, end_key)
    svalid = skey < end_key
    t_q = torch.where(svalid, skey % nq, torch.zeros_like(skey))
    if seq_q % block_m:
        kind = kind | ((t_q % nq_head == nq_head - 1) & svalid).to(torch.uint8) * _BOUNDS
    kind = torch.where(svalid, kind, torch.zeros_like(kind))
    t_q_idx = t_q.to(torch.int32)
    # the sorted keys' columns (nk past the listed ones) give each key block's [start, end) directly
    tcol = torch.where(svalid, torch.div(skey, nq, rounding_mode="floor"), torch.full_like(skey, nk)).contiguous()
    tptr = torch.searchsorted(tcol, torch.arange(nk + 1, device=dev).expand(hl, nk + 1).contiguous())
    tcounts = tptr[:, 1:] - tptr[:, :-1]
    korder = torch.sort(tcounts, dim=1, descending=True, stable=True).indices
    if deterministic:
        t_rank = det_ranks(t_q, tcol, tptr, korder, block_m // 64, max(1, block_n // 128), sms, interleave)
    else:  # each entry's place in its query block's own row (of 128-key columns for 64-key halves)
        t_rank = turns(t_q, svalid, ())
    t_rank = t_rank.to(torch.int32)
    start = torch.gather(tptr[:, :-1], 1, korder)
    end = torch.gather(tptr[:, 1:], 1, korder)
    packed = t_q_idx.long() | (kind.long() << 24)
    first = torch.where(end > start, torch.gather(packed, 1, start.clamp(max=w - 1)), torch.zeros_like(start))
    t_sched = torch.stack([korder, start, end, first], dim=2).to(torch.int32).contiguous()
    return t_q_idx.contiguous(), kind.contiguous(), t_sched, t_rank.contiguous()


def _merge_pairs(skey: torch.Tensor, kind: torch.Tensor, end_key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted (pair column, query block) keys with their kinds -> the same with each pair listed
    once: where both halves list a query block, the first entry takes the OR of the two kinds less the PAIR_NO
    bits and the second moves past the listed entries (key end_key). No host sync."""
    dup = (skey[:, 1:] == skey[:, :-1]) & (skey[:, 1:] < end_key)  # entry i + 1 repeats entry i
    both = torch.nn.functional.pad(dup, (0, 1))
    later = torch.nn.functional.pad(dup, (1, 0))
    nxt = torch.nn.functional.pad(kind[:, 1:], (0, 1))
    kind = torch.where(both, (kind | nxt) & (0xFF ^ PAIR_NO_LO ^ PAIR_NO_HI), kind)
    skey = torch.where(later, torch.full_like(skey, end_key), skey)
    skey, again = torch.sort(skey, dim=1, stable=True)
    return skey, torch.gather(kind, 1, again)


def det_ranks(t_q: torch.Tensor, tcol: torch.Tensor, tptr: torch.Tensor, korder: torch.Tensor, tiles_m: int,
              tiles_n: int, sms: int, interleave: int = 1, wave_ctas: int = 0) -> torch.Tensor:
    """The deterministic kernel's order of the dQ contributions to each query block: per entry of the transposed
    view (query block t_q, key block tcol, nk past the listed ones; tptr: each key block's [start, end); korder: the
    schedule), its turn among the entries of its query block.

    Turns follow the contributions' estimated arrival, so that CTAs rarely wait on each other. The launch order is
    the tile order's: groups of ``interleave`` (batch, head)s, one after the other; in a group, key blocks in
    schedule order, the group's heads interleaved, tiles_n CTAs per key block. A key block's CTA starts once the
    SMs have run the tiles launched before it in its group (estimated as interleave x its own head's, / sms), then
    reaches its p-th query block p * tiles_m 64-query tiles later; ties go to the lower key block. Arrival is ranked
    inside waves of at most sms // 2 consecutive CTAs of a group (wave first): a CTA waits only on CTAs of its own
    or an earlier wave of its group, and inside a wave on an earlier (estimate, key block) of another CTA, so the
    waits form no cycle, and a wave fits on the GPU at once, so no CTA waits on one that cannot start (half the SMs
    free for the kernel suffice). Heads that share a layout get the same turns. ``wave_ctas``: another wave size
    (measurements; the deadlock argument needs that many CTAs resident)."""
    wave_ctas = wave_ctas or max(1, sms // 2)
    if tiles_n * interleave > wave_ctas:
        raise ValueError(f"a wave of {wave_ctas} CTAs cannot hold one key block of {interleave} heads "
                         f"({tiles_n} CTAs each): use a smaller tile-order group")
    hl, w = t_q.shape
    nk = korder.shape[1]
    dev = t_q.device
    valid = tcol < nk
    counts = tptr[:, 1:] - tptr[:, :-1]
    pos = torch.empty_like(korder)
    pos.scatter_(1, korder, torch.arange(nk, device=dev).expand(hl, nk).contiguous())  # schedule position per block
    tiles = torch.gather(counts, 1, korder) * tiles_m * tiles_n  # CTA tiles per key block, schedule order
    before = torch.gather(torch.cumsum(tiles, 1) - tiles, 1, pos) * interleave  # tiles launched before, estimated
    wave = pos // (wave_ctas // (tiles_n * interleave))
    col = tcol.clamp(max=nk - 1)
    p = torch.arange(w, device=dev).expand(hl, w) - torch.gather(tptr[:, :-1], 1, col)
    arrival = torch.gather(before, 1, col) + p * tiles_m * sms  # sms x the estimate, exact in integers
    return turns(t_q, valid, (arrival, torch.gather(wave, 1, col)))


def turns(t_q: torch.Tensor, valid: torch.Tensor, keys: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Each valid entry's position among the entries of its query block t_q, ordered by ``keys`` (least significant
    first; entries are in key-block order, which breaks the remaining ties)."""
    hl, w = t_q.shape
    dev = t_q.device
    q_key = torch.where(valid, t_q.long(), torch.full_like(t_q, 1 << 40, dtype=torch.long))
    perm = torch.arange(w, device=dev).expand(hl, w)
    for key in (*keys, q_key):  # stable sorts, the least significant key first
        perm = torch.gather(perm, 1, torch.sort(torch.gather(key, 1, perm), dim=1, stable=True).indices)
    q_sorted = torch.gather(q_key, 1, perm).contiguous()
    turn = torch.arange(w, device=dev).expand(hl, w) - torch.searchsorted(q_sorted, q_sorted)
    rank = torch.zeros(hl, w, dtype=torch.long, device=dev)
    rank.scatter_(1, perm, turn)
    return torch.where(valid, rank, torch.zeros_like(rank))


_TCACHE: dict[int, tuple] = {}
_TCACHE_MAX = 64


def _transposed_cached(col_idx, block_kind, row_sched, n_kblocks, seq_q, block_m, deterministic=False, group=1,
                       block_n=128, sms=132, interleave=1):
    """transposed_view(), cached by the identity (and version) of the three layout tensors."""
    facts = (int(n_kblocks), int(seq_q), int(block_m), int(block_n), int(sms), int(interleave), col_idx._version,
             block_kind._version, row_sched._version)
    key = (id(col_idx), bool(deterministic), int(group))
    hit = _TCACHE.get(key)
    if hit is not None:
        refs, got_facts, view = hit
        if all(r() is t for r, t in zip(refs, (col_idx, block_kind, row_sched))) and got_facts == facts:
            return view
    view = transposed_view(col_idx, block_kind, row_sched, n_kblocks, seq_q, block_m, deterministic, group,
                           block_n, sms, interleave)
    if len(_TCACHE) >= _TCACHE_MAX:
        _TCACHE.pop(next(iter(_TCACHE)))
    _TCACHE[key] = (tuple(weakref.ref(t) for t in (col_idx, block_kind, row_sched)), facts, view)
    return view


def element_mask(col_idx, block_kind, row_sched, meta, seq_q: int, seq_k: int, block_m: int,
                 block_n: int) -> torch.Tensor:
    """bool [Hl, seq_q, seq_k]: the element mask the op's layout arguments describe (for the dense path)."""
    hl = col_idx.shape[0]
    nq, nk = row_sched.shape[1], int(meta[2])
    row, valid = _slot_rows(col_idx, row_sched)
    h = torch.arange(hl, device=col_idx.device).unsqueeze(1).expand_as(row)
    grid = torch.full((hl, nq, nk), -1, dtype=torch.int16, device=col_idx.device)
    grid[h[valid], row[valid], col_idx.long()[valid]] = block_kind[valid].to(torch.int16)
    g = grid[:, torch.arange(seq_q) // block_m][:, :, torch.arange(seq_k) // block_n]
    qp = torch.arange(seq_q).unsqueeze(1) + (seq_k - seq_q)
    kk = torch.arange(seq_k).unsqueeze(0)
    rule = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if meta[0] >= 0:
        rule &= kk >= qp - meta[0]
    if meta[1] >= 0:
        rule &= kk <= qp + meta[1]
    return (g >= 0) & (((g & _RULE) == 0) | rule.to(g.device))
