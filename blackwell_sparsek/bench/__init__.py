"""Benchmark and comparison harness of BlackwellSparseK (docs/benchmarks.md).

Subcommands (``python -m blackwell_sparsek <sub>`` or ``python -m blackwell_sparsek.bench <sub>``):

* ``compare-88``: our kernels vs CUTLASS example 88 (ex88.py builds, caches, runs and parses it; compare88.py).
* ``bench``: sweeps over sequence length, head dim, sparsity pattern and schedule, against torch SDPA,
  FlexAttention and FlashAttention / xformers when importable; JSON + PNG plots (harness.py, peers.py, plots.py);
  ``--preset headline`` measures exactly the acceptance shapes (headline.py).
* ``profile``: Nsight Compute metrics of one of our kernels (profile.py).

Importing this package is cheap (no torch); the modules load what they need on use.
"""
from .cli import main

__all__ = ["main"]
