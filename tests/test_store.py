"""The artifact store's trust rules and housekeeping (issues 24 and 28), with a fake nvcc. CPU only.

Ownership by another user is simulated by changing the set of trusted uids (so our own files look foreign) where
the test cannot chown; as root the tests also chown for real.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blackwell_sparsek import cli
from blackwell_sparsek.jit import kernels
from blackwell_sparsek.jit.spec import get_config
from blackwell_sparsek.errors import CacheError, EnvError, KernelCompileError, UnsafeCacheError
from blackwell_sparsek.jit import store, trust

NAME = "bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def cfg():
    return get_config(NAME)


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.lstat().st_mode & 0o7777
    out["."] = root.stat().st_mode & 0o7777
    return out


# -- issue 24 item 1: clear only touches what the package made ------------------------------------------------

def test_clear_leaves_foreign_directories(fake_nvcc, cfg, bsk_cache, capsys):
    e = kernels.ensure_built(cfg)
    for d in ("pip", "huggingface", "my_data", "failed/not_ours", ".staging/also_not_ours"):
        (bsk_cache / d).mkdir(parents=True)
        (bsk_cache / d / "keep.txt").write_text("user data")
    (bsk_cache / "notes.txt").write_text("user file")
    lookalike = bsk_cache / f"{cfg.kernel_name}-0123456789abcdef"  # entry-shaped, but no meta.json
    lookalike.mkdir()
    (lookalike / "kernel.so").write_text("not ours")
    entries, foreign = store.ls()
    assert [x["path"] for x in entries] == [str(e.path)]
    assert {"pip", "huggingface", "my_data", "notes.txt", lookalike.name} <= set(foreign)

    assert cli.main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 entries" in out and "left alone" in out and "huggingface" in out
    assert not e.path.exists()
    for d in ("pip", "huggingface", "my_data", "failed/not_ours", ".staging/also_not_ours"):
        assert (bsk_cache / d / "keep.txt").read_text() == "user data"
    assert (bsk_cache / "notes.txt").is_file() and (lookalike / "kernel.so").is_file()


def test_clear_reports_what_it_could_not_remove(fake_nvcc, cfg, bsk_cache, monkeypatch, capsys):
    kernels.ensure_built(cfg)

    def failing_rmtree(path, onerror=None, **kw):
        onerror(os.rmdir, str(path), (PermissionError, PermissionError(errno.EACCES, "Permission denied"), None))

    monkeypatch.setattr(store.shutil, "rmtree", failing_rmtree)
    assert cli.main(["cache", "clear"]) == 2
    captured = capsys.readouterr()
    assert "removed 0 entries" in captured.out and "could not remove" in captured.err


def test_clear_removes_staging_of_dead_builds(fake_nvcc, cfg, bsk_cache):
    kernels.ensure_built(cfg)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = bsk_cache / ".staging"
    gone = staging / f"{'a' * 16}-{dead.pid}-0badf00d"
    live = staging / f"{'b' * 16}-{os.getpid()}-0badf00d"
    for d in (gone, live):
        d.mkdir()
        (d / "kernel.cu").write_text("//")
    kernels.cache_clear()
    assert not gone.exists() and live.exists()


# -- issue 28: trust ---------------------------------------------------------------------------------------------

def test_world_writable_root_is_refused_before_anything_loads(fake_nvcc, cfg, bsk_cache):
    e = kernels.ensure_built(cfg)
    kernels.clear_loaded()
    os.chmod(bsk_cache, 0o777)
    with pytest.raises(UnsafeCacheError, match="writable by group or others") as ei:
        kernels.build(cfg)
    assert str(bsk_cache) in str(ei.value) and "BSK_CACHE_DIR" in str(ei.value)
    with pytest.raises(UnsafeCacheError):
        kernels.cache_ls()
    with pytest.raises(UnsafeCacheError):
        kernels.cache_clear()
    assert e.path.exists()  # clear refused: nothing removed
    os.chmod(bsk_cache, 0o700)
    assert kernels.build(cfg).kernel_name == cfg.kernel_name


def test_planted_so_in_world_writable_cache_is_refused(fake_nvcc, cfg, bsk_cache):
    e = kernels.ensure_built(cfg)           # learn the entry name and key the victim would look for
    kernels.clear_loaded()
    os.chmod(e.path, 0o777)               # an entry another user can write into
    (e.path / "kernel.so").write_bytes((e.path / "kernel.so").read_bytes())
    with pytest.raises(UnsafeCacheError, match=str(e.path)):
        kernels.build(cfg)
    os.chmod(e.path, 0o700)
    os.chmod(e.path / "kernel.so", 0o666)  # the artifact itself writable by others
    with pytest.raises(UnsafeCacheError, match="kernel.so"):
        kernels.build(cfg)


def test_entry_owned_by_another_user_is_refused(fake_nvcc, cfg, bsk_cache, monkeypatch):
    kernels.ensure_built(cfg)
    kernels.clear_loaded()
    monkeypatch.setattr(trust, "trusted_uids", lambda: {123456})  # our files now look like someone else's
    with pytest.raises(UnsafeCacheError, match="owned by uid"):
        kernels.build(cfg)


@pytest.mark.skipif(not IS_ROOT, reason="chown needs root")
def test_entry_chowned_to_another_user_is_refused(fake_nvcc, cfg, bsk_cache):
    e = kernels.ensure_built(cfg)
    kernels.clear_loaded()
    os.chown(e.path / "kernel.so", 4242, 4242)
    with pytest.raises(UnsafeCacheError, match="kernel.so.*owned by uid 4242"):
        kernels.build(cfg)


def test_umask_000_still_gives_private_modes(fake_nvcc, cfg, bsk_cache):
    old = os.umask(0)
    try:
        e = kernels.ensure_built(cfg)
        monkey_fail = os.environ.get("BSK_FAKE_NVCC_FAIL")
        os.environ["BSK_FAKE_NVCC_FAIL"] = "1"
        try:
            with pytest.raises(KernelCompileError):
                kernels.ensure_built(get_config("bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s5_b128x128"))
        finally:
            if monkey_fail is None:
                os.environ.pop("BSK_FAKE_NVCC_FAIL")
    finally:
        os.umask(old)
    modes = _modes(bsk_cache)
    assert modes["."] == 0o700
    for rel, mode in modes.items():
        p = bsk_cache / rel
        if p.is_dir():
            assert mode == 0o700, (rel, oct(mode))
        else:
            assert mode in (0o600, 0o700), (rel, oct(mode))
    assert modes[str((e.path / "meta.json").relative_to(bsk_cache))] == 0o600
    assert any(rel.startswith("failed/") for rel in modes)


@pytest.mark.skipif(not IS_ROOT, reason="needs root-owned files")
def test_root_owned_read_only_cache_is_accepted(fake_nvcc, cfg, bsk_cache):
    e = kernels.ensure_built(cfg)
    kernels.clear_loaded()
    for dirpath, dirnames, filenames in os.walk(bsk_cache):
        os.chmod(dirpath, 0o555)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o444)
    try:
        k = kernels.build(cfg)
        assert k.so_path == e.so_path
        assert [x["kernel_name"] for x in kernels.cache_ls(verify=True)] == [cfg.kernel_name]
    finally:
        for dirpath, dirnames, filenames in os.walk(bsk_cache):
            os.chmod(dirpath, 0o700)


def test_read_only_cache_without_the_kernel_is_a_typed_error(fake_nvcc, cfg, bsk_cache, monkeypatch):
    bsk_cache.mkdir(mode=0o700)
    real_mkdir = Path.mkdir

    def no_write(self, *a, **k):
        if str(self).startswith(str(bsk_cache)) and self != bsk_cache:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", no_write)
    with pytest.raises(CacheError, match="read-only"):
        kernels.build(cfg)
    assert fake_nvcc.count() == 0


def test_cache_dir_that_is_a_file(tmp_path, monkeypatch, fake_nvcc, cfg):
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("BSK_CACHE_DIR", str(f))
    with pytest.raises(CacheError, match="is a file"):
        kernels.build(cfg)
    assert cli.main(["cache", "ls"]) == 2  # one line, exit 2


def test_user_given_ex88_binary_must_be_private(tmp_path, monkeypatch):
    from blackwell_sparsek.bench import ex88
    d = tmp_path / "bin"
    d.mkdir()
    b = d / "88_hopper_fmha"
    b.write_text("#!/bin/sh\necho hi\n")
    os.chmod(b, 0o755)
    monkeypatch.setenv("BSK_EX88_BIN", str(b))
    assert ex88.locate(build_if_missing=False) == b
    os.chmod(d, 0o777)
    with pytest.raises(UnsafeCacheError):
        ex88.locate(build_if_missing=False)


# -- issue 24 items 10, 11, 19, 22: environment, meta, locks, verify -----------------------------------------

def test_bad_environment_values_are_typed(fake_nvcc, cfg, monkeypatch):
    monkeypatch.setenv("BSK_NVCC_FLAGS", "-Xptxas '-v")
    with pytest.raises(EnvError, match="BSK_NVCC_FLAGS"):
        kernels.build(cfg)
    monkeypatch.delenv("BSK_NVCC_FLAGS")
    for bad in ("-5", "soon", "inf", "nan"):
        monkeypatch.setenv("BSK_LOCK_TIMEOUT", bad)
        with pytest.raises(EnvError, match="BSK_LOCK_TIMEOUT"):
            kernels.build(cfg)
    monkeypatch.delenv("BSK_LOCK_TIMEOUT")
    monkeypatch.setenv("BSK_DISABLE_JIT", "maybe")
    with pytest.raises(EnvError, match="BSK_DISABLE_JIT"):
        kernels.build(cfg)


def test_cache_ls_survives_odd_meta_and_verify_finds_flipped_bytes(fake_nvcc, cfg, bsk_cache, capsys):
    e = kernels.ensure_built(cfg)
    meta = json.loads((e.path / "meta.json").read_text())
    meta["build_seconds"] = "fast"
    (e.path / "meta.json").write_text(json.dumps(meta))
    assert cli.main(["cache", "ls"]) == 0
    so = e.path / "kernel.so"
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))  # same size: only the hash can tell
    assert kernels.cache_ls()[0]["valid"] is True
    assert kernels.cache_ls(verify=True)[0]["valid"] is False


def test_waiting_for_another_build_says_so(fake_nvcc, cfg, bsk_cache, monkeypatch, capsys):
    key = kernels.cache_key(cfg)
    locks = bsk_cache / "locks"
    locks.mkdir(parents=True)
    code = ("import filelock, sys, time\n"
            "l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(1.0)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(locks / f"{key}.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        kernels.ensure_built(cfg)
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert "waiting for another process building" in err and "BSK_LOCK_TIMEOUT" in err


# -- issue 24 item 18: no compiler outlives its build ------------------------------------------------------------

_SPAWNING_NVCC = r"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 99.9, V99.9.1"; exit 0; fi
sleep 300 &
echo $! > "@PIDS@/child.pid"
echo $$ > "@PIDS@/nvcc.pid"
wait
"""

