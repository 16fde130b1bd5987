"""Typed errors of BlackwellSparseK. Every message says what was wrong and how to fix it."""


class BskError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidConfigError(BskError, ValueError):
    """A kernel config breaks a rule (tile shape, head dim, shared-memory budget, arch)."""


class LayoutError(BskError, ValueError):
    """A BlockSparseLayout is malformed or does not match the tensors it is used with."""


class InputError(BskError, ValueError):
    """An input tensor has the wrong dtype, device, shape or strides."""


class ToolchainError(BskError, RuntimeError):
    """nvcc or the CUTLASS headers cannot be found or used."""


class KernelCompileError(BskError, RuntimeError):
    """nvcc failed; the message carries the first error lines, a repro command and the kept build dir."""


class CudaError(BskError, RuntimeError):
    """A CUDA call made by a generated launcher returned an error code."""


class JitDisabledError(BskError, RuntimeError):
    """BSK_DISABLE_JIT=1 and the kernel is not in the cache: build it ahead of time or unset the variable."""


class EnvError(BskError, ValueError):
    """A BSK_* environment variable has a value the package cannot use; the message names the variable."""


class CacheError(BskError, OSError):
    """The kernel cache cannot be used as it is (root is a file, read-only, a removal failed)."""


class UnsafeCacheError(CacheError, PermissionError):
    """A cache directory or artifact could have been written by another user: nothing is loaded from it."""
