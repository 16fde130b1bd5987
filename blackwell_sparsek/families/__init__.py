"""Kernel families, one module each; importing this package registers every family with jit.spec."""
from . import attn_bwd  # noqa: F401
from . import attn_fwd  # noqa: F401
from . import bsr_gemm  # noqa: F401
