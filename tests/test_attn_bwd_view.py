"""The attention backward's view of a layout, without a GPU: the transposed view (against
BlockSparseLayout.transpose()), its GQA stacking, the deterministic kernel's turns (played out: no deadlock, every
contribution once), the view cache, and the tile-order group."""
from __future__ import annotations

import pytest
import torch

from blackwell_sparsek import InputError
from blackwell_sparsek.ops import attention_bwd as ab
from blackwell_sparsek.ops import attention_bwd_view as abv
from blackwell_sparsek.layout import BOUNDS, BlockSparseLayout


# -- the transposed view ---------------------------------------------------------------------------------------

def bwd_layouts():
    """The layouts the backward's CPU tests run on (test_attn_bwd_cpu imports them)."""
    return {
        "topk_per_head": BlockSparseLayout.random_topk(1000, 3, seed=3, num_heads=3),
        "causal_odd": BlockSparseLayout.causal(777, 1000),
        "causal_short_q": BlockSparseLayout.causal(300, 900),
        "window": BlockSparseLayout.sliding_window(1100, 300),
        "empty_rows_cols": BlockSparseLayout.from_block_mask(
            torch.tensor([[[1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0]]], dtype=torch.bool),
            seq_q=450, seq_k=500),
        "topk_64_256": BlockSparseLayout.random_topk(700, 2, seed=5, block_m=64, block_n=256, num_heads=2),
    }


@pytest.mark.parametrize("name", sorted(bwd_layouts()))
def test_transposed_view_matches_layout_transpose(name):
    """The view the backward derives from the forward op's tensors is BlockSparseLayout.transpose() (rows = key
    blocks, columns = query blocks, BOUNDS on the last query block when seq_q % block_m), plus the forward's
    key-end BOUNDS bits: the kernel masks keys past seq_k too (unmasked, S = 0 there and P = 2^-LSE2 overflows
    once LSE < -88). Entry ranks (each entry's position in its query block's own list) come on top; the
    deterministic view differs only in them."""
    lay = bwd_layouts()[name]
    args = (lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q, lay.block_m)
    t_q, t_kind, t_sched, t_rank = ab.transposed_view(*args)
    T = lay.transpose()
    assert (T.n_qblocks, T.n_kblocks) == (lay.n_kblocks, lay.n_qblocks)
    hl, nk = lay.num_heads, lay.n_kblocks
    assert t_q.dtype == torch.int32 and t_kind.dtype == torch.uint8 and t_sched.dtype == torch.int32
    assert t_q.shape == lay.col_idx.shape and t_sched.shape == (hl, nk, 4) and t_sched.is_contiguous()
    w = T.col_idx.shape[1]
    assert torch.equal(t_q[:, :w], T.col_idx) and not t_q[:, w:].any()
    key_end = torch.zeros_like(t_kind)
    if lay.seq_k % lay.block_n:  # entries of the last key block carry the forward's BOUNDS bit
        for h in range(hl):
            key_end[h, T.row_ptr[h, nk - 1]:T.row_ptr[h, nk]] = BOUNDS
    assert torch.equal(t_kind[:, :w], T.block_kind | key_end[:, :w])
    assert torch.equal(t_sched[..., :3], T.row_schedule()[..., :3])  # heaviest key blocks first
    for h in range(hl):
        for kb, start, end, first in t_sched[h].tolist():
            if end > start:
                assert first == t_q[h, start].item() | (t_kind[h, start].item() << 24)
            else:
                assert first == 0
            for r, rk in zip(t_q[h, start:end].tolist(), t_rank[h, start:end].tolist()):
                row = lay.col_idx[h, lay.row_ptr[h, r]:lay.row_ptr[h, r + 1]].tolist()
                assert row[rk] == kb  # this key block's position in the query block's own list
    det = ab.transposed_view(*args, deterministic=True, block_n=lay.block_n, sms=8)
    assert all(torch.equal(a, b) for a, b in zip(det[:3], (t_q, t_kind, t_sched)))


