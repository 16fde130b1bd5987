"""GPU tests of the attention backward: dQ, dK, dV against the float64 autograd of the dense-masked reference.

Skipped without CUDA. Fresh random inputs and upstream gradients (dO and the LSE's) per case, outputs poisoned with
NaN before each launch (BSK_POISON), ‖Δ‖/‖ref‖ ≤ 1e-2 (fp16) / 2e-2 (bf16) for each gradient separately; key
blocks nobody lists must get dK = dV = 0 and empty query rows dQ = 0, never NaN.
"""
from __future__ import annotations

import math

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention_bwd as ab  # registers the autograd of blackwell_sparsek::attn_fwd
from blackwell_sparsek.reference import attention_reference, relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)")]

L = bsk.BlockSparseLayout
_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
_SEED = [4321]



def _rand(*shape, dtype=torch.float32):
    _SEED[0] += 1
    g = torch.Generator(device="cuda").manual_seed(_SEED[0])
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


def _inputs(B, H, Hkv, Sq, Sk, D, dtype, bshd=False):
    if bshd:  # (B, S, H, D) storage, passed as (B, H, S, D) views
        q = _rand(B, Sq, H, D, dtype=dtype).transpose(1, 2)
        k = _rand(B, Sk, Hkv, D, dtype=dtype).transpose(1, 2)
        v = _rand(B, Sk, Hkv, D, dtype=dtype).transpose(1, 2)
    else:
        q, k, v = _rand(B, H, Sq, D, dtype=dtype), _rand(B, Hkv, Sk, D, dtype=dtype), _rand(B, Hkv, Sk, D, dtype=dtype)
    return q, k, v, _rand(B, H, Sq, D, dtype=dtype), _rand(B, H, Sq)


