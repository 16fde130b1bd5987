"""CUTLASS example 88 (``88_hopper_fmha``): find its source in the nvidia-cutlass wheel, build it once with nvcc,
cache the binary, run it and parse what it prints.

Example 88 is the dense Hopper FMHA our kernels measure themselves against (docs/benchmarks.md). It times
``--iterations`` back-to-back launches of each of its kernels with CUDA events and prints, per kernel::

    ###### B 2 H 16 Q 8192 K 8192 D 128 Forward Full #SM 132
     [--]  tma ws cooperative 128x128x128    : 652.3 TFLOPS/s
           t=1.69ms, smem=164096b                 (only with --verbose)

``[OK]`` replaces ``[--]`` when ``--verify`` checked the result, ``[FAIL]`` marks a kernel that failed.

Binary resolution order (:func:`locate`): ``$BSK_EX88_BIN`` → the artifact store that also holds our kernels
(``jit/store.py``: entry ``cutlass_ex88_hopper_fmha-<key16>/88_hopper_fmha``, same locks, staging, trust checks) →
build (many minutes on a small machine).

Command line (maintenance)::

    python -m blackwell_sparsek.bench.ex88 locate            # path of the cached binary (builds if missing)
    python -m blackwell_sparsek.bench.ex88 key               # the cache key and what it is made of
    python -m blackwell_sparsek.bench.ex88 import PATH       # adopt a binary built with exactly build_command()
    python -m blackwell_sparsek.bench.ex88 run --b 2 --h 16 --q 8192 --d 128 [--mask causal]
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import _env
from ..jit.compiler import _Progress as compiler_progress
from ..jit.compiler import cutlass_root, describe_exit, nvcc_version, read_cutlass_version, run_compiler
from ..jit.compiler import find_nvcc as compiler_find_nvcc
from ..errors import KernelCompileError, ToolchainError
from ..jit import store, trust
from ..jit.store import sha256_file

EX88 = "88_hopper_fmha"
STORE_NAME = "cutlass_ex88_hopper_fmha"  # its entries in the artifact store: <STORE_NAME>-<key16>/
CACHE_FORMAT = 2
# The flags of the example's CMake target for sm_90a (see docs/benchmarks.md); paths are added by build_command().
BASE_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O3", "--use_fast_math", "-DNDEBUG", "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
)
# No -lcuda: CUTLASS reaches the driver through cudaGetDriverEntryPoint, so this links without a driver library.
LINK_FLAGS: tuple[str, ...] = ()
BUILD_LOCK_TIMEOUT_S = 3 * 3600.0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Toolchain discovery
# ---------------------------------------------------------------------------------------------------------------

def cutlass_source_dir() -> Path:
    """The CUTLASS tree the kernels compile against (compiler.cutlass_root), checked for example 88's source."""
    p = cutlass_root()
    if not (p / "examples" / EX88 / f"{EX88}.cu").is_file():
        raise ToolchainError(f"the CUTLASS tree at {p} has no examples/{EX88}/{EX88}.cu "
                             f"(needs nvidia-cutlass >= 4.0 with its examples)")
    return p


def find_nvcc() -> Path:
    return Path(compiler_find_nvcc())


def _cuda_homes() -> list[Path]:
    homes = _env.cuda_homes()
    try:
        homes.append(find_nvcc().resolve().parent.parent)
    except ToolchainError:
        pass
    homes.append(Path("/usr/local/cuda"))
    return homes


