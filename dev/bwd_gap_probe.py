"""Where does the backward call's time go beyond its kernels? ``python dev/bwd_gap_probe.py``

The top-k fp16 backward's do_bench median (L2 flushed before each call) has been ~110 us above the sum of its three
kernels' profiler times (warm, back to back). This prints, for one call (2x16x8192x128, 25 % top-k):
  * do_bench median (flush before each call) and its CUDA-graph replay;
  * the back-to-back per-call time (no flush, host runs ahead);
  * per-kernel profiler times, back to back and with the flush in between;
  * each kernel's share when the flush precedes it.
If back-to-back equals the kernel sum but do_bench does not, the gap is the flush (cold or dirty L2), not idle time.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import blackwell_sparsek as bsk  # noqa: E402
from blackwell_sparsek.bench.backward import BwdCall  # noqa: E402
from blackwell_sparsek.bench.timing import bench, kernel_us, loop_bench  # noqa: E402


def main() -> None:
    print("GPU:", torch.cuda.get_device_name())
    lay = bsk.BlockSparseLayout.random_topk(seq_q=8192, k=16, seed=0, num_heads=16)
    call = BwdCall(lay, 2, 16, 8192, 128, torch.float16)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

    def flushed():
        flush.zero_()
        call()

    g = call.graph()
    for rnd in range(2):
        t_bench = bench(call).median_ms
        t_graph = bench(g.replay).median_ms
        t_loop = loop_bench(call, n=20, reps=15).median_ms
        t_gloop = loop_bench(g.replay, n=20, reps=15).median_ms
        print(f"round {rnd}: do_bench {t_bench * 1e3:.0f} us | graph do_bench {t_graph * 1e3:.0f} | "
              f"back-to-back {t_loop * 1e3:.0f} | graph back-to-back {t_gloop * 1e3:.0f} | "
              f"eff {call.flops / t_bench / 1e9:.0f} TFLOPS")
    for name, fn in (("back to back", call), ("flush + call", flushed)):
        rows = kernel_us(fn, 20)
        tot = sum(us for k, _, us in rows if "zero" not in k.lower() and "fill" not in k.lower())
        print(f"== kernels, {name}: sum without the flush {tot:.0f} us")
        for k, n, us in rows[:6]:
            print(f"  {us:8.1f} us  x{n:.0f}  {k[:90]}")


if __name__ == "__main__":
    main()
