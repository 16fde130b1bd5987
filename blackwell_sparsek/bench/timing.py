"""Timing, memory and allocator-poisoning helpers.

GPU timing uses ``triton.testing.do_bench`` (median; it flushes L2 between repetitions) when triton imports, else
CUDA events with the same recipe: one call, a short estimate, warm-up for ``warmup_ms``, then ``rep_ms`` worth of
individually timed calls after an L2 flush each, median. On CPU (only used to test the harness) it is
``time.perf_counter`` medians.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable


# Defaults of ``bench``. Under sustained load the GPU runs at its power limit and lowers its clock within about
# 100 ms; timed right after an idle gap (a compile, another peer's setup), a short warm-up catches part of the boost,
# so the result depends on what ran before it (25 ms warm-up + 100 ms: 630 vs 570 TFLOPS for the same kernel as the
# first or a later measurement of a process, H200). Half a second of warm-up reaches the sustained state.
WARMUP_MS = 500.0
REP_MS = 200.0


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str

    def as_dict(self) -> dict[str, Any]:
        return {"time_ms": self.median_ms, "time_ms_p20": self.p20_ms, "time_ms_p80": self.p80_ms,
                "reps": self.reps, "timer": self.method}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    i = q * (len(s) - 1)
    lo, hi = int(i), min(int(i) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _from_samples(xs: list[float], method: str) -> Timing:
    return Timing(statistics.median(xs), _quantile(xs, 0.2), _quantile(xs, 0.8), len(xs), method)


def have_triton() -> bool:
    try:
        import triton.testing  # noqa: F401
        return True
    except Exception:
        return False


def bench(fn: Callable[[], Any], *, device: str = "cuda", warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS,
          max_reps: int = 1000, use_triton: bool | None = None) -> Timing:
    """Median time of ``fn()`` in milliseconds."""
    if device != "cuda":
        return _bench_cpu(fn, rep_ms=rep_ms, max_reps=max_reps)
    if use_triton is None:
        use_triton = have_triton()
    if use_triton:
        try:
            import triton.testing
            try:
                xs = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
                xs = [float(x) for x in xs]
                return _from_samples(xs, "triton.do_bench")
            except TypeError:  # older triton without return_mode="all"
                m = float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
                return Timing(m, m, m, -1, "triton.do_bench")
        except Exception:
            # do_bench failing for an API reason must not lose the measurement: fall through to CUDA events.
            pass
    return _bench_cuda_events(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, max_reps=max_reps)


_L2_FLUSH: Any = None


def host_us(fn: Callable[[], Any], n: int = 200) -> tuple[float, float]:
    """(host microseconds per call issuing ``n`` calls back to back with no sync inside the loop, microseconds per
    call including the final sync). When the first is close to the second, the calls are host-bound."""
    import torch
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def kernel_us(fn: Callable[[], Any], n: int = 20) -> list[tuple[str, float, float]]:
    """The device work of one call of ``fn`` from the torch profiler (one warm-up call first): (kernel or
    memset/memcpy name, launches per call, microseconds per call), longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()

    def dev_us(e):  # the attribute's name changed across torch versions
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
    rows = [(e.key, e.count / n, dev_us(e) / n) for e in prof.key_averages() if dev_us(e) > 0]
    return sorted(rows, key=lambda r: -r[2])


def _flush_l2() -> None:
    import torch
    global _L2_FLUSH
    if _L2_FLUSH is None:
        _L2_FLUSH = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    _L2_FLUSH.zero_()


