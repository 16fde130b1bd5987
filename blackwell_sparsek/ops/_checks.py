"""Argument checks of the attention op layer, shared by ``sparse_attention`` (before it picks a kernel or falls
back to the reference, so the CPU and the GPU accept exactly the same calls) and by the raw custom op
``blackwell_sparsek::attn_fwd`` (which also takes index tensors from its caller). Every error names the fix.

Everything here except ``check_pointers`` and ``check_index_values`` reads only shapes, strides, dtypes and Python
values, so it also runs while torch.compile traces ``sparse_attention``.
"""
from __future__ import annotations

import math
import numbers

import torch

from ..families.attn_fwd import AttentionConfig
from ..jit.spec import DType
from ..errors import InputError, LayoutError
from .. import layout as _layout
from ..layout import BlockSparseLayout

HEAD_DIMS = (64, 128, 256)
DTYPES = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
_DTYPE_NAMES = {"fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16,
                "bf16": DType.BF16, "bfloat16": DType.BF16}
INT32_MAX = (1 << 31) - 1
FLOAT32_MAX = 3.4028234663852886e38
# The reference fallback computes in float64 with dense O(B·H·Sq·Sk) scores: refused above this many bytes,
# before any of them is allocated (a forgotten .cuda() on a long sequence would otherwise take the machine's memory).
FALLBACK_MAX_BYTES = 4 << 30
# ... and above this many element-mask entries (Hl*Sq*Sk): the limit of to_element_mask(), which the reference
# uses, so the user sees this error rather than one about a method they never called.
FALLBACK_MAX_MASK = 1 << 26
_KIND_MAX = 3          # FULL | BOUNDS | RULE
_COLUMN_BITS = 24      # a row schedule entry's 'first' = column | kind << 24


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- plain arguments ------------------------------------------------------------------------------------------

def as_dtype(dtype) -> DType:
    """The kernel dtype for a torch dtype, a DType or a name ('fp16', 'bf16', 'float16', 'bfloat16', 'half')."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, torch.dtype) and dtype in DTYPES:
        return DTYPES[dtype]
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise InputError(f"dtype {dtype!r} is not supported: the kernels compute in torch.float16 or torch.bfloat16 "
                     f"(also accepted: 'fp16', 'bf16'); cast the inputs with .half() or .bfloat16()")


def check_head_dim(head_dim) -> int:
    """head_dim as an int in HEAD_DIMS, else InputError saying how to pad to the next supported size."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise InputError(f"head_dim must be an int (64, 128 or 256), got {head_dim!r}")
    if head_dim in HEAD_DIMS:
        return head_dim
    if head_dim <= 0:
        raise InputError(f"head_dim {head_dim}: q, k and v need a last dimension of 64, 128 or 256")
    pad = next((d for d in HEAD_DIMS if d > head_dim), None)
    if pad is None:
        raise InputError(f"head_dim {head_dim} is not supported: kernels exist for head_dim 64, 128 and 256 "
                         f"(larger accumulators do not fit in registers)")
    raise InputError(
        f"head_dim {head_dim} is not supported: kernels exist for head_dim 64, 128 and 256. Pad q, k and v with "
        f"zeros to {pad} (torch.nn.functional.pad(t, (0, {pad - head_dim}))), pass "
        f"scale=1/math.sqrt({head_dim}) (the logits of head_dim {head_dim}) and keep o[..., :{head_dim}]")