def _nvidia_pkg_dirs() -> list[Path]:
    """Directories of the ``nvidia`` namespace package (pip wheels nvidia-curand, nvidia-cuda-runtime, ...)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def find_curand_include(cuda_homes: Iterable[Path] | None = None,
                        nvidia_dirs: Iterable[Path] | None = None) -> Path:
    """Directory holding ``curand_kernel.h`` (example 88's host reference code includes it).

    Looks in (a) the CUDA toolkit's include dirs, (b) the pip package ``nvidia-curand`` (``nvidia/cu13/include``
    for CUDA 13 wheels, ``nvidia/curand/include`` for CUDA 12 wheels). Raises ToolchainError saying how to get it.
    """
    homes = list(cuda_homes) if cuda_homes is not None else _cuda_homes()
    pkgs = list(nvidia_dirs) if nvidia_dirs is not None else _nvidia_pkg_dirs()
    looked: list[str] = []
    for h in homes:
        for inc in (h / "include", h / "targets" / "x86_64-linux" / "include", h / "targets" / "sbsa-linux" / "include"):
            looked.append(str(inc))
            if (inc / "curand_kernel.h").is_file():
                return inc
    for d in pkgs:
        for inc in [d / "cu13" / "include", d / "curand" / "include", d / "cu12" / "include",
                    *sorted(d.glob("*/include"))]:
            if str(inc) in looked:
                continue
            looked.append(str(inc))
            if (inc / "curand_kernel.h").is_file():
                return inc
    raise ToolchainError(
        "curand_kernel.h not found (CUTLASS example 88 needs it); looked in:\n  " + "\n  ".join(looked or ["(nothing)"])
        + "\nfix: `pip install nvidia-curand` (the wheel torch's CUDA builds depend on) or install the CUDA "
          "toolkit's curand headers (e.g. apt-get install libcurand-dev-13-0), or set CUDA_HOME")


# ---------------------------------------------------------------------------------------------------------------
# Build command and cache key
# ---------------------------------------------------------------------------------------------------------------

def build_command(nvcc: Path | str, src: Path, curand_inc: Path | str, out: Path | str) -> list[str]:
    return [str(nvcc), *BASE_FLAGS,
            f"-I{src}/include", f"-I{src}/tools/util/include", f"-I{src}/examples/common",
            f"-I{src}/examples/{EX88}", "-isystem", str(curand_inc),
            "-o", str(out), f"{src}/examples/{EX88}/{EX88}.cu", *LINK_FLAGS]


def _symbolic_flags() -> list[str]:
    """The build flags with machine-specific paths replaced by their roles (the key must not depend on where
    site-packages is)."""
    return [*BASE_FLAGS, "-I<cutlass>/include", "-I<cutlass>/tools/util/include", "-I<cutlass>/examples/common",
            f"-I<cutlass>/examples/{EX88}", "-isystem", "<curand>", *LINK_FLAGS]


def source_hash(src: Path) -> str:
    """sha256 over example 88's own directory and examples/common (relative path + content, sorted)."""
    h = hashlib.sha256()
    for sub in (f"examples/{EX88}", "examples/common"):
        base = src / sub
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(src)).encode() + b"\0")
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def key_fields(src: Path, nvcc_ver: str) -> dict[str, Any]:
    version_h = src / "include" / "cutlass" / "version.h"
    return {
        "what": f"cutlass-example-{EX88}",
        "format": CACHE_FORMAT,
        "flags": _symbolic_flags(),
        "nvcc_version": nvcc_ver,
        "cutlass_version_h_sha256": sha256_file(version_h),
        "cutlass_version": read_cutlass_version(version_h),
        "source_sha256": source_hash(src),
    }


def cache_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass
class Toolchain:
    nvcc: Path
    nvcc_version: str
    src: Path
    fields: dict[str, Any]
    key: str

    @classmethod
    def discover(cls) -> "Toolchain":
        src = cutlass_source_dir()
        nvcc = find_nvcc()
        ver = nvcc_version(str(nvcc))
        fields = key_fields(src, ver)
        return cls(nvcc, ver, src, fields, cache_key(fields))

    @property
    def entry(self) -> Path:
        return store.entry_dir(store.root(), STORE_NAME, self.key)


def cached_binary(tc: Toolchain | None = None) -> Path | None:
    """The cached, verified, executable binary for this toolchain, or None."""
    tc = tc or Toolchain.discover()
    hit = store.lookup(STORE_NAME, tc.key)
    if hit is None or not os.access(hit.artifact_path, os.X_OK):
        return None
    return hit.artifact_path


def _store(tc: Toolchain, produce) -> Path:
    entry = store.build(STORE_NAME, tc.key, EX88, produce, what="CUTLASS example 88",
                        lock_timeout=max(_env.lock_timeout(), BUILD_LOCK_TIMEOUT_S))
    return entry.artifact_path


