"""CUDA-event timing shared by the peer scripts (attention_peer.py, moe_peer.py)."""
import torch


def time_ms(fn):
    """Milliseconds per call of fn: a warm-up, then the median of 3 runs of
    enough calls for ~0.1 s each (3 to 2000)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end)
    n = max(3, min(2000, int(100.0 / max(once, 1e-3))))
    runs = []
    for _ in range(3):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / n)
    return sorted(runs)[1]
