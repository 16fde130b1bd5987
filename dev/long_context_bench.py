"""Time per listed block of a causal 2K sliding window at long context (issue 24, item 27).

    python dev/long_context_bench.py [--cases 256K:8,1M:16,1M:32] [--window 2048] [--head-dim 128]

For each (sequence length, heads) case: bf16 q, k, v of shape (1, H, S, D), BlockSparseLayout.sliding_window(S,
window) (causal), the kernel sparse_attention picks, run back to back (median per call after a warm-up under the same load; see
sustained_ms). Prints the time, the listed blocks (layout nnz x heads), the time and the SM cycles per listed block
and their ratio to the first case (the target: 1M with 16 and 32 heads within 3 % of 256K with 8), and effective
TFLOPS (4 * D * visible (query, key) pairs).
Needs a GPU with room for four (1, H, S, D) tensors (32 GiB at 1M x 32 heads); a case that does not fit is
reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time

import torch

import blackwell_sparsek as bsk


def _parse_cases(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        seq, heads = item.split(":")
        seq = seq.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(seq[-1], 1)
        out.append((int(seq.rstrip("KM")) * mult, int(heads)))
    return out


def _visible_pairs(seq: int, window: int) -> int:
    """(query, key) pairs of a causal window of `window` keys including the query's own."""
    full = max(0, seq - window + 1) * window
    ramp = min(seq, window - 1)
    return full + ramp * (ramp + 1) // 2


class ClockSampler:
    """The GPU's SM clock (MHz) sampled every 50 ms by `nvidia-smi -lms` while a case is timed: a long case loads
    the GPU without pause and may run at a lower sustained clock than a short one, so the table gives cycles per
    block next to nanoseconds. The child process is always reaped."""

    def __init__(self, index: int):
        self.index, self.samples, self.proc, self.thread = index, [], None, None

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(self.index), "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                 "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.thread.join(timeout=5)

    def mhz(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def sustained_ms(fn, warm_s: float, timed_s: float, index: int) -> tuple[float, float]:
    """Median ms per call of `fn` run back to back (no cache flush between calls, unlike do_bench, whose 256 MB
    memset between calls lets a short case cool down and clock higher than a long one), after `warm_s` seconds of
    the same load; and the median SM clock over the timed window."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        fn()
        torch.cuda.synchronize()
    n_probe = 3
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n_probe + 1)]
    ev[0].record()
    for i in range(n_probe):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    per = ev[0].elapsed_time(ev[-1]) / n_probe
    n = max(10, int(timed_s * 1e3 / max(per, 1e-3)))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    with ClockSampler(index) as clock:
        ev[0].record()
        for i in range(n):
            fn()
            ev[i + 1].record()
        torch.cuda.synchronize()
    times = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
    return statistics.median(times), clock.mhz()


def run_case(seq: int, heads: int, head_dim: int, window: int, warm_s: float, timed_s: float) -> dict | None:
    need = 4 * heads * seq * head_dim * 2 + heads * seq * 4
    free, _ = torch.cuda.mem_get_info()
    if free < need + (1 << 30):
        print(f"S={seq:>8} H={heads:>3}: skipped, needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        return None
    g = torch.Generator(device="cuda").manual_seed(seq + heads)
    q, k, v = (torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    layout = bsk.BlockSparseLayout.sliding_window(seq_q=seq, window=window, device="cuda")
    fn = lambda: bsk.sparse_attention(q, k, v, layout)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    ms, mhz = sustained_ms(fn, warm_s, timed_s, torch.cuda.current_device())
    blocks = layout.nnz * heads  # the layout is shared by the heads (num_heads == 1)
    tflops = 4 * head_dim * _visible_pairs(seq, window) * heads / (ms * 1e-3) / 1e12
    fn = q = k = v = None  # free the case's tensors before the next one allocates
    torch.cuda.empty_cache()
    ns = ms * 1e6 / blocks
    return {"seq": seq, "heads": heads, "ms": ms, "blocks": blocks, "ns_per_block": ns, "mhz": mhz,
            "cycles_per_block": ns * mhz / 1e3, "tflops": tflops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="256K:8,1M:16,1M:32",
                    help="SEQ:HEADS,... (K = 2^10, M = 2^20); the first case is the reference")
    ap.add_argument("--rounds", type=int, default=3, help="repeat the case list, interleaved; print medians")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of back-to-back calls before timing")
    ap.add_argument("--timed", type=float, default=2.0, help="seconds of timed back-to-back calls")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--json", help="write every measurement and the medians here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")

    print(f"{torch.cuda.get_device_name()}, bf16, D={args.head_dim}, causal window {args.window}, median of "
          f"back-to-back calls after {args.warm:g} s warm-up, SM clock sampled while timed")
    print(f"{'S':>8} {'H':>3} {'ms':>9} {'blocks':>10} {'ns/block':>9} {'MHz':>6} {'cyc/block':>9} {'TFLOPS':>7}")
    rows, per_case = [], {}
    for _ in range(args.rounds):
        for seq, heads in _parse_cases(args.cases):
            r = run_case(seq, heads, args.head_dim, args.window, args.warm, args.timed)
            if r is None:
                continue
            rows.append(r)
            per_case.setdefault((seq, heads), []).append(r)
            print(f"{seq:>8} {heads:>3} {r['ms']:>9.3f} {r['blocks']:>10} {r['ns_per_block']:>9.3f} "
                  f"{r['mhz']:>6.0f} {r['cycles_per_block']:>9.1f} {r['tflops']:>7.0f}", flush=True)
    meds = {c: {k: statistics.median(x[k] for x in v) for k in ("ns_per_block", "cycles_per_block", "mhz")}
            for c, v in per_case.items()}
    if meds:
        ref = next(iter(meds.values()))
        print(f"medians over {args.rounds} interleaved rounds, vs the first case:")
        print(f"{'S':>8} {'H':>3} {'ns/block':>9} {'vs':>7} {'cyc/block':>9} {'vs':>7} {'MHz':>6}")
        for (seq, heads), m in meds.items():
            print(f"{seq:>8} {heads:>3} {m['ns_per_block']:>9.3f} "
                  f"{(m['ns_per_block'] / ref['ns_per_block'] - 1) * 100:>+6.1f}% {m['cycles_per_block']:>9.1f} "
                  f"{(m['cycles_per_block'] / ref['cycles_per_block'] - 1) * 100:>+6.1f}% {m['mhz']:>6.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "args": vars(args), "rows": rows,
                       "medians": [{"seq": s, "heads": h, **m} for (s, h), m in meds.items()]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
