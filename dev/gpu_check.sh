#!/usr/bin/env bash
# Everything a release needs from a GPU machine without network, in one call, from the repo root (a copy carrying
# .whl/ with the nvidia-cutlass wheel):  OUT=<dir> [BSK_CACHE_TGZ=<tar.gz of a prebuilt cache>] bash dev/gpu_check.sh
# Builds every kernel the GPU tests and benches use (dev/prebuild.py, 16 nvcc in parallel), runs every GPU test of
# every family, then the benches that decide schedule defaults (GEMM schedule variants, split-KV). Logs and JSON go
# to $OUT; the test summary and the bench tables come last.
set -o pipefail
OUT=${OUT:-/tmp/bsk_gpu_check}; mkdir -p "$OUT"
source dev/gpu_session.sh
export BSK_CACHE_DIR=$PWD/.bskcache; mkdir -p -m 700 "$BSK_CACHE_DIR"
# kernels prebuilt on a CPU host (dev/prebuild.py), packed: the carried tree is size-limited and .so files pack 3x
if [ -n "$BSK_CACHE_TGZ" ]; then tar -xzf "$BSK_CACHE_TGZ" -C "$BSK_CACHE_DIR" || exit 1; fi
t0=$(date +%s)
python dev/prebuild.py -j 16 2>&1 | tail -3 | tee "$OUT/build.txt" || { echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.txt"
timeout ${TEST_TIMEOUT:-300} python -m pytest -q -m gpu tests -k "not long_context" -p no:cacheprovider -W ignore \
    -rf 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
timeout ${BENCH_TIMEOUT:-150} python dev/gemm_kernel_bench.py --quick --schedules --json "$OUT/bsr_gemm_kernels.json" \
    --txt "$OUT/bsr_gemm_kernels.txt" > "$OUT/gemm_bench_log.txt" 2>&1
timeout ${BENCH_TIMEOUT:-150} python -m blackwell_sparsek.bench.split_kv --json "$OUT/split_kv.json" \
    > "$OUT/split_kv.txt" 2>&1
echo "== tests"; grep -E "passed|failed" "$OUT/gpu_tests.txt" | tail -1
echo "== GEMM kernels"; cat "$OUT/bsr_gemm_kernels.txt" 2>/dev/null || tail -5 "$OUT/gemm_bench_log.txt"
echo "== split-KV"; tail -12 "$OUT/split_kv.txt"
