"""Compare the SASS of two builds of the same kernels (e.g. before and after a header refactor).

    python dev/sass_diff.py OLD_CACHE NEW_CACHE [--diff N]

Pairs the entries of two kernel caches by kernel name (the entry folder name without its ``-<key16>`` suffix: the
config hash is in the name, the header hash only in the key), disassembles both ``kernel.so`` with ``cuobjdump
-sass`` and compares: identical text, identical once instruction addresses / encodings / branch targets are
normalized, or different (then per-opcode count deltas, ``cuobjdump -res-usage`` of both and the first N lines of
a unified diff). Exits 1 if any pair differs or a kernel is missing on one side. cuobjdump and nvdisasm: on PATH, or
from the ``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm`` wheels (found automatically), so the CPU build host
can compare too.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def _tool_env() -> dict[str, str]:
    """PATH with cuobjdump and nvdisasm: from the toolkit, else from the nvidia-cuda-cuobjdump /
    nvidia-cuda-nvdisasm wheels (a CPU host without them in its toolkit: pip install both)."""
    env = dict(os.environ)
    for tool in ("cuobjdump", "nvdisasm"):
        if shutil.which(tool, path=env.get("PATH")) is not None:
            continue
        try:
            import nvidia  # the nvidia-cuda-* wheels share this namespace package
        except ImportError:
            break
        for root in nvidia.__path__:
            cand = next(iter(Path(root).glob(f"cu*/bin/{tool}")), None)
            if cand is not None:
                env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{cand.parent}"
                break
    return env


ENV = _tool_env()


def _run(args: list[str]) -> str:
    r = subprocess.run(args, capture_output=True, text=True, env=ENV)
    if r.returncode != 0 or "fatal" in r.stderr:
        sys.exit(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def entries(cache: Path) -> dict[str, Path]:
    """kernel name -> kernel.so, for every entry of a cache that has one."""
    out = {}
    for so in sorted(cache.glob("*/kernel.so")):
        name = re.sub(r"-[0-9a-f]{16}$", "", so.parent.name)
        out[name] = so
    return out


def sass(so: Path) -> list[str]:
    """SASS instruction lines (without the encoding-only continuation lines)."""
    lines = []
    for ln in _run(["cuobjdump", "-sass", str(so)]).splitlines():
        s = ln.strip()
        if not s or re.fullmatch(r"/\* 0x[0-9a-f]+ \*/", s):
            continue
        lines.append(s)
    return lines


_ADDR = re.compile(r"^/\*[0-9a-f]{4,}\*/\s*")
_ENC = re.compile(r"\s*/\* 0x[0-9a-f]+ \*/\s*$")
_TARGET = re.compile(r"\b(BRA|BRX|CALL\.REL(?:\.NOINC)?|CALL\.ABS|BSSY|SSY|PBK|WARPSYNC|JMP|RET\.REL)(\S*)\s+(.*?)0x[0-9a-f]+")


def normalize(line: str) -> str:
    line = _ENC.sub("", _ADDR.sub("", line))
    return _TARGET.sub(lambda m: f"{m.group(1)}{m.group(2)} {m.group(3)}<addr>", line)


def opcode(line: str) -> str | None:
    m = re.match(r"(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", normalize(line))
    return m.group(1).split(".")[0] if m else None


def instructions(lines: list[str]) -> list[str]:
    return [ln for ln in lines if _ADDR.match(ln)]


def res_usage(so: Path) -> str:
    txt = _run(["cuobjdump", "-res-usage", str(so)])
    return "\n".join(ln.strip() for ln in txt.splitlines() if "REG:" in ln)


def compare(name: str, old: Path, new: Path, ndiff: int) -> bool:
    a, b = sass(old), sass(new)
    if a == b:
        print(f"IDENTICAL  {name}  ({len(instructions(a))} instructions)")
        return True
    na, nb = [normalize(x) for x in a], [normalize(x) for x in b]
    if na == nb:
        print(f"IDENTICAL after address normalization  {name}  ({len(instructions(a))} instructions)")
        return True
    ia, ib = instructions(a), instructions(b)
    print(f"DIFFERS    {name}  instructions {len(ia)} -> {len(ib)}")
    ca = collections.Counter(opcode(x) for x in ia)
    cb = collections.Counter(opcode(x) for x in ib)
    delta = {k: cb[k] - ca[k] for k in sorted(set(ca) | set(cb), key=str) if cb[k] != ca[k]}
    print(f"  opcode count deltas: {delta}")
    print(f"  old: {res_usage(old)}\n  new: {res_usage(new)}")
    if ndiff:
        d = list(difflib.unified_diff(na, nb, "old", "new", n=1, lineterm=""))
        for ln in d[:ndiff]:
            print("  " + ln)
        if len(d) > ndiff:
            print(f"  ... {len(d) - ndiff} more diff lines")
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--diff", type=int, default=40, help="unified-diff lines to show per differing kernel")
    args = ap.parse_args(argv)
    old, new = entries(args.old), entries(args.new)
    ok = True
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            print(f"MISSING    {name}  (only in {'new' if name in new else 'old'})")
            ok = False
            continue
        ok &= compare(name, old[name], new[name], args.diff)
    print(f"{len(set(old) & set(new))} pairs compared: {'all identical' if ok else 'DIFFERENCES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
