"""The acceptance shapes the dev scripts time: name -> (B, H, S, D, layout(S, H))."""
import blackwell_sparsek as bsk

L = bsk.BlockSparseLayout
CASES = {
    "dense-d128": (2, 16, 8192, 128, lambda S, H: L.dense(S)),
    "topk25-d128": (2, 16, 8192, 128, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    "causal-d128": (2, 16, 8192, 128, lambda S, H: L.causal(S)),
    "dense-d64": (1, 8, 8192, 64, lambda S, H: L.dense(S)),
    "topk25-d64": (1, 8, 8192, 64, lambda S, H: L.random_topk(S, k=16, seed=0, num_heads=H)),
    "win2K-d128": (1, 16, 32768, 128, lambda S, H: L.sliding_window(S, window=2048)),
    # dense over 2K keys: the work of a 16-block row without the gather (example 88 can run this shape too)
    "short2K-d128": (2, 16, 8192, 128, lambda S, H: L.dense(S, 2048)),
    "short2K-d64": (1, 8, 8192, 64, lambda S, H: L.dense(S, 2048)),
}
