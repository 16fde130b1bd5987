"""The on-disk kernel cache: keys, entries, locks, atomic publish, meta.json checks.

Layout under the cache root ($BSK_CACHE_DIR, else ~/.cache/blackwell_sparsek)::

    <kernel_name>-<key[:16]>/   kernel.so, kernel.cu, meta.json (+ command.sh, nvcc.log)
    locks/<key>.lock            one filelock per key
    .staging/<key>-<pid>-<rand>/  builds in progress, published with os.replace
    failed/<kernel_name>-<key16>-<pid>-<rand>/  failed builds kept for inspection (never used as a cache hit)

Load path: try the entry (meta key matches, .so size and sha256 match) -> else take the key's lock -> check again ->
build in a staging dir -> write meta.json last -> os.replace into place (a corrupt entry is moved aside first).

Environment: BSK_CACHE_DIR, BSK_LOCK_TIMEOUT (seconds, default 900), BSK_DISABLE_JIT=1 (never compile: a missing
kernel raises JitDisabledError; without nvcc the entry is found by config + source).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__
from . import compiler
from .codegen import render
from .config import KernelConfig
from .errors import BskError, JitDisabledError, KernelCompileError, ToolchainError

META_NAME = "meta.json"
SO_NAME = compiler.OUTPUT_NAME
SRC_NAME = compiler.SOURCE_NAME
DEFAULT_LOCK_TIMEOUT = 900.0


def cache_root() -> Path:
    env = os.environ.get("BSK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "blackwell_sparsek"


def jit_disabled() -> bool:
    return os.environ.get("BSK_DISABLE_JIT", "").strip().lower() in ("1", "true", "yes", "on")


def _lock_timeout() -> float:
    raw = os.environ.get("BSK_LOCK_TIMEOUT", "")
    try:
        return float(raw) if raw.strip() else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        raise BskError(f"BSK_LOCK_TIMEOUT={raw!r} is not a number of seconds") from None


def sha256_file(path: Path) -> str:
    """sha256 of a file's content, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- keys -----------------------------------------------------------------------------------------------------

