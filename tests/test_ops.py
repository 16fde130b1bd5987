"""CPU tests of the op layer: when an eager call may skip the dispatcher; the op's own argument checks."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import blackwell_sparsek as bsk
from blackwell_sparsek.errors import InputError
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.ops.attention import _attn_fwd_impl, _check_op_call, _direct_path, _meta


class _Sub(torch.Tensor):
    pass


class _DispatchLog(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _FunctionLog(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _qkv(**kw):
    return [torch.zeros(1, 1, 4, 8, **kw) for _ in range(3)]


def test_plain_tensors_call_the_implementation_directly():
    assert _direct_path(*_qkv()) == "launch"
    with torch.no_grad():
        assert _direct_path(*_qkv(requires_grad=True)) == "launch"
    q, k, v = _qkv()
    assert _direct_path(q, k, v.requires_grad_()) == "autograd"  # EagerAttention, not the op's autograd


def test_modes_subclasses_and_transforms_go_through_the_dispatcher():
    q, k, v = _qkv()
    assert _direct_path(q.as_subclass(_Sub), k, v.detach()) is None
    with _DispatchLog():
        assert _direct_path(*_qkv()) is None
    with _FunctionLog():
        assert _direct_path(*_qkv()) is None
    seen = []

    def f(x):
        seen.append(_direct_path(x, k, v))
        return x.sum()
    torch.func.grad(f)(torch.ones(1, 1, 4, 8))
    assert seen == [None]  # torch.func needs the op's registered autograd
    assert _direct_path(*_qkv()) == "launch"


def test_row_schedule_argument_checked_before_any_kernel():
    lay = bsk.BlockSparseLayout.causal(256)
    q, k, v = (torch.randn(1, 1, 256, 64, dtype=torch.float16) for _ in range(3))
    cfg = default_config(64, torch.float16, lay).to_json()
    good = lay.row_schedule()
    _check_op_call(q, k, v, lay.col_idx, lay.block_kind, good, _meta(lay), 0.125, cfg)  # the layout's own passes
    flat = torch.zeros(good.numel() + 1, dtype=torch.int32)
    strided = torch.zeros(*good.shape[:2], 8, dtype=torch.int32)[..., ::2]
    for bad in (good.long(), good[..., :3], strided, flat[1:].view(good.shape)):  # dtype, shape, stride, 4-byte offset
        with pytest.raises(InputError, match="row_sched"):
            _attn_fwd_impl(q, k, v, lay.col_idx, lay.block_kind, bad, _meta(lay), 0.125, cfg)
