"""Index tensors already checked against a kernel's contract, so the ops need not check them again.

A ``BlockSparseLayout`` validates its tensors when it is built and derives its device copies and views (row
schedule, transpose) itself; it marks each such tensor here. An op handed index tensors checks their *values* (a
device reduction and one host sync) only when they are not marked; their shapes, dtypes and devices are checked
on every call. An entry holds a weak reference and the tensor's version counter: an in-place write to a marked
tensor (which the layout contract forbids) makes it unmarked again, and a freed tensor leaves the registry.
"""
from __future__ import annotations

import weakref
from typing import Any

_marked: dict[int, tuple[weakref.ref, int]] = {}


def _forget(key: int) -> None:
    _marked.pop(key, None)


def mark(*tensors: Any) -> None:
    """Record ``tensors`` as checked (by their identity and current version)."""
    for t in tensors:
        key = id(t)
        _marked[key] = (weakref.ref(t, lambda _ref, k=key: _forget(k)), t._version)


def is_marked(t: Any) -> bool:
    """True when ``t`` itself was marked and has not been written in place since."""
    entry = _marked.get(id(t))
    return entry is not None and entry[0]() is t and entry[1] == t._version
