"""``python -m blackwell_sparsek.bench {bench,compare-88,profile} ...`` (same as ``python -m blackwell_sparsek``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
