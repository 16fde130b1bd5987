"""nvcc discovery, flags, errors, ctypes loading and launching; plus the real nvcc compile (``-k real_compile``).

Everything but the ``real_compile`` tests runs in well under a second each, without a GPU. The real ones run the
machine's nvcc on generated sm_90a code; they skip, saying why, when nvcc or CUTLASS is missing.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from blackwell_sparsek import CudaError, InputError, InvalidConfigError, ToolchainError
from blackwell_sparsek.jit import kernels, compiler, runtime
from blackwell_sparsek.families.attn_fwd import AttentionConfig
from blackwell_sparsek.jit.spec import Arch, get_config

REPO = Path(__file__).resolve().parent.parent


# -- nvcc discovery and flags ----------------------------------------------------------------------------------

def test_find_nvcc_order(tmp_path, monkeypatch, fake_nvcc):
    assert compiler.find_nvcc() == str(fake_nvcc.path)  # BSK_NVCC first
    monkeypatch.delenv("BSK_NVCC")
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    shutil.copy(fake_nvcc.path, home / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert compiler.find_nvcc() == str(home / "bin" / "nvcc")  # then CUDA_HOME
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert compiler.find_nvcc() == str(home / "bin" / "nvcc")  # then PATH


def test_missing_nvcc_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("BSK_NVCC", str(tmp_path / "nvcc"))
    with pytest.raises(ToolchainError, match="BSK_NVCC=.* is not an executable"):
        compiler.find_nvcc()
    monkeypatch.delenv("BSK_NVCC")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("/usr/local/cuda/bin/nvcc exists: the last fallback finds it")
    with pytest.raises(ToolchainError, match="set BSK_NVCC=/path/to/nvcc, or CUDA_HOME"):
        compiler.find_nvcc()


def test_flags():
    flags = compiler.nvcc_flags(Arch.SM90A)
    for f in ("-std=c++17", "-O3", "--use_fast_math", "-DNDEBUG", "--expt-relaxed-constexpr", "-shared",
              "-gencode=arch=compute_90a,code=sm_90a"):
        assert f in flags
    assert flags[flags.index("-Xcompiler") + 1] == "-fPIC"
    assert "-lineinfo" not in flags


def test_lineinfo_flag(monkeypatch):
    monkeypatch.setenv("BSK_LINEINFO", "1")
    assert "-lineinfo" in compiler.nvcc_flags(Arch.SM90A)


def test_cutlass_paths_and_version():
    try:
        paths = compiler.cutlass_paths()
    except ToolchainError as e:
        pytest.skip(f"CUTLASS not installed: {e}")
    assert (paths.include / "cutlass" / "version.h").is_file()
    assert paths.example88.name == "88_hopper_fmha"
    v = compiler.cutlass_version(paths)
    assert v.split(".")[:2] == ["4", "2"]  # pinned nvidia-cutlass==4.2.0.0


def test_compile_command_includes(fake_nvcc):
    cmd = compiler.compile_command(AttentionConfig())
    assert cmd[0] == str(fake_nvcc.path)
    incs = [c[2:] for c in cmd if c.startswith("-I")]
    assert incs[0].endswith("templates/include")
    assert any(i.endswith("tools/util/include") for i in incs)
    assert any(i.endswith("examples/88_hopper_fmha") for i in incs)
    tail = ["kernel.cu", "-o", "kernel.so", *compiler.LINK_FLAGS]
    assert cmd[-len(tail):] == tail
    assert cmd.index("-shared") < cmd.index("kernel.cu")


def test_headers_hash_follows_content(tmp_path):
    d = tmp_path / "inc" / "bsk"
    d.mkdir(parents=True)
    (d / "a.hpp").write_text("int a;")
    h1 = compiler.headers_hash(tmp_path / "inc")
    assert compiler.headers_hash(tmp_path / "inc") == h1
    (d / "a.hpp").write_text("int b;")
    assert compiler.headers_hash(tmp_path / "inc") != h1


def test_headers_hash_of_a_source_covers_what_it_includes(tmp_path):
    inc = tmp_path / "inc"
    (inc / "bsk" / "x").mkdir(parents=True)
    (inc / "bsk" / "a.hpp").write_text('#include "x/b.hpp"\n#include "cutlass/cutlass.h"\nint a;')
    (inc / "bsk" / "x" / "b.hpp").write_text('#include "bsk/c.hpp"\nint b;')  # b.hpp's folder, then the root
    (inc / "bsk" / "c.hpp").write_text("int c;")
    (inc / "bsk" / "other.hpp").write_text("int o;")
    src = '#include "bsk/a.hpp"\n'
    h1 = compiler.headers_hash(inc, source=src)
    assert h1 != compiler.headers_hash(inc) and h1 != compiler.headers_hash(inc, source='#include "bsk/c.hpp"')
    (inc / "bsk" / "other.hpp").write_text("int other;")  # not included: the key stays
    assert compiler.headers_hash(inc, source=src) == h1
    (inc / "bsk" / "c.hpp").write_text("int cc;")  # included through two headers: the key moves
    h2 = compiler.headers_hash(inc, source=src)
    assert h2 != h1
    (inc / "bsk" / "x" / "b.hpp").write_text('#include "bsk/c.hpp"\nint bb;')
    assert compiler.headers_hash(inc, source=src) not in (h1, h2)


def test_first_error_lines():
    log = "warning: x\nkernel.cu(3): error: bad thing\n  detected during instantiation\n\nmore\n"
    lines = compiler.first_error_lines(log)
    assert lines[0] == "kernel.cu(3): error: bad thing"
    assert compiler.first_error_lines("only noise\nmore noise") == ["only noise", "more noise"]


def test_progress_line(fake_nvcc, monkeypatch, capsys):
    monkeypatch.setenv("BSK_VERBOSE", "1")
    kernels.ensure_built(AttentionConfig())
    err = capsys.readouterr().err
    assert f"compiling {AttentionConfig().kernel_name} ..." in err
    assert f"compiled {AttentionConfig().kernel_name} in " in err


# -- runtime: ctypes struct, load, launch -----------------------------------------------------------------------

def test_ctype_mapping():
    assert runtime.ctype_of("const void*") is ctypes.c_void_p
    assert runtime.ctype_of("const unsigned char*") is ctypes.c_void_p
    assert runtime.ctype_of("float *") is ctypes.c_void_p
    assert runtime.ctype_of("int") is ctypes.c_int
    assert runtime.ctype_of("long long") is ctypes.c_longlong
    assert runtime.ctype_of("float") is ctypes.c_float
    with pytest.raises(Exception, match="no ctypes mapping"):
        runtime.ctype_of("__half")


def test_args_struct_matches_abi():
    abi = tuple(AttentionConfig.abi)
    S = runtime.args_struct(abi)
    assert [f for f, _ in S._fields_] == [f for f, _ in abi]
    assert runtime.args_struct(abi) is S  # one class per ABI
    # C layout: 8 pointers, 6 ints, 14 long longs, 6 ints, a float, 2 ints
    assert S.q.offset == 0 and S.batch.offset == 8 * 8
    assert S.q_stride_b.offset == 8 * 8 + 6 * 4 + 0  # 88: already 8-aligned
    assert ctypes.sizeof(S) % 8 == 0


def test_launch_through_fake_kernel(fake_nvcc):
    k = kernels.build(AttentionConfig())
    fields = {f: 0 for f, _ in AttentionConfig.abi}
    fields["q"] = 0x1234_5678_9A
    fields["scale"] = 0.125
    k.launch(0, **fields)  # the fake returns the stream handle as its error code
    assert ctypes.c_longlong.in_dll(k._lib, "bsk_fake_last_first_field").value == 0x1234_5678_9A
    args = k.make_args(**fields)
    k.launch(args, 0)
    with pytest.raises(CudaError, match="cudaErrorInvalidValue|cudaError 1") as ei:
        k.launch(1, **fields)
    assert k.kernel_name in str(ei.value) and ei.value.code == 1
    with pytest.raises(CudaError, match="code 700"):
        k.launch(700, **fields)
    with pytest.raises(InputError, match="missing"):
        k.launch(0, q=0)
    with pytest.raises(InputError, match="unknown"):
        k.launch(0, bogus=1, **fields)
    with pytest.raises(InputError, match="stream handle"):
        k.launch("0", **fields)


def test_pointer_fields_take_tensors(fake_nvcc):
    torch = pytest.importorskip("torch")
    k = kernels.build(AttentionConfig())
    t = torch.zeros(4)
    fields = {f: 0 for f, _ in AttentionConfig.abi}
    fields["q"] = t
    k.launch(0, **fields)
    assert ctypes.c_longlong.in_dll(k._lib, "bsk_fake_last_first_field").value == t.data_ptr()


def test_cuda_error_names():
    name = runtime.cuda_error_name(1)
    assert "cudaErrorInvalidValue" in name or name == "cudaError 1"
    assert runtime.cuda_error_name(987654) == "cudaError 987654"


def test_wrong_kernel_name_refused(fake_nvcc, tmp_path):
    e = kernels.ensure_built(AttentionConfig())
    with pytest.raises(Exception, match="stale artifact"):
        runtime.CompiledKernel(e.so_path, get_config("bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"))


def test_check_device():
    cfg = get_config("bsk_sm90a_attn_fwd_d128_fp16_t128x128_pp_s5_b128x128")
    h100 = runtime.DeviceInfo(0, "NVIDIA H100", (9, 0), 132, 232448)
    assert runtime.check_device(cfg, h100) is h100
    with pytest.raises(InvalidConfigError, match=r"sm90a .*compute capability 9\.0.*is 8\.0"):
        runtime.check_device(cfg, runtime.DeviceInfo(0, "NVIDIA A100", (8, 0), 108, 166912))
    with pytest.raises(InvalidConfigError, match="is 10.0"):
        runtime.check_device(cfg, runtime.DeviceInfo(0, "NVIDIA B200", (10, 0), 148, 232448))
    with pytest.raises(InvalidConfigError, match="shared memory"):
        runtime.check_device(cfg, runtime.DeviceInfo(0, "small", (9, 0), 132, 100000))


def test_device_info_without_gpu_is_a_clear_error():
    try:
        info = runtime.device_info(0)
    except CudaError as e:
        assert str(e)
    else:  # a machine with a GPU
        assert info.sm_count > 0 and info.smem_optin > 0


# -- the real nvcc ---------------------------------------------------------------------------------------------

def _require_toolchain():
    try:
        nvcc = compiler.find_nvcc()
        compiler.nvcc_version(nvcc)
        compiler.cutlass_paths()
    except ToolchainError as e:
        pytest.skip(f"real nvcc compile needs nvcc and CUTLASS: {e}")
    return nvcc


STUB_HEADER = r"""
#pragma once
// Minimal stand-in for bsk/attn_fwd.hpp: checks the thin template, the flags and the link line with the real nvcc.
#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>
namespace bsk {
template <class Element, int HeadDim, int TileM, int TileN, int Stages, int QStages, int BlockM, int BlockN,
          bool Persistent, int CtasPerSm>
struct AttnFwdTraits {
  struct Kernel { static constexpr int kSmem = (TileM + Stages * TileN) * HeadDim * int(sizeof(Element)); };
};
template <class Name> __global__ void stub_kernel(float* p) { if (p) p[threadIdx.x] = 1.f; }
template <class Traits, class Name, class Args>
int attn_fwd_launch(const Args& args, cudaStream_t stream) {
  stub_kernel<Name><<<1, 32, 0, stream>>>(args.lse);
  return int(cudaGetLastError());
}
template <class Traits, class Name> int attn_fwd_smem_bytes() { return Name::kSmem; }
}  // namespace bsk
"""


def _exported_symbols(so: Path) -> str:
    nm = shutil.which("nm")
    if nm is None:
        return ""
    return subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout


def _assert_fresh_kernel_artifact(cfg, e):
    """A just-built entry: a non-empty .so exporting the launcher ABI and carrying the kernel's name."""
    assert e.built and e.so_path.stat().st_size > 0
    syms = _exported_symbols(e.so_path)
    if syms:
        for s in ("bsk_launch", "bsk_kernel_name", "bsk_smem_bytes"):
            assert s in syms
    assert cfg.kernel_name.encode() in e.so_path.read_bytes()