_BUILDER = """
import sys
from blackwell_sparsek.jit.kernels import ensure_built
from blackwell_sparsek.jit.spec import get_config
ensure_built(get_config(sys.argv[1]), progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_killed_build_leaves_no_compiler_running(tmp_path, bsk_cache, child_env, how):
    pids = tmp_path / "pids"
    pids.mkdir()
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(_SPAWNING_NVCC.replace("@PIDS@", str(pids)))
    nvcc.chmod(0o755)
    builder = subprocess.Popen([sys.executable, "-c", _BUILDER, NAME], env=child_env(BSK_NVCC=str(nvcc)),
                               cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids / "child.pid").exists() or not (pids / "nvcc.pid").exists():
        assert time.monotonic() < deadline and builder.poll() is None, builder.stderr.read() if builder.poll() else ""
        time.sleep(0.05)
    time.sleep(0.2)
    child, fake = int((pids / "child.pid").read_text()), int((pids / "nvcc.pid").read_text())
    builder.send_signal(how)
    builder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (_alive(child) or _alive(fake)) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = [p for p in (child, fake) if _alive(p)]
    for p in leftover:
        os.kill(p, signal.SIGKILL)
    assert not leftover, f"compiler processes outlived the build killed by {how.name}"
    if how == signal.SIGTERM:  # the build unwound: no staging dir left behind
        assert not list((bsk_cache / ".staging").iterdir())


def test_compiler_killed_by_a_signal_is_named(tmp_path, bsk_cache, monkeypatch, cfg):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "release 99.9"; exit 0; fi\nkill -9 $$\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("BSK_NVCC", str(nvcc))
    with pytest.raises(KernelCompileError, match="killed by SIGKILL: most likely out of memory"):
        kernels.ensure_built(cfg)
