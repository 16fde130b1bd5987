"""Layouts across devices, equality and saving (issue 24 item 24). CPU only."""
from __future__ import annotations

import io
import pickle

import pytest
import torch

import blackwell_sparsek.layout as layout_mod
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
    a = L.sliding_window(1000, 100, block_m=64, block_n=64)
    m = a.to("meta")
    # drop the value-holding member from the family's view: simulate a layout that only exists on meta
    fam = {m.device: m}
    object.__setattr__(m, "_copies", fam)
    m2 = L.sliding_window(1000, 100, block_m=64, block_n=64).to("meta")
    object.__setattr__(m2, "_copies", {m2.device: m2})
    assert m == m and not (m == m2) and m != m2
    assert m != a and a != m  # no values on m: not claimed equal
    assert m != L.causal(1000, block_m=64, block_n=64)


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
