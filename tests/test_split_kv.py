"""Split-KV on the CPU: the layout's plan and split schedule, the config rules, the combine's float64 reference (fed
with float64 pieces computed here, it must reproduce the attention reference; the GPU tests hold the combine kernel
to it), and the op's checks of a split schedule."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.errors import InputError, InvalidConfigError
from blackwell_sparsek.families.attn_fwd import AttentionConfig, Schedule
from blackwell_sparsek.jit.spec import DType
from blackwell_sparsek.layout import split as split_mod
from blackwell_sparsek.ops import attention_split as asplit
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.reference import attention_reference, relative_error

L = bsk.BlockSparseLayout


def global_rows(s, heads=1, n_global=2, band=1, n_random=3, seed=0, block=128):
    """2 global rows and columns, a band and a few random blocks per row (all FULL)."""
    nb = -(-s // block)
    gen = torch.Generator().manual_seed(seed)
    r = torch.arange(nb)
    masks = []
    for _ in range(heads):
        m = (r.unsqueeze(1) - r.unsqueeze(0)).abs() <= band
        m[:n_global, :] = True
        m[:, :n_global] = True
        m[r.unsqueeze(1), torch.randint(0, nb, (nb, n_random), generator=gen)] = True
        masks.append(m)
    return L.from_block_mask(torch.stack(masks) if heads > 1 else masks[0], seq_q=s, seq_k=s, block_m=block,
                             block_n=block)


def _check_schedule(lay):
    s, k = lay.split_plan()
    ss, rp, rs = lay.split_schedule(), lay.row_ptr, lay.row_schedule()
    assert ss.dtype == torch.int32 and ss.is_contiguous() and ss.shape == (lay.num_heads, lay.n_qblocks - s + s * k, 4)
    asplit.check_split_values(rs, ss, s, k)  # raises on a bad schedule
    for h in range(ss.shape[0]):
        counts = (rp[h, 1:] - rp[h, :-1]).tolist()
        split_rows = ss[h, :s * k:k, 0].tolist()
        # the S longest rows, longest first
        assert sorted(counts, reverse=True)[:s] == [counts[r] for r in split_rows]
        for e in ss[h, :s * k].tolist():  # first = column | kind << 24 of the piece's first block
            want = (int(lay.col_idx[h, e[1]]) | int(lay.block_kind[h, e[1]]) << 24) if e[2] > e[1] else 0
            assert e[3] == want


def test_plan_splits_global_rows_only():
    lay = global_rows(32768)
    assert lay.split_plan() == (2, 13)
    _check_schedule(lay)
    per_head = global_rows(8192 + 100, heads=3, seed=1)  # partial last block row: never split
    assert per_head.split_plan() is not None
    _check_schedule(per_head)
    assert (per_head.split_schedule()[:, :, 0] != per_head.n_qblocks - 1)[:, :per_head.split_plan()[0] * 4].all()
    for lay in (L.dense(4096), L.causal(8192), L.random_topk(8192, 8, num_heads=2), L.sliding_window(8192, 1024)):
        assert lay.split_plan() is None, lay
        with pytest.raises(bsk.LayoutError, match="split_plan"):
            lay.split_schedule()


def test_plan_rules():
    assert split_mod.plan(256, 9.8, 256, 20, 2, False) == (2, 13)
    assert split_mod.plan(256, 9.8, 30, 20, 2, False) is None       # not skewed
    assert split_mod.plan(256, 2.0, 24, 16, 2, False) is None       # not two pieces long
    assert split_mod.plan(64, 9.8, 256, 20, 9, False) is None       # too many long rows
    assert split_mod.plan(1, 1.0, 64, 16, 1, True) is None          # only the partial last row


def test_config_rules_and_identity():
    base = AttentionConfig(head_dim=128, dtype=DType.BF16, schedule=Schedule.COOPERATIVE, stages=5)
    assert "split_kv" not in base.to_json()  # configs from before split_kv keep their JSON and names
    sp = dataclasses.replace(base, split_kv=True)
    assert sp.kernel_name.split("_")[-2] == "split" and sp.config_hash != base.config_hash
    assert AttentionConfig.from_json(sp.to_json()) == sp and not sp.problems()
    bad = dataclasses.replace(base, schedule=Schedule.DUAL, tile_m=64, tile_n=64, block_m=64, block_n=64,
                              split_kv=True)
    assert any("split_kv" in p for p in bad.problems())
    with pytest.raises(InvalidConfigError, match="split_kv"):
        AttentionConfig(split_kv=1)


def test_default_config_picks_split_for_skewed_layouts():
    lay = global_rows(32768)
    for d, dt in ((128, torch.bfloat16), (64, torch.float16)):
        assert default_config(d, dt, lay).split_kv
        assert not default_config(d, dt, L.random_topk(32768, 8)).split_kv
    # the split evens the rows out, so the spread no longer picks cooperative: ping-pong, whose persistent CTAs
    # claim the pieces at run time (bench/results/h200/split_kv.txt)
    assert default_config(64, torch.float16, lay).schedule is Schedule.PINGPONG
    assert default_config(128, torch.bfloat16, lay).schedule is Schedule.PINGPONG
    lay64 = global_rows(8192, block=64)
    assert lay64.split_plan() is not None and not default_config(128, torch.bfloat16, lay64).split_kv  # dual
    sp = default_config(128, torch.bfloat16, lay)
    q = torch.randn(1, 1, 4096, 128, dtype=torch.bfloat16)
    with pytest.raises(InvalidConfigError, match="split_plan"):
        bsk.sparse_attention(q, q, q, L.dense(4096), config=sp)


def _pieces_reference(q, k, v, lay, scale):
    """Each piece's (O, LSE) in float64, as the kernel writes them to the workspace: [B, H, S*K, BM, D]."""
    B, H, Sq, D = q.shape
    s, kk = lay.split_plan()
    ss, bm, bn = lay.split_schedule(), lay.block_m, lay.block_n
    ws_o = torch.zeros(B, H, s * kk, bm, D, dtype=torch.float64)
    ws_lse = torch.full((B, H, s * kk, bm), float("-inf"), dtype=torch.float64)
    for h in range(H):
        lh = 0 if lay.num_heads == 1 else h
        for e in range(s * kk):
            row, st, en, _ = ss[lh, e].tolist()
            if en == st:
                continue
            cols = lay.col_idx[lh, st:en].tolist()
            keys = torch.cat([torch.arange(c * bn, min((c + 1) * bn, Sq)) for c in cols])
            qs = q[:, h, row * bm:(row + 1) * bm].double()
            sc = qs @ k[:, h, keys].double().transpose(-1, -2) * scale
            lse = torch.logsumexp(sc, dim=-1)
            ws_o[:, h, e, :qs.shape[1]] = torch.softmax(sc, dim=-1) @ v[:, h, keys].double()
            ws_lse[:, h, e, :qs.shape[1]] = lse
    return ws_o, ws_lse


