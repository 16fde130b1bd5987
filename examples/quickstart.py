#!/usr/bin/env python
"""Quick start: generate and build a kernel, run block-sparse attention on four layouts, check every result.

    python examples/quickstart.py [CONFIG]      # `make demo` installs the package first, then runs this

1. Says where attention runs: on the GPU (an H100/H200, sm_90) or on the CPU fallback, and why.
2. Writes the CUDA source of a named config (default below) into a temporary folder it removes.
3. Builds that kernel: nvcc against the CUTLASS headers of the nvidia-cutlass wheel (no GPU needed), or takes it
   from the kernel cache ($BSK_CACHE_DIR, default ~/.cache/blackwell_sparsek).
4. Runs sparse_attention on causal, sliding-window, per-head random top-k and document (block-diagonal) layouts
   and checks each output against the float64 reference.

Exit status 1 when a check fails. Nothing is written into the current directory.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

import blackwell_sparsek as bsk
from blackwell_sparsek import BlockSparseLayout as L
from blackwell_sparsek.reference import attention_reference, relative_error

CONFIG = sys.argv[1] if len(sys.argv) > 1 else "bsk_sm90a_attn_fwd_d128_fp16_t128x128_pp_s5_b128x128"
B, H, HKV, S, D = 2, 4, 2, 1024, 128   # 4 query heads share 2 K/V heads (GQA); 8 blocks of 128 per sequence
DTYPE, TOL = torch.float16, 5e-3       # fp16 output against float64: relative error ~3e-4 when correct


def pick_device() -> str:
    if not torch.cuda.is_available():
        print("device: CPU fallback (torch sees no CUDA GPU); sparse_attention runs the float64 reference, "
              "so the checks below exercise the API, not the kernel")
        return "cpu"
    major, minor = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    if (major, minor) != (9, 0):
        print(f"device: CPU fallback ({name} is sm_{major}{minor}; the kernels need sm_90a: H100/H200)")
        return "cpu"
    print(f"device: GPU, {name} (sm_90): sparse_attention runs the generated kernels")
    return "cuda"


def build_named_config() -> None:
    cfg = bsk.get_config(CONFIG)
    print(f"config {CONFIG} -> kernel {cfg.kernel_name}")
    with tempfile.TemporaryDirectory(prefix="bsk-quickstart-") as tmp:
        src = bsk.generate(cfg, Path(tmp) / "kernel.cu")
        print(f"  generated {len(src.read_text().splitlines())} lines of CUDA (temporary, removed)")
    print("  building: a cache hit takes milliseconds; a cold compile needs no GPU and takes ~30 s on a fast "
          "machine, ~60 s on 2 cores ...", flush=True)
    t0 = time.time()
    try:
        kernel = bsk.build(cfg)
    except (bsk.ToolchainError, bsk.JitDisabledError) as e:
        print(f"  not built: {e}")
        return
    fresh = kernel.meta.get("created_unix", 0) >= t0
    how = f"compiled in {kernel.meta.get('build_seconds', 0):.0f} s" if fresh else "taken from the cache"
    print(f"  {how}: {kernel.so_path} ({kernel.smem_bytes} bytes of shared memory per CTA)")


def kernel_for(layout: L, device: str) -> str:
    """The kernel sparse_attention picks for this layout (compiled on first use, then cached), or why none."""
    if device == "cpu":
        return "reference (CPU fallback)"
    try:
        return bsk.precompile(head_dim=D, dtype=DTYPE, layout=layout)[0].kernel_name
    except (bsk.ToolchainError, bsk.JitDisabledError):
        return "reference (fallback: no nvcc and no cached kernel)"


def document_mask(seq: int, doc_blocks: list[int]) -> L:
    """Block-diagonal: each query block sees only the key blocks of its own document."""
    doc = torch.repeat_interleave(torch.arange(len(doc_blocks)), torch.tensor(doc_blocks))
    return L.from_block_mask(doc[:, None] == doc[None, :], seq_q=seq, seq_k=seq)


def main() -> int:
    device = pick_device()
    build_named_config()
    layouts = {
        "causal": L.causal(S),
        "sliding window 256": L.sliding_window(S, window=256),
        "random top-k 3/row, per head": L.random_topk(S, k=3, seed=0, num_heads=H),
        "documents 3+2+3 blocks": document_mask(S, [3, 2, 3]),
    }
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, S, D, device=device, dtype=DTYPE, generator=gen)
    k, v = (torch.randn(B, HKV, S, D, device=device, dtype=DTYPE, generator=gen) for _ in range(2))
    print(f"\nsparse_attention, q {tuple(q.shape)}, k/v {tuple(k.shape)}, {str(DTYPE)[6:]}, on {device}:")
    failures = 0
    for name, layout in layouts.items():
        kernel = kernel_for(layout, device)
        out = bsk.sparse_attention(q, k, v, layout)
        ref, _ = attention_reference(q, k, v, layout)
        err = relative_error(out, ref)
        ok = err <= TOL
        failures += not ok
        print(f"  {name:30s} density {layout.density:6.1%}  rel err {err:.1e}  {'PASS' if ok else 'FAIL'}  {kernel}")
    print("all checks passed" if not failures else f"{failures} check(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
