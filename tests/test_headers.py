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
