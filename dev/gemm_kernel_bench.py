"""Raw timing of the BSR GEMM kernels (ops/_gemm_cuda.py) against cuBLAS through torch.mm in the same run.

    python dev/gemm_kernel_bench.py [--json PATH] [--txt PATH] [--quick] [--variants] [--schedules]
                                    [--sdd-block 64|128] [--sdd-only]

Cases (fp16 unless named): M = N = K = 8192, 128x128 blocks, 16 listed per block row (25 %):
  DSD, DSD_T (C = Aᵀ·B), SDD (25 % of the output blocks; --sdd-block 64: 64x64 blocks, 32 a block row), DSD at
  N = 1024, and bf16 DSD.
Effective TFLOPS = 2 * M * N * K * density / t. Peers: torch.mm of the same work (dense GEMM with K = 2048,
i.e. K * density) and dense 8192^3 cuBLAS. triton do_bench medians after warm-up; fresh random inputs; each
result checked once against torch.mm of the dense equivalent (rel err printed) before timing.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
from triton.testing import do_bench

import blackwell_sparsek as bsk
from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig
from blackwell_sparsek.layout.matrix import block_rows
from blackwell_sparsek.ops import _gemm_cuda as g

L = bsk.BlockSparseLayout


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=100, rep=400, return_mode="median")  # ms


def dense_of(lay, values) -> torch.Tensor:
    bm, bk = lay.block_m, lay.block_n
    full = torch.zeros(lay.n_qblocks, bm, lay.n_kblocks, bk, device="cuda", dtype=values.dtype)
    full[block_rows(lay)[0, :lay.nnz], :, lay.col_idx[0, :lay.nnz].long(), :] = values
    return full.reshape(lay.n_qblocks * bm, lay.n_kblocks * bk)[:lay.seq_q, :lay.seq_k]


def schedule_variants(cfg: BsrGemmConfig) -> list[BsrGemmConfig]:
    """The default config again, then with CTA pairs / quads and the TMA-store epilogue (deepest ring that fits)."""
    import dataclasses
    from blackwell_sparsek.families.bsr_gemm import Epilogue, max_stages
    out = [cfg]
    combos = [(2, "direct"), (1, "tma"), (2, "tma")] + ([(4, "direct"), (4, "tma")] if cfg.op.value != "sdd" else [])
    if cfg.op.value == "sdd":  # one block a tile (alone or as CTA pairs), and two blocks of a row a tile
        combos = [(cl, epi, cfg.block_n) for cl, epi in [(1, "direct")] + combos] + [(1, "tma", 2 * cfg.block_n)]
    else:
        combos = [(cl, epi, cfg.tile_n) for cl, epi in combos]
    for cl, epi, tn in combos:
        st = max_stages(cfg.op, cfg.dtype, cfg.block_m, cfg.block_n, tn, epilogue=Epilogue(epi),
                        out_dtype=cfg.out_dtype)
        out.append(dataclasses.replace(cfg, cluster=cl, epilogue=Epilogue(epi), stages=st, tile_n=tn).validate())
    return list(dict.fromkeys(out))


def sched_tag(cfg: BsrGemmConfig) -> str:
    return f"c{cfg.cluster} {cfg.epilogue.value} t{cfg.tile_n} s{cfg.stages}"


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--txt")
    ap.add_argument("--quick", action="store_true", help="the fp16 headline cases only")
    ap.add_argument("--variants", action="store_true", help="also time N-tile / stage variants of DSD")
    ap.add_argument("--schedules", action="store_true",
                    help="also time every case with CTA clusters (A multicast) and the TMA-store epilogue, and the "
                         "default once more (the spread between two timings of one kernel)")
    ap.add_argument("--sdd-block", type=int, default=128, help="the SDD case's block side (64 or 128)")
    ap.add_argument("--sdd-only", action="store_true", help="the SDD case only")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    print(f"GPU: {name}", flush=True)
    torch.manual_seed(0)
    S, per_row = 8192, 16
    rows = []

    def record(case, op, dtype, M, N, K, density, ms, cfg, err, peer_ms, dense_ms):
        flops = 2 * M * N * K * density
        r = dict(case=case, op=op, dtype=str(dtype).replace("torch.", ""), M=M, N=N, K=K, density=density,
                 ms=ms, eff_tflops=flops / ms / 1e9, config=cfg, rel_err=err,
                 torch_same_work_ms=peer_ms, torch_same_work_tflops=flops / peer_ms / 1e9,
                 ratio_vs_same_work=peer_ms / ms, dense_cublas_ms=dense_ms,
                 dense_cublas_tflops=2 * S ** 3 / dense_ms / 1e9 if dense_ms else None)
        rows.append(r)
        print(f"{case:28s} {ms * 1e3:9.1f} us  {r['eff_tflops']:6.1f} TFLOPS eff   same-work cuBLAS "
              f"{r['torch_same_work_tflops']:6.1f}  ratio {r['ratio_vs_same_work']:.3f}  err {err:.1e}  [{cfg}]",
              flush=True)

    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    for dtype in dtypes:
        da = torch.randn(S, S, device="cuda", dtype=dtype)
        db = torch.randn(S, S, device="cuda", dtype=dtype)
        dense_ms = bench(lambda: torch.mm(da, db))
        print(f"dense cuBLAS {S}^3 {dtype}: {dense_ms * 1e3:.1f} us, {2 * S ** 3 / dense_ms / 1e9:.1f} TFLOPS",
              flush=True)
        lay = L.random_topk(S, per_row, seed=1, seq_k=S, block_m=128, block_n=128, device="cuda")
        dens = lay.density
        vals = torch.randn(lay.nnz, 128, 128, device="cuda", dtype=dtype)
        Kw = int(S * dens)
        pa = torch.randn(S, Kw, device="cuda", dtype=dtype)
        for N in () if args.sdd_only else ((S, 1024) if dtype == torch.float16 else (S,)):
            b = torch.randn(S, N, device="cuda", dtype=dtype)
            out = torch.empty(S, N, device="cuda", dtype=dtype)
            pb = torch.randn(Kw, N, device="cuda", dtype=dtype)
            peer = bench(lambda: torch.mm(pa, pb))
            a_dense = dense_of(lay, vals)
            for transpose in ((False, True) if N == S else (False,)):
                cfg = g.config_for(g.Op.DSD_T if transpose else g.Op.DSD, dtype, dtype, 128, 128, N, S // 128, 132)
                g.dsd(vals, lay, b, out, transpose=transpose)
                ref = torch.mm(a_dense.T if transpose else a_dense, b)
                err = rel(out, ref)
                ms = bench(lambda: g.dsd(vals, lay, b, out, transpose=transpose))
                record(f"{'dsd_t' if transpose else 'dsd'} N={N} {str(dtype)[6:]}", "dsd_t" if transpose else "dsd",
                       dtype, S, N, S, dens, ms, cfg.name_facts(), err, peer, dense_ms)
                if args.schedules:
                    for vc in schedule_variants(cfg):
                        out.fill_(float("nan"))
                        g.dsd(vals, lay, b, out, transpose=transpose, config=vc)
                        verr = rel(out, ref)
                        ms = bench(lambda: g.dsd(vals, lay, b, out, transpose=transpose, config=vc))
                        record(f"  {cfg.op.value} N={N} {sched_tag(vc)}", cfg.op.value, dtype, S, N, S, dens, ms,
                               vc.name_facts(), verr, peer, dense_ms)
                if args.variants and not transpose:
                    for tn, st in ((128, 6), (256, 3), (256, 4), (128, 5)):
                        vc = BsrGemmConfig(op="dsd", dtype=cfg.dtype, out_dtype=cfg.out_dtype, tile_n=tn, stages=st)
                        ms = bench(lambda: g.dsd(vals, lay, b, out, config=vc))
                        record(f"  dsd N={N} t{tn} s{st}", "dsd", dtype, S, N, S, dens, ms, vc.name_facts(), err,
                               peer, dense_ms)
                    for strip in (1, 2, 4, 8, 32):
                        ms = bench(lambda: g.dsd(vals, lay, b, out, strip=strip))
                        record(f"  dsd N={N} strip {strip}", "dsd", dtype, S, N, S, dens, ms, cfg.name_facts(), err,
                               peer, dense_ms)
            del b, out, pb
        # SDD over an 8192^2 output, 25 % of its 128x128 blocks, K = 8192
        if dtype == torch.float16 or not args.quick:
            sb = args.sdd_block
            nb = S // sb
            if sb != 128:  # the same density with smaller blocks
                lay = L.random_topk(S, per_row * 128 // sb, seed=1, seq_k=S, block_m=sb, block_n=sb, device="cuda")
            a = torch.randn(S, S, device="cuda", dtype=dtype)
            b = torch.randn(S, S, device="cuda", dtype=dtype)
            outv = torch.empty(lay.nnz, sb, sb, device="cuda", dtype=dtype)
            g.sdd(a, b, lay, outv)
            # the listed blocks of a·b (the dense product is a temporary)
            blk_r, blk_c = block_rows(lay)[0, :lay.nnz], lay.col_idx[0, :lay.nnz].long()
            ref = torch.mm(a, b).reshape(nb, sb, nb, sb)[blk_r, :, blk_c]
            err = rel(outv, ref)
            ms = bench(lambda: g.sdd(a, b, lay, outv))
            # same work: 25 % of the 8192^2 output, as one dense product with N = 2048
            pb = torch.randn(S, Kw, device="cuda", dtype=dtype)
            peer = bench(lambda: torch.mm(a, pb))
            cfg = g.config_for(g.Op.SDD, dtype, dtype, sb, sb, S, lay.nnz, 132)
            record(f"sdd b{sb} {str(dtype)[6:]}", "sdd", dtype, S, S, S, dens, ms, cfg.name_facts(), err, peer,
                   dense_ms)
            if args.schedules:
                for vc in schedule_variants(cfg):
                    outv.fill_(float("nan"))
                    g.sdd(a, b, lay, outv, config=vc)
                    verr = rel(outv, ref)
                    ms = bench(lambda: g.sdd(a, b, lay, outv, config=vc))
                    record(f"  sdd b{sb} {sched_tag(vc)}", "sdd", dtype, S, S, S, dens, ms, vc.name_facts(), verr, peer,
                           dense_ms)
            del a, b, outv, ref
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    if args.txt:
        with open(args.txt, "w") as f:
            f.write(f"GPU: {name}; torch {torch.__version__}; do_bench medians (warmup 100 ms, rep 400 ms)\n")
            f.write(f"{'case':28s} {'us':>9s} {'effTF':>7s} {'sameworkTF':>10s} {'ratio':>6s} {'denseTF':>8s}\n")
            for r in rows:
                f.write(f"{r['case']:28s} {r['ms'] * 1e3:9.1f} {r['eff_tflops']:7.1f} "
                        f"{r['torch_same_work_tflops']:10.1f} {r['ratio_vs_same_work']:6.3f} "
                        f"{r['dense_cublas_tflops']:8.1f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
