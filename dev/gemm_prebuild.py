"""Build every BSR GEMM kernel the GPU tests (tests/test_bsr_gemm_kernels_gpu.py) and dev/gemm_kernel_bench.py
use (the choices ops/_gemm_cuda.config_for makes for their shapes on a 132-SM H100), plus the named ones, into
BSK_CACHE_DIR:  python dev/gemm_prebuild.py [-j N] [--list]"""
import sys

import torch

from blackwell_sparsek import cli
from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig, Epilogue, Op, OutDType, max_stages
from blackwell_sparsek.jit.spec import DType
from blackwell_sparsek.jit.spec import load_named_configs
from blackwell_sparsek.ops._gemm_cuda import config_for

SM = 132
f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32
cfgs = [c for c in load_named_configs().values() if c.family == "bsr_gemm"]
cdiv = lambda a, b: -(-a // b)  # noqa: E731
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
for m, n, k, bm, bn in ((1000, 1000, 264, 128, 128), (515, 136, 640, 64, 64), (384, 200, 520, 64, 128),
                        (700, 72, 248, 128, 64)):  # test_sdd
    for dt, ot in ((f16, f16), (b16, b16), (f16, f32)):
        cfgs.append(config_for(Op.SDD, dt, ot, bm, bn, n, 1, SM))
for dt in (f16, b16):  # the bench
    for op, n in ((Op.DSD, 8192), (Op.DSD_T, 8192), (Op.DSD, 1024), (Op.SDD, 8192)):
        cfgs.append(config_for(op, dt, dt, 128, 128, n, 64, SM))
for tn, st in ((128, 7), (256, 3), (256, 4), (128, 5)):  # bench --variants
    cfgs.append(BsrGemmConfig(op="dsd", tile_n=tn, stages=st))
# schedule variants: CTA clusters (A multicast) and the TMA-store epilogue (tests/test_bsr_gemm_kernels_gpu.py
# _variant, dev/gemm_kernel_bench.py --schedules)
_SD = {f16: DType.FP16, b16: DType.BF16}
_SO = {f16: OutDType.FP16, b16: OutDType.BF16, f32: OutDType.FP32}


def variant(op, cl, epi, dt=f16, ot=f16, bm=128, bn=128, tn=None):
    tn = bn if op == "sdd" else (tn or 256)
    st = max_stages(Op(op), _SD[dt], bm, bn, tn, epilogue=Epilogue(epi), out_dtype=_SO[ot])
    return BsrGemmConfig(op=op, dtype=_SD[dt], out_dtype=_SO[ot], block_m=bm, block_n=bn, tile_n=tn, stages=st,
                         cluster=cl, epilogue=epi)


for cl, epi in ((2, "direct"), (1, "tma"), (2, "tma"), (4, "direct")):
    for op in ("dsd", "dsd_t"):
        cfgs += [variant(op, cl, epi), variant(op, cl, epi, ot=f32)]
    cfgs.append(variant("dsd", cl, epi, b16, b16, 64, 64, 64))
    if cl <= 2:
        cfgs += [variant("sdd", cl, epi), variant("sdd", cl, epi, bm=64, bn=64)]
for op in ("dsd", "dsd_t"):  # the bench's quads with the TMA epilogue
    cfgs.append(variant(op, 4, "tma"))
names = list(dict.fromkeys(c.to_json() for c in cfgs))
if "--list" in sys.argv:
    for n in names:
        print(BsrGemmConfig.from_json(n).kernel_name)
    sys.exit(0)
sys.exit(cli.main(["build", *names, *sys.argv[1:]]))
