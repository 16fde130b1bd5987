"""The PyTorch face of the kernels: input checks, config choice, one torch.library custom op per family.

``sparse_attention`` validates its inputs (typed errors that name the fix), picks a kernel config, and calls the
``blackwell_sparsek::attn_fwd`` custom op, whose fake implementation only computes shapes (so
``torch.compile(fullgraph=True)`` traces it without compiling anything) and whose real implementation launches the
cached kernel through ctypes on torch's current stream. Without a GPU or nvcc it falls back to the reference with a
one-time warning, after the same checks (under torch.compile through the ``blackwell_sparsek::attn_fwd_reference``
op). Argument checks live in ``_checks``.
"""
from __future__ import annotations

import warnings
from functools import lru_cache, partial
from typing import Optional

import torch

from .. import _env, _trusted
from ..errors import InputError, InvalidConfigError, LayoutError
from ..families.attn_fwd import AttentionConfig, Schedule, launch_args
from ..jit.spec import KernelConfig
from . import dispatch
from ._checks import (check_backward_limits, check_causal, check_fallback_size, check_index_values, check_inputs,
                      check_launch_limits, check_layout_arg, check_op_args, check_pointers, check_scale,
                      check_strides)
from .dispatch import config_from_json, default_config, json_of  # noqa: F401 - default_config is public

# -- the custom op ------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _op_config(config_json: str) -> AttentionConfig:
    """The validated attention config a raw op call names (cached per JSON text)."""
    try:
        cfg = config_from_json(config_json)
    except (TypeError, ValueError, AttributeError) as e:  # not JSON of a config object (InvalidConfigError too)
        raise InvalidConfigError(f"config_json must be an AttentionConfig's to_json(), got {config_json!r} "
                                 f"({e})") from None
    if not isinstance(cfg, AttentionConfig):
        raise InvalidConfigError(f"config_json is a {cfg.family} config; the attn_fwd op takes an AttentionConfig")
    return dispatch.validated(cfg)


@lru_cache(maxsize=None)
def _kernel_for(config_text: str):
    from ..jit.kernels import build
    return build(config_from_json(config_text))


def tile_counter(config_json: str, device) -> torch.Tensor | None:
    """The int32 a config that claims_tiles counts its claimed tiles in (its launcher zeroes it on the launch's
    stream); one per call, so calls on concurrent streams never share one. None for other configs."""
    if not config_from_json(config_json).claims_tiles:
        return None
    return torch.empty(1, dtype=torch.int32, device=device)


def _poison() -> bool:
    return _env.flag("BSK_POISON")


def _check_op_call(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json) -> AttentionConfig:
    """Every raw op call: the host-side checks; then, unless all three index tensors are marked as checked
    (blackwell_sparsek._trusted: a layout's own tensors, or ones this function checked before) or the current
    stream is capturing a CUDA graph (no sync allowed there), the value checks (one host sync), after which the
    tensors are marked. Returns the config."""
    if not isinstance(config_json, str):
        raise InvalidConfigError(f"config_json must be a str (config.to_json()), got {type(config_json).__name__}")
    cfg = _op_config(config_json)
    check_op_args(q, k, v, col_idx, block_kind, row_sched, meta, scale, cfg)
    if _trusted.is_marked(col_idx) and _trusted.is_marked(block_kind) and _trusted.is_marked(row_sched):
        return cfg
    if q.is_cuda and _capturing(q.device):
        return cfg
    check_index_values(col_idx, block_kind, row_sched, row_sched.shape[1], meta[2])
    _trusted.mark(col_idx, block_kind, row_sched)
    return cfg


def _capturing(device: torch.device) -> bool:
    """Whether torch's current stream on ``device`` (where the op launches) is capturing a CUDA graph."""
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _attn_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
                   row_sched: torch.Tensor, meta: list[int], scale: float,
                   config_json: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's implementation: checks (see attn_fwd), then the kernel on q's device and current stream."""
    _check_op_call(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json)
    if not q.is_cuda:
        raise InputError(f"blackwell_sparsek::attn_fwd runs on CUDA tensors, q is on {q.device}; "
                         f"blackwell_sparsek.sparse_attention falls back to the reference off the GPU")
    return _launch(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json)


def _launch(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate O and LSE and launch the kernel. Arguments already checked (by _check_op_call, or for a plain
    eager sparse_attention call by its own checks on the layout's tensors)."""
    kernel = _kernel_for(config_json)
    B, H, Sq, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if _poison():
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    dev = q.device.index
    dispatch.check_device(config_json, dev)
    counter = tile_counter(config_json, q.device)
    args = kernel.Args(**launch_args(q, k, v, o, lse, col_idx, block_kind, row_sched, meta, scale,
                                     dispatch.sm_count(dev), counter=counter))
    kernel.launch_on(args, dev)  # torch's current stream on q's device
    return o, lse


