"""Dev: power draw, SM clock and TFLOPS while one case runs back to back for a few seconds (nvidia-smi sampled
every 50 ms), for whatever BSK_NVCC_FLAGS selects.   python scripts/exp_power.py topk25-d64 dense-d64[:cooperative]
"""
import os, statistics as st, sys, time
import torch
import blackwell_sparsek as bsk
from _cases import effective_flops, inputs, smi_samples, spec_config
tag = os.environ.get("BSK_AB_TAG") or os.environ.get("BSK_NVCC_FLAGS", "") or "default"
for spec in sys.argv[1:]:
    B, H, S, D, lay, q, k, v = inputs(spec.partition(":")[0])
    cfg = spec_config(spec, D, lay)
    flops = effective_flops(B, H, D, lay)
    fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    with smi_samples(["power.draw", "clocks.sm"]) as rows:
        t0 = time.time()
        while time.time() - t0 < 3.0:
            ev[0].record()
            for _ in range(100):
                fn()
            ev[1].record()
            ev[1].synchronize()
    last_ms = ev[0].elapsed_time(ev[1]) / 100
    w = [r[0] for r in rows[len(rows) // 3:]]  # the last two thirds (settled)
    mhz = [r[1] for r in rows[len(rows) // 3:]]
    print(f"power {tag:14s} {spec:16s} {flops / last_ms / 1e9:6.1f} TFLOPS (last 100 calls)  power {st.median(w):5.0f} W  "
          f"SM clock {st.median(mhz):5.0f} MHz  ({len(w)} samples)", flush=True)
