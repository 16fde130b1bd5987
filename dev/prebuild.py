"""Build, on a host with nvcc, every kernel a GPU session runs (the GPU tests of every family, bench --headline,
compare-88, the GEMM and split-KV benches) into BSK_CACHE_DIR, in one parallel `build`; or carry that folder to a
GPU machine without network (dev/gpu_session.sh points the cache there).

    BSK_CACHE_DIR=$PWD/.bskcache python dev/prebuild.py [--only attn|gemm] [--ex88] [--list] [-j N]

The configs are the ops' own choices for the GPU tests' shapes (ops.default_config, ops._gemm_cuda.config_for on a
132-SM H100), the schedule variants the tests and benches name, and every named config. The cache key is
content-based (config, source, toolchain, flags), so the same wheel and nvcc on the GPU machine give cache hits.
``--ex88`` also builds CUTLASS example 88's binary into the same cache (compare-88 and the short-rows bench run
it; one translation unit, ~9 min on 2 cores; it needs curand_kernel.h: pip install nvidia-curand). Remaining
arguments go to the package's `build` command.
"""
import sys

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek import cli
from blackwell_sparsek.families.attn_fwd import Schedule
from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig, DType, Epilogue, Op, OutDType, max_stages
from blackwell_sparsek.jit.spec import load_named_configs
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.ops._gemm_cuda import config_for