@torch.library.custom_op("blackwell_sparsek::attn_fwd", mutates_args=())
def _attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col_idx: torch.Tensor, block_kind: torch.Tensor,
              row_sched: torch.Tensor, meta: list[int], scale: float,
              config_json: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention forward on CUDA tensors: (O in q's memory layout, LSE float32 (B, H, Sq)).

    Arguments: q (B, H, Sq, D), k and v (B, Hkv, Sk, D); a layout's ``col_idx``, ``block_kind`` and
    ``row_schedule()`` on q's device; meta = [window_left, window_right, n_kblocks, rank_major(, deterministic)]
    (``_meta(layout)``: rank_major = rows differ in length, order tiles heaviest-first across heads; the backward's
    mode); the softmax scale; the kernel config as ``AttentionConfig.to_json()``.

    Contract. Every call checks on the host, without touching the device: dtypes, devices (q's), shapes consistent
    with each other, with q/k and with the config (row_sched [Hl, ceil(Sq / block_m), 4] int32 with Hl 1 or H,
    col_idx int32 and block_kind uint8 both [Hl, M]), contiguity and 16-byte alignment, meta's length and values
    (n_kblocks = ceil(Sk / block_n)), a finite float32 scale, strides within the launcher's range. The *values*
    the kernel indexes with (each schedule row in [0, nq) once per head, 0 <= start <= end <= M, the first block's
    column < n_kblocks and kind <= 3, every col_idx in [0, n_kblocks), every block_kind <= 3) are checked with a
    few reductions and one host sync, and the tensors are then marked as checked, so later calls with the same
    tensors skip it; a BlockSparseLayout's own tensors are marked when the layout makes them. Two exceptions: a
    call made while the current stream captures a CUDA graph runs only the host-side checks (no sync is allowed
    there), and marks are per tensor, so index tensors taken from two different layouts are not checked against
    each other. Always pass one layout's own tensors; hand-made index tensors must be checked eagerly (one call
    outside capture) before they are captured.
    """
    return _attn_fwd_impl(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json)


def _direct_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """How an eager call skips the dispatcher (tens of microseconds a call on a slow host, as much as a short
    kernel; with autograd, hundreds): "launch" (no input needs autograd), "autograd" (through
    attention_bwd.EagerAttention), or None (the ops: a tensor subclass, a TorchDispatchMode or TorchFunctionMode,
    or a torch.func transform is active, and those need the ops' registrations)."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return None
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return "launch"
    return "autograd" if torch._C._functorch.peek_interpreter_stack() is None else None


def _fake_outputs(q, k):
    B, H, Sq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Sq), dtype=torch.float32)


@_attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json):
    return _fake_outputs(q, k)


