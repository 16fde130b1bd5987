"""CPU-only tests of the bench CLI and the harness end to end on CPU (ours = the reference fallback): plans,
budgets, progress, compare-88 and profile plumbing with fake binaries, and where results are written (never into
the current directory unless asked). No GPU, no real nvcc compile."""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest

from blackwell_sparsek.bench import cases, ex88, metrics
from test_bench_cpu import NCU_RAW, _synthetic_records
from test_bench_ex88 import SAMPLE_D128, _script


# ---------------------------------------------------------------------------------------------------------------
# CLI and the harness end to end on CPU
# ---------------------------------------------------------------------------------------------------------------

def test_cli_plan_and_no_gpu(capsys):
    from blackwell_sparsek.bench.cli import main
    assert main(["bench", "--quick", "--list"]) == 0
    out = capsys.readouterr().out
    assert "cases" in out and "window2K B1 H16 S128K D128" in out
    assert main(["bench", "--headline", "--list"]) == 0
    assert "S256K" in capsys.readouterr().out
    assert main(["nope"]) == 2
    import torch
    if not torch.cuda.is_available():
        assert main(["bench", "--quick"]) == 2
        assert main(["compare-88"]) == 2
        assert "GPU" in capsys.readouterr().err


def test_presets_fit_their_budgets():
    from blackwell_sparsek.bench import harness
    for name, budget in (("quick", 180.0), ("full", 450.0)):
        chosen = cases.preset(name)
        assert len({c.key for c in chosen}) == len(chosen)
        est = sum(harness.estimate_case_seconds(c, 5) for c in chosen)
        assert est < budget, (name, est)
    full = cases.preset("full")
    assert max(c.s for c in full if c.pattern == "window") == 512 * 1024
    assert {c.d for c in full} == {64, 128}
    assert {round(c.density, 3) for c in full if c.pattern == "topk"} == {0.125, 0.25, 0.5}


def test_progress_lines():
    import io
    from blackwell_sparsek.bench.harness import Progress
    buf = io.StringIO()
    p = Progress(4, stream=buf)
    p.update("first")
    p.update("done one", advance=True)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("[bsk bench   0/4") and "first" in lines[0]
    assert "1/4" in lines[1] and "25%" in lines[1] and "left" in lines[1]


def test_timing_cpu():
    from blackwell_sparsek.bench import timing
    t = timing.bench(lambda: sum(range(1000)), device="cpu", rep_ms=5)
    assert t.reps >= 3 and t.p20_ms <= t.median_ms <= t.p80_ms and t.method == "perf_counter"
    assert timing._quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    lt = timing.loop_bench(lambda: sum(range(1000)), device="cpu", n=5, est_ms=1000.0)
    assert lt.reps == 3 and lt.method == "loop5-perf_counter"


def test_kernel_us_per_call_longest_first(monkeypatch):
    """kernel_us (bench-bwd's breakdown, the split-KV combine time, dev/host_profile.py) from a faked profiler:
    per-call launches and microseconds, host-only events dropped, longest first."""
    import torch
    import torch.profiler
    from types import SimpleNamespace as E
    from blackwell_sparsek.bench import split_kv, timing
    events = [E(key="prep", count=20, device_time_total=400.0), E(key="aten::empty", count=40, device_time_total=0),
              E(key="main", count=20, device_time_total=20000.0), E(key="bsk_split_combine", count=20,
                                                                       device_time_total=1000.0)]

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return events
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls = []
    rows = timing.kernel_us(lambda: calls.append(1), n=20)
    assert len(calls) == 21  # one warm-up call
    assert rows == [("main", 1.0, 1000.0), ("bsk_split_combine", 1.0, 50.0), ("prep", 1.0, 20.0)]
    assert split_kv.combine_kernel_ms(lambda: None) == 0.05


