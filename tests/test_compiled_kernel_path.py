"""A CPU guard for the compiled CUDA path of sparse_attention: the kernel op call (plain or split-KV; forward, and
with inputs that require grad the registered backward too) must trace under torch.compile(fullgraph=True) with no
graph break. A JSON parse inside that path once broke every compiled CUDA call, and only the GPU tests saw it.

CPU tensors stand in for CUDA ones: tracing runs the ops' fake implementations, then running the compiled graph
reaches the real forward op, which refuses tensors that are not on CUDA. That error is the sign that tracing (with
fullgraph=True, every graph break is an error at compile time) got through.
"""
from __future__ import annotations

import pytest
import torch

import blackwell_sparsek as bsk
import blackwell_sparsek.ops.attention as ops
import blackwell_sparsek.ops.attention_bwd  # noqa: F401  (the forward op's registered backward)
from blackwell_sparsek.errors import InputError
from blackwell_sparsek.ops import dispatch
from test_split_kv import global_rows

L = bsk.BlockSparseLayout


def _layout(split: bool):
    if split:
        lay = global_rows(5120, heads=2, band=0, n_random=1, seed=3)
        lay.split_schedule()
    else:
        lay = L.random_topk(seq_q=1024, k=3, seed=2, num_heads=2)
    lay.row_schedule()  # built before tracing, as on CUDA when the layout reaches its device
    return lay


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("split", [False, True], ids=["plain", "split_kv"])
def test_kernel_call_traces_without_graph_breaks(split, grad):
    lay = _layout(split)
    cfg = dispatch.default_config(128, torch.bfloat16, lay)
    assert cfg.split_kv == split
    cfg_json = cfg.to_json()
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: ops._traced_kernel_call(q, k, v, lay, False, -1, 0.088, cfg_json)[0],
                      fullgraph=True, backend="aot_eager" if grad else "eager")
    q, k, v = (torch.randn(1, 2, lay.seq_q, 128, dtype=torch.bfloat16, requires_grad=grad) for _ in range(3))
    with pytest.raises(InputError, match="runs on CUDA tensors"):
        f(q, k, v)
