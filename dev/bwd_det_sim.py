"""Model of the backward kernel's CTA timeline (dev): how much the deterministic dQ turns cost, per tile order.

    python dev/bwd_det_sim.py

One CTA per SM (132), launched in grid order as SMs free up. Per CTA: a prologue, then per 64-query tile an MMA
step (T = 1) that needs a free dQ buffer (2 buffers: tile i waits for the reduce of tile i - 2), a reduce
(R, one in flight), in deterministic mode only after the tile's previous contributor's reduce completed (ascending
key block = launch order, so a CTA's waits are on earlier CTAs and CTAs can be timed in launch order), an
epilogue. Prints the modelled total per (mode, head group). A model for choosing what to measure, not a result.
"""
import heapq
import math

import blackwell_sparsek as bsk


def simulate(cols_per_head, nq_tiles, B, H, group, det, T=1.0, R=0.6, P=3.0, E=3.0, sms=132, order="asc"):
    # tile order of the grid: group of (b, h)s, then key block (ascending or heaviest first), then head in group
    bh = B * H
    nk = len(cols_per_head[0])
    ctas = []
    for g0 in range(0, bh, group):
        heads = list(range(g0, g0 + group))
        orders = {}
        for x in heads:
            c = cols_per_head[x % len(cols_per_head)]
            ks = list(range(nk)) if order == "asc" else sorted(range(nk), key=lambda j: -len(c[j]))
            orders[x] = ks
        for r in range(nk):
            for x in heads:
                ctas.append((x, orders[x][r]))
    free = [0.0] * sms
    heapq.heapify(free)
    turn_done = {}  # (bh, q tile) -> time the last reduce on it completed (det: the previous rank's)
    end = 0.0
    for x, j in ctas:
        start = heapq.heappop(free)
        tiles = [q * 2 + t for q in cols_per_head[x % len(cols_per_head)][j] for t in range(2)]
        mma = [0.0] * len(tiles)
        red = [0.0] * len(tiles)
        t = start + P
        for i, qt in enumerate(tiles):
            ready = max(t, red[i - 2] if i >= 2 else 0.0)
            mma[i] = ready + T
            t = mma[i]
            rs = max(mma[i], red[i - 1] if i else 0.0)
            if det:
                rs = max(rs, turn_done.get((x, qt), 0.0))
            red[i] = rs + R
            if det:
                turn_done[(x, qt)] = red[i]
        fin = (max(mma[-1], red[-1]) if tiles else t) + E
        end = max(end, fin)
        heapq.heappush(free, fin)
    return end


def columns(layout):
    nk = layout.num_kblocks if hasattr(layout, "num_kblocks") else None
    out = []
    for h in range(layout.num_heads):
        rows = layout.rows(h) if hasattr(layout, "rows") else None
        out.append(rows)
    return out


def main():
    S, B, H = 8192, 2, 16
    lay = bsk.BlockSparseLayout.random_topk(seq_q=S, k=16, seed=0, num_heads=16)
    nq = S // 128
    ci = lay.col_idx.tolist()
    rs = lay.row_schedule().tolist()
    cols = []
    for h in range(lay.num_heads):
        c = [[] for _ in range(nq)]
        for row, s, e, _ in rs[h]:
            for p in range(s, e):
                c[ci[h][p]].append(row)
        cols.append([sorted(x) for x in c])
    print("group  mode        model time   det/fast")
    for group in (1, 2, 4, 8, 16, 32):
        fast = simulate(cols, nq * 2, B, H, group, False)
        fast_h = simulate(cols, nq * 2, B, H, group, False, order="heavy")
        det = simulate(cols, nq * 2, B, H, group, True)
        print(f"{group:5d}  fast(asc) {fast:10.0f}  fast(heavy) {fast_h:8.0f}  det {det:8.0f}  {det / fast_h:6.3f}")


if __name__ == "__main__":
    main()