L = bsk.BlockSparseLayout
SM = 132
f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32
cdiv = lambda a, b: -(-a // b)  # noqa: E731


def attention_configs() -> list:
    """Forward and backward: what sparse_attention picks for the GPU tests' layouts, plus split-KV."""
    cfgs = []
    for d in (64, 128):  # test_other_block_sizes: top-k (balanced rows) and causal, per block shape
        for bm, bn in ((128, 64), (256, 128), (128, 256), (64, 128), (64, 64)):
            topk = L.random_topk(seq_q=777, seq_k=1300, k=3, seed=5, num_heads=2, block_m=bm, block_n=bn)
            causal = L.dense(seq_q=777, seq_k=1300, block_m=bm, block_n=bn).with_causal()
            cfgs += [default_config(d, f16, topk), default_config(d, f16, causal)]
    for dt in (f16, b16):  # test_head_dim_256
        lay = L.dense(seq_q=700, seq_k=900)
        cfgs += [default_config(256, dt, lay), default_config(256, dt, lay.with_causal())]
    lay = L.dense(seq_q=300, seq_k=777)  # test_gqa_bshd_and_causal_rectangular
    cfgs += [default_config(128, b16, lay, schedule=s) for s in Schedule]
    for d in (64, 128):  # bench and compare-88: fp16 at both schedules
        cfgs += [default_config(d, f16, L.dense(8192), schedule=s) for s in (Schedule.PINGPONG, Schedule.COOPERATIVE)]
    from blackwell_sparsek.families.attn_bwd import config_for as bwd_config_for  # test_other_block_shapes
    cfgs += [bwd_config_for(128, "fp16", bm, bn, det) for bm, bn in ((64, 128), (256, 128), (128, 256), (128, 64),
                                                                     (128, 192)) for det in (False, True)]
    cfgs += [default_config(128, f16, lay) for lay in (  # the backward's 128x192 case: its forward
        L.random_topk(seq_q=777, seq_k=1300, k=3, seed=5, num_heads=2, block_m=128, block_n=192),
        L.dense(seq_q=777, seq_k=1300, block_m=128, block_n=192).with_causal())]
    holes = L.from_block_mask(torch.ones(6, 12, 13, dtype=torch.bool), seq_q=763, seq_k=823, block_m=64, block_n=64)
    for d in (64, 128):  # test_64_wide_key_blocks_gqa_bshd_holes: pairs of 64-wide key blocks, both directions
        cfgs += [default_config(d, dt, holes) for dt in (f16, b16)]
        cfgs += [bwd_config_for(d, dt, 64, 64, det) for dt in ("fp16", "bf16") for det in (False, True)]
    for lay in (L.random_topk(seq_q=8192, k=32, seed=0, num_heads=16, block_m=64, block_n=64),
                L.causal(8192, block_m=64, block_n=64)):  # bench-bwd's 64x64 cases (fp16, D=128)
        cfgs += [default_config(128, f16, lay), bwd_config_for(128, "fp16", 64, 64, True)]
    from blackwell_sparsek.bench import blocks64  # the 64-row block bench's dual / single / default kernels
    for _, (_, _, _, d), (bm, bn), _, scheds in blocks64.CASES:
        cfgs += [c for _, c in blocks64._configs(d, bm, bn, scheds)]
    from blackwell_sparsek.bench import short_rows  # every schedule on the short-rows bench's layouts
    cfgs += [c for d in (128, 64) for k in (2, 4, 8) for c in short_rows._configs(d, k)[1].values()]
    cfgs += [default_config(64, dt, L.sliding_window(4096, 1024)) for dt in (f16, b16)]  # D=64 claims: varied rows
    skewed = L.global_local(5120 + 50, n_global=2, window=200)  # split-KV tests and bench
    for d, dt in ((128, b16), (64, f16), (128, f16)):
        cfgs += [default_config(d, dt, skewed, schedule=s) for s in (Schedule.COOPERATIVE, Schedule.PINGPONG)]
    return cfgs


_SD = {f16: DType.FP16, b16: DType.BF16}
_SO = {f16: OutDType.FP16, b16: OutDType.BF16, f32: OutDType.FP32}


def variant(op, cl, epi, dt=f16, ot=f16, bm=128, bn=128, tn=None):
    tn = (tn or bn) if op == "sdd" else (tn or 256)
    st = max_stages(Op(op), _SD[dt], bm, bn, tn, epilogue=Epilogue(epi), out_dtype=_SO[ot])
    return BsrGemmConfig(op=op, dtype=_SD[dt], out_dtype=_SO[ot], block_m=bm, block_n=bn, tile_n=tn, stages=st,
                         cluster=cl, epilogue=epi)


def gemm_kernel_configs() -> list:
    """tests/test_bsr_gemm_kernels_gpu.py and dev/gemm_kernel_bench.py (incl. the schedule variants)."""
    cfgs = []
    # test_dsd_fp16 (both ops), CASES = (m, k, n, bm, bk)
    for m, k, n, bm, bk in ((1000, 1100, 264, 128, 128), (515, 700, 136, 64, 64), (640, 517, 200, 64, 128),
                            (777, 384, 72, 128, 64)):
        cfgs.append(config_for(Op.DSD, f16, f16, bm, bk, n, cdiv(m, bm), SM))
        cfgs.append(config_for(Op.DSD_T, f16, f16, bm, bk, n, cdiv(k, bk), SM))
    cfgs += [BsrGemmConfig(op=op, tile_n=256, stages=4) for op in ("dsd", "dsd_t")]
    for dt, ot in ((b16, b16), (f16, f32), (b16, f32)):  # test_dsd_alpha_beta_bias
        cfgs.append(config_for(Op.DSD, dt, ot, 128, 128, 328, cdiv(900, 128), SM))
        cfgs.append(config_for(Op.DSD_T, dt, ot, 128, 128, 328, cdiv(1000, 128), SM))
    cfgs.append(config_for(Op.DSD, f16, f16, 128, 128, 64, 3, SM))      # test_dsd_empty_layout...
    cfgs.append(config_for(Op.DSD, f16, f16, 128, 128, 512, 8, SM))
    cfgs.append(BsrGemmConfig(tile_n=64, stages=6))
    for op, tn, cl in (("dsd", 128, 1), ("dsd_t", 64, 1), ("dsd", 128, 2), ("dsd", 64, 1)):  # test_dsd_waves
        cfgs.append(BsrGemmConfig(op=op, tile_n=tn, stages=4, cluster=cl))
    for m, n, k, bm, bn in ((1000, 1000, 264, 128, 128), (515, 136, 640, 64, 64), (384, 200, 520, 64, 128),
                            (700, 72, 248, 128, 64)):  # test_sdd
        for dt, ot in ((f16, f16), (b16, b16), (f16, f32)):
            cfgs.append(config_for(Op.SDD, dt, ot, bm, bn, n, 1, SM))
    for dt in (f16, b16):  # the bench
        for op, n in ((Op.DSD, 8192), (Op.DSD_T, 8192), (Op.DSD, 1024), (Op.SDD, 8192)):
            cfgs.append(config_for(op, dt, dt, 128, 128, n, 64, SM))
    for tn, st in ((128, 6), (256, 3), (256, 4), (128, 5)):  # bench --variants
        cfgs.append(BsrGemmConfig(op="dsd", tile_n=tn, stages=st))
    # schedule variants: CTA clusters (A multicast) and the TMA-store epilogue (tests/test_bsr_gemm_kernels_gpu.py
    # _variant, dev/gemm_kernel_bench.py --schedules)
    for cl, epi in ((2, "direct"), (1, "tma"), (2, "tma"), (4, "direct")):
        for op in ("dsd", "dsd_t"):
            cfgs += [variant(op, cl, epi), variant(op, cl, epi, ot=f32)]
        cfgs.append(variant("dsd", cl, epi, b16, b16, 64, 64, 64))
        if cl <= 2:
            cfgs += [variant("sdd", cl, epi), variant("sdd", cl, epi, bm=64, bn=64)]
    for op in ("dsd", "dsd_t"):  # the bench's quads with the TMA epilogue
        cfgs.append(variant(op, 4, "tma"))
    for bm in (128, 64):  # SDD pair tiles
        for ot in (f16, f32):
            cfgs.append(variant("sdd", 1, "tma", f16, ot, bm=bm, bn=bm, tn=2 * bm))
    cfgs += [variant("sdd", 1, "direct"), variant("sdd", 1, "direct", bm=64, bn=64)]  # the bench's single blocks
    return cfgs


def _dsd(cfgs, dt, ot, m, k, n, b, transpose=False):
    """A = [m, k] with b x b blocks; op(A)·B with N = n."""
    op = Op.DSD_T if transpose else Op.DSD
    cfgs.append(config_for(op, dt, ot, b, b, n, cdiv(k if transpose else m, b), SM))


def _sdd(cfgs, dt, ot, b):
    cfgs.append(config_for(Op.SDD, dt, ot, b, b, b, 1, SM))


def _matmul_fwd_bwd(cfgs, dt, ot, m, k, n, b, transpose=False):
    _dsd(cfgs, dt, ot, m, k, n, b, transpose)
    _sdd(cfgs, dt, dt, b)                                   # dA
    _dsd(cfgs, dt, dt, m, k, n, b, not transpose)           # dB


def _sampled_fwd_bwd(cfgs, dt, ot, m, k, n, b):
    _sdd(cfgs, dt, ot, b)
    _dsd(cfgs, dt, dt, m, n, k, b)                          # da = S·bᵀ (S [m, n])
    _dsd(cfgs, dt, dt, m, n, k, b, True)                    # db = (Sᵀ·a)ᵀ


def gemm_api_configs() -> list:
    """tests/test_gemm_gpu.py (fp16 and bf16) and `bench gemm` (every preset)."""
    cfgs = []
    DTYPES = (f16, b16)
    for dt in DTYPES:
        for m, k, n, b in ((1024, 1024, 1024, 128), (1000, 512, 264, 128), (777, 384, 136, 64), (1024, 768, 512, 64),
                           (8, 128, 8, 64), (4096, 2048, 1024, 128)):
            for ot in (dt, f32):
                _dsd(cfgs, dt, ot, m, k, n, b)
                _sampled_fwd_bwd(cfgs, dt, ot, m, k, max(n, b), b)
            _dsd(cfgs, dt, dt, m, k, n, b, True)
        for m, k, n, b in ((1024, 512, 256, 128), (777, 384, 136, 64)):      # backward tests
            for t in (False, True):
                _matmul_fwd_bwd(cfgs, dt, f32, m, k, n, b, t)
        for m, k, n, b in ((1024, 512, 1024, 128), (777, 136, 392, 64)):
            _sampled_fwd_bwd(cfgs, dt, dt, m, k, n, b)
    for dt, ot in ((f16, f16), (b16, b16), (f16, f32)):                     # alpha_beta_bias
        if dt in DTYPES:
            _dsd(cfgs, dt, ot, 1000, 512, 256, 128)
    _dsd(cfgs, f16, f16, 512, 256, 128, 64)                                         # empty layout, torch bsr
    _matmul_fwd_bwd(cfgs, f16, f16, 512, 256, 128, 64)                              # opcheck
    _matmul_fwd_bwd(cfgs, f16, f32, 512, 256, 128, 64, True)
    _dsd(cfgs, f16, f32, 512, 256, 128, 64)
    _sampled_fwd_bwd(cfgs, f16, f16, 512, 64, 256, 64)
    _matmul_fwd_bwd(cfgs, f16, f16, 1024, 512, 256, 128)                            # compile: linear layer + sampled
    _sampled_fwd_bwd(cfgs, f16, f16, 1024, 256, 512, 128)
    _dsd(cfgs, f16, f16, 256, 256, 64, 64)                                          # refusals (the valid ones run)
    _dsd(cfgs, f16, f16, 512, 256, 128, 128)                                        # raw op
    for m, k, n in ((8192, 8192, 8192), (8192, 8192, 1024)):                 # bench gemm --preset headline
        _dsd(cfgs, f16, f16, m, k, n, 128)
        _sdd(cfgs, f16, f16, 128)
    for o, i, t in ((8192, 8192, 8192),):                                    # linear layer fwd + bwd
        _matmul_fwd_bwd(cfgs, f16, f16, o, i, t, 128)
    from blackwell_sparsek.bench.gemm import sweep                           # bench gemm --preset quick / full
    for _, m, k, n, b, _ in sweep("full"):
        _dsd(cfgs, f16, f16, m, k, n, b)
    return cfgs


def main(argv: list[str]) -> int:
    ex88 = "--ex88" in argv
    if ex88:
        argv.remove("--ex88")
    only = None
    if "--only" in argv:
        i = argv.index("--only")
        only = argv[i + 1]
        del argv[i:i + 2]
    named = list(load_named_configs().values())
    groups = {"attn": [c for c in named if c.family != "bsr_gemm"] + attention_configs(),
              "gemm": [c for c in named if c.family == "bsr_gemm"] + gemm_kernel_configs() + gemm_api_configs()}
    cfgs = [c for name, part in groups.items() if only in (None, name) for c in part]
    names = list(dict.fromkeys(c.to_json() for c in cfgs))
    if "--list" in argv:
        for c in dict.fromkeys(c.kernel_name for c in cfgs):
            print(c)
        print(len(names), "kernels", file=sys.stderr)
        return 0
    rc = cli.main(["build", *names, *argv])
    if ex88:
        from blackwell_sparsek.bench import ex88 as ex
        print(f"example 88: {ex.locate(build_if_missing=True)}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
