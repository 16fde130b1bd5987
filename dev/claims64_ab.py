"""D=64 ping-pong on a GPU: the static round-robin against tile claims (AttentionConfig.claims) over
bench.schedules' mask families at 2K (batch 16), 8K and 32K (batch 2) tokens, fp16, 16 heads. Both kernels in one
process (their names differ), three interleaved do_bench rounds, medians, effective TFLOPS over listed blocks; the
two outputs must be bitwise equal (claims change which CTA runs a tile, not its arithmetic). What set
ops.dispatch.CLAIM_CV_D64 (bench/results/h200/claims64.txt).

    python dev/claims64_ab.py
"""
import dataclasses, statistics, sys
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.bench.schedules import masks
from blackwell_sparsek.bench.timing import bench
from blackwell_sparsek.ops import default_config
print("GPU:", torch.cuda.get_device_name())
rows = []
for s, b in ((2048, 16), (8192, 2), (32768, 2)):
    for name, lay in masks(s, 16).items():
        if name == "bigbird" or (name == "causal" and s > 2048):
            continue
        base = default_config(64, torch.float16, lay, schedule=bsk.Schedule.PINGPONG)
        static = dataclasses.replace(base, claims=False).validate()
        claims = dataclasses.replace(base, claims=True).validate()
        lay = lay.to("cuda")
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v = (torch.randn(b, 16, s, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        o1 = bsk.sparse_attention(q, k, v, lay, config=static)
        o2 = bsk.sparse_attention(q, k, v, lay, config=claims)
        same = torch.equal(o1, o2)
        flops = 4.0 * 64 * 128 * 128 * lay.nnz * (16 // lay.num_heads) * b
        t = {"static": [], "claims": []}
        for r in range(3):
            for key, cfg in (("static", static), ("claims", claims)):
                ms = bench(lambda: bsk.sparse_attention(q, k, v, lay, config=cfg), warmup_ms=200, rep_ms=150).median_ms
                t[key].append(flops / (ms * 1e-3) / 1e12)
        st, cl = statistics.median(t["static"]), statistics.median(t["claims"])
        default = default_config(64, torch.float16, lay).claims_tiles
        cv = lay.row_stats()[1]
        rows.append((name, b, s, round(cv, 3), st, cl, default, same))
        print(f"{name:18s} b={b:2d} s={s:6d} cv={cv:.3f} static {st:6.1f} claims {cl:6.1f} "
              f"claims/static {cl / st:.3f} default={'claims' if default else 'static'} equal={same}", flush=True)
print("| mask | B | S | cv | static | claims | claims / static | default |")
print("|---|---|---|---|---|---|---|---|")
for n, b, s, cv, st, cl, d, same in rows:
    print(f"| {n} | {b} | {s} | {cv} | {st:.0f} | {cl:.0f} | {cl / st:.3f} | {'claims' if d else 'static'} |")
