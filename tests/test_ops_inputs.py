"""CPU tests of sparse_attention's argument checks (issue 24): every bad argument gets a typed error naming the fix,
before any kernel is chosen or built, so the CPU fallback accepts exactly what the GPU path accepts; the fallback
returns O in q's memory layout and refuses sizes it cannot hold; torch.compile on CPU tensors takes the fallback;
precompile and default_config check their arguments.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention as ops
from blackwell_sparsek.families.attn_fwd import Schedule
from blackwell_sparsek.jit.spec import DType
from blackwell_sparsek.errors import InputError, InvalidConfigError, LayoutError
from blackwell_sparsek.reference import attention_reference, relative_error

L = bsk.BlockSparseLayout


@pytest.fixture(autouse=True)
def _quiet_fallback():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="blackwell_sparsek: the inputs are not on a CUDA device")
        yield


def _qkv(B=1, H=2, Sq=256, Sk=256, D=64, dtype=torch.float16, Hkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv = Hkv or H
    return (torch.randn(B, H, Sq, D, generator=g).to(dtype), torch.randn(B, Hkv, Sk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Sk, D, generator=g).to(dtype))


# -- item 3, 7: head dims and empty inputs --------------------------------------------------------------------

@pytest.mark.parametrize("D", [8, 96, 100, 192])
def test_unsupported_head_dim_says_how_to_pad(D, fake_nvcc):
    pad = next(d for d in (64, 128, 256) if d > D)
    want = rf"head_dim {D} is not supported.*64, 128 and 256.*pad\(t, \(0, {pad - D}\)\).*scale=1/math.sqrt\({D}\)"
    with pytest.raises(InputError, match=want):
        ops.default_config(D, torch.float16)
    with pytest.raises(InputError, match=want):
        bsk.precompile(head_dim=D, dtype=torch.float16)
    q, k, v = _qkv(Sq=128, Sk=128, D=D)
    with pytest.raises(InputError, match=want):
        bsk.sparse_attention(q, k, v, L.dense(128))
    assert fake_nvcc.count() == 0, "nothing may be compiled for an unsupported head_dim"


@pytest.mark.parametrize("D", [512, 0, -1])
def test_head_dim_out_of_range(D):
    with pytest.raises(InputError, match=f"head_dim {D}"):
        ops.default_config(D, torch.float16)


def test_head_dim_zero_and_empty_heads_are_typed_errors():
    lay = L.dense(128)
    q, k, v = (torch.zeros(1, 2, 128, 0, dtype=torch.float16) for _ in range(3))
    with pytest.raises(InputError, match="head_dim 0"):
        bsk.sparse_attention(q, k, v, lay)
    q, k, v = (torch.zeros(1, 0, 128, 64, dtype=torch.float16) for _ in range(3))
    with pytest.raises(InputError, match="empty input"):
        bsk.sparse_attention(q, k, v, lay)
    q, _, _ = _qkv(Sq=128, Sk=128)
    k = v = torch.zeros(1, 0, 128, 64, dtype=torch.float16)
    with pytest.raises(InputError, match="empty input"):
        bsk.sparse_attention(q, k, v, lay)


# -- item 4: the CPU path validates like the GPU path; O in q's layout ----------------------------------------

def test_cpu_fallback_refuses_what_the_gpu_refuses(fake_nvcc):
    q, k, v = _qkv(Sq=256, Sk=256, D=64)
    lay = L.dense(256)
    d64_fp16 = next(c for c in bsk.load_named_configs().values()
                    if c.family == "attn_fwd" and c.head_dim == 64 and c.dtype is DType.FP16)
    with pytest.raises(InvalidConfigError, match="no named config"):
        bsk.sparse_attention(q, k, v, lay, config="bsk_sm90a_attn_fwd_d64_fp16_t128x128_cop_s8_b128x128")
    with pytest.raises(InvalidConfigError, match="not int"):
        bsk.sparse_attention(q, k, v, lay, config=5)
    with pytest.raises(InvalidConfigError, match="dtype=fp16"):
        bsk.sparse_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), lay, config=d64_fp16)
    for block in ((100, 100), (16, 16)):
        odd = L.dense(256, block_m=block[0], block_n=block[1])
        with pytest.raises(InvalidConfigError, match=f"{block[0]}x{block[1]} layout blocks"):
            bsk.sparse_attention(q, k, v, odd)
    assert fake_nvcc.count() == 0  # the CPU path checks configs without building them


def test_cpu_fallback_returns_o_in_q_memory_layout():
    B, S, H, D = 2, 300, 4, 64
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, S, H, D, generator=g).half().transpose(1, 2)   # (B, S, H, D) storage
    k = torch.randn(B, S, 2, D, generator=g).half().transpose(1, 2)
    v = torch.randn(B, S, 2, D, generator=g).half().transpose(1, 2)
    lay = L.random_topk(seq_q=S, k=2, seed=1)
    o, lse = bsk.sparse_attention(q, k, v, lay, return_lse=True)
    assert o.stride() == q.stride() == torch.empty_like(q).stride() and o.dtype == q.dtype
    ref, ref_lse = attention_reference(q, k, v, lay)
    assert relative_error(o, ref) < 2e-3
    assert torch.equal(lse, ref_lse)


# -- item 5: torch.compile with CPU tensors takes the fallback ------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_on_cpu_runs_the_reference(backend, fake_nvcc):
    torch._dynamo.reset()
    q, k, v = _qkv(B=2, H=4, Sq=300, Sk=500, D=64, Hkv=2)
    lay = L.random_topk(seq_q=300, seq_k=500, k=2, seed=1)
    lay.with_causal()  # prepared eagerly, as compiled causal calls require

    @torch.compile(fullgraph=True, backend=backend)
    def f(q, k, v):
        o, lse = bsk.sparse_attention(q, k, v, lay, causal=True, return_lse=True)
        return o * 2, lse

    for seed in (1, 2):
        q, k, v = _qkv(B=2, H=4, Sq=300, Sk=500, D=64, Hkv=2, seed=seed)
        o, lse = f(q, k, v)
        ref, ref_lse = attention_reference(q, k, v, lay, causal=True)
        assert relative_error(o, 2 * ref) < 2e-3
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    assert fake_nvcc.count() == 0
    assert "row_schedule" not in lay._cache and "row_schedule" not in lay.with_causal()._cache


def test_reference_op_passes_opcheck():
    q, k, v = _qkv(B=1, H=2, Sq=300, Sk=500, D=64)
    lay = L.sliding_window(seq_q=300, seq_k=500, window=100)
    args = (q, k, v, lay.row_ptr, lay.col_idx, lay.block_kind,
            [lay.block_m, lay.block_n, lay.window_left, lay.window_right], 0.125)
    torch.library.opcheck(torch.ops.blackwell_sparsek.attn_fwd_reference.default, args)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_on_cpu_differentiates_like_eager(backend, fake_nvcc):
    """Under torch.compile the CPU fallback is an op (attn_fwd_reference) with a registered backward: the same
    gradients as the eager fallback (the float64 reference's autograd), LSE gradient included."""
    torch._dynamo.reset()
    lay = L.sliding_window(seq_q=300, seq_k=500, window=120)
    lay.with_causal()
    q, k, v = _qkv(B=2, H=4, Sq=300, Sk=500, D=64, Hkv=2, seed=3)
    do = torch.randn(2, 4, 300, 64).to(torch.float16)

    def loss(q, k, v):
        o, lse = bsk.sparse_attention(q, k, v, lay, causal=True, return_lse=True)
        return (o.float() * do.float()).sum() + torch.where(torch.isinf(lse), 0.0, lse).sum() * 0.01

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend=backend)):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        fn(qg, kg, vg).backward()
        grads.append((qg.grad, kg.grad, vg.grad))
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        assert torch.isfinite(a).all() and relative_error(b, a) < 1e-3, name
    assert fake_nvcc.count() == 0


