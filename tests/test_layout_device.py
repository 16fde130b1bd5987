"""Layouts across devices, equality, saving, and the checked-tensor marks (issue 24 items 24 and 28, issue 28 item 3
support). CPU, plus one GPU test (marked) for the eager kernel views on a CUDA device."""
from __future__ import annotations

import io
import pickle

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.layout as layout_mod
import blackwell_sparsek.layout.bsr as bsr_mod
from blackwell_sparsek import _trusted
from blackwell_sparsek.errors import LayoutError
from blackwell_sparsek.layout import BlockSparseLayout as L

PATTERNS = {
    "dense": lambda **kw: L.dense(300, 200, 64, 64, **kw),
    "causal": lambda **kw: L.causal(300, 200, 64, 64, **kw),
    "sliding_window": lambda **kw: L.sliding_window(300, 50, 200, 64, 64, **kw),
    "strided": lambda **kw: L.strided(300, 2, 1, 200, 64, 64, **kw),
    "dilated": lambda **kw: L.dilated(300, 2, 2, 200, 64, 64, **kw),
    "global_local": lambda **kw: L.global_local(300, 1, 50, 200, 64, 64, **kw),
    "random_topk": lambda **kw: L.random_topk(300, 2, 0, 200, 64, 64, **kw),
    "from_block_mask": lambda **kw: L.from_block_mask(torch.ones(5, 4, dtype=torch.bool), 300, 200, 64, 64, **kw),
    "from_bsr": lambda **kw: L.from_bsr(torch.tensor([0, 1, 1, 2, 2, 3]), torch.tensor([0, 3, 1]), 300, 200, 64,
                                        64, **kw),
}


# ------------------------------------------------------------------------------------------------------------
# device=None (issue 24 item 24)
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PATTERNS)
def test_constructors_accept_device_none(name):
    lay = PATTERNS[name](device=None)
    assert lay.device == torch.device("cpu")
    assert lay == PATTERNS[name]()


# ------------------------------------------------------------------------------------------------------------
# equality with layouts on meta (issue 24 item 24)
# ------------------------------------------------------------------------------------------------------------

def test_meta_layout_compares_through_its_own_copies():
    a = L.causal(1000, block_m=64, block_n=64)
    b = L.causal(1000, block_m=64, block_n=64)         # equal values, another object (another copy family)
    m = a.to("meta")
    # a meta copy is compared through the layout it came from: no error, and the obvious answers
    assert m == a and a == m and m == m and m == b and b == m
    assert m != L.causal(1000, block_m=64, block_n=128) and m != L.dense(1000, block_m=64, block_n=64)
    bm = b.to("meta")
    assert bm == m  # both have values through their families (a == b)
    assert hash(m) == hash(a)


def test_meta_only_layout_equals_only_its_family():
    """The transpose of a meta layout is computed on meta: it has no values anywhere, so it equals itself (and its
    own device copies) but is never claimed equal to a look-alike, not even the CPU layout's transpose."""
    a = L.sliding_window(1000, 100, 900, block_m=64, block_n=128)
    t = a.to("meta").transpose()
    assert t == t and t == t.to("meta")
    assert t != a.transpose() and a.transpose() != t
    assert t != L.sliding_window(1000, 100, 900, block_m=64, block_n=128).to("meta").transpose()
    assert t.transpose() == a  # back to the meta copy, which compares through a


# ------------------------------------------------------------------------------------------------------------
# torch.save / torch.load with the default weights_only=True (issue 24 item 24)
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: L.global_local(700, 1, 90, 513, 64, 128, num_heads=3),
                                  lambda: L.causal(1000, block_m=64, block_n=64),
                                  lambda: L.random_topk(500, 3, 1, num_heads=2, block_m=64, block_n=64)])
def test_torch_load_default_weights_only(make):
    lay = make()
    buf = io.BytesIO()
    torch.save({"layout": lay, "step": 3}, buf)
    buf.seek(0)
    got = torch.load(buf)  # weights_only=True is torch's default
    assert got["layout"] == lay and got["step"] == 3 and isinstance(got["layout"], L)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["layout"] == lay
    assert pickle.loads(pickle.dumps(lay)) == lay


class _Tampered:
    """Pickles like a layout whose col_idx is out of range (what an edited file would hold)."""

    def __reduce__(self):
        lay = L.causal(256, block_m=64, block_n=64)
        ci = lay.col_idx.clone()
        ci[0, 0] = 9
        return (layout_mod._rebuild, (lay.row_ptr, ci, lay.block_kind, 256, 256, 64, 64, -1, 0))


def test_torch_load_validates_what_it_rebuilds():
    buf = io.BytesIO()
    torch.save(_Tampered(), buf)
    buf.seek(0)
    with pytest.raises(LayoutError, match="must lie in"):
        torch.load(buf)


