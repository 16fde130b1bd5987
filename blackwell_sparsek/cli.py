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

from . import __version__, _env
from .errors import BskError

FORWARDED = ("bench", "compare-88", "profile", "bench-bwd")


def _resolve(spec: str):
    from .jit.spec import resolve_config
    return resolve_config(spec)


# -- subcommands ----------------------------------------------------------------------------------------------

def cmd_generate(a: argparse.Namespace) -> int:
    from .jit.codegen import generate
    cfg = _resolve(a.config)
    if a.output:
        target: str | Path = a.output
    else:  # the user asked for the current directory by leaving -o out
        try:
            target = Path.cwd()
        except OSError as e:
            raise BskError(f"the current directory is unusable ({e.strerror or e}); give -o PATH") from None
    print(generate(cfg, target))
    return 0


def _build_one(name: str, cfg, progress: bool | None):
    from .jit.kernels import ensure_built
    t0 = time.monotonic()
    entry = ensure_built(cfg, progress=progress)
    return name, entry, time.monotonic() - t0


def cmd_build(a: argparse.Namespace) -> int:
    from .jit.spec import load_named_configs
    if a.all and a.configs:
        raise BskError("give config names or --all, not both")
    if a.all:
        targets = list(load_named_configs().items())
    elif a.configs:
        targets = [(spec, _resolve(spec)) for spec in a.configs]
    else:
        raise BskError("nothing to build: give config names/files (see list-configs) or --all")
    jobs = max(1, min(a.jobs or 1, len(targets)))
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
    return EXIT_ERROR if failures else 0


