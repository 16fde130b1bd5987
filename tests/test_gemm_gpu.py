"""GPU tests of the block-sparse GEMM (issue 27): bsr_matmul (DSD, transposed DSD) and sampled_matmul (SDD),
forward and backward against float64 dense products, fp16/bf16 in, fp16/bf16/fp32 out, alpha/beta/bias, odd row
counts, both block shapes, empty and full block rows, opcheck on CUDA, torch.compile(fullgraph=True), and the
GPU refusing what the CPU refuses.

Skipped without CUDA. Fresh random inputs for every check; outputs poisoned with NaN (BSK_POISON) before the
kernels run; the reference fallback is an error here (the kernels must run).
"""
from __future__ import annotations

import pytest
import torch

from blackwell_sparsek import BlockSparseLayout, BlockSparseMatrix, InputError, LayoutError, bsr_matmul, \
    sampled_matmul
from blackwell_sparsek.ops import gemm as G
from blackwell_sparsek.reference import relative_error, sampled_matmul_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)"),
              pytest.mark.filterwarnings("error:blackwell_sparsek:RuntimeWarning")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 1e-2}
GTOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
_SEED = [2700]



def _gen():
    _SEED[0] += 1
    return torch.Generator(device="cuda").manual_seed(_SEED[0])


def _rand(*shape, dtype=torch.float16):
    return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=_gen()).to(dtype)


def _mask(nq: int, nk: int, density: float) -> torch.Tensor:
    m = torch.rand(nq, nk, device="cuda", generator=_gen()) < density
    if nq > 2:
        m[0] = False   # an empty block row
        m[-1] = True   # a full one
    return m


