"""GPU tests of split-KV (layouts with a few long rows): float64 reference, bitwise determinism, the unsplit
kernel's answer, the combine kernel against a float64 combine of the workspace it read, empty split rows and NaN
propagation, CUDA-graph replay, every tile claimed once by the persistent kernel, and the raw op. Skipped without
CUDA; outputs and workspace poisoned."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.families.attn_fwd import Schedule
from blackwell_sparsek.ops import attention_split as asplit
from blackwell_sparsek.ops import default_config
from blackwell_sparsek.reference import attention_reference, relative_error

from test_split_kv import combine_reference, global_and_empty_rows, global_rows

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H100/H200)")]
L = bsk.BlockSparseLayout
_SEED = [777]



def _rand(*shape, dtype):
    _SEED[0] += 1
    g = torch.Generator(device="cuda").manual_seed(_SEED[0])
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


def _layouts():
    return {
        "global_shared": global_rows(5120, band=0, n_random=1, seed=3),
        "global_per_head_odd": global_rows(5120 + 77, heads=2, band=0, n_random=1, seed=4),
        "global_local_rule": L.global_local(5120 + 50, n_global=2, window=200),
    }


@pytest.mark.parametrize("D,dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=["d128bf16", "d64fp16"])
@pytest.mark.parametrize("sched", [Schedule.COOPERATIVE, Schedule.PINGPONG])
@pytest.mark.parametrize("name", list(_layouts()))
def test_split_matches_reference_and_is_deterministic(name, sched, D, dtype):
    lay = _layouts()[name].to("cuda")
    assert lay.split_plan() is not None, lay
    cfg = default_config(D, dtype, lay, schedule=sched)
    assert cfg.split_kv
    B, H = 1, 2
    q, k, v = (_rand(B, H, lay.seq_q, D, dtype=dtype) for _ in range(3))
    o, lse = bsk.sparse_attention(q, k, v, lay, config=sched, return_lse=True)
    o2, lse2 = bsk.sparse_attention(q, k, v, lay, config=sched, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_reference(q, k, v, lay)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert relative_error(o, ref_o) <= 1e-2 and relative_error(lse, ref_lse) <= 1e-4
    assert torch.equal(o, o2) and torch.equal(lse, lse2), "split-KV must be bitwise deterministic"
    plain = dataclasses.replace(cfg, split_kv=False)
    o3, lse3 = bsk.sparse_attention(q, k, v, lay, config=plain, return_lse=True)
    assert relative_error(o, o3.float()) <= 1e-2 and relative_error(lse, lse3) <= 1e-5


@pytest.mark.parametrize("sched", [Schedule.COOPERATIVE, Schedule.PINGPONG])
def test_raw_op_and_cuda_graph_replay(sched):
    """The raw op as sparse_attention; a captured call replays right (the persistent kernel's tile counter is
    zeroed inside the graph)."""
    lay = global_rows(5120, band=0, n_random=1, seed=5).to("cuda")
    cfg = default_config(128, torch.bfloat16, lay, schedule=sched)
    q, k, v = (_rand(1, 2, lay.seq_q, 128, dtype=torch.bfloat16) for _ in range(3))
    meta = [-1, -1, lay.n_kblocks, 1, -1]
    o_op, lse_op = asplit.attn_fwd_split(q, k, v, lay.col_idx, lay.block_kind, lay.row_schedule(),
                                         lay.split_schedule(), meta, list(lay.split_plan()), 128 ** -0.5,
                                         cfg.to_json())
    o_ref, lse_ref = bsk.sparse_attention(q, k, v, lay, config=cfg, return_lse=True)
    assert torch.equal(o_op, o_ref) and torch.equal(lse_op, lse_ref)
    static_q = q.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        bsk.sparse_attention(static_q, k, v, lay, config=cfg)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = bsk.sparse_attention(static_q, k, v, lay, config=cfg)
    for _ in range(2):  # a second replay starts from a zeroed counter again
        q2 = _rand(1, 2, lay.seq_q, 128, dtype=torch.bfloat16)
        static_q.copy_(q2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, bsk.sparse_attention(q2, k, v, lay, config=cfg))


@pytest.mark.parametrize("D,dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=["d128bf16", "d64fp16"])
def test_persistent_split_claims_every_tile_once(D, dtype):
    """Several times more tiles than SMs, so the persistent split kernel's CTAs claim most tiles from its counter:
    a tile run twice or never would leave a poisoned or wrong row. Reference, bitwise repeat."""
    lay = global_rows(4096 + 77, band=0, n_random=1, seed=9).to("cuda")
    cfg = default_config(D, dtype, lay, schedule=Schedule.PINGPONG)
    assert cfg.split_kv
    B, H = 4, 8
    n_tiles = B * H * lay.split_schedule().shape[1]
    assert n_tiles > 4 * torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = (_rand(B, H, lay.seq_q, D, dtype=dtype) for _ in range(3))
    o, lse = bsk.sparse_attention(q, k, v, lay, config=cfg, return_lse=True)
    o2, lse2 = bsk.sparse_attention(q, k, v, lay, config=cfg, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_reference(q, k, v, lay)
    assert relative_error(o, ref_o) <= 1e-2 and relative_error(lse, ref_lse) <= 1e-4
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("D,dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=["d128bf16", "d64fp16"])
def test_combine_kernel_matches_a_float64_combine_of_its_workspace(monkeypatch, D, dtype):
    """The combine kernel's O and LSE against combine_reference of the very workspace it read (captured), so an
    indexing or weighting slip in the kernel shows at O's rounding, not hidden in the attention tolerance."""
    lay = global_rows(5120 + 77, heads=2, band=0, n_random=1, seed=6).to("cuda")
    s, kk = lay.split_plan()
    seen = []
    real = asplit.workspace
    monkeypatch.setattr(asplit, "workspace", lambda *a: seen.append(real(*a)) or seen[-1])
    q, k, v = (_rand(2, 2, lay.seq_q, D, dtype=dtype) for _ in range(3))
    o, lse = bsk.sparse_attention(q, k, v, lay, return_lse=True)
    torch.cuda.synchronize()
    assert len(seen) == 1
    ws_o, ws_lse = seen[0]
    assert torch.isfinite(ws_o).all() and not torch.isnan(ws_lse).any()  # every piece written (poisoned before)
    ref_o, ref_lse = o.double().clone(), lse.double().clone()
    combine_reference(ref_o, ref_lse, ws_o, ws_lse, lay.split_schedule(), s, kk, lay.block_m)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(o.double(), ref_o, rtol=eps, atol=1e-6)  # within O's rounding of the exact merge
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-5)
    ref_o2, ref_lse2 = attention_reference(q, k, v, lay)
    assert relative_error(o, ref_o2) <= 1e-2 and relative_error(lse, ref_lse2) <= 1e-4


