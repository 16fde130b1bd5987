"""GPU tests of the BSR GEMM kernels (ops/_gemm_cuda.py): dsd, dsd_t and sdd against float64 references.

Skipped without CUDA. Random layouts with empty block rows, full rows and odd sizes (M, and K of dsd/dsd_t, not
multiples of the block), both block sides, fp16/bf16 in, fp16/bf16/fp32 out, alpha/beta/bias; outputs poisoned
with NaN before each launch (beta == 0 must never read them), the padding of edge value blocks poisoned too (it
must never reach the result); ‖out - ref‖ / ‖ref‖ <= 1e-2 (fp16) / 2e-2 (bf16).
"""
from __future__ import annotations

import pytest
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig
from blackwell_sparsek.ops import _gemm_cuda as g

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)")]

L = bsk.BlockSparseLayout
_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
_SEED = [1234]


def _gen() -> torch.Generator:
    _SEED[0] += 1
    return torch.Generator(device="cuda").manual_seed(_SEED[0])


def _layout(m: int, k: int, bm: int, bk: int, density: float, *, empty_rows: int = 1, full_row: bool = True):
    """A random layout over (m, k): some rows empty, one row full, the rest random at ``density``."""
    nq, nk = -(-m // bm), -(-k // bk)
    gen = torch.Generator().manual_seed(_SEED[0])
    mask = torch.rand(nq, nk, generator=gen) < density
    if full_row:
        mask[0] = True
    for r in range(min(empty_rows, nq - 1)):
        mask[nq - 1 - r] = False
    if nk > 1:
        mask[nq // 2, nk - 1] = True  # the partial last block column is listed somewhere
    return L.from_block_mask(mask, seq_q=m, seq_k=k, block_m=bm, block_n=bk, device="cuda")


def _values(lay, dtype) -> torch.Tensor:
    """Random block values; the parts of edge blocks past M or K poisoned with NaN (they must be ignored)."""
    bm, bk = lay.block_m, lay.block_n
    v = torch.randn(lay.nnz, bm, bk, device="cuda", dtype=torch.float32, generator=_gen()).to(dtype)
    rows = g_block_rows(lay)
    cols = lay.col_idx[0, :lay.nnz].long()
    r_ok = (rows[:, None] * bm + torch.arange(bm, device="cuda")[None]) < lay.seq_q   # [nnz, bm]
    c_ok = (cols[:, None] * bk + torch.arange(bk, device="cuda")[None]) < lay.seq_k   # [nnz, bk]
    ok = r_ok[:, :, None] & c_ok[:, None, :]
    return v.masked_fill(~ok, float("nan"))


def g_block_rows(lay) -> torch.Tensor:
    from blackwell_sparsek.layout.matrix import block_rows
    return block_rows(lay)[0, :lay.nnz]


def _dense(lay, values) -> torch.Tensor:
    """A as a float64 dense [M, K] matrix (padding dropped)."""
    bm, bk = lay.block_m, lay.block_n
    nq, nk = lay.n_qblocks, lay.n_kblocks
    full = torch.zeros(nq, bm, nk, bk, device="cuda", dtype=torch.float64)
    rows, cols = g_block_rows(lay), lay.col_idx[0, :lay.nnz].long()
    full[rows, :, cols, :] = values.double()
    return full.reshape(nq * bm, nk * bk)[:lay.seq_q, :lay.seq_k].nan_to_num(0.0)


def _dsd_problem(m: int, k: int, n: int, transpose: bool, empty_rows: int):
    """128x128 blocks at 30 % over (m, k) with empty rows and a full one, fp16 values, b, and op(A)·b in float64."""
    lay = _layout(m, k, 128, 128, 0.3, empty_rows=empty_rows)
    vals = _values(lay, torch.float16)
    b = torch.randn(m if transpose else k, n, device="cuda", generator=_gen()).half()
    a = _dense(lay, vals)
    return lay, vals, b, (a.T if transpose else a) @ b.double()


def _rel(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))


CASES = [  # m, k, n, bm, bk, density
    (1000, 1100, 264, 128, 128, 0.3),
    (515, 700, 136, 64, 64, 0.4),
    (640, 517, 200, 64, 128, 0.35),
    (777, 384, 72, 128, 64, 0.5),
]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_dsd_fp16(case, transpose):
    m, k, n, bm, bk, dens = case
    lay = _layout(m, k, bm, bk, dens)
    vals = _values(lay, torch.float16)
    rows = k if transpose else m
    b = torch.randn(m if transpose else k, n, device="cuda", generator=_gen()).half()
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.float16)
    cfg = None
    if bm == bk == 128:  # the widest N tile too (the default choice narrows it for these few rows)
        cfg = BsrGemmConfig(op="dsd_t" if transpose else "dsd", tile_n=256, stages=4)
    g.dsd(vals, lay, b, out, transpose=transpose, config=cfg)
    a = _dense(lay, vals)
    ref = (a.T if transpose else a) @ b.double()
    assert not out.isnan().any()
    assert _rel(out, ref) <= 1e-2
    # rows of output blocks nobody lists are exactly 0
    empty = lay.transpose().row_counts()[0] == 0 if transpose else lay.row_counts()[0] == 0
    blk = lay.block_n if transpose else lay.block_m
    idx = torch.nonzero(empty).flatten()
    for r in idx.tolist():
        assert out[r * blk:(r + 1) * blk].abs().max() == 0


