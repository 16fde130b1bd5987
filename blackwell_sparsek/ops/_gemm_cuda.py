"""The BSR GEMM kernels as plain functions on CUDA tensors (the API layer, ops/gemm.py, validates and calls them).

    dsd(values, layout, b, out, *, transpose=False, alpha=1.0, beta=0.0, bias=None) -> None
        out = alpha * op(A) · b + beta * out + bias, A = (layout, values [nnz, bm, bk]); op(A) = A or Aᵀ.
    sdd(a, b, layout, out_values, *, alpha=1.0) -> None
        out_values[p] = alpha * (a · b) on listed block p of the layout over (M, N).
    problems(**facts) -> list[str]   what the kernels cannot serve, as sentences ([] = servable)

Conventions: every tensor contiguous row-major on one CUDA device; values and dense inputs fp16 or bf16 (the
same); ``out`` fp16, bf16 (the input dtype) or fp32; ``bias`` ``[N]`` in any float dtype (converted to fp32,
which the kernel reads). ``beta == 0`` never reads ``out`` (it may hold NaN). Block rows with no blocks give
``beta * out + bias``. TMA alignment: N (and for SDD also K) must be a multiple of 8; M, and K of DSD/DSD_T, may be
anything (partial edge blocks are zero-filled on load, never written past the edge). SDD writes whole blocks: the
part of an edge block past M or N is written with 0.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from ..families.bsr_gemm import ALIGN_ELEMS, BLOCKS, BsrGemmConfig, Epilogue, Op, OutDType, max_stages, launch_args
from ..jit.spec import DType
from ..layout.matrix import dsd_operands

_IN = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
_OUT = {torch.float16: OutDType.FP16, torch.bfloat16: OutDType.BF16, torch.float32: OutDType.FP32}
INT_MAX = 2**31 - 1


def problems(*, op: str = "dsd", dtype=None, out_dtype=None, block_m: int = 128, block_n: int = 128,
             m: int = 1, n: int = 8, k: int = 8, nnz: int = 0, num_heads: int = 1, has_rule: bool = False,
             capability: tuple[int, int] | None = None) -> list[str]:
    """What the kernels cannot serve. ``op``: 'dsd', 'dsd_t' or 'sdd'; m, n, k: the problem's M, N, K (A is M x K
    for dsd/dsd_t, the output M x N for sdd); ``capability``: the device's (major, minor) when known."""
    p: list[str] = []
    if op not in ("dsd", "dsd_t", "sdd"):
        p.append(f"op {op!r} is not one of 'dsd', 'dsd_t', 'sdd'")
    if dtype is not None and dtype not in _IN:
        p.append(f"inputs are {dtype}; the kernels take torch.float16 or torch.bfloat16")
    if out_dtype is not None and out_dtype not in _OUT:
        p.append(f"out is {out_dtype}; the kernels write torch.float16, torch.bfloat16 or torch.float32")
    if out_dtype is not None and dtype in _IN and out_dtype != torch.float32 and out_dtype != dtype:
        p.append(f"out is {out_dtype} but the inputs are {dtype}: use the inputs' dtype or torch.float32")
    for name, v in (("block_m", block_m), ("block_n", block_n)):
        if v not in BLOCKS:
            p.append(f"{name} {v} is not supported; use a layout with blocks of {BLOCKS[0]} or {BLOCKS[1]}")
    if num_heads != 1:
        p.append(f"the layout has {num_heads} heads; a GEMM layout has one (num_heads == 1)")
    if has_rule:
        p.append("the layout has an element rule (window/causal); a GEMM layout lists whole blocks only")
    if n % ALIGN_ELEMS:
        p.append(f"N = {n} is not a multiple of {ALIGN_ELEMS}: TMA needs 16-byte rows of b and out; pad N")
    if op == "sdd" and k % ALIGN_ELEMS:
        p.append(f"K = {k} is not a multiple of {ALIGN_ELEMS}: TMA needs 16-byte rows of a; pad K")
    big = max(m + 256, n + 256, k + 256, nnz * max(block_m, block_n))
    if big > INT_MAX:
        p.append("a size (M, N, K or nnz * block) reaches 2^31: the kernels address tiles in int32; split the call")
    if capability is not None and tuple(capability) != (9, 0):
        p.append(f"the device is sm_{capability[0]}{capability[1]}; the kernels run on sm_90 (H100/H200)")
    return p


# Ops whose CTA-pair kernels (cluster 2: the A tile multicast across the pair) measured faster than the single-CTA
# ones in the same run (dev/gemm_kernel_bench.py --schedules; bench/results/*/gemm_sdd_pair.txt): SDD on the
# H100 (+5 % with the TMA epilogue; on the H200 within 1 % of single CTAs). SDD tiles of two blocks beat both
# (+10 % on the H200, bench/results/h200/gemm_sdd_pair.txt) and take their place where their pairs fill the GPU.
PAIR_FASTER: frozenset[Op] = frozenset({Op.SDD})
# Ops whose TMA-store epilogue measured faster than the direct one in the same run: SDD on both GPUs (its output
# is whole blocks). DSD: 3-4 % slower (likely because the copy engine that drains the stores also loads the
# next tiles).
TMA_EPI_FASTER: frozenset[Op] = frozenset({Op.SDD})


