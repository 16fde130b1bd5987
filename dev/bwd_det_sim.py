"""Model of the backward kernel's CTA timeline (dev): what the deterministic dQ turns cost, per turn order.

    python dev/bwd_det_sim.py

One CTA per SM (132), launched in grid order as SMs free up ((batch, head) after (batch, head), key blocks in
schedule order). Per CTA: a prologue P, then per 64-query tile an MMA step (T = 1) that needs a free dQ buffer
(2 buffers: tile i waits for the reduce of tile i - 2) and a reduce R (one in flight, in order), which in
deterministic mode also waits for the tile's counter to reach the CTA's turn; an epilogue E. Event-driven, so a CTA
may wait on one launched after it. Turn orders: 'key order' (each query block's own list, ascending key block, with
key blocks launched in ascending order: the kernel before det_ranks) and 'arrival' (attention_bwd_view.det_ranks, with
the heaviest-first schedule). A model for choosing what to measure, not a result.
"""
import collections
import heapq

import blackwell_sparsek as bsk
from blackwell_sparsek.ops.attention_bwd import transposed_view


def ctas_of(lay, heads, det, order):
    """Per CTA in launch order: [(tile key, turn)] in its column's order."""
    t_q, _, t_sched, t_rank = transposed_view(lay.col_idx, lay.block_kind, lay.row_schedule(), lay.n_kblocks,
                                              lay.seq_q, lay.block_m, deterministic=(order == "arrival"))
    out = []
    for x in range(heads):
        lh = 0 if lay.num_heads == 1 else x
        sched = t_sched[lh].tolist()
        if order == "key order":
            sched.sort()
        for kb, start, end, _ in sched:
            out.append([((x, 2 * q + i), rk) for q, rk in zip(t_q[lh, start:end].tolist(),
                                                               t_rank[lh, start:end].tolist()) for i in range(2)])
    return out


def simulate(ctas, det, T=1.0, R=0.5, P=3.0, E=3.0, sms=132):
    ev, seq, state = [], [0], {}
    counter, waiters = collections.Counter(), collections.defaultdict(list)

    def push(t, kind, c):
        seq[0] += 1
        heapq.heappush(ev, (t, seq[0], kind, c))

    def try_mma(c, t):
        s = state[c]
        k = s["k"]
        if k < len(ctas[c]) and not s["mma"] and (k < 2 or s["red_done"] >= k - 1):
            s["mma"] = True
            push(max(t, s["t0"]) + T, "mma", c)

    def try_red(c, t):
        s = state[c]
        m = s["m"]
        if m >= len(ctas[c]) or s["red"] or s["k"] <= m:
            return
        key, turn = ctas[c][m]
        if det and counter[key] != turn:
            waiters[key].append(c)
            return
        s["red"] = True
        push(t + R, "red", c)

    def start(c, t):
        state[c] = dict(k=0, m=0, mma=False, red=False, red_done=0, t0=t + P)
        if ctas[c]:
            try_mma(c, t + P)
        else:
            push(t + P + E, "fin", c)

    nxt, end = 0, 0.0
    while nxt < min(sms, len(ctas)):
        start(nxt, 0.0)
        nxt += 1
    while ev:
        t, _, kind, c = heapq.heappop(ev)
        s = state[c]
        if kind == "mma":
            s["k"] += 1
            s["mma"] = False
        elif kind == "red":
            key, _ = ctas[c][s["m"]]
            s["m"] += 1
            s["red_done"] = s["m"]
            s["red"] = False
            counter[key] += 1
            for w in waiters.pop(key, []):
                try_red(w, t)
            if s["m"] == len(ctas[c]):
                push(t + E, "fin", c)
        else:
            end = max(end, t)
            if nxt < len(ctas):
                start(nxt, t)
                nxt += 1
            continue
        try_mma(c, t)
        try_red(c, t)
    assert all(state[c]["m"] == len(ctas[c]) for c in state), "deadlock"
    return end


def main():
    print("layout                      det/fast: key order  arrival")
    for S, k in ((8192, 16), (8192, 8), (32768, 64)):
        lay = bsk.BlockSparseLayout.random_topk(seq_q=S, k=k, seed=0, num_heads=8)
        fast = simulate(ctas_of(lay, 8, False, "arrival"), False)
        old = simulate(ctas_of(lay, 8, True, "key order"), True)
        new = simulate(ctas_of(lay, 8, True, "arrival"), True)
        print(f"top-{k} of {S // 128} blocks, 8 heads {old / fast:21.3f} {new / fast:8.3f}")


if __name__ == "__main__":
    main()
