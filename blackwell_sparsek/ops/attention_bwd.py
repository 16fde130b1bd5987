"""Backward of block-sparse attention: the ``blackwell_sparsek::attn_bwd`` custom op and the autograd formula of
``blackwell_sparsek::attn_fwd``.

Importing this module registers both (``torch.library.register_autograd`` on the forward op). The forward op's
arguments are all the backward gets of the layout (col_idx, block_kind, row_sched, meta), so the transposed view
the kernel walks (per key block, the query blocks that list it) is derived from them here, on their device, with
torch ops only (no host sync), and cached by the identity of those tensors (a layout keeps its device tensors, so
training steps reuse one view).

The backward kernel (family ``attn_bwd``, ``blackwell_sparsek.families.attn_bwd``) does everything in one launcher
call on torch's current stream: zero the fp32 dQ accumulator, prep (delta = rowsum(dO * O) - g_lse in fp32 and
LSE2 = LSE * log2(e), +inf on rows with no visible key), the main kernel, and the dQ convert. Under GQA the
transposed view stacks the query heads that share a K/V head, so the kernel sums their dK/dV in registers and
writes them per K/V head. On tensors that are not on a CUDA device the op computes the same formulas
densely in float64 (tests; the public API's CPU fallback is the reference's own autograd).
"""
from __future__ import annotations

import weakref
from functools import lru_cache, partial
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import attention as _fwd  # noqa: F401  (defines blackwell_sparsek::attn_fwd, whose autograd this registers)
from ..errors import InputError, InvalidConfigError
from ..families import attn_bwd as _family
from ..families.attn_bwd import AttnBwdConfig
from ..families.attn_fwd import AttentionConfig
from ..jit.spec import DType, KernelConfig
from ._checks import check_backward_limits

_DTYPES = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
_BOUNDS, _RULE = 1, 2        # block-kind bits (blackwell_sparsek.layout)
# The view's own bits for pairs of 64-wide key blocks: the half a query block does not list (attn_bwd_common.hpp)
PAIR_NO_LO, PAIR_NO_HI = 4, 8


# -- the transposed view -----------------------------------------------------------------------------------------

