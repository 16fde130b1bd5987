"""Command line of the benchmark tools: ``main(argv)`` with argv[0] the subcommand.

    python -m blackwell_sparsek bench [--quick | --preset quick|full|headline|tiny] [--out DIR]
    python -m blackwell_sparsek bench gemm [--preset quick|full|headline] [--out DIR]   (block-sparse GEMM)
    python -m blackwell_sparsek compare-88 [--shapes 2x16x8192x128 ...] [--iterations 20] [--json PATH]
    python -m blackwell_sparsek bench-bwd [--quick] [--out DIR]   (the attention backward vs Flex and cuDNN)
    python -m blackwell_sparsek profile [--config NAME] [--shape 2x16x8192x128] [--pattern dense] [--out DIR]

Results are printed; files are written only where --out / --json say (never into the current directory unasked).
(``python -m blackwell_sparsek.bench ...`` is the same.) See docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import BskError, InputError
from .timing import REP_MS, WARMUP_MS

SUBCOMMANDS = ("bench", "compare-88", "profile", "bench-bwd")
# Seconds of building + measuring after which remaining cases are skipped; the rest of a run (torch import, CUDA
# init, JSON, plots) takes ~20 s and one case may overrun its estimate: quick < 4 min, full < 9 min in total.
DEFAULT_BUDGET = {"tiny": 300.0, "quick": 180.0, "full": 450.0, "headline": 420.0}


def _bench_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek bench",
                                 description="Sweep sequence length, head dim, sparsity pattern and schedule over "
                                             "ours and the peers; prints the summary, and writes JSON, the full "
                                             "table and PNG plots into --out when given.")
    ap.add_argument("--preset", choices=["quick", "full", "headline", "tiny"], default="full",
                    help="quick: < 4 min on an H100; full: < 9 min; headline: the acceptance shapes with a verdict "
                         "table; tiny: small CPU-capable smoke run (default: full)")
    ap.add_argument("--quick", action="store_const", const="quick", dest="preset", help="same as --preset quick")
    ap.add_argument("--headline", action="store_const", const="headline", dest="preset",
                    help="same as --preset headline")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="directory (created) for bench_<preset>.json/.txt and the plots, e.g. bench/results "
                         "(default: none; results are only printed)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of building + measuring before remaining cases are skipped (default: quick 180, "
                         "full 450, headline 420)")
    ap.add_argument("--peers", default=None,
                    help="comma-separated peer name prefixes to run (ours, sdpa-flash, sdpa-cudnn, flex, fa, "
                         "xformers); default all available")
    ap.add_argument("--no-check", action="store_true", help="skip the small-shape reference checks")
    ap.add_argument("--no-ex88", action="store_true", help="do not run CUTLASS example 88 on dense/causal cases")
    ap.add_argument("--ex88-build", action="store_true",
                    help="build example 88 if it is not cached (minutes); default: use it only when cached or "
                         "BSK_EX88_BIN is set")
    ap.add_argument("--no-plots", action="store_true", help="do not draw PNG plots into --out")
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_MS,
                    help="do_bench warm-up before each measurement, ms (default %(default)s)")
    ap.add_argument("--rep-ms", type=float, default=REP_MS,
                    help="do_bench timed calls per measurement, ms (default %(default)s)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu only exercises the harness (tiny preset; ours = reference fallback)")
    ap.add_argument("--list", action="store_true", help="print the planned cases and exit (no GPU needed)")
    ap.add_argument("--replot", metavar="JSON", default=None,
                    help="only redraw the PNG plots from a bench_<preset>.json (no GPU needed; into --out, default "
                         "the JSON's directory)")
    return ap


def _compare_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek compare-88",
                                 description="Our kernels vs every kernel of CUTLASS example 88, same shapes, "
                                             "same run; prints a table with ours/ex88-best and writes JSON.")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="BxHxSxD",
                    help="default: 2x16x8192x128 1x8x8192x64 16x16x1024x128")
    ap.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    ap.add_argument("--iterations", type=int, default=20, help="example 88 --iterations (timed launches)")
    ap.add_argument("--repeats", type=int, default=3, help="example 88 invocations per shape (median)")
    ap.add_argument("--verify", action="store_true", help="also run example 88 --verify on the first invocation")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--no-build", action="store_true", help="fail instead of building example 88 when not cached")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the results as JSON to PATH, e.g. bench/results/compare88.json (default: "
                         "none; the table is only printed)")
    ap.add_argument("--rep-ms", type=float, default=REP_MS,
                    help="do_bench timed calls per measurement of ours, ms (default %(default)s)")
    return ap


def _profile_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek profile",
                                 description="Nsight Compute on one of our kernels; key metrics to JSON/markdown.")
    ap.add_argument("--config", default=None, help="named config (default: the cooperative config for --shape's D)")
    ap.add_argument("--shape", default="2x16x8192x128", metavar="BxHxSxD", help="problem shape (default %(default)s)")
    ap.add_argument("--pattern", default="dense", choices=["dense", "causal", "window", "topk"],
                    help="layout pattern (default %(default)s)")
    ap.add_argument("--density", type=float, default=0.25, help="kept fraction for --pattern topk")
    ap.add_argument("--window", type=int, default=2048, help="window in tokens for --pattern window")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help="input dtype (default %(default)s)")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="directory (created) for profile_*.json/.md and the Nsight report under DIR/tmp/ "
                         "(default: none; the metrics are only printed and the report is discarded)")
    ap.add_argument("--kernel-regex", default="regex:bsk_", help="ncu --kernel-name filter (default %(default)s)")
    ap.add_argument("--launch-skip", type=int, default=2, help="launches to skip before the profiled one")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    sub, rest = argv[0], argv[1:]
    try:
        if sub == "bench" and rest[:1] == ["gemm"]:  # block-sparse GEMM benchmark (bench/gemm.py)
            from .gemm import main as gemm_main
            return gemm_main(rest[1:])
        if sub == "bench":
            return cmd_bench(_bench_parser().parse_args(rest))
        if sub in ("compare-88", "compare88"):
            return cmd_compare(_compare_parser().parse_args(rest))
        if sub == "profile":
            return cmd_profile(_profile_parser().parse_args(rest))
        if sub == "bench-bwd":
            from .backward import main as bwd_main
            return bwd_main(rest)
    except BskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"unknown subcommand {sub!r}; use one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
    return 2


def output_dir(path: str | None, option: str = "--out") -> Path | None:
    """The directory the user named for results, created now (before minutes of measuring), or None."""
    if path is None:
        return None
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)  # raises when p or a parent is a file
    except OSError as e:
        raise InputError(f"cannot use {option} {path}: {e.strerror or e} (a file in the way, or no permission); "
                         f"give a directory you can write to") from None
    return p


def output_file(path: str | None, option: str) -> Path | None:
    """The file the user named for results (its directory created now), or None."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {path} is a directory; give a file path such as {p / 'compare88.json'}")
    output_dir(str(p.parent), option)
    return p


