"""CPU tests of the raw op's contract (issue 28, item 3) and of what compiled code may read of a layout (issue 24,
item 28).

torch.ops.blackwell_sparsek.attn_fwd takes index tensors from its caller: every call checks shapes, dtypes,
devices and meta on the host; unmarked index tensors also get their values checked (one sync) and are then marked.
On CPU tensors the op refuses to run after its checks ("runs on CUDA tensors"), which is what these tests observe.
"""
from __future__ import annotations

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention as ops
from blackwell_sparsek import _trusted
from blackwell_sparsek.errors import InputError, InvalidConfigError, LayoutError

L = bsk.BlockSparseLayout
S = 640  # 5 query blocks, 5 key blocks of 128


@pytest.fixture(autouse=True)
def _nothing_built(fake_nvcc):
    yield
    assert fake_nvcc.count() == 0, "a check must refuse before any kernel is built"


def _case(per_head=False):
    lay = L.random_topk(seq_q=S, k=2, seed=3, num_heads=2 if per_head else 1)
    q, k, v = (torch.randn(1, 2, S, 64, dtype=torch.float16) for _ in range(3))
    cfg = ops.default_config(64, torch.float16, lay).to_json()
    idx = dict(col_idx=lay.col_idx.clone(), block_kind=lay.block_kind.clone(), row_sched=lay.row_schedule().clone())
    return q, k, v, lay, idx, cfg


def _call(q, k, v, idx, meta, cfg, scale=0.125):
    return torch.ops.blackwell_sparsek.attn_fwd(q, k, v, idx["col_idx"], idx["block_kind"], idx["row_sched"], meta,
                                                scale, cfg)


def test_good_index_tensors_pass_and_are_marked():
    q, k, v, lay, idx, cfg = _case()
    assert not any(_trusted.is_marked(t) for t in idx.values())
    with pytest.raises(InputError, match="runs on CUDA tensors"):  # every check passed
        _call(q, k, v, idx, ops._meta(lay), cfg)
    assert all(_trusted.is_marked(t) for t in idx.values())


def _edit(idx, name, fn):
    out = {n: t.clone() for n, t in idx.items()}
    fn(out[name])
    return out


@pytest.mark.parametrize("per_head", [False, True])
def test_bad_index_values_are_refused(per_head):
    q, k, v, lay, idx, cfg = _case(per_head)
    M, nk = idx["col_idx"].shape[1], lay.n_kblocks
    bad = {
        "range": (_edit(idx, "row_sched", lambda s: s[0, 1, 2].fill_(M + 3)), "range .* outside col_idx"),
        "start>end": (_edit(idx, "row_sched", lambda s: s[0, 1, 1].copy_(s[0, 1, 2] + 1)), "start > end"),
        "negative": (_edit(idx, "row_sched", lambda s: s[0, 2, 1].fill_(-1)), "range"),
        "row": (_edit(idx, "row_sched", lambda s: s[0, 0, 0].fill_(lay.n_qblocks)), "row lies outside"),
        "twice": (_edit(idx, "row_sched", lambda s: s[0, 0, 0].copy_(s[0, 1, 0])), "listed twice"),
        "first col": (_edit(idx, "row_sched", lambda s: s[0, 0, 3].fill_(nk)), "first block has a column"),
        "first kind": (_edit(idx, "row_sched", lambda s: s[0, 0, 3].fill_(5 << 24)), "kind > 3"),
        "column": (_edit(idx, "col_idx", lambda c: c[0, 0].fill_(nk)), "column outside"),
        "neg column": (_edit(idx, "col_idx", lambda c: c[-1, -1].fill_(-7)), "column outside"),
        "kind": (_edit(idx, "block_kind", lambda b: b[0, 0].fill_(4)), "block_kind holds a value > 3"),
    }
    for what, (tensors, msg) in bad.items():
        with pytest.raises(InputError, match=msg):
            _call(q, k, v, tensors, ops._meta(lay), cfg)


