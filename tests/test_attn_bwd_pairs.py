"""The backward's view of layouts whose key blocks are not whole 128-key tiles (64, 192 columns), without a GPU:
the kernel covers 128 keys a CTA, so transposed_view makes each 128-key tile (two 64-key halves of one or two key
blocks) one column over the union of their query blocks and marks the half a query block does not list
(PAIR_NO_LO / PAIR_NO_HI). Checked by rebuilding the element mask the kernel
applies from the view alone and comparing it with the layout's, for per-head and shared layouts, GQA stacking and
the deterministic turns (played out)."""
from __future__ import annotations

import pytest
import torch

from blackwell_sparsek.layout import BOUNDS, RULE, BlockSparseLayout
from blackwell_sparsek.errors import InputError
from blackwell_sparsek.ops import attention_bwd_view as ab
from test_attn_bwd_view import _run_turns

L = BlockSparseLayout


def pair_layouts():
    holes = torch.rand(2, 12, 13, generator=torch.Generator().manual_seed(3)) < 0.4
    holes[:, 2] = False      # an empty query row
    holes[:, :, 5] = False   # key block 5 listed by nobody: its pair (4, 5) has only low halves
    holes[:, :, 8:10] = False  # a whole pair listed by nobody
    return {
        "topk_64x64_per_head": L.random_topk(777, 3, seed=5, num_heads=2, block_m=64, block_n=64),
        "topk_128x64": L.random_topk(1000, 4, seed=1, block_m=128, block_n=64),
        "causal_64x64_odd": L.causal(777, 1000, block_m=64, block_n=64),
        "causal_short_q_64x64": L.causal(300, 900, block_m=64, block_n=64),
        "window_128x64": L.sliding_window(1100, 300, block_m=128, block_n=64),
        "holes_64x64_per_head": L.from_block_mask(holes, seq_q=12 * 64 - 5, seq_k=13 * 64 - 9, block_m=64,
                                                  block_n=64),
        "topk_128x192_per_head": L.random_topk(1500, 2, seed=4, num_heads=2, block_m=128, block_n=192),
        "causal_64x192_odd": L.causal(700, 1000, block_m=64, block_n=192),
        "one_block_50": L.random_topk(50, 1, seed=0, block_m=64, block_n=64),  # one key block: no high half
    }


