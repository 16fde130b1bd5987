"""BlockSparseLayout, continued: transforms (with_causal, row order and schedules, devices, immutability, pickling),
validation errors, and scale and plotting. CPU only; the references are test_layout.py's.
"""
from __future__ import annotations

import pickle
import time

import pytest
import torch

from blackwell_sparsek.errors import InputError, LayoutError
from blackwell_sparsek.layout import BlockSparseLayout as L
from test_layout import SIZES, assert_canonical, assert_contract, cdiv, rule_ref


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread

# ------------------------------------------------------------------------------------------------------------
# transforms
# ------------------------------------------------------------------------------------------------------------

CAUSAL_CASES = [
    ("dense", lambda sq, sk, bm, bn: L.dense(sq, sk, bm, bn, num_heads=2)),
    ("window_sym", lambda sq, sk, bm, bn: L.sliding_window(sq, 150, sk, bm, bn, causal=False)),
    ("window_causal", lambda sq, sk, bm, bn: L.sliding_window(sq, 150, sk, bm, bn)),
    ("strided_nc", lambda sq, sk, bm, bn: L.strided(sq, 3, 2, sk, bm, bn, causal=False)),
    ("global_local_wide", lambda sq, sk, bm, bn: L.global_local(sq, 1, 400, sk, bm, bn)),
    ("random", lambda sq, sk, bm, bn: L.random_topk(sq, 3, 1, sk, bm, bn, num_heads=3)),
    ("mask_rule", lambda sq, sk, bm, bn: L.from_block_mask(
        torch.rand(cdiv(sq, bm), cdiv(sk, bn), generator=torch.Generator().manual_seed(3)) < 0.5,
        sq, sk, bm, bn, window_left=5, window_right=30)),
]


@pytest.mark.parametrize("name,make", CAUSAL_CASES, ids=[c[0] for c in CAUSAL_CASES])
@pytest.mark.parametrize("sq,sk,bm,bn", [(300, 300, 64, 64), (513, 190, 128, 64), (257, 513, 64, 128)])
def test_with_causal(name, make, sq, sk, bm, bn):
    lay = make(sq, sk, bm, bn)
    c = lay.with_causal()
    assert c is lay.with_causal()
    assert c.window_left == lay.window_left and c.window_right == 0
    want = lay.to_element_mask() & rule_ref(sq, sk, -1, 0)
    assert torch.equal(c.to_element_mask(), want)
    assert_contract(c)
    if name != "random":
        assert_canonical(c)
    # drops exactly the blocks that lose every element; never adds blocks
    dm = lay.to_dense_mask()
    assert torch.equal(c.to_dense_mask() & ~dm, torch.zeros_like(dm))
    assert c.with_causal() == c


def test_with_causal_matches_causal_constructors():
    for sq, sk, bm, bn in SIZES:
        assert L.dense(sq, sk, bm, bn).with_causal() == L.causal(sq, sk, bm, bn)
        assert (L.sliding_window(sq, 77, sk, bm, bn, causal=False).with_causal()
                == L.sliding_window(sq, 77, sk, bm, bn, causal=True))


def test_with_causal_unrepresentable_raises():
    lay = L.global_local(512, 1, 16, block_m=64, block_n=64)
    with pytest.raises(LayoutError, match="window_left"):
        lay.with_causal()


def test_row_order():
    for lay in [L.causal(1000, block_m=64, block_n=64), L.random_topk(700, 3, 2, block_m=64, block_n=64),
                L.from_block_mask(torch.rand(3, 9, 7, generator=torch.Generator().manual_seed(1)) < 0.5),
                L.global_local(1000, 2, 100, block_m=64, block_n=64)]:
        order = lay.row_order()
        assert order.dtype == torch.int32 and order.shape == (lay.num_heads, lay.n_qblocks)
        assert order is lay.row_order()
        counts = (lay.row_ptr[:, 1:] - lay.row_ptr[:, :-1]).tolist()
        for h in range(lay.num_heads):
            want = sorted(range(lay.n_qblocks), key=lambda r: -counts[h][r])  # Python's sort is stable
            assert order[h].tolist() == want