def _run_turns(t_q, t_sched, t_rank, heads, tiles_m, tiles_n, capacity, interleave=1):
    """The deterministic kernel's dQ turns, played out: CTAs start in the launcher's tile order (groups of
    ``interleave`` (batch, head)s; in a group, key blocks in schedule order, the group's heads interleaved, tiles_n
    CTAs per key block) whenever fewer than ``capacity`` run; a CTA adds its 64-query tiles in its column's order,
    each when the tile's counter equals its turn. Returns the order of adds per tile, or None when every running
    CTA waits (a deadlock)."""
    import collections
    ctas = collections.deque()
    nk = t_sched.shape[1]
    for g0 in range(0, heads, interleave):
        for s in range(nk):
            for x in range(g0, g0 + interleave):
                lh = 0 if t_sched.shape[0] == 1 else x
                kb, start, end, _ = t_sched[lh, s].tolist()
                for t in range(tiles_n):
                    steps = [(x, q * tiles_m + i, rk * tiles_n + t, kb * tiles_n + t)
                             for q, rk in zip(t_q[lh, start:end].tolist(), t_rank[lh, start:end].tolist())
                             for i in range(tiles_m)]
                    ctas.append(collections.deque(steps))
    counter = collections.Counter()
    adds = collections.defaultdict(list)
    running = []
    while ctas or running:
        while ctas and len(running) < capacity:
            running.append(ctas.popleft())
        moved = False
        for c in running:
            while c and counter[c[0][:2]] == c[0][2]:
                x, tile, _, who = c.popleft()
                counter[x, tile] += 1
                adds[x, tile].append(who)
                moved = True
        running = [c for c in running if c]
        if not moved and running:
            return None
    return adds


