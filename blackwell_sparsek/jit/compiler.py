"""nvcc: discovery, flags, CUTLASS include paths, the toolchain fingerprint, and one compile.

Environment (read through _env): BSK_NVCC, BSK_CUTLASS_DIR, BSK_LINEINFO, BSK_NVCC_FLAGS, BSK_VERBOSE.

nvcc runs under a small reaper process in a process group of its own: whatever ends the build (an error, Ctrl-C,
SIGTERM, or this process dying outright: the reaper gets a parent-death signal) ends nvcc and every cicc/ptxas it
started, so no compiler is left running.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import _env
from .._paths import include_dir
from .spec import Arch, KernelConfig
from ..errors import KernelCompileError, ToolchainError

BASE_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O3", "--use_fast_math", "-DNDEBUG", "--expt-relaxed-constexpr",
    "-Xcompiler", "-fPIC", "-shared",
)
# No -lcuda: CUTLASS reaches the driver (cuTensorMapEncodeTiled) through cudaGetDriverEntryPoint, so the
# .so links on machines without a driver library (CI, this build host) and runs on any GPU machine.
LINK_FLAGS: tuple[str, ...] = ()
SOURCE_NAME = "kernel.cu"
OUTPUT_NAME = "kernel.so"
LOG_NAME = "nvcc.log"
COMMAND_NAME = "command.sh"

_NVCC_HELP = ("set BSK_NVCC=/path/to/nvcc, or CUDA_HOME to a CUDA toolkit (>= 12.3, with sm_90a), "
              "or put nvcc on PATH")


def verbose() -> bool:
    return _env.flag("BSK_VERBOSE")


# -- nvcc ---------------------------------------------------------------------------------------------------

def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_nvcc() -> str:
    """Path of nvcc: $BSK_NVCC, then $CUDA_HOME/bin/nvcc ($CUDA_PATH too), then PATH."""
    env = _env.text("BSK_NVCC")
    if env:
        p = Path(env).expanduser()
        if not _is_exe(p):
            raise ToolchainError(f"BSK_NVCC={env} is not an executable file; point it at nvcc or unset it")
        return str(p)
    for home in _env.cuda_homes():
        p = home / "bin" / "nvcc"
        if _is_exe(p):
            return str(p)
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    if _is_exe(default):
        return str(default)
    raise ToolchainError(f"nvcc not found (looked at $BSK_NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin): "
                         f"{_NVCC_HELP}")


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """Full ``nvcc --version`` output (memoized per process and path)."""
    try:
        r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run {nvcc} --version: {e}; {_NVCC_HELP}") from None
    if r.returncode != 0:
        raise ToolchainError(f"{nvcc} --version failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r.stdout.strip()


def nvcc_release(version_text: str) -> str:
    """``13.0`` from nvcc's version text ("Cuda compilation tools, release 13.0, V13.0.88"), else the last line."""
    m = re.search(r"release\s+([0-9][0-9.]*)", version_text)
    if m:
        return m.group(1)
    lines = version_text.strip().splitlines()
    return lines[-1] if lines else "unknown"


# -- CUTLASS --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CutlassPaths:
    root: Path
    include: Path
    util_include: Path
    example88: Path

    def include_dirs(self, roles: tuple[str, ...] = ("cutlass", "cutlass_ex88")) -> list[Path]:
        """The trees of a family's include roles (KernelConfig.includes), in command-line order."""
        by_role = {"cutlass": [self.include, self.util_include], "cutlass_ex88": [self.example88]}
        unknown = [r for r in roles if r not in by_role]
        if unknown:
            raise ToolchainError(f"unknown include role(s) {unknown}; known: {sorted(by_role)}")
        return [d for r in roles for d in by_role[r]]


def cutlass_root() -> Path:
    """The CUTLASS source tree: $BSK_CUTLASS_DIR, else ``cutlass_library.source_path`` (nvidia-cutlass wheel)."""
    env = _env.path("BSK_CUTLASS_DIR")
    if env:
        return env
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("CUTLASS not found: pip install nvidia-cutlass==4.2.0.0 "
                             "(or set BSK_CUTLASS_DIR to a CUTLASS checkout)")
    pkg = Path(list(spec.submodule_search_locations)[0])
    if (pkg / "source").is_dir():  # what cutlass_library.source_path resolves to for the wheel
        return pkg / "source"
    import cutlass_library  # a source checkout: let the package say where it lives
    return Path(cutlass_library.source_path)


