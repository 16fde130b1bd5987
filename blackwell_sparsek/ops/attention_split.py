"""Split-KV forward (layouts whose row lengths are skewed, layout/split.py): the ``blackwell_sparsek::attn_fwd_split``
custom op and its autograd (the backward of ``attn_fwd``: it reads the same O and LSE).

One launcher call runs two kernels on the current stream (templates/include/bsk/sm90/split_kv.hpp). The main kernel
(a ``split_kv`` config) runs the layout's ``split_schedule()``: the first ``S * K`` entries of every head are ``K``
pieces of each of its ``S`` longest rows, each writing its O (fp32, normalized by its own sum) and LSE to a workspace
``[B, H, S, K, block_m, D]`` / ``[B, H, S, K, block_m]``; the other rows write O and LSE as usual. The combine kernel
then merges every split row's pieces: ``LSE = m + log(sum_i exp(LSE_i - m))`` with ``m = max_i LSE_i``,
``O = sum_i exp(LSE_i - LSE) O_i``, in fp32, over the pieces in a fixed order (no atomics: bitwise deterministic),
into O (its dtype and strides) and LSE. A row whose pieces see no key gives O = 0, LSE = -inf; a NaN piece makes
the row NaN.
"""
from __future__ import annotations

import torch

from .. import _trusted
from ..errors import InputError, InvalidConfigError
from ..families.attn_fwd import launch_args
from . import attention as _fwd
from . import attention_bwd as _bwd
from . import dispatch


def check_split_args(row_sched: torch.Tensor, split_sched: torch.Tensor, split, cfg) -> tuple[int, int]:
    """Host-side checks of the split arguments (no device work): a split_kv config, split = [S, K] and a split
    schedule of shape [Hl, nq - S + S * K, 4] beside the row schedule. Returns (S, K)."""
    if not cfg.split_kv:
        raise InvalidConfigError(f"config {cfg.kernel_name} has split_kv=False; attn_fwd_split needs a split_kv "
                                 "config (sparse_attention picks one for a layout with a split_plan())")
    if (not isinstance(split, (list, tuple)) or len(split) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in split)):
        raise InputError(f"split must be [S, K] (layout.split_plan()), got {split!r}")
    s, k = split
    hl, nq = row_sched.shape[0], row_sched.shape[1]
    if not (1 <= s <= nq and 1 <= k <= (1 << 20)):
        raise InputError(f"split [S={s}, K={k}] must have 1 <= S <= nq={nq} and 1 <= K <= 2^20")
    want = (hl, nq - s + s * k, 4)
    if (not isinstance(split_sched, torch.Tensor) or split_sched.dtype != torch.int32
            or tuple(split_sched.shape) != want or split_sched.device != row_sched.device
            or not split_sched.is_contiguous() or split_sched.data_ptr() % 16):
        got = (tuple(split_sched.shape), split_sched.dtype, split_sched.device) if isinstance(
            split_sched, torch.Tensor) else type(split_sched).__name__
        raise InputError(f"split_sched must be the layout's split_schedule(): int32 {list(want)} on "
                         f"{row_sched.device}, contiguous and 16-byte aligned, got {got}")
    return s, k


def check_split_values(row_sched: torch.Tensor, split_sched: torch.Tensor, s: int, k: int) -> None:
    """The split schedule's values against the (checked) row schedule, one host sync: each row once (S split rows
    of K pieces, the rest whole), and each split row's pieces cover its blocks in order."""
    hl, nq = row_sched.shape[:2]
    pieces = split_sched[:, :s * k].long().view(hl, s, k, 4)
    rest = split_sched[:, s * k:].long()
    rows = torch.cat([pieces[:, :, 0, 0], rest[..., 0]], dim=1)
    by_row = torch.zeros(hl, nq, 4, dtype=torch.long, device=row_sched.device)
    by_row.scatter_(1, row_sched[..., :1].long().clamp(0, nq - 1).expand(hl, nq, 4), row_sched.long())
    safe = rows.clamp(0, nq - 1)
    whole = torch.gather(by_row, 1, safe[:, s:].unsqueeze(2).expand(hl, nq - s, 4))
    split_of = torch.gather(by_row, 1, safe[:, :s].unsqueeze(2).expand(hl, s, 4))
    bad = torch.stack([
        (torch.sort(rows, dim=1).values != torch.arange(nq, device=rows.device)).any(),
        (pieces[..., 0] != pieces[:, :, :1, 0]).any(),
        (rest != whole).any(),
        (pieces[:, :, 0, 1] != split_of[..., 1]).any() | (pieces[:, :, -1, 2] != split_of[..., 2]).any()
        | (pieces[:, :, 1:, 1] != pieces[:, :, :-1, 2]).any() | (pieces[..., 1] > pieces[..., 2]).any(),
    ]).tolist()
    if any(bad):
        raise InputError("split_sched is not a split of row_sched (each row once, pieces covering a row's blocks in "
                         "order): pass one layout's row_schedule() and split_schedule()")