def _layouts(Sq, Sk, H):
    nq, nk = -(-Sq // 128), -(-Sk // 128)
    g = torch.Generator().manual_seed(11)
    holes = torch.rand(H, nq, nk, generator=g) < 0.45
    holes[:, 1] = False     # an empty query row in every head
    holes[0, :, 2] = False  # an empty key column in head 0
    holes[:, 0, 0] = True
    return {
        "dense": (L.dense(seq_q=Sq, seq_k=Sk), False),
        "causal": (L.dense(seq_q=Sq, seq_k=Sk), True),
        "window": (L.sliding_window(seq_q=Sq, seq_k=Sk, window=300), False),
        "topk_per_head": (L.random_topk(seq_q=Sq, seq_k=Sk, k=3, seed=5, num_heads=H), False),
        "empty_rows_cols": (L.from_block_mask(holes, seq_q=Sq, seq_k=Sk), False),
    }


def _check_grads(q, k, v, do, glse, layout, causal, scale=None, deterministic=None):
    """Ours through torch.autograd (sparse_attention, eager) against the float64 reference's autograd; returns the
    relative errors and our gradients."""
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = bsk.sparse_attention(qg, kg, vg, layout, causal=causal, scale=scale, return_lse=True,
                                  deterministic=deterministic)
    ref_lay = layout.with_causal() if causal else layout
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ro, rlse = attention_reference(qd, kd, vd, ref_lay, scale=scale)
    empty = torch.isinf(rlse)
    g = torch.where(empty, 0.0, glse)  # the LSE of an empty row is -inf: no gradient flows there
    torch.autograd.backward([o, torch.where(torch.isinf(lse), 0.0, lse)], [do, g])
    torch.autograd.backward([ro, torch.where(empty, 0.0, rlse.double())], [do.double(), g.double()])
    torch.cuda.synchronize()
    tol = _TOL[q.dtype]
    errs = {}
    for name, got, ref in (("dq", qg.grad, qd.grad), ("dk", kg.grad, kd.grad), ("dv", vg.grad, vd.grad)):
        assert got.shape == ref.shape and got.dtype == q.dtype, name
        assert torch.isfinite(got).all(), f"NaN/inf in {name}: unwritten (poisoned) or 0 * inf"
        errs[name] = relative_error(got, ref)
        assert errs[name] <= tol, f"{name}: relative error {errs[name]:.3e} > {tol}"
    if empty.any():
        assert (qg.grad.float()[empty] == 0).all(), "empty query rows must get dQ = 0"
    return errs, (qg.grad, kg.grad, vg.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("pattern", ["dense", "causal", "window", "topk_per_head", "empty_rows_cols"])
def test_gradients_match_reference(pattern, D, dtype):
    B, H, Hkv, Sq, Sk = 2, 4, 4, 777, 1000
    layout, causal = _layouts(Sq, Sk, H)[pattern]
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, dtype)
    _check_grads(q, k, v, do, glse, layout.to("cuda"), causal)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
@pytest.mark.parametrize("block", [(64, 128), (256, 128), (128, 256), (64, 64), (128, 64), (128, 192)],
                         ids=lambda b: f"{b[0]}x{b[1]}")
def test_other_block_shapes(block, deterministic):
    """Block shapes besides 128x128 (the forward tests' layouts, seq_q 777 so the last 256-row block has 9 rows and
    three 64-row dQ tiles past seq_q): gradients against float64, and the deterministic kernel bitwise repeatable
    (256-key blocks are two CTAs that take consecutive dQ turns; 64-key blocks run in pairs, 21 of them at
    seq_k 1300, so the last pair has no high half; 192-key blocks as 128-key columns of 64-key halves, one in
    three straddling two blocks)."""
    bm, bn = block
    for layout, causal in ((L.random_topk(seq_q=777, seq_k=1300, k=3, seed=5, num_heads=2, block_m=bm, block_n=bn),
                            False), (L.dense(seq_q=777, seq_k=1300, block_m=bm, block_n=bn), True)):
        layout = layout.to("cuda")
        q, k, v, do, glse = _inputs(1, 2, 2, 777, 1300, 128, torch.float16)
        _, first = _check_grads(q, k, v, do, glse, layout, causal, deterministic=deterministic)
        if deterministic:
            _, again = _check_grads(q, k, v, do, glse, layout, causal, deterministic=True)
            for name, a, b in zip(("dq", "dk", "dv"), first, again):
                assert torch.equal(a, b), f"{name} differs between deterministic runs"


@pytest.mark.parametrize("D,dtype", [(128, torch.bfloat16)], ids=["d128bf16"])
def test_gradients_through_a_split_kv_forward(D, dtype):
    """A layout with global rows runs the split-KV forward (attn_fwd_split); its O and LSE feed the backward."""
    from test_split_kv import global_rows
    layout = global_rows(5120 + 77, heads=2, band=0, n_random=1, seed=9).to("cuda")
    from blackwell_sparsek.ops import default_config
    assert default_config(D, dtype, layout).split_kv
    q, k, v, do, glse = _inputs(1, 2, 2, layout.seq_q, layout.seq_k, D, dtype)
    _check_grads(q, k, v, do, glse, layout, False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("pattern", ["causal", "topk_per_head", "empty_rows_cols"])
def test_gqa_bshd_odd_lengths(pattern, dtype):
    B, H, Hkv, Sq, Sk, D = 1, 4, 2, 333, 901, 128
    layout, causal = _layouts(Sq, Sk, H)[pattern]
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, dtype, bshd=True)
    _check_grads(q, k, v, do, glse, layout.to("cuda"), causal, scale=0.05)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
def test_64_wide_key_blocks_gqa_bshd_holes(D, dtype, deterministic):
    """Pairs of 64-wide key blocks (one CTA over the union of their query blocks, the unlisted half masked) under
    GQA with (B, S, H, D) strides: per-head 64x64 blocks with an empty query row, a key block nobody lists (its
    pair has only low halves: dK = dV = 0 there) and a whole pair nobody lists; odd lengths."""
    B, H, Hkv, Sq, Sk = 2, 6, 2, 12 * 64 - 5, 13 * 64 - 9
    g = torch.Generator().manual_seed(7)
    holes = torch.rand(H, 12, 13, generator=g) < 0.4
    holes[:, 2] = False
    holes[:, :, 5] = False
    holes[:, :, 8:10] = False
    holes[:, 0, 0] = True
    layout = L.from_block_mask(holes, seq_q=Sq, seq_k=Sk, block_m=64, block_n=64).to("cuda")
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, dtype, bshd=True)
    _, (dq, dk, dv) = _check_grads(q, k, v, do, glse, layout, False, deterministic=deterministic)
    for cols in (slice(5 * 64, 6 * 64), slice(8 * 64, 10 * 64)):
        assert torch.all(dk[:, :, cols] == 0) and torch.all(dv[:, :, cols] == 0)
    if deterministic:
        _, again = _check_grads(q, k, v, do, glse, layout, False, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), again):
            assert torch.equal(a, b), f"{name} differs between deterministic runs"