def cutlass_paths() -> CutlassPaths:
    root = cutlass_root().resolve()
    paths = CutlassPaths(root, root / "include", root / "tools" / "util" / "include",
                         root / "examples" / "88_hopper_fmha")
    if not (paths.include / "cutlass" / "version.h").is_file():
        raise ToolchainError(f"{paths.include}/cutlass/version.h missing: {root} is not a CUTLASS source tree; "
                             f"pip install nvidia-cutlass==4.2.0.0 or fix BSK_CUTLASS_DIR")
    return paths


@lru_cache(maxsize=None)
def _cutlass_version_at(version_h: Path, mtime_ns: int) -> str:
    text = version_h.read_text(errors="replace")
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"#define\s+CUTLASS_{part}\s+(\d+)", text)
        if not m:
            raise ToolchainError(f"cannot read CUTLASS_{part} from {version_h}")
        parts.append(m.group(1))
    return ".".join(parts)


def read_cutlass_version(version_h: Path) -> str:
    """``MAJOR.MINOR.PATCH`` from a CUTLASS ``version.h`` (memoized while the file is unchanged)."""
    return _cutlass_version_at(version_h, version_h.stat().st_mtime_ns)


def cutlass_version(paths: CutlassPaths | None = None) -> str:
    """CUTLASS version from include/cutlass/version.h (never from wheel metadata)."""
    return read_cutlass_version((paths or cutlass_paths()).include / "cutlass" / "version.h")


@lru_cache(maxsize=None)
def tree_signature(dirs: tuple[Path, ...]) -> str:
    """sha256 over (relative path, content) of every file under ``dirs``, memoized per process.

    Content, not mtimes: the same wheel installed on another machine (the GPU host, CI) gives the same
    signature, so a kernel built here is a cache hit there. The content hash is remembered on disk under the
    cache root, keyed by the cheap (path, size, mtime) listing, so a fresh process pays only the listing.
    """
    files: list[tuple[str, str, os.stat_result]] = []
    for d in dirs:
        if not d.is_dir():
            files.append((f"[{d.name}]<missing>", "", None))  # type: ignore[arg-type]
            continue
        for dirpath, dirnames, filenames in os.walk(d):
            dirnames.sort()
            for f in sorted(filenames):
                p = os.path.join(dirpath, f)
                try:
                    files.append((f"[{d.name}]{os.path.relpath(p, d)}", p, os.stat(p)))
                except OSError:
                    continue
    listing = hashlib.sha256("\n".join(
        f"{rel}\0{p}\0{st.st_size}\0{st.st_mtime_ns}" if st else rel for rel, p, st in files).encode()).hexdigest()
    from . import store
    text = store.memo_get(listing)
    if text is not None and len(text) == 64:
        return text
    h = hashlib.sha256()
    for rel, p, st in files:
        h.update(rel.encode() + b"\0")
        if st is not None:
            with open(p, "rb") as fh:
                h.update(fh.read())
        h.update(b"\0")
    digest = h.hexdigest()
    store.memo_put(listing, digest)
    return digest


_headers_memo: dict[tuple, tuple[tuple, str]] = {}
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _included_headers(d: Path, source: str) -> list[Path]:
    """Our headers that ``source`` includes, directly or through each other: quoted includes resolved as the
    preprocessor does (the including file's folder, then ``d``); anything else (CUTLASS, system) is left out."""
    seen: dict[Path, None] = {}
    todo = [(None, name) for name in _INCLUDE_RE.findall(source)]
    while todo:
        here, name = todo.pop()
        for base in ((here,) if here is not None else ()) + (d,):
            p = (base / name).resolve()
            if p.is_file() and d in p.parents:
                if p not in seen:
                    seen[p] = None
                    todo += [(p.parent, n) for n in _INCLUDE_RE.findall(p.read_text(errors="replace"))]
                break
    return sorted(seen)


