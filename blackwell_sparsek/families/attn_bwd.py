"""Family ``attn_bwd``: block-sparse attention backward on Hopper (dQ, dK, dV).

The kernel (templates/attn_bwd.cu.j2 + templates/include/bsk/sm90/attn_bwd_*.hpp) runs one CTA per 128-key tile
over the TRANSPOSED layout: for each key block, the query blocks that list it. 64-wide key blocks run as pairs:
one CTA per two neighbouring key blocks, over the union of their columns (attention_bwd_view.transposed_view), and
so do the 64-key halves of other widths that are not multiples of 128 (192, ...); the warpgroup of a half a
query block does not list skips that entry. Two MMA warpgroups of 64 keys keep
dK and dV in registers; a reducer warp adds each 64-query dQ tile into an fp32 accumulator with TMA reduce-add.
Its shell, shared-memory layouts and tiled MMAs are CUTLASS example 88's backward (by #include).

This module owns the config (and its rules), the launcher ABI, and ``launch_args()``: the one place that fills
the ABI struct from tensors. Importing it registers the family in ``config.FAMILIES``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from ..errors import InvalidConfigError
from ..jit.spec import Arch, DType, KernelConfig, abi_strides, enum_from, register

# Queries per inner step and keys per CTA: example 88's backward tile (64, 128, D), two warpgroups of 64 keys.
TILE_M = 64
TILE_N = 128
HEAD_DIMS = (64, 128)


@register
@dataclass(frozen=True)
class AttnBwdConfig(KernelConfig):
    """Block-sparse attention backward on Hopper (TMA + warp-specialized WGMMA over the transposed layout)."""

    head_dim: int = 128
    dtype: DType = DType.FP16
    tile_m: int = TILE_M
    tile_n: int = TILE_N
    block_m: int = 128
    block_n: int = 128
    arch: Arch = Arch.SM90A
    # dQ contributions added in one fixed order (bitwise-identical gradients run to run); else unordered fp32
    # TMA reduce-adds. The deterministic kernel adds them in the turns of attention_bwd_view.det_ranks.
    deterministic: bool = False

    family: ClassVar[str] = "attn_bwd"
    template: ClassVar[str] = "attn_bwd.cu.j2"
    includes: ClassVar[tuple[str, ...]] = ("cutlass", "cutlass_ex88")  # the kernel shell is example 88's
    abi: ClassVar[tuple[tuple[str, str], ...]] = (
        ("q", "const void*"), ("k", "const void*"), ("v", "const void*"), ("o", "const void*"),
        ("do_", "const void*"), ("lse", "const float*"), ("glse", "const float*"),
        ("lse2", "float*"), ("delta", "float*"), ("dq_acc", "float*"),
        ("dq", "void*"), ("dk", "void*"), ("dv", "void*"),
        ("t_q_idx", "const int*"), ("t_kind", "const unsigned char*"), ("t_sched", "const int*"),
        ("t_rank", "const int*"), ("dq_sem", "int*"),
        ("batch", "int"), ("heads", "int"), ("heads_kv", "int"),
        ("seq_q", "int"), ("seq_k", "int"), ("head_dim", "int"),
        *abi_strides(("q", "k", "v", "o", "do", "dq", "dk", "dv")), *abi_strides(("lse", "ws"), "bh"),
        ("layout_heads", "int"), ("n_kblocks", "int"), ("col_stride", "int"),
        ("window_left", "int"), ("window_right", "int"), ("head_group", "int"),
        ("scale", "float"),
    )

    def name_facts(self) -> str:
        det = "_det" if self.deterministic else ""
        return f"d{self.head_dim}_{self.dtype.value}_t{self.tile_m}x{self.tile_n}_b{self.block_m}x{self.block_n}{det}"

    @property
    def pairs(self) -> bool:
        """Key blocks that are not whole 128-key tiles (64, 192, ...): the view's columns are 128-key tiles of two
        64-key halves, and the kernel's warpgroup of a half an entry does not list skips it."""
        return self.block_n % TILE_N != 0

    @property
    def tile_block_n(self) -> int:
        """Keys per column of the kernel's transposed view: block_n, or one 128-key tile of 64-key halves."""
        return TILE_N if self.pairs else self.block_n

    def smem_bytes(self) -> int:
        """Shared memory of one CTA, bytes; mirrors example 88's backward SharedStorage: K/V (4 stages of 64 keys),
        dS (two warpgroups), Q/dO (4 stages of 64 queries), the fp32 dQ tile (2 buffers), LSE/delta, barriers."""
        e, d = self.dtype.itemsize, self.head_dim
        kv = 4 * 64 * d * e
        ds = 2 * 64 * 64 * e
        qdo = 4 * 64 * d * e
        dq = 2 * 64 * d * 4
        lse = 64 * 4 * 4
        return kv + ds + qdo + dq + lse + 1024

    def problems(self) -> list[str]:
        p: list[str] = []
        if self.arch is not Arch.SM90A:
            p.append(f"arch {self.arch.value} has no backward code generator yet; use arch='sm90a' (H100/H200)")
        if self.head_dim not in HEAD_DIMS:
            p.append(f"head_dim {self.head_dim} is not supported by the backward; use 64 or 128 (256 would need "
                     f"{AttnBwdConfig(head_dim=256).smem_bytes()} bytes of shared memory in this design)")
        if (self.tile_m, self.tile_n) != (TILE_M, TILE_N):
            p.append(f"tile {self.tile_m}x{self.tile_n} is not supported; the backward runs {TILE_M} queries x "
                     f"{TILE_N} keys (two MMA warpgroups of 64 keys): use tile_m={TILE_M}, tile_n={TILE_N}")
        if self.block_m <= 0 or self.block_m % TILE_M:
            p.append(f"block_m {self.block_m} must be a positive multiple of {TILE_M}")
        if self.block_n <= 0 or self.block_n % (TILE_N // 2):
            p.append(f"block_n {self.block_n} must be a positive multiple of {TILE_N // 2} (one CTA covers "
                     f"{TILE_N} keys as two halves of {TILE_N // 2}); build the layout with block_n=64 or 128")
        if not p and self.smem_bytes() > self.arch.facts.smem_optin:
            p.append(f"needs {self.smem_bytes()} bytes of shared memory, over the {self.arch.facts.smem_optin} a "
                     f"Hopper CTA can have")
        return p

    def nearest_valid(self) -> "AttnBwdConfig | None":
        hd = min(HEAD_DIMS, key=lambda d: (abs(d - self.head_dim), d))
        bm = max(TILE_M, (max(self.block_m, 1) + TILE_M - 1) // TILE_M * TILE_M)
        bn = max(TILE_N // 2, (self.block_n + TILE_N // 2 - 1) // (TILE_N // 2) * (TILE_N // 2))
        cand = dataclasses.replace(self, arch=Arch.SM90A, head_dim=hd, tile_m=TILE_M, tile_n=TILE_N,
                                   block_m=bm, block_n=bn)
        return None if cand.problems() else cand

    def template_vars(self) -> dict[str, Any]:
        return {
            "element": self.dtype.cutlass_type,
            "head_dim": self.head_dim,
            "block_m": self.block_m,
            "block_n": self.tile_block_n,
            "deterministic": self.deterministic,
            "pairs": self.pairs,
        }


# -- named configs -------------------------------------------------------------------------------------------

def named_configs() -> dict[str, "AttnBwdConfig"]:
    """The family's named configs in cutlass_configs/, by name (file stem = kernel name without the hash)."""
    from ..jit.spec import load_named_configs
    return {n: c for n, c in load_named_configs().items() if isinstance(c, AttnBwdConfig)}


def config_for(head_dim: int, dtype: DType, block_m: int, block_n: int, deterministic: bool = False
               ) -> AttnBwdConfig:
    """The backward config for these facts: a named one when it matches, else derived; InvalidConfigError (naming
    the fix) when no backward kernel serves them."""
    return _config_for(int(head_dim), enum_from(DType, dtype), int(block_m), int(block_n), bool(deterministic))


@lru_cache(maxsize=None)
def _config_for(head_dim: int, dtype: DType, block_m: int, block_n: int, deterministic: bool) -> AttnBwdConfig:
    facts = (head_dim, dtype, block_m, block_n, deterministic)
    for cfg in named_configs().values():
        if (cfg.head_dim, cfg.dtype, cfg.block_m, cfg.block_n, cfg.deterministic) == facts:
            return cfg
    cfg = AttnBwdConfig(head_dim=head_dim, dtype=dtype, block_m=block_m, block_n=block_n,
                        deterministic=deterministic)
    probs = cfg.problems()
    if probs:
        raise InvalidConfigError(
            f"no sm90a attention backward kernel serves head_dim={head_dim}, {block_m}x{block_n} layout blocks: "
            + "; ".join(probs))
    return cfg


# -- launch arguments: the one place the ABI struct is filled from tensors --------------------------------------

def launch_args(*, q, k, v, o, do, lse, glse, lse2, delta, dq_acc, dq, dk, dv, t_q_idx, t_kind, t_sched, t_rank,
                dq_sem, window_left: int, window_right: int, scale: float, head_group: int = 0) -> dict[str, Any]:
    """Keyword fields of the ABI struct, in ABI order.

    q, o, do, dq: (B, H, Sq, D); k, v, dk, dv: (B, Hkv, Sk, D) (the kernel sums dK/dV over the query heads of a
    K/V head); lse (and glse, the LSE's upstream gradient, or None): (B, H, Sq) fp32 with unit sequence stride;
    lse2, delta: the kernel's workspace rows (B, H, >= Sq), fp32, one layout, unit sequence stride, 16-byte
    aligned rows; dq_acc: (B, H, Sq, D) fp32 contiguous (the launcher zeroes it for the fast kernel;
    the deterministic one stores each tile's first contribution); t_*: the transposed layout
    (query blocks per key block; under GQA stacked per K/V head: transposed_view(group=H // Hkv)) and its
    schedule [1 or Hkv, nk, 4]; deterministic kernels also take t_rank (each entry's turn among its query block's
    contributions, attention_bwd_view.det_ranks) and dq_sem (int32, B * H * ceil(Sq / 64), zeroed by the launcher);
    the others take None for both. head_group: (batch, K/V head)s per group of the tile order, a divisor of
    B * Hkv (attention_bwd.tile_group picks it; the launcher refuses anything else, 0 included)."""
    B, H, Sq, D = q.shape
    if glse is not None and glse.stride() != lse.stride():
        raise InvalidConfigError("glse must have lse's strides (the kernel takes one stride pair for both)")
    if delta.stride() != lse2.stride():
        raise InvalidConfigError("lse2 and delta must share one layout (the kernel takes one stride pair)")
    qs, ks, vs, os_, ds = q.stride(), k.stride(), v.stride(), o.stride(), do.stride()
    dqs, dks, dvs, ls, ws = dq.stride(), dk.stride(), dv.stride(), lse.stride(), lse2.stride()
    return dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), do_=do.data_ptr(),
        lse=lse.data_ptr(), glse=glse.data_ptr() if glse is not None else None,
        lse2=lse2.data_ptr(), delta=delta.data_ptr(), dq_acc=dq_acc.data_ptr(),
        dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(),
        t_q_idx=t_q_idx.data_ptr(), t_kind=t_kind.data_ptr(), t_sched=t_sched.data_ptr(),
        t_rank=t_rank.data_ptr() if t_rank is not None else None,
        dq_sem=dq_sem.data_ptr() if dq_sem is not None else None,
        batch=B, heads=H, heads_kv=k.shape[1], seq_q=Sq, seq_k=k.shape[2], head_dim=D,
        q_stride_b=qs[0], q_stride_h=qs[1], q_stride_s=qs[2],
        k_stride_b=ks[0], k_stride_h=ks[1], k_stride_s=ks[2],
        v_stride_b=vs[0], v_stride_h=vs[1], v_stride_s=vs[2],
        o_stride_b=os_[0], o_stride_h=os_[1], o_stride_s=os_[2],
        do_stride_b=ds[0], do_stride_h=ds[1], do_stride_s=ds[2],
        dq_stride_b=dqs[0], dq_stride_h=dqs[1], dq_stride_s=dqs[2],
        dk_stride_b=dks[0], dk_stride_h=dks[1], dk_stride_s=dks[2],
        dv_stride_b=dvs[0], dv_stride_h=dvs[1], dv_stride_s=dvs[2],
        lse_stride_b=ls[0], lse_stride_h=ls[1],
        ws_stride_b=ws[0], ws_stride_h=ws[1],
        layout_heads=t_sched.shape[0], n_kblocks=t_sched.shape[1], col_stride=t_q_idx.stride(0),
        window_left=int(window_left), window_right=int(window_right), head_group=int(head_group),
        scale=float(scale),
    )


__all__ = ["AttnBwdConfig", "named_configs", "config_for", "launch_args", "TILE_M", "TILE_N", "HEAD_DIMS"]
