"""GPU tests of the attention forward: every named config against a float64 dense-masked reference.

Skipped without CUDA. Fresh random inputs per check, outputs poisoned with NaN before each launch (BSK_POISON),
relative error ‖out − ref‖/‖ref‖ ≤ 1e-2, LSE checked too, empty rows must give O = 0 and LSE = -inf.
"""
from __future__ import annotations

import math

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention as ops
from blackwell_sparsek.ops import dispatch
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.families.attn_fwd import AttentionConfig, Schedule
from blackwell_sparsek.jit.spec import load_named_configs
from blackwell_sparsek.errors import InputError, LayoutError, InvalidConfigError
from blackwell_sparsek.reference import attention_reference, relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)")]

L = bsk.BlockSparseLayout
TOL = 1e-2
_TORCH = {"FP16": torch.float16, "BF16": torch.bfloat16}
_SEED = [1234]



def _rand(*shape, dtype):
    _SEED[0] += 1
    g = torch.Generator(device="cuda").manual_seed(_SEED[0])
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


def _qkv(B, H, Sq, Sk, D, dtype, Hkv=None, bshd=False):
    Hkv = Hkv or H
    if bshd:  # (B, S, H, D) storage, passed as (B, H, S, D) views
        return (_rand(B, Sq, H, D, dtype=dtype).transpose(1, 2), _rand(B, Sk, Hkv, D, dtype=dtype).transpose(1, 2),
                _rand(B, Sk, Hkv, D, dtype=dtype).transpose(1, 2))
    return _rand(B, H, Sq, D, dtype=dtype), _rand(B, Hkv, Sk, D, dtype=dtype), _rand(B, Hkv, Sk, D, dtype=dtype)


