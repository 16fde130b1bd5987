"""The implementations a benchmark case is run on: ours (one per schedule), torch SDPA backends, FlexAttention,
FlashAttention and xformers when importable. Example 88 is not a peer here: it is a separate binary with its own
timer (see ex88.py / compare88.py).

A peer answers ``unsupported(case) -> reason | None`` and ``prepare(case, tensors) -> fn`` where ``fn()`` runs the
attention once and returns O as a (B, H, S, D) tensor (a view is fine). Everything a peer needs that is not the
attention itself (layout transfers, block masks, transposed copies, compilation) happens in ``prepare``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import time
from typing import Any, Callable

DENSE_PATTERNS = ("dense", "causal")


@dataclasses.dataclass
class Tensors:
    """Inputs of one case, built once and shared by every peer."""

    q: Any
    k: Any
    v: Any
    layout: Any          # BlockSparseLayout as given to our kernel (on device)
    causal: bool         # the causal flag passed alongside the layout
    scale: float


class Peer:
    name = "peer"
    kind = "peer"
    config_name: str | None = None

    def unsupported(self, case: Any) -> str | None:
        return None

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        raise NotImplementedError

    def context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "config": self.config_name}


# ---------------------------------------------------------------------------------------------------------------

class Ours(Peer):
    """blackwell_sparsek.sparse_attention with one config (schedule)."""

    kind = "ours"

    def __init__(self, config: Any, config_name: str | None = None, label: str | None = None):
        self.config = config
        self.config_name = config_name or getattr(config, "kernel_name", None)
        sched = getattr(getattr(config, "schedule", None), "value", "?")
        self.name = label or f"ours-{'coop' if sched == 'cooperative' else 'pp' if sched == 'pingpong' else sched}"
        self.build_s: float | None = None

    def unsupported(self, case: Any) -> str | None:
        if getattr(self.config, "head_dim", case.d) != case.d:
            return f"config is for head_dim {self.config.head_dim}"
        if getattr(getattr(self.config, "dtype", None), "value", case.dtype) != case.dtype:
            return f"config is for {self.config.dtype.value}"
        return None

    def precompile(self) -> float:
        import blackwell_sparsek as bsk
        t0 = time.monotonic()
        bsk.precompile(self.config)
        self.build_s = time.monotonic() - t0
        return self.build_s

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        import blackwell_sparsek as bsk
        cfg = self.config
        q, k, v, layout, causal, scale = t.q, t.k, t.v, t.layout, t.causal, t.scale

        def fn():
            return bsk.sparse_attention(q, k, v, layout, causal=causal, scale=scale, config=cfg)
        return fn

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["kernel"] = getattr(self.config, "kernel_name", None)
        d["config_json"] = self.config.to_json() if hasattr(self.config, "to_json") else None
        d["build_s"] = self.build_s
        return d


class Sdpa(Peer):
    """torch.nn.functional.scaled_dot_product_attention pinned to one backend (dense / causal only)."""

    kind = "sdpa"

    def __init__(self, backend: str):
        self.backend = backend  # 'flash' | 'cudnn' | 'efficient' | 'math' | 'default'
        self.name = f"sdpa-{backend}"

    def unsupported(self, case: Any) -> str | None:
        if case.pattern not in DENSE_PATTERNS:
            return "SDPA has no block-sparse mask (dense/causal only)"
        if case.device != "cuda" and self.backend not in ("math", "default"):
            return f"SDPA {self.backend} backend needs CUDA"
        return None

    def context(self) -> contextlib.AbstractContextManager:
        if self.backend == "default":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[self.backend]
        return sdpa_kernel([be])

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        import torch.nn.functional as F
        q, k, v, scale = t.q, t.k, t.v, t.scale
        causal = case.pattern == "causal"

        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return fn


_FLEX_COMPILED: Any = None


def compiled_flex() -> Any:
    """torch.compile(flex_attention), made once per process. Raises dynamo's recompile limit so a sweep over
    shapes and masks never silently falls back to eager flex attention (which materialises S×S scores)."""
    global _FLEX_COMPILED
    if _FLEX_COMPILED is None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        import torch._dynamo.config as dcfg
        # renamed in torch 2.6 (cache_size_limit -> recompile_limit); set whichever this torch has
        for new, old, value in (("recompile_limit", "cache_size_limit", 256),
                                ("accumulated_recompile_limit", "accumulated_cache_size_limit", 2048)):
            for attr in (new, old):
                try:
                    cur = getattr(dcfg, attr)
                except AttributeError:
                    continue
                try:
                    setattr(dcfg, attr, max(int(cur), value))
                except Exception:
                    continue
                break
        # static shapes: each (shape, mask) compiles its own kernel, the path FlexAttention's own benchmarks take
        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


class Flex(Peer):
    """torch.compile'd FlexAttention with the layout's own BlockMask (layout.to_flex_block_mask())."""

    kind = "flex"
    name = "flex"

    def __init__(self, max_seq: int | None = None, allow_cpu: bool = False):
        self.max_seq = max_seq
        self.allow_cpu = allow_cpu  # CPU flex (inductor C++) only to test the harness
        self.compile_s: dict[str, float] = {}

    def unsupported(self, case: Any) -> str | None:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except Exception as e:
            return f"FlexAttention not importable ({e})"
        if self.max_seq is not None and case.s > self.max_seq:
            return f"skipped above S={self.max_seq} (compile time budget)"
        if case.device != "cuda" and not self.allow_cpu:
            return "FlexAttention is only benchmarked on CUDA"
        return None

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        layout = t.layout.with_causal() if t.causal else t.layout
        bm = layout.to_flex_block_mask()
        flex = compiled_flex()
        q, k, v, scale = t.q, t.k, t.v, t.scale

        def fn():
            return flex(q, k, v, block_mask=bm, scale=scale)
        t0 = time.monotonic()
        fn()  # compile (or hit the compile cache) outside the timed region
        from .timing import sync
        sync(case.device)
        self.compile_s[case.name] = time.monotonic() - t0
        return fn


def _import_first(mods: list[tuple[str, str]]) -> tuple[str, Callable[..., Any]] | None:
    for mod, attr in mods:
        try:
            m = importlib.import_module(mod)
            f = getattr(m, attr)
            return mod, f
        except Exception:
            continue
    return None


class FlashAttn(Peer):
    """A FlashAttention package (FA4 flash_attn.cute, FA3 flash_attn_interface or FA2 flash_attn):
    dense, causal and causal sliding window. Inputs are (B, S, H, D) copies made in prepare."""

    kind = "flash_attn"

    def __init__(self, module: str, func: Callable[..., Any], label: str):
        self.module = module
        self.func = func
        self.name = label
        try:
            self.params = set(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            self.params = set()

    @staticmethod
    def available() -> list["FlashAttn"]:
        out = []
        for mods, label in (([("flash_attn.cute.interface", "flash_attn_func"), ("flash_attn.cute", "flash_attn_func")],
                             "fa4"),
                            ([("flash_attn_interface", "flash_attn_func")], "fa3"),
                            ([("flash_attn", "flash_attn_func")], "fa2")):
            hit = _import_first(mods)
            if hit:
                out.append(FlashAttn(hit[0], hit[1], label))
        return out

    def unsupported(self, case: Any) -> str | None:
        if case.device != "cuda":
            return "needs CUDA"
        if case.pattern not in ("dense", "causal", "window"):
            return "block-sparse masks are not benchmarked for FlashAttention"
        if case.pattern == "window" and not ({"window_size", "window_size_left"} & self.params):
            return "this FlashAttention has no window_size argument"
        return None

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (t.q, t.k, t.v))
        kw: dict[str, Any] = {"causal": case.pattern in ("causal", "window")}
        if "softmax_scale" in self.params:
            kw["softmax_scale"] = t.scale
        if case.pattern == "window":
            left = case.window - 1  # keys in (q - window, q]: window keys including the diagonal
            if "window_size" in self.params:
                kw["window_size"] = (left, 0)
            else:
                kw["window_size_left"], kw["window_size_right"] = left, 0
        f = self.func

        def fn():
            o = f(qt, kt, vt, **kw)
            if isinstance(o, (tuple, list)):
                o = o[0]
            return o.transpose(1, 2)
        return fn


class Xformers(Peer):
    kind = "xformers"
    name = "xformers"

    def unsupported(self, case: Any) -> str | None:
        if case.device != "cuda":
            return "needs CUDA"
        if case.pattern not in DENSE_PATTERNS:
            return "dense/causal only"
        return None

    @staticmethod
    def available() -> bool:
        try:
            import xformers.ops  # noqa: F401
            return True
        except Exception:
            return False

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        import xformers.ops as xops
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (t.q, t.k, t.v))
        bias = xops.LowerTriangularMask() if case.pattern == "causal" else None
        scale = t.scale

        def fn():
            return xops.memory_efficient_attention(qt, kt, vt, attn_bias=bias, scale=scale).transpose(1, 2)
        return fn


class Reference(Peer):
    """The float64 dense-masked reference as a peer (CPU harness tests; tiny shapes only)."""

    kind = "reference"
    name = "reference"

    def prepare(self, case: Any, t: Tensors) -> Callable[[], Any]:
        from ..reference import attention_reference
        q, k, v, layout, causal, scale = t.q, t.k, t.v, t.layout, t.causal, t.scale

        def fn():
            return attention_reference(q, k, v, layout, causal=causal, scale=scale)[0].to(q.dtype)
        return fn


# ---------------------------------------------------------------------------------------------------------------

def our_configs(d: int, dtype: str, schedules: tuple[str, ...] = ("cooperative", "pingpong")) -> list[tuple[str, Any]]:
    """(name, config) of the named configs for head dim ``d`` and ``dtype``, one per schedule, block 128x128.
    Falls back to AttentionConfig defaults when no named config matches."""
    import blackwell_sparsek as bsk
    from ..families.attn_fwd import AttentionConfig
    named: dict[str, Any] = {}
    try:
        named = bsk.load_named_configs()
    except Exception:
        named = {}
    out = []
    for sched in schedules:
        hits = [(n, c) for n, c in sorted(named.items())
                if isinstance(c, AttentionConfig) and c.head_dim == d and c.dtype.value == dtype
                and c.schedule.value == sched and c.block_m == 128 and c.block_n == 128]
        if hits:
            out.append(hits[0])
        else:
            cfg = AttentionConfig(head_dim=d, dtype=dtype, schedule=sched).validate()
            out.append((cfg.kernel_name, cfg))
    return out


def default_peers(d: int, dtype: str, *, include: set[str] | None = None, device: str = "cuda",
                  flex_max_seq: int | None = None) -> list[Peer]:
    """Every peer usable here for (d, dtype): ours per schedule, SDPA flash + cuDNN, Flex, FA, xformers.
    ``include`` filters by name prefix ('ours', 'sdpa', 'flex', 'fa', 'xformers')."""
    def want(name: str) -> bool:
        return include is None or any(name.startswith(p) for p in include)

    peers: list[Peer] = []
    if want("ours"):
        peers += [Ours(c, n) for n, c in our_configs(d, dtype)]
    if device == "cuda":
        if want("sdpa-flash"):
            peers.append(Sdpa("flash"))
        if want("sdpa-cudnn"):
            peers.append(Sdpa("cudnn"))
    else:
        if want("sdpa"):
            peers.append(Sdpa("math"))
    if want("flex"):
        peers.append(Flex(max_seq=flex_max_seq))
    if device == "cuda":
        for fa in FlashAttn.available():
            if want(fa.name) or want("fa"):
                peers.append(fa)
        if want("xformers") and Xformers.available():
            peers.append(Xformers())
    return peers
