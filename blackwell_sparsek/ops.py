"""The PyTorch face of the kernels: input checks, config choice, one torch.library custom op per family.

``sparse_attention`` validates its inputs (typed errors that name the fix), picks a kernel config, and calls the
``blackwell_sparsek::attn_fwd`` custom op, whose fake implementation only computes shapes (so
``torch.compile(fullgraph=True)`` traces it without compiling anything) and whose real implementation launches the
cached kernel through ctypes on torch's current stream. Without a GPU or nvcc it falls back to the reference with a
one-time warning.
"""
from __future__ import annotations

import math
import os
import warnings
from functools import lru_cache

import torch

from .families.attn_fwd import AttentionConfig, Schedule
from .jit.spec import DType, KernelConfig
from .errors import InputError, InvalidConfigError, LayoutError, ToolchainError

_DTYPES = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
# Stages of the K/V ring by head dim: as deep as the shared memory allows (see AttentionConfig.smem_bytes).
_DEFAULT_STAGES = {64: 8, 128: 5, 256: 4}
# The schedule sparse_attention picks, from same-run measurements on an H200 (docs/perf_notes.md,
# bench/results/): persistent ping-pong CTAs win at head_dim 64 and 128 when rows cost about the same (dense,
# top-k, sliding windows); one CTA per tile in heaviest-first order (cooperative) wins when rows differ a lot
# (causal) and at head_dim 256; layouts with 64-row blocks need the single-warpgroup kernel.
def _default_schedule(head_dim: int, balanced_rows: bool, block_m: int = 128) -> Schedule:
    if block_m % 128:
        return Schedule.SINGLE
    return Schedule.PINGPONG if head_dim <= 128 and balanced_rows else Schedule.COOPERATIVE


# -- config choice ------------------------------------------------------------------------------------------

def default_config(head_dim: int, dtype: torch.dtype | DType, layout=None, schedule: Schedule | None = None
                   ) -> AttentionConfig:
    """The config sparse_attention uses when none is given: a named config if one matches, else a derived one."""
    dt = dtype if isinstance(dtype, DType) else _DTYPES[dtype]
    bm = layout.block_m if layout is not None else 128
    bn = layout.block_n if layout is not None else 128
    if schedule is None:
        schedule = _default_schedule(head_dim, layout.balanced_rows() if layout is not None else True, bm)
    return _derived_config(head_dim, dt, bm, bn, schedule)


@lru_cache(maxsize=None)
def _derived_config(head_dim: int, dt: DType, bm: int, bn: int, schedule: Schedule) -> AttentionConfig:
    from .jit.spec import load_named_configs
    for cfg in load_named_configs().values():
        if (isinstance(cfg, AttentionConfig) and cfg.head_dim == head_dim and cfg.dtype is dt and cfg.block_m == bm
                and cfg.block_n == bn and cfg.schedule is schedule):
            return cfg
    single = schedule is Schedule.SINGLE
    # one 64-row warpgroup per CTA, 2-3 CTAs per SM: 128-key tiles fit the shared memory only at head_dim 64
    tile_n = 128 if bn % 128 == 0 and head_dim <= (64 if single else 128) else 64
    cfg = AttentionConfig(head_dim=head_dim, dtype=dt, schedule=schedule, tile_m=schedule.tile_m,
                          tile_n=tile_n, stages=4 if single else _DEFAULT_STAGES.get(head_dim, 2),
                          block_m=bm, block_n=bn)
    if cfg.problems():
        near = cfg.nearest_valid()
        if near is None or (near.block_m, near.block_n) != (bm, bn):
            raise InvalidConfigError(
                f"no sm90a attention kernel serves {bm}x{bn} layout blocks at head_dim {head_dim}: block_m must be "
                f"a multiple of 64 (128 for the two-warpgroup kernels) and block_n a multiple of 64; build the "
                f"layout with block_m=128, block_n=128 (reasons: {'; '.join(cfg.problems())})")
        cfg = near
    return cfg


@lru_cache(maxsize=None)
def _validated(config: AttentionConfig) -> AttentionConfig:
    return config.validate()


