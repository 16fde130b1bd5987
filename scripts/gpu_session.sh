#!/usr/bin/env bash
# Set up a bare GPU machine (device tool) from the repo root: install the carried nvidia-cutlass wheel into
# /tmp/site, point the kernel cache at the carried .bskcache (kernels prebuilt on the build host), print the GPU.
# Source it:  source scripts/gpu_session.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD BSK_CACHE_DIR=$PWD/.bskcache PYTHONUNBUFFERED=1
if [ -x "$BSK_CACHE_DIR/ex88-prebuilt/88_hopper_fmha" ]; then export BSK_EX88_BIN=$BSK_CACHE_DIR/ex88-prebuilt/88_hopper_fmha; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv,noheader
