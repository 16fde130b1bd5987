"""Block-sparse GEMM API on the CPU: BlockSparseMatrix conversions (dense, torch.sparse_bsr both ways, transpose),
bsr_matmul / sampled_matmul values and gradients against float64 dense products (the reference path), every
rejected input, the custom ops under opcheck, and torch.compile(fullgraph=True)."""
from __future__ import annotations

import pytest
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek import BlockSparseLayout, BlockSparseMatrix, InputError, LayoutError, bsr_matmul, \
    sampled_matmul
from blackwell_sparsek.ops import gemm as G
from blackwell_sparsek.reference import relative_error

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def rand_mask(nq: int, nk: int, density: float, gen: torch.Generator, *, empty_row: bool = True,
              full_row: bool = True) -> torch.Tensor:
    m = torch.rand(nq, nk, generator=gen) < density
    if empty_row and nq > 1:
        m[0] = False
    if full_row and nq > 2:
        m[-1] = True
    return m


def rand_matrix(m: int, k: int, block: int, dtype=torch.float16, density=0.4, seed=0) -> BlockSparseMatrix:
    gen = torch.Generator().manual_seed(seed)
    nq, nk = -(-m // block), -(-k // block)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return BlockSparseMatrix.from_dense(x, block, mask=rand_mask(nq, nk, density, gen))


def randn(*shape, dtype=torch.float16, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- the matrix type -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,block", [(256, 256, 128), (200, 136, 64), (64, 512, 64), (1, 8, 128)])
def test_from_dense_round_trip(m, k, block):
    x = randn(m, k)
    a = BlockSparseMatrix.from_dense(x, block)
    assert a.shape == (m, k) and a.block_size == (block, block) and a.dtype == torch.float16
    assert torch.equal(a.to_dense(), x)
    assert a.nnz == a.layout.n_qblocks * a.layout.n_kblocks
    # entries past the edge are zero
    nq, nk = a.layout.n_qblocks, a.layout.n_kblocks
    pad = torch.zeros(nq * block, nk * block, dtype=x.dtype)
    pad[:m, :k] = x
    assert float(a.values.float().abs().sum()) == pytest.approx(float(pad.float().abs().sum()))


def test_from_dense_mask_threshold_nonzero():
    x = torch.zeros(256, 256)
    x[:128, 128:] = 3.0
    x[128:, :128] = 0.5
    a = BlockSparseMatrix.from_dense(x, 128)
    assert a.layout.to_dense_mask()[0].tolist() == [[False, True], [True, False]]
    b = BlockSparseMatrix.from_dense(x, 128, threshold=1.0)
    assert b.nnz == 1 and torch.equal(b.to_dense(), torch.where(x > 1, x, 0))
    mask = torch.tensor([[True, True], [False, False]])
    c = BlockSparseMatrix.from_dense(x, 128, mask=mask)
    assert c.nnz == 2 and torch.equal(c.to_dense()[:128], x[:128]) and not c.to_dense()[128:].any()
    with pytest.raises(InputError, match="mask or threshold"):
        BlockSparseMatrix.from_dense(x, 128, mask=mask, threshold=1.0)
    with pytest.raises(InputError, match="bool tensor"):
        BlockSparseMatrix.from_dense(x, 128, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(InputError, match="block"):
        BlockSparseMatrix.from_dense(x, (128, 0))
    with pytest.raises(InputError, match="2-D"):
        BlockSparseMatrix.from_dense(x[0], 128)


@pytest.mark.parametrize("block", [64, 128])
def test_torch_sparse_bsr_both_ways_exact(block):
    a = rand_matrix(256, 384, block)
    t = a.to_torch()
    assert t.layout == torch.sparse_bsr and tuple(t.values().shape[1:]) == (block, block)
    assert torch.equal(t.to_dense(), a.to_dense())
    back = BlockSparseMatrix.from_torch(t)
    assert back.layout == a.layout and torch.equal(back.values, a.values)
    # torch -> ours -> torch
    t2 = randn(256, 384).to_sparse_bsr((block, block))
    ours = BlockSparseMatrix.from_torch(t2)
    t3 = ours.to_torch()
    assert torch.equal(t3.crow_indices(), t2.crow_indices()) and torch.equal(t3.col_indices(), t2.col_indices())
    assert torch.equal(t3.values(), t2.values())


def test_from_torch_unsorted_columns_and_duplicates():
    vals = randn(3, 64, 64)
    t = torch.sparse_bsr_tensor(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), vals, size=(128, 128))
    a = BlockSparseMatrix.from_torch(t)
    assert torch.equal(a.to_dense(), t.to_dense())
    dup = torch.sparse_bsr_tensor(torch.tensor([0, 2, 2]), torch.tensor([1, 1]), vals[:2], size=(128, 128))
    with pytest.raises(LayoutError, match="twice"):
        BlockSparseMatrix.from_torch(dup)
    with pytest.raises(InputError, match="sparse_bsr"):
        BlockSparseMatrix.from_torch(randn(128, 128))
    with pytest.raises(InputError, match="multiple of the block"):
        rand_matrix(200, 128, 64).to_torch()


def test_transpose_and_type_rules():
    a = rand_matrix(200, 136, 64)
    at = a.t()
    assert at.shape == (136, 200) and torch.equal(at.to_dense(), a.to_dense().t())
    assert at.t().layout == a.layout and torch.equal(at.t().values, a.values)
    assert at.layout is a.layout.transpose()
    with pytest.raises(AttributeError):
        a.values = a.values
    with pytest.raises(InputError, match=r"\[nnz, block_m, block_n\]"):
        BlockSparseMatrix(a.values[1:], a.layout)
    with pytest.raises(InputError, match="contiguous"):
        BlockSparseMatrix(a.values.transpose(1, 2), a.layout)
    heads = BlockSparseLayout.from_block_mask(torch.ones(2, 2, 2, dtype=torch.bool), 128, 128, 64, 64)
    with pytest.raises(LayoutError, match="one"):
        BlockSparseMatrix(torch.zeros(8, 64, 64), heads)
    ruled = BlockSparseLayout.causal(128, block_m=64, block_n=64)
    with pytest.raises(LayoutError, match="rule"):
        BlockSparseMatrix(torch.zeros(ruled.nnz, 64, 64), ruled)
    with pytest.raises(LayoutError, match="BlockSparseLayout"):
        BlockSparseMatrix(torch.zeros(1, 64, 64), "layout")


# -- values against float64 ----------------------------------------------------------------------------------------

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k,n,block", [(256, 256, 64, 128), (200, 136, 24, 64), (64, 512, 8, 64)])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_bsr_matmul_values(dtype, m, k, n, block, out_dtype):
    a = rand_matrix(m, k, block, dtype, seed=m + k)
    b = randn(k, n, dtype=dtype, seed=n)
    y = bsr_matmul(a, b, out_dtype=out_dtype)
    assert y.dtype == (out_dtype or dtype) and y.shape == (m, n)
    ref = a.to_dense().double() @ b.double()
    assert relative_error(y, ref) <= TOL[dtype]
    bt = randn(m, n, dtype=dtype, seed=n + 1)
    yt = bsr_matmul(a, bt, transpose_a=True)
    assert yt.shape == (k, n) and relative_error(yt, a.to_dense().double().t() @ bt.double()) <= TOL[dtype]


def test_bsr_matmul_alpha_beta_bias_out_and_torch_input():
    a = rand_matrix(256, 128, 64, torch.float16, seed=3)
    b = randn(128, 32, seed=4)
    ref = a.to_dense().double() @ b.double()
    c0 = randn(256, 32, dtype=torch.float32, seed=5)
    out = c0.clone()
    bias = randn(32, dtype=torch.float32, seed=6)
    got = bsr_matmul(a, b, alpha=0.5, beta=-2.0, out=out, bias=bias)
    assert got is out
    assert relative_error(out, 0.5 * ref - 2.0 * c0.double() + bias.double()) <= 1e-3
    y = bsr_matmul(a.to_torch(), b)
    assert relative_error(y, ref) <= 1e-2
    assert relative_error(a @ b, ref) <= 1e-2
    empty = BlockSparseMatrix.from_dense(torch.zeros(128, 128, dtype=torch.float16), 64)
    assert empty.nnz == 0
    assert torch.equal(bsr_matmul(empty, b, bias=bias.half()), bias.half().expand(128, 32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k,n,block", [(256, 64, 256, 128), (200, 40, 136, 64)])
def test_sampled_matmul_values(dtype, m, k, n, block):
    gen = torch.Generator().manual_seed(7)
    lay = BlockSparseLayout.from_block_mask(rand_mask(-(-m // block), -(-n // block), 0.4, gen), m, n, block,
                                            block)
    a, b = randn(m, k, dtype=dtype, seed=8), randn(k, n, dtype=dtype, seed=9)
    s = sampled_matmul(a, b, lay, alpha=2.0, out_dtype=torch.float32)
    assert isinstance(s, BlockSparseMatrix) and s.layout == lay and s.dtype == torch.float32
    full = 2.0 * a.double() @ b.double()
    keep = lay.to_element_mask()[0]
    assert relative_error(s.to_dense(), torch.where(keep, full, 0)) <= TOL[dtype]
    dense_pad = BlockSparseMatrix.from_dense(torch.where(keep, full, 0).float(), block, mask=lay.to_dense_mask()[0])
    assert relative_error(s.values, dense_pad.values) <= TOL[dtype]   # zeros past the edge too


# -- autograd against float64 dense autograd -------------------------------------------------------------------

def _grads(fn, *leaves):
    for t in leaves:
        t.grad = None
    fn().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("m,k,n,block", [(256, 128, 64, 64), (200, 136, 24, 64)])
def test_bsr_matmul_autograd(transpose, m, k, n, block):
    a = rand_matrix(m, k, block, seed=11)
    vals = a.values.clone().requires_grad_()
    b = randn(k if not transpose else m, n, seed=12).requires_grad_()
    bias = randn(n, dtype=torch.float32, seed=13).requires_grad_()
    w = randn(k if transpose else m, n, dtype=torch.float64, seed=14)
    dv, db, dbias = _grads(lambda: (bsr_matmul(BlockSparseMatrix(vals, a.layout), b, bias=bias,
                                               out_dtype=torch.float32, alpha=0.7, transpose_a=transpose)
                                    .double() * w).sum(), vals, b, bias)
    vd, bd, biasd = (t.detach().double().requires_grad_() for t in (vals, b, bias))
    ad = BlockSparseMatrix(vd, a.layout).to_dense()
    rv, rb, rbias = _grads(lambda: ((0.7 * (ad.t() if transpose else ad) @ bd + biasd) * w).sum(), vd, bd, biasd)
    assert relative_error(dv, rv) <= 1e-2 and relative_error(db, rb) <= 1e-2 and relative_error(dbias, rbias) <= 1e-6
    assert dv.dtype == vals.dtype and db.dtype == b.dtype


@pytest.mark.parametrize("m,k,n,block", [(256, 64, 128, 64), (200, 40, 136, 64)])
def test_sampled_matmul_autograd(m, k, n, block):
    gen = torch.Generator().manual_seed(15)
    lay = BlockSparseLayout.from_block_mask(rand_mask(-(-m // block), -(-n // block), 0.5, gen), m, n, block, block)
    a, b = randn(m, k, seed=16).requires_grad_(), randn(k, n, seed=17).requires_grad_()
    w = randn(lay.nnz, block, block, dtype=torch.float64, seed=18)
    da, db = _grads(lambda: (sampled_matmul(a, b, lay, alpha=1.5).values.double() * w).sum(), a, b)
    ad, bd = (t.detach().double().requires_grad_() for t in (a, b))
    from blackwell_sparsek.reference import sampled_matmul_reference
    ra, rb = _grads(lambda: (1.5 * sampled_matmul_reference(ad, bd, lay) * w).sum(), ad, bd)
    assert relative_error(da, ra) <= 1e-2 and relative_error(db, rb) <= 1e-2


def test_sparse_linear_layer_step():
    """A block-sparse linear layer y = x·Wᵀ + bias as bsr_matmul(W, xᵀ) vs dense: one forward and backward."""
    w = rand_matrix(128, 64, 64, seed=19)
    wv = w.values.clone().requires_grad_()
    x = randn(64, 32, seed=20).requires_grad_()  # [in, batch]
    y = bsr_matmul(BlockSparseMatrix(wv, w.layout), x, out_dtype=torch.float32)
    y.square().sum().backward()
    wd = BlockSparseMatrix(wv.detach().double().requires_grad_(), w.layout)
    xd = x.detach().double().requires_grad_()
    (wd.to_dense() @ xd).square().sum().backward()
    assert relative_error(wv.grad, wd.values.grad) <= 1e-2 and relative_error(x.grad, xd.grad) <= 1e-2


# -- every rejected input -----------------------------------------------------------------------------------------

def _b_and_overlapping_out(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """b's values as rows 0..127 of one buffer, and a [128, 64] output on its rows 64..191 (half over b)."""
    buf = torch.empty(192, 64, dtype=b.dtype)
    buf[:128] = b
    return buf[:128], buf[64:]


def test_out_beside_b_in_one_buffer():
    """out and b as disjoint slices of one buffer: nothing in common, so the product runs (and is right)."""
    a = rand_matrix(128, 128, 64, seed=23)
    buf = randn(256, 64, seed=24)
    b, out = buf[:128], buf[128:]
    got = bsr_matmul(a, b, out=out)
    assert got is out
    assert relative_error(out, a.to_dense().double() @ b.double()) <= 1e-2


def _bad_matmul_cases():
    a = rand_matrix(128, 128, 64, seed=21)
    b = randn(128, 64, seed=22)
    a32 = rand_matrix(128, 128, 64, torch.float32, seed=21)
    a96 = BlockSparseMatrix.from_dense(randn(96, 96), 32)
    a_odd_k = BlockSparseMatrix.from_dense(randn(128, 100), 64)
    return [
        ("a-type", lambda: bsr_matmul(randn(128, 128), b), InputError, "BlockSparseMatrix"),
        ("values-dtype", lambda: bsr_matmul(a32, b), InputError, "float16"),
        ("b-dtype", lambda: bsr_matmul(a, b.float()), InputError, "float16"),
        ("mixed-dtype", lambda: bsr_matmul(a, b.bfloat16()), InputError, "float16"),
        ("b-shape", lambda: bsr_matmul(a, randn(64, 64)), InputError, r"\[K, N\]"),
        ("b-3d", lambda: bsr_matmul(a, randn(1, 128, 64)), InputError, "2-D"),
        ("b-stride", lambda: bsr_matmul(a, randn(64, 128).t()), InputError, "contiguous"),
        ("b-align-n", lambda: bsr_matmul(a, randn(128, 12)), InputError, "multiple of 8"),
        ("b-offset", lambda: bsr_matmul(a, randn(129 * 64)[4:4 + 128 * 64].view(128, 64)), InputError, "aligned"),
        ("b-sparse", lambda: bsr_matmul(a, b.to_sparse()), InputError, "dense"),
        ("k-align", lambda: bsr_matmul(a_odd_k, randn(100, 64)), InputError, "multiple of 8"),
        ("block-32", lambda: bsr_matmul(a96, randn(96, 64)), LayoutError, "64x64, 128x128"),
        ("out-dtype", lambda: bsr_matmul(a, b, out_dtype=torch.float64), InputError, "out_dtype"),
        ("out-dtype-cross", lambda: bsr_matmul(a, b, out_dtype=torch.bfloat16), InputError, "operands' dtype"),
        ("out-cross", lambda: bsr_matmul(a, b, out=torch.empty(128, 64, dtype=torch.bfloat16)), InputError,
         "out's dtype"),
        ("beta-no-out", lambda: bsr_matmul(a, b, beta=1.0), InputError, "out="),
        ("alpha-nan", lambda: bsr_matmul(a, b, alpha=float("nan")), InputError, "finite"),
        ("alpha-type", lambda: bsr_matmul(a, b, alpha="1"), InputError, "finite"),
        ("out-shape", lambda: bsr_matmul(a, b, out=torch.empty(64, 64, dtype=torch.float16)), InputError, "out"),
        ("out-vs-dtype", lambda: bsr_matmul(a, b, out=torch.empty(128, 64), out_dtype=torch.float16), InputError,
         "out_dtype"),
        ("out-alias", lambda: bsr_matmul(a, b, out=b), InputError, "shares memory"),
        ("out-overlap", lambda: (lambda bb, oo: bsr_matmul(a, bb, out=oo))(*_b_and_overlapping_out(b)), InputError,
         "shares memory"),
        ("out-grad", lambda: bsr_matmul(BlockSparseMatrix(a.values.clone().requires_grad_(), a.layout), b,
                                        out=torch.empty(128, 64, dtype=torch.float16)), InputError, "gradients"),
        ("bias-dtype", lambda: bsr_matmul(a, b, bias=torch.zeros(64)), InputError, "output dtype"),
        ("bias-shape", lambda: bsr_matmul(a, b, bias=torch.zeros(32, dtype=torch.float16)), InputError, r"\[N\]"),
        ("bias-2d", lambda: bsr_matmul(a, b, bias=torch.zeros(1, 64, dtype=torch.float16)), InputError, "1-D"),
        ("transpose-type", lambda: bsr_matmul(a, b, transpose_a=1), InputError, "bool"),
        ("torch-grad", lambda: bsr_matmul(a.to_torch().requires_grad_(), b), InputError, "from_torch"),
    ]


@pytest.mark.parametrize("case", _bad_matmul_cases(), ids=lambda c: c[0])
def test_bsr_matmul_rejects(case):
    _, fn, err, msg = case
    with pytest.raises(err, match=msg):
        fn()


def test_sampled_matmul_rejects():
    lay = BlockSparseLayout.from_block_mask(torch.ones(2, 2, dtype=torch.bool), 128, 128, 64, 64)
    a, b = randn(128, 64), randn(64, 128)
    cases = [
        (lambda: sampled_matmul(a.float(), b.float(), lay), InputError, "float16"),
        (lambda: sampled_matmul(a, b.bfloat16(), lay), InputError, "float16"),
        (lambda: sampled_matmul(a, randn(32, 128), lay), InputError, r"\[K, N\]"),
        (lambda: sampled_matmul(randn(128, 12), randn(12, 128), lay), InputError, "multiple of 8"),
        (lambda: sampled_matmul(a, randn(64, 256), lay), LayoutError, "covers"),
        (lambda: sampled_matmul(a, b, BlockSparseLayout.causal(128, block_m=64, block_n=64)), LayoutError, "rule"),
        (lambda: sampled_matmul(a, b, "lay"), LayoutError, "BlockSparseLayout"),
        (lambda: sampled_matmul(a, b, lay, out_dtype=torch.int8), InputError, "out_dtype"),
        (lambda: sampled_matmul(a, b, lay, out_dtype=torch.bfloat16), InputError, "operands' dtype"),
        (lambda: sampled_matmul(a, b, lay, alpha=float("inf")), InputError, "finite"),
        (lambda: sampled_matmul(a.t(), b, lay), InputError, "contiguous"),
    ]
    for fn, err, msg in cases:
        with pytest.raises(err, match=msg):
            fn()


def test_raw_ops_validate_hand_made_layout_tensors():
    a = BlockSparseMatrix.from_dense(randn(128, 128, seed=23), 64)
    assert a.nnz == 4
    b = randn(128, 64, seed=24)
    lay = a.layout
    rp, ci, bk = lay.row_ptr.clone(), lay.col_idx.clone(), lay.block_kind.clone()
    geom = G._geom(lay)
    y = torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, ci, bk, b, None, geom, 1.0, False, torch.float16)
    assert relative_error(y, a.to_dense().double() @ b.double()) <= 1e-2
    bad = ci.clone()
    bad[0, 0] = 7
    with pytest.raises(LayoutError, match="col_idx"):
        torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, bad, bk, b, None, geom, 1.0, False, torch.float16)
    with pytest.raises(LayoutError, match="nnz"):
        torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, ci[:, :1], bk[:, :1], b, None, geom[:4] + [1], 1.0,
                                           False, torch.float16)
    with pytest.raises(InputError, match="geom"):
        torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, ci, bk, b, None, geom[:4], 1.0, False, torch.float16)
    with pytest.raises(LayoutError, match="int32"):
        torch.ops.blackwell_sparsek.sdd(b.t().contiguous(), b, rp.long(), ci, bk, geom, 1.0, torch.float16)


# -- opcheck and torch.compile ------------------------------------------------------------------------------------

def test_opcheck_cpu():
    a = rand_matrix(128, 128, 64, seed=25)
    lay = a.layout
    idx = (lay.row_ptr, lay.col_idx, lay.block_kind)
    vals = a.values.clone().requires_grad_()
    b = randn(128, 64, seed=26).requires_grad_()
    bias = randn(64, seed=27).requires_grad_()
    geom = G._geom(lay)
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm.default,
                          (vals, *idx, b, bias, geom, 0.5, False, torch.float16))
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm.default,
                          (vals, *idx, b, None, geom, 1.0, True, torch.float32))
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm_out.default,
                          (a.values, *idx, b.detach(), randn(128, 64, dtype=torch.float32), None, geom, 1.0, 0.5,
                           False))
    x, y = randn(128, 32).requires_grad_(), randn(32, 128).requires_grad_()
    torch.library.opcheck(torch.ops.blackwell_sparsek.sdd.default, (x, y, *idx, geom, 1.0, torch.float16))


def test_torch_compile_fullgraph_cpu():
    a = rand_matrix(128, 128, 64, seed=28)
    b = randn(128, 64, seed=29)
    lay = a.layout

    def f(vals, b, x):
        y = bsr_matmul(BlockSparseMatrix(vals, lay), b, out_dtype=torch.float32)
        s = sampled_matmul(x, y.half().t().contiguous(), lay)
        return y, s.values

    x = randn(128, 64, seed=30)
    vals = a.values.clone().requires_grad_()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    y, sv = cf(vals, b, x)
    y0, sv0 = f(vals, b, x)
    assert torch.equal(y, y0) and torch.equal(sv, sv0)
    y.sum().backward()
    assert vals.grad is not None and vals.grad.shape == vals.shape


def test_public_exports():
    assert bsk.bsr_matmul is bsr_matmul and bsk.sampled_matmul is sampled_matmul
    assert bsk.BlockSparseMatrix is BlockSparseMatrix
    assert {"bsr_matmul", "sampled_matmul", "BlockSparseMatrix"} <= set(bsk.__all__)


def test_bench_gemm_plan_and_table(capsys):
    from blackwell_sparsek.bench import gemm as bg
    from blackwell_sparsek.bench.cli import main
    assert main(["bench", "gemm", "--list", "--preset", "full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("headline dsd 8192 8192 8192 128 0.25") for line in lines)
    assert {int(line.split()[2]) for line in lines if line.startswith("sweep")} == {1024, 2048, 4096, 8192, 16384}
    recs = [dict(op="dsd", M=8, K=8, N=8, block=64, density=0.25, peer=p, time_ms=t, tflops=1.0)
            for p, t in (("ours", 1.0), ("cublas-dense", 2.0))]
    assert "2.0" in bg.table(recs)


def test_int32_size_limit(monkeypatch):
    from blackwell_sparsek.ops import _gemm_checks as chk
    monkeypatch.setattr(chk, "INT_LIMIT", 200)
    a = rand_matrix(256, 128, 64, seed=31)
    with pytest.raises(InputError, match="2\\^31"):
        bsr_matmul(a, randn(128, 64))
    with pytest.raises(InputError, match="2\\^31"):
        sampled_matmul(randn(256, 64), randn(64, 128), a.layout)