def _number(value, spec: str) -> str | None:
    """``value`` formatted, or None when it is not a number (cache metadata is a file anyone can edit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return format(value, spec)


def _report(name: str, entry, seconds: float) -> None:
    meta = entry.meta if isinstance(getattr(entry, "meta", None), dict) else {}
    took = _number(meta.get("build_seconds"), ".1f") or f"{seconds:.1f}"
    how = f"compiled in {took}s" if entry.built else "cached"
    print(f"{name}: {entry.kernel_name} ({how})\n  {entry.so_path}")


def cmd_list_configs(a: argparse.Namespace) -> int:
    from .jit.spec import load_named_configs
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
    from .jit.kernels import cache_clear, cache_ls, cache_root, failed_builds
    if a.action == "ls":
        entries = cache_ls(verify=a.verify)
        print(f"cache: {cache_root()} ({len(entries)} entries)")
        for e in entries:
            flag = "" if e.get("valid") else "  [corrupt: rebuilt on next use]"
            so = e.get("so_bytes")
            mb = _number(so / 1e6, ".1f") if _number(so, "") is not None else None
            bs = _number(e.get("build_seconds"), ".0f")
            print(f"  {e.get('kernel_name')}  {str(e.get('key') or '')[:16]}  {mb + ' MB  ' if mb else ''}"
                  f"{bs + 's  ' if bs else ''}{e.get('created') or ''}{flag}")
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
    from .jit import compiler
    from ._paths import configs_dir, source_root, templates_dir
    from .jit.kernels import cache_ls, cache_root
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
    try:
        rows.append(("cache dir", f"{cache_root()} ({len(cache_ls())} entries)"))
    except (BskError, OSError) as e:  # info reports a broken cache setting instead of dying on it
        rows.append(("cache dir", f"unusable: {e}"))
    env = [f"{k}={v}" for k, v in _env.snapshot().items()]
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
    from .jit.runtime import device_info
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
            return EXIT_ERROR
        raise
    rc = bench_main([sub, *rest])
    return int(rc or 0)


# -- entry point ----------------------------------------------------------------------------------------------

# Exit status of every failure this package reports on purpose (a BskError), like argparse's usage errors.
EXIT_ERROR = 2


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m blackwell_sparsek",
        description="Generate, build and inspect BlackwellSparseK block-sparse attention kernels.",
        epilog="CONFIG: a named config (see list-configs), a .json file, or inline JSON such as "
               "'{\"head_dim\": 64, \"dtype\": \"bf16\"}' (the family defaults to attention forward). "
               "bench, compare-88 and profile pass their arguments to blackwell_sparsek.bench. "
               "Exit status: 0 ok, 2 error (the message says what to change).")
    p.add_argument("--version", action="version", version=f"blackwell_sparsek {__version__}",
                   help="print the package version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", help="one of these (COMMAND --help for its options)")
    config_help = "named config, .json file or inline JSON"

    g = sub.add_parser("generate", help="write the CUDA source of a config",
                       description="Render a config's CUDA source (no nvcc, no GPU) and print the path written.")
    g.add_argument("config", metavar="CONFIG", help=config_help)
    g.add_argument("-o", "--output", metavar="PATH",
                   help="output .cu file, or an existing directory (or a path ending in /) that gets "
                        "<kernel_name>.cu; parents are created (default: ./<kernel_name>.cu)")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("build", help="compile configs into the cache (no GPU needed)",
                       description="Compile configs with nvcc into the kernel cache ($BSK_CACHE_DIR or "
                                   "~/.cache/blackwell_sparsek); cached kernels are not rebuilt.")
    b.add_argument("configs", nargs="*", metavar="CONFIG", help=f"configs to build ({config_help})")
    b.add_argument("--all", action="store_true", help="every named config in cutlass_configs/")
    b.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="parallel nvcc processes (default: CPUs, at most one per config)")
    b.set_defaults(func=cmd_build)

    lc = sub.add_parser("list-configs", help="the named configs",
                        description="List the named configs shipped in cutlass_configs/ with shared memory and "
                                    "kernel name.")
    lc.add_argument("--json", action="store_true",
                    help="print every named config's fields as one JSON object keyed by name (for scripts)")
    lc.set_defaults(func=cmd_list_configs)

    c = sub.add_parser("cache", help="list or clear the kernel cache",
                       description="The kernel cache: $BSK_CACHE_DIR, default ~/.cache/blackwell_sparsek.")
    cs = c.add_subparsers(dest="action", metavar="ACTION", required=True,
                          help="what to do (ACTION --help for its options)")
    ls = cs.add_parser("ls", help="list cached kernels (name, key, size, build time, corrupt ones) and kept "
                                  "failed builds",
                       description="List the cache's entries and the failed builds kept for inspection.")
    ls.add_argument("--verify", action="store_true",
                    help="also re-hash each entry's .so and check its key against its metadata (slower); "
                         "mismatches are listed as corrupt")
    cl = cs.add_parser("clear", help="remove only the entries this package created; report what could not "
                                     "be removed",
                       description="Remove the cache entries this package created (kernels, example-88 "
                                   "binaries, failed builds, stale staging); anything else under the cache "
                                   "directory is left alone.")
    for sp in (ls, cl):
        sp.set_defaults(func=cmd_cache)

    i = sub.add_parser("info", help="toolchain, CUTLASS, GPU and cache facts",
                       description="Print versions and paths: package, nvcc, CUTLASS, GPU, cache, BSK_* "
                                   "variables.")
    i.add_argument("-v", "--verbose", action="store_true", help="also print the full nvcc --version")
    i.set_defaults(func=cmd_info)

    for name in FORWARDED:
        sub.add_parser(name, help=f"forwarded to blackwell_sparsek.bench ({name} --help for its options)",
                       add_help=False)
    return p


def _run(func, *args) -> int:
    """``func(*args)`` with every error this package raises on purpose turned into one line and exit status 2."""
    try:
        return func(*args)
    except BskError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:
        # A file-system failure no layer turned into a typed error yet (e.g. BSK_CACHE_DIR naming a file): one
        # line naming the path, never a traceback.
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        return _run(_forward, argv[0], argv[1:])
    parser = make_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return EXIT_ERROR
    return _run(a.func, a)
