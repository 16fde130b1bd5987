"""Results: environment facts, JSON files (atomic, NaN-free), text tables and summaries (linear scaling)."""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import metrics

SCHEMA = "blackwell_sparsek.bench/1"


def sanitize(x: Any) -> Any:
    """JSON-safe copy: non-finite floats -> None, tuples/sets -> lists, Paths -> str, unknown objects -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): sanitize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [sanitize(v) for v in (sorted(x) if isinstance(x, (set, frozenset)) else x)]
    if isinstance(x, Path):
        return str(x)
    try:
        import enum
        if isinstance(x, enum.Enum):
            return x.name
    except Exception:
        pass
    return str(x)


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON atomically (tmp file + os.replace); parents are created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(sanitize(data), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, p)
    return p


def finish_rows(rows: list[dict[str, Any]], table: Any, json_path: str | None) -> int:
    """The end of a small bench's main: print ``table(rows, gpu)`` and write {gpu, rows} as JSON when asked."""
    import torch
    gpu = torch.cuda.get_device_name()
    print(table(rows, gpu))
    if json_path:
        write_json(json_path, {"gpu": gpu, "rows": rows})
    return 0


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:
        pass
    return None


def environment() -> dict[str, Any]:
    """GPU name, SM count, driver, torch/CUDA/triton versions, date, package version and commit."""
    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import blackwell_sparsek
        env["blackwell_sparsek"] = blackwell_sparsek.__version__
    except Exception:
        pass
    env["git_commit"] = _git_commit()
    try:
        import torch
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = torch.cuda.get_device_name(0)
            env["sm_count"] = p.multi_processor_count
            env["compute_capability"] = f"{p.major}.{p.minor}"
            env["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        else:
            env["gpu"] = None
    except Exception as e:
        env["torch_error"] = str(e)
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    for mod in ("flash_attn", "xformers"):
        try:
            m = __import__(mod)
            env[mod] = getattr(m, "__version__", "?")
        except Exception:
            pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            if out.returncode == 0:
                env["nvidia_smi"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except Exception:
            pass
    try:
        from ..jit.compiler import find_nvcc, nvcc_version
        env["nvcc"] = nvcc_version(find_nvcc()).splitlines()[-1]
    except Exception:
        pass
    try:
        from ..jit.compiler import cutlass_version
        env["cutlass"] = cutlass_version()
    except Exception:
        pass
    return env


# ---------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------

def _fmt(v: Any, spec: str = ".1f", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return none
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str], align: str | None = None) -> str:
    """Plain monospaced table; ``align`` is one char per column ('l' or 'r'), default: first column left."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    n = len(header)
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    align = align or ("l" + "r" * (n - 1))
    lines = []
    for j, r in enumerate(cells):
        parts = [r[i].ljust(widths[i]) if align[i] == "l" else r[i].rjust(widths[i]) for i in range(n)]
        lines.append("  ".join(parts).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def records_table(records: Iterable[dict[str, Any]]) -> str:
    rows = []
    for r in records:
        if r.get("peer") is None:
            continue
        err = r.get("vs_rel_err")
        chk = "" if err is None else f"{err:.1e}" + ("" if r.get("check_ok", True) else " !")
        rows.append([r["case"], r["peer"], _fmt(r.get("time_ms"), ".3f"), _fmt(r.get("us_per_head"), ".1f"),
                     _fmt(r.get("tflops"), ".0f"), _fmt(r.get("gbps"), ".0f"), _fmt(r.get("peak_mem_mb"), ".0f"),
                     chk, r.get("status", "?") + (f" ({r['error'][:60]})" if r.get("error") else "")])
    return format_table(rows, ["case", "peer", "ms", "us/head", "TFLOPS", "GB/s", "peak MB", "rel err",
                               "status"], "llrrrrrrl")


def summary_table(records: Iterable[dict[str, Any]]) -> str:
    """One line per case: best of ours (and which), each peer family's best, and ours / best peer (time ratio)."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("peer") is not None:
            by_case.setdefault(r["case"], []).append(r)
    kinds = ["ex88", "sdpa", "flex", "flash_attn", "xformers"]
    present = [k for k in kinds if any(r.get("kind") == k for rs in by_case.values() for r in rs)]
    rows = []
    for case, rs in by_case.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("tflops")]
        ours = max((r for r in ok if r.get("kind") == "ours"), key=lambda r: r["tflops"], default=None)
        bests = {k: max((r for r in ok if r.get("kind") == k), key=lambda r: r["tflops"], default=None)
                 for k in present}
        peer_best = max((b for b in bests.values() if b), key=lambda r: r["tflops"], default=None)
        bad = [r["peer"] for r in rs if r.get("status") != "ok" or r.get("check_ok") is False]
        rows.append([case, _fmt(ours["tflops"] if ours else None, ".0f"),
                     (ours["peer"].replace("ours-", "") if ours else "-"),
                     *[_fmt(bests[k]["tflops"] if bests[k] else None, ".0f") for k in present],
                     (_fmt(ours["tflops"] / peer_best["tflops"], ".2f") + "x") if ours and peer_best else "-",
                     ",".join(bad)[:40]])
    head = ["case", "ours TFLOPS", "sched", *[{"flash_attn": "FA"}.get(k, k) for k in present], "ours/best peer",
            "errors/check failures"]
    return format_table(rows, head, "lrl" + "r" * len(present) + "rl")


