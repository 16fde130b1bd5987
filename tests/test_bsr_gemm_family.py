"""The BSR GEMM family on the CPU: configs and their rules, named configs, rendering, the kernel-choice function,
what the kernels cannot serve, the layout views the kernels read, and one real nvcc compile of a DSD kernel."""
from __future__ import annotations

import pytest
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek import InvalidConfigError
from blackwell_sparsek.families.bsr_gemm import BsrGemmConfig, Epilogue, Op, OutDType, max_stages
from blackwell_sparsek.jit import codegen, kernels
from blackwell_sparsek.jit.spec import DType, KernelConfig, load_named_configs
from blackwell_sparsek.layout.matrix import block_rows, sdd_schedule, transposed_value_index
from blackwell_sparsek.ops import _gemm_cuda as g

L = bsk.BlockSparseLayout


def test_default_and_named_configs_are_valid():
    assert BsrGemmConfig().validate().kernel_name.startswith("bsk_sm90a_bsr_gemm_dsd_fp16_ofp16_b128x128_t128x256_s4_")
    named = {n: c for n, c in load_named_configs().items() if c.family == "bsr_gemm"}
    assert len(named) >= 12
    for name, cfg in named.items():
        assert cfg.config_name == name
        assert {cfg.block_m, cfg.block_n} <= {64, 128}
    ops = {c.op for c in named.values()}
    assert ops == set(Op)
    assert {c.dtype for c in named.values()} == {DType.FP16, DType.BF16}


def test_config_round_trip_and_enum_spellings():
    c = BsrGemmConfig(op="dsd_t", dtype="bf16", out_dtype="FP32", block_m=64, tile_n=128, stages=5)
    assert c.op is Op.DSD_T and c.out_dtype is OutDType.FP32
    assert c.tile_m == 128  # a DSD_T tile row is a block column of A
    assert KernelConfig.from_json(c.to_json()) == c
    assert "dsd_t_bf16_ofp32_b64x128_t128x128_s5" in c.kernel_name
    assert "_s5_c" not in c.kernel_name  # single-CTA kernels keep the names they always had
    c2 = BsrGemmConfig(cluster=2)
    assert "t128x256_s4_c2_" in c2.kernel_name and KernelConfig.from_json(c2.to_json()) == c2
    assert c2.kernel_name != BsrGemmConfig().kernel_name
    pair = BsrGemmConfig(op="sdd", tile_n=256, stages=4, epilogue="tma").validate()  # two blocks of a row a tile
    assert pair.sdd_pair_tile and "sdd_fp16_ofp16_b128x128_t128x256_s4_etma" in pair.kernel_name
    assert not BsrGemmConfig(op="sdd", tile_n=128, stages=7).sdd_pair_tile


@pytest.mark.parametrize("fields,needle", [
    (dict(block_m=96), "block_m 96"),
    (dict(block_n=256), "block_n 256"),
    (dict(tile_n=192), "tile_n 192"),
    (dict(op="sdd", tile_n=64), "an SDD tile is one output block or two of one block row"),
    (dict(op="sdd", tile_n=256, stages=4), "single CTAs with the TMA-store epilogue"),
    (dict(op="sdd", tile_n=256, stages=4, epilogue="tma", cluster=2), "single CTAs with the TMA-store epilogue"),
    (dict(stages=1), "stages 1"),
    (dict(stages=8), "shared memory"),
    (dict(arch="sm100a"), "no code generator"),
    (dict(cluster=3), "cluster 3"),
    (dict(epilogue="tma", stages=5), "shared memory"),
    (dict(op="sdd", tile_n=128, stages=7, cluster=4), "SDD runs single CTAs or pairs"),
])
def test_bad_configs_name_the_fix(fields, needle):
    cfg = BsrGemmConfig(**fields)
    with pytest.raises(InvalidConfigError, match=needle) as e:
        cfg.validate()
    near = cfg.nearest_valid()
    assert near is not None and near.problems() == []
    assert "nearest valid config" in str(e.value)