@lru_cache(maxsize=None)
def _json(config: AttentionConfig) -> str:
    return config.to_json()


def _resolve_config(config, head_dim: int, dtype: torch.dtype, layout) -> AttentionConfig:
    if config is None:
        return default_config(head_dim, dtype, layout)
    if isinstance(config, str):
        from .jit.spec import get_config
        config = get_config(config)
    if isinstance(config, Schedule):
        return default_config(head_dim, dtype, layout, schedule=config)
    if not isinstance(config, AttentionConfig):
        raise InvalidConfigError(f"config must be an AttentionConfig, a named config or a Schedule, "
                                 f"not {type(config).__name__}")
    _validated(config)
    want = _DTYPES[dtype]
    if config.head_dim != head_dim or config.dtype is not want:
        raise InvalidConfigError(
            f"config {config.kernel_name} is for head_dim={config.head_dim}, dtype={config.dtype.value}; the inputs "
            f"have head_dim={head_dim}, dtype={want.value}: pass config=None or a matching config")
    if (config.block_m, config.block_n) != (layout.block_m, layout.block_n):
        raise InvalidConfigError(
            f"config {config.kernel_name} serves {config.block_m}x{config.block_n} blocks but the layout has "
            f"{layout.block_m}x{layout.block_n}: use dataclasses.replace(config, block_m={layout.block_m}, "
            f"block_n={layout.block_n}) or config=None")
    return config


# -- input checks -------------------------------------------------------------------------------------------

def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}; "
                             f"for (batch, seq, heads, head_dim) tensors pass t.transpose(1, 2) (a view, no copy)")
        if t.dtype not in _DTYPES:
            raise InputError(f"{name} has dtype {t.dtype}; use torch.float16 or torch.bfloat16 (e.g. {name}.half())")
        if t.stride(-1) != 1:
            raise InputError(f"{name} must have a contiguous last (head_dim) dimension, got strides {t.stride()}; "
                             f"call {name}.contiguous()")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them to one dtype")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device}); move them to one")
    B, H, Sq, D = q.shape
    if k.shape != v.shape:
        raise InputError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[3] != D:
        raise InputError(f"k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head_dim")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise InputError(f"q has {H} heads, k/v {k.shape[1]}: the query heads must be a multiple of the K/V heads "
                         f"(GQA/MQA)")
    if min(B, H, Sq, k.shape[2]) == 0:
        raise InputError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")


def _check_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """TMA needs 16-byte aligned base addresses and 16-byte multiples for every non-unit stride."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16:
            raise InputError(f"{name} data pointer is not 16-byte aligned (a sliced view?); pass {name}.clone()")
        st, shape, es = t.stride(), t.shape, t.element_size()
        for d in range(3):
            if st[d] * es % 16 and shape[d] > 1:
                raise InputError(f"{name} stride {st} along dim {d} is not a multiple of 16 bytes; "
                                 f"pass {name}.contiguous()")


def _check_row_sched(s: torch.Tensor) -> None:
    """The kernel's scheduler reads one 16-byte (row, start, end, first block) entry per tile."""
    if s.dtype != torch.int32 or s.dim() != 3 or s.shape[2] != 4 or not s.is_contiguous() or s.data_ptr() % 16:
        raise InputError(f"row_sched must be the layout's row_schedule() (contiguous 16-byte aligned int32 "
                         f"[Hl, nq, 4]); got {s.dtype} {tuple(s.shape)} with strides {s.stride()}")


# -- the custom op ------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _config_from_json(text: str) -> KernelConfig:
    return KernelConfig.from_json(text)


@lru_cache(maxsize=None)
def _kernel_for(config_json: str):
    from .jit.kernels import build
    return build(_config_from_json(config_json))


@lru_cache(maxsize=None)
def _sm_count(device_index: int | None) -> int:
    from .jit.runtime import device_info
    return device_info(device_index if device_index is not None else torch.cuda.current_device()).sm_count


def _poison() -> bool:
    return os.environ.get("BSK_POISON", "") not in ("", "0")


