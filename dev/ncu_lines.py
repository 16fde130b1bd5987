"""Nsight Compute's per-instruction counters of one kernel, summed by the line of our code each instruction came
from: where a kernel's executed instructions and stall samples go, by source line, and its instruction mix.

    BSK_LINEINFO=1 ... (build the kernel: -lineinfo is part of the cache key, so the GPU run needs it set too)
    ncu --kernel-name-base demangled -k regex:attn_fwd --launch-skip 3 --launch-count 1 --section SourceCounters \
        -o R python dev/ncu_targets.py NAME
    ncu -i R.ncu-rep --page source --csv --print-source sass > R.csv
    python dev/ncu_lines.py R.csv ENTRY/kernel.so [--units N] [--top 25] [--inner]   # on any host

The CSV's instruction addresses are matched to the cubin's by offset from the kernel's first instruction (the
kernel must be the .so's first function: the launched kernel). An instruction counts for its innermost line in a
file of ours (``bsk/``; --inner: its innermost line anywhere, CUTLASS included). --units divides the counts (e.g.
the number of 64-row tiles x 4 warps, to compare kernels of different grids per unit of work). Runs and findings:
bench/results/h200/short_rows_first_step.txt.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_diff import ENV  # noqa: E402  (cuobjdump and nvdisasm on PATH, from the toolkit or the wheels)

_FILE = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
_INST = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass_lines(so: str) -> dict[int, tuple[list[tuple[str, int]], str]]:
    """Offset -> (inline chain of (file, line), innermost first; instruction text) of the .so's first kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cuobjdump", "-xelf", "all", str(Path(so).resolve())], cwd=tmp, env=ENV, check=True,
                       capture_output=True)
        cubin = next(Path(tmp).glob("*.cubin"))
        text = subprocess.run(["nvdisasm", "-gi", "-c", str(cubin)], env=ENV, check=True, capture_output=True,
                              text=True).stdout
    out, chain, fresh, seen_fn = {}, [], True, 0
    for line in text.splitlines():
        if line.startswith(".text."):
            seen_fn += 1
            if seen_fn > 1:
                break
        m = _FILE.match(line)
        if m:
            if fresh:
                chain, fresh = [], False
            chain.append((m.group(1), int(m.group(2))))
            continue
        m = _INST.match(line)
        if m:
            out[int(m.group(1), 16)] = (list(chain), m.group(2))
            fresh = True
    return out


def _where(chain: list[tuple[str, int]], inner: bool) -> str:
    ours = [(f, n) for f, n in chain if "/bsk/" in f]
    f, n = (chain[0] if inner or not ours else ours[0]) if chain else ("?", 0)
    return f"{re.sub(r'.*/(include|source)/', '', f)}:{n}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("so")
    ap.add_argument("--units", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--inner", action="store_true")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = rows[1]
    ia, ie = hdr.index("Address"), hdr.index("Instructions Executed")
    iss = hdr.index("Warp Stall Sampling (All Samples)")
    data = [r for r in rows[2:] if r[ia].startswith("0x")]
    base = min(int(r[ia], 16) for r in data)
    sass = sass_lines(a.so)
    by_line, samples, ops = collections.Counter(), collections.Counter(), collections.Counter()
    for r in data:
        chain, text = sass.get(int(r[ia], 16) - base, ([], "?"))
        ex, st = int(r[ie] or 0), int(r[iss] or 0)
        where = _where(chain, a.inner)
        by_line[where] += ex
        samples[where] += st
        ops[re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]] += ex
    tot, tot_s = sum(by_line.values()) or 1, sum(samples.values()) or 1
    print(f"executed instructions {tot / a.units:.1f} per unit, stall samples {tot_s}")
    print("| line | instructions per unit | share | stall samples |\n|---|---|---|---|")
    for where, n in by_line.most_common(a.top):
        print(f"| {where} | {n / a.units:.1f} | {100 * n / tot:.1f} % | {100 * samples[where] / tot_s:.1f} % |")
    print("opcodes per unit: " + ", ".join(f"{k} {v / a.units:.1f}" for k, v in ops.most_common(24)))


if __name__ == "__main__":
    main()
