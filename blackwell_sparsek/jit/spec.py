"""Kernel configs in general: the KernelConfig base, dtype and arch tables, the family registry, named configs.

A config is the whole compile-time identity of a kernel. Its canonical form is sorted-keys JSON with enums by
name; the kernel name, the cache key and the named configs in ``cutlass_configs/`` all derive from it. Each kernel
family is one module in ``families/`` holding one ``KernelConfig`` subclass: its rules, template, include
directories, launcher ABI and the function that fills the ABI from tensors.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from ..errors import InvalidConfigError


class ConfigTypeError(InvalidConfigError, TypeError):
    """A config was given as something that is not a config, a dict, JSON text, a .json path or a config name."""


# What resolve_config accepts, said in every error about the type of a config.
ACCEPTED_CONFIGS = ("a KernelConfig (e.g. AttentionConfig(...)), a dict of config fields, inline JSON text, "
                    "the path of a .json config file or a named config (python -m blackwell_sparsek list-configs)")
# A config file is one small JSON object; anything larger is the wrong file (or a device such as /dev/zero).
MAX_CONFIG_FILE_BYTES = 1 << 20


class DType(enum.Enum):
    """Element types, as values: each row of _DTYPE_FACTS is one dtype's facts (C++ type, bytes)."""
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def cutlass_type(self) -> str:
        return _DTYPE_FACTS[self][0]

    @property
    def itemsize(self) -> int:
        return _DTYPE_FACTS[self][1]

    @property
    def torch_name(self) -> str:
        """The torch dtype's attribute name (torch.float16, ...), so this module needs no torch import."""
        return _DTYPE_FACTS[self][2]


_DTYPE_FACTS: dict[DType, tuple[str, int, str]] = {
    DType.FP16: ("cutlass::half_t", 2, "float16"),
    DType.BF16: ("cutlass::bfloat16_t", 2, "bfloat16"),
}


@dataclass(frozen=True)
class ArchFacts:
    gencode_num: str                  # the nvcc -gencode arch/code number
    compute_capability: tuple[int, int]
    smem_optin: int                   # shared memory a CTA may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    smem_per_sm: int                  # shared memory per SM; each resident CTA also reserves 1 KiB of it


class Arch(enum.Enum):
    """Target architectures, as values: each row of _ARCH_FACTS is one arch's facts."""
    SM90A = "sm90a"
    SM100A = "sm100a"

    @property
    def facts(self) -> ArchFacts:
        return _ARCH_FACTS[self]

    @property
    def gencode(self) -> str:
        num = self.facts.gencode_num
        return f"-gencode=arch=compute_{num},code=sm_{num}"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.facts.compute_capability

    @classmethod
    def for_capability(cls, cc: tuple[int, int]) -> "Arch | None":
        """The arch whose '-a' features run on a device of compute capability ``cc`` (exact match), or None."""
        return next((a for a in cls if a.compute_capability == tuple(cc)), None)


_ARCH_FACTS: dict[Arch, ArchFacts] = {
    Arch.SM90A: ArchFacts("90a", (9, 0), 232448, 233472),     # H100 / H200: 228 KiB per SM
    Arch.SM100A: ArchFacts("100a", (10, 0), 232448, 233472),  # B200 (no generator yet)
}


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidConfigError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:  # json recurses once per nesting level
        raise InvalidConfigError(f"{what} is nested too deeply to be a config; a config is one flat JSON object "
                                 f'such as {{"head_dim": 64}}') from None


def enum_from(cls: type[enum.Enum], value: Any) -> enum.Enum:
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
    # Include trees nvcc gets besides our templates/include, by role (jit/compiler.py resolves them): "cutlass"
    # (include/ and tools/util/include of the CUTLASS tree) and "cutlass_ex88" (example 88's directory).
    includes: ClassVar[tuple[str, ...]] = ("cutlass",)

    def __post_init__(self) -> None:
        """Enum fields (those whose default is an enum member) accept the member, its name or its value; fields
        declared ``int`` take ints (not bools: True would pass as 1), those declared ``bool`` take bools. A field
        whose default is None (derived by the family, e.g. attn_fwd's tile_m) may stay None here."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(f.default, enum.Enum):
                object.__setattr__(self, f.name, enum_from(type(f.default), v))
            elif f.type in ("int", int) and not (v is None and f.default is None):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise InvalidConfigError(f"{f.name} must be an int, got {v!r}")
            elif f.type in ("bool", bool) and not isinstance(v, bool):
                raise InvalidConfigError(f"{f.name} must be a bool, got {v!r}")

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
            raise InvalidConfigError(f"config field 'family' must be a string, one of {sorted(families())}; "
                                     f"got {fam!r}")
        target = families().get(fam, cls) if cls is KernelConfig else cls
        if target is KernelConfig:
            raise InvalidConfigError(f"unknown kernel family {fam!r}; known: {sorted(families())}")
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
        """bsk_<arch>_<family>_<facts>_<hash12>: the name the kernel type carries (profilers show it)."""
        return f"bsk_{self.arch.value}_{self.family}_{self.name_facts()}_{self.config_hash[:12]}"

    @property
    def config_name(self) -> str:
        """The kernel name without its hash: a named config's file stem in cutlass_configs/."""
        return self.kernel_name.rsplit("_", 1)[0]

    def name_facts(self) -> str:
        """The family's facts in the kernel name (head dim, dtype, tiles, ...)."""
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


# -- the family registry ----------------------------------------------------------------------------------------
# Families register themselves (families/<name>.py, @register). The package's __init__ imports the families
# package, which imports every family, so the registry is complete whenever any module of the package is in use;
# this generic module never imports a family. A config given without "family" is DEFAULT_FAMILY's.
FAMILIES: dict[str, type[KernelConfig]] = {}
DEFAULT_FAMILY = "attn_fwd"


def abi_strides(tensors: tuple[str, ...], dims: str = "bhs") -> tuple[tuple[str, str], ...]:
    """Launcher ABI fields for the element strides of tensors, 64-bit: ``<tensor>_stride_<dim>`` for each dim
    (batch, head, sequence), in that order, as the ops' launch_args fill them."""
    return tuple((f"{t}_stride_{d}", "long long") for t in tensors for d in dims)


def register(cls: type[KernelConfig]) -> type[KernelConfig]:
    """Class decorator: make ``cls`` the config type of family ``cls.family``."""
    if not cls.family or not cls.template:
        raise TypeError(f"{cls.__name__} must set the class variables family and template")
    FAMILIES[cls.family] = cls
    return cls


def families() -> dict[str, type[KernelConfig]]:
    """Every registered family, by name."""
    return FAMILIES


# -- named configs (cutlass_configs/<name>.json), files and what a user types -------------------------------

def _configs_dir():
    from .._paths import configs_dir
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
    return KernelConfig.from_dict({"family": DEFAULT_FAMILY, **obj}).validate()


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
