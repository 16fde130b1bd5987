"""The artifact store: one on-disk cache for every built artifact (our kernels, CUTLASS example 88's binary).

Layout under the root (``$BSK_CACHE_DIR``, default ``~/.cache/blackwell_sparsek``)::

    <name>-<key16>/                        an entry: the artifact, meta.json (written last), the build's files
    locks/<key>.lock                       one file lock per key
    .staging/<key16>-<pid>-<rand>/         builds in progress, published with os.replace
    failed/<name>-<key16>-<pid>-<rand>/    failed builds kept for inspection (never a hit)
    .trash/, .memo/                        corrupt entries on their way out; small derived values

Trust model (README, "Security"; the rule itself: jit/trust.py): every directory the store creates is 0700 and every file 0600 (0700 when
executable) whatever the umask. Before it reads, locks, publishes or clears, it checks that each directory from the
root down to the entry, and the artifact itself, is owned by this user or root and writable by nobody else;
otherwise ``UnsafeCacheError`` names the path and the fix. A root-owned read-only cache (kernels prebuilt for a
cluster) passes. The store only ever deletes names of the shapes above, so a root that also holds other things
(``BSK_CACHE_DIR=~/.cache``) keeps them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import _env
from ..errors import CacheError, UnsafeCacheError
from .trust import check_safe, fix_modes, private_dir, unwritable, write_private

META_NAME = "meta.json"
ENTRY_RE = re.compile(r"^(?P<name>[a-z0-9_]+)-(?P<key>[0-9a-f]{16})$")
_STAGING_RE = re.compile(r"^[0-9a-f]{16}-(?P<pid>\d+)-[0-9a-f]{8}$")
_FAILED_RE = re.compile(r"^[a-z0-9_]+-[0-9a-f]{16}-\d+-[0-9a-f]{8}$")
_TRASH_RE = re.compile(r"^[a-z0-9_]+-[0-9a-f]{16}-\d+-[0-9a-f]{8}$")
_MEMO_RE = re.compile(r"^[0-9a-f]{64}$")
_LOCK_RE = re.compile(r"^[0-9a-f]{64}\.lock$")
OWN_DIRS = ("locks", ".staging", "failed", ".trash", ".memo")
STALE_STAGING_S = 3600.0


def root(create: bool = False) -> Path:
    """The cache root, checked; created 0700 (its parents with default modes) when ``create`` and missing."""
    r = _env.cache_dir()
    if r.exists() and not r.is_dir():
        raise CacheError(f"BSK_CACHE_DIR={r} is a file, not a directory; point it at a directory (or unset it)")
    if not r.exists():
        if not create:
            return r
        try:
            r.parent.mkdir(parents=True, exist_ok=True)
            r.mkdir(mode=0o700)
            os.chmod(r, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise unwritable(r, e) from None
    check_safe(r)
    return r


# -- entries --------------------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Entry:
    name: str
    key: str
    path: Path
    artifact: str
    meta: dict[str, Any]
    built: bool  # made by this call (False: found in the store)

    @property
    def artifact_path(self) -> Path:
        return self.path / self.artifact


def entry_dir(r: Path, name: str, key: str) -> Path:
    return r / f"{name}-{key[:16]}"


def read_meta(d: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((d / META_NAME).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _artifact_ok(d: Path, meta: dict[str, Any], full: bool = True) -> bool:
    art = meta.get("artifact")
    if not isinstance(art, str) or "/" in art or not art:
        return False
    p = d / art
    try:
        if not p.is_file() or p.stat().st_size != meta.get("artifact_size"):
            return False
        return not full or sha256_file(p) == meta.get("artifact_sha256")
    except OSError:
        return False


def verify(d: Path, name: str, key: str) -> dict[str, Any] | None:
    """meta.json of entry ``d`` when it is complete, belongs to (name, key) and its artifact hashes right."""
    meta = read_meta(d)
    if meta is None or meta.get("key") != key or meta.get("name") != name:
        return None
    return meta if _artifact_ok(d, meta) else None


def lookup(name: str, key: str) -> Entry | None:
    """The verified entry for (name, key), or None; UnsafeCacheError when its path is not private."""
    r = root()
    d = entry_dir(r, name, key)
    if not r.is_dir() or not d.exists():
        return None
    check_safe(r, d)
    meta = verify(d, name, key)
    if meta is None:
        return None
    check_safe(r, d / meta["artifact"])
    return Entry(name, key, d, meta["artifact"], meta, built=False)


def find(predicate: Callable[[dict[str, Any]], bool], name: str) -> Entry | None:
    """The newest verified entry named ``name`` whose meta satisfies ``predicate`` (no key at hand)."""
    r = root()
    if not r.is_dir():
        return None
    best: Entry | None = None
    for d in r.glob(f"{name}-*"):
        m = ENTRY_RE.match(d.name)
        if not m or m["name"] != name:
            continue
        check_safe(r, d)
        meta = read_meta(d)
        if meta is None or not predicate(meta) or verify(d, name, str(meta.get("key", ""))) is None:
            continue
        if best is None or _created(meta) > _created(best.meta):
            best = Entry(name, meta["key"], d, meta["artifact"], meta, built=False)
    return best


def _created(meta: dict[str, Any]) -> float:
    try:
        return float(meta.get("created_unix", 0))
    except (TypeError, ValueError):
        return 0.0


# -- building -------------------------------------------------------------------------------------------------

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(key, threading.Lock())


def _say(msg: str) -> None:
    try:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


@dataclass
class BuildDirs:
    staging: Path   # write the artifact and build files here (private, empty)
    failed: Path    # where a failed build's directory may be moved (not created)


def build(name: str, key: str, artifact: str, produce: Callable[[BuildDirs], dict[str, Any]],
          *, what: str | None = None, lock_timeout: float | None = None) -> Entry:
    """The entry for (name, key), produced first when missing: under the key's file lock, in a private staging
    directory, ``produce(dirs)`` writes ``artifact`` (and returns extra meta); modes are fixed, meta.json is
    written last and the directory is published with os.replace. Failures are never cached."""
    hit = lookup(name, key)
    if hit is not None:
        return hit
    import filelock
    r = root(create=True)
    lock_path = private_dir(r, "locks") / f"{key}.lock"
    timeout = _env.lock_timeout() if lock_timeout is None else lock_timeout
    with _thread_lock(key):
        lock = filelock.FileLock(str(lock_path), mode=0o600)
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                _say(f"[bsk] waiting for another process building {what or name} (lock {lock_path}; up to "
                     f"{timeout:.0f}s, BSK_LOCK_TIMEOUT)")
                lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise CacheError(f"waited {timeout:.0f}s for another process building {what or name} (lock "
                             f"{lock_path}); a lock is released when its holder exits, so that build is still "
                             f"running: wait for it, or raise BSK_LOCK_TIMEOUT") from None
        try:
            hit = lookup(name, key)  # someone else may have built it while we waited
            if hit is not None:
                return hit
            return _build_locked(r, name, key, artifact, produce)
        finally:
            lock.release()


def _build_locked(r: Path, name: str, key: str, artifact: str,
                  produce: Callable[[BuildDirs], dict[str, Any]]) -> Entry:
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = private_dir(private_dir(r, ".staging"), f"{key[:16]}-{tag}")
    failed = private_dir(r, "failed") / f"{name}-{key[:16]}-{tag}"
    try:
        extra = produce(BuildDirs(staging, failed))
        if failed.exists():
            fix_modes(failed)
        art = staging / artifact
        if not art.is_file():
            raise CacheError(f"building {name} wrote no {artifact}")
        fix_modes(staging)
        now = time.time()
        meta = {
            **extra,
            "name": name,
            "key": key,
            "artifact": artifact,
            "artifact_sha256": sha256_file(art),
            "artifact_size": art.stat().st_size,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
            "created_unix": now,
        }
        write_private(staging / META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        final = entry_dir(r, name, key)
        _publish(staging, final, r)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if failed.exists():
            fix_modes(failed)
        raise
    return Entry(name, key, final, artifact, meta, built=True)


def _publish(staging: Path, final: Path, r: Path) -> None:
    """Move a finished staging dir into place; an entry already at ``final`` (corrupt, mismatched) goes first."""
    check_safe(r, final)
    if final.exists():
        trash = private_dir(r, ".trash") / f"{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.replace(final, trash)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(staging, final)


def discard(entry: Entry) -> None:
    """Remove an entry this store made (e.g. one that verifies but does not load)."""
    r = root()
    check_safe(r, entry.path)
    if ENTRY_RE.match(entry.path.name) and entry.path.parent == r:
        shutil.rmtree(entry.path, ignore_errors=True)


# -- memos ----------------------------------------------------------------------------------------------------

def memo_get(digest: str) -> str | None:
    """A small derived value stored under its sha256 ``digest`` (e.g. a header-tree signature), or None."""
    r = root()
    p = r / ".memo" / digest
    if not _MEMO_RE.match(digest) or not p.is_file():
        return None
    try:
        check_safe(r, p)
        return p.read_text().strip()
    except (OSError, UnsafeCacheError):
        return None


def memo_put(digest: str, value: str) -> None:
    """Best effort: a read-only or foreign cache simply keeps no memo."""
    try:
        write_private(private_dir(root(create=True), ".memo") / digest, value)
    except (OSError, CacheError):
        pass


# -- housekeeping ---------------------------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _float_or_none(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def ls(verify_hash: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """(entries, foreign names). Each entry: name, key, path, size, build_seconds, created, valid (size and meta
    checked; with ``verify_hash`` also the artifact's sha256 and the key/name against the directory name)."""
    r = root()
    if not r.is_dir():
        return [], []
    out: list[dict[str, Any]] = []
    foreign: list[str] = []
    for d in sorted(r.iterdir(), key=lambda p: p.name):
        m = ENTRY_RE.match(d.name)
        if d.name in OWN_DIRS:
            continue
        if not m or d.is_symlink() or not d.is_dir() or not (d / META_NAME).is_file():
            foreign.append(d.name)
            continue
        check_safe(r, d)
        meta = read_meta(d) or {}
        art = meta.get("artifact") if isinstance(meta.get("artifact"), str) else ""
        size = (d / art).stat().st_size if art and (d / art).is_file() else 0
        ok = (bool(meta) and str(meta.get("key", "")).startswith(m["key"]) and meta.get("name") == m["name"]
              and _artifact_ok(d, meta, full=verify_hash))
        out.append({
            "name": m["name"], "key": str(meta.get("key", "")), "path": str(d), "bytes": size,
            "build_seconds": _float_or_none(meta.get("build_seconds")), "created": meta.get("created"),
            "nvcc_release": meta.get("nvcc_release"), "cutlass_version": meta.get("cutlass_version"),
            "valid": ok,
        })
    return out, foreign


def failed_builds() -> list[Path]:
    d = root() / "failed"
    return sorted(p for p in d.iterdir() if p.is_dir() and _FAILED_RE.match(p.name)) if d.is_dir() else []


@dataclass
class ClearReport:
    root: Path
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)   # (path, why)
    foreign: list[str] = field(default_factory=list)               # left alone: not made by this package

    @property
    def ok(self) -> bool:
        return not self.failed


