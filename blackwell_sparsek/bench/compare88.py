"""``compare-88``: our kernels (both schedules) against every kernel of CUTLASS example 88, same shapes, same run.

For each shape and mask (full, causal) it runs example 88 ``--repeats`` times (each: ``--iterations`` back-to-back
launches per kernel, its own CUDA-event timer; median over invocations), then our kernels on fresh random inputs
(dense layout for full, causal layout for causal) timed with ``timing.bench`` (triton do_bench median), and checks
our output against torch SDPA on the same inputs. TFLOPS use example 88's count (4·B·H·Q·K·D, halved for causal)
for every column, so ratios are time ratios.
"""
from __future__ import annotations

import math
import re
import time
from typing import Any, Sequence

from . import ex88, metrics
from .report import _fmt, environment, format_table, print_err, write_json
from .timing import REP_MS, WARMUP_MS

DEFAULT_SHAPES: tuple[tuple[int, int, int, int], ...] = ((2, 16, 8192, 128), (1, 8, 8192, 64), (16, 16, 1024, 128))


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """'2x16x8192x128', '2,16,8192,128' or 'B=2 H=16 S=8192 D=128' -> (B, H, S, D)."""
    t = text.strip()
    named = dict((k.lower(), int(v)) for k, v in re.findall(r"([BHSDQbhsdq])\s*=\s*(\d+)", t))
    if named:
        s = named.get("s", named.get("q"))
        if None in (named.get("b"), named.get("h"), s, named.get("d")):
            raise ValueError(f"shape {text!r}: need B=, H=, S= (or Q=) and D=")
        return named["b"], named["h"], int(s), named["d"]  # type: ignore[arg-type]
    parts = [p for p in re.split(r"[x,\s]+", t.lower()) if p]
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise ValueError(f"shape {text!r}: expected BxHxSxD, e.g. 2x16x8192x128")
    b, h, s, d = (int(p) for p in parts)
    if min(b, h, s, d) <= 0:
        raise ValueError(f"shape {text!r}: sizes must be positive")
    return b, h, s, d


def _ours(shape: tuple[int, int, int, int], causal: bool, dtype: str, warmup_ms: float, rep_ms: float,
          device: str = "cuda", loop_n: int = 20, repeats: int = 3) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from ..layout import BlockSparseLayout
    from .peers import Ours, our_configs
    from .timing import bench, free_memory, loop_bench, poison_allocator, sync
    b, h, s, d = shape
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator(device=device).manual_seed(1234 + s + d)
    q, k, v = (torch.randn((b, h, s, d), generator=gen, device=device, dtype=dt) for _ in range(3))
    layout = (BlockSparseLayout.causal if causal else BlockSparseLayout.dense)(s, device=device)
    scale = 1.0 / math.sqrt(d)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    fl = metrics.dense_flops(b, h, s, s, d, causal=causal)
    out = []
    fns = []
    import blackwell_sparsek as bsk
    for name, cfg in our_configs(d, dtype):
        peer = Ours(cfg, name)
        rec: dict[str, Any] = {"impl": peer.name, "config": name, "kernel": cfg.kernel_name}
        try:
            if device == "cuda":
                peer.precompile()
                rec["build_s"] = round(peer.build_s or 0.0, 2)

            def fn(cfg=cfg, q=q, k=k, v=v):
                return bsk.sparse_attention(q, k, v, layout, scale=scale, config=cfg)
            poison_allocator(q.numel() * q.element_size(), device)
            o = fn()
            sync(device)
            err = metrics.rel_error(o, ref)
            del o
            rec.update({f"vs_sdpa_{k2}": v2 for k2, v2 in err.items()})
            rec["check_ok"] = err["nonfinite"] == 0 and err["rel_err"] <= metrics.tolerance(dtype)
            tm = bench(fn, device=device, warmup_ms=warmup_ms, rep_ms=rep_ms)
            rec.update(tm.as_dict())
            rec["tflops"] = metrics.tflops(fl, tm.median_ms)
            rec["status"] = "ok"
            fns.append((fn, rec))
        except Exception as e:
            rec["status"] = "error"
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
        out.append(rec)
    # example 88's protocol: after idling, one warm-up call then 20 back-to-back launches between two events, median
    # over as many invocations as example 88 gets (repeats). After every sustained timing: a sustained timing taken
    # right after a burst can run slow (harness.py's docstring).
    for fn, rec in fns:
        try:
            lt = loop_bench(fn, device=device, n=loop_n, reps=repeats, idle_s=1.0)
            rec["time_ms_loop"] = lt.median_ms
            rec["tflops_loop"] = metrics.tflops(fl, lt.median_ms)
        except Exception as e:
            rec["status"] = "error"
            rec["error"] = f"{type(e).__name__}: {e}"[:500]
    del q, k, v, ref, fns
    free_memory(device)
    return out, {"flops": fl}


