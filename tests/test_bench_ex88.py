"""CPU-only tests of the example-88 side of the benchmarks: parsing its output, curand discovery, its build cache
(a fake nvcc, a fake binary), its import and BSK_EX88_BIN. No GPU, no real nvcc compile."""
from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import pytest

from blackwell_sparsek.bench import ex88
from blackwell_sparsek.errors import KernelCompileError, ToolchainError

# ---------------------------------------------------------------------------------------------------------------
# example 88 output parsing (text captured from the format of print_result / main_single in 88_hopper_fmha.cu)
# ---------------------------------------------------------------------------------------------------------------

SAMPLE_D128 = """\
###### B 2 H 16 Q 8192 K 8192 D 128 Forward Full #SM 132
 [--] tma ws cooperative 128x128x128    : 652.317 TFLOPS/s
       t=1.68536ms, smem=164096b
 [--] tma ws ping-pong 128x128x128      : 640.12 TFLOPS/s
       t=1.7174ms, smem=197888b
"""

SAMPLE_D64_VERIFY = """\
###### B 1 H 8 Q 8192 K 8192 D 64 Forward Causal #SM 132
 [OK]  tma 64x128x64                    : 232.5 TFLOPS/s
 [OK]  tma ws cooperative 128x64x64     : 183.25 TFLOPS/s
[FAIL] tma ws ping-pong 128x64x64       : 0 TFLOPS/s
"""


def test_parse_output_records():
    recs = ex88.parse_output(SAMPLE_D128)
    assert [r["kernel"] for r in recs] == ["tma ws cooperative 128x128x128", "tma ws ping-pong 128x128x128"]
    assert recs[0]["tflops"] == pytest.approx(652.317)
    assert recs[0]["status"] == "unverified"
    assert recs[0]["time_ms"] == pytest.approx(1.68536)
    assert recs[0]["smem_bytes"] == 164096
    assert (recs[0]["b"], recs[0]["h"], recs[0]["q"], recs[0]["k"], recs[0]["d"]) == (2, 16, 8192, 8192, 128)
    assert recs[0]["mask"] == "full" and recs[0]["direction"] == "forward" and recs[0]["sm_count"] == 132


def test_parse_output_verify_fail_and_sections():
    recs = ex88.parse_output(SAMPLE_D128 + SAMPLE_D64_VERIFY)
    assert len(recs) == 5
    st = {r["kernel"]: r["status"] for r in recs}
    assert st["tma 64x128x64"] == "ok"
    assert st["tma ws ping-pong 128x64x64"] == "fail"
    assert recs[2]["mask"] == "causal" and recs[2]["d"] == 64 and recs[2]["time_ms"] is None


def test_parse_output_garbage_and_nan():
    text = "some banner\n [--] tma 64x128x64 : nan TFLOPS/s\nno result here\n"
    recs = ex88.parse_output(text)
    assert len(recs) == 1 and math.isnan(recs[0]["tflops"]) and recs[0]["b"] is None
    assert ex88.parse_output("") == []


def test_summarize_median_and_best():
    runs = [ex88.parse_output(SAMPLE_D128),
            ex88.parse_output(SAMPLE_D128.replace("652.317", "600").replace("t=1.68536ms", "t=1.8ms")),
            ex88.parse_output(SAMPLE_D128.replace("652.317", "700").replace("t=1.68536ms", "t=1.6ms"))]
    summ = ex88.summarize(runs, causal=False)
    coop = summ[0]
    assert coop["tflops"] == pytest.approx(652.317)
    assert coop["time_ms"] == pytest.approx(1.68536)
    assert coop["samples_tflops"] == [pytest.approx(652.317), 600.0, 700.0]
    assert ex88.best(summ)["kernel"] == "tma ws cooperative 128x128x128"