def _attn_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
                   row_sched: torch.Tensor, meta: list[int], scale: float,
                   config_json: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's CUDA implementation. row_sched: the layout's row_schedule(); meta = [window_left, window_right,
    n_kblocks, rank_major] of the layout (rank_major = rows differ in length: order tiles heaviest-first across
    heads)."""
    _check_tma(q, k, v)
    _check_row_sched(row_sched)
    kernel = _kernel_for(config_json)
    B, H, Sq, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if _poison():
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    dev = q.device.index
    qs, ks, vs, os_, ls = q.stride(), k.stride(), v.stride(), o.stride(), lse.stride()
    args = kernel.Args(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr(),
        col_idx=col_idx.data_ptr(), block_kind=block_kind.data_ptr(), row_sched=row_sched.data_ptr(),
        batch=B, heads=H, heads_kv=k.shape[1], seq_q=Sq, seq_k=k.shape[2], head_dim=D,
        q_stride_b=qs[0], q_stride_h=qs[1], q_stride_s=qs[2],
        k_stride_b=ks[0], k_stride_h=ks[1], k_stride_s=ks[2],
        v_stride_b=vs[0], v_stride_h=vs[1], v_stride_s=vs[2],
        o_stride_b=os_[0], o_stride_h=os_[1], o_stride_s=os_[2],
        lse_stride_b=ls[0], lse_stride_h=ls[1],
        layout_heads=row_sched.shape[0], n_qblocks=row_sched.shape[1], n_kblocks=meta[2],
        col_stride=col_idx.stride(0),
        window_left=meta[0], window_right=meta[1],
        scale=scale, sm_count=_sm_count(dev), rank_major=meta[3],
    )
    # on q's device and torch's current stream there (the raw handle of torch.cuda.current_stream(dev))
    if dev == torch.cuda.current_device():
        kernel.launch(args, torch._C._cuda_getCurrentRawStream(dev))
    else:
        with torch.cuda.device(dev):
            kernel.launch(args, torch._C._cuda_getCurrentRawStream(dev))
    return o, lse


@torch.library.custom_op("blackwell_sparsek::attn_fwd", mutates_args=())
def _attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
              row_sched: torch.Tensor, meta: list[int], scale: float,
              config_json: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention forward (see _attn_fwd_impl)."""
    return _attn_fwd_impl(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json)


def _direct_call_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Eager calls skip the dispatcher (tens of microseconds a call on a slow host, as much as a short kernel)
    when it would only forward to _attn_fwd_impl: plain tensors, no TorchDispatchMode or TorchFunctionMode
    active, and no input that needs autograd (the op has no backward: the dispatcher path reports that)."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


@_attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json):
    B, H, Sq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Sq), dtype=torch.float32)


# -- public API ---------------------------------------------------------------------------------------------

_warned_fallback = False


def _fallback_warning(reason: str) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"blackwell_sparsek: {reason}; sparse_attention runs the (slow, O(S^2) memory) reference "
                      f"implementation instead", RuntimeWarning, stacklevel=3)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout, *, causal: bool = False,
                     scale: float | None = None, config=None, return_lse: bool = False):
    """Block-sparse attention: softmax(scale · Q Kᵀ + mask) V over the blocks ``layout`` lists.

    q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D) with H % Hkv == 0 (GQA/MQA). (B, S, H, D) tensors are accepted as
    ``t.transpose(1, 2)`` views (strides, no copy). fp16 or bf16, D in {64, 128, 256}. ``causal`` intersects the
    layout with the bottom-right aligned causal mask. Returns O in q's memory layout, and with ``return_lse`` also
    the float32 log-sum-exp (B, H, Sq); rows with no visible key give O = 0 and LSE = -inf.
    """
    _check_inputs(q, k, v)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    scale = float(scale)
    if not math.isfinite(scale):
        raise InputError(f"scale must be finite, got {scale}")
    if causal:
        if torch.compiler.is_compiling() and "causal" not in getattr(layout, "_cache", {}):
            raise LayoutError("under torch.compile, causal=True needs the causal layout prepared eagerly: call "
                              "layout.with_causal() once before the compiled function (it is cached)")
        layout = layout.with_causal()
    layout.validate_for(B, H, Sq, Sk)

    if torch.compiler.is_compiling():
        # Traced by dynamo: no file system, no caches with side effects. The config is a trace-time constant
        # and the layout must already live on q's device (layout.to('cuda') before compiling).
        if layout.device != q.device:
            raise LayoutError(f"under torch.compile the layout must already be on {q.device}: call "
                              f"layout.to({str(q.device)!r}) once before the compiled function")
        cfg_json = _config_json_const(config, D, q.dtype, layout.block_m, layout.block_n, layout.balanced_rows())
        lay, fwd = layout, _attn_fwd
    else:
        if not q.is_cuda:
            _fallback_warning("the inputs are not on a CUDA device")
            return _reference(q, k, v, layout, scale, return_lse)
        plan = _eager_plan(layout, config, D, q.dtype, q.device)
        if plan is None:
            _fallback_warning("no nvcc to build the kernel and no cached build")
            return _reference(q, k, v, layout, scale, return_lse)
        cfg_json, lay = plan
        fwd = _attn_fwd_impl if _direct_call_ok(q, k, v) else _attn_fwd  # the op's body, or through the dispatcher
    o, lse = fwd(q, k, v, lay.col_idx, lay.block_kind, lay.row_schedule(), _meta(lay), scale, cfg_json)
    return (o, lse) if return_lse else o


