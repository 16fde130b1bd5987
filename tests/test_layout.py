"""BlockSparseLayout: every constructor against brute-force element masks, round trips and interop (transforms and
validation: test_layout_transforms.py).

CPU only. The reference masks here are written independently of layout.py from the documented definitions.
"""
from __future__ import annotations


import pytest
import torch

from blackwell_sparsek.errors import InputError, LayoutError
from blackwell_sparsek.layout import BlockSparseLayout as L

# (seq_q, seq_k, block_m, block_n): odd sizes, seq_q != seq_k both ways, 64/128 blocks, tiny edge cases
SIZES = [
    (300, 300, 64, 64),
    (257, 513, 64, 128),
    (513, 190, 128, 64),
    (1000, 1000, 128, 128),
    (640, 384, 128, 128),
    (1, 700, 64, 128),
    (190, 1, 64, 64),
]
HEADS = [1, 3]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


# ------------------------------------------------------------------------------------------------------------
# independent references
# ------------------------------------------------------------------------------------------------------------

def cdiv(a, b):
    return (a + b - 1) // b


def rule_ref(sq, sk, wl, wr):
    """Element rule by its definition: q' = q + sk - sq; keep iff k >= q' - wl (wl >= 0) and k <= q' + wr."""
    out = torch.zeros(sq, sk, dtype=torch.bool)
    for q in range(sq):
        qp = q + sk - sq
        lo = 0 if wl < 0 else max(0, qp - wl)
        hi = sk - 1 if wr < 0 else min(sk - 1, qp + wr)
        if lo <= hi:
            out[q, lo:hi + 1] = True
    return out


def expand(blocks, sq, sk, bm, bn):
    """[H, nq, nk] block values -> [H, sq, sk] element values."""
    b = blocks.repeat_interleave(bm, 1).repeat_interleave(bn, 2)
    return b[:, :sq, :sk]


def block_any_all(elem, bm, bn):
    """Per block any/all over the block's valid elements of a [sq, sk] bool mask."""
    sq, sk = elem.shape
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    any_ = torch.zeros(nq, nk, dtype=torch.bool)
    all_ = torch.zeros(nq, nk, dtype=torch.bool)
    for r in range(nq):
        for c in range(nk):
            sub = elem[r * bm:(r + 1) * bm, c * bn:(c + 1) * bn]
            any_[r, c] = bool(sub.any())
            all_[r, c] = bool(sub.all())
    return any_, all_