def headers_hash(directory: Path | None = None, source: str | None = None) -> str:
    """sha256 over the content of our own headers (templates/include): those ``source`` includes (transitively)
    when it is given, so an edit to one family's headers leaves the other families' cache keys as they were;
    every header when not. Re-read only when a file's stat changes."""
    d = Path(directory or include_dir()).resolve()
    if not d.is_dir():
        files = []
    elif source is None:
        files = sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    else:
        files = _included_headers(d, source)
    stat_sig = tuple((str(p.relative_to(d)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    memo_key = (str(d), None if source is None else hashlib.sha256(source.encode()).hexdigest())
    memo = _headers_memo.get(memo_key)
    if memo is not None and memo[0] == stat_sig:
        return memo[1]
    h = hashlib.sha256()
    for (rel, _, _), p in zip(stat_sig, files):
        h.update(rel.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    digest = h.hexdigest()
    _headers_memo[memo_key] = (stat_sig, digest)
    return digest


def clear_memos() -> None:
    """Forget every per-process memo (tests; a toolkit swapped under a long-running process)."""
    nvcc_version.cache_clear()
    _cutlass_version_at.cache_clear()
    tree_signature.cache_clear()
    _headers_memo.clear()


# -- flags, fingerprint ---------------------------------------------------------------------------------------

def nvcc_flags(arch: Arch) -> list[str]:
    """Every nvcc flag but include paths and file names, in command order; part of the cache key."""
    flags = list(BASE_FLAGS) + [arch.gencode]
    if _env.flag("BSK_LINEINFO"):
        flags.append("-lineinfo")
    flags += _env.nvcc_extra_flags()
    return flags + list(LINK_FLAGS)


def include_dirs(config: KernelConfig) -> list[Path]:
    """Our headers first, then the CUTLASS trees the config's family asks for."""
    return [include_dir(), *cutlass_paths().include_dirs(config.includes)]


def toolchain_fingerprint(config: KernelConfig, source: str | None = None) -> dict[str, object]:
    """What besides the source decides the binary: nvcc (full version text), CUTLASS (version + the include trees
    the family uses), our headers (the content of those ``source`` includes; all of them without a source) and the
    flags. Each part is memoized per process."""
    nvcc = find_nvcc()
    paths = cutlass_paths()
    return {
        "nvcc_version": nvcc_version(nvcc),
        "cutlass_version": cutlass_version(paths),
        "cutlass_tree": tree_signature(tuple(paths.include_dirs(config.includes))),
        "bsk_headers": headers_hash(source=source),
        "flags": nvcc_flags(config.arch),
        "arch": config.arch.name,
    }


def compile_command(config: KernelConfig, nvcc: str | None = None, source: str = SOURCE_NAME,
                    output: str = OUTPUT_NAME) -> list[str]:
    """The full nvcc command line; file names are relative to the build dir nvcc runs in."""
    flags = nvcc_flags(config.arch)
    compile_flags = [f for f in flags if f not in LINK_FLAGS]
    link_flags = [f for f in flags if f in LINK_FLAGS]  # libraries after the source they serve
    incs = [f"-I{d}" for d in include_dirs(config)]
    return [nvcc or find_nvcc(), *compile_flags, *incs, source, "-o", output, *link_flags]


# -- one compile ----------------------------------------------------------------------------------------------

@dataclass
class CompileResult:
    so_path: Path
    seconds: float
    command: list[str]
    log: str


class _Progress:
    """"compiling <name> ... 37s", rewritten in place on a terminal, every 15 s otherwise (BSK_VERBOSE=1)."""

    def __init__(self, kernel_name: str, enabled: bool):
        self.name = kernel_name
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.monotonic()
        self.ok = True

    def __enter__(self) -> "_Progress":
        self.t0 = time.monotonic()
        if self.enabled:
            self._write(f"compiling {self.name} ...", final=not self.tty)
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def _write(self, text: str, final: bool) -> None:
        try:
            if self.tty:
                sys.stderr.write("\r\033[K" + text + ("\n" if final else ""))
            else:
                sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _tick(self) -> None:
        period = 1.0 if self.tty else 15.0
        while not self._stop.wait(period):
            self._write(f"compiling {self.name} ... {time.monotonic() - self.t0:.0f}s", final=False)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.enabled:
            status = "compiled" if exc_type is None and self.ok else "FAILED"
            self._write(f"{status} {self.name} in {time.monotonic() - self.t0:.1f}s", final=True)


_ERROR_RE = re.compile(r"\berror\b|\bfatal\b|undefined reference", re.IGNORECASE)


def first_error_lines(log: str, limit: int = 12) -> list[str]:
    """The first error of nvcc's output with the lines that follow it (template backtraces), else the tail."""
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if _ERROR_RE.search(ln)), None)
    picked = lines[start:start + limit] if start is not None else lines[-limit:]
    return [ln if len(ln) <= 400 else ln[:400] + " ..." for ln in picked]


def _repro(build_dir: Path, cmd: list[str]) -> str:
    return f"cd {shlex.quote(str(build_dir))} && {shlex.join(cmd)}"


# The reaper: leader of nvcc's process group. It asks the kernel for SIGTERM when its parent dies (so a killed
# Python process still ends the build), and on SIGTERM/SIGINT/SIGHUP kills the whole group: nvcc, cicc, ptxas.
_REAPER = r"""
import ctypes, os, signal, subprocess, sys
def die(*_):
    os.killpg(0, signal.SIGKILL)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, die)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG (Linux)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    die()  # the parent died before the signal was armed
rc = subprocess.Popen(sys.argv[2:]).wait()
sys.exit(rc if rc >= 0 else 128 - rc)
"""


@contextmanager
def _sigterm_unwinds():
    """In the main thread, while nvcc runs, turn a default-action SIGTERM into SystemExit so the build's cleanup
    (kill the group, remove the staging dir) runs instead of the process vanishing mid-build."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):  # noqa: ANN001
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_compiler(cmd: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``cmd`` (nvcc) in ``cwd`` under the reaper; (exit code, combined output). A compiler killed by a
    signal comes back as 128 + the signal number."""
    proc = subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), *cmd], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", start_new_session=True)
    try:
        with _sigterm_unwinds():
            out, _ = proc.communicate()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        raise
    return proc.returncode, out or ""