def _meta(lay) -> list[int]:
    return [lay.window_left, lay.window_right, lay.n_kblocks, int(not lay.uniform_rows())]


def _eager_plan(layout, config, head_dim: int, dtype: torch.dtype, device: torch.device):
    """(config JSON, layout on the device) for an eager call, or None when the kernel cannot be had (fallback).
    Kept in the layout's cache per (config, head_dim, dtype, device) when config is None, a name or a Schedule, so
    a repeated call skips the config choice (an AttentionConfig object is checked on every call)."""
    key = ("plan", config, head_dim, dtype, device) if config is None or isinstance(config, (str, Schedule)) else None
    got = layout._cache.get(key) if key is not None else None
    if got is None:
        cfg = _resolve_config(config, head_dim, dtype, layout)
        if config is None and not _kernel_available(cfg):
            return None
        got = (_json(cfg), layout.to(device))
        if key is not None:
            layout._cache[key] = got
    return got


@torch.compiler.assume_constant_result
def _config_json_const(config, head_dim, dtype, block_m, block_n, balanced_rows) -> str:
    """The kernel config as JSON, computed once at trace time from plain values (a torch.compile constant)."""
    class _Geom:  # just what default_config and _resolve_config read of a layout
        pass
    g = _Geom()
    g.block_m, g.block_n = block_m, block_n
    g.balanced_rows = lambda: balanced_rows
    return _json(_resolve_config(config, head_dim, dtype, g))


def _reference(q, k, v, layout, scale, return_lse):
    from .reference import attention_reference
    o, lse = attention_reference(q, k, v, layout, scale=scale)
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o


@lru_cache(maxsize=None)
def _kernel_available(cfg: AttentionConfig) -> bool:
    """True when the kernel is cached or can be compiled here (so a missing nvcc can fall back)."""
    from .jit.kernels import build
    try:
        build(cfg)
    except ToolchainError:
        return False
    return True


def precompile(*configs, dtype: torch.dtype | None = None, head_dim: int | None = None, layout=None):
    """Build kernels ahead of time (e.g. before CUDA-graph capture or torch.compile). Returns the kernels.

    Pass configs (AttentionConfig or named config strings), or ``head_dim=``/``dtype=`` (and optionally
    ``layout=``) to build the config ``sparse_attention`` would pick.
    """
    from .jit.kernels import build
    from .jit.spec import get_config
    todo = [get_config(c) if isinstance(c, str) else c for c in configs]
    if head_dim is not None or dtype is not None:
        if head_dim is None or dtype is None:
            raise InvalidConfigError("precompile needs both head_dim= and dtype= (or explicit configs)")
        todo.append(default_config(head_dim, dtype, layout))
    return [build(c.validate()) for c in todo]


__all__ = ["sparse_attention", "precompile", "default_config"]