def check_scale(scale, head_dim: int):
    """The softmax scale as a float that float32 holds (the kernel takes a float32), or a SymFloat under tracing."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, torch.SymFloat):  # a dynamic float under torch.compile: the op checks the value it gets
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        hint = " (pass float(scale), a Python number)" if isinstance(scale, torch.Tensor) else ""
        raise InputError(f"scale must be a real number, got {type(scale).__name__} {scale!r}{hint}")
    s = float(scale)
    if not (math.isfinite(s) and abs(s) <= FLOAT32_MAX):
        raise InputError(f"scale {scale!r} is not a finite float32 (the kernel computes in float32, |scale| <= "
                         f"{FLOAT32_MAX:.4g}); pass a finite scale, e.g. None for 1/sqrt(head_dim)")
    return s


def check_causal(causal, name: str = "causal") -> bool:
    """A flag argument (causal, deterministic): a bool (numpy's too), never a truthy string or number."""
    if isinstance(causal, bool) or (type(causal).__module__ == "numpy" and type(causal).__name__ in ("bool", "bool_")):
        return bool(causal)
    raise InputError(f"{name} must be True or False, got {type(causal).__name__} {causal!r}")


def check_layout_arg(layout) -> None:
    """The layout argument must be a BlockSparseLayout; common mix-ups get the constructor that converts them."""
    if isinstance(layout, BlockSparseLayout):
        return
    what = type(layout).__name__
    csc = getattr(_layout, "BlockSparseCSC", None)  # a layout's transpose() when that is not a layout itself
    if csc is not None and isinstance(layout, csc):
        fix = "this is the transposed (CSC) view of a layout; pass the layout itself (csc.transpose())"
    elif what == "BlockMask" and type(layout).__module__.startswith("torch.nn.attention"):
        fix = ("convert a FlexAttention BlockMask with BlockSparseLayout.from_flex_block_mask(block_mask, "
               "window_left=..., window_right=...) (the rule its mask_mod implements, if any) and pass the result")
    elif isinstance(layout, torch.Tensor) and layout.dtype == torch.bool:
        fix = ("for a bool block mask [nq, nk] or [H, nq, nk] use BlockSparseLayout.from_block_mask(mask, "
               "seq_q=..., seq_k=..., block_m=..., block_n=...) and pass the result")
    else:
        fix = ("build one with a BlockSparseLayout constructor (dense, causal, sliding_window, random_topk, "
               "from_block_mask, from_bsr, from_flex_block_mask, ...)")
    raise LayoutError(f"layout must be a BlockSparseLayout, got {what}: {fix}")


# -- q, k, v --------------------------------------------------------------------------------------------------

def check_inputs(q, k, v) -> None:
    """Types, ranks, dtypes, devices, shapes (GQA), non-empty, supported head_dim."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}; "
                             f"for (batch, seq, heads, head_dim) tensors pass t.transpose(1, 2) (a view, no copy)")
        if t.dtype not in DTYPES:
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
    if min(B, H, Sq, k.shape[1], k.shape[2]) == 0:
        raise InputError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}; batch, heads and sequence "
                         f"lengths must be >= 1")
    if H % k.shape[1]:
        raise InputError(f"q has {H} heads, k/v {k.shape[1]}: the query heads must be a multiple of the K/V heads "
                         f"(GQA/MQA)")
    check_head_dim(D)


def check_strides(q, k, v) -> None:
    """TMA needs 16-byte multiples for every non-unit stride (pointer alignment: check_pointers)."""
    m = 16 // q.element_size()  # q, k, v share one 2-byte dtype (check_inputs)
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    if not (qs[0] % m or qs[1] % m or qs[2] % m or ks[0] % m or ks[1] % m or ks[2] % m
            or vs[0] % m or vs[1] % m or vs[2] % m):
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        st, shape = t.stride(), t.shape
        for d in range(3):
            if st[d] % m and shape[d] > 1:
                raise InputError(f"{name} stride {st} along dim {d} is not a multiple of 16 bytes; "
                                 f"pass {name}.contiguous()")


def check_pointers(q, k, v) -> None:
    """TMA needs 16-byte aligned base addresses (real tensors only: not while tracing)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16:
            raise InputError(f"{name} data pointer is not 16-byte aligned (a sliced view?); pass {name}.clone()")


_DIM_NAMES = ("batch", "heads", "seq")


TMA_STRIDE_LIMIT = 1 << 40  # bytes: a TMA descriptor's strides (cuTensorMapEncodeTiled)


def check_launch_limits(q, k, v) -> None:
    """What the launcher takes: q, k, v and O strides below 2^40 bytes (TMA descriptors; O is q-shaped, with
    contiguous strides when q is not dense), LSE strides (H * Sq, Sq) and every size in 32-bit ints, and
    seq_q + seq_k well inside them (the kernel's query/key positions). The one place these limits live."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    e = q.element_size()
    if max(B, H, Hkv, Sq, Sk, H * Sq) > INT32_MAX or Sq + Sk > INT32_MAX - 4096:
        raise InputError(f"sizes B={B}, H={H}, Hkv={Hkv}, Sq={Sq}, Sk={Sk}: the kernel takes each (and H * Sq, "
                         f"the LSE's batch stride) as a 32-bit int, and Sq + Sk below 2^31 - 4096; split the call "
                         f"over heads or batch entries")
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    if max(qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], H * Sq * D) * e < TMA_STRIDE_LIMIT:
        return  # the common case in one comparison; the loop below names the offending stride
    for name, st in (("q", qs), ("k", ks), ("v", vs), ("O", (H * Sq * D, Sq * D, D))):
        for d in range(3):
            if st[d] * e >= TMA_STRIDE_LIMIT:
                raise InputError(
                    f"{name} has stride {st[d]} along its {_DIM_NAMES[d]} dim ({st[d] * e} bytes), at or over the "
                    f"2^40 bytes a TMA descriptor can stride; split the call over batch entries or heads "
                    f"(torch.split(q, n, dim=1), with the matching k/v heads)")


def check_backward_limits(q, k, v) -> None:
    """What the backward launcher takes (it keeps example 88's 32-bit strides, the forward's are 64-bit): every
    stride of q, k, v and of the (B, H, S, D) tensors it reads or writes densely (O, dO, dQ, the fp32 dQ accumulator)
    below 2^31 elements, and H*Sk*D too (an upper bound of dK/dV's size per batch entry, which the kernel writes per
    K/V head). Checked before a forward that will need the backward."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    if max(H * Sq * D, H * Sk * D, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2]) <= INT32_MAX:
        return  # the common case, once per training step: no per-size bookkeeping
    sizes = (("H*Sq*D (O, dO, dQ per batch entry)", H * Sq * D), ("H*Sk*D (dK, dV per batch entry)", H * Sk * D),
             *((f"{n} stride {i}", t.stride(i)) for n, t in (("q", q), ("k", k), ("v", v)) for i in range(3)))
    for what, n in sizes:  # a plain loop: torch.compile traces this check too
        if n > INT32_MAX:
            raise InputError(
                f"the attention backward takes its strides as 32-bit ints and {what} is {n} elements (the forward "
                f"alone handles this size): to train at this length split the call over heads, e.g. "
                f"torch.split(q, n, dim=1) with the matching k/v heads, so that H*Sq*D and H*Sk*D stay below 2^31")


def check_fallback_size(q: torch.Tensor, k: torch.Tensor, layout) -> None:
    """The reference fallback's memory, before it allocates any: InputError with the bytes and what to do."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scores = B * H * Sq * Sk
    mask = layout.num_heads * Sq * Sk
    # float64 scores and one same-size temporary, the bool element mask with its int8 kind grid and rule,
    # float64 copies of q and of k, v repeated to H heads
    need = 2 * 8 * scores + 4 * mask + 8 * B * H * (Sq + 2 * Sk) * D
    if need > FALLBACK_MAX_BYTES or mask > FALLBACK_MAX_MASK:
        raise InputError(
            f"sparse_attention has no kernel to run here (CPU tensors, or no nvcc and no cached build) and its "
            f"float64 reference fallback would need about {need / 2**30:.1f} GiB for these sizes "
            f"(B*H*Sq*Sk = {scores} scores, an element mask of {mask} entries; it refuses above "
            f"{FALLBACK_MAX_BYTES / 2**30:.0f} GiB or {FALLBACK_MAX_MASK} mask entries): run on a CUDA GPU "
            f"(H100/H200) with nvcc on PATH (or BSK_NVCC) or a prebuilt kernel cache (BSK_CACHE_DIR), or use "
            f"smaller inputs")


# -- the raw op's index tensors -------------------------------------------------------------------------------

def _want(name: str, t, dtype: torch.dtype, dim: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.dim() != dim:
        raise InputError(f"{name} must be a {dim}-D {dtype} tensor (the layout's), got {t.dim()}-D {t.dtype}")
    if t.device != device:
        raise InputError(f"{name} is on {t.device} but q is on {device}; pass the layout's tensors on q's device "
                         f"(layout.to(q.device))")
    if not t.is_contiguous():
        raise InputError(f"{name} must be contiguous, got strides {t.stride()}; pass {name}.contiguous()")


def check_op_args(q, k, v, col_idx, block_kind, row_sched, meta, scale, config: AttentionConfig) -> None:
    """Host-side checks of one call of the raw op: shapes, dtypes, devices, contiguity and alignment of every
    tensor, meta and scale, all consistent with q, k and the config. No device work, no sync."""
    check_inputs(q, k, v)
    check_strides(q, k, v)
    check_pointers(q, k, v)
    check_launch_limits(q, k, v)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    want = DTYPES[q.dtype]
    if config.head_dim != D or config.dtype is not want:
        raise InputError(f"config {config.kernel_name} is for head_dim={config.head_dim}, dtype="
                         f"{config.dtype.value}; q has head_dim={D}, dtype={want.value}: pass a matching config")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
        raise InputError(f"scale must be a finite float32 number, got {scale!r}")
    nq, nk = cdiv(Sq, config.block_m), cdiv(Sk, config.block_n)
    if (not isinstance(meta, (list, tuple)) or len(meta) not in (4, 5)
            or any(isinstance(x, bool) or not isinstance(x, int) for x in meta)
            or (len(meta) == 5 and meta[4] not in (-1, 0, 1))):
        raise InputError(f"meta must be 4 or 5 ints [window_left, window_right, n_kblocks, rank_major"
                         f"(, deterministic backward: -1 follow torch, 0, 1)], got {meta!r}")
    wl, wr, n_k, rank_major = meta[:4]
    if not (-1 <= wl <= INT32_MAX and -1 <= wr <= INT32_MAX) or n_k != nk or rank_major not in (0, 1):
        raise InputError(f"meta {list(meta)} is not [window_left >= -1, window_right >= -1, n_kblocks = "
                         f"ceil(seq_k / block_n) = {nk}, rank_major 0 or 1]")
    dev = q.device
    _want("row_sched", row_sched, torch.int32, 3, dev)
    _want("col_idx", col_idx, torch.int32, 2, dev)
    _want("block_kind", block_kind, torch.uint8, 2, dev)
    hl, m = col_idx.shape
    if hl not in (1, H) or m < 1 or m > INT32_MAX:
        raise InputError(f"col_idx must be [Hl, M] with Hl 1 or the {H} query heads and 1 <= M < 2^31, got "
                         f"{tuple(col_idx.shape)}")
    if block_kind.shape != col_idx.shape:
        raise InputError(f"block_kind must have col_idx's shape {tuple(col_idx.shape)}, got "
                         f"{tuple(block_kind.shape)}")
    if tuple(row_sched.shape) != (hl, nq, 4):
        raise InputError(f"row_sched must be the layout's row_schedule(): [Hl={hl}, nq=ceil(seq_q / block_m)={nq}, "
                         f"4] int32, got {tuple(row_sched.shape)}")
    if row_sched.data_ptr() % 16:
        raise InputError("row_sched must be 16-byte aligned (the kernel reads one 16-byte entry per tile); pass "
                         "the layout's row_schedule() or row_sched.clone()")


def check_index_values(col_idx, block_kind, row_sched, n_qblocks: int, n_kblocks: int) -> None:
    """The values the kernel indexes with: every schedule entry's row in [0, nq) (each row once per head),
    0 <= start <= end <= M, its first block's column < nk and kind <= 3; every col_idx in [0, nk), every
    block_kind <= 3. A few reductions on the tensors' device and one host sync."""
    m = col_idx.shape[1]
    row, start, end, first = row_sched.unbind(2)
    order = torch.arange(n_qblocks, device=row.device, dtype=row.dtype)
    col0 = first & ((1 << _COLUMN_BITS) - 1)
    checks = {
        f"a schedule entry's row lies outside [0, nq={n_qblocks}) or a row is listed twice":
            (torch.sort(row, dim=1).values != order).any(),
        f"a schedule entry's range [start, end) lies outside col_idx's {m} columns or has start > end":
            ((start < 0) | (start > end) | (end > m)).any(),
        f"a schedule entry's first block has a column >= n_kblocks={n_kblocks} or a kind > {_KIND_MAX}":
            ((first < 0) | (col0 >= n_kblocks) | ((first >> _COLUMN_BITS) > _KIND_MAX)).any(),
        f"col_idx holds a column outside [0, n_kblocks={n_kblocks})": ((col_idx < 0) | (col_idx >= n_kblocks)).any(),
        f"block_kind holds a value > {_KIND_MAX}": (block_kind > _KIND_MAX).any(),
    }
    bad = torch.stack(list(checks.values())).tolist()  # the one host sync
    for what, b in zip(checks, bad):
        if b:
            raise InputError(f"{what}: pass a layout's own col_idx, block_kind and row_schedule() "
                             f"(BlockSparseLayout validates them), not hand-made index tensors")
