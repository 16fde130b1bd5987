"""Block kinds, size limits, argument checks and the COO -> BSR compression shared by the layout modules."""
from __future__ import annotations

import operator
from typing import Any

import torch

from ..errors import InputError, LayoutError

# Block kinds: bit flags per listed block (the kernel reads them from block_kind and the row schedule).
FULL = 0     # no element mask
BOUNDS = 1   # the block reaches past the column end (seq_k): mask k >= seq_k
RULE = 2     # apply the layout's element rule

# to_element_mask / plot / to_kind_grid refuse beyond this many entries: they are for tests, references, pictures.
MAX_ELEMENT_MASK = 1 << 26  # 64M
MAX_DENSE_BLOCKS = 1 << 26


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def as_int(name: str, value: Any, minimum: int, err: type = LayoutError) -> int:
    if isinstance(value, bool):
        raise err(f"{name} must be an int, got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise err(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if v < minimum:
        raise err(f"{name} must be >= {minimum}, got {v}")
    return v


def as_window(name: str, value: Any) -> int:
    return as_int(name, value, -1)


def normalize_device(device: Any) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def rule_desc(wl: int, wr: int) -> str:
    if wl < 0 and wr < 0:
        return "none"
    if wl < 0 and wr == 0:
        return "causal"
    if wr == 0:
        return f"causal window {wl + 1} keys (left={wl}, right=0)"
    return f"window(left={wl}, right={wr})"


def as_tensor(name: str, x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:  # noqa: BLE001 - report any conversion failure the same way
        raise InputError(f"{name} must be a tensor or array, got {type(x).__name__} ({e})") from None


def compress(n_heads: int, n_major: int, n_minor: int, h: torch.Tensor, major: torch.Tensor,
              minor: torch.Tensor, kind: torch.Tensor, presorted: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """COO entries -> (ptr int32 [H, n_major+1], idx int32 [H, M], kind uint8 [H, M]).

    Unless presorted (sorted by (h, major, minor) and unique), entries are sorted and duplicates merged with the
    smallest kind winning: a block listed both FULL and RULE is FULL (the union of the two element sets).
    """
    device = major.device
    h, major, minor = h.long(), major.long(), minor.long()
    kind = kind.to(torch.uint8)
    if not presorted and h.numel() > 0:
        key = (h * n_major + major) * n_minor + minor
        order = torch.argsort(key * 4 + kind.long())
        key = key[order]
        first = torch.ones_like(key, dtype=torch.bool)
        first[1:] = key[1:] != key[:-1]
        order = order[first]
        h, major, minor, kind = h[order], major[order], minor[order], kind[order]
    if n_heads == 1:
        counts = torch.bincount(major, minlength=n_major).view(1, n_major)
    else:
        counts = torch.bincount(h * n_major + major, minlength=n_heads * n_major).view(n_heads, n_major)
    ptr = torch.zeros(n_heads, n_major + 1, dtype=torch.int64, device=device)
    ptr[:, 1:] = torch.cumsum(counts, 1)
    per_head = ptr[:, -1]
    m = max(1, int(per_head.max()))
    if m > torch.iinfo(torch.int32).max:
        raise LayoutError(f"{m} blocks in one head overflow int32 row_ptr; use larger blocks or fewer blocks")
    if n_heads == 1:  # entries are already in order: no scatter
        n = major.numel()
        idx = torch.zeros(1, max(1, n), dtype=torch.int32, device=device)
        kinds = torch.zeros(1, max(1, n), dtype=torch.uint8, device=device)
        idx[0, :n] = minor
        kinds[0, :n] = kind
        return ptr.to(torch.int32), idx, kinds
    head_start = torch.cumsum(per_head, 0) - per_head
    pos = torch.arange(h.numel(), device=device) - head_start[h]
    idx = torch.zeros(n_heads, m, dtype=torch.int32, device=device)
    kinds = torch.zeros(n_heads, m, dtype=torch.uint8, device=device)
    idx[h, pos] = minor.to(torch.int32)
    kinds[h, pos] = kind
    return ptr.to(torch.int32), idx, kinds
