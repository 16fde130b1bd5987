"""Kernel configs: typed, frozen, validated before nvcc ever runs.

A config is the whole compile-time identity of a kernel. Its canonical form is sorted-keys JSON with enums by
name; the kernel name, the cache key and the named configs in ``cutlass_configs/`` all derive from it.
Each kernel family (attention forward today; backward and BSR GEMM later) is one ``KernelConfig`` subclass that
names its template, its launcher ABI and its own rules.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import InvalidConfigError


class Schedule(enum.Enum):
    COOPERATIVE = "cooperative"   # both MMA warpgroups split one M tile; one CTA per tile
    PINGPONG = "pingpong"         # persistent CTAs, Q loaded by its own warp, warpgroups staggered
    SINGLE = "single"             # one 64-row MMA warpgroup per CTA that issues its own TMA loads; 2-3 CTAs per SM

    @property
    def tile_m(self) -> int:
        """Query rows per tile: 64 per MMA warpgroup, two warpgroups except for SINGLE."""
        return 64 if self is Schedule.SINGLE else 128


class DType(enum.Enum):
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def cutlass_type(self) -> str:
        return {"FP16": "cutlass::half_t", "BF16": "cutlass::bfloat16_t"}[self.name]

    @property
    def itemsize(self) -> int:
        return 2


class Arch(enum.Enum):
    SM90A = "sm90a"
    SM100A = "sm100a"

    @property
    def gencode(self) -> str:
        num = {"SM90A": "90a", "SM100A": "100a"}[self.name]
        return f"-gencode=arch=compute_{num},code=sm_{num}"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return {"SM90A": (9, 0), "SM100A": (10, 0)}[self.name]


# Shared memory a CTA may opt into on H100/H200 (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes.
SM90_SMEM_OPTIN = 232448
SM90_SMEM_PER_SM = 233472   # 228 KiB per SM, of which each resident CTA also reserves 1 KiB
# Registers one consumer thread may spend on accumulators (QK fp32, P as 16-bit operand, O fp32); the rest of
# the 240 a consumer warpgroup gets after setmaxnreg go to addresses, softmax state and temporaries.
_CONSUMER_ACC_REG_BUDGET = 176


def _enum_from(cls: type[enum.Enum], value: Any) -> enum.Enum:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for member in cls:
            if value.upper() == member.name or value.lower() == member.value:
                return member
    raise InvalidConfigError(
        f"{cls.__name__} must be one of {[m.value for m in cls]}, got {value!r}")


@dataclass(frozen=True)
class KernelConfig:
    """Base of every kernel family's config. Subclasses are frozen dataclasses with enum fields."""

    family: ClassVar[str] = ""
    template: ClassVar[str] = ""           # file in templates/
    abi: ClassVar[tuple[tuple[str, str], ...]] = ()  # launcher argument struct: (field, C type), in order

    # -- canonical form -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"family": self.family}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.name if isinstance(v, enum.Enum) else v
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelConfig":
        d = dict(d)
        fam = d.pop("family", None)
        target = FAMILIES.get(fam, cls) if cls is KernelConfig else cls
        if target is KernelConfig:
            raise InvalidConfigError(f"unknown kernel family {fam!r}; known: {sorted(FAMILIES)}")
        if fam is not None and fam != target.family:
            raise InvalidConfigError(f"config is for family {fam!r}, not {target.family!r}")
        names = {f.name for f in dataclasses.fields(target)}
        unknown = set(d) - names
        if unknown:
            raise InvalidConfigError(f"unknown {target.family} config field(s) {sorted(unknown)}; valid: {sorted(names)}")
        return target(**d)

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise InvalidConfigError(f"config is not valid JSON: {e}") from None

    # -- per family -----------------------------------------------------------------------------------
    @property
    def kernel_name(self) -> str:
        raise NotImplementedError

    def problems(self) -> list[str]:
        """Every rule this config breaks, as sentences. Empty means valid."""
        raise NotImplementedError

    def nearest_valid(self) -> "KernelConfig | None":
        return None

    def validate(self) -> "KernelConfig":
        probs = self.problems()
        if probs:
            near = self.nearest_valid()
            hint = f"\n  nearest valid config: {near.to_json()}" if near is not None else ""
            raise InvalidConfigError(
                f"invalid {self.family} config {self.to_json()}:\n  - " + "\n  - ".join(probs) + hint)
        return self

    def template_vars(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class AttentionConfig(KernelConfig):
    """Block-sparse attention forward on Hopper (TMA + warp-specialized WGMMA, BSR-indexed K/V)."""

    head_dim: int = 128
    dtype: DType = DType.FP16
    schedule: Schedule = Schedule.COOPERATIVE
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 4
    block_m: int = 128
    block_n: int = 128
    arch: Arch = Arch.SM90A

    family: ClassVar[str] = "attn_fwd"
    template: ClassVar[str] = "attn_fwd.cu.j2"
    abi: ClassVar[tuple[tuple[str, str], ...]] = (
        ("q", "const void*"), ("k", "const void*"), ("v", "const void*"),
        ("o", "void*"), ("lse", "float*"),
        ("col_idx", "const int*"), ("block_kind", "const unsigned char*"), ("row_sched", "const int*"),
        ("batch", "int"), ("heads", "int"), ("heads_kv", "int"),
        ("seq_q", "int"), ("seq_k", "int"), ("head_dim", "int"),
        ("q_stride_b", "long long"), ("q_stride_h", "long long"), ("q_stride_s", "long long"),
        ("k_stride_b", "long long"), ("k_stride_h", "long long"), ("k_stride_s", "long long"),
        ("v_stride_b", "long long"), ("v_stride_h", "long long"), ("v_stride_s", "long long"),
        ("o_stride_b", "long long"), ("o_stride_h", "long long"), ("o_stride_s", "long long"),
        ("lse_stride_b", "long long"), ("lse_stride_h", "long long"),
        ("layout_heads", "int"), ("n_qblocks", "int"), ("n_kblocks", "int"),
        ("col_stride", "int"),
        ("window_left", "int"), ("window_right", "int"),
        ("scale", "float"), ("sm_count", "int"), ("rank_major", "int"),
    )

    def __post_init__(self) -> None:
        for name, cls in (("dtype", DType), ("schedule", Schedule), ("arch", Arch)):
            object.__setattr__(self, name, _enum_from(cls, getattr(self, name)))
        for name in ("head_dim", "tile_m", "tile_n", "stages", "block_m", "block_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidConfigError(f"{name} must be an int, got {v!r}")

    @property
    def kernel_name(self) -> str:
        sched = {"COOPERATIVE": "coop", "PINGPONG": "pp", "SINGLE": "single"}[self.schedule.name]
        return (f"bsk_{self.arch.value}_attn_fwd_d{self.head_dim}_{self.dtype.value}"
                f"_t{self.tile_m}x{self.tile_n}_{sched}_s{self.stages}_b{self.block_m}x{self.block_n}"
                f"_{self.config_hash[:12]}")

    @property
    def q_stages(self) -> int:
        """Q slots: one per MMA warpgroup. (Doubling them when persistent, so the next tile's Q loads during this
        one, measured 4-6 % slower on the H200 than spending that shared memory on a deeper K/V ring.)"""
        return self.tile_m // 64

    def smem_bytes(self) -> int:
        """Shared memory the kernel needs, bytes: Q for both warpgroups, the K/V ring, the O staging (beside the
        mainloop when persistent) and barriers. Mirrors SharedStorage in bsk/attn_fwd.hpp."""
        e = self.dtype.itemsize
        q = self.q_stages * 64 * self.head_dim * e
        kv = self.stages * self.tile_n * self.head_dim * e
        # O staging, one 64-row buffer per warpgroup: beside the mainloop when persistent, else over Q's slots
        epi = self.q_stages * 64 * self.head_dim * e if self.schedule is Schedule.PINGPONG else 0
        return q + kv + epi + 1024

    @property
    def ctas_per_sm(self) -> int:
        """CTAs built to share an SM (the kernel's launch bounds). Single-warpgroup CTAs: as many as shared memory
        allows, at most 3 (3 x 128 threads leave 168 registers a thread; 4 would leave 128, too few to keep the
        QK and PV accumulators)."""
        if self.schedule is not Schedule.SINGLE:
            return 1
        return min(3, SM90_SMEM_PER_SM // (self.smem_bytes() + 1024))

    def acc_registers(self) -> int:
        # per consumer thread: QK fp32 accumulator 64 x tile_n over 128 threads, P as 16-bit operand, O fp32.
        return self.tile_n // 2 + self.tile_n // 4 + self.head_dim // 2

    def problems(self) -> list[str]:
        p: list[str] = []
        if self.arch is not Arch.SM90A:
            p.append(f"arch {self.arch.value} has no code generator yet; use arch='sm90a' (H100/H200)")
        if self.head_dim not in (64, 128, 256):
            p.append(f"head_dim {self.head_dim} is not supported; use 64, 128 or 256")
        want_m = self.schedule.tile_m
        if self.tile_m != want_m:
            p.append(f"tile_m {self.tile_m} != {want_m}: " + (
                "the single schedule runs one 64-row MMA warpgroup per CTA" if self.schedule is Schedule.SINGLE else
                "two MMA warpgroups of 64 rows (one WGMMA M) make one tile; for 64-row tiles use schedule='single'"))
        if self.schedule is Schedule.SINGLE and (self.stages % 2 or self.stages < 4):
            p.append(f"stages {self.stages}: the single schedule needs an even count >= 4 (K and V of "
                     f"stages/2 tiles in flight)")
        if self.tile_n not in (64, 128):
            p.append(f"tile_n {self.tile_n} is not supported; use 64 or 128 (a WGMMA N that keeps the "
                     f"accumulators in registers)")
        if self.head_dim * self.dtype.itemsize % 16:
            p.append("head_dim * element size must be a multiple of 16 bytes for TMA")
        if not 2 <= self.stages <= 16:
            p.append(f"stages {self.stages} out of range; use 2..16 K/V slots (shared memory bounds it further)")
        if self.block_m <= 0 or self.block_m % self.tile_m:
            p.append(f"block_m {self.block_m} must be a positive multiple of tile_m {self.tile_m}")
        if self.block_n <= 0 or self.block_n % self.tile_n:
            p.append(f"block_n {self.block_n} must be a positive multiple of tile_n {self.tile_n}")
        if not p:
            if self.acc_registers() > _CONSUMER_ACC_REG_BUDGET:
                p.append(f"tile_n {self.tile_n} with head_dim {self.head_dim} needs {self.acc_registers()} "
                         f"accumulator registers per thread (budget {_CONSUMER_ACC_REG_BUDGET}); use tile_n=64")
            single = self.schedule is Schedule.SINGLE
            too_big = self.ctas_per_sm < 2 if single else self.smem_bytes() > SM90_SMEM_OPTIN
            if too_big:
                limit = SM90_SMEM_PER_SM // 2 - 1024 if single else SM90_SMEM_OPTIN
                p.append(f"needs {self.smem_bytes()} bytes of shared memory, over the {limit} a Hopper CTA can "
                         f"have{' with 2 per SM' if single else ''}; use fewer stages or a smaller tile_n")
        return p

    def nearest_valid(self) -> "AttentionConfig | None":
        hd = min((64, 128, 256), key=lambda d: (abs(d - self.head_dim), d))
        tn = 64 if (self.tile_n < 128 or hd == 256) else 128
        bm = max(128, (max(self.block_m, 1) + 127) // 128 * 128)
        bn = max(tn, (max(self.block_n, 1) + tn - 1) // tn * tn)
        single = self.schedule is Schedule.SINGLE
        st = min(max(self.stages, 4 if single else 2), 16)
        cand = dataclasses.replace(self, arch=Arch.SM90A, head_dim=hd, tile_m=self.schedule.tile_m, tile_n=tn,
                                   block_m=bm, block_n=bn, stages=st - st % 2 if single else st)
        while cand.stages > (4 if single else 2) and cand.problems():
            cand = dataclasses.replace(cand, stages=cand.stages - (2 if single else 1))
        return None if cand.problems() else cand

    def template_vars(self) -> dict[str, Any]:
        return {
            "element": self.dtype.cutlass_type,
            "head_dim": self.head_dim,
            "tile_m": self.tile_m,
            "tile_n": self.tile_n,
            "stages": self.stages,
            "q_stages": self.q_stages,
            "block_m": self.block_m,
            "block_n": self.block_n,
            "persistent": self.schedule is Schedule.PINGPONG,
            "ctas_per_sm": self.ctas_per_sm,
            "schedule": self.schedule.value,
        }


FAMILIES: dict[str, type[KernelConfig]] = {AttentionConfig.family: AttentionConfig}


# -- named configs (cutlass_configs/<name>.json) -------------------------------------------------------------

def _configs_dir():
    from ._paths import configs_dir
    return configs_dir()


def load_config_file(path: str | os.PathLike[str]) -> KernelConfig:
    """Read one config JSON file and validate it; errors name the file."""
    from pathlib import Path
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InvalidConfigError(f"cannot read config file {p}: {e.strerror or e}") from None
    try:
        return KernelConfig.from_json(text).validate()
    except InvalidConfigError as e:
        raise InvalidConfigError(f"{p}: {e}") from None


def load_named_configs() -> dict[str, KernelConfig]:
    """Every named config shipped in cutlass_configs/, by name (the file stem), sorted by name."""
    d = _configs_dir()
    return {p.stem: load_config_file(p) for p in sorted(d.glob("*.json"))}


def config_names() -> list[str]:
    return sorted(p.stem for p in _configs_dir().glob("*.json"))


def get_config(name: str) -> KernelConfig:
    """The named config ``name`` (a file stem in cutlass_configs/)."""
    p = _configs_dir() / f"{name}.json"
    if "/" in name or os.sep in name or not p.is_file():
        import difflib
        names = config_names()
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InvalidConfigError(f"no named config {name!r}{hint}; known names: {names}")
    return load_config_file(p)


def resolve_config(spec: str | KernelConfig | dict[str, Any]) -> KernelConfig:
    """A config from what a user typed: a config object, a dict, inline JSON, a .json file path or a name."""
    if isinstance(spec, KernelConfig):
        return spec.validate()
    if isinstance(spec, dict):
        # A dict without "family" means attention forward, the family a user means by default.
        return KernelConfig.from_dict({"family": AttentionConfig.family, **spec}).validate()
    s = str(spec).strip()
    if s.startswith("{"):
        try:
            d = json.loads(s)
        except json.JSONDecodeError as e:
            raise InvalidConfigError(f"inline config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise InvalidConfigError(f"inline config must be a JSON object, got {type(d).__name__}")
        return resolve_config(d)
    from pathlib import Path
    if Path(s).is_file():
        return load_config_file(s)
    if s.endswith(".json") or os.sep in s:
        raise InvalidConfigError(f"config file {s} does not exist (or give a named config: {config_names()})")
    return get_config(s)
