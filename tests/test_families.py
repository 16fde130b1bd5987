"""The contract every kernel family keeps, run over every registered family and a tiny test family: validate ->
render -> key -> ABI struct (Python's ctypes layout equals the C struct the template renders, compiled with cc) ->
fake build -> load -> launch. CPU only (a fake nvcc that makes a real shared object).

A new family registers itself in blackwell_sparsek/families/ and adds an entry to LAUNCH_ARGS below: how its
``launch_args`` is called on small CPU tensors, so the test can check it fills every ABI field exactly once.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from blackwell_sparsek import families  # noqa: F401 - registers every family
from blackwell_sparsek.jit import codegen, kernels, runtime, spec
from blackwell_sparsek.jit.spec import Arch, KernelConfig


def _attn_fwd_args():
    from blackwell_sparsek.families import attn_fwd
    from blackwell_sparsek.layout import BlockSparseLayout
    lay = BlockSparseLayout.random_topk(300, 2, seed=0, block_m=128, block_n=128)
    q = torch.zeros(1, 2, 300, 64, dtype=torch.float16)
    o, lse = torch.empty_like(q), torch.empty(1, 2, 300)
    meta = [lay.window_left, lay.window_right, lay.n_kblocks, 0]
    return attn_fwd.launch_args(q, q, q, o, lse, lay.col_idx, lay.block_kind, lay.row_schedule(), meta, 0.125, 132)


def _attn_bwd_args():
    from blackwell_sparsek.ops.attention_bwd import transposed_view
    from blackwell_sparsek.families import attn_bwd
    from blackwell_sparsek.layout import BlockSparseLayout
    lay = BlockSparseLayout.random_topk(300, 2, seed=0, block_m=128, block_n=128)
    q = torch.zeros(1, 2, 300, 64, dtype=torch.float16)
    lse, ws = torch.zeros(1, 2, 300), torch.zeros(2, 1, 2, 300)
    t_q, t_kind, t_sched, t_rank = transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks,
                                                   300, 128)
    return attn_bwd.launch_args(q=q, k=q, v=q, o=q, do=q, lse=lse, glse=None, lse2=ws[0], delta=ws[1],
                                dq_acc=torch.zeros(1, 2, 300, 64), dq=q, dk=q, dv=q, t_q_idx=t_q, t_kind=t_kind,
                                t_sched=t_sched, t_rank=t_rank, dq_sem=torch.zeros(1, 2, 5, dtype=torch.int32),
                                window_left=-1, window_right=-1, scale=0.125)


def _bsr_gemm_args():
    from blackwell_sparsek.families import bsr_gemm
    from blackwell_sparsek.layout import BlockSparseLayout
    lay = BlockSparseLayout.random_topk(300, 2, seed=0, seq_k=260, block_m=128, block_n=128)
    vals = torch.zeros(lay.nnz, 128, 128, dtype=torch.float16)
    b, out = torch.zeros(260, 64, dtype=torch.float16), torch.zeros(300, 64, dtype=torch.float16)
    return bsr_gemm.launch_args(a=vals, b=b, out=out, bias=torch.zeros(64), sched=lay.row_schedule()[0],
                                blk_b=lay.col_idx[0], blk_a=None, m=300, n=64, k=260, nnz=lay.nnz, alpha=1.0,
                                beta=0.0, sm_count=132)


LAUNCH_ARGS = {"attn_fwd": _attn_fwd_args, "attn_bwd": _attn_bwd_args, "bsr_gemm": _bsr_gemm_args}


# -- a tiny family: what a new family needs at least -----------------------------------------------------------

TINY_TEMPLATE = """// tiny test family {{ kernel_name }}
#include <cuda_runtime.h>
struct {{ kernel_name }}_args {
{%- for name, ctype in abi %}
  {{ ctype }} {{ name }};
{%- endfor %}
};
extern "C" int bsk_launch(const {{ kernel_name }}_args* args, cudaStream_t stream) { return 0; }
extern "C" const char* bsk_kernel_name() { return "{{ kernel_name }}"; }
extern "C" int bsk_smem_bytes() { return {{ width }}; }
"""


@dataclass(frozen=True)
class TinyConfig(KernelConfig):
    width: int = 8
    arch: Arch = Arch.SM90A

    family: ClassVar[str] = "tiny_test"
    template: ClassVar[str] = "tiny_test.cu.j2"
    abi: ClassVar[tuple[tuple[str, str], ...]] = (("x", "const void*"), ("n", "int"), ("alpha", "float"),
                                                  ("stride", "long long"), ("flag", "unsigned char"))

    def name_facts(self) -> str:
        return f"w{self.width}"

    def problems(self) -> list[str]:
        return [] if 1 <= self.width <= 64 else [f"width {self.width} out of 1..64"]

    def template_vars(self) -> dict[str, Any]:
        return {"width": self.width}


def _tiny_launch_args():
    return {"x": 0, "n": 3, "alpha": 0.5, "stride": 1 << 40, "flag": 1}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """TinyConfig registered, its template beside copies of the real ones (so every family renders)."""
    tdir = tmp_path / "templates"
    shutil.copytree(codegen.templates_dir(), tdir)
    (tdir / TinyConfig.template).write_text(TINY_TEMPLATE)
    monkeypatch.setattr(codegen, "templates_dir", lambda: tdir)
    monkeypatch.setitem(spec.FAMILIES, TinyConfig.family, TinyConfig)
    monkeypatch.setitem(LAUNCH_ARGS, TinyConfig.family, _tiny_launch_args)
    return TinyConfig


def _one_config(family: str) -> KernelConfig:
    cls = spec.families()[family]
    named = [c for c in spec.load_named_configs().values() if c.family == family]
    return named[0] if named else cls()


def _families(tiny) -> list[str]:
    return sorted(spec.families())


def test_every_family_has_a_launch_args_entry(tiny):
    assert set(spec.families()) <= set(LAUNCH_ARGS), "add the new family to LAUNCH_ARGS in this test"


def test_family_contract(tiny, fake_nvcc, tmp_path):
    for family in _families(tiny):
        cfg = _one_config(family).validate()
        cls = type(cfg)
        # the registry, the canonical form and the name
        assert spec.families()[family] is cls and cfg.family == family
        assert KernelConfig.from_json(cfg.to_json()) == cfg
        assert re.fullmatch(rf"bsk_{cfg.arch.value}_{family}_[a-z0-9_]+_[0-9a-f]{{12}}", cfg.kernel_name)
        assert cfg.kernel_name == f"{cfg.config_name}_{cfg.config_hash[:12]}"
        assert dataclasses.is_dataclass(cfg) and cls.__dataclass_params__.frozen
        # render: the ABI struct in order, the name the .so must report
        src = codegen.render(cfg)
        body = re.search(rf"struct {cfg.kernel_name}_args \{{(.*?)\}};", src, re.S).group(1)
        fields = [" ".join(ln.strip().rstrip(";").split()) for ln in body.strip().splitlines()]
        assert fields == [f"{ct} {n}" for n, ct in cls.abi]
        assert f'return "{cfg.kernel_name}"' in src
        # the key moves with the config
        fp = {"flags": ["-x"]}
        assert kernels.cache_key(cfg, src, fp) != kernels.cache_key(cfg, src + "//", fp)
        # launch_args fills every ABI field exactly once, with values the ctypes struct accepts
        filled = LAUNCH_ARGS[family]()
        assert sorted(filled) == sorted(n for n, _ in cls.abi), family
        # the ctypes struct has the C struct's layout (offsets and size, compiled by cc)
        _check_layout(cfg, body, tmp_path / family)
        # fake build -> load -> launch on "stream 0" (the fake launcher returns the stream as its error code)
        k = kernels.build(cfg)
        assert k.kernel_name == cfg.kernel_name
        k.launch(k.make_args(**filled), 0)


def _check_layout(cfg: KernelConfig, body: str, d) -> None:
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    d.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in cfg.abi]
    prints = "".join(f'  printf("%zu\\n", offsetof(struct a, {n}));\n' for n in names)
    (d / "l.c").write_text("#include <stddef.h>\n#include <stdio.h>\nstruct a {" + body + "};\n"
                           "int main(void) {\n" + prints + '  printf("%zu\\n", sizeof(struct a));\n  return 0;\n}\n')
    subprocess.run(["cc", "-o", str(d / "l"), str(d / "l.c")], check=True)
    got = [int(x) for x in subprocess.run([str(d / "l")], capture_output=True, text=True, check=True).stdout.split()]
    S = runtime.args_struct(tuple(cfg.abi))
    want = [getattr(S, n).offset for n in names] + [ctypes.sizeof(S)]
    assert got == want, (cfg.family, list(zip(names + ["sizeof"], got, want)))


def test_generic_machinery_never_imports_a_family():
    """jit/ (spec, codegen, compiler, store, kernels, runtime) reaches families only through the registry."""
    from pathlib import Path
    import blackwell_sparsek
    jit = Path(blackwell_sparsek.__file__).parent / "jit"
    for p in jit.glob("*.py"):
        text = p.read_text()
        assert not re.search(r"^\s*(from|import) [.\w]*families", text, re.M), p.name


def test_attn_fwd_launch_args_fix_size1_strides():
    """A size-1 dim may carry any stride in torch (1 after an unsqueeze); TMA needs 16-byte multiples, so
    launch_args passes the tensor's span there, and leaves every other stride as it is."""
    from blackwell_sparsek.families import attn_fwd
    from blackwell_sparsek.layout import BlockSparseLayout
    lay = BlockSparseLayout.dense(256)
    q = torch.zeros(256, 2, 64, dtype=torch.float16).unsqueeze(0).transpose(1, 2)  # (B, S, H, D) storage, B = 1
    odd = torch.zeros(1, 2, 256, 64, dtype=torch.float16)
    odd = odd.as_strided(odd.shape, (1, 256 * 64, 64, 1))  # the size-1 batch dim with stride 1
    o, lse = torch.empty_like(q), torch.empty(1, 2, 256)
    a = attn_fwd.launch_args(odd, q, q, o, lse, lay.col_idx, lay.block_kind, lay.row_schedule(), [-1, -1, 2, 0],
                             0.1, 132)
    assert a["q_stride_b"] == 2 * 256 * 64 and a["q_stride_h"] == 256 * 64 and a["q_stride_s"] == 64
    assert a["k_stride_h"] == 64 and a["k_stride_s"] == 128  # a (B, S, H, D) view keeps its strides


@pytest.mark.parametrize("family", sorted(spec.families()))
def test_int_and_bool_fields_take_only_ints_and_bools(family):
    """Every family's fields declared int refuse bools, floats and strings, and those declared bool refuse ints:
    one rule in KernelConfig.__post_init__, so a new family gets it without code of its own."""
    cls = spec.families()[family]
    fields = [f for f in dataclasses.fields(cls) if f.type in ("int", "bool")]
    assert fields, family
    for f in fields:
        bad = (True, 1.0, "128") if f.type == "int" else (1, "yes")
        for v in bad:
            with pytest.raises(spec.InvalidConfigError, match=f"{f.name} must be an? {f.type}"):
                cls(**{f.name: v})
