"""Shared by the examples: torch and a CUDA GPU, or a one-line reason to skip (the examples then exit 0)."""
from __future__ import annotations


def torch_or_skip(device: str = "cuda", need: str = "this example needs an H100/H200 (sm_90)"):
    """The torch module, or None after printing why the example skips."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 -- a broken install skips like a missing one
        print(f"SKIP: torch is not usable ({e})")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print(f"SKIP: no CUDA GPU visible; {need}")
        return None
    return torch
