"""Dev: host time per sparse_attention call and where it goes. A one-tile problem, so the GPU waits for the host:
wall time per call over many calls = the host path. Also the bare custom op, the bare launch, and a cProfile."""
import cProfile, math, pstats, time
import torch
import blackwell_sparsek as bsk
import blackwell_sparsek.ops as ops

L = bsk.BlockSparseLayout
q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
lay = L.dense(128).to("cuda")
cfg = ops.default_config(64, torch.float16, lay)
op_args = (q, k, v, lay.col_idx, lay.block_kind, lay.row_schedule(), ops._meta(lay), 1 / math.sqrt(64),
           cfg.to_json())


def per_call_us(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


print(f"{torch.cuda.get_device_name()}: host us per call (one-tile problem)")
print(f"  sparse_attention          {per_call_us(lambda: bsk.sparse_attention(q, k, v, lay)):7.1f}")
print(f"  torch.ops attn_fwd        {per_call_us(lambda: torch.ops.blackwell_sparsek.attn_fwd(*op_args)):7.1f}")
print(f"  ops._attn_fwd_impl        {per_call_us(lambda: ops._attn_fwd_impl(*op_args)):7.1f}")
kernel = ops._kernel_for(cfg.to_json())
got = []
real = kernel.launch
kernel.launch = lambda *a: got.append(a)
ops._attn_fwd_impl(*op_args)
kernel.launch = real
print(f"  kernel.launch alone       {per_call_us(lambda: kernel.launch(*got[0])):7.1f}")
print(f"  torch.empty_like x2       {per_call_us(lambda: (torch.empty_like(q), torch.empty_like(q))):7.1f}")
pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    bsk.sparse_attention(q, k, v, lay)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