def combine_reference(o, lse, ws_o, ws_lse, split_sched, s: int, k: int, block_m: int) -> None:
    """The combine kernel's job in float64, into o and lse in place: each split row's K pieces merged,
    LSE = m + log sum exp(LSE_i - m), O = sum exp(LSE_i - LSE) O_i; pieces with LSE_i = -inf (no key) left out,
    a row without any key O = 0, LSE = -inf; a NaN LSE_i makes the row NaN."""
    B, H = o.shape[:2]
    lw = ws_lse.double().view(B, H, s, k, block_m)
    m = lw.amax(dim=3, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w = torch.exp(lw - m)
    total = w.sum(dim=3)
    row_lse = m.squeeze(3) + torch.log(total)
    seen = (lw != float("-inf")).unsqueeze(-1)
    parts = torch.where(seen, w.unsqueeze(-1) * ws_o.double().view(B, H, s, k, block_m, -1), 0.0)
    row_o = torch.where(total.unsqueeze(-1) == 0, 0.0, parts.sum(dim=3) / total.unsqueeze(-1))
    for h in range(H):
        rows = split_sched[0 if split_sched.shape[0] == 1 else h, :s * k:k, 0].tolist()
        for i, r in enumerate(rows):
            o[:, h, r * block_m:(r + 1) * block_m] = row_o[:, h, i].to(o.dtype)
            lse[:, h, r * block_m:(r + 1) * block_m] = row_lse[:, h, i].to(lse.dtype)


@pytest.mark.parametrize("heads", [1, 2])
def test_combine_of_exact_pieces_reproduces_the_reference(heads):
    lay = global_rows(5120 + 77, heads=heads, band=0, n_random=1, seed=heads)  # the reference's size limit
    s, kk = lay.split_plan()
    B, H, D = 1, 2, 16
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, lay.seq_q, D, generator=g) for _ in range(3))
    scale = D ** -0.5
    ref_o, ref_lse = attention_reference(q, k, v, lay, scale=scale)
    ws_o, ws_lse = _pieces_reference(q, k, v, lay, scale)
    o = ref_o.clone().double()
    lse = ref_lse.clone().double()
    split_rows = lay.split_schedule()[:, :s * kk:kk, 0]
    for h in range(H):  # the rows the combine must write: poisoned
        for r in split_rows[0 if lay.num_heads == 1 else h].tolist():
            assert r < lay.n_qblocks - 1  # the partial last block row is never split
            o[:, h, r * 128:(r + 1) * 128] = float("nan")
            lse[:, h, r * 128:(r + 1) * 128] = float("nan")
    combine_reference(o, lse, ws_o, ws_lse, lay.split_schedule(), s, kk, lay.block_m)
    assert relative_error(o, ref_o) < 1e-12 and relative_error(lse, ref_lse) < 1e-6  # the reference LSE: fp32