def test_non_int_fields_rejected():
    with pytest.raises(InvalidConfigError, match="tile_n must be an int"):
        BsrGemmConfig(tile_n="256")
    with pytest.raises(InvalidConfigError, match="Op must be one of"):
        BsrGemmConfig(op="sparse")


def test_max_stages_fits_shared_memory():
    for op in Op:
        for bm in (64, 128):
            for bn in (64, 128):
                for tn in ((bn,) if op is Op.SDD else (64, 128, 256)):
                    s = max_stages(op, DType.FP16, bm, bn, tn)
                    BsrGemmConfig(op=op, block_m=bm, block_n=bn, tile_n=tn, stages=s).validate()


def test_render_carries_the_choices():
    src = codegen.render(BsrGemmConfig(op="dsd_t", dtype="bf16", out_dtype="fp32", block_m=64, block_n=128,
                                       tile_n=128, stages=5))
    assert "bsk::kOpDsdT" in src and "cutlass::bfloat16_t, /*ElementOut=*/float" in src
    assert "/*TileM=*/128" in src and "/*Stages=*/5" in src
    assert '#include "bsk/bsr_gemm.hpp"' in src and "/*Cluster=*/1, /*TmaEpi=*/false>" in src
    assert "/*Cluster=*/4, /*TmaEpi=*/true>" in codegen.render(BsrGemmConfig(cluster=4, epilogue="tma", stages=3))


def test_config_for_picks_tile_and_stages():
    big = g.config_for(Op.DSD, torch.float16, torch.float16, 128, 128, 8192, 64, 132)
    assert (big.tile_n, big.stages) == (256, 4)
    small = g.config_for(Op.DSD, torch.float16, torch.float32, 128, 128, 256, 8, 132)
    assert small.tile_n == 64 and small.out_dtype is OutDType.FP32  # 8 rows: narrower tiles fill more SMs
    sdd = g.config_for(Op.SDD, torch.bfloat16, torch.bfloat16, 64, 128, 4096, 1000, 132)
    assert sdd.tile_n == 256 and sdd.tile_m == 64 and sdd.sdd_pair_tile  # 1000 blocks: tiles of two fill the GPU
    assert sdd.cluster == 1 and sdd.epilogue is Epilogue.TMA
    few = g.config_for(Op.SDD, torch.bfloat16, torch.bfloat16, 64, 128, 4096, 200, 132)
    assert few.tile_n == 128 and not few.sdd_pair_tile  # 100 pairs would leave SMs idle


def test_config_for_pairs_only_where_measured(monkeypatch):
    args = (torch.float16, torch.float16, 128, 128, 8192, 64, 132)
    monkeypatch.setattr(g, "PAIR_FASTER", frozenset())
    g.config_for.cache_clear()
    assert g.config_for(Op.DSD, *args).cluster == 1 and g.config_for(Op.SDD, *args[:-2], 200, 132).cluster == 1
    monkeypatch.setattr(g, "PAIR_FASTER", frozenset(Op))
    g.config_for.cache_clear()
    try:
        assert g.config_for(Op.DSD, *args).cluster == 2 and g.config_for(Op.SDD, *args[:-2], 200, 132).cluster == 2
        # an odd number of N tiles per row (N = 768 at tile 256) stays single
        assert g.config_for(Op.DSD, torch.float16, torch.float16, 128, 128, 768, 64, 132).cluster == 1
    finally:
        g.config_for.cache_clear()


