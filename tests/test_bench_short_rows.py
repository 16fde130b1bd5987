"""CPU tests of the short-rows bench (blackwell_sparsek.bench.short_rows): its configs and its table."""
import json

import pytest

from blackwell_sparsek.bench import short_rows
from blackwell_sparsek.jit.spec import KernelConfig


def test_configs_are_the_default_and_every_other_schedule(capsys):
    assert short_rows.main(["--configs", "--k", "2", "8", "--d", "128"]) == 0
    cfgs = [KernelConfig.from_json(line) for line in capsys.readouterr().out.splitlines()]
    assert len(cfgs) == 8  # per k: the default and the three other schedules, no duplicate
    assert all(c.head_dim == 128 and c.dtype.name == "FP16" for c in cfgs)
    for per_k in (cfgs[:4], cfgs[4:]):
        assert sorted(c.schedule.value for c in per_k) == ["cooperative", "dual", "pingpong", "single"]


def test_table_reports_the_graph_ratio_and_the_eager_one():
    ours = {"default": {"tflops_graph": 470.0, "tflops_loop": 450.0, "tflops": 430.0, "rel_err": 1e-3},
            "cooperative": {"tflops_graph": 445.0, "tflops_loop": 440.0, "tflops": 420.0, "rel_err": 2e-3}}
    row = {"d": 128, "k": 4, "ours": ours, "ex88": {"tflops": 500.0, "best_kernel": "coop"}, "ratio": 0.94,
           "ratio_eager": 0.9}
    text = short_rows.table([row], "GPU X")
    assert "GPU X" in text
    assert "| 128 | 4 | 470 / 450 / 430 | cooperative 445 | 500 (coop) | 0.940 (0.900) | 2.0e-03 |" in text
    json.dumps(row)


def test_needs_a_gpu(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert short_rows.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