def test_bad_shapes_dtypes_meta_scale_config_are_refused():
    q, k, v, lay, idx, cfg = _case()
    meta = ops._meta(lay)
    rs, ci, bk = idx["row_sched"], idx["col_idx"], idx["block_kind"]
    cases = [
        (dict(idx, row_sched=rs[:, :-1].contiguous()), meta, cfg, "row_sched must be the layout's row_schedule"),
        (dict(idx, row_sched=rs.long()), meta, cfg, "row_sched must be a 3-D torch.int32"),
        (dict(idx, col_idx=ci.long()), meta, cfg, "col_idx must be a 2-D torch.int32"),
        (dict(idx, col_idx=ci[0]), meta, cfg, "col_idx must be a 2-D"),
        (dict(idx, block_kind=bk.int()), meta, cfg, "block_kind must be a 2-D torch.uint8"),
        (dict(idx, block_kind=bk[:, :-1].contiguous()), meta, cfg, "block_kind must have col_idx's shape"),
        (dict(idx, col_idx=ci.expand(3, -1).contiguous(), block_kind=bk.expand(3, -1).contiguous()), meta, cfg,
         "Hl 1 or the 2 query heads"),
        (dict(idx, col_idx=torch.cat([ci, ci], 1)[:, ::2]), meta, cfg, "col_idx must be contiguous"),
        (idx, meta[:3], cfg, "meta must be 4 or 5 ints"),
        (idx, [meta[0], meta[1], meta[2] + 1, meta[3]], cfg, "n_kblocks = ceil"),
        (idx, [meta[0], meta[1], meta[2], 2], cfg, "rank_major 0 or 1"),
        (idx, meta, ops.default_config(128, torch.float16, lay).to_json(), "head_dim=128"),
        (idx, meta, ops.default_config(64, torch.bfloat16, lay).to_json(), "dtype=bf16"),
    ]
    for tensors, m, c, msg in cases:
        with pytest.raises(InputError, match=msg):
            _call(q, k, v, tensors, m, c)
    with pytest.raises(InputError, match="finite float32"):
        _call(q, k, v, idx, meta, cfg, scale=float("inf"))
    with pytest.raises(InvalidConfigError):
        _call(q, k, v, idx, meta, "{}")
    with pytest.raises(InvalidConfigError, match="to_json"):
        _call(q, k, v, idx, meta, "[1, 2]")
    with pytest.raises(InputError, match="k/v shape"):
        _call(q, k[..., :32].contiguous(), v[..., :32].contiguous(), idx, meta, cfg)
    with pytest.raises(InputError, match="row_sched must be the layout's"):  # seq_q past the schedule's rows
        _call(torch.randn(1, 2, S + 128, 64, dtype=torch.float16), k, v, idx, meta, cfg)


def test_marked_tensors_skip_the_value_check_until_written():
    q, k, v, lay, idx, cfg = _case()
    bad = _edit(idx, "row_sched", lambda s: s[0, 1, 2].fill_(10_000))  # would read far past col_idx
    _trusted.mark(*bad.values())   # vouched for (as a layout vouches for its own tensors): values not rechecked
    with pytest.raises(InputError, match="runs on CUDA tensors"):
        _call(q, k, v, bad, ops._meta(lay), cfg)
    bad["row_sched"][0, 1, 2] += 1  # an in-place write drops the mark: checked again
    with pytest.raises(InputError, match="range .* outside col_idx"):
        _call(q, k, v, bad, ops._meta(lay), cfg)


def test_compiled_calls_only_read_built_row_schedules():
    fresh = L.random_topk(seq_q=S, k=2, seed=5)
    if "row_schedule" in fresh._cache:
        pytest.skip("this layout builds its row schedule when made")
    with pytest.raises(LayoutError, match=r"layout.row_schedule\(\) once eagerly"):
        ops._built_row_schedule(fresh, causal=False)
    with pytest.raises(LayoutError, match=r"layout.with_causal\(\).row_schedule\(\)"):
        ops._built_row_schedule(fresh.with_causal(), causal=True)
    built = fresh.row_schedule()
    assert ops._built_row_schedule(fresh, causal=False) is built
