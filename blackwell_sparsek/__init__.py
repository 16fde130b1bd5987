"""BlackwellSparseK: generated block-sparse attention CUDA kernels for Hopper, called from PyTorch.

Public API only. Importing this package is cheap: it never runs nvcc, never initialises CUDA and does not
import torch; the heavier modules load on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    BskError,
    CacheError,
    CudaError,
    EnvError,
    InputError,
    InvalidConfigError,
    JitDisabledError,
    KernelCompileError,
    LayoutError,
    ToolchainError,
    UnsafeCacheError,
)
from . import families  # noqa: E402,F401 - registers every kernel family
from .families.attn_fwd import AttentionConfig, Schedule  # noqa: E402
from .jit.spec import (  # noqa: E402
    Arch,
    ConfigTypeError,
    DType,
    KernelConfig,
    get_config,
    load_named_configs,
    resolve_config,
)

if TYPE_CHECKING:  # pragma: no cover
    from os import PathLike
    from typing import Mapping

    from .jit.runtime import CompiledKernel

    ConfigSpec = KernelConfig | str | PathLike[str] | Mapping[str, Any]


def generate(config: ConfigSpec, out_path: str | PathLike[str]) -> Any:
    """Validate ``config``, render its CUDA source and write it to ``out_path``; returns the path written.

    ``config`` is a config object, a dict of fields, inline JSON, a .json path or a named config (as on the command
    line); ``out_path`` a file path, or a directory that gets ``<kernel_name>.cu``."""
    from .jit.codegen import generate as _generate
    return _generate(config, out_path)


def build(config: ConfigSpec) -> CompiledKernel:
    """Compile ``config`` (or take it from the on-disk cache) and load it; returns a ``CompiledKernel``.

    ``config`` is a config object, a dict of fields, inline JSON, a .json path or a named config (as on the command
    line); anything else raises a ``TypeError`` (``ConfigTypeError``) saying what is accepted."""
    from .jit.kernels import build as _build
    from .jit.spec import resolve_config
    return _build(resolve_config(config))


# Written by other modules of the package; imported on first use so `import blackwell_sparsek` stays cheap.
_LAZY = {
    "BlockSparseLayout": ".layout",
    "sparse_attention": ".ops",
    "precompile": ".ops",
    "CompiledKernel": ".jit.runtime",
    "cache_ls": ".jit.kernels",
    "cache_clear": ".jit.kernels",
    "render": ".jit.codegen",
    "BlockSparseMatrix": ".matrix",
    "bsr_matmul": ".ops.gemm",
    "sampled_matmul": ".ops.gemm",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'blackwell_sparsek' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "AttentionConfig", "KernelConfig", "Schedule", "DType", "Arch", "get_config", "load_named_configs",
    "resolve_config", "ConfigTypeError",
    "BskError", "InvalidConfigError", "LayoutError", "InputError", "ToolchainError", "KernelCompileError",
    "CudaError", "JitDisabledError", "EnvError", "CacheError", "UnsafeCacheError",
    "generate", "build", "render", "CompiledKernel", "cache_ls", "cache_clear",
    "BlockSparseLayout", "sparse_attention", "precompile",
    "BlockSparseMatrix", "bsr_matmul", "sampled_matmul",
]
