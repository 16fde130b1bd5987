"""Block-sparse attention layouts: which (query block, key block) tiles a kernel visits, and how it masks them.

A :class:`BlockSparseLayout` is runtime data (DESIGN.md, convention 5): small index tensors handed to the CUDA kernel
as arguments, never template parameters, so a new mask never triggers a compile. One class, assembled from modules
of one concern each:

``bsr.py``        storage (BSR over query-block rows), validation, equality, device copies, ``transpose()`` (the
                  same type over the key axis) and the row schedules a kernel reads; generic, no attention rule.
``attention.py``  the element rule (causal / windows), block geometry, ``with_causal()``, ``to_element_mask()``.
``patterns.py``   the constructors (``dense``, ``causal``, ``sliding_window``, ..., ``from_scores``).
``interop.py``    FlashInfer/SciPy BSR, FlexAttention ``BlockMask`` both ways, ``plot()``.

The exact kernel contract is in ``bsr.py`` (storage, what a kernel reads) and ``attention.py`` (the rule); the
user's manual is docs/layout.md.
"""
from __future__ import annotations

import torch

from ._common import BOUNDS, FULL, RULE
from .attention import AttentionRule
from .bsr import BsrBase
from .interop import Interop
from .patterns import Patterns

__all__ = ["BlockSparseLayout", "FULL", "BOUNDS", "RULE"]


class BlockSparseLayout(Patterns, Interop, AttentionRule, BsrBase):
    """Block-sparse attention layout in BSR/CSR form (kernel contract: ``layout/bsr.py`` and ``attention.py``).

    Build one with a classmethod constructor (``dense``, ``causal``, ``sliding_window``, ``strided``, ``dilated``,
    ``global_local``, ``random_topk``, ``from_block_mask``, ``from_scores``, ``from_bsr``, ``from_flex_block_mask``)
    or directly from tensors: ``BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=..., seq_k=..., block_m=...,
    block_n=..., window_left=-1, window_right=-1)``, which validates them.

    Immutable: attributes are read-only and the tensors must never be modified in place (device copies, the causal
    variant, the transpose, ``row_order()`` and ``row_schedule()`` are cached on the object).
    """

    __slots__ = ()

    def __reduce__(self):
        return (_rebuild, (self._row_ptr, self._col_idx, self._block_kind, self._seq_q, self._seq_k, self._block_m,
                           self._block_n, self._window_left, self._window_right))


def _rebuild(row_ptr, col_idx, block_kind, seq_q, seq_k, block_m, block_n, wl, wr) -> BlockSparseLayout:
    """Unpickling: the public constructor, so every tensor is validated again."""
    return BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=seq_q, seq_k=seq_k, block_m=block_m,
                             block_n=block_n, window_left=wl, window_right=wr)


# torch.load's default (weights_only=True) unpickles only allow-listed globals: a saved layout rebuilds through
# _rebuild, which validates every tensor like the public constructor, so it is safe to allow. (Its name,
# blackwell_sparsek.layout._rebuild, is the one pickles written before the package split use too.)
torch.serialization.add_safe_globals([_rebuild])