@pytest.mark.parametrize("sched", [Schedule.COOPERATIVE, Schedule.PINGPONG])
def test_empty_split_row_and_nan_propagation(sched):
    """Head 1 splits a row that lists no block: O = 0, LSE = -inf, as the reference. A NaN query row in a split row
    of head 0 gives a NaN row (O and LSE), as the unsplit kernel; every other row matches the reference."""
    lay = global_and_empty_rows().to("cuda")
    s, kk = lay.split_plan()
    ss = lay.split_schedule()
    empty_row, nan_row = int(ss[1, kk, 0]), int(ss[0, 0, 0])
    q, k, v = (_rand(1, 2, lay.seq_q, 128, dtype=torch.bfloat16) for _ in range(3))
    q[0, 0, nan_row * 128 + 5, 3] = float("nan")
    o, lse = bsk.sparse_attention(q, k, v, lay, config=sched, return_lse=True)
    cfg = default_config(128, torch.bfloat16, lay, schedule=sched)
    assert cfg.split_kv
    o_plain, lse_plain = bsk.sparse_attention(q, k, v, lay, config=dataclasses.replace(cfg, split_kv=False),
                                              return_lse=True)
    torch.cuda.synchronize()
    er = slice(empty_row * 128, (empty_row + 1) * 128)
    assert (o[0, 1, er] == 0).all() and (lse[0, 1, er] == float("-inf")).all()
    assert torch.equal(torch.isnan(o), torch.isnan(o_plain)) and torch.equal(torch.isnan(lse), torch.isnan(lse_plain))
    bad = nan_row * 128 + 5
    assert torch.isnan(o[0, 0, bad]).all() and torch.isnan(lse[0, 0, bad])
    keep = torch.ones(lay.seq_q, dtype=torch.bool, device="cuda")
    keep[bad] = False
    ref_o, ref_lse = attention_reference(q, k, v, lay)
    assert relative_error(o[:, :, keep], ref_o[:, :, keep]) <= 1e-2
    finite = torch.isfinite(ref_lse[:, :, keep])
    assert torch.equal(finite, torch.isfinite(lse[:, :, keep]))
    assert relative_error(lse[:, :, keep][finite], ref_lse[:, :, keep][finite]) <= 1e-4