def test_harness_tiny_run_on_cpu(tmp_path):
    """Ours (reference fallback on CPU) + SDPA math: records, cross-checks, small reference checks, JSON, plots."""
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import harness, report
    from blackwell_sparsek.bench.peers import Sdpa, our_configs, Ours

    cases = [harness.Case(b=1, h=2, s=256, d=64, pattern="dense", device="cpu", groups=("seq",)),
             harness.Case(b=1, h=2, s=256, d=64, pattern="topk", density=0.5, device="cpu", groups=("seq",))]
    peers = [Ours(c, n) for n, c in our_configs(64, "fp16")][:1] + [Sdpa("math")]
    opts = harness.RunOptions(rep_ms=1.0, warmup_ms=0.0, small_check_seq=256)
    written = []
    import io
    r = harness.Runner(cases, opts, peers_for=lambda c: peers, progress=harness.Progress(2, stream=io.StringIO()),
                       on_case_done=lambda rr: written.append(report.write_json(tmp_path / "b.json",
                                                                                {"records": rr.records})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r.run()
    assert len(written) == 4  # after each case's sustained timings, then after each case's burst timings
    by = {(x["case"], x["peer"]): x for x in r.records}
    dense = by[(cases[0].name, "sdpa-math")]
    assert dense["status"] == "ok" and dense["check_vs"] == "ours-coop" and dense["check_ok"]
    assert dense["tflops"] > 0 and dense["us_per_head"] > 0 and dense["time_ms"] > 0
    assert (cases[1].name, "sdpa-math") not in by                   # SDPA has no block-sparse mask
    assert by[(cases[1].name, "ours-coop")]["block_pairs"] == 2 * 2 * 1
    assert all(c["status"] == "ok" for c in r.small_checks), r.small_checks
    assert {c["peer"] for c in r.small_checks} == {"ours-coop", "sdpa-math"}
    data = json.loads((tmp_path / "b.json").read_text())
    assert len(data["records"]) == 3


def test_runner_times_bursts_after_every_sustained_timing(monkeypatch):
    """A sustained timing right after a burst can run slow at the power limit: the burst timings (example 88's
    protocol, and example 88 itself) come in a second pass, after every case's sustained ones."""
    pytest.importorskip("torch")
    import io
    from blackwell_sparsek.bench import harness
    from blackwell_sparsek.bench.peers import Reference
    from blackwell_sparsek.bench.timing import Timing
    log = []

    def fake(kind):
        def f(fn, **kw):
            fn()
            log.append(kind)
            return Timing(1.0, 1.0, 1.0, 3, kind)
        return f
    monkeypatch.setattr(harness, "bench_time", fake("sustained"))
    monkeypatch.setattr(harness, "bench_loop", fake("burst"))
    monkeypatch.setattr(harness.Runner, "run_ex88", lambda self, case, fl, density=1.0: log.append("ex88"))
    cases = [harness.Case(b=1, h=1, s=s, d=64, pattern="dense", device="cpu") for s in (128, 256)]
    r = harness.Runner(cases, harness.RunOptions(check=False, loop_timing_seqs=None, ex88_seqs={128, 256}),
                       peers_for=lambda c: [Reference(), Reference()], ex88_binary="fake",
                       progress=harness.Progress(2, stream=io.StringIO()))
    r.run()
    assert log == ["sustained"] * 4 + ["burst", "burst", "ex88"] * 2
    assert all(x["time_ms_loop"] == 1.0 and x["tflops_loop"] > 0 for x in r.records)


def test_runner_budget_skips(tmp_path):
    import io
    from blackwell_sparsek.bench import harness
    cases = [harness.Case(b=1, h=1, s=128, d=64, device="cpu")]
    r = harness.Runner(cases, harness.RunOptions(budget_s=0.0), peers_for=lambda c: [],
                       progress=harness.Progress(1, stream=io.StringIO()))
    r.run()
    assert r.records == [] and r.skipped and "time budget" in r.skipped[0]["reason"]


def test_fatal_cuda_detection():
    from blackwell_sparsek.bench.harness import _is_fatal_cuda
    assert _is_fatal_cuda(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not _is_fatal_cuda(RuntimeError("CUDA out of memory"))


@pytest.mark.skipif(sys.platform != "linux", reason="shell scripts")
def test_examples_skip_cleanly_without_cuda():
    import subprocess
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo))
    for ex in ("sparse_attention.py", "compare_ex88.py", "long_context.py"):
        p = subprocess.run([sys.executable, str(repo / "examples" / ex)], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 0, (ex, p.stdout, p.stderr)
        assert "skip" in (p.stdout + p.stderr).lower()


def test_compare88_plumbing_on_cpu(tmp_path, monkeypatch, capsys):
    """compare88.run end to end on CPU: example 88 = a fake binary printing captured output, ours = reference."""
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import compare88
    out = tmp_path / "out.txt"
    out.write_text(SAMPLE_D128.replace("B 2 H 16 Q 8192 K 8192 D 128", "B 1 H 1 Q 256 K 256 D 128"))
    monkeypatch.setenv("BSK_EX88_BIN", str(_script(tmp_path / "88_hopper_fmha", f"cat {out}\n")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = compare88.run([(1, 1, 256, 128)], ["full", "causal"], repeats=2, rep_ms=1.0, warmup_ms=0.0,
                            json_path=str(tmp_path / "c.json"), device="cpu", loop_n=2)
    assert len(res["rows"]) == 2
    row = res["rows"][0]
    assert row["ex88_best"]["kernel"] == "tma ws cooperative 128x128x128"
    assert {o["impl"] for o in row["ours"]} == {"ours-coop", "ours-pp"}
    assert all(o["status"] == "ok" and o["check_ok"] for r in res["rows"] for o in r["ours"]), res["rows"]
    assert row["ratio"] is not None and row["ratio"] > 0 and row["ratio_loop"] > 0
    assert all(o["tflops_loop"] > 0 for o in row["ours"])
    assert json.loads((tmp_path / "c.json").read_text())["rows"][1]["mask"] == "causal"
    assert "ours/ex88" in capsys.readouterr().out


def _fake_ncu(tmp_path: Path) -> tuple[Path, Path]:
    """A fake ncu that runs the launcher (on CPU) and serves captured raw CSV; returns (ncu, its call log)."""
    raw = tmp_path / "raw.csv"
    raw.write_text(NCU_RAW)
    calls = tmp_path / "calls"
    ncu = _script(tmp_path / "ncu", f'''echo "$@" >> {calls}
if [ "$1" = "--query-metrics" ]; then
  echo "sm__pipe_tensor_op_gmma_cycles_active    Counter    # of cycles the GMMA pipe was active"
  echo "dram__bytes                              Counter    # of bytes"
  exit 0
fi
if [ "$1" = "--import" ]; then cat {raw}; exit 0; fi
exp=""
while [ $# -gt 0 ]; do
  case "$1" in --export) exp="$2"; shift ;; --force-overwrite) shift; break ;; esac
  shift
done
"$@" || exit 1
touch "$exp.ncu-rep"
''')
    return ncu, calls


def test_profile_plumbing_with_fake_ncu(tmp_path, monkeypatch, capsys):
    """profile.run end to end with a fake ncu that runs the launcher (on CPU) and serves captured raw CSV."""
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import profile
    ncu, calls = _fake_ncu(tmp_path)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(ncu))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc = profile.run(None, (1, 1, 256, 64), out_dir=str(tmp_path / "res"), device="cpu")
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    prof = [ln for ln in calls.read_text().splitlines() if "--kernel-name" in ln][0]
    assert "--kernel-name regex:bsk_" in prof and "--launch-skip 2 --launch-count 1" in prof
    assert "--section SpeedOfLight" in prof and "--section Occupancy" in prof and "--section LaunchStats" in prof
    assert "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" in prof
    assert "lts__t_sector_hit_rate" not in prof                     # not offered by this (fake) ncu
    js = list((tmp_path / "res").glob("profile_*.json"))
    assert len(js) == 1 and (tmp_path / "res" / "tmp").is_dir()
    data = json.loads(js[0].read_text())
    assert data["metrics"]["registers / thread"]["value"] == 168
    assert "bsk_sm90a" in data["profiled_kernel"]
    assert js[0].with_suffix(".md").is_file()


def test_cli_headline_flow_on_cpu(tmp_path, monkeypatch, capsys):
    """`bench --headline` end to end on CPU with the acceptance shapes shrunk (same structure and groups)."""
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import headline
    from blackwell_sparsek.bench.cli import main
    from blackwell_sparsek.bench.harness import Case

    def small_cases(device="cuda"):
        out = [Case(b=1, h=2, s=256, d=64, pattern="dense", device=device, groups=("headline",)),
               Case(b=1, h=2, s=256, d=64, pattern="topk", density=0.5, device=device, groups=("headline", "density")),
               Case(b=1, h=1, s=256, d=64, pattern="dense", device=device, groups=("headline",)),
               Case(b=1, h=1, s=256, d=64, pattern="topk", density=0.5, device=device, groups=("headline",))]
        out += [Case(b=1, h=1, s=s, d=64, pattern="window", window=128, device=device,
                     groups=("headline", "linear", "seq")) for s in (256, 512)]
        return out
    monkeypatch.setattr(headline, "cases", small_cases)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc = main(["bench", "--headline", "--device", "cpu", "--out", str(tmp_path), "--rep-ms", "1",
                   "--warmup-ms", "0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((tmp_path / "bench_headline.json").read_text())
    assert data["complete"] and len(data["headline"]) == 6
    assert all(r.get("time_ms_loop") for r in data["records"] if r.get("kind") == "ours")
    assert set(data["linearity"]) == {"ours-coop", "ours-pp"}
    assert out.rstrip().splitlines()[-1].startswith("window 2K")    # verdict table is printed last
    assert "headline" in out and (tmp_path / "bench_headline.txt").is_file()


def test_runner_drops_only_compile_heavy_peers_when_short_of_time():
    import io
    from blackwell_sparsek.bench import harness
    from blackwell_sparsek.bench.peers import Flex, Reference

    case = harness.Case(b=1, h=1, s=256, d=64, device="cpu")
    flex = Flex(allow_cpu=True)
    est_plain = harness.estimate_case_seconds(case, 1)
    r = harness.Runner([case], harness.RunOptions(budget_s=est_plain + 2.0, check=False),
                       peers_for=lambda c: [Reference(), flex], progress=harness.Progress(1, stream=io.StringIO()))
    r.run()
    assert [x["peer"] for x in r.records] == ["reference"]
    assert r.skipped and r.skipped[0]["peer"] == "flex" and "compile" in r.skipped[0]["reason"]


def test_replot_from_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from blackwell_sparsek.bench import report
    from blackwell_sparsek.bench.cli import main
    j = report.write_json(tmp_path / "bench_full.json", {"preset": "full", "records": _synthetic_records()})
    assert main(["bench", "--replot", str(j)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["full_tflops_vs_density.png",
                                                              "full_tflops_vs_seq_d128.png", "full_time_vs_nnz.png"]
    assert main(["bench", "--replot", str(tmp_path / "missing.json")]) == 2


# ---------------------------------------------------------------------------------------------------------------
# issue 24 item 20: nothing is written unless the user names where (never into the current directory)
# ---------------------------------------------------------------------------------------------------------------

def test_result_paths_default_to_none():
    from blackwell_sparsek.bench import cli
    assert cli._bench_parser().parse_args([]).out is None
    assert cli._compare_parser().parse_args([]).json is None
    assert cli._profile_parser().parse_args([]).out is None


def _one_tiny_case(monkeypatch):
    from blackwell_sparsek.bench import harness
    monkeypatch.setattr(cases, "preset", lambda name, device="cuda": [
        harness.Case(b=1, h=1, s=256, d=64, pattern="dense", device=device, groups=("seq",))])


def test_bench_without_out_writes_nothing(clean_cwd, bsk_cache, monkeypatch, capsys):
    pytest.importorskip("torch")
    from blackwell_sparsek.bench.cli import main
    _one_tiny_case(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc = main(["bench", "--preset", "tiny", "--device", "cpu", "--peers", "ours", "--no-check", "--rep-ms", "1",
                   "--warmup-ms", "0"])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    assert "wrote no files (pass --out DIR" in cap.out and "results printed only" in cap.err
    # clean_cwd fails the test if anything appeared in the working directory


def test_bench_out_is_checked_before_measuring(tmp_path, clean_cwd, monkeypatch, capsys):
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import harness
    from blackwell_sparsek.bench.cli import main
    _one_tiny_case(monkeypatch)
    monkeypatch.setattr(harness.Runner, "run", lambda self: pytest.fail("measured before checking --out"))
    f = tmp_path / "file"
    f.write_text("")
    assert main(["bench", "--preset", "tiny", "--device", "cpu", "--out", str(f / "res")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot use --out") and "Traceback" not in err


def test_compare88_cli_writes_json_only_when_asked(tmp_path, clean_cwd, bsk_cache, monkeypatch, capsys):
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import cli, compare88
    out = tmp_path / "out.txt"
    out.write_text(SAMPLE_D128.replace("B 2 H 16 Q 8192 K 8192 D 128", "B 1 H 1 Q 256 K 256 D 128"))
    monkeypatch.setenv("BSK_EX88_BIN", str(_script(tmp_path / "88_hopper_fmha", f"cat {out}\n")))
    monkeypatch.setattr(cli, "_cuda_ok", lambda: True)
    real_run = compare88.run
    monkeypatch.setattr(compare88, "run", lambda *a, **kw: real_run(*a, **{**kw, "device": "cpu", "loop_n": 2,
                                                                         "warmup_ms": 0.0}))
    args = ["compare-88", "--shapes", "1x1x256x128", "--masks", "full", "--repeats", "1", "--rep-ms", "1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cli.main(args) == 0
        assert "wrote" not in capsys.readouterr().out
        target = tmp_path / "res" / "c88.json"
        assert cli.main(args + ["--json", str(target)]) == 0
    assert json.loads(target.read_text())["rows"][0]["mask"] == "full"
    assert f"wrote {target}" in capsys.readouterr().out
    assert cli.main(args + ["--json", str(tmp_path)]) == 2  # a directory is not a JSON file
    assert "is a directory" in capsys.readouterr().err


def test_profile_cli_without_out_writes_nothing(tmp_path, clean_cwd, bsk_cache, monkeypatch, capsys):
    pytest.importorskip("torch")
    from blackwell_sparsek.bench import cli, profile
    ncu, _ = _fake_ncu(tmp_path)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(ncu))
    real_run = profile.run
    monkeypatch.setattr(profile, "run", lambda *a, **kw: real_run(*a, **{**kw, "device": "cpu"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rc = cli.main(["profile", "--shape", "1x1x256x64"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "wrote no files (pass --out DIR" in cap.out and "registers" in cap.out
    assert not list(tmp_path.rglob("profile_*")) and not list(tmp_path.rglob("*.ncu-rep"))


def test_generate_kernel_example_leaves_no_files(fake_nvcc, tmp_path, child_env):
    import subprocess
    repo = Path(__file__).resolve().parent.parent
    work, tmp = tmp_path / "work", tmp_path / "tmpdir"
    work.mkdir()
    tmp.mkdir()
    env = child_env(TMPDIR=str(tmp))
    name = "bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"
    p = subprocess.run([sys.executable, str(repo / "examples" / "generate_kernel.py"), name], capture_output=True,
                       text=True, cwd=work, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "built .so" in p.stdout and "--out DIR writes a copy" in p.stdout
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []  # it used to leave bsk-generate-* in TMPDIR
    p = subprocess.run([sys.executable, str(repo / "examples" / "generate_kernel.py"), name, "--out",
                        str(tmp_path / "cu")], capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(list((tmp_path / "cu").glob("bsk_*.cu"))) == 1 and list(work.iterdir()) == []