@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("transpose", [False, True])
def test_dsd_alpha_beta_bias(dtype, out_dtype, transpose):
    m, k, n, bm, bk = 900, 1000, 328, 128, 128
    lay = _layout(m, k, bm, bk, 0.3, empty_rows=2)
    vals = _values(lay, dtype)
    rows = k if transpose else m
    b = torch.randn(m if transpose else k, n, device="cuda", generator=_gen()).to(dtype)
    c0 = torch.randn(rows, n, device="cuda", generator=_gen()).to(out_dtype)
    bias = torch.randn(n, device="cuda", generator=_gen())
    out = c0.clone()
    g.dsd(vals, lay, b, out, transpose=transpose, alpha=0.75, beta=-0.5, bias=bias)
    a = _dense(lay, vals)
    ref = 0.75 * ((a.T if transpose else a) @ b.double()) - 0.5 * c0.double() + bias.double()
    assert _rel(out, ref) <= _TOL[dtype]


def test_dsd_empty_layout_and_tile_override():
    """No blocks at all: out = beta * out + bias; and a forced 64-wide N tile gives the same as the default."""
    m, k, n = 300, 400, 64
    lay = L.from_block_mask(torch.zeros(3, 4, dtype=torch.bool), seq_q=m, seq_k=k, device="cuda")
    vals = torch.zeros(0, 128, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", generator=_gen()).half()
    c0 = torch.randn(m, n, device="cuda", generator=_gen()).half()
    bias = torch.randn(n, device="cuda", generator=_gen()).half()
    out = c0.clone()
    g.dsd(vals, lay, b, out, beta=2.0, bias=bias)
    assert _rel(out, 2.0 * c0.double() + bias.double()) <= 1e-2
    lay = _layout(1024, 1024, 128, 128, 0.3)
    vals = _values(lay, torch.float16)
    b = torch.randn(1024, 512, device="cuda", generator=_gen()).half()
    o1 = torch.full((1024, 512), float("nan"), device="cuda", dtype=torch.float16)
    o2 = o1.clone()
    g.dsd(vals, lay, b, o1)
    g.dsd(vals, lay, b, o2, config=BsrGemmConfig(tile_n=64, stages=6))
    assert _rel(o2, o1.double()) <= 1e-3


@pytest.mark.parametrize("case", [(1000, 1000, 264, 128, 128), (515, 136, 640, 64, 64), (384, 200, 520, 64, 128),
                                  (700, 72, 250 // 8 * 8, 128, 64)])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float32)])
def test_sdd(case, dtype, out_dtype):
    m, n, k, bm, bn = case
    lay = _layout(m, n, bm, bn, 0.35)
    a = torch.randn(m, k, device="cuda", generator=_gen()).to(dtype)
    b = torch.randn(k, n, device="cuda", generator=_gen()).to(dtype)
    out = torch.full((lay.nnz, bm, bn), float("nan"), device="cuda", dtype=out_dtype)
    g.sdd(a, b, lay, out, alpha=1.5)
    full = 1.5 * (a.double() @ b.double())
    nq, nk = lay.n_qblocks, lay.n_kblocks
    pad = torch.zeros(nq * bm, nk * bn, device="cuda", dtype=torch.float64)
    pad[:m, :n] = full
    rows, cols = g_block_rows(lay), lay.col_idx[0, :lay.nnz].long()
    ref = pad.reshape(nq, bm, nk, bn)[rows, :, cols, :]  # [nnz, bm, bn], padding 0
    assert not out.isnan().any()
    assert _rel(out, ref) <= _TOL[dtype]


# Schedule variants, each against float64: CTA clusters sharing the A tile (multicast) and the TMA-store epilogue.
VARIANTS = [(2, "direct"), (1, "tma"), (2, "tma"), (4, "direct")]


def _variant(op, cluster, epi, dtype=torch.float16, out_dtype=torch.float16, block=(128, 128), tile_n=None):
    from blackwell_sparsek.families.bsr_gemm import Epilogue, OutDType, max_stages
    from blackwell_sparsek.jit.spec import DType
    dt = DType.FP16 if dtype == torch.float16 else DType.BF16
    ot = {torch.float16: OutDType.FP16, torch.bfloat16: OutDType.BF16, torch.float32: OutDType.FP32}[out_dtype]
    bm, bn = block
    tn = (tile_n or bn) if op == "sdd" else (tile_n or 256)
    st = max_stages(g.Op(op), dt, bm, bn, tn, epilogue=Epilogue(epi), out_dtype=ot)
    return BsrGemmConfig(op=op, dtype=dt, out_dtype=ot, block_m=bm, block_n=bn, tile_n=tn, stages=st,
                         cluster=cluster, epilogue=epi).validate()


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("cluster,epi", VARIANTS)
def test_dsd_schedule_variants(cluster, epi, transpose):
    """Odd sizes, an odd number of N tiles (the last cluster's partner tiles lie past N), empty rows, alpha/beta/
    bias, fp16 and fp32 out."""
    m, k, n = 1000, 1100, 520  # 3 N tiles of 256 (odd: the 4th is a pair's partner past N)
    lay, vals, b, ref0 = _dsd_problem(m, k, n, transpose, empty_rows=2)
    rows = k if transpose else m
    op = "dsd_t" if transpose else "dsd"
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.float16)
    g.dsd(vals, lay, b, out, transpose=transpose, config=_variant(op, cluster, epi))
    assert not out.isnan().any()
    assert _rel(out, ref0) <= 1e-2
    c0 = torch.randn(rows, n, device="cuda", generator=_gen())
    bias = torch.randn(n, device="cuda", generator=_gen())
    out = c0.clone()
    g.dsd(vals, lay, b, out, transpose=transpose, alpha=0.5, beta=-1.5, bias=bias,
          config=_variant(op, cluster, epi, out_dtype=torch.float32))
    assert _rel(out, 0.5 * ref0 - 1.5 * c0.double() + bias.double()) <= 1e-2


@pytest.mark.parametrize("m,k,n,tile_n,cluster,transpose", [
    (3200, 1024, 1024, 128, 1, False),  # 25 rows x 8 tiles = 200 items: a full wave, a partial backward one
    (1024, 8192, 384, 64, 1, True),     # 64 x 6 = 384: forward, backward, partial forward
    (8192, 1024, 512, 128, 2, False),   # pairs: 64 x 2 = 128 pair items over 66 clusters
    (8192, 1024, 1024, 64, 1, False),   # 1024 items, ~8 waves: all forward
])
def test_dsd_waves(m, k, n, tile_n, cluster, transpose):
    """More items than persistent CTAs, rows of unequal length: every wave's items (up to 3 waves, odd ones walked
    backwards; partial last waves) run exactly once."""
    lay, vals, b, ref = _dsd_problem(m, k, n, transpose, empty_rows=3)
    rows = k if transpose else m
    op = "dsd_t" if transpose else "dsd"
    cfg = BsrGemmConfig(op=op, tile_n=tile_n, stages=4, cluster=cluster).validate()
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.float16)
    g.dsd(vals, lay, b, out, transpose=transpose, config=cfg)
    assert not out.isnan().any()
    assert _rel(out, ref) <= 1e-2


@pytest.mark.parametrize("cluster,epi", VARIANTS)
def test_dsd_variants_64_blocks(cluster, epi):
    """64x64 blocks: the 64-row tile split by columns between the warpgroups (each 64 x tile_n / 2)."""
    m, k, n = 515, 700, 136
    lay = _layout(m, k, 64, 64, 0.4)
    vals = _values(lay, torch.bfloat16)
    b = torch.randn(k, n, device="cuda", generator=_gen()).bfloat16()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = _variant("dsd", cluster, epi, dtype=torch.bfloat16, out_dtype=torch.bfloat16, block=(64, 64), tile_n=64)
    g.dsd(vals, lay, b, out, config=cfg)
    assert not out.isnan().any()
    assert _rel(out, _dense(lay, vals) @ b.double()) <= 2e-2


@pytest.mark.parametrize("cluster,epi,pair_tile,out_dtype", [
    (2, "direct", False, torch.float16), (1, "tma", False, torch.float16), (2, "tma", False, torch.float16),
    (1, "tma", True, torch.float16), (1, "tma", True, torch.float32)])
@pytest.mark.parametrize("case", [(1000, 1000, 264, 128, 128), (515, 136, 640, 64, 64)])
def test_sdd_schedule_variants(case, cluster, epi, pair_tile, out_dtype):
    """SDD pairs, as CTA pairs or as one tile of two blocks (two blocks of a row, odd rows with a partner slot,
    padding pairs), and the TMA-store epilogue."""
    m, n, k, bm, bn = case
    lay = _layout(m, n, bm, bn, 0.35)
    a = torch.randn(m, k, device="cuda", generator=_gen()).half()
    b = torch.randn(k, n, device="cuda", generator=_gen()).half()
    out = torch.full((lay.nnz, bm, bn), float("nan"), device="cuda", dtype=out_dtype)
    cfg = _variant("sdd", cluster, epi, out_dtype=out_dtype, block=(bm, bn), tile_n=2 * bn if pair_tile else None)
    g.sdd(a, b, lay, out, alpha=1.5, config=cfg)
    full = 1.5 * (a.double() @ b.double())
    nq, nk = lay.n_qblocks, lay.n_kblocks
    pad = torch.zeros(nq * bm, nk * bn, device="cuda", dtype=torch.float64)
    pad[:m, :n] = full
    ref = pad.reshape(nq, bm, nk, bn)[g_block_rows(lay), :, lay.col_idx[0, :lay.nnz].long(), :]
    assert not out.isnan().any()
    assert _rel(out, ref) <= 1e-2