def test_row_schedule():
    empty_last = torch.zeros(2, 5, 4, dtype=torch.bool)
    empty_last[0, 1, 2] = empty_last[0, 2, 0] = empty_last[0, 2, 3] = empty_last[1, 0, 1] = True  # rows 3, 4 empty
    for lay in [L.causal(1000, block_m=64, block_n=64), L.random_topk(700, 3, 2, block_m=64, block_n=64),
                L.from_block_mask(torch.rand(3, 9, 7, generator=torch.Generator().manual_seed(1)) < 0.5),
                L.from_block_mask(empty_last), L.from_block_mask(torch.zeros(1, 3, 3, dtype=torch.bool))]:
        sched = lay.row_schedule()
        assert sched.dtype == torch.int32 and sched.shape == (lay.num_heads, lay.n_qblocks, 4)
        assert sched.is_contiguous() and sched is lay.row_schedule()
        rp, ci, bk = lay.row_ptr.tolist(), lay.col_idx.tolist(), lay.block_kind.tolist()
        for h in range(lay.num_heads):
            first = [ci[h][rp[h][r]] | bk[h][rp[h][r]] << 24 if rp[h][r + 1] > rp[h][r] else 0
                     for r in range(lay.n_qblocks)]
            want = [[r, rp[h][r], rp[h][r + 1], first[r]] for r in lay.row_order()[h].tolist()]
            assert sched[h].tolist() == want
    assert any(int(k) for k in L.causal(1000, block_m=64, block_n=64).row_schedule()[..., 3].flatten() >> 24)
    wide = L(torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[5]], dtype=torch.int32),
             torch.zeros(1, 1, dtype=torch.uint8), seq_q=64, seq_k=((1 << 24) + 1) * 64, block_m=64, block_n=64)
    with pytest.raises(LayoutError, match="24 bits"):
        wide.row_schedule()


def test_to_device_caching():
    lay = L.causal(1000, block_m=64, block_n=64)
    assert lay.to("cpu") is lay and lay.to(torch.device("cpu")) is lay and lay.cpu() is lay
    m = lay.to("meta")
    assert m.device.type == "meta" and m.row_ptr.device.type == "meta"
    assert lay.to("meta") is m and m.to("meta") is m
    assert m.to("cpu") is lay
    assert m.nnz == lay.nnz and m.nnz_per_head == lay.nnz_per_head and "meta" in repr(m)
    assert (m.window_left, m.window_right, m.seq_q, m.block_m) == (-1, 0, 1000, 64)


def test_immutable_eq_hash_repr_pickle():
    a = L.sliding_window(1000, 200, block_m=64, block_n=64)
    b = L.sliding_window(1000, 200, block_m=64, block_n=64)
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != L.sliding_window(1000, 201, block_m=64, block_n=64)
    assert a != L.sliding_window(1000, 200, block_m=64, block_n=64, causal=False)
    assert a != L.sliding_window(1000, 200, block_m=64, block_n=64, num_heads=2)
    assert a != "layout"
    with pytest.raises(AttributeError):
        a.seq_q = 5
    with pytest.raises(AttributeError):
        a.row_ptr = a.row_ptr
    with pytest.raises(AttributeError):
        a.extra = 1
    r = repr(a)
    for part in ("seq_q=1000", "seq_k=1000", "block=64x64", "heads=1", f"nnz={a.nnz}", "density=", "rule=causal"):
        assert part in r
    assert pickle.loads(pickle.dumps(a)) == a


def test_raw_constructor_accepts_valid_tensors():
    a = L.global_local(700, 1, 90, 513, 64, 128, num_heads=3)
    b = L(a.row_ptr.clone(), a.col_idx.clone(), a.block_kind.clone(), seq_q=700, seq_k=513, block_m=64,
          block_n=128, window_left=89, window_right=89)
    assert a == b


# ------------------------------------------------------------------------------------------------------------
# validation errors
# ------------------------------------------------------------------------------------------------------------

def parts():
    lay = L.from_block_mask(torch.tensor([[[1, 1, 0], [0, 1, 1]], [[1, 0, 1], [0, 0, 0]]], dtype=torch.bool),
                            200, 300, 128, 128)
    return lay.row_ptr.clone(), lay.col_idx.clone(), lay.block_kind.clone(), dict(seq_q=200, seq_k=300,
                                                                                   block_m=128, block_n=128)


def make(rp, ci, bk, kw, **extra):
    return L(rp, ci, bk, **{**kw, **extra})


