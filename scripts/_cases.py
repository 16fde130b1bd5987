"""The acceptance shapes the dev scripts time: name -> (B, H, S, D, layout(S, H)), and their shared helpers."""
import contextlib
import subprocess
import blackwell_sparsek as bsk

L = bsk.BlockSparseLayout
CASES = {
    "dense-d128": (2, 16, 8192, 128, lambda S, H: L.dense(S)),
    "topk25-d128": (2, 16, 8192, 128, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    "causal-d128": (2, 16, 8192, 128, lambda S, H: L.causal(S)),
    "dense-d64": (1, 8, 8192, 64, lambda S, H: L.dense(S)),
    "topk25-d64": (1, 8, 8192, 64, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    "win2K-d128": (1, 16, 32768, 128, lambda S, H: L.sliding_window(S, window=2048)),
    "causal-d64": (1, 8, 8192, 64, lambda S, H: L.causal(S)),
    # short causal rows over many heads (compare-88's 16x16x1024 shape): every head's K/V together outgrow L2
    "causal1K-d128": (16, 16, 1024, 128, lambda S, H: L.causal(S)),
    # dense over 2K keys: the work of a 16-block row without the gather (example 88 can run this shape too)
    "short2K-d128": (2, 16, 8192, 128, lambda S, H: L.dense(S, 2048)),
    "short2K-d64": (1, 8, 8192, 64, lambda S, H: L.dense(S, 2048)),
}


def inputs(name, *, max_heads=None, max_seq=None):
    """(B, H, S, D, layout on the GPU, q, k, v) of a case: fresh fp16 inputs; heads / length optionally capped."""
    import torch
    B, H, S, D, mk = CASES[name]
    H, S = min(H, max_heads or H), min(S, max_seq or S)
    lay = mk(S, H).to("cuda")
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, H, lay.seq_k, D, device="cuda", dtype=torch.float16) for _ in range(2))
    return B, H, S, D, lay, q, k, v


def spec_config(spec, D, lay):
    """'name[:schedule]' -> sparse_attention's default config for the layout (that schedule when given)."""
    import torch
    from blackwell_sparsek.config import Schedule
    from blackwell_sparsek.ops import default_config
    sched = spec.partition(":")[2]
    return default_config(D, torch.float16, lay, schedule=Schedule(sched) if sched else None)


@contextlib.contextmanager
def persistent_ctas(n):
    """Persistent kernels launched on ``n`` CTAs inside the block (None: one per SM, the default), so that with a
    small ``n`` every CTA walks many rows."""
    import blackwell_sparsek.ops as ops
    real = ops._sm_count
    if n:
        ops._sm_count = lambda index: n
    try:
        yield
    finally:
        ops._sm_count = real


def graph_ms(fn, calls=1):
    """Milliseconds per call of ``fn`` replayed from a CUDA graph of ``calls`` calls (do_bench median): the kernel
    time without the host path."""
    import torch
    from triton.testing import do_bench
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return do_bench(g.replay, warmup=50, rep=300, return_mode="median") / calls


def effective_flops(B, H, D, lay):
    """4 * B * H * D * (listed blocks * block_m * block_n), per-head or shared layout: the bench's count."""
    from blackwell_sparsek.bench import metrics
    pairs = metrics.block_pairs_total(lay.nnz, lay.num_heads, B, H)
    return metrics.effective_flops(pairs, lay.block_m, lay.block_n, D)


@contextlib.contextmanager
def smi_samples(fields, every_ms=50):
    """nvidia-smi's ``--query-gpu=<fields>`` every ``every_ms`` while the block runs: yields a list that holds the
    samples (one list of floats per sample, in field order) once the block has ended."""
    rows = []
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                            "-lms", str(every_ms)], stdout=subprocess.PIPE, text=True)
    try:
        yield rows
    finally:
        smi.terminate()
        rows += [[float(x) for x in line.split(",")] for line in smi.communicate()[0].strip().splitlines()
                 if line.count(",") == len(fields) - 1]