def run(shapes: Sequence[tuple[int, int, int, int]] = DEFAULT_SHAPES, masks: Sequence[str] = ("full", "causal"), *,
        iterations: int = 20, repeats: int = 3, verify: bool = False, dtype: str = "fp16",
        build_ex88: bool = True, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS,
        json_path: str | None = None, device: str = "cuda", loop_n: int = 20) -> dict[str, Any]:
    """``device='cpu'`` only tests the plumbing (ours = the reference fallback, example 88 = whatever
    $BSK_EX88_BIN prints)."""
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("compare-88 needs a CUDA GPU (Hopper, sm_90)")
    env = environment()
    print(f"GPU: {env.get('gpu')} ({env.get('sm_count')} SMs), torch {env.get('torch')}, CUDA {env.get('torch_cuda')}",
          flush=True)
    try:
        binary = ex88.locate(build_if_missing=build_ex88)
        bin_err = None
    except Exception as e:
        binary, bin_err = None, f"{type(e).__name__}: {e}"
        print_err(f"[bsk] example 88 unavailable: {bin_err}")
    if dtype != "fp16":
        print_err("[bsk] note: example 88 is built for fp16; its numbers are fp16 whatever --dtype says")
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for shape in shapes:
        b, h, s, d = shape
        for mask in masks:
            causal = mask == "causal"
            row: dict[str, Any] = {"b": b, "h": h, "s": s, "d": d, "mask": mask, "dtype": dtype}
            # ours first: its do_bench timings should not follow example 88's bursts (harness.py's docstring)
            print_err(f"[bsk compare-88] B{b} H{h} S{s} D{d} {mask}: ours ...")
            row["ours"], extra = _ours(shape, causal, dtype, warmup_ms, rep_ms, device, loop_n, repeats)
            row.update(extra)
            print_err(f"[bsk compare-88] B{b} H{h} S{s} D{d} {mask}: example 88 ...")
            if binary is not None:
                try:
                    row["ex88"] = ex88.measure(binary, b=b, h=h, q=s, d=d, causal=causal, iterations=iterations,
                                               repeats=repeats, verify=verify)
                except Exception as e:
                    row["ex88"] = {"error": f"{type(e).__name__}: {e}"[:800]}
            else:
                row["ex88"] = {"error": bin_err}
            best88 = (row["ex88"] or {}).get("best")
            ours_ok = [r for r in row["ours"] if r.get("tflops")]
            best_ours = max(ours_ok, key=lambda r: r["tflops"]) if ours_ok else None
            row["ex88_best"] = best88
            row["ours_best"] = best_ours
            row["ratio"] = (best_ours["tflops"] / best88["tflops"]) if best_ours and best88 else None
            loops = [r for r in row["ours"] if r.get("tflops_loop")]
            best_loop = max(loops, key=lambda r: r["tflops_loop"]) if loops else None
            row["ratio_loop"] = (best_loop["tflops_loop"] / best88["tflops"]) if best_loop and best88 else None
            rows.append(row)
    result = {"schema": "blackwell_sparsek.compare88/1", "env": env, "binary": str(binary) if binary else None,
              "iterations": iterations, "repeats": repeats, "rows": rows,
              "elapsed_s": round(time.monotonic() - t0, 1)}
    print(table(rows))
    if json_path:
        p = write_json(json_path, result)
        print(f"wrote {p}")
    return result


def table(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        kern = (r.get("ex88") or {}).get("kernels") or []
        k88 = " / ".join(f"{_short_kernel(k['kernel'])} {_fmt(k.get('tflops'), '.0f')}" for k in kern) \
            or ("error: " + str((r.get("ex88") or {}).get("error"))[:40])
        ours = {x["impl"]: x for x in r.get("ours", [])}
        best = r.get("ex88_best")
        errs = [x.get("vs_sdpa_rel_err") for x in r.get("ours", []) if x.get("vs_sdpa_rel_err") is not None]
        out.append([f"{r['b']}x{r['h']}x{r['s']}x{r['d']}", r["mask"], k88,
                    _fmt(best.get("tflops") if best else None, ".0f"),
                    _both(ours.get("ours-coop", {})), _both(ours.get("ours-pp", {})),
                    _fmt(r.get("ratio_loop"), ".3f") + ("" if r.get("ratio_loop") is None else "x"),
                    _fmt(r.get("ratio"), ".3f") + ("" if r.get("ratio") is None else "x"),
                    _fmt(max(errs) if errs else None, ".1e")])
    return format_table(out, ["BxHxSxD", "mask", "example 88 kernels (TFLOPS)", "ex88 best", "ours coop",
                              "ours pp", "ours/ex88", "(do_bench)", "err vs SDPA"], "lllrrrrrr") + (
        "\nours coop/pp: TFLOPS timed like example 88 (1 s idle, 1 warm-up, 20 back-to-back launches; median of the same "
        "number of repeats) / with do_bench (sustained, L2 flushed, one call per event pair); ours/ex88 uses the first, "
        "(do_bench) the second")


def _both(rec: dict[str, Any]) -> str:
    return f"{_fmt(rec.get('tflops_loop'), '.0f')} / {_fmt(rec.get('tflops'), '.0f')}"


def _short_kernel(name: str) -> str:
    n = name.replace("tma ws cooperative", "coop").replace("tma ws ping-pong", "pp").replace("tma ", "tma ")
    return n
