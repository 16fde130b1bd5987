"""Load a built kernel with ctypes and launch it; device facts through cuda-python.

No torch C++ ABI is involved: the generated ``.so`` exports three C functions,
``int bsk_launch(const <kernel>_args*, cudaStream_t)`` (a cudaError_t value, 0 = success),
``const char* bsk_kernel_name()`` and ``int bsk_smem_bytes()``. The argument struct is rebuilt here from the same
``config.abi`` list that the template renders, so both sides agree field by field. The caller passes the stream
(the op layer passes ``torch.cuda.current_stream().cuda_stream``); this module never picks stream 0 by itself.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .spec import Arch, KernelConfig
from ..errors import BskError, CudaError, InputError, InvalidConfigError

_SCALARS: dict[str, type] = {
    "int": ctypes.c_int, "int32_t": ctypes.c_int32, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint,
    "uint32_t": ctypes.c_uint32, "long long": ctypes.c_longlong, "int64_t": ctypes.c_int64,
    "unsigned long long": ctypes.c_ulonglong, "uint64_t": ctypes.c_uint64, "long": ctypes.c_long,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool,
    "char": ctypes.c_char, "unsigned char": ctypes.c_ubyte, "short": ctypes.c_short,
}


def ctype_of(c_type: str) -> type:
    """The ctypes type for a C type string of an ABI list: any pointer -> c_void_p, scalars by name."""
    t = " ".join(c_type.replace("*", " * ").split())
    if "*" in t:
        return ctypes.c_void_p
    t = " ".join(w for w in t.split() if w not in ("const", "volatile"))
    try:
        return _SCALARS[t]
    except KeyError:
        raise BskError(f"ABI type {c_type!r} has no ctypes mapping; known: pointers and {sorted(_SCALARS)}") \
            from None


@lru_cache(maxsize=None)
def args_struct(abi: tuple[tuple[str, str], ...], name: str = "bsk_args") -> type[ctypes.Structure]:
    """A ctypes.Structure class laid out exactly like the launcher's C argument struct."""
    fields = [(field, ctype_of(ct)) for field, ct in abi]
    return type(name, (ctypes.Structure,), {"_fields_": fields, "__abi__": abi})


# The launchers' own return codes (enum : int { kErrBadHeadDim = 10001, ... } in the kernel headers), beside
# cudaError_t values: code -> (C enum name, what it means and the fix). Keep equal to the headers' enum (a test
# checks). The op layer checks all of this before it launches; these name what a raw launch got wrong.
LAUNCHER_ERRORS: dict[int, tuple[str, str]] = {
    10001: ("kErrBadHeadDim", "the arguments' head_dim is not the head_dim this kernel was compiled for "
                              "(config.head_dim): build the config for the inputs' head_dim (64, 128 or 256)"),
    10002: ("kErrStrideRange", "a stride of q, k, v, O or LSE is out of the launcher's range (negative, not a "
                               "multiple of 16 bytes, or larger than its integer type holds): pass contiguous "
                               "tensors, or split the call into fewer heads or shorter sequences"),
    10003: ("kErrBadShape", "a size is not positive, heads is not a multiple of heads_kv, or the layout does not "
                            "fit (n_qblocks * block_m < seq_q, layout heads neither 1 nor heads): pass the shapes "
                            "of the tensors and of the layout the kernel was built for"),
    10004: ("kErrMisaligned", "a q, k, v or O base address or the row schedule is not 16-byte aligned: pass "
                              "t.clone() for a sliced view, and the layout's own row_schedule()"),
}


def launch_error_message(code: int) -> str:
    """'kErrBadShape (launcher code 10003): what it means' for the launchers' own codes, else the CUDA error."""
    known = LAUNCHER_ERRORS.get(code)
    if known is not None:
        return f"{known[0]} (launcher code {code}): {known[1]}"
    return f"{cuda_error_name(code)} (code {code})"


