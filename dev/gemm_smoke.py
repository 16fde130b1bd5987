"""Small BSR GEMM cases for compute-sanitizer (memcheck / racecheck): dsd, dsd_t and sdd at odd sizes with both
block sides, each checked against torch in float64.   compute-sanitizer --tool memcheck python dev/gemm_smoke.py"""
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.layout.matrix import block_rows
from blackwell_sparsek.ops import _gemm_cuda as g

torch.manual_seed(0)
worst = 0.0  # NaN compares False: a NaN result fails below
for (m, k, n, bm, bk) in ((300, 333, 136, 128, 128), (200, 130, 72, 64, 64)):
    mask = torch.rand(-(-m // bm), -(-k // bk)) < 0.5
    mask[-1] = False
    mask[0, -1] = True
    lay = bsk.BlockSparseLayout.from_block_mask(mask, seq_q=m, seq_k=k, block_m=bm, block_n=bk, device="cuda")
    vals = torch.randn(lay.nnz, bm, bk, device="cuda").half()
    full = torch.zeros(lay.n_qblocks, bm, lay.n_kblocks, bk, device="cuda", dtype=torch.float64)
    full[block_rows(lay)[0, :lay.nnz], :, lay.col_idx[0, :lay.nnz].long()] = vals.double()
    A = full.reshape(lay.n_qblocks * bm, -1)[:m, :k]
    for t in (False, True):
        b = torch.randn(m if t else k, n, device="cuda").half()
        out = torch.full((k if t else m, n), float("nan"), device="cuda", dtype=torch.float16)
        g.dsd(vals, lay, b, out, transpose=t)
        ref = (A.T if t else A) @ b.double()
        e = float((out.double() - ref).norm() / ref.norm())
        print(f"dsd{'_t' if t else ''} {m}x{k}x{n} b{bm}x{bk}: rel err {e:.2e}")
        worst = e if (e != e or e > worst) else worst
    n2 = 200
    mask2 = torch.rand(-(-m // bm), -(-n2 // bk)) < 0.5
    lay2 = bsk.BlockSparseLayout.from_block_mask(mask2, seq_q=m, seq_k=n2, block_m=bm, block_n=bk, device="cuda")
    a = torch.randn(m, 264, device="cuda").half()
    b = torch.randn(264, n2, device="cuda").half()
    outv = torch.full((lay2.nnz, bm, bk), float("nan"), device="cuda", dtype=torch.float16)
    g.sdd(a, b, lay2, outv)
    pad = torch.zeros(lay2.n_qblocks * bm, lay2.n_kblocks * bk, device="cuda", dtype=torch.float64)
    pad[:m, :n2] = a.double() @ b.double()
    ref = pad.reshape(lay2.n_qblocks, bm, lay2.n_kblocks, bk)[block_rows(lay2)[0, :lay2.nnz], :,
                                                               lay2.col_idx[0, :lay2.nnz].long()]
    e = float((outv.double() - ref).norm() / ref.norm())
    print(f"sdd {m}x{n2}x264 b{bm}x{bk}: rel err {e:.2e}")
    worst = e if (e != e or e > worst) else worst
torch.cuda.synchronize()
ok = worst < 1e-2
print("worst", worst, "OK" if ok else "FAIL")
raise SystemExit(0 if ok else 1)
