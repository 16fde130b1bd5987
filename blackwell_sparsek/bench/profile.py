"""``profile``: Nsight Compute on one of our kernels, key metrics into JSON + markdown.

Builds the kernel first (in this process, so the profiled process never compiles), writes a tiny launcher script
that calls ``sparse_attention`` a few times, runs it under::

    ncu --target-processes all --kernel-name-base demangled --kernel-name regex:bsk_ --launch-skip 2
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats
        --section ComputeWorkloadAnalysis --metrics <the extra metrics this ncu knows> --export <report>

then reads the report back with ``ncu --import <report> --csv --page raw`` and keeps the metrics below.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import _env
from .report import environment, format_table, write_json

# (label, unit, candidate raw metric names in order of preference)
KEY_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("duration", "us", ("gpu__time_duration.sum",)),
    ("SM throughput", "%", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("tensor pipe (GMMA) cycles active", "%", (
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")),
    # an issue rate, not a busy fraction: one GMMA instruction keeps the pipe busy for many cycles
    ("GMMA instructions issued", "% of peak issue", (
        "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",)),
    ("memory throughput", "%", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("DRAM throughput", "%", ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                              "dram__throughput.avg.pct_of_peak_sustained_elapsed")),
    ("DRAM bandwidth", "GB/s", ("dram__bytes.sum.per_second",)),
    ("L2 hit rate", "%", ("lts__t_sector_hit_rate.pct",)),
    ("achieved occupancy", "%", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    ("theoretical occupancy", "%", ("sm__maximum_warps_per_active_cycle_pct",)),
    ("registers / thread", "", ("launch__registers_per_thread",)),
    ("dynamic smem / block", "bytes", ("launch__shared_mem_per_block_dynamic",)),
    ("static smem / block", "bytes", ("launch__shared_mem_per_block_static",)),
    ("block size", "threads", ("launch__block_size",)),
    ("grid size", "blocks", ("launch__grid_size",)),
    ("waves per SM", "", ("launch__waves_per_multiprocessor",)),
    ("SM count", "", ("device__attribute_multiprocessor_count",)),
)
# Extra metrics passed with --metrics when this ncu knows them (the sections cover the rest).
EXTRA_METRICS = ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
                 "dram__bytes.sum.per_second", "lts__t_sector_hit_rate.pct", "gpu__time_duration.sum")
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis")

LAUNCHER = r'''
import math, sys, json
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.bench.cases import Case, build_layout, make_inputs
spec = json.loads(sys.argv[1])
cfg = bsk.resolve_config(spec["config"])
case = Case(**spec["case"])
layout, causal = build_layout(case)
q, k, v = make_inputs(case)
for _ in range(spec["launches"]):
    o = bsk.sparse_attention(q, k, v, layout, causal=causal, config=cfg)
if case.device == "cuda":
    torch.cuda.synchronize()
print("launched", spec["launches"], "x", cfg.kernel_name)
'''


def find_ncu() -> str | None:
    env = _env.text("BSK_NCU")
    if env and Path(env).is_file():
        return env
    w = shutil.which("ncu")
    if w:
        return w
    for c in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if Path(c).is_file():
            return c
    return None


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw``: a header row of metric names, a units row, one row per kernel launch.
    Lines before the header (==PROF== chatter) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') or ln.startswith("ID,")), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    if not rows:
        return []
    header = rows[0]
    body = rows[1:]
    units: dict[str, str] = {}
    if body and (not body[0] or not body[0][0].strip().isdigit()):
        units = dict(zip(header, body[0]))
        body = body[1:]
    out = []
    for r in body:
        if len(r) < len(header) // 2:
            continue
        d = dict(zip(header, r))
        d["__units__"] = json.dumps(units)
        out.append(d)
    return out


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    t = s.strip().replace(",", "")
    if not t or t in ("n/a", "N/A"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


# ncu spells units several ways ("msecond"/"ms", "Kbyte"/"KB", "Gbyte/second"/"Gbyte/s"/"GB/s"); parse the
# prefix and the base instead of listing spellings.
_PREFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 1024.0, "Mi": 1024.0 ** 2, "Gi": 1024.0 ** 3}
_UNIT_RE = {
    "us": (re.compile(r"^(n|u|m|)s(?:econd)?$"), 1e-6),                          # -> microseconds
    "GB/s": (re.compile(r"^(K|k|M|G|T|)(?:byte|B)/s(?:econd)?$"), 1e9),          # -> GB/s
    "bytes": (re.compile(r"^(Ki|Mi|Gi|K|k|M|G|)(?:byte|B)(?:/block)?$"), 1.0),  # -> bytes
}


def convert_unit(value: float, unit_from: str, unit_to: str) -> float:
    """``value`` in ncu's ``unit_from`` expressed in ``unit_to`` (us, GB/s or bytes); ValueError if unknown."""
    rx, base = _UNIT_RE[unit_to]
    m = rx.match(unit_from)
    if not m:
        raise ValueError(f"no conversion from {unit_from!r} to {unit_to} known")
    return value * _PREFIX[m.group(1)] / base