def _tiles(row, m):
    """The 128-key columns that a query block's row of key blocks (m 64-key units each) touches, ascending."""
    return sorted({u // 2 for c in row for u in range(c * m, c * m + m)})


def _view(lay, group=1, det=False, sms=8):
    return ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, lay.seq_q,
                              lay.block_m, det, group, lay.block_n, sms)


def _mask_from_view(lay, view, group):
    """bool [query heads of the view, seq_q, seq_k]: the elements the kernel keeps, from the view alone (per
    entry: the query block's rows, the pair's 128 keys less a PAIR_NO half, the element rule on RULE entries,
    sequence ends always)."""
    t_q, t_kind, t_sched, _ = view
    Sq, Sk, bm, nq = lay.seq_q, lay.seq_k, lay.block_m, lay.n_qblocks
    qp = torch.arange(Sq).unsqueeze(1) + (Sk - Sq)
    kk = torch.arange(Sk).unsqueeze(0)
    rule = torch.ones(Sq, Sk, dtype=torch.bool)
    if lay.window_left >= 0:
        rule &= kk >= qp - lay.window_left
    if lay.window_right >= 0:
        rule &= kk <= qp + lay.window_right
    m = torch.zeros(t_sched.shape[0] * group, Sq, Sk, dtype=torch.bool)
    for hk in range(t_sched.shape[0]):
        for kb, start, end, first in t_sched[hk].tolist():
            entries = t_q[hk, start:end].tolist()
            assert entries == sorted(set(entries)), "a column lists each query block once, ascending"
            for e, kind in zip(entries, t_kind[hk, start:end].tolist()):
                r, qb = divmod(e, nq)
                assert kind & (ab.PAIR_NO_LO | ab.PAIR_NO_HI) != ab.PAIR_NO_LO | ab.PAIR_NO_HI
                if (lay.seq_q % bm and qb == nq - 1):
                    assert kind & BOUNDS, "the last query block of an odd seq_q carries BOUNDS"
                for half, bit in ((0, ab.PAIR_NO_LO), (1, ab.PAIR_NO_HI)):
                    if kind & bit:
                        continue
                    rows, keys = slice(qb * bm, (qb + 1) * bm), slice(kb * 128 + half * 64, kb * 128 + half * 64 + 64)
                    m[hk * group + r, rows, keys] |= rule[rows, keys] if kind & RULE else True
    return m


@pytest.mark.parametrize("det", [False, True], ids=["fast", "det"])
@pytest.mark.parametrize("name", sorted(pair_layouts()))
def test_pair_view_is_the_layout(name, det):
    lay = pair_layouts()[name]
    view = _view(lay, det=det)
    t_q, t_kind, t_sched, t_rank = view
    m = lay.block_n // 64
    nk2 = (lay.n_kblocks * m + 1) // 2
    assert t_sched.shape == (lay.num_heads, nk2, 4) and t_q.shape == (lay.num_heads, lay.col_idx.shape[1] * m)
    assert torch.equal(_mask_from_view(lay, view, 1), lay.to_element_mask().expand(lay.num_heads, -1, -1))
    for h in range(lay.num_heads):
        counts = []
        for kb, start, end, first in t_sched[h].tolist():
            counts.append(end - start)
            if end > start:
                assert first == t_q[h, start].item() | (t_kind[h, start].item() << 24)
            if not det:  # position among the query block's pair columns, ascending
                for qb, rk in zip(t_q[h, start:end].tolist(), t_rank[h, start:end].tolist()):
                    row = lay.col_idx[h, lay.row_ptr[h, qb]:lay.row_ptr[h, qb + 1]].tolist()
                    assert _tiles(row, m).index(kb) == rk
        assert counts == sorted(counts, reverse=True), "heaviest pair columns first"
    if det:
        heads = lay.num_heads
        adds = _run_turns(t_q, t_sched, t_rank, heads, lay.block_m // 64, 1, capacity=4)
        assert adds is not None, "the deterministic turns deadlock"
        for (x, tile), who in adds.items():
            qb = tile // (lay.block_m // 64)
            row = lay.col_idx[x, lay.row_ptr[x, qb]:lay.row_ptr[x, qb + 1]].tolist()
            assert sorted(who) == _tiles(row, m), "each 128-key column adds once"


@pytest.mark.parametrize("name,group", [("topk_64x64_per_head", 2), ("causal_64x64_odd", 3),
                                        ("holes_64x64_per_head", 2), ("topk_128x192_per_head", 2)])
def test_pair_view_stacks_gqa_groups(name, group):
    lay = pair_layouts()[name]
    view = _view(lay, group=group)
    hl_out = max(lay.num_heads // group, 1)
    assert view[2].shape == (hl_out, (lay.n_kblocks * lay.block_n // 64 + 1) // 2, 4)
    want = lay.to_element_mask().expand(hl_out * group, -1, -1) if lay.num_heads == 1 else lay.to_element_mask()
    assert torch.equal(_mask_from_view(lay, view, group), want)


def test_pair_view_refuses_other_narrow_blocks():
    lay = L.random_topk(300, 2, seed=0, block_m=64, block_n=64)
    with pytest.raises(InputError, match="multiple of 64 columns"):
        ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, 300, 64, block_n=32)


def test_pair_bits_match_the_kernel_header():
    import re
    from blackwell_sparsek import _paths
    src = (_paths.templates_dir() / "include" / "bsk" / "sm90" / "attn_bwd_common.hpp").read_text()
    got = {n: int(re.search(rf"\b{n}\s*=\s*(\d+)", src).group(1)) for n in ("kPairNoLo", "kPairNoHi")}
    assert (got["kPairNoLo"], got["kPairNoHi"]) == (ab.PAIR_NO_LO, ab.PAIR_NO_HI)
    assert not (ab.PAIR_NO_LO | ab.PAIR_NO_HI) & (BOUNDS | RULE)  # apart from the layout's kind bits


@pytest.mark.parametrize("block", [(64, 64), (128, 64), (128, 192)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_sparse_attention_with_64_wide_key_blocks_trains_on_the_cpu(block):
    """Key blocks of 64 or 192 columns are served when inputs need gradients; the CPU fallback's backward is the
    reference's autograd (same API everywhere), and the backward config is the pair kernel's."""
    import blackwell_sparsek as bsk
    from blackwell_sparsek.families.attn_bwd import config_for
    from blackwell_sparsek.jit.spec import DType
    bm, bn = block
    lay = L.random_topk(300, 2, seed=0, block_m=bm, block_n=bn)
    q, k, v = (torch.randn(1, 2, 300, 64, dtype=torch.float16, requires_grad=True) for _ in range(3))
    bsk.sparse_attention(q, k, v, lay).float().square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    assert config_for(64, DType.FP16, bm, bn).tile_block_n == 128


def test_only_pair_kernels_compile_the_pair_code():
    """The skip of an unlisted half is compiled into the kernels of 64-wide key blocks only (template flag Pairs),
    so the 128-key kernels keep their code."""
    from blackwell_sparsek.families.attn_bwd import config_for
    from blackwell_sparsek.jit.codegen import render
    from blackwell_sparsek.jit.spec import DType
    pair, plain = config_for(128, DType.FP16, 64, 64), config_for(128, DType.FP16, 128, 128)
    assert "/*BlockN=*/128" in render(pair) and "/*Pairs=*/true" in render(pair)
    assert "/*Pairs=*/false" in render(plain)
