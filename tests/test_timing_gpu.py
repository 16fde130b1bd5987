"""GPU test of the bench timers (blackwell_sparsek.bench.timing) that only a GPU can exercise: CUDA-graph replay."""
import pytest
import torch

from blackwell_sparsek.bench import timing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_loop_bench_graph_replays_the_captured_calls():
    """graph=True times replays of n captured calls: the captured calls run (a counter the call bumps grows by n
    a replay), each timed loop is one replay, and the method says so."""
    a = torch.randn(2048, 2048, device="cuda")
    count = torch.zeros((), device="cuda")

    def fn():
        count.add_(1)
        return a @ a

    g = timing.loop_bench(fn, n=10, reps=3, graph=True)
    assert g.method == "graph10-cuda-events" and g.median_ms > 0
    before = count.item()
    timing.loop_bench(fn, n=10, reps=2, graph=True, idle_s=0.01)
    torch.cuda.synchronize()
    # warm-up before capture (3), the replay after it (10), then per rep one eager warm-up call and one replay
    assert count.item() - before == 3 + 10 + 2 * (1 + 10)
