"""BSR GEMM on Hopper: the config and its rules, the launcher ABI and how it is filled from tensors.

Three products over one BSR operand (the layout's blocks are ``block_m x block_n``):

* ``DSD``   ``C[M, N] = alpha * A·B + beta * C + bias``: A block-sparse over (M, K) with values
  ``[nnz, block_m, block_n]``, B ``[K, N]`` and C dense, row-major.
* ``DSD_T`` ``C[K, N] = alpha * Aᵀ·B + beta * C + bias``, the same A through its column view (no transposed copy
  of the values: the kernel loads each value block M-major and WGMMA reads it so), B ``[M, N]``.
* ``SDD``   ``V[p] = alpha * (A·B)`` on the listed blocks of a layout over (M, N) only, A ``[M, K]``, B ``[K, N]``,
  V ``[nnz, block_m, block_n]``.

One persistent, warp-specialized kernel (templates/include/bsk/sm90/gemm_*.hpp; docs/kernels/sm90_bsr_gemm.md):
an output tile is one block row (``tile_m`` = the block's rows: ``block_m``, or ``block_n`` for DSD_T) by
``tile_n`` columns (SDD: the block's columns, or two listed blocks of the row side by side), reduced in k steps
of 64.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from ..jit.spec import Arch, DType, KernelConfig, register


class Op(enum.Enum):
    DSD = "dsd"      # dense = sparse · dense
    DSD_T = "dsd_t"  # dense = sparseᵀ · dense
    SDD = "sdd"      # sparse (the layout's blocks) = dense · dense


class OutDType(enum.Enum):
    """Output element types: the input's, or fp32."""
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"

    @property
    def cutlass_type(self) -> str:
        return {"FP16": "cutlass::half_t", "BF16": "cutlass::bfloat16_t", "FP32": "float"}[self.name]

    @property
    def torch_name(self) -> str:
        return {"FP16": "float16", "BF16": "bfloat16", "FP32": "float32"}[self.name]


class Epilogue(enum.Enum):
    """How the output tile leaves the MMA warpgroups."""
    DIRECT = "direct"  # pair stores straight from the accumulators
    TMA = "tma"        # per warp through two shared-memory slices and asynchronous TMA stores


BLOCKS = (64, 128)         # layout block sides the kernels are built for
TILE_NS = (64, 128, 256)   # output tile widths (DSD, DSD_T)
CLUSTERS = (1, 2, 4)       # CTAs per cluster (the A tile multicast across them; SDD: 1 or 2)
TILE_K = 64                # k step: one 128-byte swizzle row of 16-bit elements
# Alignment (the TMA rule): every row a descriptor walks must be a multiple of 16 bytes, so N (b's and out's
# rows) and, for SDD, K (a's rows) must be multiples of 8 elements; M, and K of DSD/DSD_T, may be anything.
ALIGN_ELEMS = 8
_SMEM_RESERVE = 1024       # barriers and alignment


