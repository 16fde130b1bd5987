"""Dev A/B of kernel variants built with different BSK_NVCC_FLAGS, in one process and alternating, so slow drifts
of the GPU's clock (power limit, temperature) fall on every variant alike.

    BSK_VARIANTS='base=-DBSK_X=0;new=' BSK_AB_CASES=topk25-d128,dense-d64 python scripts/exp_variants.py [rounds]
A variant given as tag=@DIR is the kernel found under cache directory DIR as it is (e.g. built from HEAD's tree).
Each variant (tag=flags; the flags as the build used them) is checked first against the float64 reference (2 heads,
4K; on one CTA per SM and on 3 persistent CTAs), then timed with do_bench (sustained, 300 ms warm-up) once per round, the variants' order rotating each round.
Prints every measurement and, last, the median per case and variant with its ratio to the first variant.
BSK_AB_SCHEDS picks the schedule (default: the layout's default).
"""
import os, statistics as st, sys
from pathlib import Path
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import blackwell_sparsek as bsk
import blackwell_sparsek.ops as ops
from blackwell_sparsek import cache
from blackwell_sparsek.reference import attention_reference, relative_error
from blackwell_sparsek.runtime import CompiledKernel
from _cases import CASES, effective_flops, inputs, persistent_ctas, spec_config

variants = [tuple(v.split("=", 1)) for v in os.environ["BSK_VARIANTS"].split(";") if v]
names = [k for k in CASES if k in os.environ.get("BSK_AB_CASES", ",".join(CASES)).split(",")]
scheds = os.environ.get("BSK_AB_SCHEDS", "").split(",")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
real_kernel_for = ops._kernel_for


def kernel(cfg, flags):
    if flags.startswith("@"):  # a kernel built from another tree: its entry under that cache directory, as is
        entry, = Path(flags[1:]).glob(f"{cfg.kernel_name}-*")  # the cache's entry_dir naming
        return CompiledKernel(entry / cache.SO_NAME, cfg, cache._read_meta(entry))
    before = os.environ.get("BSK_NVCC_FLAGS")
    os.environ["BSK_NVCC_FLAGS"] = flags
    try:
        return cache.build(cfg)
    finally:
        if before is None:
            os.environ.pop("BSK_NVCC_FLAGS", None)
        else:
            os.environ["BSK_NVCC_FLAGS"] = before


def run_with(k, fn):
    ops._kernel_for = lambda config_json: k
    try:
        return fn()
    finally:
        ops._kernel_for = real_kernel_for


print(torch.cuda.get_device_name(), flush=True)
cases = []
for name in names:
    for sched in scheds:
        spec = f"{name}:{sched}" if sched else name
        B, H, S, D, lay, q, k, v = inputs(name)
        cfg = spec_config(spec, D, lay)
        ks = {tag: kernel(cfg, flags) for tag, flags in variants}
        sb, sh, ss, sd, slay, sq, sk, sv = inputs(name, max_heads=2, max_seq=4096)
        ref = attention_reference(sq, sk, sv, slay)[0]
        for tag, kk in ks.items():
            for ctas in (None, 3):  # 3 persistent CTAs: each walks ~20 rows
                with persistent_ctas(ctas):
                    out = run_with(kk, lambda: bsk.sparse_attention(sq, sk, sv, slay, config=cfg))
                err = relative_error(out, ref)
                print(f"check {spec:22s} {tag:10s} ctas {ctas or 'all':3} rel err {err:.2e} "
                      f"{'OK' if err < 1e-2 else 'FAIL'}", flush=True)
        cases.append((spec, cfg, ks, effective_flops(B, H, D, lay), (q, k, v, lay)))

res = {}
for r in range(rounds):
    for spec, cfg, ks, flops, (q, k, v, lay) in cases:
        tags = list(ks)
        tags = tags[r % len(tags):] + tags[:r % len(tags)]
        for tag in tags:
            fn = lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)  # noqa: E731
            ms = run_with(ks[tag], lambda: do_bench(fn, warmup=300, rep=300, return_mode="median"))
            res.setdefault((spec, tag), []).append(flops / ms / 1e9)
            print(f"round {r} {spec:22s} {tag:10s} {flops / ms / 1e9:6.1f} TFLOPS", flush=True)
print("\nmedian over rounds (TFLOPS, ratio to the first variant)")
for spec, _, ks, _, _ in cases:
    base = st.median(res[(spec, variants[0][0])])
    print(f"{spec:22s} " + "  ".join(f"{tag} {st.median(res[(spec, tag)]):6.1f} ({st.median(res[(spec, tag)]) / base:.3f})"
                                       for tag in ks), flush=True)