def key_material(config: KernelConfig, source: str | None = None,
                 fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the cache key covers, as a JSON-able dict."""
    if source is None:
        source = render(config)
    if fingerprint is None:
        fingerprint = compiler.toolchain_fingerprint(config.arch)
    return {
        "config": config.to_json(),
        "source_sha256": _sha256_text(source),
        "toolchain": fingerprint,
        "flags": list(fingerprint.get("flags", [])),
        "arch": config.arch.name,
        "package_version": __version__,
    }


def cache_key(config: KernelConfig, source: str | None = None,
              fingerprint: dict[str, Any] | None = None) -> str:
    """sha256 over (config JSON, rendered source, toolchain fingerprint, flags, arch, package version)."""
    material = key_material(config, source, fingerprint)
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# -- entries --------------------------------------------------------------------------------------------------

@dataclass
class CacheEntry:
    key: str
    kernel_name: str
    path: Path
    meta: dict[str, Any]
    built: bool  # compiled by this call (False: found in the cache)

    @property
    def so_path(self) -> Path:
        return self.path / SO_NAME


def entry_dir(root: Path, kernel_name: str, key: str) -> Path:
    return root / f"{kernel_name}-{key[:16]}"


def _read_meta(d: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((d / META_NAME).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _check_artifact(d: Path, meta: dict[str, Any]) -> bool:
    so = d / SO_NAME
    try:
        if so.stat().st_size != meta.get("so_size"):
            return False
        return sha256_file(so) == meta.get("so_sha256")
    except OSError:
        return False


def verify_entry(d: Path, key: str) -> dict[str, Any] | None:
    """meta.json of entry ``d`` when it is complete and belongs to ``key``; None when missing or corrupt."""
    meta = _read_meta(d)
    if meta is None or meta.get("key") != key:
        return None
    return meta if _check_artifact(d, meta) else None


def _find_without_toolchain(root: Path, config: KernelConfig, source: str) -> CacheEntry | None:
    """With no nvcc/CUTLASS to compute the key: the newest intact entry built from this config and source."""
    src_sha = _sha256_text(source)
    best: tuple[float, CacheEntry] | None = None
    for d in root.glob(f"{config.kernel_name}-*"):
        meta = _read_meta(d)
        if (meta is None or meta.get("config_json") != config.to_json() or meta.get("source_sha256") != src_sha
                or meta.get("package_version") != __version__ or not _check_artifact(d, meta)):
            continue
        t = float(meta.get("created_unix", 0))
        if best is None or t > best[0]:
            best = (t, CacheEntry(meta["key"], config.kernel_name, d, meta, built=False))
    return best[1] if best else None


def publish(staging: Path, final: Path, root: Path) -> None:
    """Move a finished staging dir into place (the caller holds the key's lock); an entry already at ``final``
    (corrupt or mismatched) is moved aside first."""
    if final.exists():  # corrupt or mismatched entry: move it aside, then replace
        trash = root / ".trash" / f"{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(final, trash)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(staging, final)


def _build_into_cache(config: KernelConfig, source: str, key: str, fingerprint: dict[str, Any], root: Path,
                      progress: bool | None) -> CacheEntry:
    kernel_name = config.kernel_name
    staging = root / ".staging" / f"{key}-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    try:
        result = compiler.compile_kernel(source, kernel_name, staging, config.arch, failed_root=root / "failed",
                                         failed_name=f"{kernel_name}-{key[:16]}-{staging.name[len(key) + 1:]}",
                                         progress=progress)
    except KernelCompileError as e:
        _print_err(f"[bsk] compiling {kernel_name} failed; nothing cached; build dir kept: {e.build_dir}")
        raise
    except BaseException:
        if staging.exists():  # compile_kernel moved it to failed/ on a compile error; anything else: clean up
            shutil.rmtree(staging, ignore_errors=True)
        raise
    so = result.so_path
    now = time.time()
    meta = {
        "key": key,
        "kernel_name": kernel_name,
        "family": config.family,
        "config": config.to_dict(),
        "config_json": config.to_json(),
        "source_sha256": _sha256_text(source),
        "so_sha256": sha256_file(so),
        "so_size": so.stat().st_size,
        "flags": list(fingerprint.get("flags", [])),
        "command": result.command,
        "arch": config.arch.name,
        "nvcc": result.command[0],
        "nvcc_version": fingerprint.get("nvcc_version"),
        "nvcc_release": compiler.nvcc_release(str(fingerprint.get("nvcc_version", ""))),
        "cutlass_version": fingerprint.get("cutlass_version"),
        "cutlass_tree": fingerprint.get("cutlass_tree"),
        "bsk_headers": fingerprint.get("bsk_headers"),
        "package_version": __version__,
        "build_seconds": round(result.seconds, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "created_unix": now,
    }
    tmp = staging / (META_NAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, staging / META_NAME)  # meta last: an entry without it is never a hit
    final = entry_dir(root, kernel_name, key)
    publish(staging, final, root)
    return CacheEntry(key, kernel_name, final, meta, built=True)


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(key, threading.Lock())


def ensure_built(config: KernelConfig, *, progress: bool | None = None) -> CacheEntry:
    """The cache entry of ``config``, compiling it first when missing or corrupt. Does not load the .so,
    so it works on machines without a GPU (ahead-of-time builds)."""
    config.validate()
    source = render(config)
    root = cache_root()
    try:
        fingerprint = compiler.toolchain_fingerprint(config.arch)
    except ToolchainError as e:
        if jit_disabled():
            found = _find_without_toolchain(root, config, source)
            if found is not None:
                return found
            raise JitDisabledError(
                f"{config.kernel_name} is not in the cache at {root}, BSK_DISABLE_JIT=1 and the toolchain is "
                f"unusable ({e}). Build it ahead of time where nvcc is: python -m blackwell_sparsek build "
                f"'{config.to_json()}' (same BSK_CACHE_DIR), or unset BSK_DISABLE_JIT") from None
        raise
    key = cache_key(config, source, fingerprint)
    final = entry_dir(root, config.kernel_name, key)
    meta = verify_entry(final, key)
    if meta is not None:
        return CacheEntry(key, config.kernel_name, final, meta, built=False)
    if jit_disabled():
        raise JitDisabledError(
            f"{config.kernel_name} (key {key[:16]}) is not in the cache at {root} and BSK_DISABLE_JIT=1. Build it "
            f"ahead of time: python -m blackwell_sparsek build '{config.to_json()}' (same BSK_CACHE_DIR and "
            f"toolchain), or unset BSK_DISABLE_JIT")

    import filelock
    (root / "locks").mkdir(parents=True, exist_ok=True)
    lock_path = root / "locks" / f"{key}.lock"
    timeout = _lock_timeout()
    with _thread_lock(key):
        try:
            with filelock.FileLock(str(lock_path), timeout=timeout):
                meta = verify_entry(final, key)  # someone else may have built it while we waited
                if meta is not None:
                    return CacheEntry(key, config.kernel_name, final, meta, built=False)
                return _build_into_cache(config, source, key, fingerprint, root, progress)
        except filelock.Timeout:
            raise BskError(f"waited {timeout:.0f}s for the build lock {lock_path} of {config.kernel_name}: another "
                           f"process is compiling it or died holding it; retry, raise BSK_LOCK_TIMEOUT, or delete "
                           f"the lock file if no build is running") from None


# -- loading --------------------------------------------------------------------------------------------------

_loaded: dict[tuple[str, ...], Any] = {}


def _process_key(config: KernelConfig) -> tuple[str, ...]:
    env = os.environ
    return (config.to_json(), str(cache_root()), env.get("BSK_NVCC", ""), env.get("BSK_CUTLASS_DIR", ""),
            env.get("BSK_LINEINFO", ""), env.get("BSK_NVCC_FLAGS", ""))


def build(config: KernelConfig, *, progress: bool | None = None):
    """Compile (or find in the cache) and load ``config``'s kernel; a repeat in the same process is a dict hit."""
    pk = _process_key(config)
    kernel = _loaded.get(pk)
    if kernel is not None:
        return kernel
    from .runtime import CompiledKernel
    entry = ensure_built(config, progress=progress)
    try:
        kernel = CompiledKernel(entry.so_path, config, entry.meta)
    except BskError:
        if entry.built:
            raise
        # A cache entry that verifies but does not load (e.g. written by a foreign toolchain): rebuild once.
        shutil.rmtree(entry.path, ignore_errors=True)
        entry = ensure_built(config, progress=progress)
        kernel = CompiledKernel(entry.so_path, config, entry.meta)
    _loaded[pk] = kernel
    return kernel


def clear_loaded() -> None:
    """Forget the in-process kernels (the loaded libraries stay mapped)."""
    _loaded.clear()


# -- housekeeping ---------------------------------------------------------------------------------------------

def cache_ls() -> list[dict[str, Any]]:
    """One dict per cache entry: kernel name, key, path, size, build seconds, created, valid (size check)."""
    root = cache_root()
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith(".") or d.name in ("locks", "failed"):
            continue
        meta = _read_meta(d) or {}
        so = d / SO_NAME
        size = so.stat().st_size if so.is_file() else 0
        out.append({
            "kernel_name": meta.get("kernel_name", d.name.rsplit("-", 1)[0]),
            "key": meta.get("key", ""),
            "path": str(d),
            "so_bytes": size,
            "build_seconds": meta.get("build_seconds"),
            "created": meta.get("created"),
            "nvcc_release": meta.get("nvcc_release"),
            "cutlass_version": meta.get("cutlass_version"),
            "valid": bool(meta) and size == meta.get("so_size"),
        })
    return out


def failed_builds() -> list[Path]:
    d = cache_root() / "failed"
    return sorted(p for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def cache_clear(*, stale_staging_seconds: float = 3600.0) -> int:
    """Remove every entry, failed build and stale staging dir; returns how many entries were removed.
    Lock files stay (another process may hold one); staging dirs younger than an hour may be live builds."""
    root = cache_root()
    if not root.is_dir():
        return 0
    n = 0
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith(".") and d.name not in ("locks", "failed"):
            shutil.rmtree(d, ignore_errors=True)
            n += 1
    shutil.rmtree(root / "failed", ignore_errors=True)
    shutil.rmtree(root / ".trash", ignore_errors=True)
    staging = root / ".staging"
    if staging.is_dir():
        now = time.time()
        for d in staging.iterdir():
            try:
                if now - d.stat().st_mtime > stale_staging_seconds:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass
    _loaded.clear()
    return n


def _print_err(msg: str) -> None:
    sys.stderr.write(msg + "\n")
