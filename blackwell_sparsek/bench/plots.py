"""PNG plots of a benchmark run (matplotlib, optional: ``pip install matplotlib``).

* ``<prefix>_tflops_vs_seq_d<D>.png``: effective TFLOPS vs sequence length, one panel per pattern, one line per peer.
* ``<prefix>_tflops_vs_density.png``: effective TFLOPS vs block density (random top-k and dense) per peer.
* ``<prefix>_time_vs_nnz.png``: time vs listed block pairs of the linear-scaling cases with the least-squares
  line through the origin and the max deviation from proportionality.

Uses the Agg canvas directly (never touches the global backend), so it works headless.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from . import metrics

_PATTERN_ORDER = ("dense", "causal", "window", "topk")
_MARKERS = "osD^v<>ph*"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except Exception:
        return False


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _ok(r: dict[str, Any]) -> bool:
    return r.get("status") == "ok" and bool(r.get("tflops")) and r.get("peer") is not None


def _style(peer: str, idx: int) -> dict[str, Any]:
    ls = "-" if peer.startswith("ours") else "--" if peer.startswith("ex88") else ":"
    lw = 2.2 if peer.startswith("ours") else 1.3
    return {"linestyle": ls, "linewidth": lw, "marker": _MARKERS[idx % len(_MARKERS)], "markersize": 4}


def _pattern_label(r: dict[str, Any]) -> str:
    p = r["pattern"]
    if p == "window":
        return f"window {r.get('window')}"
    if p == "topk":
        return f"top-k {100 * (r.get('density_target') or 0):g}%"
    return p


def plot_tflops_vs_seq(records: Sequence[dict[str, Any]], path: str | Path, d: int, title: str = "") -> Path | None:
    rs = [r for r in records if _ok(r) and "seq" in (r.get("groups") or []) and r["d"] == d]
    if not rs:
        return None
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in rs:
        panels.setdefault(_pattern_label(r), []).append(r)
    names = sorted(panels, key=lambda n: (next((i for i, p in enumerate(_PATTERN_ORDER) if n.startswith(p) or
                                                (p == "topk" and n.startswith("top-k"))), 9), n))
    cols = 2 if len(names) > 1 else 1
    rows = math.ceil(len(names) / cols)
    fig = _figure(6.0 * cols, 3.6 * rows)
    peers = sorted({r["peer"] for r in rs}, key=lambda p: (not p.startswith("ours"), p))
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, peer in enumerate(peers):
            pts = sorted((r["s"], r["tflops"]) for r in panels[name] if r["peer"] == peer)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=peer, **_style(peer, j))
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("effective TFLOPS")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(title or f"forward, head_dim {d}", fontsize=11)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return Path(path)


def plot_tflops_vs_density(records: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    rs = [r for r in records if _ok(r) and "density" in (r.get("groups") or [])
          and r["pattern"] in ("topk", "dense")]
    if not rs:
        return None
    shapes = sorted({(r["b"], r["h"], r["s"], r["d"]) for r in rs}, key=lambda t: (t[2], t[3]))
    fig = _figure(6.0 * len(shapes), 3.8)
    for i, shp in enumerate(shapes):
        ax = fig.add_subplot(1, len(shapes), i + 1)
        sub = [r for r in rs if (r["b"], r["h"], r["s"], r["d"]) == shp]
        peers = sorted({r["peer"] for r in sub}, key=lambda p: (not p.startswith("ours"), p))
        for j, peer in enumerate(peers):
            pts = sorted((100.0 * (r.get("density") or 0), r["tflops"]) for r in sub if r["peer"] == peer)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=peer, **_style(peer, j))
        ax.set_title(f"B{shp[0]} H{shp[1]} S{shp[2]} D{shp[3]}", fontsize=10)
        ax.set_xlabel("block density (%)")
        ax.set_ylabel("effective TFLOPS")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "random top-k block sparsity (per head)", fontsize=11)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return Path(path)


def plot_time_vs_nnz(records: Sequence[dict[str, Any]], path: str | Path,
                     groups: Sequence[str] = ("linear", "density"), title: str = "") -> Path | None:
    """One panel per group present: 'linear' (one pattern, S varies) and 'density' (one S, density varies),
    each with least-squares lines through the origin and the max deviation from proportionality per peer."""
    def sel(g: str) -> list[dict[str, Any]]:
        return [r for r in records if r.get("status") == "ok" and r.get("time_ms") and r.get("block_pairs")
                and g in (r.get("groups") or []) and r.get("peer")]
    panels = [(g, sel(g)) for g in groups]
    panels = [(g, rs) for g, rs in panels if rs]
    if not panels:
        return None
    fig = _figure(6.5 * len(panels), 4.4)
    for i, (g, rs) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        peers = sorted({r["peer"] for r in rs}, key=lambda p: (not p.startswith("ours"), p))
        notes = []
        # a series = one peer on one problem family: S varies (linear) or the density varies at fixed S
        def series(r: dict[str, Any]) -> tuple:
            return (r["b"], r["h"], r["d"], f"S{r['s']}" if g == "density" else r["pattern"])
        shapes = sorted({series(r) for r in rs})
        for j, peer in enumerate(peers):
            for shp in shapes:
                pts = sorted((r["block_pairs"], r["time_ms"] * 1e3) for r in rs
                             if r["peer"] == peer and series(r) == shp)
                if not pts:
                    continue
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                lab = peer if len(shapes) == 1 else f"{peer} {shp[3]} B{shp[0]} H{shp[1]} D{shp[2]}"
                line = ax.plot(xs, ys, linestyle="none", marker=_style(peer, j)["marker"], label=lab)[0]
                fit = metrics.linear_fit(xs, ys)
                if fit.get("ok"):
                    c = fit["proportional_slope"]
                    ax.plot([0, max(xs)], [0, c * max(xs)], color=line.get_color(), linewidth=0.9, alpha=0.7)
                    notes.append(f"{lab}: max dev {100 * fit['max_dev_from_proportional']:.1f}%")
        ax.set_xlabel("listed block pairs (all batch x heads)")
        ax.set_ylabel("time (us)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        if notes:
            ax.text(0.98, 0.02, "\n".join(notes[:8]), transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
        what = {"linear": "sequence length varies", "density": "density varies"}.get(g, g)
        ax.set_title(f"time vs non-zero blocks ({what})", fontsize=10)
    fig.suptitle(title or "lines: least squares through the origin", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return Path(path)


def make_all(records: Sequence[dict[str, Any]], out_dir: str | Path, prefix: str) -> list[Path]:
    """Every plot the records support; [] (and no error) without matplotlib."""
    if not have_matplotlib():
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made: list[Path | None] = []
    for d in sorted({r["d"] for r in records if r.get("d")}):
        made.append(plot_tflops_vs_seq(records, out / f"{prefix}_tflops_vs_seq_d{d}.png", d))
    made.append(plot_tflops_vs_density(records, out / f"{prefix}_tflops_vs_density.png"))
    made.append(plot_time_vs_nnz(records, out / f"{prefix}_time_vs_nnz.png"))
    return [p for p in made if p is not None]