@torch.library.custom_op("blackwell_sparsek::attn_fwd_reference", mutates_args=())
def _attn_fwd_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_ptr: torch.Tensor,
                        col_idx: torch.Tensor, block_kind: torch.Tensor, geom: list[int],
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference fallback as an op (what a torch.compile'd sparse_attention runs on CPU tensors): the layout
    (row_ptr, col_idx, block_kind, geom = [block_m, block_n, window_left, window_right]) is rebuilt and
    validated, then the float64 reference runs. Same outputs as attn_fwd."""
    _fallback_warning("the inputs are not on a CUDA device")
    with torch.no_grad():  # differentiable through the op's registered backward
        return _fallback(q, k, v, _reference_layout(q, k, row_ptr, col_idx, block_kind, geom), scale)


def _reference_layout(q, k, row_ptr, col_idx, block_kind, geom):
    from ..layout import BlockSparseLayout
    return BlockSparseLayout(row_ptr, col_idx, block_kind, seq_q=q.shape[2], seq_k=k.shape[2], block_m=geom[0],
                             block_n=geom[1], window_left=geom[2], window_right=geom[3])


@_attn_fwd_reference.register_fake
def _attn_fwd_reference_fake(q, k, v, row_ptr, col_idx, block_kind, geom, scale):
    return _fake_outputs(q, k)


def _reference_setup(ctx, inputs, output) -> None:
    q, k, v, row_ptr, col_idx, block_kind, geom, scale = inputs
    ctx.save_for_backward(q, k, v, row_ptr, col_idx, block_kind)
    ctx.geom, ctx.scale = list(geom), float(scale)


@torch.library.custom_op("blackwell_sparsek::attn_bwd_reference", mutates_args=())
def _attn_bwd_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_o: torch.Tensor,
                        grad_lse: Optional[torch.Tensor], row_ptr: torch.Tensor, col_idx: torch.Tensor,
                        block_kind: torch.Tensor, geom: list[int],
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of attn_fwd_reference in float64 (reference.attention_backward_reference: the values of the
    reference's own autograd, which the eager fallback uses; inside an op autograd does not record). An op of its
    own, so compiled graphs hold it unexamined; O(B·H·Sq·Sk) memory again."""
    from ..reference import attention_backward_reference, attention_reference
    layout = _reference_layout(q, k, row_ptr, col_idx, block_kind, geom)
    o, lse = attention_reference(q, k, v, layout, scale=scale)
    return attention_backward_reference(q, k, v, o, lse, grad_o, grad_lse, layout.to_element_mask().to(q.device),
                                        scale)


@_attn_bwd_reference.register_fake
def _attn_bwd_reference_fake(q, k, v, grad_o, grad_lse, row_ptr, col_idx, block_kind, geom, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _reference_backward(ctx, grad_o, grad_lse):
    q, k, v, row_ptr, col_idx, block_kind = ctx.saved_tensors
    dq, dk, dv = _attn_bwd_reference(q, k, v, grad_o, grad_lse, row_ptr, col_idx, block_kind, ctx.geom, ctx.scale)
    return dq, dk, dv, None, None, None, None, None


_attn_fwd_reference.register_autograd(_reference_backward, setup_context=_reference_setup)


# -- the reference fallback ---------------------------------------------------------------------------------

_warned_fallback = False


def _fallback_warning(reason: str) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"blackwell_sparsek: {reason}; sparse_attention runs the (slow, O(S^2) memory) reference "
                      f"implementation instead", RuntimeWarning, stacklevel=3)


def _fallback(q, k, v, layout, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference, O returned in q's dtype and memory layout (torch.empty_like(q), as the kernel),
    within check_fallback_size's bytes. Differentiable when an input requires grad (the same API as the GPU op's
    backward); otherwise without building a graph."""
    check_fallback_size(q, k, layout)
    from ..reference import attention_reference
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    with torch.set_grad_enabled(grad):
        o_ref, lse = attention_reference(q, k, v, layout, scale=scale)
    o = torch.empty_like(q)
    o.copy_(o_ref)
    return o, lse


# -- public API ---------------------------------------------------------------------------------------------

def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout, *, causal: bool = False,
                     scale: float | None = None, config=None, return_lse: bool = False,
                     deterministic: bool | None = None):
    """Block-sparse attention: softmax(scale · Q Kᵀ + mask) V over the blocks ``layout`` lists.

    q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D) with H % Hkv == 0 (GQA/MQA). (B, S, H, D) tensors are accepted as
    ``t.transpose(1, 2)`` views (strides, no copy). fp16 or bf16, D in {64, 128, 256}. ``causal`` intersects the
    layout with the bottom-right aligned causal mask. Returns O in q's memory layout, and with ``return_lse`` also
    the float32 log-sum-exp (B, H, Sq); rows with no visible key give O = 0 and LSE = -inf, rows that see an
    infinite or NaN logit give NaN. Every argument is checked before a kernel is chosen, so CPU tensors (which
    run the float64 reference, with a warning) are accepted or refused exactly as CUDA tensors are.

    Inputs that require grad get dQ, dK, dV from the block-sparse backward kernels (the CPU fallback: the
    reference's autograd). ``deterministic=True`` makes those gradients bitwise identical run to run (ordered dQ
    accumulation, slower); ``None`` follows ``torch.use_deterministic_algorithms``.
    """
    check_inputs(q, k, v)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = check_scale(scale, D)
    causal = check_causal(causal)
    det = -1 if deterministic is None else int(check_causal(deterministic, "deterministic"))
    check_layout_arg(layout)
    check_strides(q, k, v)
    check_launch_limits(q, k, v)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad:
        check_backward_limits(q, k, v)
    compiling = torch.compiler.is_compiling()
    if causal:
        if compiling and "causal" not in layout._cache:
            raise LayoutError("under torch.compile, causal=True needs the causal layout prepared eagerly: call "
                              "layout.with_causal() once before the compiled function (it is cached)")
        layout = layout.with_causal()
    layout.validate_for(B, H, Sq, Sk)

    if compiling:
        # Traced by dynamo: no file system, no caches with side effects, nothing computed here and kept on the
        # layout. The config is a trace-time constant (validated like the eager path's).
        cfg_json = dispatch.config_json_traced(config, D, q.dtype, layout.block_m, layout.block_n,
                                               layout.row_stats(), layout.split_plan())
        if needs_grad:
            dispatch.check_backward_config(cfg_json, det)
        if q.device.type != "cuda":  # the eager path's fallback, as an op the graph can hold
            o, lse = _attn_fwd_reference(q, k, v, layout.row_ptr, layout.col_idx, layout.block_kind,
                                         [layout.block_m, layout.block_n, layout.window_left, layout.window_right],
                                         scale)
            return (o, lse) if return_lse else o
        if layout.device != q.device:
            raise LayoutError(f"under torch.compile the layout must already be on {q.device}: call "
                              f"layout.to({str(q.device)!r}) once before the compiled function")
        o, lse = _traced_kernel_call(q, k, v, layout, causal, det, scale, cfg_json)
        return (o, lse) if return_lse else o

    check_pointers(q, k, v)
    cfg_json, lay = _eager_plan(layout, config, D, q.dtype, q.device)
    if needs_grad:
        dispatch.check_backward_config(cfg_json, det)
    if lay is None:
        _fallback_warning("the inputs are not on a CUDA device" if not q.is_cuda
                          else "no nvcc to build the kernel and no cached build")
        o, lse = _fallback(q, k, v, layout, scale)
        return (o, lse) if return_lse else o
    # Plain eager calls launch directly (through EagerAttention when they need gradients): every argument is
    # checked above and the index tensors are the layout's own; other calls go through the dispatcher to the op,
    # which checks its arguments itself.
    path = _direct_path(q, k, v)
    meta = _meta(lay, det)
    split_kv = dispatch.is_split(cfg_json)
    # the backward's view of the rows (a split-KV forward without gradients has no use for it)
    row_sched = None if path == "launch" and split_kv else lay.row_schedule()
    if split_kv:
        split = list(lay.split_plan())
        if path is None:
            o, lse = _split.attn_fwd_split(q, k, v, lay.col_idx, lay.block_kind, row_sched, lay.split_schedule(),
                                           meta, split, scale, cfg_json)
            return (o, lse) if return_lse else o
        launch = partial(_split.launch_split, col_idx=lay.col_idx, block_kind=lay.block_kind,
                         split_sched=lay.split_schedule(), meta=meta, split=split, scale=scale,
                         config_json=cfg_json)
    elif path is None:
        o, lse = _attn_fwd(q, k, v, lay.col_idx, lay.block_kind, row_sched, meta, scale, cfg_json)
        return (o, lse) if return_lse else o
    else:
        launch = partial(_launch, col_idx=lay.col_idx, block_kind=lay.block_kind, row_sched=row_sched, meta=meta,
                         scale=scale, config_json=cfg_json)
    if path == "launch":
        o, lse = launch(q, k, v)
    else:
        o, lse = _bwd.EagerAttention.apply(q, k, v, launch, lay.col_idx, lay.block_kind, row_sched, meta, scale,
                                           cfg_json)
    return (o, lse) if return_lse else o


def _traced_kernel_call(q, k, v, layout, causal: bool, det: int, scale: float, cfg_json: str):
    """The kernel op call of a compiled sparse_attention (arguments checked, layout on q's device): everything
    here must trace without a graph break (the config a constant, the layout's views built before tracing)."""
    if dispatch.is_split(cfg_json):
        return _split.attn_fwd_split(q, k, v, layout.col_idx, layout.block_kind, _built_row_schedule(layout, causal),
                                     _built_split_schedule(layout), _meta(layout, det), list(layout.split_plan()),
                                     scale, cfg_json)
    return _attn_fwd(q, k, v, layout.col_idx, layout.block_kind, _built_row_schedule(layout, causal),
                     _meta(layout, det), scale, cfg_json)


def _meta(lay, deterministic: int = -1) -> list[int]:
    """[window_left, window_right, n_kblocks, rank_major, deterministic] of a layout for the op. A window wider
    than both sequences keeps every key, as the clamp to seq_q + seq_k does, and then fits the kernel's 32-bit
    ints. The forward kernel reads the first four; the backward, the mode (-1: torch's deterministic setting)."""
    reach = lay.seq_q + lay.seq_k
    wl, wr = (w if w < 0 else min(w, reach) for w in (lay.window_left, lay.window_right))
    return [wl, wr, lay.n_kblocks, int(not lay.uniform_rows()), deterministic]


def _built_row_schedule(layout, causal: bool) -> torch.Tensor:
    """The layout's row schedule, which must exist before tracing: computed inside a compiled region it would be
    a cached intermediate of that region (under mode='reduce-overhead' a CUDA-graph output that the next replay
    overwrites)."""
    got = layout._cache.get("row_schedule")
    if got is None:
        which = "layout.with_causal().row_schedule()" if causal else "layout.row_schedule()"
        raise LayoutError(f"under torch.compile the kernel reads the layout's row schedule, which must be built "
                          f"before the compiled function runs: call {which} once eagerly on the layout on "
                          f"{layout.device} (it is cached), or make one eager sparse_attention call")
    return got


def _built_split_schedule(layout) -> torch.Tensor:
    """The layout's split schedule, built with the layout on CUDA (see _built_row_schedule)."""
    got = layout._cache.get("split_schedule")
    if got is None:
        raise LayoutError("under torch.compile the kernel reads the layout's split schedule, which must be built "
                          "before the compiled function runs: call layout.split_schedule() once eagerly (it is "
                          "cached), or make one eager sparse_attention call")
    return got


def _eager_plan(layout, config, head_dim: int, dtype: torch.dtype, device: torch.device):
    """(config JSON, layout on the device) for an eager call; the layout is None when the reference must run
    (CPU tensors, or no kernel can be had). The config is resolved and checked first in every case, so a call
    that the GPU refuses is refused on the CPU too. Kept in the layout's cache per (config, head_dim, dtype,
    device) when config is None, a name or a Schedule, so a repeated call skips the config choice (an
    AttentionConfig object is checked on every call)."""
    key = ("plan", config, head_dim, dtype, device) if config is None or isinstance(config, (str, Schedule)) else None
    got = layout._cache.get(key) if key is not None else None
    if got is None:
        cfg = dispatch.resolve_config(config, head_dim, dtype, layout)
        if device.type != "cuda":
            got = (json_of(cfg), None)
        elif config is None and not dispatch.kernel_available(cfg):
            return json_of(cfg), None
        else:
            got = (json_of(cfg), layout.to(device))
        if key is not None:
            layout._cache[key] = got
    return got


def precompile(*configs, dtype: torch.dtype | str | None = None, head_dim: int | None = None, layout=None):
    """Build kernels ahead of time (e.g. before CUDA-graph capture or torch.compile). Returns the kernels.

    Pass configs (AttentionConfig objects, named configs, inline JSON or dicts, as the CLI takes them), or
    ``head_dim=`` (64, 128 or 256) and ``dtype=`` (torch.float16 / torch.bfloat16, or 'fp16' / 'bf16'), and
    optionally ``layout=``, to build the config ``sparse_attention`` would pick. Everything is checked before
    anything is compiled.
    """
    from ..jit.kernels import build
    from ..jit.spec import resolve_config
    todo = []
    for c in configs:
        if isinstance(c, (str, dict)):
            todo.append(resolve_config(c))
        elif isinstance(c, KernelConfig):
            todo.append(c.validate())
        else:
            raise InvalidConfigError(f"precompile takes configs (an AttentionConfig, a named config, inline JSON "
                                     f"or a dict), got {type(c).__name__} {c!r}")
    if head_dim is not None or dtype is not None:
        if head_dim is None or dtype is None:
            raise InvalidConfigError("precompile needs both head_dim= and dtype= (or explicit configs)")
        todo.append(default_config(head_dim, dtype, layout))
    elif layout is not None:
        raise InvalidConfigError("precompile's layout= picks the config for head_dim= and dtype=: pass them too")
    return [build(c) for c in todo]


from . import attention_split as _split  # noqa: E402 - the split-KV op (it imports this module)
from . import attention_bwd as _bwd  # noqa: E402 - the backward and EagerAttention (it imports this module)

__all__ = ["sparse_attention", "precompile", "default_config"]