def test_parts_are_valid():
    rp, ci, bk, kw = parts()
    assert rp.tolist() == [[0, 2, 4], [0, 2, 2]]
    assert ci.tolist() == [[0, 1, 1, 2], [0, 2, 0, 0]]
    assert bk.tolist() == [[0, 0, 0, 1], [0, 1, 0, 0]]
    make(rp, ci, bk, kw)


def _bad(match, mutate, **extra):
    rp, ci, bk, kw = parts()
    rp, ci, bk = mutate(rp, ci, bk)
    with pytest.raises(LayoutError, match=match):
        make(rp, ci, bk, kw, **extra)


def _set(t, idx, val):
    t[idx] = val
    return t


BAD = [
    ("row_ptr must be torch.int32", lambda rp, ci, bk: (rp.long(), ci, bk)),
    ("col_idx must be torch.int32", lambda rp, ci, bk: (rp, ci.long(), bk)),
    ("block_kind must be torch.uint8", lambda rp, ci, bk: (rp, ci, bk.int())),
    ("must be a torch.Tensor", lambda rp, ci, bk: (rp.tolist(), ci, bk)),
    ("different devices", lambda rp, ci, bk: (rp, ci.to("meta"), bk)),
    ("row_ptr must be 2-D", lambda rp, ci, bk: (rp[0], ci, bk)),
    ("n_qblocks \\+ 1", lambda rp, ci, bk: (torch.cat([rp, rp[:, -1:]], 1), ci, bk)),
    ("col_idx must be 2-D", lambda rp, ci, bk: (rp, ci[:1], bk[:1])),
    ("col_idx must be 2-D", lambda rp, ci, bk: (rp, ci[0], bk[0])),
    ("block_kind must have col_idx's shape", lambda rp, ci, bk: (rp, ci, bk[:, :3])),
    ("must be 0 for every head", lambda rp, ci, bk: (_set(rp, (1, 0), 1), ci, bk)),
    ("non-decreasing", lambda rp, ci, bk: (_set(rp, (0, 1), 5), ci, bk)),
    ("exceeds col_idx's width", lambda rp, ci, bk: (rp, ci[:, :3], bk[:, :3])),
    ("must lie in \\[0, n_kblocks=3\\)", lambda rp, ci, bk: (rp, _set(ci, (0, 1), 3), bk)),
    ("must lie in", lambda rp, ci, bk: (rp, _set(ci, (0, 0), -1), bk)),
    ("sorted ascending and unique", lambda rp, ci, bk: (rp, _set(ci, (0, 0), 1), bk)),            # duplicate
    ("sorted ascending and unique", lambda rp, ci, bk: (rp, _set(_set(ci, (0, 2), 2), (0, 3), 1),
                                                        _set(_set(bk, (0, 2), 1), (0, 3), 0))),  # unsorted
    ("values must be in 0..3", lambda rp, ci, bk: (rp, ci, _set(bk, (0, 0), 4))),
    ("padding", lambda rp, ci, bk: (rp, _set(ci, (1, 3), 1), bk)),
    ("padding", lambda rp, ci, bk: (rp, ci, _set(bk, (1, 3), 2))),
    ("BOUNDS bit", lambda rp, ci, bk: (rp, ci, _set(bk, (0, 3), 0))),
    ("BOUNDS bit", lambda rp, ci, bk: (rp, ci, _set(bk, (0, 0), 1))),
    ("has no rule", lambda rp, ci, bk: (rp, ci, _set(bk, (0, 0), 2))),
]


@pytest.mark.parametrize("match,mutate", BAD, ids=[f"{i}-{b[0][:24]}" for i, b in enumerate(BAD)])
def test_validation_errors(match, mutate):
    _bad(match, mutate)


@pytest.mark.parametrize("kw,match", [
    (dict(seq_q=0), "seq_q must be >= 1"),
    (dict(seq_q=True), "bool"),
    (dict(seq_q=1.5), "must be an int"),
    (dict(block_m=0), "block_m must be >= 1"),
    (dict(window_left=-2), "window_left must be >= -1"),
    (dict(window_right="0"), "window_right must be an int"),
])
def test_scalar_errors(kw, match):
    rp, ci, bk, base = parts()
    with pytest.raises(LayoutError, match=match):
        make(rp, ci, bk, base, **kw)