def test_reference_backward_op_passes_opcheck():
    q, k, v = _qkv(B=1, H=2, Sq=200, Sk=300, D=64)
    lay = L.random_topk(seq_q=200, seq_k=300, k=2, seed=4)
    do, glse = torch.randn(1, 2, 200, 64).to(torch.float16), torch.randn(1, 2, 200)
    args = (q, k, v, do, glse, lay.row_ptr, lay.col_idx, lay.block_kind,
            [lay.block_m, lay.block_n, lay.window_left, lay.window_right], 0.125)
    torch.library.opcheck(torch.ops.blackwell_sparsek.attn_bwd_reference.default, args)


# -- items 15, 16: the layout, scale and causal arguments -----------------------------------------------------

def test_layout_argument_of_the_wrong_kind():
    q, k, v = _qkv(Sq=256, Sk=256)
    lay = L.dense(256)
    cases = [(None, "BlockSparseLayout constructor"), ("dense", "BlockSparseLayout constructor"),
             (torch.ones(2, 2, dtype=torch.bool), "from_block_mask"),
             (lay.to_flex_block_mask(), "from_flex_block_mask")]
    if not isinstance(lay.transpose(), L):  # a CSC view (where transpose() does not return a layout)
        cases.append((lay.transpose(), r"CSC\) view"))
    for bad, hint in cases:
        with pytest.raises(LayoutError, match=f"must be a BlockSparseLayout, got .*{hint}"):
            bsk.sparse_attention(q, k, v, bad)


