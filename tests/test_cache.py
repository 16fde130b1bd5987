"""The on-disk cache with a fake nvcc: keys, hits, concurrency, corruption, failures, BSK_DISABLE_JIT. CPU only."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from blackwell_sparsek import BskError, JitDisabledError, KernelCompileError
from blackwell_sparsek.jit import kernels, compiler
from blackwell_sparsek.families.attn_fwd import AttentionConfig
from blackwell_sparsek.jit.spec import get_config

NAME = "bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"


@pytest.fixture
def cfg():
    return get_config(NAME)


# -- keys ------------------------------------------------------------------------------------------------------

def test_key_covers_every_input(fake_nvcc, cfg, monkeypatch):
    base = kernels.cache_key(cfg)
    assert len(base) == 64 and base == kernels.cache_key(cfg)

    # another nvcc version string
    real_version = compiler.nvcc_version
    monkeypatch.setattr(compiler, "nvcc_version", lambda nvcc: real_version(nvcc) + "\nBuild 2")
    assert kernels.cache_key(cfg) != base
    monkeypatch.setattr(compiler, "nvcc_version", real_version)
    assert kernels.cache_key(cfg) == base

    # flags
    monkeypatch.setenv("BSK_LINEINFO", "1")
    assert "-lineinfo" in compiler.nvcc_flags(cfg.arch)
    lineinfo = kernels.cache_key(cfg)
    assert lineinfo != base
    monkeypatch.delenv("BSK_LINEINFO")
    monkeypatch.setenv("BSK_NVCC_FLAGS", "-Xptxas -v")
    assert kernels.cache_key(cfg) not in (base, lineinfo)
    monkeypatch.delenv("BSK_NVCC_FLAGS")
    assert kernels.cache_key(cfg) == base

    # the template's output, our headers, CUTLASS, the package version, the config
    src = kernels.render(cfg)
    assert kernels.cache_key(cfg, source=src + "\n// edited template\n") != base
    with monkeypatch.context() as m:
        m.setattr(compiler, "headers_hash", lambda *a, **k: "0" * 64)
        assert kernels.cache_key(cfg) != base
    assert kernels.cache_key(cfg) == base
    fp = compiler.toolchain_fingerprint(cfg)
    assert kernels.cache_key(cfg, fingerprint={**fp, "cutlass_version": "9.9.9"}) != kernels.cache_key(cfg, fingerprint=fp)
    assert kernels.cache_key(cfg, fingerprint={**fp, "cutlass_tree": "x"}) != kernels.cache_key(cfg, fingerprint=fp)
    other = dataclasses.replace(cfg, stages=5)
    assert kernels.cache_key(other, fingerprint=fp) != kernels.cache_key(cfg, fingerprint=fp)


def test_package_version_changes_key(fake_nvcc, cfg, monkeypatch):
    src = kernels.render(cfg)
    fp = compiler.toolchain_fingerprint(cfg)
    k1 = kernels.cache_key(cfg, src, fp)
    monkeypatch.setattr(kernels, "__version__", "999.0")
    assert kernels.cache_key(cfg, src, fp) != k1


def test_fingerprint_contents(fake_nvcc, cfg):
    fp = compiler.toolchain_fingerprint(cfg)
    assert "release 99.9" in fp["nvcc_version"]  # the full --version text, not a parsed number
    assert fp["cutlass_version"].count(".") == 2
    assert "-lcuda" not in fp["flags"] and cfg.arch.gencode in fp["flags"]
    assert len(fp["bsk_headers"]) == 64 and len(fp["cutlass_tree"]) == 64


# -- build, hit, load ------------------------------------------------------------------------------------------

def test_build_then_hits(fake_nvcc, cfg, bsk_cache, clean_cwd):
    k = kernels.build(cfg)
    assert fake_nvcc.count() == 1
    assert k.kernel_name == cfg.kernel_name and k.smem_bytes == 4242
    entry_dir = k.so_path.parent
    assert entry_dir.parent == bsk_cache
    key = k.meta["key"]
    assert entry_dir.name == f"{cfg.kernel_name}-{key[:16]}"
    assert {"kernel.cu", "kernel.so", "meta.json"} <= {p.name for p in entry_dir.iterdir()}
    assert (entry_dir / "kernel.cu").read_text() == kernels.render(cfg)
    meta = json.loads((entry_dir / "meta.json").read_text())
    for field in ("key", "config", "kernel_name", "artifact_sha256", "artifact_size", "flags", "nvcc_version",
                  "cutlass_version", "package_version", "build_seconds", "created"):
        assert field in meta, field
    assert meta["config"] == cfg.to_dict()
    # nvcc ran inside the staging dir, never in the caller's cwd
    pid, cwd = fake_nvcc.calls()[0].split(" ", 1)
    assert "/.staging/" in cwd and cwd.startswith(str(bsk_cache))
    assert not any((bsk_cache / ".staging").iterdir())

    # in-process repeat: O(1)
    t0 = time.perf_counter()
    again = kernels.build(cfg)
    assert time.perf_counter() - t0 < 0.02
    assert again is k

    # a new process-level lookup (ensure_built reads the disk): no compile
    kernels.clear_loaded()
    e = kernels.ensure_built(cfg)
    assert not e.built and e.path == entry_dir
    assert fake_nvcc.count() == 1


def test_warm_hit_in_fresh_process_is_fast(fake_nvcc, cfg, bsk_cache, child_env, tmp_path):
    kernels.ensure_built(cfg)
    code = (
        "import time, json\n"
        "from blackwell_sparsek.jit.spec import get_config\n"
        "from blackwell_sparsek.jit.kernels import build\n"
        f"c = get_config({NAME!r})\n"
        "t0 = time.perf_counter(); k = build(c); t1 = time.perf_counter(); build(c); t2 = time.perf_counter()\n"
        "print(json.dumps({'first': t1 - t0, 'repeat': t2 - t1, 'name': k.kernel_name}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["name"] == cfg.kernel_name
    assert r["first"] < 1.0, r
    assert r["repeat"] < 0.02, r
    assert fake_nvcc.count() == 1


_WORKER = """
import json, sys
from blackwell_sparsek.jit.kernels import build
from blackwell_sparsek.jit.spec import get_config
k = build(get_config(sys.argv[1]))
print(json.dumps({"so": str(k.so_path), "name": k.kernel_name, "smem": k.smem_bytes}))
"""


def test_eight_processes_compile_once(fake_nvcc, cfg, bsk_cache, child_env, tmp_path):
    env = child_env(BSK_FAKE_NVCC_SLEEP="1")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, NAME], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert fake_nvcc.count() == 1, fake_nvcc.calls()
    assert len({r["so"] for r in results}) == 1
    assert {r["name"] for r in results} == {cfg.kernel_name}
    assert {r["smem"] for r in results} == {4242}
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".cu", ".so", ".c")]  # children's cwd untouched


def test_threads_in_one_process_compile_once(fake_nvcc, cfg, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setenv("BSK_FAKE_NVCC_SLEEP", "0.5")
    with ThreadPoolExecutor(4) as pool:
        entries = list(pool.map(lambda _: kernels.ensure_built(cfg, progress=False), range(4)))
    assert fake_nvcc.count() == 1
    assert len({e.path for e in entries}) == 1
    assert sum(e.built for e in entries) == 1


# -- corruption ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate_so", "garbage_so", "delete_so", "garbage_meta", "delete_meta",
                                    "wrong_key"])
def test_corrupt_entry_is_rebuilt(fake_nvcc, cfg, damage):
    e = kernels.ensure_built(cfg)
    so, meta = e.path / "kernel.so", e.path / "meta.json"
    if damage == "truncate_so":
        with open(so, "r+b") as f:
            f.truncate(so.stat().st_size // 2)
    elif damage == "garbage_so":
        data = bytearray(so.read_bytes())
        data[len(data) // 2] ^= 0xFF
        so.write_bytes(bytes(data))
    elif damage == "delete_so":
        so.unlink()
    elif damage == "garbage_meta":
        meta.write_text("{not json")
    elif damage == "delete_meta":
        meta.unlink()
    elif damage == "wrong_key":
        m = json.loads(meta.read_text())
        m["key"] = "0" * 64
        meta.write_text(json.dumps(m))
    kernels.clear_loaded()
    e2 = kernels.ensure_built(cfg)
    assert e2.built and e2.path == e.path
    assert fake_nvcc.count() == 2
    k = kernels.build(cfg)  # loads fine
    assert k.kernel_name == cfg.kernel_name
    assert kernels.verify_entry(e.path, e.key) is not None


# -- failures --------------------------------------------------------------------------------------------------

def test_failed_compile_is_reported_and_not_cached(fake_nvcc, cfg, bsk_cache, monkeypatch, capsys):
    monkeypatch.setenv("BSK_FAKE_NVCC_FAIL", "1")
    with pytest.raises(KernelCompileError) as ei:
        kernels.build(cfg)
    err = ei.value
    msg = str(err)
    assert cfg.kernel_name in msg
    assert 'error: identifier "bsk_oops" is undefined' in msg
    assert "repro: cd " in msg and "kernel.cu -o kernel.so" in msg
    kept = err.build_dir
    assert kept.is_dir() and kept.parent == bsk_cache / "failed"
    assert str(kept) in msg
    assert {"kernel.cu", "command.sh", "nvcc.log"} <= {p.name for p in kept.iterdir()}
    assert "bsk_oops" in (kept / "nvcc.log").read_text()
    assert err.kernel_name == cfg.kernel_name and err.repro.startswith(f"cd {kept}")
    assert str(kept) in capsys.readouterr().err  # the kept path is printed
    # nothing cached, nothing left staging
    assert kernels.cache_ls() == []
    assert not any((bsk_cache / ".staging").iterdir())
    # the failure is not remembered: the next call compiles again
    monkeypatch.delenv("BSK_FAKE_NVCC_FAIL")
    k = kernels.build(cfg)
    assert k.kernel_name == cfg.kernel_name
    assert fake_nvcc.count() == 2
    assert len(kernels.failed_builds()) == 1


def test_repro_command_works(fake_nvcc, cfg, monkeypatch):
    monkeypatch.setenv("BSK_FAKE_NVCC_FAIL", "1")
    with pytest.raises(KernelCompileError) as ei:
        kernels.ensure_built(cfg)
    monkeypatch.delenv("BSK_FAKE_NVCC_FAIL")
    r = subprocess.run(ei.value.repro, shell=True, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ei.value.build_dir / "kernel.so").is_file()
    r = subprocess.run(["sh", str(ei.value.build_dir / "command.sh")], capture_output=True, text=True,
                       cwd=os.path.expanduser("~"))
    assert r.returncode == 0, r.stderr


def test_lock_timeout_is_clear(fake_nvcc, cfg, bsk_cache, monkeypatch):
    key = kernels.cache_key(cfg)
    (bsk_cache / "locks").mkdir(parents=True)
    monkeypatch.setenv("BSK_LOCK_TIMEOUT", "0.3")
    code = ("import filelock, sys, time\n"
            "l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(bsk_cache / "locks" / f"{key}.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BskError, match="BSK_LOCK_TIMEOUT"):
            kernels.ensure_built(cfg)
    finally:
        holder.kill()
        holder.wait()
    assert fake_nvcc.count() == 0


# -- BSK_DISABLE_JIT --------------------------------------------------------------------------------------------

def test_disable_jit_refuses_to_compile(fake_nvcc, cfg, monkeypatch):
    monkeypatch.setenv("BSK_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError, match="BSK_DISABLE_JIT=1") as ei:
        kernels.build(cfg)
    assert "python -m blackwell_sparsek build" in str(ei.value)
    assert fake_nvcc.count() == 0


def test_disable_jit_uses_prebuilt(fake_nvcc, cfg, monkeypatch, tmp_path):
    built = kernels.ensure_built(cfg)
    kernels.clear_loaded()
    monkeypatch.setenv("BSK_DISABLE_JIT", "1")
    assert kernels.build(cfg).so_path == built.so_path
    # a deployment machine without nvcc: found by config + source
    kernels.clear_loaded()
    compiler.clear_memos()
    monkeypatch.setenv("BSK_NVCC", str(tmp_path / "no-such-nvcc"))
    assert kernels.build(cfg).so_path == built.so_path
    other = dataclasses.replace(cfg, stages=5)
    with pytest.raises(JitDisabledError, match="toolchain is unusable"):
        kernels.build(other)
    monkeypatch.delenv("BSK_DISABLE_JIT")
    with pytest.raises(compiler.ToolchainError, match="BSK_NVCC"):
        kernels.build(other)
    assert fake_nvcc.count() == 1


# -- housekeeping ----------------------------------------------------------------------------------------------

def test_cache_ls_and_clear(fake_nvcc, bsk_cache):
    a = kernels.ensure_built(get_config(NAME))
    b = kernels.ensure_built(AttentionConfig())
    ls = kernels.cache_ls()
    assert {e["kernel_name"] for e in ls} == {a.kernel_name, b.kernel_name}
    assert all(e["valid"] and e["so_bytes"] > 0 for e in ls)
    assert len(kernels.cache_clear().removed) == 2
    assert kernels.cache_ls() == []
    kernels.ensure_built(AttentionConfig())
    assert fake_nvcc.count() == 3


def test_cache_root_default(monkeypatch, tmp_path):
    monkeypatch.delenv("BSK_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kernels.cache_root() == tmp_path / ".cache" / "blackwell_sparsek"
    monkeypatch.setenv("BSK_CACHE_DIR", str(tmp_path / "x"))
    assert kernels.cache_root() == tmp_path / "x"
