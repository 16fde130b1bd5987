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
from typing import Any, ClassVar, Mapping

from .errors import InvalidConfigError


class ConfigTypeError(InvalidConfigError, TypeError):
    """A config was given as something that is not a config, a dict, JSON text, a .json path or a config name."""


# What resolve_config accepts, said in every error about the type of a config.
ACCEPTED_CONFIGS = ("a KernelConfig (e.g. AttentionConfig(...)), a dict of config fields, inline JSON text, "
                    "the path of a .json config file or a named config (python -m blackwell_sparsek list-configs)")
# A config file is one small JSON object; anything larger is the wrong file (or a device such as /dev/zero).
MAX_CONFIG_FILE_BYTES = 1 << 20


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
# Largest layout block side (block_m, block_n): 4096 = 32 tiles of 128 (64 of 64) per block. The kernel walks a
# block tile by tile and forms element offsets such as col * BlockN in 32-bit ints, so the bound keeps those far
# from overflow; and a block that coarse (16M scores) is already dense attention in all but name: Flex and the
# layouts shipped here use 64-256.
MAX_BLOCK = 4096
# Registers one consumer thread may spend on accumulators (QK fp32, P as 16-bit operand, O fp32); the rest of
# the 240 a consumer warpgroup gets after setmaxnreg go to addresses, softmax state and temporaries.
_CONSUMER_ACC_REG_BUDGET = 176


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidConfigError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:  # json recurses once per nesting level
        raise InvalidConfigError(f"{what} is nested too deeply to be a config; a config is one flat JSON object "
                                 f'such as {{"head_dim": 64}}') from None


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
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelConfig":
        if not isinstance(d, Mapping):
            raise ConfigTypeError(f"a config must be a JSON object / dict of fields such as "
                                  f'{{"head_dim": 64}}, got {type(d).__name__}')
        d = dict(d)
        fam = d.pop("family", None)
        if fam is not None and not isinstance(fam, str):
            raise InvalidConfigError(f"config field 'family' must be a string, one of {sorted(FAMILIES)}; "
                                     f"got {fam!r}")
        target = FAMILIES.get(fam, cls) if cls is KernelConfig else cls
        if target is KernelConfig:
            raise InvalidConfigError(f"unknown kernel family {fam!r}; known: {sorted(FAMILIES)}")
        if fam is not None and fam != target.family:
            raise InvalidConfigError(f"config is for family {fam!r}, not {target.family!r}")
        names = {f.name for f in dataclasses.fields(target)}
        unknown = set(d) - names
        if unknown:
            raise InvalidConfigError(f"unknown {target.family} config field(s) {sorted(map(repr, unknown))}; "
                                     f"valid: {sorted(names)}")
        return target(**d)

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        return cls.from_dict(_parse_json(text, "config"))

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
    tile_m: int = None  # type: ignore[assignment]  # None: the schedule's own (Schedule.tile_m), set on creation
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
        if self.tile_m is None:
            # tile_m follows from the schedule (64 rows for 'single', else 128); only a tile_m the user gives
            # can disagree with it, and validate() then names the fix.
            object.__setattr__(self, "tile_m", self.schedule.tile_m)
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
                "two MMA warpgroups of 64 rows (one WGMMA M) make one tile; for 64-row tiles use schedule='single'")
                + f"; set tile_m={want_m} or leave tile_m out (it follows the schedule)")
        if self.schedule is Schedule.SINGLE and (self.stages % 2 or self.stages < 4):
            p.append(f"stages {self.stages}: the single schedule needs an even count >= 4 (K and V of "
                     f"stages/2 tiles in flight)")
        tile_n_ok = self.tile_n in (64, 128)
        if not tile_n_ok:
            p.append(f"tile_n {self.tile_n} is not supported; use 64 or 128 (a WGMMA N that keeps the "
                     f"accumulators in registers)")
        if self.head_dim * self.dtype.itemsize % 16:
            p.append("head_dim * element size must be a multiple of 16 bytes for TMA")
        if not 2 <= self.stages <= 16:
            p.append(f"stages {self.stages} out of range; use 2..16 K/V slots (shared memory bounds it further)")
        # Layout blocks are whole kernel tiles (the template static_asserts it). Check against the tile the kernel
        # will have, so a wrong tile_m/tile_n (reported above) cannot hide or fake a block problem (or divide by 0).
        for name, block, tname, tile in (("block_m", self.block_m, "tile_m", want_m),
                                         ("block_n", self.block_n, "tile_n", self.tile_n if tile_n_ok else 64)):
            if not tile <= block <= MAX_BLOCK or block % tile:
                p.append(f"{name} {block} must be a multiple of {tname} {tile} between {tile} and {MAX_BLOCK} "
                         f"(rows/columns of one layout block)")
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
        tm = self.schedule.tile_m
        bm = min(MAX_BLOCK, max(tm, (self.block_m + tm - 1) // tm * tm))
        bn = min(MAX_BLOCK, max(tn, (self.block_n + tn - 1) // tn * tn))
        single = self.schedule is Schedule.SINGLE
        st = min(max(self.stages, 4 if single else 2), 16)
        cand = dataclasses.replace(self, arch=Arch.SM90A, head_dim=hd, tile_m=tm, tile_n=tn,
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


# -- named configs (cutlass_configs/<name>.json), files and what a user types -------------------------------

def _configs_dir():
    from ._paths import configs_dir
    return configs_dir()


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true/false",
               type(None): "null"}


def _config_from_object(obj: Any, what: str) -> KernelConfig:
    """A validated config from a parsed JSON value or a dict. Without "family" it is attention forward, the family
    a user means by default, whether the fields come inline, in a dict or in a file."""
    if not isinstance(obj, Mapping):
        kind = _JSON_KINDS.get(type(obj), type(obj).__name__)
        raise InvalidConfigError(f"{what} must be a JSON object of config fields such as "
                                 f'{{"head_dim": 64, "dtype": "bf16"}}, got {kind}')
    return KernelConfig.from_dict({"family": AttentionConfig.family, **obj}).validate()


def load_config_file(path: str | os.PathLike[str]) -> KernelConfig:
    """Read one config JSON file (UTF-8, one object; "family" defaults to attention forward) and validate it;
    errors name the file."""
    import stat
    from pathlib import Path
    p = Path(path)
    kind = ""
    try:
        st = p.stat()
        if stat.S_ISDIR(st.st_mode):
            kind = "is a directory"
        elif not stat.S_ISREG(st.st_mode):  # a FIFO or /dev/zero would block or never end
            kind = "is not a regular file"
        else:
            with open(p, "rb") as f:
                data = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        kind = ("does not exist" if isinstance(e, FileNotFoundError)
                else f"cannot be read ({getattr(e, 'strerror', None) or e})")
    if kind:
        raise InvalidConfigError(f"config file {p} {kind}; give the path of a readable .json config file")
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise InvalidConfigError(f"config file {p} is over {MAX_CONFIG_FILE_BYTES} bytes; a config is one small "
                                 f"JSON object: is this the right file?")
    try:
        text = data.decode("utf-8-sig")  # a BOM from an editor is fine
    except UnicodeDecodeError as e:
        raise InvalidConfigError(f"config file {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                                 f"{e.start}); save it as UTF-8 JSON") from None
    try:
        return _config_from_object(_parse_json(text, "its content"), "its content")
    except InvalidConfigError as e:
        raise type(e)(f"config file {p}: {e}") from None


def load_named_configs() -> dict[str, KernelConfig]:
    """Every named config shipped in cutlass_configs/, by name (the file stem), sorted by name."""
    d = _configs_dir()
    return {p.stem: load_config_file(p) for p in sorted(d.glob("*.json"))}


def config_names() -> list[str]:
    return sorted(p.stem for p in _configs_dir().glob("*.json"))


def get_config(name: str) -> KernelConfig:
    """The named config ``name`` (a file stem in cutlass_configs/)."""
    if not isinstance(name, str):
        raise ConfigTypeError(f"a config name must be a str, got {type(name).__name__}")
    names = config_names()
    if name not in names:  # a lookup in the list, never a path built from the name (no ../, no odd bytes)
        import difflib
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        shown = repr(name) if len(name) <= 80 else repr(name[:80]) + "..."
        raise InvalidConfigError(f"no named config {shown}{hint}; known names: {names}")
    return load_config_file(_configs_dir() / f"{name}.json")


def _is_regular_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def resolve_config(spec: str | os.PathLike[str] | KernelConfig | Mapping[str, Any]) -> KernelConfig:
    """A validated config from what a user gives: a config object, a dict, inline JSON, a .json file path or a
    named config. Anything else is a ``ConfigTypeError`` (a ``TypeError``) saying what is accepted."""
    if isinstance(spec, KernelConfig):
        return spec.validate()
    if isinstance(spec, Mapping):
        return _config_from_object(spec, "a config dict")
    if isinstance(spec, os.PathLike):
        path = os.fspath(spec)
        if not isinstance(path, str):
            raise ConfigTypeError(f"config paths must be str paths, got {type(path).__name__}")
        return load_config_file(path)
    if not isinstance(spec, str):
        raise ConfigTypeError(f"a config must be {ACCEPTED_CONFIGS}; got {type(spec).__name__}")
    s = spec.strip()
    if s.startswith(("{", "[")):
        return _config_from_object(_parse_json(s, "inline config"), "inline config")
    if _is_regular_file(s):
        return load_config_file(s)
    if s.endswith(".json") or os.sep in s or (os.altsep is not None and os.altsep in s):
        if not os.path.lexists(s):
            raise InvalidConfigError(f"config file {s} does not exist (or give a named config: {config_names()})")
        return load_config_file(s)  # there but not a regular file: it says what it is
    return get_config(s)