def _check(q, k, v, layout, config=None, causal=False):
    o, lse = bsk.sparse_attention(q, k, v, layout, causal=causal, config=config, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_reference(q, k, v, layout, causal=causal)
    assert o.shape == q.shape and o.stride() == q.stride(), "O must come back in q's layout"
    assert torch.isfinite(o).all(), "NaN/inf in O: unwritten or poisoned elements"
    err = relative_error(o, ref_o)
    assert err <= TOL, f"relative error {err:.3e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "LSE must be -inf exactly on empty rows"
    if empty.any():
        assert (o.float()[empty] == 0).all(), "empty rows must give O = 0"
    fin = ~empty
    if fin.any():
        lerr = (lse[fin].double() - ref_lse[fin].double()).abs().max().item()
        assert lerr < 2e-2, f"LSE error {lerr:.3e}"
    return err


NAMED = {n: c for n, c in load_named_configs().items() if isinstance(c, AttentionConfig)}


def _patterns(Sq, Sk, H, bm, bn):
    nq, nk = -(-Sq // bm), -(-Sk // bn)
    g = torch.Generator().manual_seed(7)
    holes = torch.rand(nq, nk, generator=g) < 0.5
    holes[1] = False  # an empty row
    return {
        "dense": (L.dense(seq_q=Sq, seq_k=Sk, block_m=bm, block_n=bn), False),
        "causal": (L.dense(seq_q=Sq, seq_k=Sk, block_m=bm, block_n=bn), True),
        "window": (L.sliding_window(seq_q=Sq, seq_k=Sk, window=300, block_m=bm, block_n=bn), False),
        "topk": (L.random_topk(seq_q=Sq, seq_k=Sk, k=2, seed=3, block_m=bm, block_n=bn), False),
        "topk_per_head": (L.random_topk(seq_q=Sq, seq_k=Sk, k=2, seed=4, num_heads=H, block_m=bm, block_n=bn),
                          False),
        "empty_rows": (L.from_block_mask(holes, seq_q=Sq, seq_k=Sk, block_m=bm, block_n=bn), False),
    }


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("pattern", ["dense", "causal", "window", "topk", "topk_per_head", "empty_rows"])
@pytest.mark.parametrize("lengths", [(640, 640), (517, 1000)])
def test_named_configs(name, pattern, lengths):
    cfg = NAMED[name]
    Sq, Sk = lengths
    H = 3
    layout, causal = _patterns(Sq, Sk, H, cfg.block_m, cfg.block_n)[pattern]
    q, k, v = _qkv(2, H, Sq, Sk, cfg.head_dim, _TORCH[cfg.dtype.name])
    _check(q, k, v, layout, config=cfg, causal=causal)


@pytest.mark.parametrize("name", sorted(n for n, c in NAMED.items() if c.schedule in (Schedule.PINGPONG,
                                                                                      Schedule.DUAL)))
@pytest.mark.parametrize("pattern", ["dense", "causal", "window", "topk_per_head", "empty_rows"])
def test_persistent_ctas_walk_many_rows(name, pattern, monkeypatch):
    # Ping-pong CTAs are persistent: each walks its query tiles in turn (the K/V ring and the Q slots carry over
    # from row to row, the epilogue's O buffer is reused once its store has read it, at D=64 the two warpgroups'
    # softmax turns pair up row after row; dual CTAs: each warpgroup's own stream of rows). With 3 CTAs every CTA
    # walks ~10 rows of every kind one after another: full, partial, one tile, empty (at one CTA per SM most small
    # problems give a CTA one row). At D=128 (and in the D=64 claims config) ping-pong CTAs claim their tiles from a
    # counter (claims_tiles): a tile run twice or never leaves a poisoned or wrong row, and the output must not
    # depend on which CTA ran what.
    monkeypatch.setattr(dispatch, "sm_count", lambda index: 3)
    cfg = NAMED[name]
    Sq, Sk = 517, 1000
    layout, causal = _patterns(Sq, Sk, 3, cfg.block_m, cfg.block_n)[pattern]
    q, k, v = _qkv(2, 3, Sq, Sk, cfg.head_dim, _TORCH[cfg.dtype.name])
    _check(q, k, v, layout, config=cfg, causal=causal)
    if cfg.claims_tiles:
        o1 = bsk.sparse_attention(q, k, v, layout, causal=causal, config=cfg)
        o2 = bsk.sparse_attention(q, k, v, layout, causal=causal, config=cfg)
        assert torch.equal(o1, o2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["dense", "causal", "window", "topk_per_head", "empty_rows"])
@pytest.mark.parametrize("ctas", [None, 3])
def test_dual_three_streams(dtype, pattern, ctas, monkeypatch):
    # 64x64 blocks at head_dim 64 run three 64-row streams per CTA by default: each MMA warpgroup its own rows,
    # K/V ring, O buffer and epilogue barrier. With 3 CTAs each stream walks ~5 rows of every kind; with all SMs
    # most get one.
    if ctas:
        monkeypatch.setattr(dispatch, "sm_count", lambda index: ctas)
    Sq, Sk = 517, 1000
    layout, causal = _patterns(Sq, Sk, 3, 64, 64)[pattern]
    cfg = default_config(64, dtype, layout)
    assert (cfg.schedule, cfg.streams) == (Schedule.DUAL, 3)
    q, k, v = _qkv(2, 3, Sq, Sk, 64, dtype)
    _check(q, k, v, layout, config=cfg, causal=causal)


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("growth", ["mild", "ramp", "step"])
def test_running_max_grows_across_tiles(name, growth):
    # Later key blocks score far above the first ones, so a row's running max keeps growing: the softmax steps that
    # keep a stale max (lazy rescale, exp2 before the max) must notice and rescale. "mild": one jump of ~11 in
    # log2 units (near the threshold); "ramp": ~25 per tile; "step": ~200 at the second block, which overflows
    # exp2 against the first block's max.
    cfg = NAMED[name]
    Sq, Sk = 517, 1000
    q, k, v = _qkv(1, 2, Sq, Sk, cfg.head_dim, _TORCH[cfg.dtype.name])
    pos = torch.arange(Sk, device="cuda", dtype=torch.float32)
    later = (pos >= cfg.block_n).float()
    gain = {"mild": 1 + 3 * later, "ramp": 60 ** (pos / Sk), "step": 1 + 59 * later}[growth]
    k = (k.float() * gain[:, None]).to(k.dtype)
    for layout in (L.dense(seq_q=Sq, seq_k=Sk, block_m=cfg.block_m, block_n=cfg.block_n),
                   L.random_topk(seq_q=Sq, seq_k=Sk, k=2, seed=4, num_heads=2, block_m=cfg.block_m,
                                 block_n=cfg.block_n)):
        _check(q, k, v, layout, config=cfg)


@pytest.mark.parametrize("schedule", [Schedule.COOPERATIVE, Schedule.PINGPONG, Schedule.SINGLE, Schedule.DUAL])
def test_gqa_bshd_and_causal_rectangular(schedule):
    # GQA (8 query heads over 2 K/V heads), (B, S, H, D) storage, causal with seq_q < seq_k and seq_q > seq_k.
    bm = 64 if schedule is Schedule.DUAL else 128
    for Sq, Sk in ((300, 777), (900, 400)):
        q, k, v = _qkv(2, 8, Sq, Sk, 128, torch.bfloat16, Hkv=2, bshd=True)
        lay = L.dense(seq_q=Sq, seq_k=Sk, block_m=bm, block_n=bm)
        _check(q, k, v, lay, config=default_config(128, torch.bfloat16, lay, schedule=schedule), causal=True)


@pytest.mark.parametrize("schedule", [Schedule.COOPERATIVE, Schedule.PINGPONG])
def test_heaviest_first_order_in_head_groups(schedule):
    # Rows of unequal length run heaviest first across a group of (batch, head)s whose K/V fits in half of L2,
    # group after group (the launcher's head_group): here 4 x 4 heads of 2 MB K/V each, so a group holds fewer
    # than all 16 (the check below), shared causal rows and per-head rows with holes.
    B, H, S, D = 4, 4, 4096, 128
    kv = 2 * S * D * 2
    fit = torch.cuda.get_device_properties(0).L2_cache_size // 2 // kv
    group = max(g for g in range(1, B * H + 1) if (B * H) % g == 0 and g <= max(fit, 1))
    assert 1 < group < B * H, f"shape does not split the heads into groups on this GPU (group {group})"
    nq = S // 128
    g = torch.Generator().manual_seed(11)
    holes = torch.rand(H, nq, nq, generator=g) < torch.linspace(0.0, 0.9, nq)[:, None]  # later rows emptier
    q, k, v = _qkv(B, H, S, S, D, torch.float16)
    for lay, causal in ((L.dense(seq_q=S), True), (L.from_block_mask(~holes, seq_q=S, seq_k=S), False)):
        assert not lay.uniform_rows() or causal
        _check(q, k, v, lay, config=default_config(D, torch.float16, lay, schedule=schedule), causal=causal)


@pytest.mark.parametrize("block", [(128, 64), (256, 128), (128, 256), (64, 128), (64, 64)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_other_block_sizes(block, head_dim):
    # tile_n 64 under 64-wide blocks; two 128-row tiles per 256-row block; two 128-key tiles per 256-key block;
    # 64-row blocks run the dual kernel by default; the single-warpgroup kernel is checked on them too.
    bm, bn = block
    for lay, causal in ((L.random_topk(seq_q=777, seq_k=1300, k=3, seed=5, num_heads=2, block_m=bm, block_n=bn),
                         False),
                        (L.dense(seq_q=777, seq_k=1300, block_m=bm, block_n=bn), True)):
        q, k, v = _qkv(1, 2, 777, 1300, head_dim, torch.float16)
        _check(q, k, v, lay, causal=causal)
        if bm == 64:
            assert default_config(head_dim, torch.float16, lay).schedule is Schedule.DUAL
            single = default_config(head_dim, torch.float16, lay, schedule=Schedule.SINGLE)
            _check(q, k, v, lay, config=single, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_dim_256(dtype):
    # D=256 runs with 128x64 tiles (accumulators must fit in registers); no named config, derived by default_config.
    for lay, causal in ((L.dense(seq_q=700, seq_k=900), False), (L.dense(seq_q=700, seq_k=900), True),
                        (L.random_topk(seq_q=700, seq_k=900, k=3, seed=9, num_heads=2), False)):
        q, k, v = _qkv(1, 2, 700, 900, 256, dtype)
        _check(q, k, v, lay, causal=causal)


def test_mqa_per_head_layout_default_config():
    q, k, v = _qkv(1, 4, 1024, 1024, 64, torch.float16, Hkv=1)
    lay = L.random_topk(seq_q=1024, k=3, seed=11, num_heads=4)
    _check(q, k, v, lay)


def test_custom_scale_and_fresh_inputs_change_output():
    q, k, v = _qkv(1, 2, 256, 256, 128, torch.float16)
    lay = L.dense(seq_q=256)
    o1 = bsk.sparse_attention(q, k, v, lay, scale=0.3)
    ref, _ = attention_reference(q, k, v, lay, scale=0.3)
    assert relative_error(o1, ref) <= TOL
    o2 = bsk.sparse_attention(q, k, _rand(*v.shape, dtype=v.dtype), lay, scale=0.3)
    assert relative_error(o1, o2) > 0.1  # the kernel really reads its inputs


def test_stream_is_torch_current_stream():
    q, k, v = _qkv(1, 2, 512, 512, 128, torch.float16)
    lay = L.dense(seq_q=512)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        o = bsk.sparse_attention(q, k, v, lay)
    s.synchronize()
    ref, _ = attention_reference(q, k, v, lay)
    assert relative_error(o, ref) <= TOL


def test_eager_call_skips_the_dispatcher_with_the_same_result():
    # Plain eager calls run the op's implementation directly; under a TorchDispatchMode (or with autograd inputs)
    # they go through torch.ops.blackwell_sparsek.attn_fwd. Same kernel, same inputs: the same bits.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = _qkv(1, 2, 640, 640, 128, torch.float16)
    lay = L.random_topk(seq_q=640, k=2, seed=5).to("cuda")
    o = bsk.sparse_attention(q, k, v, lay)
    cfg_json, dlay = ops._eager_plan(lay, None, 128, torch.float16, q.device)  # the call's (cached) config choice
    o_op, _ = torch.ops.blackwell_sparsek.attn_fwd(q, k, v, dlay.col_idx, dlay.block_kind, dlay.row_schedule(),
                                                   ops._meta(dlay), 1 / math.sqrt(128), cfg_json)
    with Log() as log:
        o_mode = bsk.sparse_attention(q, k, v, lay)
    assert "blackwell_sparsek.attn_fwd.default" in log.ops
    assert torch.equal(o, o_op) and torch.equal(o, o_mode)
    assert relative_error(o, attention_reference(q, k, v, lay)[0]) <= TOL


def test_bad_inputs_raise_typed_errors():
    q, k, v = _qkv(1, 2, 256, 256, 128, torch.float16)
    lay = L.dense(seq_q=256)
    with pytest.raises(InputError, match="dtype"):
        bsk.sparse_attention(q.float(), k.float(), v.float(), lay)
    with pytest.raises(InputError, match="contiguous"):
        bsk.sparse_attention(q.transpose(2, 3), k, v, lay)
    with pytest.raises(InputError, match="heads"):
        bsk.sparse_attention(q, k[:, :1].expand(1, 3, 256, 128).contiguous(), v[:, :1].expand(1, 3, 256, 128)
                             .contiguous(), lay)
    with pytest.raises(LayoutError):
        bsk.sparse_attention(q, k, v, L.dense(seq_q=512))
    with pytest.raises(InvalidConfigError):
        bsk.sparse_attention(q, k, v, lay, config=NAMED[next(n for n in NAMED if "d64" in n)])


def test_opcheck_and_torch_compile():
    q, k, v = _qkv(1, 2, 384, 384, 128, torch.float16)
    lay = L.sliding_window(seq_q=384, window=200).to("cuda")
    cfg = default_config(128, torch.float16, lay)
    args = (q, k, v, lay.col_idx, lay.block_kind, lay.row_schedule(), ops._meta(lay), 1.0 / math.sqrt(128),
            cfg.to_json())
    torch.library.opcheck(torch.ops.blackwell_sparsek.attn_fwd.default, args)

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return bsk.sparse_attention(q, k, v, lay) * 2

    out = f(q, k, v)
    ref, _ = attention_reference(q, k, v, lay)
    assert relative_error(out, 2 * ref) <= TOL

    dense = L.dense(seq_q=384).to("cuda")
    dense.with_causal()  # prepared eagerly (cached), as the compile path requires

    @torch.compile(fullgraph=True)
    def g(q, k, v):
        o, lse = bsk.sparse_attention(q, k, v, dense, causal=True, return_lse=True)
        return o.float().sum(-1), lse

    s, lse = g(q, k, v)
    ref, ref_lse = attention_reference(q, k, v, dense, causal=True)
    assert relative_error(s, ref.sum(-1)) <= TOL
    assert torch.allclose(lse, ref_lse.float(), atol=2e-2)
