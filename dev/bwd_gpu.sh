#!/usr/bin/env bash
# The attention backward on a GPU machine without network, from a copy of the repo:
#   WHL=<dir with the nvidia-cutlass wheel> bash dev/bwd_gpu.sh [quick]
# Installs the wheel into /tmp/site, builds the backward kernels and the forward kernels its tests use (16 parallel
# nvcc; a carried .bskcache/ of kernels prebuilt on a CPU host gives cache hits when the toolchain matches), runs
# dev/bwd_smoke.py (stops on a hang), tests/test_attn_bwd_gpu.py and `bench-bwd`; the benchmark table comes
# last. With OUT set, the JSON and the pytest report land there.
set -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHL"/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$root PYTHONUNBUFFERED=1 BSK_CACHE_DIR=${BSK_CACHE_DIR:-/tmp/bskcache}
mkdir -p "$BSK_CACHE_DIR" && chmod 700 "$BSK_CACHE_DIR"
[ -d .bskcache ] && cp -a .bskcache/. "$BSK_CACHE_DIR"/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
names=$(python3 - <<'PY'
from blackwell_sparsek.jit.spec import load_named_configs
print(" ".join(n for n, c in load_named_configs().items() if c.family == "attn_bwd" or (
    c.family == "attn_fwd" and (c.block_m, c.block_n) == (128, 128) and c.schedule.value != "single")))
PY
)
t0=$(date +%s)
python3 -m blackwell_sparsek build $names -j 16 || exit 1
echo "build: $(( $(date +%s) - t0 )) s"
timeout 90 python3 dev/bwd_smoke.py || { echo "SMOKE FAILED (error or hang): stopping"; exit 1; }
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -rf -p no:cacheprovider tests/test_attn_bwd_gpu.py \
    ${OUT:+--junitxml=$OUT/bwd_tests.xml} 2>&1 | tail -60
timeout ${BENCH_TIMEOUT:-300} python3 -m blackwell_sparsek bench-bwd ${1:+--quick} --out "${OUT:-/tmp}" $BENCH_ARGS
