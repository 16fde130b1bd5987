"""Is the DSD kernel held back by where its B tiles come from, or by its own loop? The same work (8192 x 8192,
128x128 blocks, 16 listed per block row, N = 8192, fp16) on layouts that differ only in which columns a row
lists: random (the headline), the same 16 columns in every row (B's first 2048 rows: the dense GEMM with
K = 2048, cuBLAS's same-work problem), and a band (row r lists 16 consecutive columns starting at r mod 49).
Peers: torch.mm of the same work, same process. Each layout's result is checked once against cuBLAS in fp32.

    python dev/gemm_locality_probe.py      # on the GPU
    PROBE_DEFAULT_ONLY=1                   # only the launcher's strip (else also PROBE_STRIPS, default "1 4 32")
    PROBE_CONFIG='<BsrGemmConfig JSON>'    # another kernel than the default; a JSON list: several, interleaved

bench/results/h200/gemm_epilogue.txt ran it on measurement builds (BSK_NVCC_FLAGS) of the epilogue.
"""
import torch
from triton.testing import do_bench

import blackwell_sparsek as bsk
from blackwell_sparsek.ops import _gemm_cuda as g

L = bsk.BlockSparseLayout
S, K_PER = 8192, 16


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=100, rep=400, return_mode="median")


def main():
    import os
    strips = [None] + ([] if os.environ.get("PROBE_DEFAULT_ONLY") else
                       [int(x) for x in os.environ.get("PROBE_STRIPS", "1 4 32").split()])
    cfgs = [None]
    if os.environ.get("PROBE_CONFIG"):  # configs (JSON, one or a list) instead of the default
        import json
        from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig
        spec = json.loads(os.environ["PROBE_CONFIG"])
        cfgs = [None if c is None else BsrGemmConfig.from_json(json.dumps(c))
                for c in (spec if isinstance(spec, list) else [spec])]
    print(f"GPU: {torch.cuda.get_device_name()}  BSK_NVCC_FLAGS={os.environ.get('BSK_NVCC_FLAGS', '')!r}")
    dt = torch.float16
    nb = S // 128
    r = torch.arange(nb).view(-1, 1)
    masks = {
        "random": None,
        "same 16 cols": torch.zeros(nb, nb, dtype=torch.bool).index_fill_(1, torch.arange(K_PER), True),
        "band": torch.zeros(nb, nb, dtype=torch.bool).scatter_(1, (r % (nb - K_PER + 1)) + torch.arange(K_PER), True),
    }
    b = torch.randn(S, S, device="cuda", dtype=dt)
    out = torch.empty(S, S, device="cuda", dtype=dt)
    pa = torch.randn(S, K_PER * 128, device="cuda", dtype=dt)
    pb = torch.randn(K_PER * 128, S, device="cuda", dtype=dt)
    flops = 2 * S * S * K_PER * 128
    for rnd in range(2):
        peer = bench(lambda: torch.mm(pa, pb))
        print(f"round {rnd}: cuBLAS same work {flops / peer / 1e9:.1f}")
        for cfg in cfgs:
            tag = "default" if cfg is None else cfg.kernel_name.split("_b128x128_")[-1]
            for name, m in masks.items():
                lay = (L.random_topk(S, K_PER, seed=1, block_m=128, block_n=128, device="cuda") if m is None else
                       L.from_block_mask(m, S, S, block_m=128, block_n=128).to("cuda"))
                vals = torch.randn(lay.nnz, 128, 128, device="cuda", dtype=dt)
                if rnd == 0:  # the result against cuBLAS on the dense equivalent (fp32 accumulate)
                    from blackwell_sparsek.reference import bsr_to_dense
                    out.fill_(float("nan"))
                    g.dsd(vals, lay, b, out, config=cfg)
                    ref = torch.mm(bsr_to_dense(vals, lay, torch.float32), b.float())
                    err = float((out.float() - ref).norm() / ref.norm())
                    print(f"  {tag:14s} {name:14s} rel err vs fp32 cuBLAS {err:.1e}")
                line = []
                for strip in strips:
                    kw = {"config": cfg} if strip is None else {"strip": strip, "config": cfg}
                    ms = bench(lambda: g.dsd(vals, lay, b, out, **kw))
                    line.append(f"{'default' if strip is None else f'strip {strip}'} {flops / ms / 1e9:.1f}")
                print(f"  {tag:14s} {name:14s} " + " | ".join(line), flush=True)

if __name__ == "__main__":
    main()