@register
@dataclass(frozen=True)
class BsrGemmConfig(KernelConfig):
    """Block-sparse GEMM on Hopper (TMA + warp-specialized WGMMA over a BSR operand)."""

    op: Op = Op.DSD
    dtype: DType = DType.FP16
    out_dtype: OutDType = OutDType.FP16
    block_m: int = 128
    block_n: int = 128
    tile_n: int = 256
    stages: int = 4
    # SDD: tile_n = block_n (a tile is one listed block) or 2 * block_n (two listed blocks of one block row, from
    # matrix.sdd_schedule(pairs=True): one A tile, WGMMAs twice as wide; single CTAs, TMA-store epilogue).
    # CTAs per cluster: 2 or 4 CTAs share their A tile by TMA multicast (DSD/DSD_T: adjacent N tiles of one output
    # block row; SDD, pairs only: two listed blocks of one block row, from matrix.sdd_schedule(pairs=True)).
    cluster: int = 1
    epilogue: Epilogue = Epilogue.DIRECT
    arch: Arch = Arch.SM90A

    family: ClassVar[str] = "bsr_gemm"
    template: ClassVar[str] = "bsr_gemm.cu.j2"
    includes: ClassVar[tuple[str, ...]] = ("cutlass",)
    abi: ClassVar[tuple[tuple[str, str], ...]] = (
        ("a", "const void*"), ("b", "const void*"), ("out", "void*"), ("bias", "const float*"),
        ("sched", "const int*"), ("blk_b", "const int*"), ("blk_a", "const int*"),
        ("m", "int"), ("n", "int"), ("k", "int"), ("nnz", "int"), ("n_items", "int"),
        ("alpha", "float"), ("beta", "float"), ("sm_count", "int"), ("strip", "int"),
    )

    @property
    def tile_m(self) -> int:
        """Output rows per tile: one block row of the output (DSD_T: a block column of A, block_n rows)."""
        return self.block_n if self.op is Op.DSD_T else self.block_m

    @property
    def sdd_pair_tile(self) -> bool:
        """SDD with two listed blocks of one block row a tile (matrix.sdd_schedule(pairs=True))."""
        return self.op is Op.SDD and self.tile_n == 2 * self.block_n

    def name_facts(self) -> str:
        # cluster 1 and the direct epilogue keep the names they always had
        cluster = f"_c{self.cluster}" if self.cluster != 1 else ""
        epi = "_etma" if self.epilogue is Epilogue.TMA else ""
        return (f"{self.op.value}_{self.dtype.value}_o{self.out_dtype.value}_b{self.block_m}x{self.block_n}"
                f"_t{self.tile_m}x{self.tile_n}_s{self.stages}{cluster}{epi}")

    def smem_bytes(self) -> int:
        """The A and B rings, the epilogue's staging tile and barriers; mirrors GemmKernel::SharedStorage."""
        return (self.stages * (self.tile_m + self.tile_n) * TILE_K * self.dtype.itemsize + _SMEM_RESERVE
                + epilogue_bytes(self.epilogue, self.tile_m, self.tile_n, self.out_dtype, self.op))

    def problems(self) -> list[str]:
        p: list[str] = []
        if self.arch is not Arch.SM90A:
            p.append(f"arch {self.arch.value} has no code generator yet; use arch='sm90a' (H100/H200)")
        for name in ("block_m", "block_n"):
            if getattr(self, name) not in BLOCKS:
                p.append(f"{name} {getattr(self, name)} is not supported; use one of {BLOCKS}")
        if self.op is Op.SDD:
            if self.tile_n not in (self.block_n, 2 * self.block_n):
                p.append(f"tile_n {self.tile_n}: an SDD tile is one output block or two of one block row; "
                         f"set tile_n={self.block_n} or {2 * self.block_n}")
            elif self.sdd_pair_tile and (self.cluster != 1 or self.epilogue is not Epilogue.TMA):
                p.append(f"tile_n {self.tile_n} (two blocks a tile) runs single CTAs with the TMA-store epilogue; "
                         f"set cluster=1, epilogue='tma'")
        elif self.tile_n not in TILE_NS:
            p.append(f"tile_n {self.tile_n} is not supported; use one of {TILE_NS}")
        if self.cluster not in CLUSTERS:
            p.append(f"cluster {self.cluster} is not supported; use one of {CLUSTERS}")
        elif self.op is Op.SDD and self.cluster > 2:
            p.append(f"cluster {self.cluster}: SDD runs single CTAs or pairs (two blocks of a row); use 1 or 2")
        if not 2 <= self.stages <= 16:
            p.append(f"stages {self.stages} out of range; use 2..16")
        if not p and self.smem_bytes() > self.arch.facts.smem_optin:
            p.append(f"needs {self.smem_bytes()} bytes of shared memory, over the {self.arch.facts.smem_optin} a "
                     f"Hopper CTA can have; use fewer stages or a smaller tile_n")
        return p

    def nearest_valid(self) -> "BsrGemmConfig | None":
        def near(v: int, opts: tuple[int, ...]) -> int:
            return min(opts, key=lambda o: (abs(o - v), o))
        bm, bn = near(self.block_m, BLOCKS), near(self.block_n, BLOCKS)
        cluster = near(self.cluster, CLUSTERS[:2] if self.op is Op.SDD else CLUSTERS)
        epi = self.epilogue
        if self.op is not Op.SDD:
            tn = near(self.tile_n, TILE_NS)
        elif self.tile_n >= 2 * bn:  # a pair tile
            tn, cluster, epi = 2 * bn, 1, Epilogue.TMA
        else:
            tn = bn
        cand = dataclasses.replace(self, arch=Arch.SM90A, block_m=bm, block_n=bn, tile_n=tn,
                                   stages=min(max(self.stages, 2), 16), cluster=cluster, epilogue=epi)
        while cand.stages > 2 and cand.problems():
            cand = dataclasses.replace(cand, stages=cand.stages - 1)
        return None if cand.problems() else cand

    def template_vars(self) -> dict[str, Any]:
        return {
            "element": self.dtype.cutlass_type,
            "element_out": self.out_dtype.cutlass_type,
            "op_enum": {"DSD": "kOpDsd", "DSD_T": "kOpDsdT", "SDD": "kOpSdd"}[self.op.name],
            "tile_m": self.tile_m,
            "tile_n": self.tile_n,
            "block_m": self.block_m,
            "block_n": self.block_n,
            "stages": self.stages,
            "cluster": self.cluster,
            "tma_epi": "true" if self.epilogue is Epilogue.TMA else "false",
        }