def _rmtree(p: Path, report: ClearReport) -> bool:
    errors: list[str] = []

    def onerror(func, path, exc_info):  # noqa: ANN001 - shutil's callback signature
        errors.append(f"{path}: {exc_info[1]}")

    shutil.rmtree(p, onerror=onerror)
    if errors or p.exists():
        report.failed.append((str(p), errors[0] if errors else "still present"))
        return False
    return True


def clear(stale_staging_s: float = STALE_STAGING_S) -> ClearReport:
    """Remove every entry, failed build, trash and memo this package made, and staging dirs of builds that are
    gone (their process died) or older than ``stale_staging_s``. Lock files stay (a live process may hold one).
    Anything else under the root is reported as foreign and left alone."""
    r = root()
    report = ClearReport(r)
    if not r.is_dir():
        return report
    entries, report.foreign = ls()
    for e in entries:
        if _rmtree(Path(e["path"]), report):
            report.removed.append(e["path"])
    now = time.time()
    for sub, pattern in (("failed", _FAILED_RE), (".trash", _TRASH_RE), (".memo", _MEMO_RE),
                         (".staging", _STAGING_RE)):
        d = r / sub
        if not d.is_dir() or d.is_symlink():
            continue
        check_safe(r, d)
        for p in d.iterdir():
            m = pattern.match(p.name)
            if not m:
                report.foreign.append(f"{sub}/{p.name}")
                continue
            if sub == ".staging":
                try:
                    age = now - p.stat().st_mtime
                except OSError:
                    continue
                if _pid_alive(int(m["pid"])) and age <= stale_staging_s:
                    continue  # a build in progress
            if p.is_dir() and not p.is_symlink():
                _rmtree(p, report)
            else:
                try:
                    p.unlink()
                except OSError as e:
                    report.failed.append((str(p), e.strerror or str(e)))
    return report
