"""Benchmark cases: a problem (B, H, S, D, dtype, pattern), its layout, flop counts, inputs, and the presets."""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Iterable

from . import metrics
from .timing import WARMUP_MS

BLOCK = 128
PATTERNS = ("dense", "causal", "window", "topk")


@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    h: int
    s: int
    d: int
    pattern: str = "dense"        # dense | causal | window | topk
    dtype: str = "fp16"
    window: int = 0               # keys per query (pattern 'window'; causal sliding window)
    density: float = 0.0          # fraction of key blocks per row (pattern 'topk')
    per_head: bool = True         # topk: a different random layout per head
    seed: int = 0
    device: str = "cuda"
    groups: tuple[str, ...] = ()  # which plots/sweeps this case belongs to ('seq', 'density', 'linear', ...)

    @property
    def name(self) -> str:
        p = self.pattern
        if p == "window":
            p = f"window{_fmt_tokens(self.window)}"
        elif p == "topk":
            p = f"topk{self.density * 100:g}%"
        return f"{p} B{self.b} H{self.h} S{_fmt_tokens(self.s)} D{self.d} {self.dtype}"

    @property
    def key(self) -> tuple:
        return (self.b, self.h, self.s, self.d, self.pattern, self.dtype, self.window, self.density,
                self.per_head, self.seed, self.device)

    def topk_k(self) -> int:
        nk = -(-self.s // BLOCK)
        return max(1, min(nk, round(self.density * nk)))

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["groups"] = list(self.groups)
        d["name"] = self.name
        return d


def _fmt_tokens(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def merge_cases(cases: Iterable[Case]) -> list[Case]:
    """Deduplicate cases by problem, uniting their groups, keeping first-seen order."""
    out: dict[tuple, Case] = {}
    for c in cases:
        if c.key in out:
            old = out[c.key]
            out[c.key] = dataclasses.replace(old, groups=tuple(dict.fromkeys(old.groups + c.groups)))
        else:
            out[c.key] = c
    return list(out.values())


# ---------------------------------------------------------------------------------------------------------------
# Layouts, flops, inputs
# ---------------------------------------------------------------------------------------------------------------

def build_layout(case: Case, device: str | None = None) -> tuple[Any, bool]:
    """(layout, causal flag to pass with it) for a case. Every pattern is expressed in the layout itself."""
    from ..layout import BlockSparseLayout as L
    dev = device or case.device
    kw = dict(block_m=BLOCK, block_n=BLOCK, device=dev)
    if case.pattern == "dense":
        return L.dense(case.s, **kw), False
    if case.pattern == "causal":
        return L.causal(case.s, **kw), False
    if case.pattern == "window":
        return L.sliding_window(case.s, case.window, causal=True, **kw), False
    if case.pattern == "topk":
        return L.random_topk(case.s, case.topk_k(), seed=1000 + case.seed,
                             num_heads=case.h if case.per_head else 1, **kw), False
    raise ValueError(f"unknown pattern {case.pattern!r}; known: {PATTERNS}")


def case_flops(case: Case, layout: Any) -> dict[str, float]:
    """``flops_blocks`` (effective: listed blocks x block area), ``flops_dense`` (example 88's dense count, halved
    for causal) and ``flops`` = the one TFLOPS columns use: the dense-half count for the causal pattern (so the
    numbers match example 88's), the block count otherwise."""
    pairs = metrics.block_pairs_total(layout.nnz, layout.num_heads, case.b, case.h)
    fb = metrics.effective_flops(pairs, BLOCK, BLOCK, case.d)
    fd = metrics.dense_flops(case.b, case.h, case.s, case.s, case.d, causal=case.pattern == "causal")
    return {"flops_blocks": fb, "flops_dense": fd, "flops": fd if case.pattern in ("dense", "causal") else fb,
            "block_pairs": pairs}


def estimate_case_seconds(case: Case, n_peers: int, tflops_guess: float = 300.0) -> float:
    """Rough wall time of one case (for the budget): ~12 calls per peer at ``tflops_guess``, the timer's warm-up and
    fixed overheads."""
    if case.pattern == "dense":
        f = metrics.dense_flops(case.b, case.h, case.s, case.s, case.d)
    elif case.pattern == "causal":
        f = metrics.dense_flops(case.b, case.h, case.s, case.s, case.d, causal=True)
    elif case.pattern == "window":
        f = 4.0 * case.b * case.h * case.d * (-(-case.s // BLOCK)) * (case.window // BLOCK + 1) * BLOCK * BLOCK
    else:
        f = 4.0 * case.b * case.h * case.d * (-(-case.s // BLOCK)) * case.topk_k() * BLOCK * BLOCK
    per_call = f / (tflops_guess * 1e12)
    return n_peers * (12 * per_call + 0.4 + WARMUP_MS / 1e3) + 0.5


def make_inputs(case: Case) -> tuple[Any, Any, Any]:
    import torch
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[case.dtype]
    gen = torch.Generator(device=case.device)
    # deterministic per case (str hashes are salted per process; crc32 is not)
    gen.manual_seed(zlib.crc32(repr((case.b, case.h, case.s, case.d, case.pattern, case.seed)).encode()))
    shape = (case.b, case.h, case.s, case.d)
    return tuple(torch.randn(shape, generator=gen, device=case.device, dtype=dt) for _ in range(3))  # type: ignore


# ---------------------------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------------------------

K = 1024


def _b_for(s: int, tokens: int = 16 * K) -> int:
    return max(1, tokens // s)


def preset(name: str, device: str = "cuda") -> list[Case]:
    """The cases of a preset: 'quick' (< 4 min on an H100), 'full' (< 9 min), 'tiny' (a CPU-capable smoke run)."""
    C = lambda **kw: Case(device=device, **kw)  # noqa: E731
    cases: list[Case] = []
    if name == "tiny":
        for s in (256, 512):
            for p, extra in (("dense", {}), ("causal", {}), ("window", {"window": 200}), ("topk", {"density": 0.5})):
                cases.append(C(b=1, h=2, s=s, d=64, pattern=p, groups=("seq", "linear") if p == "window" else
                               ("seq", "density") if p in ("topk", "dense") else ("seq",), **extra))
        cases.append(C(b=1, h=2, s=512, d=64, pattern="topk", density=0.25, groups=("density",)))
        return merge_cases(cases)
    if name == "quick":
        # in priority order: the budget drops cases from the end
        for p, extra in (("dense", {}), ("topk", {"density": 0.25}), ("causal", {}), ("window", {"window": 2 * K})):
            cases.append(C(b=2, h=16, s=8 * K, d=128, pattern=p,
                           groups=("seq", "density") if p in ("dense", "topk") else ("seq",), **extra))
        for s in (16 * K, 32 * K, 64 * K, 128 * K):
            cases.append(C(b=1, h=16, s=s, d=128, pattern="window", window=2 * K, groups=("linear", "seq")))
        cases += [C(b=2, h=16, s=8 * K, d=64, pattern="dense", groups=("seq",)),
                  C(b=2, h=16, s=8 * K, d=64, pattern="topk", density=0.25, groups=("seq",))]
        for dens in (0.125, 0.5):
            cases.append(C(b=2, h=16, s=8 * K, d=128, pattern="topk", density=dens, groups=("density",)))
        for s in (2 * K, 32 * K):
            b = _b_for(s)
            cases += [C(b=b, h=16, s=s, d=128, pattern="dense", groups=("seq",)),
                      C(b=b, h=16, s=s, d=128, pattern="causal", groups=("seq",)),
                      C(b=b, h=16, s=s, d=128, pattern="topk", density=0.25, groups=("seq",))]
        cases.append(C(b=8, h=16, s=2 * K, d=128, pattern="window", window=2 * K, groups=("seq",)))
        return merge_cases(cases)
    if name == "full":
        for d, max_dense, max_topk, max_window in ((128, 128 * K, 128 * K, 512 * K), (64, 32 * K, 32 * K, 128 * K)):
            s = 1 * K
            while s <= max_window:
                b = _b_for(s)
                if s <= max_dense:
                    cases += [C(b=b, h=16, s=s, d=d, pattern="dense", groups=("seq",)),
                              C(b=b, h=16, s=s, d=d, pattern="causal", groups=("seq",))]
                if s <= max_topk:
                    cases.append(C(b=b, h=16, s=s, d=d, pattern="topk", density=0.25, groups=("seq",)))
                cases.append(C(b=b, h=16, s=s, d=d, pattern="window", window=2 * K,
                               groups=("seq",) + (("linear",) if b == 1 and d == 128 else ())))
                s *= 2
        for s in (8 * K, 32 * K):
            b = _b_for(s)
            cases.append(C(b=b, h=16, s=s, d=128, pattern="dense", groups=("density",)))
            for dens in (0.125, 0.25, 0.5):
                cases.append(C(b=b, h=16, s=s, d=128, pattern="topk", density=dens, groups=("density",)))
        return merge_cases(cases)
    raise ValueError(f"unknown preset {name!r}; known: tiny, quick, full, headline")


# What one FlexAttention / FA4 compile of a new shape or mask costs, roughly (for the time budget).
JIT_COMPILE_GUESS_S = 15.0
# Sequence lengths at which compile-heavy peers (FlexAttention, FA4) run, per preset: each new shape compiles.
JIT_PEER_SEQS = {"tiny": None, "quick": {8 * K}, "full": {2 * K, 8 * K, 32 * K}}
# Example 88 runs (dense/causal cases) at these sequence lengths, when its binary is available.
EX88_SEQS = {"tiny": set(), "quick": {8 * K}, "full": {2 * K, 8 * K, 32 * K}}