def test_rule_bits_allowed_with_rule():
    rp, ci, bk, kw = parts()
    bk[0, 0] = 2
    lay = make(rp, ci, bk, kw, window_left=-1, window_right=0)
    assert lay.has_rule


def test_validate_for():
    lay = L.causal(300, 200, 64, 64, num_heads=3)
    lay.validate_for(2, 3, 300, 200)
    L.causal(300, 200, 64, 64).validate_for(4, 8, 300, 200)
    with pytest.raises(LayoutError, match="seq_q=300, seq_k=200"):
        lay.validate_for(2, 3, 300, 300)
    with pytest.raises(LayoutError, match="num_heads=1 or num_heads=4"):
        lay.validate_for(2, 4, 300, 200)
    with pytest.raises(LayoutError, match="batch and heads"):
        lay.validate_for(0, 3, 300, 200)
    with pytest.raises(LayoutError, match=r"layout.to\('meta'\)"):
        lay.validate_for(2, 3, 300, 200, device="meta")


def test_constructor_input_errors():
    with pytest.raises(InputError, match="bool"):
        L.from_block_mask(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(InputError, match=r"\[nq, nk\]"):
        L.from_block_mask(torch.ones(2, dtype=torch.bool))
    with pytest.raises(LayoutError, match="give 3x3"):
        L.from_block_mask(torch.ones(2, 2, dtype=torch.bool), seq_q=300, seq_k=300)
    with pytest.raises(InputError, match="floating-point"):
        L.from_scores(torch.ones(2, 2, dtype=torch.int64), 1)
    with pytest.raises(InputError, match="integer"):
        L.from_bsr(torch.tensor([0.0, 1.0]), torch.tensor([0]), 128)
    with pytest.raises(LayoutError, match="start at 0"):
        L.from_bsr(torch.tensor([1, 1]), torch.tensor([0]), 128)
    with pytest.raises(LayoutError, match="nq \\+ 1"):
        L.from_bsr(torch.tensor([0, 1, 1]), torch.tensor([0]), 128)
    with pytest.raises(LayoutError, match="exceeds"):
        L.from_bsr(torch.tensor([0, 2]), torch.tensor([0]), 128)
    with pytest.raises(LayoutError, match="indices must lie"):
        L.from_bsr(torch.tensor([0, 1]), torch.tensor([1]), 128)
    with pytest.raises(LayoutError, match="window must be >= 1"):
        L.sliding_window(128, 0)
    with pytest.raises(LayoutError, match="stride must be >= 1"):
        L.strided(128, 0)
    with pytest.raises(LayoutError, match="num_heads must be >= 1"):
        L.causal(128, num_heads=0)
    with pytest.raises(LayoutError, match="k must be >= 1"):
        L.random_topk(128, 0)


def test_element_mask_refuses_huge():
    lay = L.sliding_window(1 << 14, 64)
    with pytest.raises(LayoutError, match="tests and references"):
        lay.to_element_mask()


# ------------------------------------------------------------------------------------------------------------
# scale (information only: no timed assertion) and plotting
# ------------------------------------------------------------------------------------------------------------

def test_large_sliding_window_is_cheap(capsys):
    seq, window = 512 * 1024, 2048
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        lay = L.sliding_window(seq, window)
        best = min(best, time.perf_counter() - t0)
    nq = lay.n_qblocks
    per_row = window // lay.block_n + 2
    assert nq == 4096 and lay.nnz <= nq * per_row
    assert lay.nbytes <= 4 * (nq + 1) + 5 * nq * per_row  # O(S * k): int32 col_idx + uint8 kind + row_ptr
    with capsys.disabled():
        print(f"\n[info] sliding_window(S={seq}, window={window}): nq={nq}, nnz={lay.nnz}, "
              f"built in {best * 1e3:.1f} ms (best of 3), holds {lay.nbytes} bytes")


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    lay = L.global_local(1000, 1, 100, 900, 64, 64, num_heads=2)
    path = lay.plot(tmp_path / "layout.png", head=1)
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000
    with pytest.raises(LayoutError, match="head=2"):
        lay.plot(tmp_path / "x.png", head=2)


def test_kind_constants():
    assert (L.FULL, L.BOUNDS, L.RULE) == (0, 1, 2)
