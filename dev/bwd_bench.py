"""The attention backward benchmark now lives in the harness: ``python -m blackwell_sparsek bench-bwd``
(blackwell_sparsek/bench/backward.py). This script forwards its arguments there (``--quick``, ``--out DIR``)."""
import sys

from blackwell_sparsek.bench.backward import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
