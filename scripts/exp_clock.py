"""Dev: does the timing protocol (short burst after idle vs sustained) explain ours-vs-ex88? Same run, both."""
import os, time
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.bench import ex88
from blackwell_sparsek.bench.timing import loop_bench
from blackwell_sparsek.config import Schedule
from blackwell_sparsek.ops import default_config
B, H, S, D = 2, 16, 8192, 128
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
lay = bsk.BlockSparseLayout.dense(S).to("cuda")
flops = 4 * B * H * D * S * S

for rep in range(2):
    for n in (20, 500):
        for sched in (Schedule.COOPERATIVE, Schedule.PINGPONG):
            cfg = default_config(D, torch.float16, lay, schedule=sched)
            fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa
            ms = loop_bench(fn, n=n, reps=1, idle_s=1.0).median_ms
            print(f"ours {sched.value:12s} n={n:4d}: {flops/ms/1e9:6.1f} TFLOPS", flush=True)
        time.sleep(1.0)
        for r in ex88.run(os.environ["BSK_EX88_BIN"], b=B, h=H, q=S, d=D, iterations=n)["records"]:
            print(f"ex88 {r['kernel']:30s} n={n:4d}: {r['tflops']:6.1f} TFLOPS", flush=True)
