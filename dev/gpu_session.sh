#!/usr/bin/env bash
# Set up a GPU machine that has no network, from the repo root: install the carried nvidia-cutlass wheel (.whl/)
# into /tmp/site, point the kernel cache at the carried .bskcache (kernels prebuilt on a CPU host with
# dev/prebuild.py), use a carried example-88 binary when there is one, print the GPU.
# Source it:  source dev/gpu_session.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD BSK_CACHE_DIR=$PWD/.bskcache PYTHONUNBUFFERED=1
if [ -x "$BSK_CACHE_DIR/ex88-prebuilt/88_hopper_fmha" ]; then export BSK_EX88_BIN=$BSK_CACHE_DIR/ex88-prebuilt/88_hopper_fmha; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv,noheader
