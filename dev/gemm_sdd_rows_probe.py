"""Why SDD's tiles of two blocks ran ~12 % slower on bench gemm's layout (rows of 7..24 blocks) than on 16 blocks
in every row: the same kernel (config_for's) and operands on layouts that separate the suspects (row lengths, odd
rows' partner slots, the items' count against the 132 persistent CTAs), 8192^3 fp16, 25 % of the 128-blocks.

    python dev/gemm_sdd_rows_probe.py
"""
import torch

import blackwell_sparsek as bsk
from blackwell_sparsek.bench.gemm import _mask
from blackwell_sparsek.bench.timing import bench
from blackwell_sparsek.ops import _gemm_cuda as g

L = bsk.BlockSparseLayout
S, NB = 8192, 64


def from_rows(counts, gen):
    """Rows of the given block counts at uniformly random columns."""
    mask = torch.zeros(NB, NB, dtype=torch.bool, device="cuda")
    for r, c in enumerate(counts):
        mask[r, torch.randperm(NB, device="cuda", generator=gen)[:int(c)]] = True
    return mask


def main():
    print(f"GPU: {torch.cuda.get_device_name()}")
    gen = torch.Generator(device="cuda").manual_seed(5)
    rand = _mask(NB, NB, 0.25, gen)
    counts = rand.sum(1)
    even = counts - counts % 2  # the random rows with an odd row's last block dropped: no partner slots
    layouts = {
        "16 a row (random_topk)": L.random_topk(S, 16, seed=1, block_m=128, block_n=128, device="cuda"),
        "16 a row (random columns)": L.from_block_mask(from_rows([16] * NB, gen), S, S, 128, 128),
        "random rows (7..24 a row)": L.from_block_mask(rand, S, S, 128, 128),
        "bench gemm's layout": L.from_block_mask(_mask(NB, NB, 0.25, torch.Generator(device="cuda").manual_seed(
            S + 7 * S + 13 * S + 128 + 250)), S, S, 128, 128),
        "same rows, even counts": L.from_block_mask(from_rows(even.tolist(), gen), S, S, 128, 128),
        "rows of 8 and 24 alternating": L.from_block_mask(from_rows([8, 24] * (NB // 2), gen), S, S, 128, 128),
        "rows of 8 and 24, long rows first": L.from_block_mask(from_rows([24] * (NB // 2) + [8] * (NB // 2), gen),
                                                               S, S, 128, 128),
    }
    x = torch.randn(S, S, device="cuda", dtype=torch.float16)
    b = torch.randn(S, S, device="cuda", dtype=torch.float16)
    for rnd in range(2):
        for name, lay in layouts.items():
            vals = torch.empty(lay.nnz, 128, 128, device="cuda", dtype=torch.float16)
            t = bench(lambda: g.sdd(x, b, lay, vals)).median_ms
            cnt = (lay.row_ptr[0, 1:] - lay.row_ptr[0, :-1]).long()
            items = int(((cnt + 1) // 2).sum())  # tiles of two blocks (an odd row's last block with a partner slot)
            print(f"  round {rnd} {name:36s} nnz {lay.nnz:5d} pair items {items} ({items / 132:.2f} waves)  "
                  f"{t * 1e3:6.1f} us "
                  f"{2.0 * lay.nnz * 128 * 128 * S / t / 1e9:6.1f} TF", flush=True)


if __name__ == "__main__":
    main()
