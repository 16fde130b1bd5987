"""Where the package's data lives: the repo checkout first, else the copy shipped inside the wheel.

``templates/`` and ``cutlass_configs/`` sit at the top level of the repository. A wheel carries copies of them
under ``blackwell_sparsek/_data/`` (see setup.py), so a non-editable install finds them without the source tree.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_DATA_DIR = PACKAGE_DIR / "_data"


@lru_cache(maxsize=None)
def source_root() -> Path | None:
    """The repository checkout this package is imported from, or None for an installed wheel."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "templates").is_dir():
        return root
    return None


def _data(name: str) -> Path:
    root = source_root()
    if root is not None and (root / name).is_dir():
        return root / name
    shipped = _DATA_DIR / name
    if shipped.is_dir():
        return shipped
    # Imported neither from a checkout nor from a complete wheel: say where we looked.
    from .errors import ToolchainError
    looked = [str(p) for p in ((root / name) if root else None, shipped) if p is not None]
    raise ToolchainError(f"cannot find the package's {name}/ directory (looked in {looked}); "
                         f"reinstall blackwell_sparsek (pip install .) or run from a repo checkout")


def templates_dir() -> Path:
    """Directory holding ``*.cu.j2`` templates and ``include/`` (our C++ headers)."""
    return _data("templates")


def include_dir() -> Path:
    """Our own kernel headers (``bsk/*.hpp``), passed to nvcc with ``-I``."""
    return templates_dir() / "include"


def configs_dir() -> Path:
    """Named kernel configs, one ``<name>.json`` each."""
    return _data("cutlass_configs")