def _bench_cuda_events(fn: Callable[[], Any], *, warmup_ms: float, rep_ms: float, max_reps: int) -> Timing:
    import torch
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        _flush_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm = max(1, int(warmup_ms / est))
    n_rep = max(3, min(max_reps, int(rep_ms / est)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        _flush_l2()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return _from_samples([s.elapsed_time(e) for s, e in zip(starts, ends)], "cuda-events")


def _bench_cpu(fn: Callable[[], Any], *, rep_ms: float, max_reps: int) -> Timing:
    fn()
    xs: list[float] = []
    t_end = time.perf_counter() + rep_ms / 1e3
    while len(xs) < 3 or (time.perf_counter() < t_end and len(xs) < max_reps):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e3)
    return _from_samples(xs, "perf_counter")


def loop_bench(fn: Callable[[], Any], *, device: str = "cuda", n: int = 20, reps: int = 15,
               budget_ms: float = 400.0, est_ms: float | None = None, idle_s: float = 0.0,
               graph: bool = False) -> Timing:
    """Example 88's way of timing: ``n`` back-to-back calls between two CUDA events (warm L2, host launch overhead
    overlapped with the GPU), per-call time; the median over ``reps`` such loops (fewer when one loop would take
    long: about ``budget_ms`` in all, at least 3).

    ``idle_s > 0`` reproduces example 88's whole protocol: before each loop the GPU idles ``idle_s`` seconds and
    takes one warm-up call, as each invocation of the example binary does. This matters: a GPU near its power
    limit clocks down under sustained load, so a short burst after idling runs ~10% faster on an H200 than the
    same kernel timed in a long sustained loop; comparing across protocols would measure the clocks, not the code.

    ``graph=True`` (CUDA only) captures the ``n`` calls once into a CUDA graph and times its replay: the launches
    run back to back as example 88's C++ loop issues them, without the Python call's host time between them (which
    on a slow host is as long as a 0.1 ms kernel, so an eager loop would time the host).
    """
    loop = _event_loop_ms
    if graph and device == "cuda":
        loop = _graph_loop(fn, n)
    if idle_s > 0 and device == "cuda":
        import torch
        xs = []
        for _ in range(max(1, reps)):
            torch.cuda.synchronize()
            time.sleep(idle_s)
            fn()
            xs.append(loop(fn, n))
        return _from_samples(xs, f"{'graph' if graph else 'burst'}{n}-after-{idle_s:g}s-idle")
    if est_ms:
        reps = max(3, min(reps, int(budget_ms / max(n * est_ms, 1e-3))))
    if device != "cuda":
        xs = []
        fn()
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            xs.append((time.perf_counter() - t0) * 1e3 / n)
        return _from_samples(xs, f"loop{n}-perf_counter")
    import torch
    fn()
    torch.cuda.synchronize()
    xs = [loop(fn, n) for _ in range(reps)]
    return _from_samples(xs, f"{'graph' if graph else 'loop'}{n}-cuda-events")


def capture(fn: Callable[[], Any], n: int = 1, warmup: int = 1):
    """A CUDA graph of ``n`` back-to-back calls of ``fn``, after ``warmup`` calls on a side stream (as capture
    requires): its replay is the calls' device work without their host path."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return g


def _graph_loop(fn: Callable[[], Any], n: int) -> Callable[[Callable[[], Any], int], float]:
    """A CUDA graph of ``n`` calls of ``fn`` and the timer of one replay, per call."""
    import torch
    g = capture(fn, n, warmup=3)
    g.replay()
    torch.cuda.synchronize()

    def replay_ms(_fn: Callable[[], Any], calls: int) -> float:
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / calls

    return replay_ms


def _event_loop_ms(fn: Callable[[], Any], n: int) -> float:
    """Per-call ms of ``n`` back-to-back calls between two CUDA events on the current stream."""
    import torch
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


def sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def peak_memory(fn: Callable[[], Any], device: str) -> tuple[int | None, int | None, Any]:
    """(peak bytes allocated during one call, peak minus what was allocated before, fn's result)."""
    if device != "cuda":
        return None, None, fn()
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak, peak - base, out


def poison_allocator(nbytes: int, device: str) -> None:
    """Fill a freshly freed block of ``nbytes`` with 0xFF (NaN in fp16/bf16/fp32) so an output allocated next of
    that size starts as NaN: a kernel that skips writing part of its output is caught by the NaN check."""
    if device != "cuda" or nbytes <= 0:
        return
    import torch
    t = torch.empty(nbytes, dtype=torch.uint8, device=device)
    t.fill_(0xFF)
    del t


def free_memory(device: str) -> None:
    import gc
    gc.collect()
    if device == "cuda":
        import torch
        torch.cuda.empty_cache()