def epilogue_bytes(epilogue: Epilogue, tile_m: int, tile_n: int, out_dtype: OutDType, op: Op) -> int:
    """Shared memory of the epilogue's staging (GemmKernel::SharedStorage::epi): for TMA stores, two 16-row
    slices per MMA warp, rows of min(warpgroup width, 128 bytes); for DSD/DSD_T's direct stores, one 16 x 64
    slice per MMA warp when a warpgroup's columns are whole slices (GemmKernel::kStaged), else none."""
    size = 4 if out_dtype is OutDType.FP32 else 2
    wg_n = tile_n if tile_m == 128 else tile_n // 2
    if epilogue is Epilogue.TMA:
        return 8 * 2 * 16 * min(wg_n * size, 128)
    return 8 * 16 * 64 * size if op is not Op.SDD and wg_n % 64 == 0 else 0


def max_stages(op: Op, dtype: DType, block_m: int, block_n: int, tile_n: int, arch: Arch = Arch.SM90A,
               epilogue: Epilogue = Epilogue.DIRECT, out_dtype: OutDType = OutDType.FP16) -> int:
    """The most ring slots that fit a CTA's shared memory for this tile (capped at 8: deeper buys nothing)."""
    tile_m = block_n if op is Op.DSD_T else block_m
    per = (tile_m + tile_n) * TILE_K * dtype.itemsize
    room = arch.facts.smem_optin - _SMEM_RESERVE - epilogue_bytes(epilogue, tile_m, tile_n, out_dtype, op)
    return max(2, min(8, room // per))


def launch_args(*, a, b, out, bias, sched, blk_b, blk_a, m: int, n: int, k: int, nnz: int, alpha: float,
                beta: float, sm_count: int, strip: int = 0) -> dict[str, Any]:
    """Every field of the launcher's argument struct, by ABI name. ``m``: output rows (DSD: M, DSD_T: K, SDD: M);
    ``k``: the reduction length (DSD: K, DSD_T: M, SDD: K); ``sched``: int32 [n_items, 4] work entries (the
    layout's row schedule, the transpose's, or the SDD block list); ``blk_b``/``blk_a``: int32 per listed block
    (B's block row; DSD_T: the value index), None where the op reads none; ``strip``: N tiles per strip of the
    work order (0: the launcher's choice, B's strip in half of L2)."""
    return dict(
        a=a.data_ptr(), b=b.data_ptr(), out=out.data_ptr(), bias=None if bias is None else bias.data_ptr(),
        sched=sched.data_ptr(), blk_b=None if blk_b is None else blk_b.data_ptr(),
        blk_a=None if blk_a is None else blk_a.data_ptr(),
        m=int(m), n=int(n), k=int(k), nnz=int(nnz), n_items=int(sched.shape[0]),
        alpha=float(alpha), beta=float(beta), sm_count=int(sm_count), strip=int(strip),
    )