def build(tc: Toolchain | None = None, *, progress: bool = True) -> Path:
    """Build example 88 into the cache (or return the cached binary). Takes many minutes on a small machine."""
    tc = tc or Toolchain.discover()
    hit = cached_binary(tc)
    if hit:
        return hit
    curand = find_curand_include()

    def produce(dirs: store.BuildDirs) -> dict[str, Any]:
        cmd = build_command(tc.nvcc, tc.src, curand, EX88)
        (dirs.staging / "command.txt").write_text(" ".join(cmd) + "\n")
        if progress:
            _log(f"[bsk] compiling CUTLASS example 88 ({tc.fields['cutlass_version']}) with {tc.nvcc}; this takes "
                 f"several minutes (one translation unit, ~10 kernels)")
        t0 = time.monotonic()
        with compiler_progress("CUTLASS example 88", progress):
            rc, log = run_compiler(cmd, dirs.staging)
        elapsed = time.monotonic() - t0
        (dirs.staging / "build.log").write_text(log)
        if rc != 0 or not (dirs.staging / EX88).is_file():
            shutil.move(str(dirs.staging), str(dirs.failed))
            errs = [ln for ln in log.splitlines() if "error" in ln.lower()][:10] or log.splitlines()[-10:]
            raise KernelCompileError(
                f"nvcc failed building CUTLASS example 88 ({describe_exit(rc)}, {elapsed:.0f} s):\n  "
                + "\n  ".join(errs) + f"\nrepro: cd {dirs.failed} && {' '.join(cmd)}"
                + f"\nbuild dir kept: {dirs.failed}")
        if progress:
            _log(f"[bsk] example 88 built in {elapsed:.0f} s")
        return {**tc.fields, "build_seconds": round(elapsed, 1), "curand_include": str(curand), "command": cmd}

    return _store(tc, produce)


def import_binary(path: str | os.PathLike[str], tc: Toolchain | None = None, *, note: str = "") -> Path:
    """Adopt a binary built with exactly :func:`build_command` (same flags, this nvcc, this CUTLASS) into the cache."""
    src_bin = Path(path)
    if not src_bin.is_file():
        raise ToolchainError(f"no binary at {src_bin}")
    tc = tc or Toolchain.discover()

    def produce(dirs: store.BuildDirs) -> dict[str, Any]:
        shutil.copyfile(src_bin, dirs.staging / EX88)
        os.chmod(dirs.staging / EX88, 0o700)
        return {**tc.fields, "imported_from": str(src_bin.resolve()), "note": note}

    return _store(tc, produce)


def _check_user_binary(p: Path) -> None:
    """BSK_EX88_BIN runs as this user: it and its directory must be writable by nobody but its owner, who must be
    this user or root (the store's rule for what it runs)."""
    for q in (p.parent.resolve(), p.resolve()):
        trust.check_path(q)


def locate(*, build_if_missing: bool = True, progress: bool = True) -> Path:
    """Path of a runnable example-88 binary: $BSK_EX88_BIN, else the cache, else build it (if allowed)."""
    env = _env.path("BSK_EX88_BIN")
    if env:
        if not (env.is_file() and os.access(env, os.X_OK)):
            raise ToolchainError(f"BSK_EX88_BIN={env} is not an executable file")
        _check_user_binary(env)
        return env
    tc = Toolchain.discover()
    hit = cached_binary(tc)
    if hit:
        return hit
    if not build_if_missing:
        raise ToolchainError(
            f"CUTLASS example 88 is not built (cache entry {tc.entry} missing); build it with "
            f"`python -m blackwell_sparsek.bench.ex88 locate` (several minutes) or set BSK_EX88_BIN")
    return build(tc, progress=progress)


# ---------------------------------------------------------------------------------------------------------------
# Running and parsing
# ---------------------------------------------------------------------------------------------------------------

_HEADER = re.compile(
    r"^#+\s*B\s+(?P<b>\d+)\s+H\s+(?P<h>\d+)\s+Q\s+(?P<q>\d+)\s+K\s+(?P<k>\d+)\s+D\s+(?P<d>\d+)\s+"
    r"(?P<dir>Forward|Backward)\s+(?P<mask>\w+)(?:\s+#SM\s+(?P<sm>\d+))?")