def test_scale_and_causal_must_be_numbers_and_bools():
    q, k, v = _qkv(Sq=128, Sk=128)
    lay = L.dense(128)
    for bad in (1e39, -1e39, float("inf"), float("nan")):
        with pytest.raises(InputError, match="finite float32"):
            bsk.sparse_attention(q, k, v, lay, scale=bad)
    for bad in (True, "0.1", torch.tensor(0.1), 1j):
        with pytest.raises(InputError, match="scale must be a real number"):
            bsk.sparse_attention(q, k, v, lay, scale=bad)
    for bad in ("no", 1, None, torch.tensor(True)):
        with pytest.raises(InputError, match="causal must be True or False"):
            bsk.sparse_attention(q, k, v, lay, causal=bad)
    np = pytest.importorskip("numpy")
    o = bsk.sparse_attention(q, k, v, lay, scale=np.float32(0.3), causal=np.bool_(True))
    assert relative_error(o, attention_reference(q, k, v, lay, causal=True, scale=0.3)[0]) < 2e-3
    assert relative_error(bsk.sparse_attention(q, k, v, lay, scale=1), attention_reference(q, k, v, lay,
                                                                                         scale=1.0)[0]) < 2e-3


# -- item 17: the fallback checks its size before it allocates ------------------------------------------------

def _huge(B, H, S, D=64):
    return torch.zeros(1, 1, 1, D, dtype=torch.float16).expand(B, H, S, D)  # no memory behind it


