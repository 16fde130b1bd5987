"""``python -m blackwell_sparsek``: generate, build, list-configs, cache, info; bench/compare-88/profile forward.

A CONFIG is a named config (``list-configs``), a path to a .json file, or inline JSON such as
'{"head_dim": 64, "stages": 6, "dtype": "bf16"}' (the family defaults to attention forward).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import BskError

FORWARDED = ("bench", "compare-88", "profile")


def _resolve(spec: str):
    from .config import resolve_config
    return resolve_config(spec)


# -- subcommands ----------------------------------------------------------------------------------------------

def cmd_generate(a: argparse.Namespace) -> int:
    from .codegen import generate
    cfg = _resolve(a.config)
    out = Path(a.output) if a.output else Path.cwd() / f"{cfg.kernel_name}.cu"
    generate(cfg, out)
    print(out)
    return 0


def _build_one(name: str, cfg, progress: bool | None):
    from .cache import ensure_built
    t0 = time.monotonic()
    entry = ensure_built(cfg, progress=progress)
    return name, entry, time.monotonic() - t0


def cmd_build(a: argparse.Namespace) -> int:
    from .config import load_named_configs
    if a.all and a.configs:
        raise BskError("give config names or --all, not both")
    if a.all:
        targets = list(load_named_configs().items())
    elif a.configs:
        targets = [(spec, _resolve(spec)) for spec in a.configs]
    else:
        raise BskError("nothing to build: give config names/files (see list-configs) or --all")
    jobs = max(1, a.jobs or 1)
    t0 = time.monotonic()
    failures: list[tuple[str, BaseException]] = []
    n_built = 0
    if len(targets) == 1 or jobs == 1:
        results = []
        for name, cfg in targets:
            try:
                results.append(_build_one(name, cfg, None))
            except BskError as e:
                failures.append((name, e))
            else:
                _report(*results[-1])
                n_built += results[-1][1].built
    else:
        # several nvcc at once: one line per finished kernel instead of competing progress lines
        print(f"building {len(targets)} kernels with {jobs} parallel nvcc ...", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = {pool.submit(_build_one, name, cfg, False): name for name, cfg in targets}
            for fut in as_completed(futs):
                try:
                    res = fut.result()
                except BskError as e:
                    failures.append((futs[fut], e))
                    print(f"FAILED {futs[fut]}", file=sys.stderr)
                else:
                    _report(*res)
                    n_built += res[1].built
    ok = len(targets) - len(failures)
    print(f"{ok}/{len(targets)} kernels ready ({n_built} compiled, {ok - n_built} cached) "
          f"in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    for name, e in failures:
        print(f"\nerror building {name}: {e}", file=sys.stderr)
    return 1 if failures else 0


def _report(name: str, entry, seconds: float) -> None:
    how = f"compiled in {entry.meta.get('build_seconds', seconds):.1f}s" if entry.built else "cached"
    print(f"{name}: {entry.kernel_name} ({how})\n  {entry.so_path}")


def cmd_list_configs(a: argparse.Namespace) -> int:
    from .config import load_named_configs
    configs = load_named_configs()
    if a.json:
        print(json.dumps({n: c.to_dict() for n, c in configs.items()}, indent=2, sort_keys=True))
        return 0
    width = max((len(n) for n in configs), default=4)
    print(f"{'name':<{width}}  {'smem':>7}  kernel_name")
    for n, c in configs.items():
        smem = c.smem_bytes() if hasattr(c, "smem_bytes") else ""
        print(f"{n:<{width}}  {smem:>7}  {c.kernel_name}")
    return 0


def cmd_cache(a: argparse.Namespace) -> int:
    from .cache import cache_clear, cache_ls, cache_root, failed_builds
    if a.action == "ls":
        entries = cache_ls(verify=getattr(a, "verify", False))
        print(f"cache: {cache_root()} ({len(entries)} entries)")
        for e in entries:
            flag = "" if e["valid"] else "  [corrupt: rebuilt on next use]"
            bs = e["build_seconds"]
            print(f"  {e['kernel_name']}  {e['key'][:16]}  {e['so_bytes'] / 1e6:.1f} MB  "
                  f"{'' if bs is None else f'{bs:.0f}s  '}{e['created'] or ''}{flag}")
        failed = failed_builds()
        if failed:
            print(f"failed builds kept ({len(failed)}):")
            for p in failed:
                print(f"  {p}")
        return 0
    report = cache_clear()
    print(f"removed {len(report.removed)} entries from {report.root}")
    if report.foreign:
        shown = ", ".join(report.foreign[:8]) + (" ..." if len(report.foreign) > 8 else "")
        print(f"left alone {len(report.foreign)} item(s) this package did not create: {shown}")
    for path, why in report.failed:
        print(f"error: could not remove {path}: {why}", file=sys.stderr)
    return 0 if report.ok else 2


def cmd_info(a: argparse.Namespace) -> int:
    from . import compiler
    from ._paths import configs_dir, source_root, templates_dir
    from .cache import cache_ls, cache_root
    rows: list[tuple[str, str]] = [("blackwell_sparsek", f"{__version__} ({Path(__file__).resolve().parent})")]
    root = source_root()
    rows.append(("source tree", str(root) if root else "none (installed package data)"))
    try:
        rows.append(("templates", str(templates_dir())))
        rows.append(("configs", str(configs_dir())))
    except BskError as e:
        rows.append(("templates", f"MISSING: {e}"))
    try:
        nvcc = compiler.find_nvcc()
        rows.append(("nvcc", f"{nvcc} (release {compiler.nvcc_release(compiler.nvcc_version(nvcc))})"))
    except BskError as e:
        rows.append(("nvcc", f"not found: {e}"))
    try:
        paths = compiler.cutlass_paths()
        rows.append(("CUTLASS", f"{compiler.cutlass_version(paths)} ({paths.root})"))
    except BskError as e:
        rows.append(("CUTLASS", f"not found: {e}"))
    rows.append(("GPU", _gpu_line()))
    rows.append(("cache dir", f"{cache_root()} ({len(cache_ls())} entries)"))
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("BSK_")]
    rows.append(("BSK_* env", " ".join(env) if env else "(none set)"))
    rows.append(("python", sys.version.split()[0]))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if a.verbose:
        try:
            print("\n" + compiler.nvcc_version(compiler.find_nvcc()))
        except BskError:
            pass
    return 0


def _gpu_line() -> str:
    from .runtime import device_info
    try:
        info = device_info(0)
        return (f"{info.name} (sm_{info.compute_capability[0]}{info.compute_capability[1]}, {info.sm_count} SMs, "
                f"{info.smem_optin} B opt-in smem)")
    except BskError as e:
        why = str(e).splitlines()[0][:160]
    except Exception as e:  # noqa: BLE001 - info must never crash
        why = f"{type(e).__name__}: {e}"[:160]
    try:
        import torch
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
        return f"none (torch {torch.__version__}: CUDA not available; cuda-python: {why})"
    except Exception:  # noqa: BLE001
        return f"none ({why})"


def _forward(sub: str, rest: Sequence[str]) -> int:
    try:
        from .bench.cli import main as bench_main
    except ImportError as e:
        missing = getattr(e, "name", "") or ""
        if missing.startswith("blackwell_sparsek.bench"):
            print(f"error: '{sub}' needs blackwell_sparsek.bench.cli, which this installation does not have "
                  f"({e})", file=sys.stderr)
            return 2
        raise
    rc = bench_main([sub, *rest])
    return int(rc or 0)


# -- entry point ----------------------------------------------------------------------------------------------

def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m blackwell_sparsek",
        description="Generate, build and inspect BlackwellSparseK block-sparse attention kernels.",
        epilog="CONFIG: a named config (see list-configs), a .json file, or inline JSON. "
               "bench, compare-88 and profile pass their arguments to blackwell_sparsek.bench.")
    p.add_argument("--version", action="version", version=f"blackwell_sparsek {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="write the CUDA source of a config")
    g.add_argument("config", metavar="CONFIG")
    g.add_argument("-o", "--output", help="output .cu path (default: ./<kernel_name>.cu)")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("build", help="compile configs into the cache (no GPU needed)")
    b.add_argument("configs", nargs="*", metavar="CONFIG")
    b.add_argument("--all", action="store_true", help="every named config in cutlass_configs/")
    b.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc (default: CPUs)")
    b.set_defaults(func=cmd_build)

    lc = sub.add_parser("list-configs", help="the named configs")
    lc.add_argument("--json", action="store_true")
    lc.set_defaults(func=cmd_list_configs)

    c = sub.add_parser("cache", help="inspect or clear the kernel cache")
    c.add_argument("action", choices=("ls", "clear"))
    c.set_defaults(func=cmd_cache)

    i = sub.add_parser("info", help="toolchain, CUTLASS, GPU and cache facts")
    i.add_argument("-v", "--verbose", action="store_true", help="also print the full nvcc --version")
    i.set_defaults(func=cmd_info)

    for name in FORWARDED:
        sub.add_parser(name, help=f"forwarded to blackwell_sparsek.bench ({name} --help for its options)",
                       add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        return _forward(argv[0], argv[1:])
    parser = make_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    try:
        return a.func(a)
    except BskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
