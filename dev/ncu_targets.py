"""One workload per call for Nsight Compute, and a summary of its per-instruction stall samples.

    ncu --kernel-name-base demangled -k regex:attn_fwd --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters ... -o REP \
        python dev/ncu_targets.py NAME
    ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv; python dev/ncu_targets.py stalls REP.csv

Each NAME runs its op five times on fresh random inputs (the first builds or loads the kernel); ``stalls`` prints
the stall reasons' shares and the instructions with the most samples. ``dev/ncu_lines.py`` sums a source-counter CSV by
line of our code (on a ``BSK_LINEINFO=1`` build). Runs and findings: bench/results/h100/ncu/.

  short64   forward, (1, 16, 32768, 64) fp16, random top-k with 2 blocks per row (issue 29's worst short-row case),
            the default schedule; ``short64single``: the single-warpgroup schedule (example 88's best kernel there,
            "tma 64x128x64", has the same tile and one warpgroup); example 88 on the same work is
            ``88_hopper_fmha --b=1 --h=16 --q=32768 --k=256 --d=64``; ``short64same`` / ``short64singlesame``:
            the same kernels on rows that all list blocks 0 and 1 (example 88's traffic: the kernels compared on
            identical memory behaviour)
  dsd       bsr_matmul, 8192^3 fp16, 128x128 blocks, 16 per block row (issue 27's headline); ``cublas``: torch.mm
            of the same work (8192x2048 . 2048x8192 fp16), the peer; ``dsd_strip1`` / ``dsd_strip32``: the DSD
            kernel with every N-strip 1 / 32 tiles wide (A's rows re-read per strip, B's strip kept in L2 or not)
  bwd       the attention backward op, (2, 16, 8192, 128) fp16, 25 % random top-k (issue 26's headline)
  blocks64  forward, (2, 16, 8192, 128) bf16, 64x64 blocks, 25 % random per head, the dual schedule (issue 29);
            ``blocks64d64``: the same at D=64 (the three-stream dual kernel); ``topk128``: 128x128 blocks, 16 a row
            (the headline layout, ping-pong), for contrast
  global2   forward, (1, 16, 32768, 128) bf16, 2 global rows and columns + band + 3 random blocks a row (issue 29's
            rows of mixed length), split-KV, the default schedule; ``global2pp``: split ping-pong; ``global2cut``:
            the same layout without its global rows (ping-pong, no split)
  regions CSV  the stall samples of a source-page CSV by straight-line code region (a hot loop, an unrolled
            epilogue, ...): where a long unrolled stretch holds many samples spread thin over its instructions
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import blackwell_sparsek as bsk  # noqa: E402

L = bsk.BlockSparseLayout


def short64(schedule=None, same=False):
    if same:  # every row lists blocks 0 and 1: example 88's traffic (K/V in L2), the same kernel and work
        lay = L.from_bsr(torch.arange(257) * 2, torch.arange(2).repeat(256), 32768, 32768).to("cuda")
    else:
        lay = L.random_topk(32768, 2, seed=2, num_heads=16).to("cuda")
    q, k, v = (torch.randn(1, 16, 32768, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    from blackwell_sparsek.ops import default_config
    cfg = default_config(64, torch.float16, lay, schedule=schedule)
    return lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)


def dsd(strip: int = 0):
    mask = torch.zeros(64, 64, dtype=torch.bool)
    for r in range(64):
        mask[r, torch.randperm(64)[:16]] = True
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    a = bsk.BlockSparseMatrix.from_dense(w, block=128, mask=mask.cuda())
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    if not strip:
        return lambda: bsk.bsr_matmul(a, b)
    from blackwell_sparsek.ops import _gemm_cuda
    out = torch.empty(8192, 8192, device="cuda", dtype=torch.float16)
    return lambda: _gemm_cuda.dsd(a.values, a.layout, b, out, strip=strip)


def cublas():
    a = torch.randn(8192, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 8192, device="cuda", dtype=torch.float16)
    return lambda: torch.mm(a, b)


def bwd():
    from blackwell_sparsek.bench.backward import BwdCall
    return BwdCall(L.random_topk(seq_q=8192, k=16, seed=0, num_heads=16), 2, 16, 8192, 128, torch.float16)


def blocks64(d=128, block=64):
    """25 % random blocks per head (block x block), 2x16x8192, bf16, the default schedule."""
    lay = L.random_topk(8192, 8192 // block // 4, seed=1, block_m=block, block_n=block, num_heads=16).to("cuda")
    q, k, v = (torch.randn(2, 16, 8192, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return lambda: bsk.sparse_attention(q, k, v, lay)


def regions(path: str, min_share: float = 0.5) -> None:
    """Consecutive instructions grouped by how often they ran (hot: > 1/4 of the most-run instruction's count,
    warm: ran at all, cold: never), with each group's share of the stall samples and its top reasons."""
    import collections
    import csv
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], rows[2:]
    ia, ie = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    tot = sum(int(r[ia] or 0) for r in data) or 1
    top = max(int(r[ie] or 0) for r in data) or 1
    groups: list[list] = []
    for r in data:
        ex = int(r[ie] or 0)
        kind = "hot" if ex > top // 4 else "warm" if ex else "cold"
        if not groups or groups[-1][0] != kind:
            groups.append([kind, r[0], []])
        groups[-1][2].append(r)
    for kind, start, rs in groups:
        n = sum(int(r[ia] or 0) for r in rs)
        if 100 * n / tot < min_share:
            continue
        why = collections.Counter({hdr[i][6:]: sum(int(r[i] or 0) for r in rs) for i in cols}).most_common(3)
        print(f"{kind:4s} {start[-6:]} {len(rs):5d} instructions, max run {max(int(r[ie] or 0) for r in rs):9d}: "
              f"{100 * n / tot:5.1f} % of samples {[(k, round(100 * v / max(n, 1))) for k, v in why]}")


