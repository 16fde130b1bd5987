"""Dev: does a case's sustained TFLOPS depend on how hot the card already is? Times one case (ours, default
config, and compiled FlexAttention on the same block mask) with the bench's own timer, alternating, then heats the
GPU with back-to-back dense D128 calls for BSK_HEAT_S seconds, then times the pair again. nvidia-smi samples
temperature, power and SM clock during every measurement.   python scripts/exp_thermal.py [case] [rounds]
"""
import os, statistics as st, sys, time
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek.bench.peers import compiled_flex
from blackwell_sparsek.bench.timing import bench
from _cases import effective_flops, inputs, smi_samples, spec_config

name = sys.argv[1] if len(sys.argv) > 1 else "topk25-d128"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
heat_s = float(os.environ.get("BSK_HEAT_S", "45"))
print(torch.cuda.get_device_name(), flush=True)

B, H, S, D, lay, q, k, v = inputs(name)
cfg = spec_config(name, D, lay)
flops = effective_flops(B, H, D, lay)
bm = lay.to_flex_block_mask()
flex = compiled_flex()
peers = {"ours": lambda: bsk.sparse_attention(q, k, v, lay, config=cfg),
         "flex": lambda: flex(q, k, v, block_mask=bm)}
for fn in peers.values():
    fn()
torch.cuda.synchronize()


def sampled(fn):
    with smi_samples(["temperature.gpu", "power.draw", "clocks.sm"]) as rows:
        t = bench(fn)
    rows = rows[len(rows) // 2:] or rows  # the timed part (the second half: after the warm-up)
    return t.median_ms, *(st.median(r[i] for r in rows) for i in range(3))


def measure(phase):
    for r in range(rounds):
        for peer, fn in peers.items():
            ms, temp, watts, mhz = sampled(fn)
            print(f"{phase:6s} round {r}  {peer:5s} {flops / ms / 1e9:6.1f} TFLOPS  {temp:3.0f} C  {watts:4.0f} W  "
                  f"{mhz:5.0f} MHz", flush=True)


t0 = time.time()
measure("first")
_, _, _, _, dl, dq, dk, dv = inputs("dense-d128")
dcfg = spec_config("dense-d128", 128, dl)
end = time.time() + heat_s
while time.time() < end:
    for _ in range(50):
        bsk.sparse_attention(dq, dk, dv, dl, config=dcfg)
    torch.cuda.synchronize()
del dq, dk, dv
measure("hot")
print(f"({time.time() - t0:.0f} s)")
