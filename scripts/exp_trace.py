"""Dev: per-row timeline of the two-warpgroup kernel (build with BSK_NVCC_FLAGS=-DBSK_TRACE; SM clock cycles).

    BSK_NVCC_FLAGS=-DBSK_TRACE python scripts/exp_trace.py topk25-d64 dense-d64 short2K-d64 topk25-d128
Medians over CTAs and rows (first and last row of each CTA left out) of: the row period, the wait for Q, the first
tile, the loop's cycles per tile, what follows the loop (tail, epilogue, next tile's lookup), the epilogue's phases
for both MMA warpgroups, and the producer; inside the loop, per tile and warpgroup, the QK wait, the softmax (and
the previous PV's wait) and the next QK's issue. Then the launch as a whole (globaltimer): CTA start spread, when CTAs end
against the last one (the partial last wave), and the SM clock (clock64 over globaltimer); a CTA's cycles: prologue,
its first row (cold loads) against the median row, and that row's phases. BSK_TRACE_WARM=N sets the
warm-up launches before the traced one (default 20; a few hundred to see the clock under sustained load).
"""
import ctypes, os, statistics as st, sys
import torch
import blackwell_sparsek as bsk
from blackwell_sparsek import cache
from _cases import inputs, spec_config
for spec in sys.argv[1:]:
    B, H, S, D, lay, q, k, v = inputs(spec.partition(":")[0])
    cfg = spec_config(spec, D, lay)
    lib = ctypes.CDLL(str(cache.ensure_built(cfg).so_path), mode=ctypes.RTLD_LOCAL)
    for _ in range(int(os.environ.get("BSK_TRACE_WARM", "20"))):
        bsk.sparse_attention(q, k, v, lay, config=cfg)
    torch.cuda.synchronize()
    assert lib.bsk_trace_reset() == 0
    bsk.sparse_attention(q, k, v, lay, config=cfg)
    torch.cuda.synchronize()
    span = (ctypes.c_longlong * (132 * 6))()
    assert lib.bsk_trace_span_dump(span) == 0
    sp = torch.tensor(list(span), dtype=torch.int64).view(132, 6)[:min(132, torch.cuda.get_device_properties(0)
                                                                      .multi_processor_count)]
    dims = (ctypes.c_int * 3)()
    buf = (ctypes.c_longlong * (132 * 64 * 16))()
    assert lib.bsk_trace_dump(buf, dims) == 0
    C, R, K = dims
    t = torch.tensor(list(buf[:C * R * K]), dtype=torch.int64).view(C, R, K)
    rows = [(c, r) for c in range(C) for r in range(1, R - 2) if t[c, r + 1, 0] > 0 and t[c, r, 3] > 0
            and t[c, r + 1, 15] > 0]
    med = lambda f: st.median(f(c, r) for c, r in rows) if rows else float("nan")  # noqa
    ntile = lay.nnz // (lay.num_heads * lay.n_qblocks)  # tiles per row (128x128 blocks)
    period = med(lambda c, r: int(t[c, r + 1, 0] - t[c, r, 0]))
    loop = med(lambda c, r: int(t[c, r, 3] - t[c, r, 2]))
    print(f"{spec:14s} {cfg.kernel_name[:48]} rows={len(rows)} tiles/row={ntile}\n"
          f"  period {period:8.0f}  qwait {med(lambda c, r: int(t[c, r, 1] - t[c, r, 0])):7.0f}  "
          f"first {med(lambda c, r: int(t[c, r, 2] - t[c, r, 1])):7.0f}  loop {loop:8.0f} "
          f"({loop / max(ntile - 1, 1):6.0f}/tile)  after {med(lambda c, r: int(t[c, r + 1, 0] - t[c, r, 3])):7.0f}\n"
          f"  wg1: entry-wg0 {med(lambda c, r: int(t[c, r, 4] - t[c, r, 0])):6.0f}  done-wg0 "
          f"{med(lambda c, r: int(t[c, r, 5] - t[c, r, 3])):6.0f}   producer: row start-wg0 entry "
          f"{med(lambda c, r: int(t[c, r, 6] - t[c, r, 0])):8.0f}  first K issued-row start "
          f"{med(lambda c, r: int(t[c, r, 7] - t[c, r, 6])):6.0f}\n"
          f"  wg0: entry->row_ptr {med(lambda c, r: int(t[c, r, 9] - t[c, r, 0])):6.0f}  ->col chunk "
          f"{med(lambda c, r: int(t[c, r, 10] - t[c, r, 9])):6.0f}  loop end->tail done "
          f"{med(lambda c, r: int(t[c, r, 8] - t[c, r, 3])):6.0f}  tail done->next entry (epilogue, scheduler) "
          f"{med(lambda c, r: int(t[c, r + 1, 0] - t[c, r, 8])):6.0f}\n"
          f"  epilogue (its stamps land in the next row's entry): wg0 tail done->start "
          f"{med(lambda c, r: int(t[c, r + 1, 11] - t[c, r, 8])):6.0f}  start->buffer free "
          f"{med(lambda c, r: int(t[c, r + 1, 12] - t[c, r + 1, 11])):6.0f}  ->store issued "
          f"{med(lambda c, r: int(t[c, r + 1, 13] - t[c, r + 1, 12])):6.0f}  ->next entry "
          f"{med(lambda c, r: int(t[c, r + 1, 0] - t[c, r + 1, 13])):6.0f}\n"
          f"  wg1: loop end->epilogue start {med(lambda c, r: int(t[c, r + 1, 14] - t[c, r, 5])):6.0f}  "
          f"start-wg0 epilogue end {med(lambda c, r: int(t[c, r + 1, 14] - t[c, r + 1, 13])):6.0f}  "
          f"epilogue {med(lambda c, r: int(t[c, r + 1, 15] - t[c, r + 1, 14])):6.0f}  "
          f"end->next entry {med(lambda c, r: int(t[c, r + 1, 4] - t[c, r + 1, 15])):6.0f}", flush=True)
    # Launch outside the rows: CTA start spread, each CTA's end (later of its two MMA warpgroups) against the last
    # one, SM clock from clock64 over globaltimer.
    start, end = sp[:, 0], torch.maximum(sp[:, 2], sp[:, 4])
    mhz = ((torch.maximum(sp[:, 3], sp[:, 5]) - sp[:, 1]).double() / (end - start).double() * 1e3).median().item()
    t0 = start.min()
    print(f"  launch: CTAs start..last end "
          f"{(end.max() - t0).item() / 1e3:7.1f} us  start spread {(start.max() - t0).item() / 1e3:5.2f} us  "
          f"end min/median/max {(end.min() - t0).item() / 1e3:6.1f} / {(end.median() - t0).item() / 1e3:6.1f} / "
          f"{(end.max() - t0).item() / 1e3:6.1f} us  (idle after own end: {((end.max() - end).double().mean() / (end.max() - t0).double()).item() * 100:4.1f} %)  "
          f"SM clock {mhz:5.0f} MHz", flush=True)
    # Where a CTA's cycles go: start -> first row's entry, the first row (cold K/V, both warpgroups starting
    # together) against the median row, the rest; medians over CTAs.
    cyc = (torch.maximum(sp[:, 3], sp[:, 5]) - sp[:, 1])[:C].double()
    ramp = (t[:, 0, 0] - sp[:C, 1]).double()
    first_row = (t[:, 1, 0] - t[:, 0, 0]).double()
    nrows = (t[:, :, 0] > 0).sum(1).double()  # rows stamped (at most kTraceRows = 24)
    print(f"  CTA cycles {cyc.median().item():8.0f}: start->row 0 entry {ramp.median().item():6.0f}  row 0 "
          f"{first_row.median().item():7.0f} (median row {period:7.0f})  rows {nrows.median().item():4.1f} x period = "
          f"{(nrows * period).median().item():8.0f}", flush=True)
    m0 = lambda a, b: (t[:, 0, b] - t[:, 0, a]).double().median().item()  # noqa: row 0's phases
    print(f"  row 0: qwait {m0(0, 1):6.0f}  first {m0(1, 2):6.0f}  loop {m0(2, 3):8.0f} "
          f"({m0(2, 3) / max(ntile - 1, 1):6.0f}/tile)  entry->row_ptr {m0(0, 9):6.0f}  ->col chunk {m0(9, 10):6.0f}  "
          f"wg1 entry-wg0 {m0(0, 4):6.0f}  after {(t[:, 1, 0] - t[:, 0, 3]).double().median().item():6.0f}",
          flush=True)
    # Persistent CTAs: c takes tiles c, c + grid, ...; among the CTAs with the most rows, how their ends spread
    # (rows alike, so the spread is the CTAs' speed, which a static schedule cannot even out).
    grid = sp.shape[0]
    tiles = B * H * lay.n_qblocks
    if cfg.schedule.value == "pingpong" and tiles > grid:
        nrow = torch.tensor([len(range(c, tiles, grid)) for c in range(grid)])
        e = ((end - t0)[nrow == nrow.max()].double() / 1e3).sort().values
        qs = [e[int(f * (len(e) - 1))].item() for f in (0.0, 0.1, 0.5, 0.9, 1.0)]
        print(f"  CTAs with {int(nrow.max())} rows ({len(e)}): end min/p10/median/p90/max "
              + " / ".join(f"{x:6.1f}" for x in qs) + " us", flush=True)
    # Inside the loop (the CTA's second row, tiles 2 .. n-2), per MMA warpgroup: QK_j issued -> QK_j done (the
    # previous tile's PV is issued in between and may still run), -> softmax done and P written (after waiting for
    # that PV), -> next QK issued (K wait); warpgroup 1's QK issue after warpgroup 0's.
    lb = (ctypes.c_longlong * (132 * 2 * 64 * 3))()
    assert lib.bsk_trace_loop_dump(lb) == 0
    L = torch.tensor(list(lb), dtype=torch.int64).view(132, 2, 64, 3)[:C]
    n = min(ntile, 64)
    if n > 5:
        j = slice(2, n - 2)
        jn = slice(3, n - 1)
        ok = (L[:, :, 2:n - 1, 0] > 0).all(-1).all(-1)
        Lk = L[ok]
        md = lambda x: x.double().median().item()  # noqa
        for w in range(2):
            print(f"  loop wg{w}: gemm {md(Lk[:, w, j, 1] - Lk[:, w, j, 0]):6.0f}  softmax "
                  f"{md(Lk[:, w, j, 2] - Lk[:, w, j, 1]):6.0f}  ->next QK {md(Lk[:, w, jn, 0] - Lk[:, w, j, 2]):6.0f}"
                  f"  period {md(Lk[:, w, jn, 0] - Lk[:, w, j, 0]):6.0f}", end="")
        print(f"  | wg1-wg0 QK issue {md(Lk[:, 1, j, 0] - Lk[:, 0, j, 0]):6.0f}  ctas {int(ok.sum())}", flush=True)
