"""Properties every layout constructor must keep, over a parameter grid of every constructor.

Odd sequence lengths, seq_q != seq_k both ways, several block shapes (square and not), one and several layout heads.
CPU only.
"""
from __future__ import annotations

import pytest
import torch

from blackwell_sparsek.errors import LayoutError
from blackwell_sparsek.layout import BlockSparseLayout as L

# (seq_q, seq_k, block_m, block_n)
GRID_SIZES = [
    (300, 300, 64, 64),
    (257, 513, 64, 128),
    (513, 190, 128, 64),
    (1000, 1000, 128, 128),
    (2000, 1900, 128, 128),   # the issue's global_local case
    (333, 777, 32, 96),
    (1, 700, 64, 128),
    (190, 1, 64, 64),
]
GRID_HEADS = [1, 3]


def _cdiv(a, b):
    return -(-a // b)


def _gen(*seed):
    return torch.Generator().manual_seed(hash(seed) % (1 << 31))


def _mask(sq, sk, bm, bn, h, density):
    return torch.rand(h, _cdiv(sq, bm), _cdiv(sk, bn), generator=_gen(sq, sk, bm, bn, h)) < density


def _scores(sq, sk, bm, bn, h):
    return torch.randn(h, _cdiv(sq, bm), _cdiv(sk, bn), generator=_gen(sq, sk, bm, bn, h, "s"))


def _bsr(sq, sk, bm, bn, h):
    lay = L.from_block_mask(_mask(sq, sk, bm, bn, h, 0.4), sq, sk, bm, bn)
    return L.from_bsr(lay.row_ptr, lay.col_idx, sq, sk, bm, bn, window_left=100, window_right=100)


def _with_causal(make):
    def build(sq, sk, bm, bn, h):
        try:
            return make(sq, sk, bm, bn, h).with_causal()
        except LayoutError:  # the documented unrepresentable case: no layout to test
            pytest.skip("with_causal() cannot express this case (documented LayoutError)")
    return build


CONSTRUCTORS = {
    "dense": lambda sq, sk, bm, bn, h: L.dense(sq, sk, bm, bn, num_heads=h),
    "causal": lambda sq, sk, bm, bn, h: L.causal(sq, sk, bm, bn, num_heads=h),
    "window_causal": lambda sq, sk, bm, bn, h: L.sliding_window(sq, 37, sk, bm, bn, num_heads=h),
    "window_sym": lambda sq, sk, bm, bn, h: L.sliding_window(sq, 150, sk, bm, bn, causal=False, num_heads=h),
    "strided": lambda sq, sk, bm, bn, h: L.strided(sq, 3, 2, sk, bm, bn, num_heads=h),
    "strided_nc": lambda sq, sk, bm, bn, h: L.strided(sq, 3, 2, sk, bm, bn, causal=False, num_heads=h),
    "dilated": lambda sq, sk, bm, bn, h: L.dilated(sq, 3, 2, sk, bm, bn, num_heads=h),
    "dilated_nc": lambda sq, sk, bm, bn, h: L.dilated(sq, 3, 2, sk, bm, bn, causal=False, num_heads=h),
    "global_local": lambda sq, sk, bm, bn, h: L.global_local(sq, 1, 200, sk, bm, bn, num_heads=h),
    "global_local_2": lambda sq, sk, bm, bn, h: L.global_local(sq, 2, 40, sk, bm, bn, num_heads=h),
    "global_local_0": lambda sq, sk, bm, bn, h: L.global_local(sq, 0, 100, sk, bm, bn, num_heads=h),
    "random_topk": lambda sq, sk, bm, bn, h: L.random_topk(sq, 3, 5, sk, bm, bn, num_heads=h),
    "block_mask": lambda sq, sk, bm, bn, h: L.from_block_mask(_mask(sq, sk, bm, bn, h, 0.5), sq, sk, bm, bn),
    "block_mask_causal_win": lambda sq, sk, bm, bn, h: L.from_block_mask(
        _mask(sq, sk, bm, bn, h, 0.7), sq, sk, bm, bn, window_left=40, window_right=0),
    "block_mask_rule": lambda sq, sk, bm, bn, h: L.from_block_mask(
        _mask(sq, sk, bm, bn, h, 0.7), sq, sk, bm, bn, window_left=0, window_right=7),
    "scores_diag": lambda sq, sk, bm, bn, h: L.from_scores(_scores(sq, sk, bm, bn, h), 3, True, sq, sk, bm, bn),
    "scores": lambda sq, sk, bm, bn, h: L.from_scores(_scores(sq, sk, bm, bn, h), 2, False, sq, sk, bm, bn),
    "bsr_rule": _bsr,
    "dense+causal": _with_causal(lambda sq, sk, bm, bn, h: L.dense(sq, sk, bm, bn, num_heads=h)),
    "window_sym+causal": _with_causal(
        lambda sq, sk, bm, bn, h: L.sliding_window(sq, 150, sk, bm, bn, causal=False, num_heads=h)),
    "global_local+causal": _with_causal(lambda sq, sk, bm, bn, h: L.global_local(sq, 1, 400, sk, bm, bn,
                                                                                 num_heads=h)),
    "random+causal": _with_causal(lambda sq, sk, bm, bn, h: L.random_topk(sq, 3, 1, sk, bm, bn, num_heads=h)),
    "mask_rule+causal": _with_causal(lambda sq, sk, bm, bn, h: L.from_block_mask(
        _mask(sq, sk, bm, bn, h, 0.5), sq, sk, bm, bn, window_left=5, window_right=30)),
}


def grid():
    return [pytest.param(name, *size, h, id=f"{name}-{size[0]}x{size[1]}-b{size[2]}x{size[3]}-h{h}")
            for name in CONSTRUCTORS for size in GRID_SIZES for h in GRID_HEADS]


def build(name, sq, sk, bm, bn, h):
    return CONSTRUCTORS[name](sq, sk, bm, bn, h)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


# ------------------------------------------------------------------------------------------------------------
# FlexAttention round trip (issue 24 item 2)
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,sq,sk,bm,bn,h", grid())
def test_flex_round_trip_is_exact(name, sq, sk, bm, bn, h):
    pytest.importorskip("torch.nn.attention.flex_attention", reason="torch has no flex_attention BlockMask")
    lay = build(name, sq, sk, bm, bn, h)
    back = L.from_flex_block_mask(lay.to_flex_block_mask(), window_left=lay.window_left,
                                  window_right=lay.window_right)
    assert back == lay, f"{name}: nnz {lay.nnz} -> {back.nnz}"


def test_flex_round_trip_issue_case():
    """The reported case: a global block partial only because of the seq_k end came back dropped (96 -> 95)."""
    pytest.importorskip("torch.nn.attention.flex_attention", reason="torch has no flex_attention BlockMask")
    a = L.global_local(2000, n_global=1, window=200, seq_k=1900)
    b = L.from_flex_block_mask(a.to_flex_block_mask(), window_left=a.window_left, window_right=a.window_right)
    assert a.nnz == 96 and b.nnz == 96 and b == a


def test_flex_user_mask_global_blocks_at_sequence_ends():
    """A user's create_block_mask of 'global OR band' with both sequence ends inside a block: the global blocks of
    the last key column and of the last query row are partial in Flex; they must come back FULL, the band's edge
    blocks RULE, giving the exact element mask of the mask_mod."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention", reason="torch has no flex_attention BlockMask")
    sq, sk, bm, bn, w = 1000, 900, 128, 128, 100
    off = sk - sq

    def mask_mod(b, h, q, k):
        band = (k >= q + off - (w - 1)) & (k <= q + off + (w - 1))
        return band | (q < bm) | (k < bn) | (q >= 7 * bm) | (k >= 7 * bn)

    flex_bm = fa.create_block_mask(mask_mod, 1, 1, sq, sk, device="cpu", BLOCK_SIZE=(bm, bn))
    lay = L.from_flex_block_mask(flex_bm, window_left=w - 1, window_right=w - 1)
    want = fa.create_mask(mask_mod, 1, 1, sq, sk, device="cpu")[0]
    assert torch.equal(lay.to_element_mask(), want)
    grid_ = lay.to_kind_grid()[0]
    assert int(grid_[0, 7]) == L.BOUNDS and int(grid_[7, 0]) == L.FULL and int(grid_[7, 7]) == L.BOUNDS


# ------------------------------------------------------------------------------------------------------------
# transpose: the same type over the key axis (issue 25 item 4)
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,sq,sk,bm,bn,h", grid())
def test_transpose(name, sq, sk, bm, bn, h):
    lay = build(name, sq, sk, bm, bn, h)
    t = lay.transpose()
    assert type(t) is L and t is lay.transpose() and t.transpose() is lay
    assert (t.seq_q, t.seq_k, t.block_m, t.block_n, t.num_heads) == (sk, sq, bn, bm, lay.num_heads)
    assert (t.window_left, t.window_right) == (lay.window_right, lay.window_left)
    assert t.nnz_per_head == lay.nnz_per_head and t.col_idx.shape == lay.col_idx.shape
    t.validate()  # the kernel contract, BOUNDS on the new last column included
    assert torch.equal(t.to_element_mask(), lay.to_element_mask().transpose(-1, -2))
    assert torch.equal(t.to_dense_mask(), lay.to_dense_mask().transpose(-1, -2))
    # its schedule runs the heaviest key columns first (stable: ties keep column order)
    cols = lay.to_dense_mask().sum(1)                                           # [Hl, nk] blocks per key column
    want = torch.sort(cols, dim=1, descending=True, stable=True).indices
    assert torch.equal(t.row_order().long(), want)
    assert torch.equal(t.row_schedule()[..., 0].long(), want)
    # a layout built independently from the transposed mask with the swapped rule agrees wherever the pattern is
    # subject to the rule everywhere (canonical RULE bits) - e.g. the plain rule constructors
    if name in ("dense", "causal", "window_causal", "window_sym"):
        again = L.from_block_mask(lay.to_dense_mask().transpose(-1, -2), sk, sq, bn, bm,
                                  window_left=lay.window_right, window_right=lay.window_left)
        assert again == t
    # the double transpose of an equal, separately built layout is equal too
    assert build(name, sq, sk, bm, bn, h).transpose().transpose() == lay


@pytest.mark.parametrize("name", ["causal", "global_local", "random_topk", "window_sym+causal"])
def test_transpose_flex_round_trip(name):
    pytest.importorskip("torch.nn.attention.flex_attention", reason="torch has no flex_attention BlockMask")
    for sq, sk, bm, bn in GRID_SIZES:
        t = build(name, sq, sk, bm, bn, 3).transpose()
        back = L.from_flex_block_mask(t.to_flex_block_mask(), window_left=t.window_left,
                                      window_right=t.window_right)
        assert back == t


def test_transpose_has_no_host_sync():
    """On meta (shapes only, any host sync such as .item() or nonzero raises) the transpose and its schedule are
    computed all the same: the same steps run on a CUDA device without waiting for it."""
    lay = L.global_local(1000, 1, 100, 900, 64, 128, num_heads=3)
    m = lay.to("meta")
    t = m.transpose()
    assert t.device.type == "meta" and t.col_idx.shape == lay.transpose().col_idx.shape
    assert t.row_schedule().shape == (3, lay.n_kblocks, 4) and t.transpose() is m


def test_transpose_of_empty_and_single_block_layouts():
    empty = L.from_block_mask(torch.zeros(2, 3, 4, dtype=torch.bool), 300, 250, 128, 64)
    t = empty.transpose()
    assert t.nnz == 0 and t.row_ptr.shape == (2, 5) and t.col_idx.shape == (2, 1)
    assert torch.equal(t.row_schedule()[..., 1:], torch.zeros(2, 4, 3, dtype=torch.int32))
    one = L.dense(1, 1, 64, 64)
    assert one.transpose().to_kind_grid().tolist() == [[[L.BOUNDS]]] and one.transpose().transpose() is one
    # BOUNDS follows the sequence end of the new columns (the queries): from seq_q % block_m, not seq_k % block_n
    assert L.dense(64, 1, 64, 64).transpose().to_kind_grid().tolist() == [[[L.FULL]]]
    assert L.dense(1, 64, 64, 64).transpose().to_kind_grid().tolist() == [[[L.BOUNDS]]]
