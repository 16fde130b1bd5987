"""The kernel headers under templates/include: size and shape rules, and the constants they share with Python.

The C++ side is parsed from the header text (no compiler needed), so a change on either side that breaks the
contract fails here on the CPU, before a kernel would misread a layout on the GPU.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from blackwell_sparsek import _paths
from blackwell_sparsek.layout import BOUNDS, FULL, RULE, BlockSparseLayout

TEMPLATES = _paths.templates_dir()
INCLUDE = TEMPLATES / "include"
HEADERS = sorted(p for p in INCLUDE.rglob("*") if p.is_file() and p.suffix in (".hpp", ".h", ".cuh"))
BLOCK_LAYOUT = INCLUDE / "bsk" / "common" / "block_layout.hpp"
MAX_LINES = 500


def _int(text: str) -> int:
    return int(text, 0)


def _constant(source: str, name: str) -> int:
    """`name = <integer literal>` from an enum or a constexpr in ``source``."""
    m = re.search(rf"\b{name}\s*=\s*(0[xX][0-9a-fA-F]+|\d+)\b", source)
    assert m, f"{name} = <integer literal> not found"
    return _int(m.group(1))


def test_headers_exist():
    assert HEADERS, f"no headers under {INCLUDE}"
    assert BLOCK_LAYOUT in HEADERS


@pytest.mark.parametrize("path", HEADERS, ids=lambda p: str(p.relative_to(INCLUDE)))
def test_header_is_short_and_says_its_role(path: Path):
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"{path.name} has {len(lines)} lines (> {MAX_LINES}): split it by role"
    assert lines and lines[0].startswith("//"), f"{path.name} must open with a comment saying its role"
    assert "#pragma once" in lines


def test_every_bsk_include_resolves():
    for src in [*HEADERS, *TEMPLATES.glob("*.j2")]:
        for inc in re.findall(r'#include\s+"(bsk/[^"]+)"', src.read_text()):
            assert (INCLUDE / inc).is_file(), f"{src.name} includes {inc}, which does not exist"


def test_block_kinds_match_python():
    src = BLOCK_LAYOUT.read_text()
    assert (_constant(src, "kBlockFull"), _constant(src, "kBlockBounds"), _constant(src, "kBlockRule")) == \
        (FULL, BOUNDS, RULE)


def test_schedule_packing_constants_are_consistent():
    src = BLOCK_LAYOUT.read_text()
    shift, mask = _constant(src, "kSchedKindShift"), _constant(src, "kSchedColMask")
    assert mask == (1 << shift) - 1
    assert (BOUNDS | RULE) << shift < 1 << 31, "every kind must fit above the column in a non-negative int32"


def _layouts_with_partial_first_blocks() -> list[BlockSparseLayout]:
    return [
        # Rows starting at a RULE block past column 0 (and a FULL one at column 0), several heads' worth of rows.
        BlockSparseLayout.sliding_window(seq_q=1000, window=300, block_m=128, block_n=128),
        # One row whose only block is column 7, BOUNDS | RULE: seq_k % 128 != 0, bottom-right aligned window.
        BlockSparseLayout.sliding_window(seq_q=100, seq_k=1020, window=10, block_m=128, block_n=128),
    ]


def test_row_schedule_packing_matches_header():
    """first == column | kind << shift of each row's first block, with the header's shift and mask."""
    src = BLOCK_LAYOUT.read_text()
    shift, mask = _constant(src, "kSchedKindShift"), _constant(src, "kSchedColMask")
    seen = set()
    for lay in _layouts_with_partial_first_blocks():
        sched = lay.row_schedule()
        assert sched.dtype == torch.int32 and sched.shape == (lay.num_heads, lay.n_qblocks, 4)
        for h in range(lay.num_heads):
            for row, start, end, first in sched[h].tolist():
                assert lay.row_ptr[h, row].item() == start and lay.row_ptr[h, row + 1].item() == end
                if end == start:
                    assert first == 0
                    continue
                col = int(lay.col_idx[h, start])
                kind = int(lay.block_kind[h, start])
                assert first == col | kind << shift, (row, col, kind, first)
                assert first & mask == col and first >> shift == kind  # the kernel's sched_col / sched_kind
                seen.add((col > 0, kind))
    assert {(True, RULE), (True, BOUNDS | RULE), (False, FULL)} <= seen, seen


def test_kernel_decodes_with_the_header_constants():
    """The device decode uses the named constants, not literals that could drift from them."""
    src = BLOCK_LAYOUT.read_text()
    assert re.search(r"first\s*&\s*kSchedColMask", src)
    assert re.search(r">>\s*kSchedKindShift", src)


_FORBIDDEN = [
    (re.compile(r"#\s*if(?:n?def)?\b.*\bBSK_"), "an #if on a BSK_ macro (experiment switch outside the config)"),
    (re.compile(r"\bBSK_T(?:R|L|RACE)\w*"), "trace instrumentation"),
    (re.compile(r"\bbsk_(?:trace|loop)_\w+"), "a trace buffer or dump function"),
]


@pytest.mark.parametrize("path", [*HEADERS, *sorted(TEMPLATES.glob("*.j2"))], ids=lambda p: p.name)
def test_no_experiment_switch_or_trace(path: Path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        for pattern, what in _FORBIDDEN:
            assert not pattern.search(line), f"{path.name}:{n}: {what}: {line.strip()}"


# -- the launcher's argument checks, through a real build of the header (real_compile) -------------------------
# Every check runs before the launcher's first CUDA call, so a rejected argument set is safe to pass on any
# machine; a set that passes goes on to cudaGetDevice, which fails without a GPU (and would launch with one).

LAUNCH_CODES = {"bad_head_dim": 10001, "stride_range": 10002, "bad_shape": 10003, "misaligned": 10004}


def test_launcher_error_codes_are_the_documented_ones():
    src = (INCLUDE / "bsk" / "common" / "launch.hpp").read_text()
    for name, code in (("kErrBadHeadDim", 10001), ("kErrStrideRange", 10002), ("kErrBadShape", 10003),
                       ("kErrMisaligned", 10004)):
        assert _constant(src, name) == code


def _long_context_args(H=16, S=1 << 20, D=128):
    """Launch fields of a (1, H, S, D) bf16 attention with a shared 2K-window layout; fake, aligned pointers."""
    return dict(
        q=1 << 20, k=2 << 20, v=3 << 20, o=4 << 20, lse=5 << 20, col_idx=6 << 20, block_kind=7 << 20,
        row_sched=8 << 20, batch=1, heads=H, heads_kv=H, seq_q=S, seq_k=S, head_dim=D,
        q_stride_b=H * S * D, q_stride_h=S * D, q_stride_s=D, k_stride_b=H * S * D, k_stride_h=S * D, k_stride_s=D,
        v_stride_b=H * S * D, v_stride_h=S * D, v_stride_s=D, o_stride_b=H * S * D, o_stride_h=S * D, o_stride_s=D,
        lse_stride_b=H * S, lse_stride_h=S, layout_heads=1, n_qblocks=S // 128, n_kblocks=S // 128, col_stride=17,
        window_left=2047, window_right=0, scale=0.088, sm_count=132, rank_major=1, ws_o=0, ws_lse=0, n_pieces=0,
        split_k=0, counter=0)


_TMA_MAX_ELEMS = (1 << 39) - 8  # bf16: the largest 16-byte multiple below 2^40 bytes

_REJECTED = [
    ({"head_dim": 64}, "bad_head_dim"),
    ({"q_stride_b": 1 << 39}, "stride_range"),           # 2^40 bytes: past TMA's stride limit
    ({"o_stride_s": 129}, "stride_range"),               # not a multiple of 16 bytes
    ({"k_stride_h": -128}, "stride_range"),
    ({"lse_stride_b": 1 << 31}, "stride_range"),         # the device reads LSE strides as int32
    ({"q": (1 << 20) + 8}, "misaligned"),
    ({"row_sched": (8 << 20) + 4}, "misaligned"),
    ({"heads_kv": 3}, "bad_shape"),                      # 16 % 3 != 0
    ({"n_qblocks": (1 << 20) // 128 - 1}, "bad_shape"),  # the layout does not cover seq_q
    ({"layout_heads": 2}, "bad_shape"),                  # neither shared nor one per head
    ({"seq_q": (1 << 31) - 1, "seq_k": 1 << 30, "n_qblocks": 1 << 24}, "bad_shape"),  # int32 positions
    ({"batch": 1 << 14, "heads": 1 << 10, "heads_kv": 1 << 10, "n_qblocks": 1 << 13}, "bad_shape"),  # 2^37 tiles
]
_ACCEPTED = [
    {},                                                   # (1, 16, 1M, 128): batch stride 2^31 (was code 10002)
    _long_context_args(H=32),                             # (1, 32, 1M, 128): 2^32 elements
    {"q_stride_b": _TMA_MAX_ELEMS},
    {"window_left": (1 << 31) - 1, "window_right": (1 << 31) - 1},  # clamped, not rejected
]


@pytest.mark.real_compile
@pytest.mark.slow
def test_launcher_checks_arguments_before_any_cuda_call(bsk_cache):
    import blackwell_sparsek as bsk
    from blackwell_sparsek.jit import compiler
    from blackwell_sparsek.errors import BskError, ToolchainError

    try:
        compiler.nvcc_version(compiler.find_nvcc())
        compiler.cutlass_paths()
    except ToolchainError as e:
        pytest.skip(f"needs nvcc and CUTLASS: {e}")
    kernel = bsk.build(bsk.get_config("bsk_sm90a_attn_fwd_d128_bf16_t128x128_coop_s5_b128x128"))

    def code(fields):
        try:
            kernel.launch(0, **fields)
        except BskError as e:
            return getattr(e, "code", None)
        return 0

    base = _long_context_args()
    for change, want in _REJECTED:
        assert code({**base, **change}) == LAUNCH_CODES[want], change
    if torch.cuda.is_available():
        return  # valid fields would launch on fake pointers; tests/test_long_context_gpu.py runs these for real
    for change in _ACCEPTED:
        got = code({**base, **change})
        assert got not in LAUNCH_CODES.values(), (change, got)  # past every check, stopped at cudaGetDevice