def describe_exit(code: int) -> str:
    """'exit 2', or the signal that ended the compiler and what usually sends it."""
    sig = code - 128 if code > 128 else -code if code < 0 else 0
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = (": most likely out of memory (each nvcc of these kernels needs ~2 GB; build fewer at once, -j 1)"
               if sig == signal.SIGKILL else "")
        return f"killed by {name}{why}"
    return f"exit {code}"


def compile_kernel(source: str, config: KernelConfig, build_dir: Path, *,
                   failed_path: Path | None = None, progress: bool | None = None) -> CompileResult:
    """Write ``source`` to ``build_dir/kernel.cu`` and run nvcc there (cwd = build_dir) into ``kernel.so``.

    On failure the build dir (kernel.cu, command.sh, nvcc.log) is kept -- moved to ``failed_path`` when given --
    and KernelCompileError carries the first error lines, the kernel name, a one-line repro and that path.
    """
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / SOURCE_NAME).write_text(source)
    kernel_name = config.kernel_name
    cmd = compile_command(config)
    (build_dir / COMMAND_NAME).write_text(
        "#!/bin/sh\n# rebuild this kernel by hand: sh command.sh\ncd \"$(dirname \"$0\")\" && exec "
        + shlex.join(cmd) + "\n")
    if progress is None:
        progress = sys.stderr.isatty() or verbose()
    if verbose():
        sys.stderr.write(f"[bsk] {_repro(build_dir, cmd)}\n")
    if not Path(cmd[0]).is_file() and shutil.which(cmd[0]) is None:
        raise ToolchainError(f"cannot run {cmd[0]}: no such file; {_NVCC_HELP}")
    t0 = time.monotonic()
    with _Progress(kernel_name, progress) as prog:
        returncode, log = run_compiler(cmd, build_dir)
        prog.ok = returncode == 0
    seconds = time.monotonic() - t0
    (build_dir / LOG_NAME).write_text(log)
    so_path = build_dir / OUTPUT_NAME
    if returncode == 0 and so_path.is_file() and so_path.stat().st_size > 0:
        return CompileResult(so_path, seconds, cmd, log)

    kept = build_dir
    if failed_path is not None:
        failed_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.move(str(build_dir), str(failed_path))
        kept = failed_path
    why = describe_exit(returncode) if returncode != 0 else f"exit 0 but no {OUTPUT_NAME} was written"
    errors = first_error_lines(log) or ["(nvcc printed nothing)"]
    err = KernelCompileError(
        f"nvcc failed to compile {kernel_name} ({why}, {seconds:.1f}s):\n"
        + "\n".join("  " + ln for ln in errors)
        + f"\nrepro: {_repro(kept, cmd)}"
        + f"\nbuild dir kept: {kept} ({SOURCE_NAME}, {COMMAND_NAME}, {LOG_NAME})")
    err.kernel_name = kernel_name
    err.first_errors = errors
    err.repro = _repro(kept, cmd)
    err.build_dir = kept
    err.log = log
    err.returncode = returncode
    raise err