def small_checks_table(checks: Iterable[dict[str, Any]]) -> str:
    rows = [[c.get("case"), c.get("peer") or "-", _fmt(c.get("rel_err"), ".2e"), _fmt(c.get("max_abs_err"), ".2e"),
             c.get("status", "?") + (f" ({c['error'][:70]})" if c.get("error") else "")] for c in checks]
    return format_table(rows, ["reference check", "peer", "rel err", "max abs", "status"], "llrrl")


# ---------------------------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------------------------

def linearity(records: Iterable[dict[str, Any]], *, group: str = "linear", kind: str = "ours") -> dict[str, Any]:
    """Per peer of ``kind``: least-squares fit of time (µs) vs listed block pairs over the ``group`` cases
    (same pattern, B, H, D; S varies), with the max deviation from proportionality and min effective TFLOPS."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == kind and group in (r.get("groups") or []) and r.get("time_ms") and r.get("block_pairs"):
            by.setdefault(r["peer"], []).append(r)
    out: dict[str, Any] = {}
    for peer, rs in sorted(by.items()):
        rs = sorted(rs, key=lambda r: r["block_pairs"])
        fit = metrics.linear_fit([r["block_pairs"] for r in rs], [r["time_ms"] * 1e3 for r in rs])
        fit["points"] = [{"s": r["s"], "block_pairs": r["block_pairs"], "time_us": r["time_ms"] * 1e3,
                          "tflops": r.get("tflops")} for r in rs]
        tf = [r.get("tflops") for r in rs if r.get("tflops")]
        fit["min_tflops"] = min(tf) if tf else None
        fit["within_10pct"] = bool(fit.get("ok") and fit["max_dev_from_proportional"] <= 0.10)
        out[peer] = fit
    return out


def linearity_text(lin: dict[str, Any]) -> str:
    lines = []
    for peer, f in lin.items():
        if not f.get("ok"):
            lines.append(f"{peer}: linear fit not possible ({f.get('reason')})")
            continue
        lines.append(f"{peer}: time = {f['intercept']:.1f} us + {f['slope'] * 1e3:.3f} ns x blocks (r2 {f['r2']:.4f}); "
                     f"max deviation from proportional {f['max_dev_from_proportional'] * 100:.1f}% over "
                     f"{f['n']} points; min {_fmt(f.get('min_tflops'), '.0f')} TFLOPS")
    return "\n".join(lines)


def best_by(records: Iterable[dict[str, Any]], case: str, kind: str) -> dict[str, Any] | None:
    rs = [r for r in records if r.get("case") == case and r.get("kind") == kind and r.get("tflops")
          and r.get("status") == "ok"]
    return max(rs, key=lambda r: r["tflops"]) if rs else None


def print_err(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)