_RESULT = re.compile(r"^\s*\[\s*(?P<st>OK|--|FAIL)\s*\]\s*(?P<name>.*?)\s*:\s*(?P<val>\S+)\s+TFLOPS/s")
_VERBOSE = re.compile(r"^\s*t=(?P<ms>[-+0-9.eE]+|nan|inf)\s*ms\s*,\s*smem=(?P<smem>\d+)\s*b")
_STATUS = {"OK": "ok", "--": "unverified", "FAIL": "fail"}


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("nan")


def parse_output(text: str) -> list[dict[str, Any]]:
    """Records ``{kernel, tflops, status, time_ms, smem_bytes, b, h, q, k, d, direction, mask, sm_count}`` from
    example 88's stdout. ``status`` is 'ok' (verified), 'unverified' (ran, not checked) or 'fail'. Lines before the
    first header (or without one) get shape fields None. Accepts several sections (comma-separated CLI values)."""
    recs: list[dict[str, Any]] = []
    hdr: dict[str, Any] = {k: None for k in ("b", "h", "q", "k", "d", "direction", "mask", "sm_count")}
    for line in text.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            hdr = {"b": int(m["b"]), "h": int(m["h"]), "q": int(m["q"]), "k": int(m["k"]), "d": int(m["d"]),
                   "direction": m["dir"].lower(), "mask": m["mask"].lower(),
                   "sm_count": int(m["sm"]) if m["sm"] else None}
            continue
        m = _RESULT.match(line)
        if m:
            recs.append({"kernel": m["name"].strip(), "tflops": _float(m["val"]), "status": _STATUS[m["st"]],
                         "time_ms": None, "smem_bytes": None, **hdr})
            continue
        m = _VERBOSE.match(line)
        if m and recs:
            recs[-1]["time_ms"] = _float(m["ms"])
            recs[-1]["smem_bytes"] = int(m["smem"])
    return recs


def flops(b: int, h: int, q: int, k: int, d: int, causal: bool, backward: bool = False) -> float:
    """Example 88's own flop count: 4·B·H·Q·K·D, halved for causal (its backward uses the same formula)."""
    f = 4.0 * b * h * q * k * d
    return f * 0.5 if causal else f


class Ex88Error(RuntimeError):
    pass


def run(binary: Path | str, *, b: int, h: int, q: int, k: int | None = None, d: int, mask: str = "no",
        iterations: int = 20, verify: bool = False, bwd: bool = False, timeout: float = 600.0) -> dict[str, Any]:
    """One invocation. Returns {'records': [...], 'stdout', 'stderr', 'returncode', 'argv', 'wall_s'}."""
    if mask not in ("no", "causal", "residual"):
        raise ValueError(f"mask must be no|causal|residual, got {mask!r}")
    k = q if k is None else k
    argv = [str(binary), f"--b={b}", f"--h={h}", f"--q={q}", f"--k={k}", f"--d={d}", f"--mask={mask}",
            f"--iterations={iterations}", "--verbose"]
    if verify:
        argv.append("--verify")
    if bwd:
        argv.append("--bwd")
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Ex88Error(f"example 88 timed out after {timeout:.0f} s: {' '.join(argv)}") from e
    wall = time.monotonic() - t0
    out = {"argv": argv, "returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr,
           "wall_s": wall, "records": parse_output(p.stdout)}
    if "requires a GPU of NVIDIA's Hopper" in p.stdout:
        raise Ex88Error("example 88 needs a Hopper GPU (sm_90): " + p.stdout.strip().splitlines()[-1])
    if "No forward kernel instantiated" in p.stdout or "No backward kernel instantiated" in p.stdout:
        raise Ex88Error(f"example 88 has no kernel for d={d}: {p.stdout.strip()}")
    if not out["records"]:
        tail = (p.stderr.strip() + "\n" + p.stdout.strip()).strip()[-800:]
        raise Ex88Error(f"example 88 printed no results (rc={p.returncode}): {tail or '(no output)'}")
    return out