# ------------------------------------------------------------------------------------------------------------
# checked-tensor marks (issue 28 item 3 support)
# ------------------------------------------------------------------------------------------------------------

def _marked(lay):
    return all(_trusted.is_marked(t) for t in (lay.row_ptr, lay.col_idx, lay.block_kind))


@pytest.mark.parametrize("name", PATTERNS)
def test_layout_tensors_are_marked(name):
    lay = PATTERNS[name](num_heads=2) if name not in ("from_block_mask", "from_bsr") else PATTERNS[name]()
    assert _marked(lay)
    assert _trusted.is_marked(lay.row_schedule())
    assert _marked(lay.to("meta"))
    assert _marked(lay.transpose()) and _trusted.is_marked(lay.transpose().row_schedule())
    if lay.window_left < 0:  # with_causal of a layout without a rule is always expressible
        assert _marked(lay.with_causal()) and _trusted.is_marked(lay.with_causal().row_schedule())


def test_raw_constructor_marks_only_valid_tensors():
    good = L.causal(300, block_m=64, block_n=64)
    rp, ci, bk = good.row_ptr.clone(), good.col_idx.clone(), good.block_kind.clone()
    assert not any(_trusted.is_marked(t) for t in (rp, ci, bk))  # clones of marked tensors are not marked
    ci_bad = ci.clone()
    ci_bad[0, 0] = 99
    with pytest.raises(LayoutError):
        L(rp, ci_bad, bk, seq_q=300, block_m=64, block_n=64, window_right=0)
    assert not any(_trusted.is_marked(t) for t in (rp, ci_bad, bk))
    lay = L(rp, ci, bk, seq_q=300, block_m=64, block_n=64, window_right=0)
    assert _marked(lay)
    lay.col_idx.add_(0)  # an in-place write (forbidden by the contract) drops the mark
    assert not _trusted.is_marked(lay.col_idx)


# ------------------------------------------------------------------------------------------------------------
# kernel views built eagerly on a kernel device (issue 24 item 28)
# ------------------------------------------------------------------------------------------------------------

def test_kernel_views_lazy_on_cpu():
    lay = L.causal(1000, block_m=64, block_n=64)
    assert "row_schedule" not in lay._cache
    lay.row_schedule()
    assert "row_schedule" in lay._cache


def test_kernel_views_eager_on_kernel_devices(monkeypatch):
    """What a CUDA device gets, checked on CPU by declaring 'meta' a kernel device: moving a layout there (and
    building one there) builds the row schedule with it, so no traced region ever computes it."""
    monkeypatch.setattr(bsr_mod, "_EAGER_VIEW_DEVICES", ("cuda", "meta"))
    lay = L.causal(1000, 900, block_m=64, block_n=64, num_heads=2)
    assert "row_schedule" not in lay._cache
    m = lay.to("meta")
    assert "row_schedule" in m._cache and _trusted.is_marked(m._cache["row_schedule"])
    assert m._cache["row_schedule"].shape == lay.row_schedule().shape
    t = m._cache["transpose"]  # the transpose and its schedule, for a backward pass
    assert "row_schedule" in t._cache and _trusted.is_marked(t._cache["row_schedule"]) and _marked(t)
    assert t._cache["row_schedule"].shape == lay.transpose().row_schedule().shape
    built_there = L.sliding_window(1000, 100, block_m=64, block_n=64, device="meta")
    assert "row_schedule" in built_there._cache and "row_schedule" in built_there._cache["transpose"]._cache


def test_kernel_views_skip_unschedulable_layouts(monkeypatch):
    """A layout with more key blocks than the schedule can hold still moves (its row_schedule() raises)."""
    monkeypatch.setattr(bsr_mod, "_EAGER_VIEW_DEVICES", ("cuda", "meta"))
    wide = L(torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[5]], dtype=torch.int32),
             torch.zeros(1, 1, dtype=torch.uint8), seq_q=64, seq_k=((1 << 24) + 1) * 64, block_m=64, block_n=64)
    m = wide.to("meta")
    with pytest.raises(LayoutError, match="24 bits"):
        m.row_schedule()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_views_eager_on_cuda():
    lay = bsk.BlockSparseLayout.global_local(3000, 1, 300, 2900, 128, 128, num_heads=2)
    d = lay.to("cuda")
    assert "row_schedule" in d._cache and _trusted.is_marked(d._cache["row_schedule"])
    assert torch.equal(d._cache["row_schedule"].cpu(), lay.row_schedule())
    t = d._cache["transpose"]
    assert "row_schedule" in t._cache and "row_stats" in t._cache and t.device == d.device
    assert torch.equal(t.row_schedule().cpu(), lay.transpose().row_schedule())
    c = d.with_causal()  # built on the device: views built with it
    assert "row_schedule" in c._cache and torch.equal(c.row_schedule().cpu(), lay.with_causal().row_schedule())