def _slot_rows(col_idx: torch.Tensor, row_sched: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, valid, rank) per col_idx slot [Hl, W]: the query-block row each slot belongs to, whether it is a listed
    block (padding after the head's last row is not), and its position in the row. From the schedule entries
    (row, start, end, first)."""
    hl, w = col_idx.shape
    nq = row_sched.shape[1]
    dev = col_idx.device
    rows = row_sched[..., 0].long()
    counts = torch.zeros(hl, nq, dtype=torch.long, device=dev)
    counts.scatter_(1, rows, (row_sched[..., 2] - row_sched[..., 1]).long())
    ptr = torch.zeros(hl, nq + 1, dtype=torch.long, device=dev)
    ptr[:, 1:] = torch.cumsum(counts, 1)
    pos = torch.arange(w, device=dev).expand(hl, w).contiguous()
    row = (torch.searchsorted(ptr, pos, right=True) - 1).clamp_(0, nq - 1)
    return row, pos < ptr[:, -1:], pos - torch.gather(ptr, 1, row)


def transposed_view(col_idx: torch.Tensor, block_kind: torch.Tensor, row_sched: torch.Tensor, n_kblocks: int,
                    seq_q: int, block_m: int, deterministic: bool = False, group: int = 1, block_n: int = 128,
                    sms: int = 132, interleave: int = 1
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout's transpose as the backward kernel reads it: (t_q_idx int32 [Hl, W], t_kind uint8 [Hl, W],
    t_sched int32 [Hl, nk, 4], t_rank int32 [Hl, W]). Row j of the transpose (key block j) lists, ascending, the
    query blocks whose row lists j; kinds are carried over, with BOUNDS added on the last query block when
    seq_q % block_m (its rows past seq_q): BlockSparseLayout.transpose()'s col_idx, block_kind and row_schedule()
    plus the forward's key-end BOUNDS bits (the kernel masks keys past seq_k as well; unmasked, S = 0 there and
    P = 2^-LSE2 overflows once LSE < -88). t_sched has the forward's packing: (key block, start, end, first query
    block | kind << 24), heaviest key blocks first (stable). t_rank: each entry's turn among the contributions to
    its query block's dQ, the order in which the deterministic kernel adds them (det_ranks(), for ``sms`` SMs and
    tile-order groups of ``interleave`` heads; without ``deterministic``, the entry's position in its query
    block's own list). W = col_idx's width (each head's nnz
    fits). Device ops only, no host sync.

    ``group`` > 1 (GQA: query heads per K/V head) stacks the rows of each group's heads into one layout per K/V
    head (query block qb of the group's r-th head becomes qb + r * nq): the kernel walks, per key block, every
    listed query block of all the heads that share its K/V and sums their dK/dV in registers. A shared layout
    (one head) stays shared; a per-head one gets Hl / group rows. W becomes group * W.

    ``block_n`` not a multiple of 128 (64, 192, ...): the kernel's CTA covers 128 keys, so the view's columns are
    128-key tiles, each two 64-key halves of one or two key blocks (64-wide blocks 2j and 2j + 1 make column j),
    listing the union of the query blocks of both halves (ceil(nk * block_n / 128) columns, W = col_idx's width
    * block_n / 64); an entry whose query block lists only one half carries PAIR_NO_HI or PAIR_NO_LO (that half's
    warpgroup skips it) and the other bits of the block it lists, an entry listing both halves the OR of their
    kinds (each rule is exact per element). The rest as above, the 128-key tile being the key block."""
    hl, w = col_idx.shape
    nq = row_sched.shape[1]
    nk = int(n_kblocks)
    dev = col_idx.device
    row, valid, rank = _slot_rows(col_idx, row_sched)
    col = col_idx.long()
    pairs = block_n % 128 != 0
    if pairs:
        if block_n <= 0 or block_n % 64:
            raise InputError(f"block_n {block_n}: the backward takes key blocks of a multiple of 64 columns")
        m = block_n // 64  # 64-key units per key block; unit u is half u % 2 of the kernel's 128-key column u // 2
        unit = col.unsqueeze(-1) * m + torch.arange(m, device=dev)
        no_other = torch.where(unit % 2 == 0, PAIR_NO_HI, PAIR_NO_LO).to(torch.uint8)
        block_kind = (block_kind.unsqueeze(-1) | no_other).reshape(hl, w * m)
        row, valid, rank = (t.unsqueeze(-1).expand(hl, w, m).reshape(hl, w * m) for t in (row, valid, rank))
        col, nk, w = (unit // 2).reshape(hl, w * m), (nk * m + 1) // 2, w * m
    if group * nq >= 1 << 24:  # the schedule packs a stacked query block in 24 bits (entry | kind << 24)
        raise InputError(f"{group} query heads per K/V head x {nq} query blocks do not fit the backward's 24-bit "
                         f"block index: split the call over query heads (each K/V head with its own group)")
    if group > 1:
        if hl > 1:
            if hl % group:
                raise InputError(f"a per-head layout of {hl} heads cannot be grouped by {group}")
            hl //= group
        else:
            row, valid, rank, col, block_kind = (t.expand(group, w) for t in (row, valid, rank, col, block_kind))
        r = torch.arange(group, device=dev).repeat(hl).view(hl * group, 1)
        row = row + r * nq
        row, valid, rank, col, block_kind = (t.reshape(hl, group * w) for t in (row, valid, rank, col, block_kind))
        nq_head, nq, w = nq, nq * group, w * group
    else:
        nq_head = nq
    end_key = nk * nq
    key = torch.where(valid, col * nq + row, torch.full_like(col, end_key))
    skey, order = torch.sort(key, dim=1, stable=True)
    kind = torch.gather(block_kind, 1, order)
    if pairs:
        skey, order, kind = _merge_pairs(skey, order, kind, end_key)
    svalid = skey < end_key
    t_q = torch.where(svalid, skey % nq, torch.zeros_like(skey))
    if seq_q % block_m:
        kind = kind | ((t_q % nq_head == nq_head - 1) & svalid).to(torch.uint8) * _BOUNDS
    kind = torch.where(svalid, kind, torch.zeros_like(kind))
    t_q_idx = t_q.to(torch.int32)
    t_rank = torch.where(svalid, torch.gather(rank, 1, order), torch.zeros_like(rank)).to(torch.int32)
    # the sorted keys' columns (nk past the listed ones) give each key block's [start, end) directly
    tcol = torch.where(svalid, torch.div(skey, nq, rounding_mode="floor"), torch.full_like(skey, nk)).contiguous()
    tptr = torch.searchsorted(tcol, torch.arange(nk + 1, device=dev).expand(hl, nk + 1).contiguous())
    tcounts = tptr[:, 1:] - tptr[:, :-1]
    korder = torch.sort(tcounts, dim=1, descending=True, stable=True).indices
    if pairs:
        t_rank = _positions(t_q, svalid, nq).to(torch.int32)
    if deterministic:
        t_rank = det_ranks(t_q, tcol, tptr, korder, block_m // 64, max(1, block_n // 128), sms,
                           interleave).to(torch.int32)
    start = torch.gather(tptr[:, :-1], 1, korder)
    end = torch.gather(tptr[:, 1:], 1, korder)
    packed = t_q_idx.long() | (kind.long() << 24)
    first = torch.where(end > start, torch.gather(packed, 1, start.clamp(max=w - 1)), torch.zeros_like(start))
    t_sched = torch.stack([korder, start, end, first], dim=2).to(torch.int32).contiguous()
    return t_q_idx.contiguous(), kind.contiguous(), t_sched, t_rank.contiguous()


def _merge_pairs(skey: torch.Tensor, order: torch.Tensor, kind: torch.Tensor, end_key: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted (pair column, query block) keys with their slot order and kinds -> the same with each pair listed
    once: where both halves list a query block, the first entry takes the OR of the two kinds less the PAIR_NO
    bits and the second moves past the listed entries (key end_key). No host sync."""
    dup = (skey[:, 1:] == skey[:, :-1]) & (skey[:, 1:] < end_key)  # entry i + 1 repeats entry i
    both = torch.nn.functional.pad(dup, (0, 1))
    later = torch.nn.functional.pad(dup, (1, 0))
    nxt = torch.nn.functional.pad(kind[:, 1:], (0, 1))
    kind = torch.where(both, (kind | nxt) & (0xFF ^ PAIR_NO_LO ^ PAIR_NO_HI), kind)
    skey = torch.where(later, torch.full_like(skey, end_key), skey)
    skey, again = torch.sort(skey, dim=1, stable=True)
    return skey, torch.gather(order, 1, again), torch.gather(kind, 1, again)


def _positions(t_q: torch.Tensor, valid: torch.Tensor, nq: int) -> torch.Tensor:
    """Each listed entry's position among its query block's entries (columns ascending; 0 elsewhere)."""
    w = t_q.shape[1]
    qkey = torch.where(valid, t_q, torch.full_like(t_q, nq))
    sq, o = torch.sort(qkey, dim=1, stable=True)
    first = torch.searchsorted(sq.contiguous(), sq.contiguous())
    pos = torch.arange(w, device=t_q.device).expand_as(sq) - first
    out = torch.empty_like(pos).scatter_(1, o, pos)
    return torch.where(valid, out, torch.zeros_like(out))


def det_ranks(t_q: torch.Tensor, tcol: torch.Tensor, tptr: torch.Tensor, korder: torch.Tensor, tiles_m: int,
              tiles_n: int, sms: int, interleave: int = 1, wave_ctas: int = 0) -> torch.Tensor:
    """The deterministic kernel's order of the dQ contributions to each query block: per entry of the transposed
    view (query block t_q, key block tcol, nk past the listed ones; tptr: each key block's [start, end); korder: the
    schedule), its turn among the entries of its query block.

    Turns follow the contributions' estimated arrival, so that CTAs rarely wait on each other. The launch order is
    the tile order's: groups of ``interleave`` (batch, head)s, one after the other; in a group, key blocks in
    schedule order, the group's heads interleaved, tiles_n CTAs per key block. A key block's CTA starts once the
    SMs have run the tiles launched before it in its group (estimated as interleave x its own head's, / sms), then
    reaches its p-th query block p * tiles_m 64-query tiles later; ties go to the lower key block. Arrival is ranked
    inside waves of at most sms // 2 consecutive CTAs of a group (wave first): a CTA waits only on CTAs of its own
    or an earlier wave of its group, and inside a wave on an earlier (estimate, key block) of another CTA, so the
    waits form no cycle, and a wave fits on the GPU at once, so no CTA waits on one that cannot start (half the SMs
    free for the kernel suffice). Heads that share a layout get the same turns. ``wave_ctas``: another wave size
    (measurements; the deadlock argument needs that many CTAs resident)."""
    wave_ctas = wave_ctas or max(1, sms // 2)
    if tiles_n * interleave > wave_ctas:
        raise ValueError(f"a wave of {wave_ctas} CTAs cannot hold one key block of {interleave} heads "
                         f"({tiles_n} CTAs each): use a smaller tile-order group")
    hl, w = t_q.shape
    nk = korder.shape[1]
    dev = t_q.device
    valid = tcol < nk
    counts = tptr[:, 1:] - tptr[:, :-1]
    pos = torch.empty_like(korder)
    pos.scatter_(1, korder, torch.arange(nk, device=dev).expand(hl, nk).contiguous())  # schedule position per block
    tiles = torch.gather(counts, 1, korder) * tiles_m * tiles_n  # CTA tiles per key block, schedule order
    before = torch.gather(torch.cumsum(tiles, 1) - tiles, 1, pos) * interleave  # tiles launched before, estimated
    wave = pos // (wave_ctas // (tiles_n * interleave))
    col = tcol.clamp(max=nk - 1)
    p = torch.arange(w, device=dev).expand(hl, w) - torch.gather(tptr[:, :-1], 1, col)
    arrival = torch.gather(before, 1, col) + p * tiles_m * sms  # sms x the estimate, exact in integers
    return turns(t_q, valid, (arrival, torch.gather(wave, 1, col)))


def turns(t_q: torch.Tensor, valid: torch.Tensor, keys: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Each valid entry's position among the entries of its query block t_q, ordered by ``keys`` (least significant
    first; entries are in key-block order, which breaks the remaining ties)."""
    hl, w = t_q.shape
    dev = t_q.device
    q_key = torch.where(valid, t_q.long(), torch.full_like(t_q, 1 << 40, dtype=torch.long))
    perm = torch.arange(w, device=dev).expand(hl, w)
    for key in (*keys, q_key):  # stable sorts, the least significant key first
        perm = torch.gather(perm, 1, torch.sort(torch.gather(key, 1, perm), dim=1, stable=True).indices)
    q_sorted = torch.gather(q_key, 1, perm).contiguous()
    turn = torch.arange(w, device=dev).expand(hl, w) - torch.searchsorted(q_sorted, q_sorted)
    rank = torch.zeros(hl, w, dtype=torch.long, device=dev)
    rank.scatter_(1, perm, turn)
    return torch.where(valid, rank, torch.zeros_like(rank))


_TCACHE: dict[int, tuple] = {}
_TCACHE_MAX = 64


def _transposed_cached(col_idx, block_kind, row_sched, n_kblocks, seq_q, block_m, deterministic=False, group=1,
                       block_n=128, sms=132, interleave=1):
    """transposed_view(), cached by the identity (and version) of the three layout tensors."""
    facts = (int(n_kblocks), int(seq_q), int(block_m), int(block_n), int(sms), int(interleave), col_idx._version,
             block_kind._version, row_sched._version)
    key = (id(col_idx), bool(deterministic), int(group))
    hit = _TCACHE.get(key)
    if hit is not None:
        refs, got_facts, view = hit
        if all(r() is t for r, t in zip(refs, (col_idx, block_kind, row_sched))) and got_facts == facts:
            return view
    view = transposed_view(col_idx, block_kind, row_sched, n_kblocks, seq_q, block_m, deterministic, group,
                           block_n, sms, interleave)
    if len(_TCACHE) >= _TCACHE_MAX:
        _TCACHE.pop(next(iter(_TCACHE)))
    _TCACHE[key] = (tuple(weakref.ref(t) for t in (col_idx, block_kind, row_sched)), facts, view)
    return view


# -- configs ---------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def bwd_config_json(fwd_config_json: str, deterministic: bool = False) -> str:
    """The backward kernel's config (JSON) for the forward config that produced O and LSE."""
    fwd = KernelConfig.from_json(fwd_config_json)
    if not isinstance(fwd, AttentionConfig):
        raise InvalidConfigError(f"attention backward needs an attn_fwd config, got family {fwd.family!r}")
    return _family.config_for(fwd.head_dim, fwd.dtype, fwd.block_m, fwd.block_n, deterministic).to_json()


@lru_cache(maxsize=None)
def _bwd_config(text: str) -> AttnBwdConfig:
    cfg = AttnBwdConfig.from_json(text)
    if not isinstance(cfg, AttnBwdConfig):
        raise InvalidConfigError(f"not an attn_bwd config: {text}")
    return cfg.validate()


@lru_cache(maxsize=None)
def _kernel_for(text: str):
    from ..jit.kernels import build
    return build(_bwd_config(text))


def _poison() -> bool:
    from .. import _env
    return _env.flag("BSK_POISON")


# -- the op --------------------------------------------------------------------------------------------------

# (batch, K/V head)s per group of the kernel's tile order: 0 = tile_group's choice; else the largest divisor of
# B * Hkv up to it. A module setting so a benchmark can compare values.
HEAD_GROUP = 0


def tile_group(bh: int, qdo_bytes: int, l2_bytes: int, want: int = 0, cap: int = 0) -> int:
    """(batch, K/V head)s per group of the backward's tile order (the launcher takes it as given): ``want`` > 0,
    else those whose Q and dO (read for every key block; all query heads of a K/V head: ``qdo_bytes``) fit in half
    of L2 (the forward's launcher applies the same rule to K/V); at most ``cap`` when given; the largest divisor
    of ``bh`` up to that."""
    g = want if want > 0 else (l2_bytes // 2) // max(1, qdo_bytes)
    g = max(1, min(bh, g, cap or bh))
    while bh % g:
        g -= 1
    return g


def _tma_ready(t: torch.Tensor) -> bool:
    es = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(t.stride(d) * es % 16 == 0 or t.shape[d] == 1 for d in range(3)))


def _check(q, k, v, o, lse, do, cfg: AttnBwdConfig) -> None:
    if q.dtype not in _DTYPES or not (q.dtype == k.dtype == v.dtype == o.dtype):
        raise InputError(f"q, k, v, o must share one dtype, float16 or bfloat16; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {o.dtype}")
    if _DTYPES[q.dtype] is not cfg.dtype or q.shape[-1] != cfg.head_dim:
        raise InvalidConfigError(f"{cfg.kernel_name} is for head_dim={cfg.head_dim}, {cfg.dtype.value}; the "
                                 f"inputs have head_dim={q.shape[-1]}, {q.dtype}")
    if do.shape != o.shape or lse.shape != o.shape[:3] or lse.dtype != torch.float32:
        raise InputError(f"grad_o {tuple(do.shape)} must match O {tuple(o.shape)} and LSE must be float32 "
                         f"{tuple(o.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}")


def _attn_bwd_cuda(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json,
                   trusted: bool = False):
    """``trusted``: q, k, v were checked by the eager forward and o is its output (TMA-ready, strides in range)."""
    cfg = _bwd_config(config_json)
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    if not _tma_ready(do):
        do = do.contiguous()
    for name, t in () if trusted else (("q", q), ("k", k), ("v", v), ("o", o)):
        if not _tma_ready(t):
            raise InputError(f"{name} strides {t.stride()} (or its address) are not 16-byte aligned for TMA")
    lse = lse.contiguous()
    glse = None if grad_lse is None else grad_lse.to(torch.float32).contiguous()
    det = cfg.deterministic
    kernel = _kernel_for(config_json)
    dev = q.device.index
    from . import dispatch
    dispatch.check_device(config_json, dev)  # arch and shared memory, once per (config, device)
    facts = dispatch.device_facts(dev)
    # deterministic: a wave of det_ranks must hold one key block of every head in the group
    cap = max(1, facts.sm_count // 2 // (cfg.tile_block_n // 128)) if det else 0
    group = tile_group(B * Hkv, 2 * H * Sq * D * q.element_size() // Hkv, facts.l2_bytes, HEAD_GROUP, cap)
    # GQA: the view stacks the query heads of each K/V head, so one CTA per key tile of a K/V head sums dK/dV over
    # its whole group in registers (dK/dV come out per K/V head; no per-query-head buffer, no second pass).
    t_q_idx, t_kind, t_sched, t_rank = _transposed_cached(col_idx, block_kind, row_sched, meta[2], Sq, cfg.block_m,
                                                          det, H // Hkv, cfg.block_n, facts.sm_count, group)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    work = _Workspace(B, H, Sq, D, det, q.device)
    if _poison():
        for t in (work.poisonable, dq, dk, dv):
            t.fill_(float("nan"))
    fields = _family.launch_args(q=q, k=k, v=v, o=o, do=do, lse=lse, glse=glse, lse2=work.ws[0], delta=work.ws[1],
                                 dq_acc=work.dq_acc, dq=dq, dk=dk, dv=dv, t_q_idx=t_q_idx, t_kind=t_kind,
                                 t_sched=t_sched, t_rank=t_rank if det else None, dq_sem=work.dq_sem,
                                 window_left=meta[0], window_right=meta[1], scale=scale,
                                 head_group=group)
    kernel.launch_on(kernel.Args(**fields), dev)  # torch's current stream on q's device
    return dq, dk, dv


class _Workspace:
    """One fp32 buffer for the LSE2 and delta rows (16-byte rows for their TMA loads), the dQ accumulator and the
    deterministic turn counters (one per 64-query dQ tile); the launcher's prep kernel zeroes the last two."""

    def __init__(self, B: int, H: int, Sq: int, D: int, det: bool, device):
        sq_pad = (Sq + 3) // 4 * 4
        n_ws, n_acc = 2 * B * H * sq_pad, B * H * Sq * D
        n_sem = B * H * ((Sq + 63) // 64) if det else 0
        self.buf = torch.empty(n_ws + n_acc + n_sem, dtype=torch.float32, device=device)
        self.ws = self.buf[:n_ws].view(2, B, H, sq_pad)
        self.dq_acc = self.buf[n_ws:n_ws + n_acc].view(B, H, Sq, D)
        self.dq_sem = self.buf[n_ws + n_acc:].view(torch.int32) if det else None
        self.poisonable = self.buf[:n_ws + n_acc]  # the turn counters stay as they are: prep must zero them


def element_mask(col_idx, block_kind, row_sched, meta, seq_q: int, seq_k: int, block_m: int,
                 block_n: int) -> torch.Tensor:
    """bool [Hl, seq_q, seq_k]: the element mask the op's layout arguments describe (for the dense path)."""
    hl = col_idx.shape[0]
    nq, nk = row_sched.shape[1], int(meta[2])
    row, valid, _ = _slot_rows(col_idx, row_sched)
    h = torch.arange(hl, device=col_idx.device).unsqueeze(1).expand_as(row)
    grid = torch.full((hl, nq, nk), -1, dtype=torch.int16, device=col_idx.device)
    grid[h[valid], row[valid], col_idx.long()[valid]] = block_kind[valid].to(torch.int16)
    g = grid[:, torch.arange(seq_q) // block_m][:, :, torch.arange(seq_k) // block_n]
    qp = torch.arange(seq_q).unsqueeze(1) + (seq_k - seq_q)
    kk = torch.arange(seq_k).unsqueeze(0)
    rule = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if meta[0] >= 0:
        rule &= kk >= qp - meta[0]
    if meta[1] >= 0:
        rule &= kk <= qp + meta[1]
    return (g >= 0) & (((g & _RULE) == 0) | rule.to(g.device))


def _attn_bwd_dense(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json):
    """The kernel's formulas densely in float64 (reference.attention_backward_reference) on the element mask the
    op's layout arguments describe."""
    cfg = _bwd_config(config_json)
    mask = element_mask(col_idx.cpu(), block_kind.cpu(), row_sched.cpu(), meta, q.shape[2], k.shape[2], cfg.block_m,
                        cfg.block_n).to(q.device)
    from ..reference import attention_backward_reference
    return attention_backward_reference(q, k, v, o, lse, do, grad_lse, mask, scale)


@torch.library.custom_op("blackwell_sparsek::attn_bwd", mutates_args=())
def attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
             do: torch.Tensor, grad_lse: Optional[torch.Tensor], col_idx: torch.Tensor, block_kind: torch.Tensor,
             row_sched: torch.Tensor, meta: list[int], scale: float,
             config_json: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of blackwell_sparsek::attn_fwd. meta = [window_left, window_right, n_kblocks, rank_major] as the
    forward got it; config_json: the attn_bwd config (bwd_config_json of the forward's)."""
    return _attn_bwd_impl(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json)


def _attn_bwd_impl(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json,
                   trusted: bool = False):
    """attn_bwd's body: what the op runs, and what an eager backward calls without the dispatcher (``trusted``:
    the arguments of a forward sparse_attention checked, so only dO and the config are checked again)."""
    _check(q, k, v, o, lse, do, _bwd_config(config_json))
    if not trusted:
        check_backward_limits(q, k, v)
    if q.is_cuda:
        return _attn_bwd_cuda(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale,
                              config_json, trusted=trusted)
    return _attn_bwd_dense(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale,
                           config_json)


@attn_bwd.register_fake
def _attn_bwd_fake(q, k, v, o, lse, do, grad_lse, col_idx, block_kind, row_sched, meta, scale, config_json):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# -- autograd of the forward op ----------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output) -> None:
    q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, col_idx, block_kind, row_sched)
    ctx.meta = list(meta)
    ctx.scale = float(scale)
    ctx.config_json = config_json


def deterministic_from_meta(meta) -> bool:
    """The backward's mode: meta[4] when the forward got one (1 deterministic, 0 fast; -1 or absent: follow
    torch.use_deterministic_algorithms). The forward kernel reads meta[0:4] only."""
    if len(meta) > 4 and meta[4] >= 0:
        return bool(meta[4])
    return torch.are_deterministic_algorithms_enabled()


def _grads(ctx, grad_o, grad_lse, bwd=attn_bwd):
    """dQ, dK, dV of the saved forward through ``bwd`` (the attn_bwd op, or its body for an eager call); the
    deterministic kernel (bitwise-identical gradients run to run) when deterministic_from_meta says so."""
    q, k, v, o, lse, col_idx, block_kind, row_sched = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    det = deterministic_from_meta(ctx.meta)
    return bwd(q, k, v, o, lse, grad_o, grad_lse, col_idx, block_kind, row_sched, ctx.meta, ctx.scale,
               bwd_config_json(ctx.config_json, det))


def _backward(ctx, grad_o, grad_lse):
    return (*_grads(ctx, grad_o, grad_lse), None, None, None, None, None, None)


torch.library.register_autograd("blackwell_sparsek::attn_fwd", _backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """Forward and backward of an eager sparse_attention call that needs gradients, without the dispatcher: the
    op's autograd (which torch.compile, dispatch modes, subclasses and torch.func use) costs some hundred
    microseconds of host time a step, more than a short kernel. ``launch(q, k, v) -> (o, lse)`` runs the forward
    kernel on arguments sparse_attention has checked; the rest are the forward op's arguments (row_sched: the
    layout's row_schedule(), which the backward reads)."""

    @staticmethod
    def forward(ctx, q, k, v, launch, col_idx, block_kind, row_sched, meta, scale, config_json):
        o, lse = launch(q, k, v)
        ctx.set_materialize_grads(False)  # an unused LSE costs no zero-filled gradient
        _setup_context(ctx, (q, k, v, col_idx, block_kind, row_sched, meta, scale, config_json), (o, lse))
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_o, grad_lse):
        return (*_grads(ctx, grad_o, grad_lse, partial(_attn_bwd_impl, trusted=True)), None, None, None, None, None,
                None, None)


__all__ = ["attn_bwd", "transposed_view", "element_mask", "bwd_config_json", "deterministic_from_meta"]