def test_mqa_and_seq_q_longer_than_seq_k():
    B, H, Hkv, Sq, Sk, D = 2, 4, 1, 1100, 515, 64
    layout, causal = _layouts(Sq, Sk, H)["causal"]
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, torch.float16)
    _check_grads(q, k, v, do, glse, layout.to("cuda"), causal)


@pytest.mark.parametrize("H,Hkv,pattern", [(6, 2, "topk_per_head"), (8, 2, "empty_rows_cols"), (8, 1, "causal")],
                         ids=["g3", "g4", "mqa8"])
def test_gqa_group_sizes_deterministic_and_within_the_memory_bound(H, Hkv, pattern):
    """GQA sums dK/dV over a K/V head's query heads inside the kernel (the transposed view stacks them): gradients
    against float64 for groups of 3, 4 and 8 (per-head and shared layouts), the deterministic mode bitwise
    repeatable, and a backward call's extra memory within one fp32 dQ accumulator of all heads (issue 26's bound),
    with no per-query-head dK/dV buffer."""
    B, Sq, Sk, D = 1, 700, 700, 128
    layout, causal = _layouts(Sq, Sk, H)[pattern]
    layout = layout.to("cuda")
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, torch.float16)
    _check_grads(q, k, v, do, glse, layout, causal)
    _, first = _check_grads(q, k, v, do, glse, layout, causal, deterministic=True)
    _, again = _check_grads(q, k, v, do, glse, layout, causal, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), f"{name} differs between deterministic runs"
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = bsk.sparse_attention(qg, kg, vg, layout, causal=causal)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    dq, dk, dv = torch.autograd.grad(o, (qg, kg, vg), do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - sum(t.numel() * t.element_size() for t in (dq, dk, dv))
    bound = B * H * Sq * D * 4 + (1 << 20)  # one fp32 dQ accumulator, plus O(nnz) metadata and the LSE rows
    assert extra <= bound, f"backward used {extra} bytes beyond its outputs, bound {bound}"


def test_empty_key_columns_get_zero_dk_dv():
    H, Sq, Sk, D = 2, 512, 640, 64
    m = torch.zeros(H, 4, 5, dtype=torch.bool)
    m[:, :, 1] = True
    m[:, 2, 3] = True  # key blocks 0, 2, 4 listed by nobody
    layout = L.from_block_mask(m, seq_q=Sq, seq_k=Sk).to("cuda")
    q, k, v, do, _ = _inputs(1, H, H, Sq, Sk, D, torch.float16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = bsk.sparse_attention(q, k, v, layout)
    o.backward(do)
    for blk in (0, 2, 4):
        sl = slice(blk * 128, min((blk + 1) * 128, Sk))
        assert (k.grad[:, :, sl] == 0).all() and (v.grad[:, :, sl] == 0).all()
    assert torch.isfinite(q.grad).all() and (k.grad[:, :, 128:256] != 0).any()


def test_transposed_view_on_cuda_matches_cpu():
    lay = L.random_topk(seq_q=3000, k=5, seed=2, num_heads=3)
    cpu = ab.transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks, 3000, 128)
    gl = lay.to("cuda")
    gpu = ab.transposed_view(gl.col_idx, gl.block_kind, gl.row_schedule(), gl.n_kblocks, 3000, 128)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a, b.cpu())


def test_repeated_backward_is_stable_and_reuses_the_view():
    layout = L.random_topk(seq_q=1024, k=3, seed=9).to("cuda")
    q, k, v, do, _ = _inputs(1, 2, 2, 1024, 1024, 128, torch.bfloat16)
    grads = []
    for _ in range(3):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        bsk.sparse_attention(qg, kg, vg, layout).backward(do)
        grads.append((qg.grad, kg.grad, vg.grad))
    for a, b in zip(grads[0], grads[-1]):  # dK, dV exact; dQ through unordered fp32 atomics: close
        assert relative_error(b, a) < 1e-3
    assert torch.equal(grads[0][1], grads[-1][1]) and torch.equal(grads[0][2], grads[-1][2])


