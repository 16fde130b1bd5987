"""Build step that ships the top-level templates/ and cutlass_configs/ inside the wheel.

All metadata lives in pyproject.toml. The copies land in ``blackwell_sparsek/_data/`` of the build tree, where
``blackwell_sparsek._paths`` finds them when the package is not imported from a repo checkout. Editable installs
skip the copy: they read the checkout directly.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("templates", "cutlass_configs")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "*.cubin", "*.ptx", ".*")


class build_py_with_data(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in SHIPPED:
            src = ROOT / name
            if not src.is_dir():
                raise SystemExit(f"setup.py: {src} is missing; it must ship inside the wheel")
            dst = Path(self.build_lib) / "blackwell_sparsek" / "_data" / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=IGNORE)


setup(cmdclass={"build_py": build_py_with_data})