def test_combine_reference_empty_and_nan_rows():
    lay = global_rows(32768)
    s, kk = lay.split_plan()
    ws_o = torch.zeros(1, 1, s * kk, 128, 4)
    ws_lse = torch.full((1, 1, s * kk, 128), float("-inf"))
    ws_lse[0, 0, kk, 5] = float("nan")  # split row 1, row 5 of its block sees a NaN
    o = torch.full((1, 1, 32768, 4), 7.0)
    lse = torch.zeros(1, 1, 32768)
    combine_reference(o, lse, ws_o, ws_lse, lay.split_schedule(), s, kk, 128)
    r0, r1 = lay.split_schedule()[0, :s * kk:kk, 0].tolist()
    assert (o[0, 0, r0 * 128:(r0 + 1) * 128] == 0).all() and (lse[0, 0, r0 * 128:(r0 + 1) * 128] == float("-inf")).all()
    assert torch.isnan(lse[0, 0, r1 * 128 + 5]) and torch.isnan(o[0, 0, r1 * 128 + 5]).all()
    assert (o[0, 0, r1 * 128 + 6] == 0).all() and lse[0, 0, r1 * 128 + 6] == float("-inf")


def global_and_empty_rows(s: int = 5120):
    """Two heads: head 0 with 2 global rows and columns and a band; head 1 with one global row and nothing else,
    so its second split row lists no block (its pieces are all empty)."""
    nb = -(-s // 128)
    r = torch.arange(nb)
    m = torch.zeros(2, nb, nb, dtype=torch.bool)
    m[0] = (r.unsqueeze(1) - r.unsqueeze(0)).abs() <= 1
    m[0, :2, :] = True
    m[0, :, :2] = True
    m[1, 0, :] = True
    return L.from_block_mask(m, seq_q=s, seq_k=s)


def test_layout_with_an_empty_split_row():
    lay = global_and_empty_rows()
    s, kk = lay.split_plan()
    assert s == 2
    ss, counts = lay.split_schedule(), lay.row_ptr[:, 1:] - lay.row_ptr[:, :-1]
    assert counts[1, ss[1, kk, 0]] == 0 and (ss[1, kk:2 * kk, 1] == ss[1, kk:2 * kk, 2]).all()  # all pieces empty


def test_op_rejects_bad_split_arguments():
    lay = global_rows(8192)
    s, kk = lay.split_plan()
    q = torch.randn(1, 1, 8192, 64, dtype=torch.float16)
    cfg = default_config(64, torch.float16, lay)
    args = (q, q, q, lay.col_idx, lay.block_kind, lay.row_schedule())
    meta = [-1, -1, lay.n_kblocks, 1, -1]
    bad = lay.split_schedule().clone()
    bad[0, [0, 1]] = bad[0, [1, 0]]  # two pieces swapped
    with pytest.raises(InputError, match="not a split of row_sched"):
        asplit.attn_fwd_split(*args, bad, meta, [s, kk], 0.125, cfg.to_json())
    with pytest.raises(InputError, match="split_sched"):
        asplit.attn_fwd_split(*args, lay.split_schedule()[:, 1:].contiguous(), meta, [s, kk], 0.125, cfg.to_json())
    with pytest.raises(InputError, match=r"\[S, K\]"):
        asplit.attn_fwd_split(*args, lay.split_schedule(), meta, [s], 0.125, cfg.to_json())
    plain = dataclasses.replace(cfg, split_kv=False)
    with pytest.raises(InvalidConfigError, match="split_kv"):
        asplit.attn_fwd_split(*args, lay.split_schedule(), meta, [s, kk], 0.125, plain.to_json())
    with pytest.raises(InputError, match="CUDA"):  # a good call on CPU tensors: everything checked, then refused
        asplit.attn_fwd_split(*args, lay.split_schedule(), meta, [s, kk], 0.125, cfg.to_json())


@pytest.mark.parametrize("split", [False, True])
def test_split_decision_traces_under_dynamo(split):
    """sparse_attention asks dispatch.is_split(config_json) inside the compiled region; the JSON parse must be a
    trace-time constant (it broke fullgraph compilation of every CUDA call once)."""
    from blackwell_sparsek.ops import dispatch
    cfg = dispatch.default_config(128, torch.bfloat16, global_rows(5120, band=0, n_random=1, seed=3))
    assert cfg.split_kv
    text = (cfg if split else dataclasses.replace(cfg, split_kv=False)).to_json()
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2 if dispatch.is_split(text) else x * 3, fullgraph=True, backend="eager")
    assert f(torch.ones(2)).tolist() == ([2.0, 2.0] if split else [3.0, 3.0])
