"""The PyTorch face of the kernels: one module per op (attention.py, the forward; attention_bwd.py, its backward
and autograd), the one place configs are chosen (dispatch.py) and the argument checks every path shares
(_checks.py)."""
from .attention import precompile, sparse_attention
from . import attention_bwd  # noqa: F401,E402 - registers the forward op's autograd (the backward kernels)
from .dispatch import default_config

__all__ = ["sparse_attention", "precompile", "default_config"]