def cuda_error_name(code: int) -> str:
    """``cudaErrorInvalidValue`` for 1, through cuda-python; the number itself when that is unavailable."""
    try:
        from cuda.bindings import runtime as cudart
    except Exception:  # cuda-python missing or broken
        return f"cudaError {code}"
    try:
        err = cudart.cudaError_t(code)
    except Exception:
        return f"cudaError {code}"
    try:
        status, name = cudart.cudaGetErrorName(err)
        text = name.decode() if isinstance(name, bytes) else str(name)
        if int(status) == 0 and text:
            try:
                _, desc = cudart.cudaGetErrorString(err)
                desc = desc.decode() if isinstance(desc, bytes) else str(desc)
                return f"{text}: {desc}" if desc else text
            except Exception:
                return text
    except Exception:
        pass
    return getattr(err, "name", f"cudaError {code}")


def _pointer_value(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    if isinstance(value, ctypes.c_void_p):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InputError(f"argument {field!r} is a pointer: pass a tensor, an int address or None, "
                     f"not {type(value).__name__}")


class CompiledKernel:
    """A built kernel: the loaded ``.so``, its argument struct class and ``launch``."""

    def __init__(self, so_path: str | Path, config: KernelConfig, meta: dict[str, Any] | None = None):
        self.so_path = Path(so_path)
        self.config = config
        self.meta = dict(meta or {})
        self.kernel_name = config.kernel_name
        try:
            self._lib = ctypes.CDLL(str(self.so_path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise BskError(f"cannot load {self.so_path}: {e}") from None
        try:
            self._launch = self._lib.bsk_launch
            name_fn = self._lib.bsk_kernel_name
            smem_fn = self._lib.bsk_smem_bytes
        except AttributeError as e:
            raise BskError(f"{self.so_path} is not a BlackwellSparseK kernel ({e})") from None
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        name_fn.argtypes = []
        name_fn.restype = ctypes.c_char_p
        smem_fn.argtypes = []
        smem_fn.restype = ctypes.c_int
        loaded = (name_fn() or b"").decode()
        if loaded != self.kernel_name:
            raise BskError(f"{self.so_path} holds kernel {loaded!r}, expected {self.kernel_name!r}: stale artifact")
        self._smem_fn = smem_fn
        self.Args = args_struct(tuple(config.abi), f"{self.kernel_name}_args")
        self._pointer_fields = {f for f, ct in config.abi if "*" in ct}

    def __repr__(self) -> str:
        return f"CompiledKernel({self.kernel_name}, {self.so_path})"

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory the kernel asks for, as compiled (bsk_smem_bytes)."""
        return int(self._smem_fn())

    def make_args(self, **fields: Any) -> ctypes.Structure:
        """The argument struct from keyword fields; every ABI field is required, pointers take tensors too."""
        names = [f for f, _ in self.config.abi]
        unknown = sorted(set(fields) - set(names))
        missing = [f for f in names if f not in fields]
        if unknown or missing:
            raise InputError(f"{self.kernel_name}: launch arguments wrong: unknown {unknown}, missing {missing}")
        args = self.Args()
        for f in names:
            v = fields[f]
            try:
                setattr(args, f, _pointer_value(f, v) if f in self._pointer_fields else v)
            except TypeError as e:
                raise InputError(f"{self.kernel_name}: argument {f!r}={v!r}: {e}") from None
        return args

    def launch(self, *args: Any, **fields: Any) -> None:
        """``launch(stream_handle, **fields)`` or ``launch(args_struct, stream_handle)``.

        ``stream_handle`` is the integer handle of a CUDA stream: pass
        ``torch.cuda.current_stream().cuda_stream``. Raises CudaError when the launcher returns an error code.
        """
        if args and isinstance(args[0], ctypes.Structure):
            if len(args) != 2 or fields:
                raise InputError("launch(args_struct, stream_handle) takes exactly those two arguments")
            struct, stream = args
        else:
            if len(args) != 1:
                raise InputError("launch(stream_handle, **fields): pass the stream handle positionally")
            stream = args[0]
            struct = self.make_args(**fields)
        if isinstance(stream, bool) or not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", stream)  # a torch.cuda.Stream is accepted too
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise InputError(f"stream handle must be an int (torch.cuda.current_stream().cuda_stream), "
                             f"got {type(stream).__name__}")
        self._run(struct, stream)

    def _run(self, struct: ctypes.Structure, stream: int) -> None:
        """The launcher on this kernel's struct and a checked stream handle; CudaError when it returns an error."""
        if not isinstance(struct, self.Args):
            raise InputError(f"args_struct is {type(struct).__name__}, not {self.Args.__name__}")
        code = self._launch(ctypes.byref(struct), ctypes.c_void_p(stream or None))
        if code != 0:
            err = CudaError(f"{self.kernel_name}: launch failed with {launch_error_message(code)}")
            err.code = code
            raise err


    def launch_on(self, struct: ctypes.Structure, device: int) -> None:
        """Launch with ``struct`` on torch's current stream of CUDA device ``device`` (its raw handle), switching
        the current device only when it differs, as the ops do for tensors on another GPU."""
        import torch
        if device == torch.cuda.current_device():
            self._run(struct, torch._C._cuda_getCurrentRawStream(device))
        else:
            with torch.cuda.device(device):
                self._run(struct, torch._C._cuda_getCurrentRawStream(device))

# -- device facts ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_optin: int  # max dynamic shared memory per block a kernel may opt into, bytes
    l2_bytes: int = 50 << 20


def _check(result: Any, what: str) -> Any:
    status, *rest = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise CudaError(f"{what} failed: {getattr(status, 'name', status)}")
    return rest[0] if len(rest) == 1 else rest


@lru_cache(maxsize=None)
def device_info(index: int = 0) -> DeviceInfo:
    """Name, compute capability, SM count, opt-in shared memory and L2 size of CUDA device ``index`` (driver
    API)."""
    try:
        from cuda.bindings import driver as cu
    except Exception as e:
        raise CudaError(f"cuda-python is not usable ({e}); pip install cuda-python") from None
    try:
        _check(cu.cuInit(0), "cuInit")
    except CudaError:
        raise
    except Exception as e:  # no driver library on this machine
        raise CudaError(f"no CUDA driver: {e}") from None
    count = _check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    if not 0 <= index < int(count):
        raise CudaError(f"CUDA device {index} does not exist ({count} device(s) visible)")
    dev = _check(cu.cuDeviceGet(index), "cuDeviceGet")
    raw = _check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = (raw.split(b"\0", 1)[0].decode() if isinstance(raw, (bytes, bytearray)) else str(raw)).strip()
    A = cu.CUdevice_attribute

    def attr(a: Any) -> int:
        return int(_check(cu.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a})"))

    return DeviceInfo(
        index=index, name=name,
        compute_capability=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        smem_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        l2_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
    )


def check_device(config: KernelConfig, info: DeviceInfo | int = 0) -> DeviceInfo:
    """Raise InvalidConfigError when ``config`` cannot run on the device (arch, shared memory)."""
    if isinstance(info, int):
        info = device_info(info)
    arch = getattr(config, "arch", None)
    if isinstance(arch, Arch) and info.compute_capability != arch.compute_capability:
        want = "%d.%d" % arch.compute_capability
        have = "%d.%d" % info.compute_capability
        raise InvalidConfigError(
            f"{config.kernel_name} is built for {arch.value} (compute capability {want}, '-a' features run on that "
            f"exact arch only); device {info.index} '{info.name}' is {have}")
    smem = getattr(config, "smem_bytes", None)
    if callable(smem) and smem() > info.smem_optin:
        raise InvalidConfigError(f"{config.kernel_name} needs {smem()} bytes of shared memory per block; device "
                                 f"{info.index} '{info.name}' allows {info.smem_optin}")
    return info
