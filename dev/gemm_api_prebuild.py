"""Build the BSR GEMM kernels that tests/test_gemm_gpu.py (fp16 subset, see GPU_K below) and
``bench gemm --preset headline`` pick on a 132-SM H100 (ops/_gemm_cuda.config_for), into BSK_CACHE_DIR:
    python dev/gemm_api_prebuild.py [-j N] [--list] [--all-dtypes]"""
import sys

import torch

from blackwell_sparsek import cli
from blackwell_sparsek.families.bsr_gemm import Op
from blackwell_sparsek.ops._gemm_cuda import config_for

SM = 132
GPU_K = "not bfloat16"  # pytest -k of the subset these kernels serve (fp16)
f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32
DTYPES = (f16, b16) if "--all-dtypes" in sys.argv else (f16,)
cdiv = lambda a, b: -(-a // b)  # noqa: E731
cfgs = []


def dsd(dt, ot, m, k, n, b, transpose=False):
    """A = [m, k] with b x b blocks; op(A)·B with N = n."""
    op = Op.DSD_T if transpose else Op.DSD
    cfgs.append(config_for(op, dt, ot, b, b, n, cdiv(k if transpose else m, b), SM))


def sdd(dt, ot, b):
    cfgs.append(config_for(Op.SDD, dt, ot, b, b, b, 1, SM))


def matmul_fwd_bwd(dt, ot, m, k, n, b, transpose=False):
    dsd(dt, ot, m, k, n, b, transpose)
    sdd(dt, dt, b)                                   # dA
    dsd(dt, dt, m, k, n, b, not transpose)           # dB


def sampled_fwd_bwd(dt, ot, m, k, n, b):
    sdd(dt, ot, b)
    dsd(dt, dt, m, n, k, b)                          # da = S·bᵀ (S [m, n])
    dsd(dt, dt, m, n, k, b, True)                    # db = (Sᵀ·a)ᵀ


for dt in DTYPES:
    for m, k, n, b in ((1024, 1024, 1024, 128), (1000, 512, 264, 128), (777, 384, 136, 64), (1024, 768, 512, 64),
                       (8, 128, 8, 64), (4096, 2048, 1024, 128)):
        for ot in (dt, f32):
            dsd(dt, ot, m, k, n, b)
            sampled_fwd_bwd(dt, ot, m, k, max(n, b), b)
        dsd(dt, dt, m, k, n, b, True)
    for m, k, n, b in ((1024, 512, 256, 128), (777, 384, 136, 64)):      # backward tests
        for t in (False, True):
            matmul_fwd_bwd(dt, f32, m, k, n, b, t)
    for m, k, n, b in ((1024, 512, 1024, 128), (777, 136, 392, 64)):
        sampled_fwd_bwd(dt, dt, m, k, n, b)
for dt, ot in ((f16, f16), (b16, b16), (f16, f32)):                     # alpha_beta_bias
    if dt in DTYPES:
        dsd(dt, ot, 1000, 512, 256, 128)
dsd(f16, f16, 512, 256, 128, 64)                                         # empty layout, torch bsr
matmul_fwd_bwd(f16, f16, 512, 256, 128, 64)                              # opcheck
matmul_fwd_bwd(f16, f32, 512, 256, 128, 64, True)
dsd(f16, f32, 512, 256, 128, 64)
sampled_fwd_bwd(f16, f16, 512, 64, 256, 64)
matmul_fwd_bwd(f16, f16, 1024, 512, 256, 128)                            # compile: linear layer + sampled
sampled_fwd_bwd(f16, f16, 1024, 256, 512, 128)
dsd(f16, f16, 256, 256, 64, 64)                                          # refusals (the valid ones run)
dsd(f16, f16, 512, 256, 128, 128)                                        # raw op
for m, k, n in ((8192, 8192, 8192), (8192, 8192, 1024)):                 # bench gemm --preset headline
    dsd(f16, f16, m, k, n, 128)
    sdd(f16, f16, 128)
for o, i, t in ((8192, 8192, 8192),):                                    # linear layer fwd + bwd
    matmul_fwd_bwd(f16, f16, o, i, t, 128)
names = list(dict.fromkeys(c.to_json() for c in cfgs))
if "--list" in sys.argv:
    for n in names:
        print(torch.__version__ and __import__("blackwell_sparsek").families.bsr_gemm.BsrGemmConfig.from_json(n)
              .kernel_name)
    print(len(names), "kernels", file=sys.stderr)
    sys.exit(0)
sys.exit(cli.main(["build", *names, *[a for a in sys.argv[1:] if a != "--all-dtypes"]]))
