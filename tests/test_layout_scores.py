"""from_scores(keep_diagonal=True): the same selection as its definition, without copying the scores (issue 24
item 21). CPU only."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import blackwell_sparsek.layout.patterns as patterns_mod
from blackwell_sparsek.layout import BlockSparseLayout as L


def _cdiv(a, b):
    return -(-a // b)


def definition(scores, k, sq, sk, bm, bn):
    """The documented selection, the way the library computed it before: per row the diagonal block, plus
    torch.topk(k - 1) over the row's other blocks gathered in column order (a full copy of the scores)."""
    hl, nq, nk = scores.shape
    kk = min(k, nk)
    r = torch.arange(nq)
    qhi = torch.clamp((r + 1) * bm, max=sq) - 1 + sk - sq
    d = torch.clamp(torch.div(qhi, bn, rounding_mode="floor"), 0, nk - 1)
    other = torch.arange(nk - 1).unsqueeze(0)
    other = other + (other >= d.unsqueeze(1)).long()
    want = torch.zeros(hl, nq, nk, dtype=torch.bool)
    want[:, r, d] = True
    if kk > 1:
        sub = torch.gather(scores, 2, other.unsqueeze(0).expand(hl, nq, nk - 1))
        top = torch.topk(sub, kk - 1, dim=2).indices
        want.scatter_(2, torch.gather(other.unsqueeze(0).expand(hl, nq, nk - 1), 2, top), True)
    return want


CASES = [(1000, 1000, 64, 64), (513, 900, 128, 64), (900, 300, 64, 128), (64, 64, 64, 64), (4000, 130, 32, 32)]


@pytest.mark.parametrize("chunk", [None, 1, 37, 1000])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sq,sk,bm,bn", CASES)
@pytest.mark.parametrize("k", [1, 2, 5, 100])
def test_keep_diagonal_equals_definition(monkeypatch, chunk, ties, heads, sq, sk, bm, bn, k):
    """Equal to the definition on random scores, also with many ties (scores from {0, 1, 2} and -inf) and with
    the row chunking forced down to one row per chunk."""
    if chunk is not None:
        monkeypatch.setattr(patterns_mod, "_SCORES_CHUNK", chunk)
    nq, nk = _cdiv(sq, bm), _cdiv(sk, bn)
    g = torch.Generator().manual_seed(sq + 7 * k + heads)
    if ties:
        scores = torch.randint(0, 3, (heads, nq, nk), generator=g).float()
        scores[torch.rand(heads, nq, nk, generator=g) < 0.2] = float("-inf")
    else:
        scores = torch.randn(heads, nq, nk, generator=g)
    lay = L.from_scores(scores, k, keep_diagonal=True, seq_q=sq, seq_k=sk, block_m=bm, block_n=bn)
    assert torch.equal(lay.to_dense_mask(), definition(scores, k, sq, sk, bm, bn))
    assert torch.equal(lay.row_counts(), torch.full((heads, nq), min(k, nk), dtype=torch.int32))


def test_scores_are_not_copied():
    """Peak extra memory of from_scores(keep_diagonal=True) on 64 MB of scores, measured as the growth of the
    process's peak RSS in a fresh interpreter: before, a gathered copy of the scores (64 MB) plus int64 column
    numbers of the same shape (128 MB) were live at once (+255 MB measured); now one chunk of rows (a few MB)
    and the result."""
    code = textwrap.dedent("""
        import resource, time, torch
        from blackwell_sparsek.layout import BlockSparseLayout as L
        torch.set_num_threads(1)
        L.from_scores(torch.randn(1, 64, 64), 8)                     # load every code path first
        s = torch.randn(1, 4096, 4096)                                 # 64 MB of float32 scores
        s.add_(0)                                                      # touch every page
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        lay = L.from_scores(s, 64, keep_diagonal=True)
        dt = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024, round(dt * 1000), lay.nnz)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    extra_mb, ms, nnz = (int(x) for x in out.stdout.split())
    assert nnz == 4096 * 64
    print(f"\n[info] from_scores(4096x4096 float32, k=64, keep_diagonal): +{extra_mb} MB peak RSS, {ms} ms")
    assert extra_mb < 32, f"from_scores grew the peak RSS by {extra_mb} MB for 64 MB of scores"
