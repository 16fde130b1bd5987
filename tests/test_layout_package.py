"""The layout package's shape (issue 25 item 4): one concern per module, generic BSR code free of the attention
rule, the public names where users import them, and pickles of the pre-split module still loading."""
from __future__ import annotations

import ast
import io
import pickle
from pathlib import Path

import torch

import blackwell_sparsek
import blackwell_sparsek.layout as layout_pkg
from blackwell_sparsek.layout import BOUNDS, FULL, RULE, BlockSparseLayout

PKG = Path(layout_pkg.__file__).parent


def _imports(path: Path) -> set[str]:
    """Module names a source file imports (relative ones as written, e.g. '.attention', '..errors')."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_modules_stay_small():
    for path in PKG.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 500, f"{path.name} is over 500 lines: split it by concern"


def test_generic_bsr_code_never_imports_the_attention_rule():
    for name in ("bsr.py", "_common.py"):
        imported = _imports(PKG / name)
        assert not {".attention", ".patterns", ".interop", "."} & imported, (name, imported)
    assert _imports(PKG / "attention.py") & {".patterns", ".interop"} == set()


def test_public_names():
    assert blackwell_sparsek.BlockSparseLayout is BlockSparseLayout
    assert (FULL, BOUNDS, RULE) == (BlockSparseLayout.FULL, BlockSparseLayout.BOUNDS, BlockSparseLayout.RULE)
    assert set(layout_pkg.__all__) == {"BlockSparseLayout", "FULL", "BOUNDS", "RULE"}
    lay = BlockSparseLayout.sliding_window(1000, 100, block_m=64, block_n=64)
    for derived in (lay.transpose(), lay.with_causal(), lay.to("meta"), lay._repeat_heads(2)):
        assert type(derived) is BlockSparseLayout


def test_pickles_name_the_pre_split_rebuild_function():
    """Layouts pickled before the split (module blackwell_sparsek.layout) name blackwell_sparsek.layout._rebuild;
    new pickles name it too, so both load, with torch.load's default weights_only=True as well."""
    lay = BlockSparseLayout.causal(300, 200, 64, 64, num_heads=2)
    data = pickle.dumps(lay)
    assert b"blackwell_sparsek.layout" in data and b"_rebuild" in data
    assert b"blackwell_sparsek.layout.bsr" not in data
    assert pickle.loads(data) == lay
    buf = io.BytesIO()
    torch.save(lay.transpose(), buf)
    buf.seek(0)
    assert torch.load(buf) == lay.transpose()
