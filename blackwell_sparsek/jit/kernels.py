"""Kernels in the artifact store: the cache key, build-or-find, and loading (once per process).

The store (``jit/store.py``) owns the directories, locks, staging, publishing, trust checks and housekeeping; this
module says what a kernel's key covers and how a kernel is produced (render, then nvcc in the staging directory).

Load path: the entry for (kernel name, key) verifies (meta key, artifact size and sha256) -> else build it under the
key's lock -> load the .so with ctypes. Environment: BSK_CACHE_DIR, BSK_LOCK_TIMEOUT, BSK_DISABLE_JIT (never
compile: a missing kernel raises JitDisabledError; without nvcc the entry is found by config + source).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from .. import __version__, _env
from . import compiler
from .codegen import render
from .spec import KernelConfig
from ..errors import BskError, JitDisabledError, KernelCompileError, ToolchainError
from . import store

SO_NAME = compiler.OUTPUT_NAME
SRC_NAME = compiler.SOURCE_NAME
sha256_file = store.sha256_file


class CacheEntry(store.Entry):
    """A store entry holding a kernel: its .so and the kernel name."""

    @property
    def so_path(self) -> Path:
        return self.artifact_path

    @property
    def kernel_name(self) -> str:
        return self.name


def _kernel_entry(e: store.Entry | None) -> CacheEntry | None:
    return None if e is None else CacheEntry(e.name, e.key, e.path, e.artifact, e.meta, e.built)


def cache_root() -> Path:
    return _env.cache_dir()


def jit_disabled() -> bool:
    return _env.flag("BSK_DISABLE_JIT")


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- keys -----------------------------------------------------------------------------------------------------

def key_material(config: KernelConfig, source: str | None = None,
                 fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the cache key covers, as a JSON-able dict."""
    if source is None:
        source = render(config)
    if fingerprint is None:
        fingerprint = compiler.toolchain_fingerprint(config, source)
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


def verify_entry(d: Path, key: str) -> dict[str, Any] | None:
    """meta.json of kernel entry ``d`` when it is complete and belongs to ``key``; None when missing or corrupt."""
    meta = store.read_meta(d)
    if meta is None:
        return None
    return store.verify(d, str(meta.get("name", "")), key)


# -- building -------------------------------------------------------------------------------------------------

def _producer(config: KernelConfig, source: str, fingerprint: dict[str, Any], progress: bool | None):
    def produce(dirs: store.BuildDirs) -> dict[str, Any]:
        kernel_name = config.kernel_name
        try:
            result = compiler.compile_kernel(source, config, dirs.staging, failed_path=dirs.failed,
                                             progress=progress)
        except KernelCompileError as e:
            sys.stderr.write(f"[bsk] compiling {kernel_name} failed; nothing cached; build dir kept: "
                             f"{e.build_dir}\n")
            raise
        return {
            "kernel_name": kernel_name,
            "family": config.family,
            "config": config.to_dict(),
            "config_json": config.to_json(),
            "source_sha256": _sha256_text(source),
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
        }
    return produce


def _find_without_toolchain(config: KernelConfig, source: str) -> CacheEntry | None:
    """With no nvcc/CUTLASS to compute the key: the newest intact entry built from this config and source."""
    src_sha = _sha256_text(source)
    return _kernel_entry(store.find(lambda m: (m.get("config_json") == config.to_json() and m.get("source_sha256") == src_sha
                                 and m.get("package_version") == __version__), config.kernel_name))


def ensure_built(config: KernelConfig, *, progress: bool | None = None) -> CacheEntry:
    """The cache entry of ``config``, compiling it first when missing or corrupt. Does not load the .so,
    so it works on machines without a GPU (ahead-of-time builds)."""
    config.validate()
    source = render(config)
    try:
        fingerprint = compiler.toolchain_fingerprint(config, source)
    except ToolchainError as e:
        if jit_disabled():
            found = _find_without_toolchain(config, source)
            if found is not None:
                return found
            raise JitDisabledError(
                f"{config.kernel_name} is not in the cache at {cache_root()}, BSK_DISABLE_JIT=1 and the toolchain "
                f"is unusable ({e}). Build it ahead of time where nvcc is: python -m blackwell_sparsek build "
                f"'{config.to_json()}' (same BSK_CACHE_DIR), or unset BSK_DISABLE_JIT") from None
        raise
    key = cache_key(config, source, fingerprint)
    if jit_disabled():
        hit = _kernel_entry(store.lookup(config.kernel_name, key))
        if hit is not None:
            return hit
        raise JitDisabledError(
            f"{config.kernel_name} (key {key[:16]}) is not in the cache at {cache_root()} and BSK_DISABLE_JIT=1. "
            f"Build it ahead of time: python -m blackwell_sparsek build '{config.to_json()}' (same BSK_CACHE_DIR "
            f"and toolchain), or unset BSK_DISABLE_JIT")
    return _kernel_entry(store.build(config.kernel_name, key, SO_NAME,
                                     _producer(config, source, fingerprint, progress)))


# -- loading --------------------------------------------------------------------------------------------------

_loaded: dict[tuple[str, ...], Any] = {}


def _process_key(config: KernelConfig) -> tuple[str, ...]:
    return (config.to_json(), str(cache_root()), json.dumps(_env.snapshot(), sort_keys=True))


def build(config: KernelConfig, *, progress: bool | None = None):
    """Compile (or find in the cache) and load ``config``'s kernel; a repeat in the same process is a dict hit."""
    pk = _process_key(config)
    kernel = _loaded.get(pk)
    if kernel is not None:
        return kernel
    entry = ensure_built(config, progress=progress)
    try:
        kernel = _load(entry, config)
    except BskError:
        if entry.built:
            raise
        # An entry that verifies but does not load (e.g. written by a foreign toolchain): rebuild once.
        store.discard(entry)
        entry = ensure_built(config, progress=progress)
        kernel = _load(entry, config)
    _loaded[pk] = kernel
    return kernel


def _load(entry: CacheEntry, config: KernelConfig):
    from .runtime import CompiledKernel
    store.check_safe(store.root(), entry.artifact_path)  # right before dlopen: nobody else could have written it
    return CompiledKernel(entry.artifact_path, config, entry.meta)


def clear_loaded() -> None:
    """Forget the in-process kernels (the loaded libraries stay mapped)."""
    _loaded.clear()


# -- housekeeping ---------------------------------------------------------------------------------------------

def cache_ls(verify: bool = False) -> list[dict[str, Any]]:
    """One dict per cache entry: kernel_name, key, path, so_bytes, build_seconds (float or None), created, valid
    (meta and size checked; with ``verify`` the .so's sha256 and the key against the entry's name too)."""
    entries, _ = store.ls(verify_hash=verify)
    for e in entries:
        e["kernel_name"] = e["name"]
        e["so_bytes"] = e["bytes"]
    return entries


def failed_builds() -> list[Path]:
    return store.failed_builds()


def cache_clear() -> store.ClearReport:
    """Remove the entries, failed builds and dead staging dirs this package made; leave everything else (see
    ClearReport: removed, failed, foreign). Forgets the in-process kernels."""
    report = store.clear()
    _loaded.clear()
    return report
