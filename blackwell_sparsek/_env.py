"""Every ``BSK_*`` environment variable, read in this one module with one truthiness rule.

Values are read when asked for (tests and long-running processes change them), parsed here, and a malformed value
raises ``EnvError`` naming the variable and what it accepts. ``markdown_table()`` renders the README's table, so the
documentation cannot drift from what the code reads.
"""
from __future__ import annotations

import contextlib
import math
import os
import shlex
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

from .errors import EnvError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Var:
    name: str
    kind: str      # flag | path | float | words | text
    default: str   # as documented
    doc: str


VARS: tuple[Var, ...] = (
    Var("BSK_CACHE_DIR", "path", "`~/.cache/blackwell_sparsek`",
        "kernel cache root; must be private to you (see Security)"),
    Var("BSK_NVCC", "path", "`$CUDA_HOME/bin/nvcc`, `nvcc` on `PATH`", "the nvcc to compile with"),
    Var("BSK_CUTLASS_DIR", "path", "the `nvidia-cutlass` wheel", "a CUTLASS source tree to compile against"),
    Var("BSK_NVCC_FLAGS", "words", "none", "extra nvcc flags, shell-quoted (part of the cache key)"),
    Var("BSK_LINEINFO", "flag", "off", "compile with `-lineinfo` for source-level profiling (part of the key)"),
    Var("BSK_DISABLE_JIT", "flag", "off", "never compile: a kernel missing from the cache raises `JitDisabledError`"),
    Var("BSK_VERBOSE", "flag", "off", "print the nvcc command and a progress line, even off a terminal"),
    Var("BSK_LOCK_TIMEOUT", "float", "900",
        "seconds (>= 0) to wait for another process's build of the same kernel"),
    Var("BSK_POISON", "flag", "off", "fill outputs with NaN before each launch (tests: a skipped write shows)"),
    Var("BSK_EX88_BIN", "path", "built into the cache", "a CUTLASS example 88 binary for `compare-88` / `bench`"),
    Var("BSK_NCU", "path", "`ncu` on `PATH`", "the Nsight Compute that `profile` runs"),
)
_BY_NAME = {v.name: v for v in VARS}
_TRUTHY_HELP = f"one of {', '.join(_TRUE)} (on) or {', '.join(repr(x) for x in _FALSE)} (off)"


def _raw(name: str) -> str:
    if name not in _BY_NAME:  # a typo in the package itself, never user input
        raise KeyError(f"{name} is not a known BSK_* variable")
    return os.environ.get(name, "")


def flag(name: str) -> bool:
    """A BSK_* switch: 1/true/yes/on or 0/false/no/off/empty (any case); anything else is an error."""
    raw = _raw(name).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise EnvError(f"{name}={os.environ.get(name)!r} is not a switch: use {_TRUTHY_HELP}")


def text(name: str) -> str | None:
    """The raw value with surrounding blanks stripped, None when unset or empty."""
    raw = _raw(name).strip()
    return raw or None


def path(name: str) -> Path | None:
    raw = text(name)
    return Path(raw).expanduser() if raw else None


def cuda_homes() -> list[Path]:
    """The CUDA toolkits named by $CUDA_HOME and $CUDA_PATH (in that order), for finding nvcc and headers."""
    return [Path(os.environ[v]).expanduser() for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v, "").strip()]


def child_environ(**extra: str) -> dict[str, str]:
    """This process's environment for a child process, with ``extra`` set."""
    return {**os.environ, **extra}


def cache_dir() -> Path:
    return path("BSK_CACHE_DIR") or Path.home() / ".cache" / "blackwell_sparsek"


def nvcc_extra_flags() -> list[str]:
    raw = text("BSK_NVCC_FLAGS")
    if not raw:
        return []
    try:
        return shlex.split(raw)
    except ValueError as e:
        raise EnvError(f"BSK_NVCC_FLAGS={raw!r} cannot be split into flags ({e}); balance its quotes") from None


def lock_timeout() -> float:
    raw = text("BSK_LOCK_TIMEOUT")
    if raw is None:
        return 900.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise EnvError(f"BSK_LOCK_TIMEOUT={raw!r} must be a finite number of seconds >= 0 (0: do not wait)")
    return value


@contextlib.contextmanager
def override(name: str, value: str) -> Iterator[None]:
    """Set a BSK_* variable for the duration of a block (the bench's poisoned checks), then restore it."""
    _raw(name)
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def snapshot() -> dict[str, str]:
    """The BSK_* variables set in this process, for `info` and build keys of in-process memos."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("BSK_")}


def markdown_table() -> str:
    """The README's table of environment variables (tests/test_docs.py holds the README to it). Switches take
    1/true/yes/on and 0/false/no/off."""
    rows = ["| variable | default | effect |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.default} | {v.doc} |" for v in VARS]
    return "\n".join(rows)
