"""Dev: does a sustained (do_bench) measurement depend on the burst loop timed just before it? The causal 2K
window at (1, 16, S, 128), our two schedules; each sequence is 'X loop' (example 88's protocol: 3 x [1 s idle, one
call, 20 back-to-back calls]) or 'sleep N', then do_bench of Y.   python scripts/exp_afterburst.py [S] [rounds]
"""
import sys, time
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.bench.peers import our_configs
from blackwell_sparsek.bench.timing import bench, loop_bench
from _cases import effective_flops

S = int(sys.argv[1]) if len(sys.argv) > 1 else 262144
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
print(torch.cuda.get_device_name(), flush=True)
lay = bsk.BlockSparseLayout.sliding_window(S, 2048, causal=True, device="cuda")
q, k, v = (torch.randn(1, 16, S, 128, device="cuda", dtype=torch.float16) for _ in range(3))
flops = effective_flops(1, 16, 128, lay)
cfg = {("coop" if "coop" in n else "pp"): c for n, c in our_configs(128, "fp16")}
fns = {n: (lambda c=c: bsk.sparse_attention(q, k, v, lay, config=c)) for n, c in cfg.items()}
keep = fns["coop"]()  # the headline keeps the first peer's output for its cross-check
for fn in fns.values():
    fn()
torch.cuda.synchronize()
seqs = [("coop loop", "pp"), ("pp loop", "pp"), ("coop loop", "coop"), ("sleep 3", "pp"), ("coop loop+sleep 3", "pp"),
        ("coop bench", "pp")]
for r in range(rounds):
    for before, target in seqs:
        for part in before.split("+"):
            what, how = part.split()
            if what == "sleep":
                time.sleep(float(how))
            elif how == "loop":
                loop_bench(fns[what], n=20, reps=3, idle_s=1.0)
            else:
                bench(fns[what])
        ms = bench(fns[target]).median_ms
        print(f"S={S // 1024}K round {r}: after {before:18s} {target:5s} {flops / ms / 1e9:6.1f} TFLOPS", flush=True)