@pytest.mark.parametrize("interleave", [1, 0], ids=["group1", "group_all"])
@pytest.mark.parametrize("sms", [4, 8, 132])
@pytest.mark.parametrize("name", sorted(bwd_layouts()))
def test_deterministic_turns_finish_and_are_a_fixed_order(name, sms, interleave):
    """det_ranks' turns, played out with only half the SMs running CTAs (the kernel's stated need), for tile-order
    groups of one head and of all heads: no deadlock, every contribution to a query tile added exactly once, the
    same turns for the same layout."""
    lay = bwd_layouts()[name]
    heads = 3 if lay.num_heads == 1 else lay.num_heads
    tm, tn = lay.block_m // 64, lay.block_n // 128
    interleave = ab.tile_group(heads, 1, 0, interleave or heads, cap=max(1, sms // 2 // tn))
    args = (lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q, lay.block_m)
    t_q, _, t_sched, t_rank = ab.transposed_view(*args, deterministic=True, block_n=lay.block_n, sms=sms,
                                                 interleave=interleave)
    adds = _run_turns(t_q, t_sched, t_rank, heads, tm, tn, capacity=max(1, sms // 2), interleave=interleave)
    assert adds is not None, "the deterministic turns deadlock"
    for (x, tile), who in adds.items():
        lh = 0 if lay.num_heads == 1 else x
        q = tile // tm
        kbs = lay.col_idx[lh, lay.row_ptr[lh, q]:lay.row_ptr[lh, q + 1]].tolist()
        assert sorted(who) == sorted(kb * tn + t for kb in kbs for t in range(tn))
    again = ab.transposed_view(*args, deterministic=True, block_n=lay.block_n, sms=sms, interleave=interleave)[3]
    assert torch.equal(again, t_rank)
    with pytest.raises(ValueError, match="cannot hold one key block"):
        ab.transposed_view(*args, deterministic=True, block_n=lay.block_n, sms=sms, interleave=sms)


def test_deterministic_turns_follow_arrival_not_key_order():
    """On a dense layout every key block lists every query block in the same order, so all CTAs of a wave reach
    query block 0 first: the turns there go by key block. On a layout where later key blocks list a query block
    earlier in their columns, their turns come first (the old order, ascending key block, made them wait)."""
    m = torch.zeros(1, 4, 4, dtype=torch.bool)
    m[0, 3, 0] = m[0, 3, 1] = m[0, 3, 2] = m[0, 3, 3] = True  # query block 3: every key block
    m[0, 0, 0] = m[0, 1, 0] = m[0, 2, 0] = True                # key block 0 also lists query blocks 0-2 first
    lay = BlockSparseLayout.from_block_mask(m, seq_q=512, seq_k=512)
    t_q, _, t_sched, t_rank = ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), 4, 512, 128,
                                                 deterministic=True, sms=132)
    turns = {}
    for kb, start, end, _ in t_sched[0].tolist():
        for q, rk in zip(t_q[0, start:end].tolist(), t_rank[0, start:end].tolist()):
            turns[q, kb] = rk
    # key block 0 reaches query block 3 fourth in its column, key blocks 1-3 first: they add before it
    assert turns[3, 0] == 3 and sorted(turns[3, kb] for kb in (1, 2, 3)) == [0, 1, 2]


def test_transposed_view_has_no_host_sync():
    lay = BlockSparseLayout.random_topk(2000, 4, seed=1, num_heads=2)
    args = (lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q, lay.block_m)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:  # data-dependent host syncs (.item(), nonzero) raise under fake tensors
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = ab.transposed_view(*fake)
    assert out[2].shape == (2, lay.n_kblocks, 4)


def test_transposed_view_cache_follows_identity():
    lay = BlockSparseLayout.random_topk(600, 2, seed=2)
    a = abv._transposed_cached(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, 600, 128)
    assert abv._transposed_cached(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, 600, 128) is a
    other = abv._transposed_cached(lay.col_idx.clone(), lay.block_kind, lay.row_schedule(), lay.n_kblocks, 600, 128)
    assert other is not a and all(torch.equal(x, y) for x, y in zip(a, other))
    assert abv._transposed_cached(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, 599, 128) is not a


def test_tile_group():
    """The backward's tile-order group: (batch, K/V head)s whose Q and dO fit in half of L2, else what the caller
    wants, always a divisor of B * Hkv and at least 1."""
    assert ab.tile_group(32, 4 << 20, 50 << 20) == 4       # 6 fit: the largest divisor of 32 up to 6
    assert ab.tile_group(32, 64 << 20, 50 << 20) == 1      # none fits: 1
    assert ab.tile_group(6, 1 << 20, 50 << 20) == 6        # all fit
    assert ab.tile_group(12, 1, 1 << 30, want=5) == 4      # the caller's 5: largest divisor of 12 up to it
    assert ab.tile_group(7, 1, 1 << 30, want=100) == 7
    assert ab.tile_group(32, 1, 1 << 30, cap=6) == 4          # capped (deterministic waves): a divisor up to 6


def _stacked_reference(lay, group):
    """Per K/V head and key block: the (r * nq + query block, kind, rank) entries of the group's query heads, in
    ascending stacked order, from the layout's rows directly."""
    nq, nk = lay.n_qblocks, lay.n_kblocks
    hl = lay.num_heads
    out = {}
    for hk in range(max(hl // group, 1)):
        for j in range(nk):
            ent = []
            for r in range(group):
                h = hk * group + r if hl > 1 else 0
                for qb in range(nq):
                    row = lay.col_idx[h, lay.row_ptr[h, qb]:lay.row_ptr[h, qb + 1]].tolist()
                    if j in row:
                        pos = row.index(j)
                        kind = int(lay.block_kind[h, lay.row_ptr[h, qb] + pos])
                        if lay.seq_q % lay.block_m and qb == nq - 1:
                            kind |= BOUNDS
                        ent.append((r * nq + qb, kind, pos))
            out[hk, j] = ent
    return out


@pytest.mark.parametrize("det", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("name,group", [("topk_per_head", 3), ("causal_odd", 4), ("empty_rows_cols", 2),
                                        ("topk_64_256", 2)])
def test_transposed_view_stacks_gqa_groups(name, group, det):
    """transposed_view(group=G): one column per (K/V head, key block) listing the group's query heads' blocks as
    r * nq + query block (ascending), kinds with BOUNDS on each head's last query block, ranks in each head's own
    row (deterministic: turns that play out without a deadlock), the schedule heaviest first over the stacked
    counts; a per-head layout whose head count G does not divide is refused."""
    lay = bwd_layouts()[name]
    t_q, t_kind, t_sched, t_rank = ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(),
                                                      lay.n_kblocks, lay.seq_q, lay.block_m, det, group,
                                                      lay.block_n, 8)
    hl_out = 1 if lay.num_heads == 1 else lay.num_heads // group
    assert t_q.shape == (hl_out, group * lay.col_idx.shape[1]) and t_sched.shape == (hl_out, lay.n_kblocks, 4)
    ref = _stacked_reference(lay, group)
    for hk in range(hl_out):
        counts = {}
        for kb, start, end, first in t_sched[hk].tolist():
            got = list(zip(t_q[hk, start:end].tolist(), t_kind[hk, start:end].tolist(),
                           t_rank[hk, start:end].tolist()))
            key_end = BOUNDS if lay.seq_k % lay.block_n and kb == lay.n_kblocks - 1 else 0
            want = [(e, k | key_end, rk) for e, k, rk in ref[hk, kb]]
            if det:  # turns: played out below
                got, want = [g[:2] for g in got], [x[:2] for x in want]
            assert got == want
            counts[kb] = end - start
            if end > start:
                assert first == got[0][0] | (got[0][1] << 24)
        order = [kb for kb, *_ in t_sched[hk].tolist()]
        assert [counts[kb] for kb in order] == sorted(counts.values(), reverse=True)
    if det:
        tm, tn = lay.block_m // 64, lay.block_n // 128
        assert _run_turns(t_q, t_sched, t_rank, 2 * hl_out, tm, tn, capacity=max(1, 4 // tn) * tn) is not None
    with pytest.raises(InputError, match="24-bit"):
        ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q, lay.block_m,
                           det, (1 << 24) // lay.n_qblocks + 1)
    if lay.num_heads > 1:
        with pytest.raises(InputError, match="cannot be grouped"):
            ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q,
                               lay.block_m, det, lay.num_heads + 1)
