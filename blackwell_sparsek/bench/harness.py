"""The benchmark harness: cases, presets, the measuring loop, correctness checks, time budget and progress.

One *case* is a problem (B, H, S, D, dtype, pattern). For each case the harness builds fresh random inputs
(seeded per case, never zeros) and the layout once, then for every peer that supports the case:

1. ``prepare`` (compiles/JITs happen here, outside the timings),
2. one poisoned call (allocator block filled with NaN first; ``BSK_POISON=1`` for ours) whose output is checked
   for NaN/inf and compared with the case's baseline (the first of our schedules that ran; relative error
   ‖a − b‖ / ‖b‖ in float32),
3. a call under ``torch.cuda.max_memory_allocated`` for the peak memory,
4. the timing (median, ``timing.bench``: the sustained clock).

The burst timings (example 88's protocol: ours timed as example 88 times itself, and example 88's binary) run in a
second pass after every case's sustained timings, on fresh inputs of the same seeds: a GPU at its power limit runs
a sustained measurement taken right after a burst up to 15 % slower, some of the time (H100: the 256K-token window
case 532 / 600 / 532 TFLOPS after a burst, 607-615 after another sustained measurement), so no sustained timing
follows a burst.

Separately, every (pattern, D, dtype) of a run is checked at a small shape against the float64 dense-masked
reference (``small_checks`` in the JSON), so a peer and our kernel cannot both be wrong the same way unnoticed.

The whole run honours a time budget: cases that would not fit are skipped (and listed), so a capped device
command always finishes and writes its JSON (written after every case, atomically).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from typing import Any, Callable, Sequence

from .. import _env
from . import metrics
from .peers import Flex, Ours, Peer, Tensors, default_peers
from .timing import bench as bench_time
from .timing import loop_bench as bench_loop
from .timing import REP_MS, WARMUP_MS, free_memory, peak_memory, poison_allocator, sync
from .cases import JIT_COMPILE_GUESS_S, Case, build_layout, case_flops, estimate_case_seconds, make_inputs

# ---------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------

class Progress:
    """One stderr line per step: ``[bsk bench  12/48  25%  1:23 elapsed, ~3:10 left] case | peer``."""

    def __init__(self, total: int, label: str = "bsk bench", stream: Any = None):
        self.total = max(1, total)
        self.done = 0
        self.t0 = time.monotonic()
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @staticmethod
    def _mmss(s: float) -> str:
        s = max(0, int(s))
        return f"{s // 60}:{s % 60:02d}"

    def line(self, what: str) -> str:
        el = time.monotonic() - self.t0
        pct = 100.0 * self.done / self.total
        left = el / self.done * (self.total - self.done) if self.done else float("nan")
        eta = f", ~{self._mmss(left)} left" if self.done else ""
        return f"[{self.label} {self.done:>3}/{self.total} {pct:3.0f}% {self._mmss(el)} elapsed{eta}] {what}"

    def update(self, what: str, advance: bool = False) -> None:
        if advance:
            self.done = min(self.total, self.done + 1)
        text = self.line(what)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text[:200])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------

def _is_fatal_cuda(e: BaseException) -> bool:
    s = str(e).lower()
    return any(m in s for m in ("illegal memory access", "unspecified launch failure", "device-side assert",
                                "misaligned address", "illegal instruction", "cuda error: an illegal"))


def _short(e: BaseException, n: int = 400) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) <= n else s[:n] + " ..."


class FatalCudaError(RuntimeError):
    """The CUDA context is broken (illegal address, ...): nothing after this can be measured in-process."""


@dataclasses.dataclass
class RunOptions:
    warmup_ms: float = WARMUP_MS
    rep_ms: float = REP_MS
    budget_s: float = 1e9
    check: bool = True
    cross_check: bool = True
    jit_peer_seqs: set[int] | None = None     # restrict Flex / FA4 to these seqs (None = all)
    ex88_seqs: set[int] = dataclasses.field(default_factory=set)
    ex88_iterations: int = 20
    ex88_repeats: int = 1
    peers_include: set[str] | None = None
    small_check_seq: int = 1024
    # also time like example 88 (20 back-to-back calls between two events) at these seqs (None = every case);
    # ratios against example 88 use this number, whose method matches its timer
    loop_timing_seqs: set[int] | None = dataclasses.field(default_factory=set)
    loop_n: int = 20
    verbose: bool = False


class Runner:
    """Runs cases over peers, collecting records; ``on_case_done(self)`` is called after every case (JSON)."""

    def __init__(self, cases: Sequence[Case], opts: RunOptions, *,
                 peers_for: Callable[[Case], list[Peer]] | None = None,
                 on_case_done: Callable[["Runner"], None] | None = None,
                 ex88_binary: Any = None, progress: Progress | None = None):
        self.cases = list(cases)
        self.opts = opts
        self._peers_for = peers_for
        self._peer_cache: dict[tuple, list[Peer]] = {}
        self.on_case_done = on_case_done
        self.ex88_binary = ex88_binary
        self.records: list[dict[str, Any]] = []
        self.small_checks: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.peer_info: dict[str, dict[str, Any]] = {}
        self.case_info: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.deadline = self.t0 + opts.budget_s
        self.fatal: str | None = None
        self.progress = progress or Progress(len(self.cases))
        self._checked: set[tuple] = set()
        self._no_jit = False
        # the second pass's work: per case, its layout, causal flag, FLOP counts and the (peer, record)s timed
        self._burst: list[tuple[Case, Any, bool, dict[str, float], list[tuple[Peer, dict[str, Any]]]]] = []

    # -- peers ---------------------------------------------------------------------------------------------------
    def peers(self, case: Case) -> list[Peer]:
        key = (case.d, case.dtype, case.device)
        if key not in self._peer_cache:
            if self._peers_for is not None:
                ps = self._peers_for(case)
            else:
                ps = default_peers(case.d, case.dtype, include=self.opts.peers_include, device=case.device)
            self._peer_cache[key] = ps
            for p in ps:
                self.peer_info.setdefault(p.name + (f"/d{case.d}/{case.dtype}" if p.kind == "ours" else ""),
                                          p.describe())
        return self._peer_cache[key]

    @staticmethod
    def _is_jit_peer(peer: Peer) -> bool:
        return isinstance(peer, Flex) or (peer.kind == "flash_attn" and peer.name == "fa4")

    def _jit_peer_allowed(self, peer: Peer, case: Case) -> str | None:
        if self._is_jit_peer(peer) and getattr(self, "_no_jit", False):
            self.skipped.append({"case": case.name, "peer": peer.name, "reason": "time budget (compile)"})
            return "time budget"
        if self._is_jit_peer(peer) and self.opts.jit_peer_seqs is not None and case.s not in self.opts.jit_peer_seqs:
            return f"compile-heavy peer runs only at S in {sorted(self.opts.jit_peer_seqs)} in this preset"
        return None

    def precompile(self) -> dict[str, float]:
        """Build every config of our peers before timing anything (parallel nvcc; cached builds are instant)."""
        ours: dict[str, Ours] = {}
        for c in self.cases:
            for p in self.peers(c):
                if isinstance(p, Ours) and c.device == "cuda":
                    ours.setdefault(p.config.to_json(), p)
        if not ours:
            return {}
        from concurrent.futures import ThreadPoolExecutor
        out: dict[str, float] = {}

        def one(p: Ours) -> tuple[str, float | str]:
            try:
                return p.config_name or "?", p.precompile()
            except Exception as e:  # reported per record later too
                return p.config_name or "?", _short(e)
        self.progress.update(f"building {len(ours)} kernel(s) (cached builds are instant)")
        with ThreadPoolExecutor(max_workers=min(4, len(ours))) as ex:
            for name, res in ex.map(one, ours.values()):
                if isinstance(res, str):
                    self.notes.append(f"precompile {name} failed: {res}")
                else:
                    out[name] = round(res, 2)
        return out

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        for i, case in enumerate(self.cases):
            if self.fatal:
                self.skipped.append({"case": case.name, "reason": f"CUDA context broken earlier: {self.fatal}"})
                continue
            self._no_jit = False
            active = [p for p in self.peers(case) if not p.unsupported(case) and not self._jit_peer_allowed(p, case)]
            n_jit = sum(1 for p in active if self._is_jit_peer(p))
            est_plain = estimate_case_seconds(case, len(active) - n_jit)
            est = est_plain + estimate_case_seconds(case, n_jit) - 0.5 + JIT_COMPILE_GUESS_S * n_jit if n_jit else \
                est_plain
            left = self.deadline - time.monotonic()
            if est > left:
                if n_jit and est_plain <= left:
                    self._no_jit = True  # drop only the compile-heavy peers of this case
                else:
                    self.skipped.append({"case": case.name,
                                         "reason": f"time budget: ~{est_plain:.0f}s needed, {left:.0f}s left"})
                    self.progress.update(f"skip {case.name} (time budget)", advance=True)
                    continue
            try:
                self.run_case(case)
            except FatalCudaError as e:
                self.fatal = str(e)
                self.notes.append(f"stopped: {e}")
            except Exception as e:  # a case-level failure (e.g. layout construction) must not end the sweep
                self.records.append(self._record(case, None, status="error", error=_short(e)))
                self.notes.append(f"{case.name}: {_short(e)}")
            finally:
                free_memory(case.device)
            self.progress.update(f"done {case.name}", advance=True)
            if self.on_case_done:
                self.on_case_done(self)
        self.burst_pass()
        self.progress.close()

    def _wants_loop(self, case: Case) -> bool:
        return self.opts.loop_timing_seqs is None or case.s in self.opts.loop_timing_seqs

    def _wants_ex88(self, case: Case) -> bool:
        return bool(case.pattern in ("dense", "causal") and case.s in self.opts.ex88_seqs and self.ex88_binary)

    def burst_pass(self) -> None:
        """Second pass: the burst-protocol timings of every case (ours like example 88, then example 88's binary),
        after all sustained ones, on the first pass's layout; inputs are made again from the case's seed."""
        for case, layout, causal, fl, timed in self._burst:
            if self.fatal:
                break
            if time.monotonic() > self.deadline:
                self.skipped.append({"case": case.name, "reason": "time budget (burst timings)"})
                continue
            try:
                if timed and self._wants_loop(case):
                    self._burst_loops(case, layout, causal, fl, timed)
                if self._wants_ex88(case):
                    self.run_ex88(case, fl, layout.density)
            except Exception as e:
                if case.device == "cuda" and _is_fatal_cuda(e):
                    self.fatal = f"burst timings of {case.name}: {_short(e, 200)}"
                    self.notes.append(f"stopped: {self.fatal}")
                else:
                    self.notes.append(f"{case.name} (burst timings): {_short(e)}")
            finally:
                free_memory(case.device)
            if self.on_case_done:
                self.on_case_done(self)

    def _burst_loops(self, case: Case, layout: Any, causal: bool, fl: dict[str, float],
                     timed: list[tuple[Peer, dict[str, Any]]]) -> None:
        q, k, v = make_inputs(case)
        t = Tensors(q, k, v, layout, causal, 1.0 / math.sqrt(case.d))
        for peer, rec in timed:
            self.progress.update(f"{case.name} | {peer.name} (burst)")
            with peer.context():
                fn = peer.prepare(case, t)
                lt = bench_loop(fn, device=case.device, n=self.opts.loop_n, reps=3, idle_s=1.0)  # ex88 protocol
            rec["time_ms_loop"] = lt.median_ms
            rec["tflops_loop"] = metrics.tflops(fl["flops"], lt.median_ms)
        del q, k, v, t

    def _record(self, case: Case, peer_obj: Peer | None, **kw: Any) -> dict[str, Any]:
        """One result record; keyword fields (``peer=``, ``kind=`` for peers that are not Peer objects, such as
        example 88's kernels) override the ones taken from ``peer_obj``."""
        rec: dict[str, Any] = {"case": case.name, "pattern": case.pattern, "b": case.b, "h": case.h, "s": case.s,
                               "d": case.d, "dtype": case.dtype, "window": case.window, "density_target": case.density,
                               "groups": list(case.groups),
                               "peer": peer_obj.name if peer_obj else None,
                               "kind": peer_obj.kind if peer_obj else None,
                               "config": peer_obj.config_name if peer_obj else None}
        rec.update(kw)
        return rec

    def run_case(self, case: Case) -> None:
        layout, causal = build_layout(case)
        fl = case_flops(case, layout)
        nbytes = metrics.io_bytes(case.b, case.h, case.s, case.s, case.d, 2)
        info = {"case": case.name, **case.as_dict(), "nnz": layout.nnz, "layout_heads": layout.num_heads,
                "density": layout.density, **fl, "io_bytes": nbytes}
        self.case_info.append(info)
        if self.opts.check:
            self.small_check(case)
        q, k, v = make_inputs(case)
        t = Tensors(q, k, v, layout, causal, 1.0 / math.sqrt(case.d))
        baseline: Any = None
        baseline_name: str | None = None
        timed: list[tuple[Peer, dict[str, Any]]] = []
        self._burst.append((case, layout, causal, fl, timed))
        for peer in self.peers(case):
            why = peer.unsupported(case) or self._jit_peer_allowed(peer, case)
            if why:
                continue
            if time.monotonic() > self.deadline:
                self.skipped.append({"case": case.name, "peer": peer.name, "reason": "time budget"})
                continue
            self.progress.update(f"{case.name} | {peer.name}")
            rec = self._record(case, peer, nnz=layout.nnz, block_pairs=fl["block_pairs"],
                               density=layout.density)
            try:
                out = self._measure(case, peer, t, rec, fl, nbytes)
            except FatalCudaError:
                raise
            except Exception as e:
                if case.device == "cuda" and _is_fatal_cuda(e):
                    rec.update(status="error", error=_short(e))
                    self.records.append(rec)
                    raise FatalCudaError(f"{peer.name} on {case.name}: {_short(e, 200)}") from e
                if type(e).__name__ == "OutOfMemoryError":
                    rec.update(status="oom", error=_short(e, 200))
                else:
                    rec.update(status="error", error=_short(e))
                self.records.append(rec)
                free_memory(case.device)
                continue
            # cross-check against the baseline (first of ours that ran; else the first peer)
            if self.opts.cross_check and out is not None:
                if baseline is None:
                    baseline, baseline_name = out, peer.name
                    rec["check_vs"] = None
                else:
                    err = metrics.rel_error(out, baseline)
                    rec["check_vs"] = baseline_name
                    rec.update({f"vs_{k2}": v2 for k2, v2 in err.items()})
                    rec["check_ok"] = err["nonfinite"] == 0 and err["rel_err"] <= 2 * metrics.tolerance(case.dtype)
            del out
            self.records.append(rec)
            if rec.get("status") == "ok":
                timed.append((peer, rec))
        del baseline, q, k, v, t

    def _measure(self, case: Case, peer: Peer, t: Tensors, rec: dict[str, Any], fl: dict[str, float],
                 nbytes: int) -> Any:
        import torch
        t_prep = time.monotonic()
        with peer.context():
            fn = peer.prepare(case, t)
            sync(case.device)
            rec["prepare_s"] = round(time.monotonic() - t_prep, 3)
            # 1. poisoned correctness call
            out_bytes = case.b * case.h * case.s * case.d * 2
            poison_allocator(out_bytes, case.device)
            with _env.override("BSK_POISON", "1") if peer.kind == "ours" else contextlib.nullcontext():
                out = fn()
            sync(case.device)
            nonfinite = int((~torch.isfinite(out)).sum().item())
            rec["nonfinite"] = nonfinite
            # 2. peak memory of one call
            peak, extra, o2 = peak_memory(fn, case.device)
            del o2
            rec["peak_mem_mb"] = None if peak is None else round(peak / 2**20, 1)
            rec["extra_mem_mb"] = None if extra is None else round(extra / 2**20, 1)
            # 3. timing
            tm = bench_time(fn, device=case.device, warmup_ms=self.opts.warmup_ms, rep_ms=self.opts.rep_ms)
        rec.update(tm.as_dict())
        ms = tm.median_ms
        rec["us_per_head"] = ms * 1e3 / (case.b * case.h)
        rec["tflops"] = metrics.tflops(fl["flops"], ms)
        rec["tflops_blocks"] = metrics.tflops(fl["flops_blocks"], ms)
        rec["tflops_dense"] = metrics.tflops(fl["flops_dense"], ms)
        rec["gbps"] = metrics.gbps(nbytes, ms)
        rec["status"] = "ok" if nonfinite == 0 else "nonfinite"
        if isinstance(peer, Flex):
            rec["compile_s"] = round(peer.compile_s.get(case.name, float("nan")), 2)
        return out.detach()

    # -- example 88 as a peer ------------------------------------------------------------------------------------
    def run_ex88(self, case: Case, fl: dict[str, float], density: float = 1.0) -> None:
        from . import ex88
        free_memory(case.device)
        self.progress.update(f"{case.name} | ex88")
        try:
            res = ex88.measure(self.ex88_binary, b=case.b, h=case.h, q=case.s, d=case.d,
                               causal=case.pattern == "causal", iterations=self.opts.ex88_iterations,
                               repeats=self.opts.ex88_repeats)
        except Exception as e:
            self.records.append(self._record(case, None, peer="ex88", kind="ex88", status="error", error=_short(e)))
            return
        for kr in res["kernels"]:
            ms = kr.get("time_ms")
            rec = self._record(case, None, peer=f"ex88 {kr['kernel']}", kind="ex88", config=kr["kernel"],
                               status="ok" if kr.get("tflops") else "error", time_ms=ms, timer="ex88",
                               reps=self.opts.ex88_iterations, ex88_tflops=kr.get("tflops"),
                               samples_tflops=kr.get("samples_tflops"), density=density,
                               block_pairs=fl["block_pairs"])
            if ms:
                rec["us_per_head"] = ms * 1e3 / (case.b * case.h)
                rec["tflops"] = metrics.tflops(fl["flops"], ms)
                rec["tflops_blocks"] = metrics.tflops(fl["flops_blocks"], ms)
                rec["tflops_dense"] = metrics.tflops(fl["flops_dense"], ms)
                rec["gbps"] = metrics.gbps(metrics.io_bytes(case.b, case.h, case.s, case.s, case.d, 2), ms)
            self.records.append(rec)

    # -- small-shape reference checks ----------------------------------------------------------------------------
    def small_check(self, case: Case) -> None:
        key = (case.pattern, case.d, case.dtype, case.density, case.per_head, case.window > 0, case.device)
        if key in self._checked:
            return
        self._checked.add(key)
        from ..reference import attention_reference
        s = self.opts.small_check_seq
        small = dataclasses.replace(case, b=1, h=2, s=s, window=min(case.window, 300) if case.window else 0,
                                    groups=("check",), seed=case.seed + 7)
        try:
            layout, causal = build_layout(small)
            q, k, v = make_inputs(small)
            ref = attention_reference(q, k, v, layout, causal=causal, scale=1.0 / math.sqrt(small.d))[0]
        except Exception as e:
            self.small_checks.append({"case": small.name, "peer": None, "status": "error", "error": _short(e)})
            return
        t = Tensors(q, k, v, layout, causal, 1.0 / math.sqrt(small.d))
        tol = metrics.tolerance(small.dtype)
        for peer in self.peers(case):
            why = peer.unsupported(small)
            if why:
                continue
            if self._is_jit_peer(peer):
                # each new shape costs FlexAttention / FA4 a compile; they are cross-checked at the large shapes
                continue
            entry: dict[str, Any] = {"case": small.name, "for": case.name, "peer": peer.name, "tolerance": tol}
            try:
                with peer.context():
                    fn = peer.prepare(small, t)
                    poison_allocator(q.numel() * q.element_size(), small.device)
                    with _env.override("BSK_POISON", "1") if peer.kind == "ours" else contextlib.nullcontext():
                        out = fn()
                    sync(small.device)
                err = metrics.rel_error(out, ref)
                entry.update(err)
                entry["ok"] = err["nonfinite"] == 0 and err["rel_err"] <= tol
                entry["status"] = "ok" if entry["ok"] else "mismatch"
            except Exception as e:
                if small.device == "cuda" and _is_fatal_cuda(e):
                    entry.update(status="error", error=_short(e))
                    self.small_checks.append(entry)
                    raise FatalCudaError(f"{peer.name} on {small.name}: {_short(e, 200)}") from e
                entry.update(status="error", error=_short(e))
            self.small_checks.append(entry)
        del q, k, v, ref
