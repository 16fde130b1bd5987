"""CPU tests of the op layer: when an eager call may skip the dispatcher."""
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from blackwell_sparsek.ops import _direct_call_ok


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
    assert _direct_call_ok(*_qkv())
    with torch.no_grad():
        assert _direct_call_ok(*_qkv(requires_grad=True))


def test_autograd_modes_and_subclasses_go_through_the_dispatcher():
    q, k, v = _qkv()
    assert not _direct_call_ok(q, k, v.requires_grad_())
    assert not _direct_call_ok(q.as_subclass(_Sub), k, v.detach())
    with _DispatchLog():
        assert not _direct_call_ok(*_qkv())
    with _FunctionLog():
        assert not _direct_call_ok(*_qkv())
    assert _direct_call_ok(*_qkv())