def key_metrics(row: dict[str, str]) -> dict[str, Any]:
    """Pick KEY_METRICS from one raw row, converting durations to µs and bandwidths to GB/s."""
    units = json.loads(row.get("__units__", "{}"))
    out: dict[str, Any] = {}
    for label, unit, names in KEY_METRICS:
        for n in names:
            if n in row:
                v = _num(row[n])
                if v is None:
                    continue
                u = units.get(n, "").strip()
                shown = unit
                if unit in _UNIT_RE and u:
                    try:
                        v = convert_unit(v, u, unit)
                    except ValueError:
                        shown = u  # a spelling we do not know: report ncu's own value and unit, unconverted
                out[label] = {"value": v, "unit": shown, "metric": n}
                break
    for k in ("Kernel Name", "Demangled Name", "Function Name", "Block Size", "Grid Size"):
        if k in row:
            out.setdefault("_kernel", row[k])
    return out


def available_metrics(ncu: str) -> set[str] | None:
    """Base metric names this ncu knows for the current GPU (None if the query fails)."""
    try:
        p = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except Exception:
        return None
    if p.returncode != 0:
        return None
    names = set()
    for ln in p.stdout.splitlines():
        parts = ln.replace(",", " ").replace('"', " ").split()
        if parts and "__" in parts[0]:
            names.add(parts[0])
    return names or None


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Nsight Compute: {report.get('kernel')}", "",
             f"GPU {report['env'].get('gpu')}, {report.get('case')}, config `{report.get('config')}`", ""]
    rows = [[k, f"{v['value']:.4g}", v["unit"], f"`{v['metric']}`"] for k, v in report.get("metrics", {}).items()
            if not k.startswith("_")]
    lines.append("| metric | value | unit | ncu name |")
    lines.append("|---|---:|---|---|")
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def run(config: str | None, shape: tuple[int, int, int, int], pattern: str = "dense", density: float = 0.25,
        window: int = 2048, dtype: str = "fp16", out_dir: str | None = None, kernel_regex: str = "regex:bsk_",
        launch_skip: int = 2, timeout: float = 540.0, device: str = "cuda") -> int:
    """Returns the exit status. Files (JSON, markdown, the .ncu-rep under ``out_dir/tmp/``) are written only when
    ``out_dir`` is given; otherwise the metrics are printed and the report is discarded. ``device='cpu'`` only
    tests the plumbing (with a fake ncu)."""
    ncu = find_ncu()
    if ncu is None:
        print("profile: Nsight Compute (ncu) is not on PATH (nor $BSK_NCU, /usr/local/cuda/bin/ncu): install "
              "Nsight Compute (part of the CUDA toolkit) or set BSK_NCU=/path/to/ncu", file=sys.stderr)
        return 2
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        print("profile: needs a CUDA GPU", file=sys.stderr)
        return 2
    import blackwell_sparsek as bsk
    from .cases import Case
    from .peers import our_configs
    b, h, s, d = shape
    if config:
        cfg = bsk.resolve_config(config)
        cfg_name = config
        d = getattr(cfg, "head_dim", d)
        dtype = getattr(getattr(cfg, "dtype", None), "value", dtype)
    else:
        cfg_name, cfg = our_configs(d, dtype)[0]
    case = Case(b=b, h=h, s=s, d=d, pattern=pattern, dtype=dtype, density=density if pattern == "topk" else 0.0,
                window=window if pattern == "window" else 0, device=device)
    if device == "cuda":
        print(f"profile: building {cfg.kernel_name} ...", file=sys.stderr, flush=True)
        bsk.precompile(cfg)
    spec = {"config": cfg.to_json(), "case": {k: v for k, v in case.as_dict().items() if k != "name"},
            "launches": launch_skip + 2}
    spec["case"]["groups"] = []
    out = Path(out_dir) if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    avail = available_metrics(ncu)
    extra = [m for m in EXTRA_METRICS if avail is None or m.split(".")[0] in avail]
    with tempfile.TemporaryDirectory(prefix="bsk-ncu-") as td:
        script = Path(td) / "launch.py"
        script.write_text(LAUNCHER)
        rep = Path(td) / "report"
        base = [ncu, "--target-processes", "all", "--kernel-name-base", "demangled", "--kernel-name", kernel_regex,
                "--launch-skip", str(launch_skip), "--launch-count", "1"]
        for sec in SECTIONS:
            base += ["--section", sec]
        cmd = base + (["--metrics", ",".join(extra)] if extra else []) + \
            ["--export", str(rep), "--force-overwrite", sys.executable, str(script), json.dumps(spec)]
        env = _env.child_environ()
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2])] +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        print("profile: " + " ".join(cmd[:-1]) + " '<spec>'", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        log = p.stdout + p.stderr
        if p.returncode != 0 and "--metrics" in cmd and "metric" in log.lower() and "fail" in log.lower():
            cmd = base + ["--export", str(rep), "--force-overwrite", sys.executable, str(script), json.dumps(spec)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            log = p.stdout + p.stderr
        if "ERR_NVGPUCTRPERM" in log:
            print("profile: ncu has no permission for the GPU performance counters (ERR_NVGPUCTRPERM): run as root "
                  "or with the driver option NVreg_RestrictProfilingToAdminUsers=0", file=sys.stderr)
            return 3
        rep_file = rep.with_suffix(".ncu-rep")
        if p.returncode != 0 or not rep_file.is_file():
            tail = "\n".join(log.strip().splitlines()[-25:])
            hint = (" (no kernel matched: try --kernel-regex regex:. to see every kernel)"
                    if "No kernels were profiled" in log else "")
            print(f"profile: ncu failed (rc={p.returncode}){hint}:\n{tail}", file=sys.stderr)
            return 1
        imp = subprocess.run([ncu, "--import", str(rep_file), "--csv", "--page", "raw"], capture_output=True,
                             text=True, timeout=300)
        rows = parse_raw_csv(imp.stdout)
        if not rows:
            print(f"profile: could not read the report back:\n{imp.stdout[-2000:]}{imp.stderr[-2000:]}",
                  file=sys.stderr)
            return 1
        stem = f"profile_{cfg_name if config else cfg.kernel_name}_{case.pattern}_s{s}"
        stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)
        if out is not None:
            keep = out / "tmp"  # bench/results/tmp/ is git-ignored: the binary report is never committed
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(rep_file, keep / f"{stem}.ncu-rep")
    km = key_metrics(rows[0])
    report = {"schema": "blackwell_sparsek.profile/1", "env": environment(), "config": cfg_name,
              "kernel": cfg.kernel_name, "profiled_kernel": km.pop("_kernel", None), "case": case.name,
              "metrics": km, "ncu_command": " ".join(cmd[:-1]) + " '<spec>'",
              "raw": {k: v for k, v in rows[0].items() if not k.startswith("__")}}
    rows_t = [[k, f"{v['value']:.4g} {v['unit']}".strip()] for k, v in km.items()]
    print(format_table(rows_t, ["metric", "value"], "lr"))
    if out is None:
        print("wrote no files (pass --out DIR to keep the metrics as JSON/markdown and the Nsight Compute report)")
        return 0
    jp = write_json(out / f"{stem}.json", report)
    mp = out / f"{stem}.md"
    mp.write_text(markdown(report))
    print(f"wrote {jp}, {mp} and {out / 'tmp' / (stem + '.ncu-rep')} (open it in Nsight Compute)")
    return 0

