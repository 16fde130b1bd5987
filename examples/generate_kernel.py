#!/usr/bin/env python
"""Generate and build one kernel from a config: prints its name, the .cu source, the built .so and the build time.

    python examples/generate_kernel.py                                  # bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s5_b128x128
    python examples/generate_kernel.py bsk_sm90a_attn_fwd_d64_bf16_t128x128_pp_s8_b128x128
    python examples/generate_kernel.py '{"family": "attn_fwd", "head_dim": 128, "stages": 3}' --out /tmp/k

Needs nvcc and the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0), not a GPU. The build goes to the kernel
cache ($BSK_CACHE_DIR or ~/.cache/blackwell_sparsek; its entry keeps the kernel.cu it compiled); a second run is a
cache hit. The .cu is written elsewhere only with --out. Exit 0 = built (or skipped because no toolchain is
installed), 1 = the config, the output path or the compile failed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="bsk_sm90a_attn_fwd_d128_fp16_t128x128_coop_s5_b128x128",
                    help="named config, inline JSON or a .json file (default: %(default)s)")
    ap.add_argument("--out", default=None,
                    help="directory for a copy of the generated .cu (default: none; the cache entry keeps one)")
    a = ap.parse_args()

    import blackwell_sparsek as bsk
    from blackwell_sparsek.jit.spec import resolve_config
    from blackwell_sparsek.errors import BskError, InvalidConfigError, KernelCompileError, ToolchainError

    try:
        cfg = resolve_config(a.config)
    except InvalidConfigError as e:
        print(f"FAIL: invalid config: {e}")
        return 1
    print(f"config       : {cfg.to_json()}")
    print(f"kernel name  : {cfg.kernel_name}")
    try:
        if a.out:
            cu = bsk.generate(cfg, Path(a.out) / f"{cfg.kernel_name}.cu")
            print(f"generated .cu: {cu} ({Path(cu).stat().st_size} bytes)")
        else:
            print(f"generated .cu: {len(bsk.render(cfg))} characters (--out DIR writes a copy)")
    except BskError as e:
        print(f"FAIL: {e}")
        return 1

    from blackwell_sparsek.jit.kernels import ensure_built
    t0 = time.monotonic()
    try:
        entry = ensure_built(cfg, progress=True)
    except ToolchainError as e:
        print(f"SKIP build: no usable CUDA toolchain here ({e})")
        return 0
    except KernelCompileError as e:
        print(f"FAIL: nvcc failed:\n{e}")
        return 1
    except BskError as e:
        print(f"FAIL: {e}")
        return 1
    dt = time.monotonic() - t0
    print(f"built .so    : {entry.so_path} ({entry.so_path.stat().st_size} bytes)")
    print(f"build time   : {dt:.2f} s ({'compiled now' if entry.built else 'cache hit'})")
    print(f"cache entry  : {entry.path} (meta.json, kernel.cu, nvcc log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