def summarize(runs: Sequence[Sequence[dict[str, Any]]], *, causal: bool) -> list[dict[str, Any]]:
    """Median over invocations, per kernel: [{kernel, tflops, time_ms, status, samples_tflops, ...}] in the order
    example 88 printed them. ``time_ms`` comes from --verbose when present, else from the flop count."""
    order: list[str] = []
    by: dict[str, list[dict[str, Any]]] = {}
    for recs in runs:
        for r in recs:
            if r["kernel"] not in by:
                order.append(r["kernel"])
                by[r["kernel"]] = []
            by[r["kernel"]].append(r)
    out = []
    for name in order:
        rs = by[name]
        good = [r for r in rs if r["status"] != "fail" and r["tflops"] == r["tflops"] and r["tflops"] > 0]
        first = rs[0]
        rec: dict[str, Any] = {"kernel": name, "samples_tflops": [r["tflops"] for r in rs],
                               "status": "fail" if not good else ("ok" if all(r["status"] == "ok" for r in good)
                                                                  else "unverified"),
                               "failures": len(rs) - len(good)}
        for f in ("b", "h", "q", "k", "d", "sm_count", "smem_bytes"):
            rec[f] = first.get(f)
        if good:
            rec["tflops"] = statistics.median(r["tflops"] for r in good)
            times = [r["time_ms"] for r in good if r.get("time_ms")]
            if times:
                rec["time_ms"] = statistics.median(times)
            elif None not in (first["b"], first["h"], first["q"], first["k"], first["d"]):
                fl = flops(first["b"], first["h"], first["q"], first["k"], first["d"], causal)
                rec["time_ms"] = fl / (rec["tflops"] * 1e12) * 1e3
            else:
                rec["time_ms"] = None
        else:
            rec["tflops"] = None
            rec["time_ms"] = None
        out.append(rec)
    return out


def best(summary: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in summary if r.get("tflops")]
    return max(ok, key=lambda r: r["tflops"]) if ok else None


def measure(binary: Path | str, *, b: int, h: int, q: int, d: int, k: int | None = None, causal: bool = False,
            iterations: int = 20, repeats: int = 3, verify: bool = False,
            timeout: float = 600.0) -> dict[str, Any]:
    """Run example 88 ``repeats`` times (each: ``iterations`` timed launches per kernel); median per kernel."""
    mask = "causal" if causal else "no"
    raws = []
    for i in range(repeats):
        r = run(binary, b=b, h=h, q=q, k=k, d=d, mask=mask, iterations=iterations,
                verify=verify and i == 0, timeout=timeout)
        raws.append(r)
    summ = summarize([r["records"] for r in raws], causal=causal)
    return {"shape": {"b": b, "h": h, "q": q, "k": q if k is None else k, "d": d}, "causal": causal,
            "iterations": iterations, "repeats": repeats, "kernels": summ, "best": best(summ),
            "stderr_tail": "\n".join(r["stderr"] for r in raws).strip()[-2000:]}


# ---------------------------------------------------------------------------------------------------------------

def _main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m blackwell_sparsek.bench.ex88", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("key", help="print the cache key and its fields")
    loc = sub.add_parser("locate", help="print the binary path (build if missing)")
    loc.add_argument("--no-build", action="store_true")
    imp = sub.add_parser("import", help="adopt a binary built with exactly build_command() into the cache")
    imp.add_argument("path")
    imp.add_argument("--note", default="")
    r = sub.add_parser("run", help="run and print parsed records")
    for f, dflt in (("b", 2), ("h", 16), ("q", 8192), ("k", None), ("d", 128)):
        r.add_argument(f"--{f}", type=int, default=dflt)
    r.add_argument("--mask", default="no", choices=["no", "causal", "residual"])
    r.add_argument("--iterations", type=int, default=20)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--verify", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "key":
            tc = Toolchain.discover()
            print(json.dumps({"key": tc.key, "entry": str(tc.entry), **tc.fields}, indent=2))
            print("build command:", " ".join(build_command(tc.nvcc, tc.src, find_curand_include(), EX88)))
        elif a.cmd == "locate":
            print(locate(build_if_missing=not a.no_build))
        elif a.cmd == "import":
            print(import_binary(a.path, note=a.note))
        elif a.cmd == "run":
            binp = locate()
            res = measure(binp, b=a.b, h=a.h, q=a.q, k=a.k, d=a.d, causal=a.mask == "causal",
                          iterations=a.iterations, repeats=a.repeats, verify=a.verify)
            print(json.dumps(res, indent=2))
    except (ToolchainError, KernelCompileError, Ex88Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
