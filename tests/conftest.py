"""Shared fixtures: an isolated cache, a fake nvcc that builds real shared objects fast, a clean tmp cwd.

Nothing here needs a GPU. The fake nvcc (BSK_NVCC) answers ``--version``, counts its compile invocations in a
file, optionally sleeps or fails, and turns the generated kernel.cu into a real ``.so`` with ``cc -shared -fPIC``
exporting ``bsk_kernel_name`` (the name parsed from the source), ``bsk_smem_bytes`` and ``bsk_launch`` (which
returns the stream handle as its error code and records the first struct field), so ctypes can load and call it.
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FAKE_NVCC = r"""#!/bin/sh
# fake nvcc for the BlackwellSparseK test suite
if [ "$1" = "--version" ]; then
  printf 'nvcc: fake NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 99.9, V99.9.1\n'
  exit 0
fi
echo "$$ $(pwd)" >> "@COUNT@"
out=""; src=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift ;;
    *.cu) src="$1" ;;
  esac
  shift
done
sleep "${BSK_FAKE_NVCC_SLEEP:-0}"
if [ -n "${BSK_FAKE_NVCC_FAIL:-}" ]; then
  echo "kernel.cu(7): error: identifier \"bsk_oops\" is undefined"
  echo "          detected during instantiation of \"bsk::attn_fwd_launch\""
  echo "1 error detected in the compilation of \"kernel.cu\"."
  exit 2
fi
name=$(sed -n 's/.*bsk_kernel_name() { return "\([^"]*\)".*/\1/p' "$src")
cat > fake_kernel.c <<EOF
long long bsk_fake_last_first_field = 0;
const char* bsk_kernel_name(void) { return "$name"; }
int bsk_smem_bytes(void) { return 4242; }
int bsk_launch(const void* args, void* stream) {
  bsk_fake_last_first_field = *(const long long*)args;
  return (int)(long)stream;
}
EOF
exec cc -shared -fPIC -o "$out" fake_kernel.c
"""


class FakeNvcc:
    def __init__(self, directory: Path):
        self.dir = directory
        self.path = directory / "nvcc"
        self.count_file = directory / "invocations.txt"
        self.path.write_text(FAKE_NVCC.replace("@COUNT@", str(self.count_file)))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def calls(self) -> list[str]:
        return self.count_file.read_text().splitlines() if self.count_file.exists() else []

    def count(self) -> int:
        return len(self.calls())


def _reset_process_state() -> None:
    from blackwell_sparsek.jit import compiler, kernels
    kernels.clear_loaded()
    compiler.clear_memos()


@pytest.fixture
def bsk_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty cache root (BSK_CACHE_DIR) and fresh in-process memos."""
    root = tmp_path / "bsk-cache"
    monkeypatch.setenv("BSK_CACHE_DIR", str(root))
    for var in ("BSK_DISABLE_JIT", "BSK_LINEINFO", "BSK_NVCC_FLAGS", "BSK_VERBOSE", "BSK_LOCK_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    _reset_process_state()
    yield root
    _reset_process_state()


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch, bsk_cache) -> FakeNvcc:
    """BSK_NVCC pointing at the fake compiler (needs a C compiler for the .so it makes)."""
    if shutil.which("cc") is None:
        pytest.skip("the fake nvcc needs a C compiler 'cc' to make a loadable shared object")
    d = tmp_path / "fake-cuda"
    d.mkdir()
    fake = FakeNvcc(d)
    monkeypatch.setenv("BSK_NVCC", str(fake.path))
    monkeypatch.delenv("BSK_FAKE_NVCC_FAIL", raising=False)
    monkeypatch.delenv("BSK_FAKE_NVCC_SLEEP", raising=False)
    return fake


@pytest.fixture
def clean_cwd(tmp_path, monkeypatch) -> Path:
    """Run in an empty directory and fail the test if anything was written there."""
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    yield d
    left = sorted(p.name for p in d.iterdir())
    assert left == [], f"files written into the working directory: {left}"


@pytest.fixture
def child_env():
    """``child_env(**extra)``: the current environment (as set up by the other fixtures at call time) for child
    Python processes that import this checkout."""
    def make(**extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        env.update(extra)
        return env
    return make


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny tensors: more threads only add contention on a busy CI box."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def poison_outputs(monkeypatch):
    """BSK_POISON=1 for a GPU test: every output is NaN-filled before its kernel runs, so an unwritten element fails
    the check. The GPU modules take it through their pytestmark; a test may set BSK_POISON=0 itself."""
    monkeypatch.setenv("BSK_POISON", "1")
