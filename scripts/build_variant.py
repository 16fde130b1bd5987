"""Dev helper: build derived / varied configs into the cache ahead of a GPU run (carry .bskcache).

    python scripts/build_variant.py d256-fp16-cooperative d64-fp16-single:6 d64-fp16-single@64x64 ...
Spec: d<head_dim>-<dtype>-<schedule>[:<stages>][@<block_m>x<block_n>], resolved like sparse_attention's default
config for a layout with those blocks (128x128 unless given).
"""
import dataclasses, sys
from concurrent.futures import ThreadPoolExecutor
from blackwell_sparsek import cache
from blackwell_sparsek.config import DType, Schedule
from blackwell_sparsek.ops import _derived_config, default_config

cfgs = []
for spec in sys.argv[1:]:
    spec, _, blocks = spec.partition("@")
    body, _, st = spec.partition(":")
    d, dt, sched = body.split("-")
    bm, bn = (int(x) for x in (blocks or "128x128").split("x"))
    cfg = default_config(int(d[1:]), DType(dt), schedule=Schedule(sched))
    cfg = _derived_config(cfg.head_dim, cfg.dtype, bm, bn, cfg.schedule)
    if st:
        cfg = dataclasses.replace(cfg, stages=int(st))
    cfgs.append(cfg.validate())
cfgs = list(dict.fromkeys(cfgs))
with ThreadPoolExecutor(2) as ex:
    for c, e in zip(cfgs, ex.map(cache.ensure_built, cfgs)):
        print(c.kernel_name, "->", e.path)
