"""Attention backward without a GPU: the attn_bwd family (config rules, names, rendering, ABI), the op's dense
formulas against the reference's autograd, the autograd wiring of attn_fwd, the GQA launch, bad inputs, and one
real nvcc compile (``-k real_compile``). The transposed view and the deterministic turns: test_attn_bwd_view.py."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from blackwell_sparsek import InputError, InvalidConfigError
from blackwell_sparsek.ops import attention_bwd as ab
from blackwell_sparsek.errors import ToolchainError
from blackwell_sparsek.families import attn_bwd as fam
from blackwell_sparsek.families.attn_bwd import AttnBwdConfig
from blackwell_sparsek.families.attn_fwd import AttentionConfig
from blackwell_sparsek.jit import compiler, kernels, runtime
from blackwell_sparsek.jit.codegen import render
from blackwell_sparsek.jit.spec import DType, KernelConfig, families
from blackwell_sparsek.layout import BlockSparseLayout
from blackwell_sparsek.reference import attention_reference, relative_error
from test_attn_bwd_view import bwd_layouts as _layouts


# -- config ----------------------------------------------------------------------------------------------------

def test_family_registered_and_round_trips():
    assert families()["attn_bwd"] is AttnBwdConfig
    cfg = AttnBwdConfig(head_dim=64, dtype="bf16")
    assert cfg.dtype is DType.BF16
    back = KernelConfig.from_json(cfg.to_json())
    assert back == cfg and isinstance(back, AttnBwdConfig)
    assert json.loads(cfg.to_json())["family"] == "attn_bwd"


def test_named_configs_valid_and_named_by_kernel():
    named = fam.named_configs()
    assert len(named) == 8
    facts = set()
    for stem, cfg in named.items():
        assert cfg.problems() == []
        assert stem == cfg.config_name and cfg.kernel_name.startswith(stem + "_")
        assert re.fullmatch(r"[0-9a-f]{12}", cfg.kernel_name[len(stem) + 1:])
        facts.add((cfg.head_dim, cfg.dtype, cfg.deterministic))
    assert facts == {(d, t, det) for d in (64, 128) for t in (DType.FP16, DType.BF16) for det in (False, True)}
    assert len({c.kernel_name for c in named.values()}) == len(named)


@pytest.mark.parametrize("change, words", [
    (dict(head_dim=256), "use 64 or 128"),
    (dict(head_dim=96), "use 64 or 128"),
    (dict(block_n=96), "block_n 96 must be a positive multiple of 64"),
    (dict(block_n=32), "build the layout with block_n=64 or 128"),
    (dict(block_m=96), "block_m 96 must be a positive multiple of 64"),
    (dict(tile_m=128), "tile_m=64, tile_n=128"),
    (dict(arch="sm100a"), "use arch='sm90a'"),
])
def test_invalid_configs_name_the_fix(change, words):
    cfg = dataclasses.replace(AttnBwdConfig(), **change)
    probs = cfg.problems()
    assert any(words in p for p in probs), probs
    with pytest.raises(InvalidConfigError, match="nearest valid config"):
        cfg.validate()
    near = cfg.nearest_valid()
    assert near is not None and near.problems() == []


@pytest.mark.parametrize("field, value", [("head_dim", "128"), ("block_m", True), ("tile_n", 128.0)])
def test_integer_fields_are_ints(field, value):
    with pytest.raises(InvalidConfigError, match=f"{field} must be an int"):
        AttnBwdConfig(**{field: value})


def test_deterministic_is_its_own_kernel():
    fast, det = AttnBwdConfig(), AttnBwdConfig(deterministic=True)
    assert det.kernel_name != fast.kernel_name and "_b128x128_det_" in det.kernel_name
    assert "/*Deterministic=*/true" in render(det) and "/*Deterministic=*/false" in render(fast)
    assert fam.config_for(128, DType.FP16, 128, 128, True) == det
    with pytest.raises(InvalidConfigError, match="deterministic must be a bool"):
        AttnBwdConfig(deterministic=1)
    fwd = AttentionConfig(head_dim=128, tile_n=64, stages=2).to_json()
    assert AttnBwdConfig.from_json(ab.bwd_config_json(fwd, True)).deterministic


def test_a_config_with_the_removed_dq_split_field_is_refused():
    """dq_split (dQ's columns split between the warpgroups) was measured slower on both GPUs and removed: a saved
    config that still names it gets a typed error, not a silently different kernel."""
    text = json.dumps({**json.loads(AttnBwdConfig().to_json()), "dq_split": True})
    with pytest.raises(InvalidConfigError, match="dq_split"):
        AttnBwdConfig.from_json(text)


def test_deterministic_from_meta():
    assert ab.deterministic_from_meta([-1, 0, 4, 1, 1]) is True
    assert ab.deterministic_from_meta([-1, 0, 4, 1, 0]) is False
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        assert ab.deterministic_from_meta([-1, 0, 4, 1]) is True
        assert ab.deterministic_from_meta([-1, 0, 4, 1, -1]) is True
        assert ab.deterministic_from_meta([-1, 0, 4, 1, 0]) is False
    finally:
        torch.use_deterministic_algorithms(False)
    assert ab.deterministic_from_meta([-1, 0, 4, 1]) is False


def test_smem_fits_and_config_for():
    for d in (64, 128):
        assert AttnBwdConfig(head_dim=d).smem_bytes() <= 232448
    cfg = fam.config_for(128, DType.FP16, 128, 128)
    assert cfg == fam.named_configs()[cfg.config_name]
    assert fam.config_for(64, DType.BF16, 256, 256).block_n == 256  # derived, not named
    pair = fam.config_for(128, DType.FP16, 128, 64)  # 64-wide key blocks: pairs in one 128-key CTA
    assert pair.block_n == 64 and pair.tile_block_n == 128 and pair.template_vars()["block_n"] == 128
    assert fam.config_for(128, DType.FP16, 128, 192).tile_block_n == 128  # 64-key halves of 192-key blocks
    with pytest.raises(InvalidConfigError, match="block_n=64 or 128"):
        fam.config_for(128, DType.FP16, 128, 96)


def test_bwd_config_from_forward_config():
    fwd = AttentionConfig(head_dim=64, dtype=DType.BF16, tile_n=128, stages=4)
    bwd = AttnBwdConfig.from_json(ab.bwd_config_json(fwd.to_json()))
    assert (bwd.head_dim, bwd.dtype, bwd.block_m, bwd.block_n) == (64, DType.BF16, 128, 128)
    with pytest.raises(InvalidConfigError, match="attn_fwd config"):
        ab.bwd_config_json(AttnBwdConfig().to_json())


# -- rendering and ABI -----------------------------------------------------------------------------------------

def _rendered_struct(src: str, name: str) -> list[tuple[str, str]]:
    body = re.search(r"struct " + re.escape(name) + r"_args \{(.*?)\};", src, re.S).group(1)
    out = []
    for line in body.strip().splitlines():
        m = re.fullmatch(r"\s*(.+?)\s*(\w+);\s*", line)
        out.append((m.group(2), m.group(1)))
    return out


@pytest.mark.parametrize("stem", sorted(fam.named_configs()))
def test_render_named(stem):
    cfg = fam.named_configs()[stem]
    src = render(cfg)
    assert '#include "bsk/sm90/attn_bwd_kernel.hpp"' in src
    assert f"struct {cfg.kernel_name} :" in src and f'return "{cfg.kernel_name}"' in src
    assert f"/*HeadDim=*/{cfg.head_dim}," in src and cfg.dtype.cutlass_type in src
    assert _rendered_struct(src, cfg.kernel_name) == list(AttnBwdConfig.abi)


def test_abi_struct_launch_args_and_ctypes_agree():
    abi = AttnBwdConfig.abi
    names = [f for f, _ in abi]
    assert len(set(names)) == len(names)
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 100, 70, 64
    q = torch.zeros(B, H, Sq, D, dtype=torch.float16)
    k = torch.zeros(B, Hkv, Sk, D, dtype=torch.float16)
    lay = BlockSparseLayout.random_topk(Sq, 1, seq_k=Sk, num_heads=H)
    t = ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, Sq, 128)
    assert len(t) == 4
    ws = torch.zeros(2, B, H, 104)
    f = fam.launch_args(q=q, k=k, v=k, o=q, do=q, lse=torch.zeros(B, H, Sq), glse=None, lse2=ws[0], delta=ws[1],
                        dq_acc=torch.zeros(B, H, Sq, D), dq=q, dk=q, dv=q, t_q_idx=t[0], t_kind=t[1],
                        t_sched=t[2], t_rank=None, dq_sem=None, window_left=-1, window_right=0, scale=0.125)
    assert list(f) == names
    assert (f["heads_kv"], f["seq_k"], f["ws_stride_h"], f["n_kblocks"], f["layout_heads"]) == (2, 70, 104, 1, 4)
    assert f["glse"] is None and f["t_rank"] is None and f["dq_sem"] is None
    st = runtime.args_struct(abi)
    assert [x[0] for x in st._fields_] == names
    # the C struct's size: packed fields (the 4-byte ones come in runs of even length or last) plus the tail padding
    # to the 8-byte alignment of its pointers and long longs
    packed = sum(8 if ("*" in c or "long" in c) else 4 for _, c in abi)
    assert ctypes_size_of(st) == (packed + 7) // 8 * 8
    assert f["head_group"] == 0
    with pytest.raises(InvalidConfigError, match="one stride pair"):
        fam.launch_args(**{**dict(q=q, k=k, v=k, o=q, do=q, lse=torch.zeros(B, H, Sq), glse=None),
                           "lse2": ws[0], "delta": torch.zeros(B, H, Sq), "dq_acc": q, "dq": q, "dk": q, "dv": q,
                           "t_q_idx": t[0], "t_kind": t[1], "t_sched": t[2], "t_rank": None, "dq_sem": None,
                           "window_left": -1,
                           "window_right": -1, "scale": 1.0})


def ctypes_size_of(st) -> int:
    import ctypes
    return ctypes.sizeof(st)


# -- the dense formulas against the reference's autograd ------------------------------------------------------

def _case(lay, B, H, Hkv, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lay.seq_q, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, lay.seq_k, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, lay.seq_k, D, generator=g).to(dtype)
    do = torch.randn(B, H, lay.seq_q, D, generator=g).to(dtype)
    glse = torch.randn(B, H, lay.seq_q, generator=g)
    return q, k, v, do, glse


def _reference_grads(q, k, v, do, glse, lay, scale):
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = attention_reference(qd, kd, vd, lay, scale=scale)
    loss = (o * do.double()).sum() + (torch.where(torch.isinf(lse), 0.0, lse.double()) * glse.double()).sum()
    loss.backward()
    return o, lse, qd.grad, kd.grad, vd.grad


@pytest.mark.parametrize("name, B, H, Hkv, D, dtype", [
    ("topk_per_head", 1, 3, 3, 64, torch.float16),
    ("causal_odd", 2, 4, 2, 64, torch.bfloat16),
    ("causal_short_q", 1, 2, 1, 128, torch.float16),
    ("window", 1, 2, 2, 64, torch.float16),
    ("empty_rows_cols", 1, 2, 2, 64, torch.bfloat16),
])
def test_dense_op_matches_reference_autograd(name, B, H, Hkv, D, dtype):
    lay = _layouts()[name]
    scale = 0.7 / math.sqrt(D)
    q, k, v, do, glse = _case(lay, B, H, Hkv, D, dtype, seed=hash(name) % 1000)
    o, lse, dq_ref, dk_ref, dv_ref = _reference_grads(q, k, v, do, glse, lay, scale)
    fwd = AttentionConfig(head_dim=D, dtype=DType.BF16 if dtype == torch.bfloat16 else DType.FP16,
                          tile_n=128 if D == 64 else 64, stages=2)
    meta = [lay.window_left, lay.window_right, lay.n_kblocks, 0]
    dq, dk, dv = ab.attn_bwd(q, k, v, o.to(dtype), lse, do, glse, lay.col_idx, lay.block_kind,
                             lay.row_schedule(), meta, scale, ab.bwd_config_json(fwd.to_json()))
    assert dq.dtype == dtype and dk.shape == k.shape and dv.shape == v.shape
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for got, ref in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert relative_error(got, ref) <= tol
    if name == "empty_rows_cols":  # key blocks nobody lists get zero gradients, never NaN
        assert torch.all(dk[:, :, 128:256] == 0) and torch.all(dv[:, :, 256:384] == 0)


def test_element_mask_matches_layout():
    for lay in _layouts().values():
        if lay.block_n % 128:
            continue
        m = ab.element_mask(lay.col_idx, lay.block_kind, lay.row_schedule(),
                            [lay.window_left, lay.window_right, lay.n_kblocks, 0], lay.seq_q, lay.seq_k,
                            lay.block_m, lay.block_n)
        assert torch.equal(m, lay.to_element_mask())


# -- autograd wiring (fake tensors: no kernel runs) ---------------------------------------------------------------

def test_attn_fwd_autograd_calls_attn_bwd_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    lay = BlockSparseLayout.causal(300)
    fwd = AttentionConfig(head_dim=64, dtype=DType.FP16, tile_n=128, stages=4)
    real = (lay.col_idx, lay.block_kind, lay.row_schedule())
    with FakeTensorMode():
        q = torch.empty(1, 2, 300, 64, dtype=torch.float16, requires_grad=True)
        k = torch.empty(1, 1, 300, 64, dtype=torch.float16, requires_grad=True)
        v = torch.empty(1, 1, 300, 64, dtype=torch.float16, requires_grad=True)
        ci, bk, rs = (torch.empty(t.shape, dtype=t.dtype) for t in real)
        o, lse = torch.ops.blackwell_sparsek.attn_fwd(q, k, v, ci, bk, rs, [-1, 0, 3, 1], 0.125, fwd.to_json())
        (o.float().sum() + lse.sum()).backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("with_lse", [False, True])
def test_eager_autograd_function_matches_the_op_backward(with_lse):
    """EagerAttention (the dispatcher-free eager path) feeds the same saved tensors, metadata and gradients to the
    backward's body as the op's registered autograd: on CPU tensors both run the dense formulas."""
    lay = _layouts()["causal_odd"]
    B, H, Hkv, D, dtype = 1, 4, 2, 64, torch.float16
    scale = 0.7 / math.sqrt(D)
    q, k, v, do, glse = _case(lay, B, H, Hkv, D, dtype, seed=11)
    o_ref, lse_ref = attention_reference(q.double(), k.double(), v.double(), lay, scale=scale)
    fwd = AttentionConfig(head_dim=D, dtype=DType.FP16, tile_n=128, stages=2).to_json()
    meta = [lay.window_left, lay.window_right, lay.n_kblocks, 1, 0]
    launch = lambda q, k, v: (o_ref.to(dtype), lse_ref.float())  # noqa: E731 - stands in for the kernel
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o, lse = ab.EagerAttention.apply(qg, kg, vg, launch, lay.col_idx, lay.block_kind, lay.row_schedule(), meta,
                                     scale, fwd)
    outs, grads = ([o, lse], [do, glse]) if with_lse else ([o], [do])
    torch.autograd.backward(outs, grads)
    want = ab.attn_bwd(q, k, v, o.detach(), lse.detach(), do, glse if with_lse else None, lay.col_idx,
                       lay.block_kind, lay.row_schedule(), meta, scale, ab.bwd_config_json(fwd))
    for got, ref in zip((qg.grad, kg.grad, vg.grad), want):
        assert torch.equal(got, ref)
    with pytest.raises(RuntimeError, match="differentiable"):  # no silent wrong double backward
        o2, _ = ab.EagerAttention.apply(qg, kg, vg, launch, lay.col_idx, lay.block_kind, lay.row_schedule(), meta,
                                        scale, fwd)
        g, = torch.autograd.grad(o2, qg, do.clone().requires_grad_(), create_graph=True)
        g.sum().backward()


@pytest.mark.parametrize("D, block", [(256, 128)], ids=["d256"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_no_backward_kernel_is_refused_before_the_forward(D, block, compiled, monkeypatch):
    """Inputs that need gradients on a config no backward kernel serves: InvalidConfigError naming the fix before
    any forward runs (on the CPU fallback as on the GPU), not in the middle of backward(); without grad it runs."""
    import warnings
    import blackwell_sparsek as bsk
    from blackwell_sparsek.ops import attention as fa
    ran = []
    monkeypatch.setattr(fa, "_fallback", lambda *a: ran.append(1) or (_ for _ in ()).throw(AssertionError("ran")))
    lay = BlockSparseLayout.random_topk(300, 2, seed=0, block_m=block, block_n=block)
    q, k, v = (torch.randn(1, 2, 300, D, dtype=torch.float16, requires_grad=True) for _ in range(3))
    fn = torch.compile(bsk.sparse_attention, backend="eager") if compiled else bsk.sparse_attention
    with pytest.raises(InvalidConfigError, match="head_dim 256 is not supported by the backward"):
        fn(q, k, v, lay)
    assert not ran
    monkeypatch.undo()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert bsk.sparse_attention(q, k, v, lay).shape == q.shape


def test_bad_inputs_are_rejected():
    lay = BlockSparseLayout.causal(200)
    q = torch.randn(1, 2, 200, 64, dtype=torch.float16)
    k = torch.randn(1, 2, 200, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 200)
    meta = [-1, 0, 2, 0]
    cfg = ab.bwd_config_json(AttentionConfig(head_dim=64, tile_n=128, stages=4).to_json())
    args = (lay.col_idx, lay.block_kind, lay.row_schedule(), meta, 0.125, cfg)
    with pytest.raises(InputError, match="one dtype"):
        ab.attn_bwd(q, k.float(), k, q, lse, q, None, *args)
    with pytest.raises(InputError, match="must match O"):
        ab.attn_bwd(q, k, k, q, lse, q[:, :, :100], None, *args)
    with pytest.raises(InputError, match="float32"):
        ab.attn_bwd(q, k, k, q, lse.half(), q, None, *args)
    cfg128 = ab.bwd_config_json(AttentionConfig(head_dim=128, tile_n=64, stages=2).to_json())
    with pytest.raises(InvalidConfigError, match="head_dim=128"):
        ab.attn_bwd(q, k, k, q, lse, q, None, *args[:-1], cfg128)


# -- the real compile ----------------------------------------------------------------------------------------------

@pytest.mark.real_compile
@pytest.mark.slow
def test_real_compile_attn_bwd(bsk_cache):
    """The real nvcc on the d64 fp16 backward kernel (~1-2 min on 2 cores); no GNU-unique symbols of ours."""
    try:
        compiler.nvcc_version(compiler.find_nvcc())
        compiler.cutlass_paths()
    except ToolchainError as e:
        pytest.skip(f"real nvcc compile needs nvcc and CUTLASS: {e}")
    cfg = fam.named_configs()["bsk_sm90a_attn_bwd_d64_fp16_t64x128_b128x128"]
    e = kernels.ensure_built(cfg)
    assert e.built and e.so_path.stat().st_size > 0
    assert cfg.kernel_name.encode() in e.so_path.read_bytes()
    # the config's shared-memory model may round up (alignment), never under the kernel's SharedStorage
    assert cfg.smem_bytes() - 1024 < kernels.build(cfg).smem_bytes <= cfg.smem_bytes()
    import shutil
    import subprocess
    nm = shutil.which("nm")
    if nm:
        syms = subprocess.run([nm, "-D", "--defined-only", str(e.so_path)], capture_output=True, text=True).stdout
        for s in ("bsk_launch", "bsk_kernel_name", "bsk_smem_bytes"):
            assert s in syms
        assert not [ln for ln in syms.splitlines() if ln.split()[1:2] == ["u"] and "3bsk" in ln]


def test_bench_bwd_lists_its_cases_and_formats_rows(capsys):
    """The harness's backward benchmark: the case list (the done-when's shapes) and its markdown table, on CPU."""
    from blackwell_sparsek.bench import backward
    from blackwell_sparsek.bench.cli import main as bench_main
    assert bench_main(["bench-bwd", "--list"]) == 0
    listed = capsys.readouterr().out
    for shape in ("2,16,8192,128", "4,16,8192,128", "1,8,8192,64", "1,16,32768,128"):
        assert shape in listed
    rows = [dict(case="c", impl="bsk bwd", dtype="float16", B=1, H=2, S=3, D=64, ms=2.0, tflops=5.0, vs_flex=1.5),
            dict(case="c", impl="bsk bwd det", dtype="float16", B=1, H=2, S=3, D=64, ms=2.2, tflops=4.5,
                 det_cost=0.1)]
    md = backward.markdown("GPU", rows, {"k": 1})
    assert "| c | bsk bwd | float16 | 1,2,3,64 | 2.000 | 5.0 | 1.50x Flex |" in md
    assert "det cost +10.0 %" in md


@pytest.mark.parametrize("H,Hkv,heads", [(4, 4, 1), (6, 2, 6), (8, 2, 1), (8, 1, 8)], ids=["mha", "g3", "g4", "mqa8"])
def test_gqa_launch_orchestration(H, Hkv, heads, monkeypatch):
    """The op's GQA path without a GPU: one launch with all query heads, dK/dV per K/V head, the workspace over
    the query heads, and the transposed view stacked per K/V head (1 or Hkv layout rows)."""
    B, S, D = 1, 256, 64
    seen = []

    class FakeKernel:
        Args = dict

        def launch_on(self, fields, dev):
            seen.append(fields)
    monkeypatch.setattr(ab, "_kernel_for", lambda text: FakeKernel())
    from blackwell_sparsek.ops import dispatch
    monkeypatch.setattr(dispatch, "device_facts",
                        lambda dev: runtime.DeviceInfo(0, "H100", (9, 0), 132, 232448, l2_bytes=1 << 20))
    monkeypatch.setattr(dispatch, "check_device", lambda *a: None)
    lay = BlockSparseLayout.random_topk(seq_q=S, k=1, seed=1, num_heads=heads)
    q, o, do = (torch.randn(B, H, S, D, dtype=torch.float16) for _ in range(3))
    k, v = (torch.randn(B, Hkv, S, D, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(B, H, S)
    cfg = ab.bwd_config_json(AttentionConfig(head_dim=D, tile_n=64, stages=2).to_json())
    dq, dk, dv = ab._attn_bwd_cuda(q, k, v, o, lse, do, None, lay.col_idx, lay.block_kind, lay.row_schedule(),
                                   [-1, -1, lay.n_kblocks, 0, 0], 0.1, cfg)
    assert len(seen) == 1
    f = seen[0]
    assert (f["heads"], f["heads_kv"], f["layout_heads"]) == (H, Hkv, 1 if heads == 1 else Hkv)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    assert (f["dk"], f["dv"], f["dq"]) == (dk.data_ptr(), dv.data_ptr(), dq.data_ptr())
    assert f["col_stride"] == (H // Hkv) * lay.col_idx.shape[1]
    # Q and dO of a K/V head's query heads, 2 * (H / Hkv) * 256 * 64 * 2 bytes: half of the 1 MiB L2 holds 8 (MHA),
    # 2 (G = 3, 4) or 1 (G = 8) of them; the group is that, up to B * Hkv
    assert f["head_group"] == {(4, 4): 4, (6, 2): 2, (8, 2): 2, (8, 1): 1}[H, Hkv]