def workspace(B: int, H: int, n_pieces: int, block_m: int, D: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The pieces' fp32 O [B, H, n_pieces, block_m, D] and LSE [B, H, n_pieces, block_m] (16-byte aligned)."""
    return (torch.empty((B, H, n_pieces, block_m, D), dtype=torch.float32, device=device),
            torch.empty((B, H, n_pieces, block_m), dtype=torch.float32, device=device))


def launch_split(q, k, v, col_idx, block_kind, split_sched, meta, split, scale, config_json):
    """Allocate O, LSE and the workspace; launch the split kernel and its combine. Arguments already checked."""
    s, kk = split
    cfg = dispatch.config_from_json(config_json)
    kernel = _fwd._kernel_for(config_json)
    B, H, Sq, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    ws_o, ws_lse = workspace(B, H, s * kk, cfg.block_m, D, q.device)
    if _fwd._poison():
        for t in (o, lse, ws_o, ws_lse):
            t.fill_(float("nan"))
    dev = q.device.index
    dispatch.check_device(config_json, dev)
    args = kernel.Args(**launch_args(q, k, v, o, lse, col_idx, block_kind, split_sched, meta, scale,
                                     dispatch.sm_count(dev), ws_o, ws_lse, s * kk, kk,
                                     counter=_fwd.tile_counter(config_json, q.device)))
    kernel.launch_on(args, dev)  # torch's current stream on q's device
    return o, lse


@torch.library.custom_op("blackwell_sparsek::attn_fwd_split", mutates_args=())
def attn_fwd_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, col_idx: torch.Tensor,
                   block_kind: torch.Tensor, row_sched: torch.Tensor, split_sched: torch.Tensor, meta: list[int],
                   split: list[int], scale: float, config_json: str) -> tuple[torch.Tensor, torch.Tensor]:
    """blackwell_sparsek::attn_fwd with the layout's rows split (split-KV): the same arguments and outputs, plus the
    layout's ``split_schedule()`` and ``split = list(layout.split_plan())``; the config must have split_kv=True.
    ``row_sched`` (the layout's ``row_schedule()``) is what the backward reads. Checks as attn_fwd's, and the
    split schedule's values against row_sched (one sync) unless the layout made it."""
    cfg = _fwd._check_op_call(q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json)
    s, kk = check_split_args(row_sched, split_sched, split, cfg)
    if not _trusted.is_marked(split_sched) and not (q.is_cuda and _fwd._capturing(q.device)):
        check_split_values(row_sched, split_sched, s, kk)
        _trusted.mark(split_sched)
    if not q.is_cuda:
        raise InputError(f"blackwell_sparsek::attn_fwd_split runs on CUDA tensors, q is on {q.device}; "
                         f"blackwell_sparsek.sparse_attention falls back to the reference off the GPU")
    return launch_split(q, k, v, col_idx, block_kind, split_sched, meta, [s, kk], scale, config_json)


@attn_fwd_split.register_fake
def _attn_fwd_split_fake(q, k, v, col_idx, block_kind, row_sched, split_sched, meta, split, scale, config_json):
    return _fwd._fake_outputs(q, k)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, col_idx, block_kind, row_sched, _split, meta, _parts, scale, config_json = inputs
    _bwd._setup_context(ctx, (q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json), output)


def _backward(ctx, grad_o, grad_lse):
    dq, dk, dv = _bwd._grads(ctx, grad_o, grad_lse)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd("blackwell_sparsek::attn_fwd_split", _backward, setup_context=_setup_context)
