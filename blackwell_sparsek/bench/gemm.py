"""Block-sparse GEMM benchmark (issue 27): ours vs cuBLAS and torch's Triton BSR kernels, in one run.

    python -m blackwell_sparsek bench gemm [--preset quick|full|headline] [--out bench/results/h100] [--no-tune]
    python -m blackwell_sparsek.bench.gemm ...   (the same)

Per case (M x K x N, block, density, fp16): ``ours`` (bsr_matmul / sampled_matmul), ``cublas-same-work`` (a dense
M x (K·density) x N product: the same multiply-adds), ``cublas-dense`` (the full M x K x N product), torch's
``bsr_dense_mm`` untuned (the meta table torch ships, else its defaults) and tuned (``tune_bsr_dense_addmm``
run on these inputs first; only on the headline cases, it takes a while), and for SDD torch's Triton
``sampled_addmm``. Timings are ``triton.testing.do_bench`` medians after warm-up (bench/timing.py). Effective
TFLOPS count the listed blocks' work: 2 · nnz · bm · bk · N. Each of our results is checked against an fp32
product first (relative error). The linear-layer case times forward + backward of y = W·x with W block-sparse
(gradients for W's values and x) against the dense layer. Writes ``bsr_gemm.json``, ``bsr_gemm.txt`` and, with
matplotlib, ``bsr_gemm_tflops.png`` into --out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

K1 = 1024
HEADLINE = [("dsd", 8192, 8192, 8192, 128, 0.25), ("sdd", 8192, 8192, 8192, 128, 0.25),
            ("dsd", 8192, 8192, 1024, 128, 0.25), ("sdd", 8192, 8192, 1024, 128, 0.25)]
LINEAR = [(8192, 8192, 8192, 128, 0.25), (8192, 8192, 8192, 128, 0.5)]   # out, in, tokens, block, density


def sweep(preset: str) -> list[tuple[str, int, int, int, int, float]]:
    sizes = [K1, 2 * K1, 4 * K1, 8 * K1, 16 * K1] if preset == "full" else [K1, 4 * K1, 16 * K1]
    dens = [0.0625, 0.125, 0.25, 0.5]
    blocks = [128, 64] if preset == "full" else [128]
    return [("dsd", s, s, s, b, d) for b in blocks for s in sizes for d in dens]


def _mask(nq: int, nk: int, density: float, gen):
    """Exactly round(density · nq · nk) blocks, uniformly at random."""
    import torch
    n = max(1, round(density * nq * nk))
    flat = torch.zeros(nq * nk, dtype=torch.bool, device="cuda")
    flat[torch.randperm(nq * nk, device="cuda", generator=gen)[:n]] = True
    return flat.view(nq, nk)


def _time(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float | None:
    from .timing import bench
    try:
        return bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms
    except Exception as e:  # a peer that fails must not lose the run
        print(f"    (peer failed: {type(e).__name__}: {str(e).splitlines()[0][:160]})", file=sys.stderr)
        return None


def _rel(out, ref) -> float:
    from ..reference import relative_error
    return relative_error(out.float(), ref)


def run_case(op: str, m: int, k: int, n: int, block: int, density: float, *, tune: bool, warmup_ms: float,
             rep_ms: float) -> list[dict[str, Any]]:
    import torch
    from .. import BlockSparseLayout, BlockSparseMatrix, bsr_matmul, sampled_matmul
    gen = torch.Generator(device="cuda").manual_seed(m + 7 * k + 13 * n + block + int(density * 1000))
    rows, cols = (m, k) if op == "dsd" else (m, n)
    mask = _mask(-(-rows // block), -(-cols // block), density, gen)
    lay = BlockSparseLayout.from_block_mask(mask, rows, cols, block, block)
    dens = lay.density
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
    work = 2.0 * lay.nnz * block * block * (n if op == "dsd" else k)
    base = dict(op=op, M=m, K=k, N=n, block=block, density=round(dens, 4), dtype="fp16", nnz=lay.nnz, flops=work)
    recs: list[dict[str, Any]] = []

    def add(peer: str, ms: float | None, **extra) -> None:
        recs.append(dict(base, peer=peer, time_ms=ms, tflops=(work / ms / 1e9) if ms else None, **extra))

    if op == "dsd":
        a = BlockSparseMatrix.from_dense(x, block, mask=mask)
        del x
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        bsr_matmul(a, b, out=out)
        err = _rel(out, a.to_dense().float() @ b.float()) if m * k <= (8 * K1) ** 2 else None
        add("ours", _time(lambda: bsr_matmul(a, b, out=out), warmup_ms, rep_ms), rel_err=err)
        kk = max(64, round(k * dens / 64) * 64)
        xs, bs = torch.randn(m, kk, device="cuda", dtype=torch.float16), torch.randn(kk, n, device="cuda",
                                                                                      dtype=torch.float16)
        add("cublas-same-work", _time(lambda: torch.mm(xs, bs), warmup_ms, rep_ms), k_eff=kk)
        del xs, bs
        ad = a.to_dense()
        add("cublas-dense", _time(lambda: torch.mm(ad, b), warmup_ms, rep_ms))
        del ad
        t = a.to_torch()
        try:
            from torch.sparse._triton_ops import bsr_dense_mm
            tout = torch.empty(m, n, device="cuda", dtype=torch.float16)
            add("torch-bsr_dense_mm", _time(lambda: bsr_dense_mm(t, b, out=tout), warmup_ms, rep_ms))
            if tune:
                from torch.sparse._triton_ops_meta import tune_bsr_dense_addmm
                t0 = time.time()
                meta = tune_bsr_dense_addmm(tout, t, b, beta=0, alpha=1, out=tout, store=False)
                add("torch-bsr_dense_mm-tuned",
                    _time(lambda: bsr_dense_mm(t, b, out=tout, meta=meta), warmup_ms, rep_ms),
                    meta={kk_: v for kk_, v in meta.items()}, tune_s=round(time.time() - t0, 1))
        except ImportError as e:
            print(f"    (torch bsr_dense_mm unavailable: {e})", file=sys.stderr)
    else:
        s = sampled_matmul(x, b, lay)
        err = None
        if m * n <= (8 * K1) ** 2:
            from ..reference import sampled_matmul_reference
            err = _rel(s.values, sampled_matmul_reference(x.float(), b.float(), lay, dtype=torch.float32))
        add("ours", _time(lambda: sampled_matmul(x, b, lay), warmup_ms, rep_ms), rel_err=err)
        add("cublas-dense", _time(lambda: torch.mm(x, b), warmup_ms, rep_ms))
        mm = max(64, round(m * dens / 64) * 64)
        xs = x[:mm].contiguous()
        add("cublas-same-work", _time(lambda: torch.mm(xs, b), warmup_ms, rep_ms), m_eff=mm)
        try:
            from torch.sparse._triton_ops import sampled_addmm
            tb = BlockSparseMatrix(s.values.clone(), lay).to_torch()
            add("torch-sampled_addmm", _time(lambda: sampled_addmm(tb, x, b, beta=0.0, alpha=1.0), warmup_ms,
                                             rep_ms))
        except Exception as e:
            print(f"    (torch sampled_addmm unavailable: {type(e).__name__}: {e})", file=sys.stderr)
    return recs


def run_linear(out_f: int, in_f: int, tokens: int, block: int, density: float, *, warmup_ms: float,
               rep_ms: float) -> list[dict[str, Any]]:
    """Forward + backward of y = W·x (W [out, in], x [in, tokens]): block-sparse W vs the dense layer."""
    import torch
    from .. import BlockSparseLayout, BlockSparseMatrix, bsr_matmul
    gen = torch.Generator(device="cuda").manual_seed(out_f + in_f + tokens + int(density * 100))
    mask = _mask(out_f // block, in_f // block, density, gen)
    lay = BlockSparseLayout.from_block_mask(mask, out_f, in_f, block, block)
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.float16, generator=gen) / in_f ** 0.5
    ws = BlockSparseMatrix.from_dense(w, block, mask=mask)
    wv = ws.values.clone().requires_grad_()
    wd = w.clone().requires_grad_()
    x = torch.randn(in_f, tokens, device="cuda", dtype=torch.float16, generator=gen).requires_grad_()
    g = torch.randn(out_f, tokens, device="cuda", dtype=torch.float16, generator=gen)

    def ours():
        bsr_matmul(BlockSparseMatrix(wv, lay), x).backward(g)

    def dense():
        torch.mm(wd, x).backward(g)

    work = 3 * 2.0 * lay.nnz * block * block * tokens
    base = dict(op="linear-fwd+bwd", M=out_f, K=in_f, N=tokens, block=block, density=round(lay.density, 4),
                dtype="fp16", nnz=lay.nnz, flops=work)
    recs = []
    for peer, fn in (("ours", ours), ("cublas-dense", dense)):
        ms = _time(fn, warmup_ms, rep_ms)
        recs.append(dict(base, peer=peer, time_ms=ms, tflops=(work / ms / 1e9) if ms else None))
    return recs


def table(records: list[dict[str, Any]]) -> str:
    from .report import format_table
    rows = []
    for r in records:
        ours = next((q for q in records if q["peer"] == "ours" and all(q[f] == r[f] for f in
                                                                      ("op", "M", "K", "N", "block", "density"))),
                    None)
        speed = (r["time_ms"] / ours["time_ms"]) if ours and ours["time_ms"] and r["time_ms"] else None
        rows.append([r["op"], f"{r['M']}x{r['K']}x{r['N']}", r["block"], f"{r['density']:.3f}", r["peer"],
                     r["time_ms"], r["tflops"], speed, r.get("rel_err")])
    return format_table(rows, ["op", "MxKxN", "blk", "dens", "peer", "ms", "eff TFLOPS", "peer/ours", "rel err"])


def plot(records: list[dict[str, Any]], path: Path) -> Path | None:
    from .plots import _figure, have_matplotlib
    if not have_matplotlib():
        return None
    sw = [r for r in records if r.get("group") == "sweep" and r["tflops"]]
    sizes = sorted({r["M"] for r in sw})
    if not sizes:
        return None
    fig = _figure(4.2 * len(sizes), 3.6)
    for i, s in enumerate(sizes):
        ax = fig.add_subplot(1, len(sizes), i + 1)
        for peer in sorted({r["peer"] for r in sw}):
            pts = sorted((r["density"], r["tflops"]) for r in sw if r["M"] == s and r["peer"] == peer
                         and r["block"] == 128)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=peer)
        ax.set_xscale("log", base=2)
        ax.set_title(f"DSD fp16 {s}^3, 128x128 blocks")
        ax.set_xlabel("block density")
        ax.set_ylabel("effective TFLOPS")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek bench gemm", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=["quick", "full", "headline"], default="quick",
                    help="quick: headline + linear + DSD sweep over N in {1K, 4K, 16K}; full: N 1K..16K, blocks 64 "
                         "and 128; headline: only the headline and linear-layer cases")
    ap.add_argument("--out", default=None, metavar="DIR", help="write bsr_gemm.json/.txt/.png here")
    ap.add_argument("--no-tune", action="store_true", help="skip torch's tune_bsr_dense_addmm (slow)")
    ap.add_argument("--warmup-ms", type=float, default=100.0)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--list", action="store_true", help="print the planned cases and exit")
    a = ap.parse_args(argv)
    cases = [(c, "headline") for c in HEADLINE]
    if a.preset != "headline":
        cases += [(c, "sweep") for c in sweep(a.preset)]
    if a.list:
        for c, grp in cases:
            print(grp, *c)
        for c in LINEAR:
            print("linear", *c)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("error: bench gemm needs a CUDA GPU", file=sys.stderr)
        return 2
    from .report import environment, write_json
    env = environment()
    print(f"GPU: {env.get('gpu')}  torch {env.get('torch')}  triton {env.get('triton')}", flush=True)
    records: list[dict[str, Any]] = []
    for (op, m, k, n, block, dens), grp in cases:
        print(f"  {grp} {op} {m}x{k}x{n} block {block} density {dens}", flush=True)
        for r in run_case(op, m, k, n, block, dens, tune=(grp == "headline" and not a.no_tune),
                          warmup_ms=a.warmup_ms, rep_ms=a.rep_ms):
            records.append(dict(r, group=grp))
        torch.cuda.empty_cache()
    for c in LINEAR:
        print(f"  linear {c}", flush=True)
        records += [dict(r, group="linear") for r in run_linear(*c, warmup_ms=a.warmup_ms, rep_ms=a.rep_ms)]
    text = f"GPU: {env.get('gpu')}\n" + table(records)
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "bsr_gemm.json", {"environment": env, "preset": a.preset, "records": records})
        (out / "bsr_gemm.txt").write_text(text + "\n")
        p = plot(records, out / "bsr_gemm_tflops.png")
        print(f"wrote {out / 'bsr_gemm.json'}" + (f", {p}" if p else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