@lru_cache(maxsize=256)
def config_for(op: Op, dtype: torch.dtype, out_dtype: torch.dtype, block_m: int, block_n: int, n: int,
               n_items: int, sm_count: int) -> BsrGemmConfig:
    """The kernel for a call: the widest N tile (256) unless that leaves SMs idle (SDD: tiles of two blocks of a
    row where the pairs fill the GPU), the deepest ring that fits, and CTA pairs where they measured faster
    (``PAIR_FASTER``) and the work fills the pairs, the TMA-store epilogue where it measured faster
    (``TMA_EPI_FASTER``)."""
    dt, ot = _IN[dtype], _OUT[out_dtype]
    if op is Op.SDD:
        # two blocks of a row per tile (one A tile, WGMMAs twice as wide) wherever their pairs fill the GPU
        pair_tile = n_items >= 2 * sm_count
        tile_n = 2 * block_n if pair_tile else block_n
        cluster = 2 if op in PAIR_FASTER and not pair_tile and n_items >= sm_count else 1
    else:
        tile_n = 256
        while tile_n > 64 and n_items * -(-n // tile_n) < sm_count:
            tile_n //= 2
        # a pair runs two adjacent N tiles: only where every row has an even number of them and pairs fill the GPU
        n_tiles = -(-n // tile_n)
        cluster = 2 if op in PAIR_FASTER and n_tiles % 2 == 0 and n_items * n_tiles >= sm_count else 1
    epi = Epilogue.TMA if op in TMA_EPI_FASTER else Epilogue.DIRECT
    stages = max_stages(op, dt, block_m, block_n, tile_n, epilogue=epi, out_dtype=ot)
    return BsrGemmConfig(op=op, dtype=dt, out_dtype=ot, block_m=block_m, block_n=block_n, tile_n=tile_n,
                         stages=stages, cluster=cluster, epilogue=epi).validate()


def _sm_count(device: torch.device) -> int:
    from .dispatch import sm_count
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


# Loaded kernels by config. kernels.build() recomputes its process key (the config's JSON and the BSK_* environment,
# ~80 us) on every call, as much as a whole small GEMM; this memo is dropped whenever kernels.clear_loaded() runs.
_KERNELS: dict[BsrGemmConfig, object] = {}


def _launch(cfg: BsrGemmConfig, device: torch.device, **fields) -> None:
    from ..jit import kernels
    kernel = _KERNELS.get(cfg) if kernels._loaded else None
    if kernel is None:
        if not kernels._loaded:
            _KERNELS.clear()
        kernel = _KERNELS[cfg] = kernels.build(cfg)
    # launch_args gives every field as a plain int/float (pointers as addresses): the struct takes them directly
    kernel.launch_on(kernel.Args(**fields), device.index if device.index is not None else torch.cuda.current_device())


def dsd(values: torch.Tensor, layout, b: torch.Tensor, out: torch.Tensor, *, transpose: bool = False,
        alpha: float = 1.0, beta: float = 0.0, bias: torch.Tensor | None = None, config: BsrGemmConfig | None = None,
        strip: int = 0) -> None:
    """out = alpha * op(A)·b + beta * out + bias, op(A) = A (transpose=False; b [K, N], out [M, N]) or Aᵀ
    (b [M, N], out [K, N]); A [M, K] = (layout, values). ``config`` overrides the kernel choice and ``strip`` the
    N tiles per strip of the work order (0: the launcher's choice); both for tuning."""
    bm, bk = layout.block_m, layout.block_n
    assert values.is_contiguous() and b.is_contiguous() and out.is_contiguous()
    assert layout.num_heads == 1 and values.shape[1:] == (bm, bk)
    n = b.shape[1]
    dev = values.device
    sms = _sm_count(dev)
    sched, blk_b, blk_a, m, k = dsd_operands(layout, transpose)
    op = Op.DSD_T if transpose else Op.DSD
    assert b.shape[0] == k and out.shape == (m, n)
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    cfg = config or config_for(op, values.dtype, out.dtype, bm, bk, n, sched.shape[0], sms)
    _launch(cfg, dev, **launch_args(a=values, b=b, out=out, bias=bias, sched=sched, blk_b=blk_b, blk_a=blk_a,
                                    m=m, n=n, k=k, nnz=layout.nnz, alpha=alpha, beta=beta, sm_count=sms,
                                    strip=strip))


def sdd(a: torch.Tensor, b: torch.Tensor, layout, out_values: torch.Tensor, *, alpha: float = 1.0,
        config: BsrGemmConfig | None = None) -> None:
    """out_values[p] = alpha * (a·b) restricted to listed block p of ``layout`` (over (M, N), blocks bm x bn)."""
    from ..layout.matrix import sdd_schedule
    assert a.is_contiguous() and b.is_contiguous() and out_values.is_contiguous() and layout.num_heads == 1
    m, k = a.shape
    n = b.shape[1]
    assert layout.seq_q == m and layout.seq_k == n and b.shape[0] == k
    if layout.nnz == 0:
        return
    dev = a.device
    sms = _sm_count(dev)
    cfg = config or config_for(Op.SDD, a.dtype, out_values.dtype, layout.block_m, layout.block_n, n,
                               layout.nnz, sms)
    sched = sdd_schedule(layout, sms, pairs=cfg.cluster > 1 or cfg.sdd_pair_tile)
    _launch(cfg, dev, **launch_args(a=a, b=b, out=out_values, bias=None, sched=sched, blk_b=None, blk_a=None,
                                    m=m, n=n, k=k, nnz=layout.nnz, alpha=alpha, beta=0.0, sm_count=sms))