def _matrix(m: int, k: int, block: int, dtype, density: float = 0.3) -> BlockSparseMatrix:
    return BlockSparseMatrix.from_dense(_rand(m, k, dtype=dtype), block,
                                        mask=_mask(-(-m // block), -(-k // block), density))


SHAPES = [(1024, 1024, 1024, 128), (1024, 768, 512, 64), (1000, 512, 264, 128), (777, 384, 136, 64),
          (8, 128, 8, 64), (4096, 2048, 1024, 128)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k,n,block", SHAPES)
def test_bsr_matmul_forward(dtype, m, k, n, block):
    a = _matrix(m, k, block, dtype)
    b = _rand(k, n, dtype=dtype)
    for out_dtype in (None, torch.float32):
        y = bsr_matmul(a, b, out_dtype=out_dtype)
        assert y.dtype == (out_dtype or dtype)
        assert relative_error(y, a.to_dense().double() @ b.double()) <= TOL[dtype]
    bt = _rand(m, n, dtype=dtype)
    yt = bsr_matmul(a, bt, transpose_a=True)
    assert relative_error(yt, a.to_dense().double().t() @ bt.double()) <= TOL[dtype]


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_bsr_matmul_alpha_beta_bias(out_dtype):
    dtype = torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float16
    a = _matrix(1000, 512, 128, dtype)
    b = _rand(512, 256, dtype=dtype)
    c0 = _rand(1000, 256, dtype=out_dtype)
    bias = _rand(256, dtype=out_dtype)
    out = c0.clone()
    bsr_matmul(a, b, alpha=0.75, beta=-1.5, out=out, bias=bias)
    ref = 0.75 * (a.to_dense().double() @ b.double()) - 1.5 * c0.double() + bias.double()
    assert relative_error(out, ref) <= TOL[dtype]
    y = bsr_matmul(a, b, alpha=2.0, bias=bias, out_dtype=out_dtype)
    assert relative_error(y, 2.0 * (a.to_dense().double() @ b.double()) + bias.double()) <= TOL[dtype]


def test_bsr_matmul_empty_layout_and_torch_bsr():
    empty = BlockSparseMatrix.from_dense(torch.zeros(512, 256, device="cuda", dtype=torch.float16), 64)
    assert empty.nnz == 0
    b = _rand(256, 128)
    bias = _rand(128)
    assert torch.equal(bsr_matmul(empty, b, bias=bias), bias.expand(512, 128))
    a = _matrix(512, 256, 64, torch.float16)
    y = bsr_matmul(a.to_torch(), b)
    assert relative_error(y, a.to_dense().double() @ b.double()) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k,n,block", SHAPES)
def test_sampled_matmul_forward(dtype, m, k, n, block):
    n = max(n, block)
    lay = BlockSparseLayout.from_block_mask(_mask(-(-m // block), -(-n // block), 0.3), m, n, block, block)
    a, b = _rand(m, k, dtype=dtype), _rand(k, n, dtype=dtype)
    for out_dtype in (None, torch.float32):
        s = sampled_matmul(a, b, lay, alpha=0.5, out_dtype=out_dtype)
        assert s.values.dtype == (out_dtype or dtype)
        ref = 0.5 * sampled_matmul_reference(a, b, lay)      # zero past the edge: the padding is checked too
        assert relative_error(s.values, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("m,k,n,block", [(1024, 512, 256, 128), (777, 384, 136, 64)])
def test_bsr_matmul_backward(dtype, transpose, m, k, n, block):
    a = _matrix(m, k, block, dtype, 0.4)
    vals = a.values.clone().requires_grad_()
    b = _rand(m if transpose else k, n, dtype=dtype).requires_grad_()
    bias = _rand(n, dtype=torch.float32).requires_grad_()
    g = _rand(k if transpose else m, n, dtype=torch.float32)
    y = bsr_matmul(BlockSparseMatrix(vals, a.layout), b, bias=bias, out_dtype=torch.float32, alpha=1.25,
                   transpose_a=transpose)
    y.backward(g)
    vd, bd, biasd = (t.detach().double().requires_grad_() for t in (vals, b, bias))
    ad = BlockSparseMatrix(vd, a.layout).to_dense()
    (1.25 * ((ad.t() if transpose else ad) @ bd) + biasd).backward(g.double())
    assert relative_error(vals.grad, vd.grad) <= GTOL[dtype]
    assert relative_error(b.grad, bd.grad) <= GTOL[dtype]
    assert relative_error(bias.grad, biasd.grad) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k,n,block", [(1024, 512, 1024, 128), (777, 136, 392, 64)])
def test_sampled_matmul_backward(dtype, m, k, n, block):
    lay = BlockSparseLayout.from_block_mask(_mask(-(-m // block), -(-n // block), 0.4), m, n, block, block)
    a, b = _rand(m, k, dtype=dtype).requires_grad_(), _rand(k, n, dtype=dtype).requires_grad_()
    g = _rand(lay.nnz, block, block, dtype=torch.float32)
    sampled_matmul(a, b, lay, alpha=0.5).values.backward(g.to(dtype))
    ad, bd = (t.detach().double().requires_grad_() for t in (a, b))
    (0.5 * sampled_matmul_reference(ad, bd, lay)).backward(g.to(dtype).double())
    assert relative_error(a.grad, ad.grad) <= GTOL[dtype]
    assert relative_error(b.grad, bd.grad) <= GTOL[dtype]


def test_opcheck_cuda():
    a = _matrix(512, 256, 64, torch.float16, 0.5)
    lay = a.layout
    idx = (lay.row_ptr, lay.col_idx, lay.block_kind)
    geom = G._geom(lay)
    vals = a.values.clone().requires_grad_()
    b = _rand(256, 128).requires_grad_()
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm.default,
                          (vals, *idx, b, _rand(128).requires_grad_(), geom, 0.5, False, torch.float16))
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm.default,
                          (vals, *idx, _rand(512, 128).requires_grad_(), None, geom, 1.0, True, torch.float32))
    torch.library.opcheck(torch.ops.blackwell_sparsek.bsr_mm_out.default,
                          (a.values, *idx, b.detach(), _rand(512, 128, dtype=torch.float32), None, geom, 1.0, 0.5,
                           False))
    x, w = _rand(512, 64).requires_grad_(), _rand(64, 256).requires_grad_()
    torch.library.opcheck(torch.ops.blackwell_sparsek.sdd.default, (x, w, *idx, geom, 1.0, torch.float16))


def test_torch_compile_fullgraph_linear_layer():
    """A block-sparse linear layer y = W·x + bias (W [out, in] block-sparse), compiled with fullgraph, fwd + bwd."""
    w = _matrix(1024, 512, 128, torch.float16, 0.25)
    lay = w.layout
    wv = w.values.clone().requires_grad_()
    bias = _rand(256).requires_grad_()

    def f(vals, x, bias):
        y = bsr_matmul(BlockSparseMatrix(vals, lay), x, bias=bias)
        s = sampled_matmul(y, x.t().contiguous(), lay, alpha=1.0 / 64)   # scaled: gradients stay in fp16 range
        return (s.values.float() * wgt).sum() + y.float().sum()

    x = _rand(512, 256).requires_grad_()
    wgt = _rand(lay.nnz, 128, 128, dtype=torch.float32)
    cf = torch.compile(f, fullgraph=True)
    loss = cf(wv, x, bias)
    loss.backward()
    grads = [t.grad.clone() for t in (wv, x, bias)]
    for t in (wv, x, bias):
        t.grad = None
    loss0 = f(wv, x, bias)
    loss0.backward()
    assert relative_error(loss, loss0.double()) <= 1e-3
    for g1, t in zip(grads, (wv, x, bias)):
        assert torch.isfinite(g1).all()
        assert relative_error(g1, t.grad.double()) <= 1e-3


def test_gpu_refuses_what_cpu_refuses():
    a = _matrix(256, 256, 64, torch.float16)
    b = _rand(256, 64)
    cases = [
        (lambda: bsr_matmul(a, b.float()), InputError, "float16"),
        (lambda: bsr_matmul(a, _rand(256, 12)), InputError, "multiple of 8"),
        (lambda: bsr_matmul(a, _rand(64, 256).t()), InputError, "contiguous"),
        (lambda: bsr_matmul(a, b.cpu()), InputError, "cpu"),
        (lambda: bsr_matmul(a, b, beta=1.0), InputError, "out="),
        (lambda: bsr_matmul(a, b, bias=_rand(64, dtype=torch.float32)), InputError, "output dtype"),
        (lambda: bsr_matmul(BlockSparseMatrix.from_dense(_rand(96, 96), 32), _rand(96, 64)), LayoutError, "64x64"),
        (lambda: sampled_matmul(_rand(256, 64), _rand(64, 256), a.layout, out_dtype=torch.int8), InputError,
         "out_dtype"),
    ]
    for fn, err, msg in cases:
        with pytest.raises(err, match=msg):
            fn()


def test_raw_op_rebuilds_hand_made_layout_on_cuda():
    a = _matrix(512, 256, 128, torch.float16, 0.5)
    b = _rand(256, 128)
    lay = a.layout
    rp, ci, bk = (t.clone() for t in (lay.row_ptr, lay.col_idx, lay.block_kind))
    y = torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, ci, bk, b, None, G._geom(lay), 1.0, False, torch.float16)
    assert relative_error(y, a.to_dense().double() @ b.double()) <= 1e-2
    bad = ci.clone()
    bad[0, -1] = 99
    with pytest.raises(LayoutError):
        torch.ops.blackwell_sparsek.bsr_mm(a.values, rp, bad, bk, b, None, G._geom(lay), 1.0, False, torch.float16)
