#!/usr/bin/env bash
# Everything a release needs from a GPU machine without network, from the repo root (a copy carrying .whl/ with the
# nvidia-cutlass wheel), in two parts that each fit one 10-minute device call on the same machine:
#   OUT=<dir> [BSK_CACHE_TGZ=<tar.gz of a prebuilt cache>] [PART=1|2|all] bash dev/gpu_check.sh
# Part 1: builds what the carried cache lacks (dev/prebuild.py, 16 nvcc) and example 88 (in the background), a
# backward smoke run under a timeout (a hang stops here), every GPU test of every family but long context, and the
# host-time profile (dev/host_profile.py). Part 2: the benches that decide defaults and the issues' peers: the
# backward (bench-bwd), short rows against example 88 and the GEMM schedule variants
# (split-KV has its own bench, python -m blackwell_sparsek.bench.split_kv). Logs and JSON go to $OUT; the test
# summary and the bench tables come last.
set -o pipefail
OUT=${OUT:-/tmp/bsk_gpu_check}; mkdir -p "$OUT"
PART=${PART:-all}
source dev/gpu_session.sh
export BSK_CACHE_DIR=$PWD/.bskcache; mkdir -p -m 700 "$BSK_CACHE_DIR"
# kernels prebuilt on a CPU host (dev/prebuild.py), packed: the carried tree is size-limited and .so files pack 3x
if [ -n "$BSK_CACHE_TGZ" ] && [ -f "$BSK_CACHE_TGZ" ]; then tar -xzf "$BSK_CACHE_TGZ" -C "$BSK_CACHE_DIR" || exit 1; fi

if [ "$PART" = 1 ] || [ "$PART" = all ]; then
  (python -m blackwell_sparsek.bench.ex88 locate > "$OUT/ex88_build.txt" 2>&1) &
  ex88=$!
  t0=$(date +%s)
  python dev/prebuild.py -j 16 2>&1 | tail -3 | tee "$OUT/build.txt" || { echo "BUILD FAILED"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.txt"
  timeout 90 python dev/bwd_smoke.py 2>&1 | tee "$OUT/bwd_smoke.txt" || { echo "SMOKE FAILED (error or hang)"; exit 1; }
  timeout ${TEST_TIMEOUT:-360} python -m pytest -q -m gpu tests -k "not long_context" -p no:cacheprovider -W ignore \
      -rf 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
  timeout 90 python dev/host_profile.py > "$OUT/host_profile.txt" 2>&1
  wait $ex88
  echo "== tests"; grep -E "passed|failed" "$OUT/gpu_tests.txt" | tail -1
  echo "== host"; grep -E "^==" "$OUT/host_profile.txt"
  echo "== example 88"; tail -1 "$OUT/ex88_build.txt"
fi

if [ "$PART" = 2 ] || [ "$PART" = all ]; then
  timeout ${BENCH_TIMEOUT:-260} python -m blackwell_sparsek bench-bwd --no-head-groups --budget-s 190 \
      --out "$OUT" > "$OUT/bwd_bench_log.txt" 2>&1
  timeout ${BENCH_TIMEOUT:-170} python -m blackwell_sparsek.bench.short_rows --json "$OUT/short_rows.json" \
      > "$OUT/short_rows.txt" 2> "$OUT/short_rows_log.txt"
  timeout ${BENCH_TIMEOUT:-150} python dev/gemm_kernel_bench.py --quick --schedules \
      --json "$OUT/bsr_gemm_kernels.json" --txt "$OUT/bsr_gemm_kernels.txt" > "$OUT/gemm_bench_log.txt" 2>&1
  echo "== backward"; cat "$OUT/bwd_bench.md" 2>/dev/null | grep "^|" || tail -5 "$OUT/bwd_bench_log.txt"
  echo "== short rows"; cat "$OUT/short_rows.txt" 2>/dev/null; tail -3 "$OUT/short_rows_log.txt"
  echo "== GEMM kernels"; cat "$OUT/bsr_gemm_kernels.txt" 2>/dev/null || tail -5 "$OUT/gemm_bench_log.txt"
fi
