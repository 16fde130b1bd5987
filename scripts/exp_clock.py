"""Dev: does the timing protocol (short burst after idle vs sustained) explain ours-vs-ex88? Same run, both."""
import os, re, subprocess, sys, time
import torch
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
L = bsk.BlockSparseLayout
B, H, S, D = 2, 16, 8192, 128
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
lay = L.dense(S).to("cuda")
flops = 4 * B * H * D * S * S


def burst(fn, n):
    time.sleep(1.0)
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record(); b.synchronize()
    return a.elapsed_time(b) / n


def ex88(iters):
    time.sleep(1.0)
    out = subprocess.run([os.environ["BSK_EX88_BIN"], f"--b={B}", f"--h={H}", f"--q={S}", f"--k={S}", f"--d={D}",
                          f"--iterations={iters}"], capture_output=True, text=True).stdout
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"\]\s+(.*?)\s+:\s+([\d.]+) TFLOPS", out)}


for rep in range(2):
    for n in (20, 500):
        for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
            cfg = default_config(D, torch.float16, lay, schedule=sched)
            ms = burst(lambda: bsk.sparse_attention(q, k, v, lay, config=cfg), n)
            print(f"ours {sched.value:12s} n={n:4d}: {flops/ms/1e9:6.1f} TFLOPS", flush=True)
        for name, tf in ex88(n).items():
            print(f"ex88 {name:30s} n={n:4d}: {tf:6.1f} TFLOPS", flush=True)