@pytest.mark.real_compile
def test_real_compile_pipeline_with_stub_header(bsk_cache, tmp_path, monkeypatch):
    """The real nvcc on the real template, with a tiny stand-in for the kernel header (a few seconds)."""
    _require_toolchain()
    inc = tmp_path / "include"
    (inc / "bsk").mkdir(parents=True)
    (inc / "bsk" / "attn_fwd.hpp").write_text(STUB_HEADER)
    monkeypatch.setattr(compiler, "include_dir", lambda: inc)
    cfg = get_config("bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128")
    e = kernels.ensure_built(cfg, progress=False)
    _assert_fresh_kernel_artifact(cfg, e)
    meta = json.loads((e.path / "meta.json").read_text())
    assert "-gencode=arch=compute_90a,code=sm_90a" in meta["flags"]
    assert kernels.ensure_built(cfg).built is False


@pytest.mark.real_compile
@pytest.mark.slow
def test_real_compile_sm90a_kernel(bsk_cache):
    """The real nvcc on one generated kernel with the real templates/include/bsk/attn_fwd.hpp."""
    _require_toolchain()
    header = compiler.include_dir() / "bsk" / "attn_fwd.hpp"
    if not header.is_file():
        pytest.skip(f"{header} is not written yet")
    cfg = get_config("bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s5_b128x128")
    e = kernels.ensure_built(cfg)  # raises KernelCompileError with the first nvcc errors on failure
    _assert_fresh_kernel_artifact(cfg, e)
    # the config's shared-memory model may round up (alignment), never under the kernel's SharedStorage
    assert cfg.smem_bytes() - 1024 < kernels.build(cfg).smem_bytes <= cfg.smem_bytes()
    # No GNU-unique symbol of ours (a function-local static in a template or inline function): the dynamic loader
    # merges those across libraries even under RTLD_LOCAL, so two builds of one kernel name in a process would
    # share them (it happened with the launcher's "attribute already set" flags).
    unique = [ln for ln in _exported_symbols(e.so_path).splitlines() if ln.split()[1:2] == ["u"] and "3bsk" in ln]
    assert not unique, unique
    print(f"\n{cfg.kernel_name}: compiled in {e.meta['build_seconds']:.1f}s, "
          f"{e.so_path.stat().st_size / 1e6:.2f} MB ({os.cpu_count()} CPUs)")


@pytest.mark.real_compile
@pytest.mark.slow
def test_real_compile_dual_three_streams(bsk_cache):
    """The dual shell with three streams (512 threads, 160 registers a consumer): it compiles, and the config's
    shared-memory model (three 1024-aligned stream slices plus barriers) holds the compiled SharedStorage."""
    _require_toolchain()
    cfg = get_config("bsk_sm90a_attn_fwd_d64_fp16_t64x64_dual3_s7_b64x64")
    assert cfg.streams == 3
    e = kernels.ensure_built(cfg)
    _assert_fresh_kernel_artifact(cfg, e)
    assert cfg.smem_bytes() - 1024 < kernels.build(cfg).smem_bytes <= cfg.smem_bytes()