def diag_ref(r, sq, sk, bm, bn):
    nk = cdiv(sk, bn)
    qhi = min((r + 1) * bm, sq) - 1 + sk - sq
    return min(max(qhi // bn, 0), nk - 1)


def expected(pattern, ruled, sq, sk, bm, bn, wl, wr):
    """Expected (element mask, kind grid) for blocks ``pattern`` [H, nq, nk], where ``ruled`` blocks are
    intersected with the rule (dropped if it keeps nothing, RULE if it cuts) and the others are FULL."""
    rule = rule_ref(sq, sk, wl, wr)
    has_rule = wl >= 0 or wr >= 0
    r_any, r_all = block_any_all(rule, bm, bn)
    listed = pattern & (~ruled | r_any)
    is_rule = listed & ruled & ~r_all & has_rule
    kinds = torch.full(pattern.shape, -1, dtype=torch.int8)
    kinds[listed] = 0
    kinds[is_rule] = 2
    if sk % bn:
        last = torch.zeros_like(listed)
        last[:, :, -1] = True
        kinds[listed & last] |= 1
    elem = expand(listed & ~is_rule, sq, sk, bm, bn) | (expand(is_rule, sq, sk, bm, bn) & rule)
    return elem, kinds


def assert_layout(lay, pattern, ruled, sq, sk, bm, bn, wl, wr):
    elem, kinds = expected(pattern, ruled, sq, sk, bm, bn, wl, wr)
    assert (lay.window_left, lay.window_right) == (wl, wr)
    assert lay.seq_q == sq and lay.seq_k == sk and lay.block_m == bm and lay.block_n == bn
    assert torch.equal(lay.to_kind_grid(), kinds.expand(lay.num_heads, -1, -1))
    assert torch.equal(lay.to_element_mask(), elem.expand(lay.num_heads, -1, -1))
    assert_contract(lay)


def assert_contract(lay):
    """The kernel contract, checked with plain Python loops."""
    rp, ci, bk = lay.row_ptr, lay.col_idx, lay.block_kind
    nq, nk = lay.n_qblocks, lay.n_kblocks
    assert rp.dtype == torch.int32 and ci.dtype == torch.int32 and bk.dtype == torch.uint8
    assert rp.shape == (lay.num_heads, nq + 1) and ci.shape == bk.shape and ci.shape[0] == lay.num_heads
    assert ci.shape[1] == max(1, max(int(x) for x in rp[:, -1]))
    assert rp.is_contiguous() and ci.is_contiguous() and bk.is_contiguous()
    for h in range(lay.num_heads):
        assert int(rp[h, 0]) == 0
        end = int(rp[h, -1])
        assert torch.all(ci[h, end:] == 0) and torch.all(bk[h, end:] == 0)
        for r in range(nq):
            a, b = int(rp[h, r]), int(rp[h, r + 1])
            cols = ci[h, a:b].tolist()
            assert cols == sorted(set(cols)) and all(0 <= c < nk for c in cols)
            for c, k in zip(cols, bk[h, a:b].tolist()):
                assert k in (0, 1, 2, 3)
                assert bool(k & 1) == (c == nk - 1 and lay.seq_k % lay.block_n != 0)
    assert lay.nnz == int(rp[:, -1].sum())
    assert lay.nnz_per_head == [int(x) for x in rp[:, -1]]
    assert lay.density == pytest.approx(lay.nnz / (lay.num_heads * nq * nk))


def assert_canonical(lay):
    """Every listed block keeps something; RULE exactly where the block's element mask is not all-kept."""
    elem = lay.to_element_mask()
    grid = lay.to_kind_grid()
    for h in range(lay.num_heads):
        e_any, e_all = block_any_all(elem[h], lay.block_m, lay.block_n)
        listed = grid[h] >= 0
        assert torch.equal(listed & ~e_any, torch.zeros_like(listed)), "a listed block keeps nothing"
        assert torch.equal(((grid[h] & 2) != 0) & listed, listed & ~e_all)


def full_pattern(nq, nk):
    return torch.ones(1, nq, nk, dtype=torch.bool)


def sizes_heads():
    return [pytest.param(*s, h, id=f"{s[0]}x{s[1]}-b{s[2]}x{s[3]}-h{h}") for s in SIZES for h in HEADS]


# ------------------------------------------------------------------------------------------------------------
# constructors vs brute force
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
def test_dense(sq, sk, bm, bn, heads):
    lay = L.dense(sq, sk, bm, bn, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    assert lay.num_heads == heads and lay.nnz == heads * nq * nk and lay.density == 1.0
    assert_layout(lay, full_pattern(nq, nk), full_pattern(nq, nk), sq, sk, bm, bn, -1, -1)


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
def test_causal(sq, sk, bm, bn, heads):
    lay = L.causal(sq, sk, bm, bn, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    assert_layout(lay, full_pattern(nq, nk), full_pattern(nq, nk), sq, sk, bm, bn, -1, 0)
    assert_canonical(lay)


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
@pytest.mark.parametrize("window", [1, 37, 128, 300])
@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window(sq, sk, bm, bn, heads, window, causal):
    lay = L.sliding_window(sq, window, sk, bm, bn, causal=causal, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    wr = 0 if causal else window - 1
    assert_layout(lay, full_pattern(nq, nk), full_pattern(nq, nk), sq, sk, bm, bn, window - 1, wr)
    # documented meaning, checked on elements directly: a causal query sees exactly `window` keys when it can
    if causal and sq == sk:
        counts = lay.to_element_mask()[0].sum(1)
        want = torch.clamp(torch.arange(sq) + 1, max=window)
        assert torch.equal(counts, want)


def strided_pattern(sq, sk, bm, bn, stride, local, causal):
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    p = torch.zeros(1, nq, nk, dtype=torch.bool)
    for r in range(nq):
        d = diag_ref(r, sq, sk, bm, bn)
        for c in range(nk):
            near = (d - local < c <= d) if causal else abs(c - d) < local
            p[0, r, c] = near or c % stride == 0
    return p


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
@pytest.mark.parametrize("stride,local", [(1, 1), (2, 1), (3, 2), (4, 0)])
@pytest.mark.parametrize("causal", [True, False])
def test_strided(sq, sk, bm, bn, heads, stride, local, causal):
    lay = L.strided(sq, stride, local, sk, bm, bn, causal=causal, num_heads=heads)
    pat = strided_pattern(sq, sk, bm, bn, stride, local, causal)
    wl, wr = (-1, 0) if causal else (-1, -1)
    assert_layout(lay, pat, torch.ones_like(pat), sq, sk, bm, bn, wl, wr)
    assert_canonical(lay)


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
@pytest.mark.parametrize("n_blocks,dilation", [(1, 1), (3, 2), (4, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_dilated(sq, sk, bm, bn, heads, n_blocks, dilation, causal):
    lay = L.dilated(sq, n_blocks, dilation, sk, bm, bn, causal=causal, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    pat = torch.zeros(1, nq, nk, dtype=torch.bool)
    for r in range(nq):
        d = diag_ref(r, sq, sk, bm, bn)
        for i in range(n_blocks):
            for c in ([d - i * dilation] if causal else [d - i * dilation, d + i * dilation]):
                if 0 <= c < nk:
                    pat[0, r, c] = True
    wl, wr = (-1, 0) if causal else (-1, -1)
    assert_layout(lay, pat, torch.ones_like(pat), sq, sk, bm, bn, wl, wr)


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
@pytest.mark.parametrize("n_global,window", [(0, 50), (1, 1), (1, 100), (2, 200)])
def test_global_local(sq, sk, bm, bn, heads, n_global, window):
    lay = L.global_local(sq, n_global, window, sk, bm, bn, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    glob = torch.zeros(1, nq, nk, dtype=torch.bool)
    glob[:, :n_global, :] = True
    glob[:, :, :n_global] = True
    assert_layout(lay, full_pattern(nq, nk), ~glob, sq, sk, bm, bn, window - 1, window - 1)
    assert_canonical(lay)


@pytest.mark.parametrize("sq,sk,bm,bn,heads", sizes_heads())
@pytest.mark.parametrize("k", [1, 3, 100])
def test_random_topk(sq, sk, bm, bn, heads, k):
    lay = L.random_topk(sq, k, seed=7, seq_k=sk, block_m=bm, block_n=bn, num_heads=heads)
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    assert lay.num_heads == heads
    assert torch.equal(lay.row_counts(), torch.full((heads, nq), min(k, nk), dtype=torch.int32))
    pat = lay.to_dense_mask()
    assert_layout(lay, pat, torch.zeros_like(pat), sq, sk, bm, bn, -1, -1)
    again = L.random_topk(sq, k, seed=7, seq_k=sk, block_m=bm, block_n=bn, num_heads=heads)
    assert again == lay


def test_random_topk_seeds_and_heads_differ():
    a = L.random_topk(4096, 8, seed=1, block_m=64, block_n=64, num_heads=2)
    b = L.random_topk(4096, 8, seed=2, block_m=64, block_n=64, num_heads=2)
    assert a != b
    dm = a.to_dense_mask()
    assert not torch.equal(dm[0], dm[1])
    # roughly uniform: every key block is picked by some row
    assert bool(dm.any(1).all())


# ------------------------------------------------------------------------------------------------------------
# from_block_mask / from_bsr / from_scores / flex: property tests over random masks
# ------------------------------------------------------------------------------------------------------------

RULES = [(-1, -1), (-1, 0), (40, 0), (100, 100), (0, 7)]


def random_case(seed):
    g = torch.Generator().manual_seed(seed)
    sq, sk, bm, bn = SIZES[seed % len(SIZES)]
    heads = HEADS[(seed // len(SIZES)) % 2]
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    density = [0.0, 0.2, 0.6, 1.0][seed % 4]
    mask = torch.rand(heads, nq, nk, generator=g) < density
    wl, wr = RULES[seed % len(RULES)]
    return mask, sq, sk, bm, bn, wl, wr


@pytest.mark.parametrize("seed", range(30))
def test_from_block_mask_brute_force(seed):
    mask, sq, sk, bm, bn, wl, wr = random_case(seed)
    lay = L.from_block_mask(mask, sq, sk, bm, bn, window_left=wl, window_right=wr)
    assert lay.num_heads == mask.shape[0]
    assert_layout(lay, mask, torch.ones_like(mask), sq, sk, bm, bn, wl, wr)
    assert_canonical(lay)
    if wl < 0 and wr < 0:
        assert torch.equal(lay.to_dense_mask(), mask)
    # 2-D shared mask
    lay2 = L.from_block_mask(mask[0], sq, sk, bm, bn, window_left=wl, window_right=wr)
    assert lay2.num_heads == 1 and torch.equal(lay2.to_dense_mask()[0], lay.to_dense_mask()[0])


@pytest.mark.parametrize("seed", range(30))
def test_round_trips(seed):
    mask, sq, sk, bm, bn, wl, wr = random_case(seed)
    lay = L.from_block_mask(mask, sq, sk, bm, bn, window_left=wl, window_right=wr)
    # dense
    assert L.from_block_mask(lay.to_dense_mask(), sq, sk, bm, bn, window_left=wl, window_right=wr) == lay
    # BSR (stored 2-D form, and 1-D form for one head)
    ip, ix = lay.to_bsr()
    assert L.from_bsr(ip, ix, sq, sk, bm, bn, window_left=wl, window_right=wr) == lay
    if lay.num_heads == 1:
        assert ip.dim() == 1 and ix.numel() == lay.nnz
    # the transpose is a layout over the key axis listing the same blocks (BOUNDS recomputed for its own end)
    t = lay.transpose()
    assert isinstance(t, L) and t is lay.transpose() and t.transpose() is lay
    assert t.row_ptr.shape == (lay.num_heads, lay.n_kblocks + 1) and t.col_idx.shape == lay.col_idx.shape
    assert (t.seq_q, t.seq_k, t.block_m, t.block_n) == (sk, sq, bn, bm)
    assert (t.window_left, t.window_right) == (wr, wl)
    assert_contract(t)
    assert {(h, r, c, k & 2) for h, r, c, k in triples_csr(lay)} == triples_transposed(t)
    # Flex
    assert_flex_round_trip(lay)


def triples_csr(lay):
    out = set()
    for h in range(lay.num_heads):
        for r in range(lay.n_qblocks):
            for i in range(int(lay.row_ptr[h, r]), int(lay.row_ptr[h, r + 1])):
                out.add((h, r, int(lay.col_idx[h, i]), int(lay.block_kind[h, i])))
    return out


def triples_transposed(t):
    """(h, query block, key block, RULE bit) of a transposed layout, read back from its rows (key blocks)."""
    out = set()
    for h in range(t.num_heads):
        assert int(t.row_ptr[h, 0]) == 0
        for c in range(t.n_qblocks):
            a, b = int(t.row_ptr[h, c]), int(t.row_ptr[h, c + 1])
            rows = t.col_idx[h, a:b].tolist()
            assert rows == sorted(set(rows))
            for r, k in zip(rows, t.block_kind[h, a:b].tolist()):
                out.add((h, r, c, k & 2))
    return out


def flex():
    return pytest.importorskip("torch.nn.attention.flex_attention")


def assert_flex_round_trip(lay):
    fa = flex()
    bm = lay.to_flex_block_mask()
    assert isinstance(bm, fa.BlockMask) and lay.to_flex_block_mask() is bm
    assert bm.seq_lengths == (lay.seq_q, lay.seq_k)
    dense = bm.to_dense()[0].bool()
    assert torch.equal(dense, lay.to_dense_mask())
    # Flex's full list is exactly our FULL blocks
    full = fa._ordered_to_dense(bm.full_kv_num_blocks, bm.full_kv_indices, lay.n_kblocks)[0].bool()
    assert torch.equal(full, lay.to_kind_grid() == 0)
    back = L.from_flex_block_mask(bm, window_left=lay.window_left, window_right=lay.window_right)
    assert back == lay
    # the mask_mod reproduces the exact element mask
    elem = fa.create_mask(bm.mask_mod, 1, lay.num_heads, lay.seq_q, lay.seq_k, device="cpu")[0]
    assert torch.equal(elem, lay.to_element_mask())


@pytest.mark.parametrize("sq,sk,bm,bn", [(300, 300, 128, 128), (513, 190, 64, 64), (257, 513, 128, 64)])
def test_from_flex_create_block_mask(sq, sk, bm, bn):
    fa = flex()
    off = sk - sq

    def causal(b, h, q, k):
        return k <= q + off

    def window(b, h, q, k):
        return (k <= q + off) & (k >= q + off - 99)

    flex_bm = fa.create_block_mask(causal, 1, 1, sq, sk, device="cpu", BLOCK_SIZE=(bm, bn))
    assert L.from_flex_block_mask(flex_bm, window_left=-1, window_right=0) == L.causal(sq, sk, bm, bn)
    flex_bm = fa.create_block_mask(window, None, None, sq, sk, device="cpu", BLOCK_SIZE=(bm, bn))
    assert L.from_flex_block_mask(flex_bm, window_left=99, window_right=0) == L.sliding_window(sq, 100, sk, bm, bn)
    # without a rule, partial blocks are FULL: the same blocks, no RULE bits, a superset of the elements
    loose = L.from_flex_block_mask(flex_bm)
    assert torch.equal(loose.to_dense_mask(), L.sliding_window(sq, 100, sk, bm, bn).to_dense_mask())
    assert not loose.has_rule and bool(((loose.block_kind & 2) == 0).all())


def test_flex_attention_matches_sdpa_with_element_mask():
    fa = flex()
    torch.manual_seed(0)
    lay = L.from_block_mask(torch.rand(2, 5, 4) < 0.6, 300, 200, 64, 64, window_left=90, window_right=10)
    q = torch.randn(1, 2, 300, 32, dtype=torch.float64)
    k = torch.randn(1, 2, 200, 32, dtype=torch.float64)
    v = torch.randn(1, 2, 200, 32, dtype=torch.float64)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fa.flex_attention(q, k, v, block_mask=lay.to_flex_block_mask())
    mask = lay.to_element_mask()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(0))
    rows = mask.any(-1).unsqueeze(0).unsqueeze(-1)  # SDPA gives NaN on empty rows; Flex gives 0
    torch.testing.assert_close(torch.where(rows, out, 0), torch.where(rows, ref, 0))


def test_from_flex_batch_and_errors():
    fa = flex()
    lay = L.causal(256, block_m=64, block_n=64)
    bm = lay.to_flex_block_mask()
    two = fa.BlockMask.from_kv_blocks(bm.kv_num_blocks.repeat(2, 1, 1), bm.kv_indices.repeat(2, 1, 1, 1),
                                      bm.full_kv_num_blocks.repeat(2, 1, 1), bm.full_kv_indices.repeat(2, 1, 1, 1),
                                      BLOCK_SIZE=(64, 64), seq_lengths=(256, 256))
    assert L.from_flex_block_mask(two, window_left=-1, window_right=0) == lay
    kvn = bm.kv_num_blocks.repeat(2, 1, 1)
    kvn[1] = 0
    bad = fa.BlockMask.from_kv_blocks(kvn, bm.kv_indices.repeat(2, 1, 1, 1), BLOCK_SIZE=(64, 64),
                                      seq_lengths=(256, 256))
    with pytest.raises(LayoutError, match="batch"):
        L.from_flex_block_mask(bad)
    with pytest.raises(InputError, match="BlockMask"):
        L.from_flex_block_mask(object())


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sq,sk,bm,bn", [(1000, 1000, 64, 64), (513, 900, 128, 64), (900, 300, 64, 128)])
@pytest.mark.parametrize("k", [1, 4, 100])
def test_from_scores_equals_topk(heads, sq, sk, bm, bn, k):
    nq, nk = cdiv(sq, bm), cdiv(sk, bn)
    scores = torch.randn(heads, nq, nk, generator=torch.Generator().manual_seed(k + heads))
    kk = min(k, nk)
    # keep_diagonal=False: exactly torch.topk's selection
    lay = L.from_scores(scores, k, keep_diagonal=False, seq_q=sq, seq_k=sk, block_m=bm, block_n=bn)
    want = torch.zeros(heads, nq, nk, dtype=torch.bool).scatter_(2, torch.topk(scores, kk, dim=2).indices, True)
    assert torch.equal(lay.to_dense_mask(), want)
    assert_layout(lay, want, torch.zeros_like(want), sq, sk, bm, bn, -1, -1)
    # keep_diagonal=True: diagonal block + topk(k - 1) of the rest
    lay = L.from_scores(scores, k, keep_diagonal=True, seq_q=sq, seq_k=sk, block_m=bm, block_n=bn)
    want = torch.zeros(heads, nq, nk, dtype=torch.bool)
    s2 = scores.clone()
    for r in range(nq):
        d = diag_ref(r, sq, sk, bm, bn)
        want[:, r, d] = True
        s2[:, r, d] = float("-inf")
    if kk > 1:
        want.scatter_(2, torch.topk(s2, kk - 1, dim=2).indices, True)
    assert torch.equal(lay.to_dense_mask(), want)
    assert torch.equal(lay.row_counts(), torch.full((heads, nq), kk, dtype=torch.int32))
    # 2-D scores -> one shared head
    assert L.from_scores(scores[0], k, seq_q=sq, seq_k=sk, block_m=bm, block_n=bn).num_heads == 1


def test_from_scores_device_follows_scores():
    s = torch.randn(4, 4)
    lay = L.from_scores(s, 2, block_m=64, block_n=64)
    assert lay.device == s.device and lay.seq_q == 256 and lay.seq_k == 256


def test_from_bsr_unsorted_duplicates_and_scipy_like_inputs():
    import numpy as np
    indptr = np.array([0, 3, 3, 5])
    indices = np.array([2, 0, 2, 1, 0])
    lay = L.from_bsr(indptr, indices, 300, 200, 128, 64)
    want = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(lay.to_dense_mask()[0], want)
    assert lay.row_ptr.tolist() == [[0, 2, 2, 4]] and lay.col_idx.tolist() == [[0, 2, 0, 1]]
    # per-head 2-D with padding
    ip = torch.tensor([[0, 1, 1, 2], [0, 0, 0, 0]])
    ix = torch.tensor([[3, 1], [0, 0]])
    lay = L.from_bsr(ip, ix, 300, 200, 128, 64)
    assert lay.num_heads == 2 and lay.nnz_per_head == [2, 0] and lay.col_idx.shape == (2, 2)
    assert lay.block_kind[0].tolist() == [1, 0]  # 200 % 64 != 0: block 3 is the bounds block
