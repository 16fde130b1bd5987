"""``python -m blackwell_sparsek``: generate, build, list-configs, cache, info, forwarding. CPU only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from blackwell_sparsek import AttentionConfig, cli
from blackwell_sparsek.jit.codegen import render
from blackwell_sparsek.jit.spec import get_config, load_named_configs

NAME = "bsk_sm90a_attn_fwd_d64_bf16_t128x128_pp_s8_b128x128"


def test_list_configs(capsys):
    assert cli.main(["list-configs"]) == 0
    out = capsys.readouterr().out
    for name, cfg in load_named_configs().items():
        assert name in out and cfg.kernel_name in out
    assert cli.main(["list-configs", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[NAME]["head_dim"] == 64


def test_generate_to_path(tmp_path, clean_cwd, capsys):
    out = tmp_path / "k.cu"
    assert cli.main(["generate", NAME, "-o", str(out)]) == 0
    assert out.read_text() == render(get_config(NAME))
    assert capsys.readouterr().out.strip() == str(out)


def test_generate_default_writes_into_cwd_by_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = get_config(NAME)
    assert cli.main(["generate", NAME]) == 0
    assert (tmp_path / f"{cfg.kernel_name}.cu").read_text() == render(cfg)


def test_generate_inline_json_and_file(tmp_path, clean_cwd):
    out = tmp_path / "inline.cu"
    assert cli.main(["generate", '{"head_dim": 64, "stages": 6, "dtype": "bf16", "schedule": "pingpong"}',
                     "-o", str(out)]) == 0
    assert out.read_text() == render(AttentionConfig(head_dim=64, stages=6, dtype="bf16", schedule="pingpong"))
    f = tmp_path / "c.json"
    f.write_text(get_config(NAME).to_json())
    assert cli.main(["generate", str(f), "-o", str(out)]) == 0


def test_generate_invalid_config_is_a_clean_error(tmp_path, capsys, clean_cwd):
    assert cli.main(["generate", '{"head_dim": 96}', "-o", str(tmp_path / "x.cu")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "head_dim 96" in err and "nearest valid config" in err
    assert not (tmp_path / "x.cu").exists()
    assert cli.main(["generate", "no_such_config", "-o", str(tmp_path / "x.cu")]) == 2
    assert "known names" in capsys.readouterr().err


def test_build_and_cache_commands(fake_nvcc, bsk_cache, capsys, clean_cwd):
    assert cli.main(["build", NAME]) == 0
    out = capsys.readouterr().out
    cfg = get_config(NAME)
    assert cfg.kernel_name in out and "compiled" in out
    assert cli.main(["build", NAME]) == 0
    assert "cached" in capsys.readouterr().out
    assert fake_nvcc.count() == 1

    assert cli.main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert str(bsk_cache) in out and cfg.kernel_name in out and "1 entries" in out
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert cli.main(["cache", "ls"]) == 0
    assert "0 entries" in capsys.readouterr().out


def test_build_all_parallel(fake_nvcc, bsk_cache, capsys):
    assert cli.main(["build", "--all", "-j", "2"]) == 0
    captured = capsys.readouterr()
    n = len(load_named_configs())
    assert f"{n}/{n} kernels ready ({n} compiled, 0 cached)" in captured.err
    assert fake_nvcc.count() == n
    assert cli.main(["build", "--all", "-j", "2"]) == 0
    assert f"({n} compiled" not in capsys.readouterr().err and fake_nvcc.count() == n


def test_build_failure_exit_code(fake_nvcc, bsk_cache, monkeypatch, capsys):
    monkeypatch.setenv("BSK_FAKE_NVCC_FAIL", "1")
    assert cli.main(["build", NAME]) == 2
    err = capsys.readouterr().err
    assert "bsk_oops" in err and "repro: cd " in err and "build dir kept" in err


def test_build_needs_a_target(capsys):
    assert cli.main(["build"]) == 2
    assert "--all" in capsys.readouterr().err


def test_info(fake_nvcc, bsk_cache, capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "release 99.9" in out and str(fake_nvcc.path) in out
    assert "CUTLASS" in out and "cache dir" in out and str(bsk_cache) in out and "GPU" in out
    from blackwell_sparsek import __version__
    assert __version__ in out


def test_info_without_nvcc(bsk_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BSK_NVCC", str(tmp_path / "missing-nvcc"))
    assert cli.main(["info"]) == 0
    assert "not found" in capsys.readouterr().out


def test_forwarded_subcommands(monkeypatch):
    seen = []
    fake = types.ModuleType("blackwell_sparsek.bench.cli")
    fake.main = lambda argv: seen.append(list(argv)) or 3
    pkg = types.ModuleType("blackwell_sparsek.bench")
    pkg.__path__ = []
    pkg.cli = fake
    monkeypatch.setitem(sys.modules, "blackwell_sparsek.bench", pkg)
    monkeypatch.setitem(sys.modules, "blackwell_sparsek.bench.cli", fake)
    assert cli.main(["bench", "--shape", "2,16,8192,128", "-h"]) == 3
    assert cli.main(["compare-88"]) == 3
    assert cli.main(["profile", "x"]) == 3
    assert seen == [["bench", "--shape", "2,16,8192,128", "-h"], ["compare-88"], ["profile", "x"]]


def test_forwarded_subcommand_without_bench_module(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "blackwell_sparsek.bench.cli", None)  # import raises ImportError
    assert cli.main(["bench"]) == 2
    assert "blackwell_sparsek.bench.cli" in capsys.readouterr().err


def test_python_dash_m(child_env, tmp_path):
    r = subprocess.run([sys.executable, "-m", "blackwell_sparsek", "list-configs"], capture_output=True,
                       text=True, cwd=tmp_path, env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert NAME in r.stdout
    r = subprocess.run([sys.executable, "-m", "blackwell_sparsek", "--version"], capture_output=True, text=True,
                       cwd=tmp_path, env=child_env(), timeout=120)
    assert r.returncode == 0 and "blackwell_sparsek" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "generate" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["cache"], ["cache", "nope"], ["generate"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    assert ei.value.code == 2


@pytest.mark.slow
def test_wheel_ships_templates_and_configs(tmp_path):
    """A non-editable wheel carries templates/ and cutlass_configs/ under blackwell_sparsek/_data/."""
    import shutil
    import zipfile
    from pathlib import Path
    pytest.importorskip("setuptools")
    repo = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(repo / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for name in ("blackwell_sparsek", "templates", "cutlass_configs"):
        shutil.copytree(repo / name, src / name, ignore=ignore)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (whl,) = (tmp_path / "dist").glob("blackwell_sparsek-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert "blackwell_sparsek/_data/templates/attn_fwd.cu.j2" in names
    for cfg in (repo / "cutlass_configs").glob("*.json"):
        assert f"blackwell_sparsek/_data/cutlass_configs/{cfg.name}" in names
    for hdr in (repo / "templates" / "include").rglob("*.hpp"):
        assert f"blackwell_sparsek/_data/templates/{hdr.relative_to(repo / 'templates')}" in names
    assert "blackwell_sparsek/cli.py" in names and "blackwell_sparsek/__main__.py" in names


# -- issue 24: typed errors, exit status 2, no tracebacks (items 8, 9, 12, 23, 25) ----------------------------

def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_generate_output_targets(tmp_path, clean_cwd, capsys):
    cfg = get_config(NAME)
    d = tmp_path / "outdir"
    d.mkdir()
    assert cli.main(["generate", NAME, "-o", str(d)]) == 0  # a directory gets <kernel_name>.cu
    assert capsys.readouterr().out.strip() == str(d / f"{cfg.kernel_name}.cu")
    assert (d / f"{cfg.kernel_name}.cu").read_text() == render(cfg)
    f = tmp_path / "file"
    f.write_text("")
    assert cli.main(["generate", NAME, "-o", str(f / "x.cu")]) == 2
    assert "is a file, not a directory" in _error_line(capsys)
    if os.path.isdir("/proc/self"):
        assert cli.main(["generate", NAME, "-o", "/proc/x.cu"]) == 2
        assert "cannot write /proc/x.cu" in _error_line(capsys)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["cwd", "file", "outdir", f"outdir/{cfg.kernel_name}.cu"]


def test_config_files_on_the_command_line(tmp_path, clean_cwd, capsys):
    nofam = tmp_path / "nofam.json"
    nofam.write_text('{"head_dim": 64, "stages": 6}')
    assert cli.main(["generate", str(nofam), "-o", str(tmp_path / "k.cu")]) == 0
    assert (tmp_path / "k.cu").read_text() == render(AttentionConfig(head_dim=64, stages=6))
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    for content, message in ((b'\xff\xfe{"head_dim": 64}', "not UTF-8 text"), (b"[]", "got an array")):
        bad.write_bytes(content)
        assert cli.main(["generate", str(bad), "-o", str(tmp_path / "x.cu")]) == 2
        assert message in _error_line(capsys)
    (tmp_path / "x.json").mkdir()
    assert cli.main(["generate", str(tmp_path / "x.json"), "-o", str(tmp_path / "x.cu")]) == 2
    assert "is a directory" in _error_line(capsys)
    assert not (tmp_path / "x.cu").exists()


def test_schedule_single_without_tile_m(tmp_path, clean_cwd):
    out = tmp_path / "single.cu"
    assert cli.main(["generate", '{"schedule": "single", "head_dim": 64}', "-o", str(out)]) == 0
    assert out.read_text() == render(AttentionConfig(head_dim=64, schedule="single", tile_m=64))


def test_unbounded_config_never_reaches_nvcc(fake_nvcc, bsk_cache, capsys):
    assert cli.main(["build", '{"block_n": 100000000000}']) == 2
    assert "block_n 100000000000" in _error_line(capsys)
    assert fake_nvcc.count() == 0


def test_every_subcommand_option_and_choice_has_help():
    import argparse

    def walk(parser, where):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{where}: subcommand group without help"
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    assert helps.get(name), f"{where} {name}: no help"
                    walk(sub, f"{where} {name}")
            else:
                assert action.help, f"{where}: {action.option_strings or action.dest} has no help"
    walk(cli.make_parser(), "python -m blackwell_sparsek")


def test_cache_help_texts(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cache", "--help"])
    out = capsys.readouterr().out
    assert "ls" in out and "list cached kernels" in out and "clear" in out and "remove only the entries" in out
    with pytest.raises(SystemExit):
        cli.main(["cache", "ls", "--help"])
    assert "--verify" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["list-configs", "--help"])
    assert "JSON object keyed by name" in " ".join(capsys.readouterr().out.split())


def test_cache_ls_verify(bsk_cache, monkeypatch, capsys):
    from blackwell_sparsek.jit import kernels
    seen = []

    def fake_ls(verify: bool = False):
        seen.append(verify)
        return [{"kernel_name": "bsk_k", "key": "ab" * 32, "so_bytes": "junk", "build_seconds": "n/a",
                 "created": None, "valid": not verify}]
    monkeypatch.setattr(kernels, "cache_ls", fake_ls)
    assert cli.main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "bsk_k" in out and "corrupt" not in out  # odd metadata values are left out, not a crash
    assert cli.main(["cache", "ls", "--verify"]) == 0
    assert "[corrupt: rebuilt on next use]" in capsys.readouterr().out
    assert seen == [False, True]


def test_file_system_errors_are_one_line(fake_nvcc, tmp_path, monkeypatch, capsys):
    f = tmp_path / "not-a-dir"
    f.write_text("")
    monkeypatch.setenv("BSK_CACHE_DIR", str(f))
    assert cli.main(["info"]) == 0  # info reports a broken cache setting instead of failing
    assert "cache dir" in capsys.readouterr().out
    assert cli.main(["build", NAME]) == 2  # whatever layer reports it, one line and status 2
    assert str(f) in capsys.readouterr().err.splitlines()[-1]


def test_forwarded_bsk_errors_exit_2(monkeypatch, capsys):
    from blackwell_sparsek import InvalidConfigError
    fake = types.ModuleType("blackwell_sparsek.bench.cli")

    def main(argv):
        raise InvalidConfigError("no named config 'x'")
    fake.main = main
    monkeypatch.setitem(sys.modules, "blackwell_sparsek.bench.cli", fake)
    assert cli.main(["profile", "--config", "x"]) == 2
    assert "no named config" in _error_line(capsys)


@pytest.mark.parametrize("argv, message", [
    (["generate", "[]"], "must be a JSON object"),
    (["generate", NAME, "-o", "/proc/x.cu"], "cannot write"),
    (["build", '{"block_m": 0}'], "block_m 0"),
    (["generate", "missing.json"], "does not exist"),
])
def test_python_dash_m_errors_exit_2_without_traceback(child_env, tmp_path, argv, message):
    r = subprocess.run([sys.executable, "-m", "blackwell_sparsek", *argv], capture_output=True, text=True,
                       cwd=tmp_path, env=child_env(BSK_CACHE_DIR=str(tmp_path / "c")), timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ") and message in r.stderr
    assert [p.name for p in tmp_path.iterdir()] in ([], ["c"])
