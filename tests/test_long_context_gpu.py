"""GPU tests at long context: tensors past 2^31 elements (issue 24, item 27).

A causal 2K sliding window at 1M tokens with 16 and 32 heads (q alone is 2^31 and 2^32 elements, 4 and 8 GiB in
bf16), and the 256K x 8 heads run the time-per-block comparison is made against (dev/long_context_bench.py
measures it; nothing here asserts timing). Each run draws fresh inputs, poisons O and LSE with NaN before the
launch (BSK_POISON=1), checks that every element of O and LSE was written, and compares ~64 sampled query rows
with a float64 reference over the keys those rows see (max(0, q - 2047) .. q). Rows sampled in the heads past
2^31 elements exercise the 64-bit strides. Skipped without CUDA or without the free GPU memory a case needs.
"""
from __future__ import annotations

import math

import pytest
import torch

import blackwell_sparsek as bsk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs"), pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)")]

WINDOW = 2048
TOL = 2e-2          # relative error of a sampled row of O
LSE_TOL = 2e-2      # absolute error of its LSE
N_SAMPLES = 64
MARGIN = 2 << 30    # bytes of free memory beyond the four tensors and LSE



def _need_memory(B, H, S, D, itemsize=2):
    need = 4 * B * H * S * D * itemsize + B * H * S * 4 + MARGIN
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")


def _inputs(B, H, S, D, seed, bshd):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (B, S, H, D) if bshd else (B, H, S, D)
    out = []
    for _ in range(3):
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
        out.append(t.transpose(1, 2) if bshd else t)  # (B, S, H, D) storage as (B, H, S, D) views
    return out


def _sample_rows(H, S, seed):
    """(head, row) pairs: the first and last rows, the window edge, the last head (past 2^31 elements when
    H * S * D > 2^31), and random ones."""
    fixed = [(0, 0), (0, WINDOW - 2), (0, WINDOW - 1), (0, WINDOW), (H - 1, 0), (H - 1, S - 1), (H // 2, S // 2),
             (H - 1, S - WINDOW), (H // 2 + 1 if H > 1 else 0, S - 1)]
    g = torch.Generator().manual_seed(seed)
    heads = torch.randint(0, H, (N_SAMPLES - len(fixed),), generator=g).tolist()
    rows = torch.randint(0, S, (N_SAMPLES - len(fixed),), generator=g).tolist()
    return fixed + list(zip(heads, rows))


def _reference_row(q, k, v, h, r, scale):
    lo = max(0, r - WINDOW + 1)
    qi = q[0, h, r].double()
    ks = k[0, h, lo:r + 1].double()
    vs = v[0, h, lo:r + 1].double()
    s = (ks @ qi) * scale
    lse = torch.logsumexp(s, 0)
    return torch.exp(s - lse) @ vs, lse


def _check_long(B, H, S, D, seed, bshd=False):
    assert B == 1
    _need_memory(B, H, S, D)
    t = {}  # every large tensor lives here, so a failing assert's traceback does not keep GPU memory alive
    try:
        t["q"], t["k"], t["v"] = _inputs(B, H, S, D, seed, bshd)
        layout = bsk.BlockSparseLayout.sliding_window(seq_q=S, window=WINDOW, device="cuda")
        t["o"], t["lse"] = bsk.sparse_attention(t["q"], t["k"], t["v"], layout, return_lse=True)
        torch.cuda.synchronize()
        q, o, lse = t["q"], t["o"], t["lse"]
        assert o.shape == q.shape and o.stride() == q.stride(), "O must come back in q's layout"
        for h in range(H):  # per head, so the check needs no second O-sized buffer
            assert torch.isfinite(o[0, h]).all(), f"NaN/inf in O of head {h}: unwritten or poisoned elements"
        assert torch.isfinite(lse).all(), "every row sees its own key: LSE must be finite everywhere"
        worst = 0.0
        for h, r in _sample_rows(H, S, seed):
            ref, ref_lse = _reference_row(q, t["k"], t["v"], h, r, 1.0 / math.sqrt(D))
            got = o[0, h, r].double()
            err = (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()
            assert err <= TOL, f"head {h} row {r}: relative error {err:.3e}"
            lerr = abs(lse[0, h, r].item() - ref_lse.item())
            assert lerr <= LSE_TOL, f"head {h} row {r}: LSE error {lerr:.3e}"
            worst = max(worst, err)
        print(f"\n(1, {H}, {S}, {D}){' bshd' if bshd else ''}: worst sampled relative error {worst:.2e}")
    finally:
        q = o = lse = None
        t.clear()
        torch.cuda.empty_cache()


def test_256k_8_heads():
    """The baseline of the time-per-block comparison: 2^28 elements per tensor."""
    _check_long(1, 8, 1 << 18, 128, seed=101)


def test_1m_16_heads():
    """q is exactly 2^31 elements: its batch stride (2^31) was out of the launcher's int range (code 10002)."""
    _check_long(1, 16, 1 << 20, 128, seed=102)


def test_1m_32_heads():
    """2^32 elements: heads 16..31 start past 2^31 elements (2^32 bytes)."""
    _check_long(1, 32, 1 << 20, 128, seed=103)


def test_1m_32_heads_bshd_views():
    """(B, S, H, D) storage: sequence stride H * D, batch stride 2^32 elements."""
    _check_long(1, 32, 1 << 20, 128, seed=104, bshd=True)