def test_summarize_time_from_flops_and_failures():
    summ = ex88.summarize([ex88.parse_output(SAMPLE_D64_VERIFY)], causal=True)
    tma = summ[0]
    fl = ex88.flops(1, 8, 8192, 8192, 64, causal=True)
    assert tma["time_ms"] == pytest.approx(fl / (232.5e12) * 1e3)
    pp = summ[2]
    assert pp["status"] == "fail" and pp["tflops"] is None and pp["failures"] == 1
    assert ex88.best(summ)["kernel"] == "tma 64x128x64"


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_run_and_measure_with_fake_binary(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text(SAMPLE_D128)
    args = tmp_path / "args.txt"
    fake = _script(tmp_path / "88_hopper_fmha", f'echo "$@" >> {args}\ncat {out}\n')
    res = ex88.measure(fake, b=2, h=16, q=8192, d=128, iterations=25, repeats=2)
    assert res["best"]["tflops"] == pytest.approx(652.317)
    calls = args.read_text().splitlines()
    assert len(calls) == 2
    assert "--iterations=25" in calls[0] and "--mask=no" in calls[0] and "--verbose" in calls[0]
    assert "--k=8192" in calls[0]


def test_run_errors(tmp_path):
    silent = _script(tmp_path / "silent", 'echo "cudaGetDeviceProperties() returned an error" >&2\n')
    with pytest.raises(ex88.Ex88Error, match="printed no results"):
        ex88.run(silent, b=1, h=1, q=128, d=64)
    hopper = _script(tmp_path / "hopper", 'echo "This example requires a GPU of NVIDIA\'s Hopper Architecture"\n')
    with pytest.raises(ex88.Ex88Error, match="Hopper"):
        ex88.run(hopper, b=1, h=1, q=128, d=64)
    with pytest.raises(ValueError):
        ex88.run(hopper, b=1, h=1, q=128, d=64, mask="diagonal")


# ---------------------------------------------------------------------------------------------------------------
# curand discovery, cache key, build cache (fake nvcc), import, BSK_EX88_BIN
# ---------------------------------------------------------------------------------------------------------------

def test_curand_missing_is_a_clear_toolchain_error(tmp_path):
    with pytest.raises(ToolchainError) as ei:
        ex88.find_curand_include(cuda_homes=[tmp_path / "cuda"], nvidia_dirs=[tmp_path / "nvidia"])
    msg = str(ei.value)
    assert "pip install nvidia-curand" in msg and "curand_kernel.h" in msg


def test_curand_found_in_pip_package_and_cuda_home(tmp_path):
    pip_inc = tmp_path / "nvidia" / "cu13" / "include"
    pip_inc.mkdir(parents=True)
    (pip_inc / "curand_kernel.h").write_text("// fake\n")
    assert ex88.find_curand_include(cuda_homes=[tmp_path / "cuda"], nvidia_dirs=[tmp_path / "nvidia"]) == pip_inc
    home_inc = tmp_path / "cuda" / "include"
    home_inc.mkdir(parents=True)
    (home_inc / "curand_kernel.h").write_text("// fake\n")
    assert ex88.find_curand_include(cuda_homes=[tmp_path / "cuda"], nvidia_dirs=[tmp_path / "nvidia"]) == home_inc


def _fake_cutlass(root: Path) -> Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n")
    ex = root / "examples" / ex88.EX88
    ex.mkdir(parents=True)
    (ex / f"{ex88.EX88}.cu").write_text("int main() { return 0; }\n")
    (root / "examples" / "common").mkdir(parents=True)
    (root / "examples" / "common" / "helper.h").write_text("// helper\n")
    return root


def _toolchain(tmp_path: Path, nvcc: Path) -> ex88.Toolchain:
    src = _fake_cutlass(tmp_path / "cutlass")
    fields = ex88.key_fields(src, "nvcc: fake 13.0")
    return ex88.Toolchain(nvcc, "nvcc: fake 13.0", src, fields, ex88.cache_key(fields))


def test_cache_key_depends_on_source_and_nvcc(tmp_path):
    src = _fake_cutlass(tmp_path / "c")
    f1 = ex88.key_fields(src, "nvcc A")
    assert f1["cutlass_version"] == "4.2.0"
    assert ex88.cache_key(f1) == ex88.cache_key(ex88.key_fields(src, "nvcc A"))
    assert ex88.cache_key(f1) != ex88.cache_key(ex88.key_fields(src, "nvcc B"))
    (src / "examples" / ex88.EX88 / f"{ex88.EX88}.cu").write_text("int main() { return 1; }\n")
    assert ex88.cache_key(f1) != ex88.cache_key(ex88.key_fields(src, "nvcc A"))
    # machine-specific paths never enter the key
    assert not any("/" in f and "<" not in f for f in f1["flags"] if f.startswith("-I"))


def test_build_with_fake_nvcc_caches_and_survives_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("BSK_CACHE_DIR", str(tmp_path / "cache"))
    inc = tmp_path / "curand"
    inc.mkdir()
    monkeypatch.setattr(ex88, "find_curand_include", lambda *a, **k: inc)
    count = tmp_path / "count"
    nvcc = _script(tmp_path / "nvcc", f'''echo x >> {count}
out=""
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
printf '#!/bin/sh\\necho built\\n' > "$out"; chmod +x "$out"
''')
    tc = _toolchain(tmp_path, nvcc)
    b1 = ex88.build(tc, progress=False)
    assert b1.is_file() and b1.parent == tc.entry
    meta = json.loads((tc.entry / "meta.json").read_text())
    assert meta["key"] == tc.key and meta["artifact_size"] == b1.stat().st_size
    assert ex88.build(tc, progress=False) == b1
    assert len(count.read_text().split()) == 1          # second call is a cache hit
    b1.write_text("#!/bin/sh\necho corrupted\n")          # corrupt: sha mismatch -> rebuild
    assert ex88.cached_binary(tc) is None
    ex88.build(tc, progress=False)
    assert len(count.read_text().split()) == 2
    assert not list((tmp_path / "cache" / ".staging").iterdir())


def test_build_failure_keeps_dir_and_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("BSK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ex88, "find_curand_include", lambda *a, **k: tmp_path)
    nvcc = _script(tmp_path / "nvcc", 'echo "88_hopper_fmha.cu(12): error: identifier oops is undefined"\nexit 2\n')
    tc = _toolchain(tmp_path, nvcc)
    with pytest.raises(KernelCompileError) as ei:
        ex88.build(tc, progress=False)
    msg = str(ei.value)
    assert "identifier oops" in msg and "repro:" in msg and "build dir kept" in msg
    assert ex88.cached_binary(tc) is None
    assert list((tmp_path / "cache" / "failed").glob(f"{ex88.STORE_NAME}-*"))


def test_import_binary_and_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("BSK_CACHE_DIR", str(tmp_path / "cache"))
    tc = _toolchain(tmp_path, tmp_path / "nvcc-unused")
    built = _script(tmp_path / "prebuilt", "echo hi\n")
    p = ex88.import_binary(built, tc, note="test")
    assert p.is_file() and ex88.cached_binary(tc) == p
    assert json.loads((tc.entry / "meta.json").read_text())["imported_from"].endswith("prebuilt")
    monkeypatch.setenv("BSK_EX88_BIN", str(built))
    assert ex88.locate(build_if_missing=False) == built
    monkeypatch.setenv("BSK_EX88_BIN", str(tmp_path / "missing"))
    with pytest.raises(ToolchainError, match="BSK_EX88_BIN"):
        ex88.locate(build_if_missing=False)


def test_build_command_matches_reference_flags(tmp_path):
    cmd = ex88.build_command("nvcc", Path("/src"), "/curand", "out")
    s = " ".join(cmd)
    for flag in ("-std=c++17", "-O3", "--use_fast_math", "-DNDEBUG", "--expt-relaxed-constexpr",
                 "-gencode=arch=compute_90a,code=sm_90a", "-I/src/include", "-I/src/tools/util/include",
                 "-I/src/examples/common", "-I/src/examples/88_hopper_fmha", "-isystem /curand", "-o out",
                 "/src/examples/88_hopper_fmha/88_hopper_fmha.cu"):
        assert flag in s
    assert "-lcuda" not in cmd  # links on machines without a driver library (CI, the build host)