def stalls(path: str, top: int = 12) -> None:
    import collections
    import csv
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], rows[2:]
    ia = hdr.index("Warp Stall Sampling (All Samples)")
    cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    tot = sum(int(r[ia] or 0) for r in data)
    agg = collections.Counter({hdr[i]: sum(int(r[i] or 0) for r in data) for i in cols})
    print("total samples", tot)
    print("by reason:", [(k, round(100 * v / tot, 1)) for k, v in agg.most_common(8)])
    for r in sorted(data, key=lambda r: -int(r[ia] or 0))[:top]:
        why = sorted(((int(r[i] or 0), hdr[i][6:]) for i in cols), reverse=True)[:2]
        print(f"{100 * int(r[ia]) / tot:5.1f}%  {r[0][-5:]}  {r[1].strip()[:70]:70s} {why}")


def global2(schedule=None, cut=False):
    from blackwell_sparsek.bench.split_kv import global_layout
    from blackwell_sparsek.ops import default_config
    lay = global_layout(32768, mask="global2-cut" if cut else "global2")
    q, k, v = (torch.randn(1, 16, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = default_config(128, torch.bfloat16, lay, schedule=schedule)
    return lambda: bsk.sparse_attention(q, k, v, lay, config=cfg)


def main() -> None:
    if sys.argv[1] in ("stalls", "regions"):
        (stalls if sys.argv[1] == "stalls" else regions)(sys.argv[2])
        return
    fn = {"short64": short64, "short64single": lambda: short64("single"),
          "short64same": lambda: short64(same=True), "short64singlesame": lambda: short64("single", same=True),
          "dsd": dsd, "dsd_strip1": lambda: dsd(1), "dsd_strip32": lambda: dsd(32), "cublas": cublas, "bwd": bwd,
          "blocks64": blocks64, "blocks64d64": lambda: blocks64(64), "topk128": lambda: blocks64(block=128),
          "global2": global2, "global2pp": lambda: global2("pingpong"),
          "global2cut": lambda: global2(cut=True)}[sys.argv[1]]()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