# ---------------------------------------------------------------------------------------------------------------

def _cuda_ok() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def cmd_replot(json_path: str, out: str | None) -> int:
    import json
    from . import plots, report
    p = Path(json_path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        print(f"bench --replot: cannot read {p}: {e}", file=sys.stderr)
        return 2
    if not plots.have_matplotlib():
        print("bench --replot: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    out_dir = Path(out) if out else p.parent
    made = plots.make_all(data.get("records", []), out_dir, data.get("preset", p.stem.replace("bench_", "")))
    lin = report.linearity(data.get("records", []))
    if lin:
        print(report.linearity_text(lin))
    print("wrote " + (", ".join(str(m) for m in made) if made else "nothing (no plottable records)"))
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from . import cases as case_sets
    from . import harness, headline, plots, report
    if a.replot:
        return cmd_replot(a.replot, a.out)
    t_start = time.monotonic()
    dev = a.device
    name = a.preset
    if name == "headline":
        cases = headline.cases(dev)
        opts = headline.options(a.budget or DEFAULT_BUDGET[name])
        peers_for: Any = headline.peers_for
    else:
        cases = case_sets.preset(name, dev)
        opts = harness.RunOptions(budget_s=a.budget or DEFAULT_BUDGET[name],
                                  jit_peer_seqs=case_sets.JIT_PEER_SEQS.get(name),
                                  ex88_seqs=case_sets.EX88_SEQS.get(name, set()),
                                  loop_timing_seqs=set(case_sets.EX88_SEQS.get(name, set())))
        peers_for = None
    opts.warmup_ms, opts.rep_ms = a.warmup_ms, a.rep_ms
    opts.check = not a.no_check
    if a.peers:
        opts.peers_include = {p.strip() for p in a.peers.split(",") if p.strip()}
        if peers_for is not None:
            inner = peers_for
            peers_for = lambda c: [p for p in inner(c) if any(p.name.startswith(x) for x in opts.peers_include)]  # noqa: E731
    if a.list:
        n_peers = 6
        total = 0.0
        for c in cases:
            est = case_sets.estimate_case_seconds(c, n_peers)
            total += est
            print(f"{c.name:42s} groups={','.join(c.groups):22s} ~{est:5.1f}s")
        print(f"{len(cases)} cases, rough upper estimate {total:.0f}s at {n_peers} peers/case "
              f"(budget {opts.budget_s:.0f}s)")
        return 0
    if dev == "cuda" and not _cuda_ok():
        print("bench: no CUDA GPU visible (torch.cuda.is_available() is False); this benchmark needs an H100/H200. "
              "Use --list to see the plan, or --device cpu --preset tiny to exercise the harness.", file=sys.stderr)
        return 2
    if dev == "cpu":  # harness test mode: ours is the O(S^2) reference fallback, keep everything small
        opts.ex88_seqs = set()
        opts.loop_n = 2
        opts.small_check_seq = 256
    ex88_bin = None
    ex88_note = None
    if not a.no_ex88 and opts.ex88_seqs:
        from . import ex88
        try:
            ex88_bin = ex88.locate(build_if_missing=a.ex88_build)
        except Exception as e:
            ex88_note = f"example 88 not run: {e}"
            print(f"[bsk] {ex88_note}", file=sys.stderr)
    out_dir = output_dir(a.out)
    json_path = out_dir / f"bench_{name}.json" if out_dir else None
    env = report.environment()
    dest = f"JSON -> {json_path}" if json_path else "results printed only (--out DIR to keep JSON, table, plots)"
    print(f"[bsk bench] preset {name}: {len(cases)} cases on {env.get('gpu') or dev}; budget {opts.budget_s:.0f}s; "
          f"{dest}", file=sys.stderr, flush=True)
    build_times: dict[str, float] = {}

    def payload(runner: harness.Runner, complete: bool) -> dict[str, Any]:
        lin = report.linearity(runner.records)
        d: dict[str, Any] = {
            "schema": report.SCHEMA, "preset": name, "complete": complete, "env": env,
            "elapsed_s": round(time.monotonic() - t_start, 1), "budget_s": opts.budget_s,
            "flops_convention": "tflops: causal pattern = example 88's dense-half count, other patterns = listed "
                                "blocks x 128 x 128 (effective); tflops_blocks / tflops_dense give both",
            "peers": runner.peer_info, "build_s": build_times, "ex88_binary": str(ex88_bin) if ex88_bin else None,
            "notes": runner.notes + ([ex88_note] if ex88_note else []),
            "cases": runner.case_info, "records": runner.records, "small_checks": runner.small_checks,
            "skipped": runner.skipped, "linearity": lin,
        }
        if name == "headline":
            d["headline"] = headline.verdicts(runner.records, lin, dev)
        return d

    runner = harness.Runner(cases, opts, peers_for=peers_for, ex88_binary=ex88_bin,
                            on_case_done=lambda r: json_path and report.write_json(json_path, payload(r, False)))
    if dev == "cuda":
        build_times.update(runner.precompile())
    runner.run()
    data = payload(runner, True)
    if json_path:
        report.write_json(json_path, data)
    made = []
    if out_dir and not a.no_plots:
        if plots.have_matplotlib():
            try:
                made = plots.make_all(runner.records, out_dir, name)
            except Exception as e:
                print(f"[bsk] plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
        else:
            print("[bsk] matplotlib not installed: no PNG plots (pip install matplotlib)", file=sys.stderr)
    # ---- printout: full table to a text file; stdout gets checks, per-case summary, linearity, (verdicts last)
    txt_path = out_dir / f"bench_{name}.txt" if out_dir else None
    if txt_path:
        txt_path.write_text(f"{env.get('gpu')} | torch {env.get('torch')} | CUDA {env.get('torch_cuda')} | "
                            f"{env.get('date')}\n\n" + report.records_table(runner.records) + "\n\n"
                            + report.small_checks_table(runner.small_checks) + "\n")
    if runner.small_checks:
        print(report.small_checks_table(runner.small_checks))
        print()
    where = f"in {txt_path} and {json_path}" if out_dir else "kept only with --out DIR"
    print(f"GPU: {env.get('gpu')}; TFLOPS: causal = example 88's dense-half count, others = effective (listed "
          f"blocks); every record (ms, us/head, GB/s, peak MB, rel err) {where}")
    print(report.summary_table(runner.records))
    if data["linearity"]:
        print()
        print("time vs non-zero blocks (linear-scaling cases):")
        print(report.linearity_text(data["linearity"]))
    if runner.skipped:
        print(f"\nskipped {len(runner.skipped)}: " + "; ".join(
            f"{s['case']}{' / ' + s['peer'] if s.get('peer') else ''} ({s['reason']})" for s in runner.skipped[:12])
            + (" ..." if len(runner.skipped) > 12 else ""))
    for n in data["notes"]:
        print(f"note: {n}")
    wrote = (f"wrote {json_path}, {txt_path}" + (", " + ", ".join(str(p) for p in made) if made else "")
             if out_dir else "wrote no files (pass --out DIR to keep JSON, the full table and plots)")
    print(f"\n{wrote} in {time.monotonic() - t_start:.0f}s")
    if name == "headline":
        print()
        print(headline.verdict_table(data["headline"]))
    problems = [r for r in runner.records if r.get("kind") == "ours" and r.get("status") != "ok"]
    problems += [r for r in runner.records if r.get("kind") == "ours" and r.get("check_ok") is False]
    problems += [c for c in runner.small_checks if c.get("peer", "") and str(c.get("peer")).startswith("ours")
                 and c.get("status") != "ok"]
    if runner.fatal:
        print(f"FATAL: {runner.fatal}", file=sys.stderr)
        return 1
    if problems:
        print(f"{len(problems)} problem(s) with our kernels (errors or failed checks): see the tables above",
              file=sys.stderr)
        return 1
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from . import compare88
    if not _cuda_ok():
        print("compare-88: no CUDA GPU visible; it needs an H100/H200 (sm_90)", file=sys.stderr)
        return 2
    try:
        shapes = [compare88.parse_shape(s) for s in a.shapes] if a.shapes else list(compare88.DEFAULT_SHAPES)
    except ValueError as e:
        print(f"compare-88: {e}", file=sys.stderr)
        return 2
    json_path = output_file(a.json, "--json")
    res = compare88.run(shapes, a.masks, iterations=a.iterations, repeats=a.repeats, verify=a.verify,
                        dtype=a.dtype, build_ex88=not a.no_build, rep_ms=a.rep_ms,
                        json_path=str(json_path) if json_path else None)
    bad = [o for r in res["rows"] for o in r["ours"] if o.get("status") != "ok" or o.get("check_ok") is False]
    return 1 if bad else 0


def cmd_profile(a: argparse.Namespace) -> int:
    from . import profile
    from .compare88 import parse_shape
    try:
        shape = parse_shape(a.shape)
    except ValueError as e:
        print(f"profile: {e}", file=sys.stderr)
        return 2
    out = output_dir(a.out)
    return profile.run(a.config, shape, a.pattern, a.density, a.window, a.dtype, str(out) if out else None,
                       a.kernel_regex, a.launch_skip)


if __name__ == "__main__":
    raise SystemExit(main())

