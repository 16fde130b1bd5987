#!/usr/bin/env python
"""Our kernels vs CUTLASS example 88 on the same shapes, in one run (a thin wrapper over ``compare-88``).

    python examples/compare_ex88.py                                   # default shapes, full + causal
    python examples/compare_ex88.py --shapes 2x16x8192x128 --masks full --iterations 50

Same as ``python -m blackwell_sparsek compare-88 ...``; see docs/benchmarks.md. Skips (exit 0) without a CUDA GPU;
exit 1 when one of our kernels fails or disagrees with torch SDPA.
"""
from __future__ import annotations

import sys

from _gpu import torch_or_skip


def main() -> int:
    if torch_or_skip("cuda", "compare-88 needs an H100/H200 (sm_90)") is None:
        return 0
    from blackwell_sparsek.bench.cli import main as bench_main
    return bench_main(["compare-88", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
