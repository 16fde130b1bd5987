"""CPU tests of the float64 reference: non-finite logits give NaN rows as SDPA does (issue 24, item 6), rows
with no visible key give O = 0 and LSE = -inf, keys the layout masks are never looked at."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

import blackwell_sparsek as bsk
from blackwell_sparsek.reference import attention_reference

L = bsk.BlockSparseLayout


def _sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale)


def test_reference_propagates_nan_like_sdpa_for_rows_that_see_bad_keys():
    Sq, Sk, D = 256, 384, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, Sq, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, Sk, D, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, Sk, D, generator=g, dtype=torch.float64)
    k[0, 0, 200, 0] = float("inf")  # logit +inf where q[..., 0] > 0, -inf where it is < 0
    k[0, 1, 300, 5] = float("nan")  # a NaN logit for every row of head 1 that sees key 300
    lay = L.sliding_window(seq_q=Sq, seq_k=Sk, window=100)
    scale = D ** -0.5
    o, lse = attention_reference(q, k, v, lay, scale=scale)
    mask = lay.to_element_mask()                           # [1, Sq, Sk]
    s = (q @ k.transpose(-1, -2)) * scale
    bad_visible = ((s == float("inf")) | s.isnan()) & mask
    bad_hidden = ((s == float("inf")) | s.isnan()) & ~mask  # SDPA adds -inf to these: NaN there, not here
    sees_bad = bad_visible.any(-1)
    assert sees_bad[0, 0].any() and sees_bad[0, 1].any() and (~sees_bad).any()
    assert o[sees_bad].isnan().all() and lse[sees_bad].isnan().all()
    assert torch.isfinite(o[~sees_bad]).all() and not (lse[~sees_bad] == float("inf")).any()
    comparable = ~bad_hidden.any(-1)
    assert (comparable & sees_bad).any()
    ref = _sdpa(q, k, v, mask, scale)
    assert torch.equal(o[comparable].isnan(), ref[comparable].isnan())
    fin = comparable & ~sees_bad
    torch.testing.assert_close(o[fin], ref[fin], rtol=1e-12, atol=1e-12)
    # rows that see only a -inf logit from key 200 are ordinary rows
    minus = ((s == float("-inf")) & mask).any(-1) & fin
    assert minus.any()


def test_reference_empty_rows_are_zero_and_minus_inf():
    lay = L.from_block_mask(torch.tensor([[True, False], [False, False]]), seq_q=256, seq_k=256)
    q, k, v = (torch.randn(1, 1, 256, 64, dtype=torch.float16) for _ in range(3))
    k[0, 0, 200, 0] = float("inf")  # in an unlisted block: never looked at
    o, lse = attention_reference(q, k, v, lay)
    assert torch.isfinite(o).all() and (o[0, 0, 128:] == 0).all()
    assert (lse[0, 0, 128:] == float("-inf")).all() and torch.isfinite(lse[0, 0, :128]).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        o2 = bsk.sparse_attention(q, k, v, lay)  # the CPU fallback: the same
    assert torch.isfinite(o2).all() and torch.equal(o2, o.half())


def test_reference_under_autograd_gives_the_same_values_and_gradients():
    # in place when nothing needs a gradient (the fallback's memory), out of place under autograd
    lay = L.sliding_window(seq_q=200, seq_k=300, window=64)
    q, k, v = (torch.randn(2, 2, s, 64, dtype=torch.float64) for s in (200, 300, 300))
    o, lse = attention_reference(q, k, v, lay)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    og, lseg = attention_reference(qg, kg, vg, lay)
    assert torch.equal(o, og.detach()) and torch.equal(lse, lseg.detach())
    og.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (qg, kg, vg))
