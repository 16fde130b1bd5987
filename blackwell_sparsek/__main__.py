"""``python -m blackwell_sparsek``: see blackwell_sparsek.cli."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