@pytest.mark.parametrize("D, dtype, pattern, Sq", [
    (128, torch.float16, "topk_per_head", 1777), (64, torch.bfloat16, "causal", 1777),
    (128, torch.bfloat16, "empty_rows_cols", 1777),
    # the last query block's second 64-row half lies wholly past seq_q (seq_q % 128 in 1..64): it has no dQ turn
    # counter (once, its adds bumped the next head's counters and deadlocked the kernel)
    (128, torch.bfloat16, "topk_per_head", 777), (64, torch.float16, "causal", 1600)])
def test_deterministic_mode_is_bitwise_reproducible(D, dtype, pattern, Sq, monkeypatch):
    """torch.use_deterministic_algorithms selects the ordered-dQ kernel: the same gradients bit for bit, run after
    run, and as accurate as the fast mode."""
    used = []
    inner = ab._attn_bwd_cuda
    monkeypatch.setattr(ab, "_attn_bwd_cuda", lambda *a, **kw: used.append(ab._bwd_config(a[12])) or inner(*a, **kw))
    B, H, Hkv, Sk = 2, 4, 2, 2000
    layout, causal = _layouts(Sq, Sk, H)[pattern]
    layout = layout.to("cuda")
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, dtype)
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only: the float64 reference uses cuBLAS
    try:
        _check_grads(q, k, v, do, glse, layout, causal)
        runs = []
        for _ in range(3):
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            bsk.sparse_attention(qg, kg, vg, layout, causal=causal).backward(do)
            runs.append((qg.grad, kg.grad, vg.grad))
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(used) == 4 and all(c.deterministic for c in used)
    for other in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], other):
            assert torch.equal(a, b), f"{name} differs between deterministic runs"


@pytest.mark.parametrize("pattern", ["topk_per_head", "split_kv"])
def test_eager_autograd_and_the_op_path_agree_bitwise(pattern):
    """A plain eager call runs EagerAttention (no dispatcher); under a TorchFunctionMode the same call goes through
    the ops and their registered autograd. Deterministic mode: the same gradients and outputs bit for bit."""
    from torch.overrides import TorchFunctionMode

    class _Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    D, dtype = 128, torch.bfloat16
    if pattern == "split_kv":  # the shapes of test_gradients_through_a_split_kv_forward
        from test_split_kv import global_rows
        layout, causal = global_rows(5120 + 77, heads=2, band=0, n_random=1, seed=9), False
        q, k, v, do, glse = _inputs(1, 2, 2, layout.seq_q, layout.seq_k, D, dtype)
    else:
        layout, causal = _layouts(777, 1000, 4)[pattern]
        q, k, v, do, glse = _inputs(2, 4, 4, 777, 1000, D, dtype)
    layout = layout.to("cuda")
    got = []
    for mode in (None, _Passthrough):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with mode() if mode else torch.enable_grad():
            o, lse = bsk.sparse_attention(qg, kg, vg, layout, causal=causal, return_lse=True, deterministic=True)
        assert (type(o.grad_fn).__name__ == "EagerAttentionBackward") == (mode is None), o.grad_fn
        torch.autograd.backward([o, torch.where(torch.isinf(lse), 0.0, lse)], [do, glse])
        got.append((o, lse, qg.grad, kg.grad, vg.grad))
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), *got):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("group", [3, 1 << 20])
def test_head_group_of_the_tile_order(group, monkeypatch):
    """The tile-order head group changes which CTAs run side by side, never the accuracy (a group that does not
    divide B * Hkv takes the largest divisor below it), in both modes; the deterministic kernel's turns follow the
    group (det_ranks), and each setting gives the same bits run to run."""
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 1777, 2000, 128
    layout = _layouts(Sq, Sk, H)["topk_per_head"][0].to("cuda")
    q, k, v, do, glse = _inputs(B, H, Hkv, Sq, Sk, D, torch.float16)
    monkeypatch.setattr(ab, "HEAD_GROUP", group)
    _check_grads(q, k, v, do, glse, layout, False)
    _, first = _check_grads(q, k, v, do, glse, layout, False, deterministic=True)
    _, again = _check_grads(q, k, v, do, glse, layout, False, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), f"{name} differs between deterministic runs at head group {group}"


