"""The PyTorch face of the kernels: one module per op family (attention.py), the one place configs are chosen
(dispatch.py) and the argument checks every path shares (_checks.py)."""
from .attention import precompile, sparse_attention
from .dispatch import default_config

__all__ = ["sparse_attention", "precompile", "default_config"]
