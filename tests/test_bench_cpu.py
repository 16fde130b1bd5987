"""CPU-only tests of the benchmark harness's parts: flop arithmetic and fits, JSON, tables, plots, and the
compare-88 / headline / profile helpers (ncu CSV parsing). The CLI and end-to-end runs: test_bench_cli.py; example
88's side: test_bench_ex88.py. No GPU, no real nvcc compile."""
from __future__ import annotations

import json

import pytest

from blackwell_sparsek.bench import cases, ex88, metrics
from test_bench_ex88 import SAMPLE_D128

# ---------------------------------------------------------------------------------------------------------------
# flop arithmetic and fits
# ---------------------------------------------------------------------------------------------------------------

def test_block_pairs_and_effective_flops():
    # headline 25% case: B=2, H=16, S=8192 -> 64 query rows x 16 blocks per row, per-head layout (Hl = H)
    nnz_per_head = 64 * 16
    assert metrics.block_pairs_total(nnz_per_head * 16, 16, 2, 16) == 2 * 16 * 1024
    assert metrics.block_pairs_total(nnz_per_head, 1, 2, 16) == 2 * 16 * 1024      # shared layout
    assert metrics.block_pairs_total(nnz_per_head * 4, 4, 2, 16) == 2 * 4 * nnz_per_head * 4  # grouped
    with pytest.raises(ValueError):
        metrics.block_pairs_total(10, 3, 1, 16)
    f = metrics.effective_flops(2 * 16 * 1024, 128, 128, 128)
    assert f == 4 * 128 * 128 * 128 * 2 * 16 * 1024
    # 25% of dense flops exactly
    assert f == pytest.approx(0.25 * metrics.dense_flops(2, 16, 8192, 8192, 128))
    assert metrics.effective_flops(1, 128, 128, 64, backward=True) == pytest.approx(3.5 * 4 * 64 * 128 * 128)


def test_dense_flops_and_rates():
    full = metrics.dense_flops(2, 16, 8192, 8192, 128)
    assert full == 4.0 * 2 * 16 * 8192 * 8192 * 128
    assert metrics.dense_flops(2, 16, 8192, 8192, 128, causal=True) == full / 2
    assert ex88.flops(2, 16, 8192, 8192, 128, causal=True) == full / 2
    assert metrics.tflops(1e12, 1.0) == pytest.approx(1000.0)
    assert metrics.tflops(1e12, 0) is None and metrics.tflops(1e12, None) is None
    assert metrics.gbps(2e9, 1.0) == pytest.approx(2000.0)
    assert metrics.io_bytes(1, 2, 8, 8, 4) == (2 * 1 * 2 * 8 * 4 + 2 * 1 * 2 * 8 * 4) * 2
    assert metrics.window_pairs(10, 3) == 1 + 2 + 3 * 8
    assert metrics.window_pairs(4, 100) == 10


def test_linear_fit():
    xs = [1000, 2000, 4000, 8000]
    fit = metrics.linear_fit(xs, [2.0 * x for x in xs])
    assert fit["ok"] and fit["max_dev_from_proportional"] == pytest.approx(0.0, abs=1e-12)
    assert fit["slope"] == pytest.approx(2.0) and fit["r2"] == pytest.approx(1.0)
    off = metrics.linear_fit(xs, [2.0 * x + 1000 for x in xs])
    assert off["intercept"] == pytest.approx(1000.0) and off["max_dev_from_proportional"] > 0.1
    assert off["per_unit_spread"] == pytest.approx(3.0 / 2.125 - 1)
    assert not metrics.linear_fit([1], [1])["ok"]


def test_rel_error():
    torch = pytest.importorskip("torch")
    a = torch.ones(1000)
    b = torch.ones(1000)
    assert metrics.rel_error(a, b)["rel_err"] == 0.0
    b2 = b * 1.01
    assert metrics.rel_error(b2, b, chunk_rows=7)["rel_err"] == pytest.approx(0.01, rel=1e-4)
    a[3] = float("nan")
    e = metrics.rel_error(a, b)
    assert e["nonfinite"] == 1 and e["rel_err"] == float("inf")