def test_torch_compile_fullgraph_forward_and_backward():
    layout = L.random_topk(seq_q=1024, k=3, seed=4, num_heads=2).to("cuda")
    q, k, v, do, _ = _inputs(1, 2, 2, 1024, 1024, 64, torch.float16)

    def step(q, k, v):
        return bsk.sparse_attention(q, k, v, layout)

    compiled = torch.compile(step, fullgraph=True)
    qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
    step(qe, ke, ve).backward(do)
    qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
    compiled(qc, kc, vc).backward(do)
    for a, b in ((qe.grad, qc.grad), (ke.grad, kc.grad), (ve.grad, vc.grad)):
        assert relative_error(b, a) < 1e-3


def test_default_scale_and_explicit_scale_agree_with_reference():
    layout, causal = _layouts(640, 640, 2)["window"]
    q, k, v, do, glse = _inputs(1, 2, 2, 640, 640, 64, torch.float16)
    _check_grads(q, k, v, do, glse, layout.to("cuda"), causal, scale=1.3 / math.sqrt(64))


def test_opcheck_with_autograd():
    """torch.library.opcheck on the forward op with inputs that require grad: schema, fake, autograd
    registration and AOT dispatch of the backward."""
    from blackwell_sparsek.ops import attention as fwd
    lay = L.random_topk(seq_q=512, k=2, seed=2, num_heads=2).to("cuda")
    q, k, v, _, _ = _inputs(1, 2, 2, 512, 512, 64, torch.float16)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    cfg = bsk.ops.default_config(64, torch.float16, lay).to_json()
    args = (q, k, v, lay.col_idx, lay.block_kind, lay.row_schedule(), fwd._meta(lay), 0.125, cfg)
    torch.library.opcheck(fwd._attn_fwd, args)


def test_short_training_run_matches_sdpa_with_the_same_mask():
    """A tiny model (embedding, one causal-window sparse attention layer, a head) trained 200 steps with Adam
    from one initialization, once with sparse_attention and once with SDPA and the layout's element mask (both
    bf16 attention, float32 parameters) on a task the attention must solve (predict the previous token): the
    losses stay within 5 % (+0.02) of each other at every 20th step and at the end."""
    torch.manual_seed(0)
    V, S, H, D, steps = 64, 512, 4, 64, 200
    lay = L.sliding_window(S, 128, block_m=128, block_n=128).to("cuda")
    mask = lay.to_element_mask()[0].to("cuda")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, H * D)
            self.pos = torch.nn.Embedding(S, H * D)
            self.qkv = torch.nn.Linear(H * D, 3 * H * D)
            self.out = torch.nn.Linear(H * D, V)

        def forward(self, x, sparse: bool):
            B = x.shape[0]
            h = self.emb(x) + self.pos.weight
            q, k, v = self.qkv(h).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).to(torch.bfloat16)
            if sparse:
                o = bsk.sparse_attention(q, k, v, lay)
            else:
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out(o.float().transpose(1, 2).reshape(B, S, H * D))

    data = torch.randint(0, V, (steps, 2, S + 1), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    init = Net().cuda().state_dict()
    losses = {}
    for sparse in (True, False):
        net = Net().cuda()
        net.load_state_dict(init)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        losses[sparse] = []
        for i in range(steps):
            x, y = data[i, :, 1:], data[i, :, :-1]  # predict the previous token: the attention has to find it
            loss = torch.nn.functional.cross_entropy(net(x, sparse).reshape(-1, V), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[sparse].append(loss.item())
    a, b = losses[True], losses[False]
    assert a[-1] < 0.25 * a[0]  # it learned the task (float32 SDPA on the CPU: 4.16 -> 0.07)
    for i in list(range(0, steps, 20)) + [steps - 1]:
        assert abs(a[i] - b[i]) <= 0.05 * b[i] + 0.02, (i, a[i], b[i])
