"""Rendering: every named config renders, StrictUndefined bites, no torch in generated code, nothing in cwd."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

import blackwell_sparsek
from blackwell_sparsek import AttentionConfig, BskError, InvalidConfigError
from blackwell_sparsek.jit import codegen
from blackwell_sparsek.jit.spec import get_config, load_named_configs


@pytest.mark.parametrize("name", sorted(load_named_configs()))
def test_every_named_config_renders(name, clean_cwd):
    cfg = get_config(name)
    src = codegen.render(cfg)
    assert f'bsk_kernel_name() {{ return "{cfg.kernel_name}"; }}' in src
    assert f"struct {cfg.kernel_name} :" in src  # the kernel type carries the generated name
    assert 'extern "C" int bsk_launch(' in src
    assert 'extern "C" int bsk_smem_bytes()' in src
    assert f"// config: {cfg.to_json()}" in src
    if cfg.family.startswith("attn_"):
        assert f"/*HeadDim=*/{cfg.head_dim}" in src
    if cfg.family in ("attn_fwd", "bsr_gemm"):
        assert f"/*Stages=*/{cfg.stages}" in src
    if cfg.family == "bsr_gemm":
        assert f"/*TileN=*/{cfg.tile_n}," in src and f"/*BlockM=*/{cfg.block_m}," in src
    assert cfg.dtype.cutlass_type in src
    assert "{{" not in src and "{%" not in src
    assert codegen.render(cfg) == src  # deterministic


def test_tile_claims_render_where_the_config_claims():
    """ClaimTiles is rendered for the configs whose persistent CTAs claim tiles (ping-pong at head_dim 128, every
    split ping-pong, ping-pong at head_dim 64 with claims=True), and nowhere else: the other kernels keep their
    static order (and their source)."""
    import torch
    from blackwell_sparsek.families.attn_fwd import Schedule
    from blackwell_sparsek.ops.attention import tile_counter
    pp, coop = Schedule.PINGPONG, Schedule.COOPERATIVE
    cases = [(pp, 128, False, True), (pp, 64, False, False), (pp, 64, True, True), (pp, 128, True, True),
             (coop, 128, False, False), (coop, 128, True, False), (pp, 256, False, False)]
    for sched, d, split, want in cases:
        cfg = AttentionConfig(head_dim=d, schedule=sched, split_kv=split, stages={64: 8, 128: 5, 256: 2}[d],
                              tile_n=64 if d == 256 else 128)
        assert cfg.claims_tiles is want, (sched, d, split)
        src = codegen.render(cfg)
        assert ("/*ClaimTiles=*/true" in src) is want, (sched, d, split)
        counter = tile_counter(cfg.to_json(), "cpu")  # the op's per-call int32 for the launcher to zero
        assert (counter is not None) is want and (counter is None or counter.dtype == torch.int32)
    for claims in (True, False):  # the field overrides the default either way
        cfg = AttentionConfig(head_dim=64 if claims else 128, schedule=pp, stages=8 if claims else 5, claims=claims)
        assert ("/*ClaimTiles=*/true" in codegen.render(cfg)) is claims
        assert (tile_counter(cfg.to_json(), "cpu") is not None) is claims
    assert ("counter", "int*") in AttentionConfig.abi


def test_generated_code_has_no_torch_headers():
    for cfg in load_named_configs().values():
        src = codegen.render(cfg)
        assert "torch/extension.h" not in src
        assert "#include <torch" not in src and '#include "torch' not in src
        assert "pybind11" not in src


def test_abi_struct_rendered_in_order():
    cfg = AttentionConfig()
    src = codegen.render(cfg)
    body = src.split(f"struct {cfg.kernel_name}_args {{", 1)[1].split("};", 1)[0]
    fields = [ln.strip().rstrip(";") for ln in body.strip().splitlines()]
    assert fields == [f"{ct} {name}" for name, ct in cfg.abi]


def test_missing_template_variable_fails(monkeypatch):
    orig = AttentionConfig.template_vars

    def without_stages(self):
        d = orig(self)
        del d["stages"]
        return d

    monkeypatch.setattr(AttentionConfig, "template_vars", without_stages)
    with pytest.raises(BskError, match="stages") as ei:
        codegen.render(AttentionConfig())
    assert isinstance(ei.value.__cause__, jinja2.UndefinedError)


def test_environment_is_strict():
    env = codegen.environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ nope }}").render()


def test_reserved_template_vars_cannot_be_overridden(monkeypatch):
    orig = AttentionConfig.template_vars
    monkeypatch.setattr(AttentionConfig, "template_vars", lambda self: {**orig(self), "kernel_name": "x"})
    with pytest.raises(BskError, match="kernel_name"):
        codegen.render(AttentionConfig())


def test_render_validates_first():
    with pytest.raises(InvalidConfigError, match="head_dim 96"):
        codegen.render(dataclasses.replace(AttentionConfig(), head_dim=96))


def test_generate_writes_only_the_given_path(tmp_path, clean_cwd):
    cfg = get_config("bsk_sm90a_attn_fwd_d64_bf16_t128x128_coop_s8_b128x128")
    out = tmp_path / "out" / "k.cu"
    assert blackwell_sparsek.generate(cfg, out) == out
    assert out.read_text() == codegen.render(cfg)
    assert sorted(p.name for p in out.parent.iterdir()) == ["k.cu"]


def test_import_is_cheap(child_env, tmp_path):
    code = ("import sys, blackwell_sparsek as b; "
            "heavy = [m for m in ('torch', 'jinja2', 'cuda', 'cuda.bindings', 'cutlass_library', 'filelock', "
            "'subprocess', 'blackwell_sparsek.jit.kernels', 'blackwell_sparsek.jit.compiler', 'blackwell_sparsek.jit.runtime', 'blackwell_sparsek.jit.store') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env=child_env())
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_lazy_public_names():
    assert set(blackwell_sparsek.__all__) >= {
        "AttentionConfig", "Schedule", "DType", "Arch", "generate", "build", "BlockSparseLayout",
        "sparse_attention", "precompile", "KernelCompileError", "CudaError"}
    assert blackwell_sparsek.render is codegen.render
    with pytest.raises(AttributeError):
        blackwell_sparsek.not_a_thing  # noqa: B018


# -- issue 24 item 8: output paths; item 13: configs given by name, dict or JSON ------------------------------

NAMED = "bsk_sm90a_attn_fwd_d64_bf16_t128x128_coop_s8_b128x128"


def _leftovers(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp"))


def test_generate_into_a_directory(tmp_path, clean_cwd):
    cfg = get_config(NAMED)
    d = tmp_path / "existing"
    d.mkdir()
    out = blackwell_sparsek.generate(cfg, d)
    assert out == d / f"{cfg.kernel_name}.cu" and out.read_text() == codegen.render(cfg)
    assert [p.name for p in d.iterdir()] == [out.name]
    new = blackwell_sparsek.generate(cfg, f"{tmp_path / 'new'}/")  # a trailing separator means a directory
    assert new == tmp_path / "new" / f"{cfg.kernel_name}.cu" and new.is_file()
    assert _leftovers(tmp_path) == []


def test_generate_refuses_unwritable_targets_and_leaves_nothing(tmp_path, clean_cwd):
    from blackwell_sparsek import InputError
    cfg = get_config(NAMED)
    f = tmp_path / "file"
    f.write_text("mine")
    for target in (f / "x.cu", f / "sub" / "x.cu"):
        with pytest.raises(InputError, match=r"file is a file, not a directory; choose another output path"):
            blackwell_sparsek.generate(cfg, target)
    assert f.read_text() == "mine"
    blocked = tmp_path / "d"
    (blocked / f"{cfg.kernel_name}.cu").mkdir(parents=True)  # the file name is taken by a directory
    with pytest.raises(InputError, match="cannot write"):
        blackwell_sparsek.generate(cfg, blocked)
    if Path("/proc/self").is_dir():  # procfs accepts no new files, even for root
        with pytest.raises(InputError, match="cannot write /proc/x.cu"):
            blackwell_sparsek.generate(cfg, "/proc/x.cu")
    for bad in (None, 3, b"x.cu", ""):
        with pytest.raises(InputError, match="output path"):
            blackwell_sparsek.generate(cfg, bad)
    assert _leftovers(tmp_path) == [] and sorted(p.name for p in blocked.iterdir()) == [f"{cfg.kernel_name}.cu"]


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_generate_removes_its_temp_file_on_any_failure(tmp_path, monkeypatch, exc):
    import os

    def boom(*args, **kwargs):
        raise exc
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(type(exc) if isinstance(exc, KeyboardInterrupt) else BskError):
        blackwell_sparsek.generate(get_config(NAMED), tmp_path / "k.cu")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_generate_keeps_the_umask_permissions(tmp_path):
    import os
    out = blackwell_sparsek.generate(get_config(NAMED), tmp_path / "k.cu")
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_generate_and_render_take_names_dicts_and_json(tmp_path):
    cfg = get_config(NAMED)
    src = codegen.render(cfg)
    assert blackwell_sparsek.generate(NAMED, tmp_path / "a.cu").read_text() == src
    assert blackwell_sparsek.generate(cfg.to_dict(), tmp_path / "b.cu").read_text() == src
    assert blackwell_sparsek.generate(cfg.to_json(), tmp_path / "c.cu").read_text() == src
    assert blackwell_sparsek.render(NAMED) == src
    with pytest.raises(TypeError, match="named config"):
        blackwell_sparsek.generate(5, tmp_path / "d.cu")
    with pytest.raises(InvalidConfigError, match="no named config"):
        blackwell_sparsek.generate("sm90_nope", tmp_path / "d.cu")


def test_build_takes_names_dicts_and_json(fake_nvcc, bsk_cache):
    cfg = get_config(NAMED)
    no_family = {k: v for k, v in cfg.to_dict().items() if k != "family"}
    for spec in (NAMED, cfg.to_dict(), no_family, cfg.to_json()):
        k = blackwell_sparsek.build(spec)
        assert k.kernel_name == cfg.kernel_name
    assert fake_nvcc.count() == 1
    from blackwell_sparsek.jit.spec import ConfigTypeError
    with pytest.raises(ConfigTypeError, match="a dict of config fields, inline JSON text"):
        blackwell_sparsek.build(5)
    assert fake_nvcc.count() == 1
