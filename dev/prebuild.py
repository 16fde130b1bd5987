"""Build, on a CPU host with nvcc, every kernel a GPU session runs (the GPU tests, bench --headline, compare-88),
into BSK_CACHE_DIR; carry that folder to a GPU machine without network (dev/gpu_session.sh points the cache there).

    BSK_CACHE_DIR=$PWD/.bskcache python dev/prebuild.py [-j N]

The configs are sparse_attention's own choices for the GPU tests' layouts (ops.default_config), plus every named
one; the package's `build` command compiles them (arguments after the script's name go to it). The cache key is
content-based (config, source, toolchain, flags), so the same wheel and nvcc on the GPU machine give cache hits.
"""
import sys
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek import cli
from blackwell_sparsek.families.attn_fwd import AttentionConfig, Schedule
from blackwell_sparsek.jit.spec import load_named_configs
from blackwell_sparsek.ops import default_config

L = bsk.BlockSparseLayout
cfgs = list(load_named_configs().values())  # every family
for d in (64, 128):  # test_other_block_sizes: top-k (balanced rows) and causal, per block shape
    for bm, bn in ((128, 64), (256, 128), (128, 256), (64, 128), (64, 64)):
        topk = L.random_topk(seq_q=777, seq_k=1300, k=3, seed=5, num_heads=2, block_m=bm, block_n=bn)
        causal = L.dense(seq_q=777, seq_k=1300, block_m=bm, block_n=bn).with_causal()
        cfgs += [default_config(d, torch.float16, topk), default_config(d, torch.float16, causal)]
for dt in (torch.float16, torch.bfloat16):  # test_head_dim_256
    lay = L.dense(seq_q=700, seq_k=900)
    cfgs += [default_config(256, dt, lay), default_config(256, dt, lay.with_causal())]
lay = L.dense(seq_q=300, seq_k=777)  # test_gqa_bshd_and_causal_rectangular
cfgs += [default_config(128, torch.bfloat16, lay, schedule=s) for s in Schedule]
for d in (64, 128):  # bench and compare-88: fp16 at both schedules
    cfgs += [default_config(d, torch.float16, L.dense(8192), schedule=s)
             for s in (Schedule.PINGPONG, Schedule.COOPERATIVE)]
sys.exit(cli.main(["build", *dict.fromkeys(c.to_json() for c in cfgs), *sys.argv[1:]]))