def test_case_flops_with_real_layouts():
    pytest.importorskip("torch")
    from blackwell_sparsek.bench.harness import Case, build_layout, case_flops
    c = Case(b=2, h=16, s=8192, d=128, pattern="topk", density=0.25, device="cpu")
    assert c.topk_k() == 16
    lay, causal = build_layout(c)
    assert not causal and lay.num_heads == 16
    fl = case_flops(c, lay)
    assert fl["block_pairs"] == 2 * 16 * 64 * 16
    assert fl["flops"] == fl["flops_blocks"] == pytest.approx(0.25 * metrics.dense_flops(2, 16, 8192, 8192, 128))
    cc = Case(b=1, h=2, s=1024, d=64, pattern="causal", device="cpu")
    fl2 = case_flops(cc, build_layout(cc)[0])
    assert fl2["flops"] == metrics.dense_flops(1, 2, 1024, 1024, 64, causal=True)       # example 88's convention
    assert fl2["flops_blocks"] == metrics.effective_flops(2 * (8 * 9 // 2), 128, 128, 64)  # diagonal blocks count
    w = Case(b=1, h=2, s=4096, d=64, pattern="window", window=2048, device="cpu")
    lw, _ = build_layout(w)
    assert lw.num_heads == 1 and 0 < lw.density < 1


# ---------------------------------------------------------------------------------------------------------------
# JSON, tables, plots
# ---------------------------------------------------------------------------------------------------------------

def test_write_json_sanitizes_and_is_atomic(tmp_path):
    from blackwell_sparsek.bench import report
    p = report.write_json(tmp_path / "sub" / "r.json",
                          {"a": float("nan"), "b": [1.5, float("inf")], "c": {3, 1}, "d": (1, 2), "p": tmp_path})
    data = json.loads(p.read_text())
    assert data == {"a": None, "b": [1.5, None], "c": [1, 3], "d": [1, 2], "p": str(tmp_path)}
    assert not list(p.parent.glob(".*.tmp"))


def test_environment_without_gpu():
    from blackwell_sparsek.bench import report
    env = report.environment()
    assert "date" in env and "torch" in env
    json.dumps(report.sanitize(env))


def _synthetic_records():
    recs = []
    for peer, eff in (("ours-coop", 600.0), ("ours-pp", 620.0), ("flex", 380.0)):
        for s in (2048, 8192, 32768):
            for pat, dens in (("dense", 0.0), ("topk", 0.25), ("window", 0.0)):
                if peer == "flex" and pat == "window":
                    continue
                pairs = (s // 128) * (s // 128 if pat == "dense" else 16)
                ms = 4 * 128 * 128 * 128 * pairs / (eff * 1e12) * 1e3
                recs.append({"case": f"{pat} S{s}", "peer": peer, "kind": peer.split("-")[0], "pattern": pat,
                             "b": 1, "h": 1, "s": s, "d": 128, "window": 2048 if pat == "window" else 0,
                             "density_target": dens, "density": 0.25 if pat == "topk" else 1.0,
                             "groups": ["seq"] + (["linear"] if pat == "window" else [])
                             + (["density"] if s == 8192 and pat != "window" else []),
                             "status": "ok", "time_ms": ms, "tflops": eff, "block_pairs": pairs,
                             "us_per_head": ms * 1e3, "gbps": 100.0, "peak_mem_mb": 10.0})
    return recs


def test_tables_and_linearity():
    from blackwell_sparsek.bench import report
    recs = _synthetic_records()
    txt = report.records_table(recs)
    assert "ours-coop" in txt and "TFLOPS" in txt
    lin = report.linearity(recs)
    assert set(lin) == {"ours-coop", "ours-pp"}
    assert lin["ours-coop"]["max_dev_from_proportional"] == pytest.approx(0.0, abs=1e-9)
    assert lin["ours-coop"]["within_10pct"] and lin["ours-coop"]["min_tflops"] == pytest.approx(600.0)
    assert "max deviation" in report.linearity_text(lin)
    assert report.best_by(recs, "topk S8192", "ours")["peer"] == "ours-pp"


def test_plots_with_synthetic_data(tmp_path):
    pytest.importorskip("matplotlib")
    from blackwell_sparsek.bench import plots
    made = plots.make_all(_synthetic_records(), tmp_path, "t")
    names = sorted(p.name for p in made)
    assert names == ["t_tflops_vs_density.png", "t_tflops_vs_seq_d128.png", "t_time_vs_nnz.png"]
    for p in made:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert plots.make_all([], tmp_path / "empty", "e") == []


# ---------------------------------------------------------------------------------------------------------------
# compare-88 / headline / profile helpers
# ---------------------------------------------------------------------------------------------------------------

def test_parse_shape():
    from blackwell_sparsek.bench.compare88 import parse_shape
    assert parse_shape("2x16x8192x128") == (2, 16, 8192, 128)
    assert parse_shape("1,8,8192,64") == (1, 8, 8192, 64)
    assert parse_shape("B=16 H=16 Q=1024 D=128") == (16, 16, 1024, 128)
    for bad in ("2x16x8192", "axbxcxd", "0x1x2x3", "B=1 H=2"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_compare_table():
    from blackwell_sparsek.bench.compare88 import table
    summ = ex88.summarize([ex88.parse_output(SAMPLE_D128)], causal=False)
    row = {"b": 2, "h": 16, "s": 8192, "d": 128, "mask": "full", "ex88": {"kernels": summ, "best": ex88.best(summ)},
           "ours": [{"impl": "ours-coop", "tflops": 660.0, "vs_sdpa_rel_err": 3e-4},
                    {"impl": "ours-pp", "tflops": 650.0, "vs_sdpa_rel_err": 2e-4}],
           "ex88_best": ex88.best(summ), "ratio": 660.0 / 652.317}
    txt = table([row, {"b": 1, "h": 8, "s": 8192, "d": 64, "mask": "causal", "ex88": {"error": "no binary"},
                       "ours": [], "ex88_best": None, "ratio": None}])
    assert "coop 128x128x128 652" in txt and "1.012x" in txt and "error: no binary" in txt


def test_headline_verdicts():
    from blackwell_sparsek.bench import headline, report
    cs = headline.cases("cpu")
    recs = []

    def rec(case, peer, kind, tf, **kw):
        r = {"case": case.name, "peer": peer, "kind": kind, "tflops": tf, "status": "ok", "groups": list(case.groups),
             "s": case.s}
        r.update(kw)
        recs.append(r)
    rec(cs[0], "ours-coop", "ours", 680.0)
    rec(cs[0], "ex88 tma ws cooperative 128x128x128", "ex88", 670.0)
    rec(cs[1], "ours-pp", "ours", 590.0)
    rec(cs[1], "flex", "flex", 376.0)
    rec(cs[2], "ours-coop", "ours", 400.0)
    rec(cs[2], "ex88 tma 64x128x64", "ex88", 465.0)
    for i, c in enumerate(cs[4:]):
        pairs = (c.s // 128) * 17
        rec(c, "ours-pp", "ours", 560.0, block_pairs=pairs, time_ms=pairs * 1e-4 * (1.0 + 0.02 * i))
    lin = report.linearity(recs)
    rows = headline.verdicts(recs, lin, "cpu")
    met = [r["met"] for r in rows]
    assert met == [True, False, False, None, True, True]
    txt = headline.verdict_table(rows)
    assert "MET" in txt and "MISSED" in txt and "n/a" in txt


NCU_RAW = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","launch__registers_per_thread","launch__shared_mem_per_block_dynamic","sm__warps_active.avg.pct_of_peak_sustained_active","dram__bytes.sum.per_second","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","nsecond","%","register/thread","byte","%","Tbyte/second","%"
"0","123","python","host","void cutlass::device_kernel<bsk_sm90a_attn_fwd_d128_fp16>(T1::Params)","1","7","1,693,568","85.12","168","164,864","24.5","1.25","79.9"
'''


def test_ncu_raw_csv_parsing():
    from blackwell_sparsek.bench import profile
    rows = profile.parse_raw_csv(NCU_RAW)
    assert len(rows) == 1
    km = profile.key_metrics(rows[0])
    assert km["duration"]["value"] == pytest.approx(1693.568)       # ns -> us
    assert km["SM throughput"]["value"] == pytest.approx(85.12)
    assert km["registers / thread"]["value"] == 168
    assert km["dynamic smem / block"]["value"] == 164864
    assert km["DRAM bandwidth"]["value"] == pytest.approx(1250.0)    # TB/s -> GB/s
    assert km["tensor pipe (GMMA) cycles active"]["value"] == pytest.approx(79.9)
    assert "bsk_sm90a" in km["_kernel"]
    # the short unit spellings an H200's ncu printed: ms, Kbyte (2.09 ms must not come back as 2.09 us)
    short = NCU_RAW.replace('"nsecond","%","register/thread","byte"', '"ms","%","register/thread","Kbyte"') \
        .replace('"1,693,568"', '"2.090944"').replace('"164,864"', '"197.12"')
    km2 = profile.key_metrics(profile.parse_raw_csv(short)[0])
    assert km2["duration"]["value"] == pytest.approx(2090.944)
    assert km2["dynamic smem / block"]["value"] == pytest.approx(197120)
    assert profile.convert_unit(125.5, "Gbyte/s", "GB/s") == pytest.approx(125.5)
    assert profile.convert_unit(1.25, "Tbyte/second", "GB/s") == pytest.approx(1250.0)
    assert profile.convert_unit(3.0, "usecond", "us") == pytest.approx(3.0)
    assert profile.convert_unit(2.0, "KiB", "bytes") == 2048
    assert profile.convert_unit(197.12, "Kbyte/block", "bytes") == pytest.approx(197120)
    with pytest.raises(ValueError, match="furlong"):
        profile.convert_unit(1.0, "furlong", "us")
    odd = profile.key_metrics(profile.parse_raw_csv(NCU_RAW.replace('"nsecond"', '"furlong"'))[0])
    assert odd["duration"] == {"value": 1693568.0, "unit": "furlong", "metric": "gpu__time_duration.sum"}
    assert profile.parse_raw_csv("no csv here") == []
    md = profile.markdown({"kernel": "k", "env": {"gpu": "H100"}, "case": "c", "config": "x",
                           "metrics": {k: v for k, v in km.items() if not k.startswith("_")}})
    assert "| SM throughput |" in md


def test_profile_without_ncu(monkeypatch, capsys):
    from blackwell_sparsek.bench import profile
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    assert profile.run(None, (1, 1, 128, 64)) == 2
    assert "ncu" in capsys.readouterr().err


def test_backward_bench_counts_64_blocks_and_pair_fill():
    """bench-bwd's effective FLOPs count each layout's own block size, and pair_fill is the listed share of the
    paired 64-wide key blocks' work (1 where the two neighbours of every pair list the same query blocks)."""
    import blackwell_sparsek as bsk
    from blackwell_sparsek.bench import backward as bb
    L = bsk.BlockSparseLayout
    lay64 = L.random_topk(seq_q=2048, k=8, seed=0, num_heads=2, block_m=64, block_n=64)
    assert bb._flops(lay64, 1, 2, 128, 2.5) == pytest.approx(2.5 * 4 * 128 * sum(lay64.nnz_per_head) * 64 * 64)
    assert bb.pair_fill(L.dense(1024, block_m=64, block_n=64)) == 1.0
    assert 0.5 < bb.pair_fill(lay64) < 0.75
    assert bb.pair_fill(L.dense(1536, block_m=128, block_n=192)) == 1.0  # halves of 192-key blocks
    assert any(c["name"] == "topk25_b64_d128" for c in bb.cases(False))


def test_flex_peer_mask_of_64_blocks_is_the_layout_mask():
    """Flex's kernels refuse 64-wide blocks, so bench-bwd gives Flex the same element mask at 128x128 blocks:
    its output must equal the reference on the 64x64 layout (CPU, unfused Flex)."""
    import warnings
    import torch
    import blackwell_sparsek as bsk
    from torch.nn.attention.flex_attention import flex_attention
    from blackwell_sparsek.bench.backward import flex_block_mask
    from blackwell_sparsek.reference import attention_reference, relative_error
    lay = bsk.BlockSparseLayout.random_topk(seq_q=1000, k=4, seed=0, num_heads=2, block_m=64, block_n=64)
    bm = flex_block_mask(lay)
    assert bm.BLOCK_SIZE == (128, 128)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1000, 64, generator=g, dtype=torch.float64) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = flex_attention(q, k, v, block_mask=bm)
    assert relative_error(o, attention_reference(q, k, v, lay)[0]) < 1e-10