def test_fallback_refuses_big_inputs_before_allocating(monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("the reference ran: the size check must come first")
    monkeypatch.setattr("blackwell_sparsek.reference.attention_reference", boom)
    lay = L.dense(8192)
    q = _huge(2, 16, 8192)
    with pytest.raises(InputError, match=r"about 32\.\d GiB.*CUDA GPU.*nvcc.*smaller inputs") as ei:
        bsk.sparse_attention(q, q, q, lay)
    assert "to_element_mask" not in str(ei.value)
    # under the byte limit but over the element-mask limit: the same error, not to_element_mask's
    lay = L.dense(9000, block_m=128, block_n=128)
    q = _huge(1, 1, 9000)
    with pytest.raises(InputError, match="element mask") as ei:
        bsk.sparse_attention(q, q, q, lay)
    assert "to_element_mask" not in str(ei.value)


# -- item 27: tensors past 2^31 elements launch; what TMA and the 32-bit sizes cannot take is refused -----------

def test_launch_limits_are_the_launchers():
    from blackwell_sparsek.ops._checks import check_launch_limits
    for h in (16, 32):  # (1, h, 1M, 128) bf16: 2^31 and 2^32 elements, now within the launcher's range
        big = torch.empty(1, h, 1 << 20, 128, dtype=torch.bfloat16, device="meta")  # strides without memory
        check_launch_limits(big, big, big)
    # a view whose batch stride is 2^40 bytes (the heads of a huge buffer), though it holds little itself
    wide = torch.empty_strided((2, 1, 1024, 128), (1 << 39, 1024 * 128, 128, 1), dtype=torch.bfloat16,
                               device="meta")
    with pytest.raises(InputError, match=r"q has stride .* batch dim.*2\^40 bytes"):
        check_launch_limits(wide, wide, wide)
    tall = torch.empty(1, 1 << 12, 1 << 19, 64, dtype=torch.bfloat16, device="meta")  # H * Sq = 2^31
    with pytest.raises(InputError, match="32-bit int"):
        check_launch_limits(tall, tall, tall)
    lay = L.sliding_window(1 << 19, window=2048)
    with pytest.raises(InputError, match="32-bit int"):
        bsk.sparse_attention(tall, tall, tall, lay)


def test_backward_limits_are_checked_before_the_forward():
    """The backward keeps 32-bit strides: inputs that need gradients past them are refused before the forward
    runs (and by the backward op itself), with the split that fixes it; the forward alone still takes them."""
    import blackwell_sparsek.ops.attention_bwd as ab
    from blackwell_sparsek.ops._checks import check_backward_limits
    lay = L.sliding_window(1 << 20, window=2048)
    ok = torch.empty(1, 8, 1 << 20, 128, dtype=torch.bfloat16, device="meta")    # H*Sq*D = 2^30
    check_backward_limits(ok, ok, ok)
    big = torch.empty(1, 16, 1 << 20, 128, dtype=torch.bfloat16, device="meta")  # H*Sq*D = 2^31
    with pytest.raises(InputError, match=r"backward takes its strides as 32-bit ints and H\*Sq\*D .*torch.split"):
        check_backward_limits(big, big, big)
    with pytest.raises(InputError, match="backward takes its strides"):
        bsk.sparse_attention(big.clone().requires_grad_(), big, big, lay)
    with pytest.raises(InputError, match="float64 reference fallback"):  # no gradient needed: not the backward's
        bsk.sparse_attention(big, big, big, lay)
    with torch.no_grad():
        with pytest.raises(InputError, match="float64 reference fallback"):
            bsk.sparse_attention(big.clone().requires_grad_(), big, big, lay)
    gqa_k = torch.empty(1, 1, 1 << 23, 128, dtype=torch.bfloat16, device="meta")  # dK/dV per query head: H*Sk*D
    q = torch.empty(1, 2, 1024, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(InputError, match=r"H\*Sk\*D"):
        check_backward_limits(q, gqa_k, gqa_k)
    fwd = ops.default_config(128, torch.bfloat16)
    t = torch.zeros(1, dtype=torch.bfloat16).expand(1, 16, 1 << 20, 128)  # the raw op on CPU (no memory)
    lse = torch.zeros(1).expand(1, 16, 1 << 20)
    with pytest.raises(InputError, match="backward takes its strides"):
        ab.attn_bwd(t, t, t, t, lse, t, None, lay.col_idx, lay.block_kind, lay.row_schedule(),
                    [2048, 0, lay.n_kblocks, 0], 0.1, ab.bwd_config_json(fwd.to_json()))


# -- item 14: precompile's and default_config's dtype, precompile's other arguments ---------------------------

def test_precompile_dtype_and_arguments(fake_nvcc):
    for bad in (torch.float32, "float32", "fp8", 16):
        with pytest.raises(InputError, match="torch.float16 or torch.bfloat16.*'fp16', 'bf16'"):
            bsk.precompile(head_dim=128, dtype=bad)
        with pytest.raises(InputError, match="torch.float16 or torch.bfloat16"):
            ops.default_config(128, bad)
    assert fake_nvcc.count() == 0
    (a,) = bsk.precompile(head_dim=128, dtype="bf16")
    assert a.config == ops.default_config(128, torch.bfloat16)
    assert ops.default_config(64, "fp16") == ops.default_config(64, torch.float16) == ops.default_config(64, DType.FP16)
    with pytest.raises(InvalidConfigError, match="precompile takes configs"):
        bsk.precompile(5)
    with pytest.raises(InvalidConfigError, match="head_dim= and dtype="):
        bsk.precompile(layout=L.dense(256))
    with pytest.raises(LayoutError, match="must be a BlockSparseLayout"):
        bsk.precompile(head_dim=64, dtype="fp16", layout="dense")
    (b,) = bsk.precompile({"head_dim": 64, "schedule": "single", "tile_m": 64, "block_m": 64})
    assert b.config.schedule is Schedule.SINGLE
    assert ops.default_config(64, "fp16", schedule="pingpong").schedule is Schedule.PINGPONG
    with pytest.raises(InvalidConfigError, match="schedule must be one of"):
        ops.default_config(64, "fp16", schedule="fast")


def test_default_scale_is_one_over_sqrt_head_dim():
    q, k, v = _qkv(Sq=128, Sk=128, D=128)
    lay = L.dense(128)
    o = bsk.sparse_attention(q, k, v, lay)
    assert relative_error(o, attention_reference(q, k, v, lay, scale=1 / math.sqrt(128))[0]) < 2e-3


# -- the backward's API on the CPU fallback: the reference's autograd, the same arguments ------------------------

def test_cpu_fallback_is_differentiable_and_deterministic_is_a_bool():
    import warnings
    from blackwell_sparsek.reference import attention_reference, relative_error
    lay = L.random_topk(200, 1, seed=3)
    q, k, v = (torch.randn(1, 2, 200, 64, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(InputError, match="dtype"):
            bsk.sparse_attention(q, k, v, lay)  # float64 is refused on every path
        qh, kh, vh = (t.detach().half().requires_grad_() for t in (q, k, v))
        o = bsk.sparse_attention(qh, kh, vh, lay, deterministic=True)
        with pytest.raises(InputError, match="deterministic must be True or False"):
            bsk.sparse_attention(qh, kh, vh, lay, deterministic="yes")
    g = torch.randn_like(o)
    o.backward(g)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (qh, kh, vh))
    ref_o, _ = attention_reference(qd, kd, vd, lay)
    ref_o.backward(g.double())
    for got, want in ((qh.grad, qd.grad), (kh.grad, kd.grad), (vh.grad, vd.grad)):
        assert relative_error(got, want) <= 1e-2
