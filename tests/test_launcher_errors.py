"""CPU test: the launchers' own return codes (beyond cudaError_t's range) have names and meanings in Python, equal
to the enum the kernel headers declare, and a failed launch says them instead of "cudaError 10001"."""
from __future__ import annotations

import re

import pytest

from blackwell_sparsek.jit import kernels
from blackwell_sparsek._paths import include_dir
from blackwell_sparsek.families.attn_fwd import AttentionConfig
from blackwell_sparsek.errors import CudaError
from blackwell_sparsek.jit.runtime import LAUNCHER_ERRORS


def test_launcher_error_codes_have_names(fake_nvcc):
    declared = {}  # the launchers' enum, wherever the headers declare it
    for header in sorted(include_dir().rglob("*.hpp")):
        declared.update({int(v): n for n, v in re.findall(r"\b(kErr\w+)\s*=\s*(\d+)", header.read_text())})
    assert {10001, 10002, 10003} <= declared.keys()
    for code, name in declared.items():  # every code a launcher returns has its name in Python
        assert LAUNCHER_ERRORS[code][0] == name
    kernel = kernels.build(AttentionConfig())
    fields = {f: 0 for f, _ in AttentionConfig.abi}
    for code, (name, _) in LAUNCHER_ERRORS.items():
        with pytest.raises(CudaError, match=f"{name} \\(launcher code {code}\\): ") as ei:
            kernel.launch(code, **fields)  # the fake launcher returns the stream handle as its error code
        assert f"cudaError {code}" not in str(ei.value) and ei.value.code == code