def test_problems_helper():
    assert g.problems(op="dsd", dtype=torch.float16, out_dtype=torch.float32, m=1000, n=264, k=1001) == []
    assert any("multiple of 8" in p for p in g.problems(op="dsd", n=260))
    assert any("16-byte rows of a" in p for p in g.problems(op="sdd", n=8, k=12))
    assert g.problems(op="dsd", k=12) == []  # DSD's K may be anything
    assert any("torch.float16 or torch.bfloat16" in p for p in g.problems(dtype=torch.float32))
    assert any("inputs' dtype or torch.float32" in p
               for p in g.problems(dtype=torch.float16, out_dtype=torch.bfloat16))
    assert any("blocks of 64 or 128" in p for p in g.problems(block_m=32))
    assert any("one (num_heads == 1)" in p for p in g.problems(num_heads=2))
    assert any("element rule" in p for p in g.problems(has_rule=True))
    assert any("sm_90" in p for p in g.problems(capability=(8, 0)))
    assert any("2^31" in p for p in g.problems(nnz=2**25))
    assert any("op 'mm'" in p for p in g.problems(op="mm"))


def _mask_layout(seed, m, k, bm, bk, dens=0.3):
    gen = torch.Generator().manual_seed(seed)
    nq, nk = -(-m // bm), -(-k // bk)
    mask = torch.rand(nq, nk, generator=gen) < dens
    mask[-1] = False
    return L.from_block_mask(mask, seq_q=m, seq_k=k, block_m=bm, block_n=bk)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transposed_value_index_agrees_with_transpose(seed):
    lay = _mask_layout(seed, 1000, 1300, 128, 64)
    t = lay.transpose()
    nnz = lay.nnz
    perm = transposed_value_index(lay)[0, :nnz].long()
    assert sorted(perm.tolist()) == list(range(nnz))
    # the transposed entry q is block (row = t.col_idx[q], col = t's row of q) of A, stored at values[perm[q]]
    assert torch.equal(block_rows(lay)[0, perm].int(), t.col_idx[0, :nnz])
    assert torch.equal(lay.col_idx[0, perm].long(), block_rows(t)[0, :nnz])
    assert transposed_value_index(lay) is transposed_value_index(lay)  # cached


def test_sdd_schedule_lists_every_block_once():
    lay = _mask_layout(3, 2000, 3000, 64, 128, 0.4)
    s = sdd_schedule(lay, 132)
    nnz = lay.nnz
    assert s.shape == (nnz, 4) and s.dtype == torch.int32 and s.is_contiguous()
    assert sorted(s[:, 2].tolist()) == list(range(nnz))
    v = s[:, 2].long()
    assert torch.equal(s[:, 0].long(), block_rows(lay)[0, v]) and torch.equal(s[:, 1], lay.col_idx[0, v])
    assert sdd_schedule(lay, 132) is s


@pytest.mark.parametrize("seed", [3, 4])
def test_sdd_pair_schedule(seed):
    """Pairs of one block row; every block once; odd rows' partner slots and the padding never store."""
    lay = _mask_layout(seed, 2000, 3000, 64, 128, 0.4)
    s = sdd_schedule(lay, 132, pairs=True)
    nnz, nq = lay.nnz, lay.n_qblocks
    assert s.shape == (2 * ((nnz + nq) // 2), 4) and s.dtype == torch.int32 and s.is_contiguous()
    p = s.view(-1, 2, 4)
    assert torch.equal(p[:, 0, 0], p[:, 1, 0])  # one block row per pair
    stored = s[s[:, 2] >= 0]
    assert sorted(stored[:, 2].tolist()) == list(range(nnz))
    v = stored[:, 2].long()
    assert torch.equal(stored[:, 0].long(), block_rows(lay)[0, v]) and torch.equal(stored[:, 1], lay.col_idx[0, v])
    skip = p[:, 0, 3] == 1
    assert torch.equal(skip, p[:, 1, 3] == 1) and (p[skip][..., 2] == -1).all()
    assert not skip[:skip.float().argmax()].any() if skip.any() else True  # padding last
    real_pairs = int(((lay.row_counts()[0] + 1) // 2).sum())
    assert int((~skip).sum()) == real_pairs
    assert sdd_schedule(lay, 132, pairs=True) is s


@pytest.mark.real_compile
@pytest.mark.slow
def test_real_compile_dsd_kernel(bsk_cache):
    """The real nvcc on a DSD kernel and an SDD kernel with the TMA-store epilogue (about 40 s): the templates
    compile and export the launcher ABI."""
    from blackwell_sparsek.jit import compiler
    from blackwell_sparsek.errors import ToolchainError
    try:
        compiler.nvcc_version(compiler.find_nvcc())
        compiler.cutlass_paths()
    except ToolchainError as e:
        pytest.skip(f"needs nvcc and CUTLASS: {e}")
    cfg = BsrGemmConfig(op="dsd", block_m=64, block_n=128, tile_n=128, stages=6)
    e = kernels.ensure_built(cfg)
    assert e.built and e.so_path.stat().st_size > 0
    assert cfg.kernel_name.encode() in e.so_path.read_bytes()
    # the config's shared-memory model (stage counts, validation) is the kernel's SharedStorage, staging included
    kernel = kernels.build(cfg)
    assert kernel.smem_bytes == cfg.smem_bytes()
    # the same for the TMA-store epilogue's per-warp slices, on an SDD tile of two blocks (4 stages: 230,400 bytes)
    pair = BsrGemmConfig(op="sdd", tile_n=256, stages=4, epilogue="tma")
    assert kernels.build(pair).smem_bytes == pair.smem_bytes()
    # another kernel's (or any other) argument struct is refused before the launcher runs
    import ctypes

    class Other(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]
    with pytest.raises(bsk.InputError, match="args_struct is Other"):
        kernel.launch(Other(), 0)


@pytest.mark.parametrize("transpose", [False, True])
def test_launch_fills_the_whole_argument_struct(transpose, monkeypatch):
    """dsd()/sdd() on the CUDA path hand the kernel a struct built from launch_args by the ABI's own ctypes class,
    on the tensors' device (launch_on). Run here on CPU tensors with the kernel replaced by a recorder."""
    from blackwell_sparsek.jit.runtime import args_struct

    class Recorder:
        Args = args_struct(BsrGemmConfig.abi)

        def __init__(self):
            self.calls = []

        def launch_on(self, struct, device):
            self.calls.append((struct, device))

    rec = Recorder()
    monkeypatch.setattr(g, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(kernels, "build", lambda cfg: rec)
    monkeypatch.setattr(kernels, "_loaded", {"x": rec})  # non-empty: the memo in _gemm_cuda is used
    g._KERNELS.clear()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    lay = L.random_topk(seq_q=1024, seq_k=512, k=2, seed=3)
    vals = torch.randn(lay.nnz, 128, 128, dtype=torch.float16)
    b = torch.randn(1024 if transpose else 512, 64, dtype=torch.float16)
    out = torch.empty(512 if transpose else 1024, 64, dtype=torch.float16)
    bias = torch.randn(64)
    g.dsd(vals, lay, b, out, transpose=transpose, alpha=0.5, bias=bias)
    a = torch.randn(1024, 256, dtype=torch.float16)
    g.sdd(a, torch.randn(256, 512, dtype=torch.float16), lay, torch.empty(lay.nnz, 128, 128, dtype=torch.float16))
    g._KERNELS.clear()
    (s, dev), (s2, _) = rec.calls
    assert dev == 0
    assert s.a == vals.data_ptr() and s.b == b.data_ptr() and s.out == out.data_ptr() and s.bias == bias.data_ptr()
    assert (s.m, s.n, s.k, s.nnz) == ((512, 64, 1024, lay.nnz) if transpose else (1024, 64, 512, lay.nnz))
    assert s.alpha == 0.5 and s.beta == 0.0 and s.sm_count == 132
    assert (s.blk_a is not None) == transpose and s2.bias is None and s2.blk_b is None
