"""Who may have written a file the package will load or run: the cache's trust rule, and private files and
directories (README, "Security"; the store, jit/store.py, applies it to every entry).

A path passes when it is owned by this user or root and writable by nobody else; below a checked root no component
may be a symbolic link. Everything the package creates is 0700 (directories, executables) or 0600 whatever the
umask.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from ..errors import CacheError, UnsafeCacheError


def trusted_uids() -> set[int]:
    return {os.geteuid(), 0}


_FIX = ("tighten it (chmod go-w, chown to yourself) or point BSK_CACHE_DIR at a private directory "
        "(mkdir -m 700 DIR)")


def check_stat(p: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(f"refusing to use the kernel cache: {p} is a symbolic link inside the cache, which "
                               f"could point anywhere; remove it")
    if st.st_uid not in trusted_uids():
        raise UnsafeCacheError(f"refusing to use the kernel cache: {p} is owned by uid {st.st_uid}, not by you "
                               f"(uid {os.geteuid()}) or root, so its owner could plant code this process would "
                               f"load; {_FIX}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(f"refusing to use the kernel cache: {p} is writable by group or others (mode "
                               f"{stat.S_IMODE(st.st_mode):o}), so another user could plant code this process "
                               f"would load; {_FIX}")


def check_safe(root: Path, path: Path | None = None) -> None:
    """Raise UnsafeCacheError unless ``root`` and every component from it down to ``path`` (inclusive, when it
    exists) are owned by this user or root and writable by nobody else. Components below the root must not be
    symbolic links; the root itself may be one (its target is checked)."""
    check_stat(root, os.stat(root))
    if path is None:
        return
    rel = path.relative_to(root)
    cur = root
    for part in rel.parts:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        check_stat(cur, st)


def check_path(p: Path) -> None:
    """The ownership and write-permission rule for one path outside the store that the package will run or load
    (e.g. a user-given example-88 binary and its directory)."""
    check_stat(p, os.stat(p))


def fix_modes(top: Path) -> None:
    """Directories 0700, files 0600 (0700 when the owner may execute them), whatever the umask was."""
    for dirpath, dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o700)
        for f in filenames:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, 0o700 if st.st_mode & stat.S_IXUSR else 0o600)


def private_dir(parent: Path, name: str) -> Path:
    """``parent/name`` as a directory private to this user (created 0700 when missing), checked."""
    d = parent / name
    try:
        d.mkdir(mode=0o700)
        os.chmod(d, 0o700)  # mkdir's mode is masked by the umask
    except FileExistsError:
        if not d.is_dir() or d.is_symlink():
            raise CacheError(f"{d} exists and is not a directory; remove it or point BSK_CACHE_DIR elsewhere") \
                from None
    except OSError as e:
        raise unwritable(d, e) from None
    check_stat(d, os.lstat(d))
    return d


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a 0600 temp file, then os.replace)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unwritable(p: Path, e: OSError) -> CacheError:
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CacheError(f"the kernel cache at {p.parent} is read-only for you ({e.strerror}); a kernel that is "
                          f"not in it cannot be built there: build it where the cache is writable (python -m "
                          f"blackwell_sparsek build ...), or point BSK_CACHE_DIR at a private writable directory")
    return CacheError(f"cannot create {p}: {e.strerror or e}; point BSK_CACHE_DIR at a private writable directory")
