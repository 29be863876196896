"""Request latency with many idle sessions resident (issue 18, item 3:
the engine publishes sessions incrementally): starts kvc-server (the binary
given), times 40 sequential 8-token requests alone, creates N sessions (32
requests at a time), times them again.

    python3 scripts/session_publish_bench.py target/debug/kvc-server 22000
"""
import time, httpx, sys, statistics, concurrent.futures as cf
import kvc_local
bin = sys.argv[1]; N = int(sys.argv[2])
p, url = kvc_local.start(bin, "--max-num-seqs", "256")
c = httpx.Client(timeout=120)
def probe(k=40):
    ts = []
    for i in range(k):
        t = time.perf_counter()
        r = c.post(url + "/v1/completions", json={"prompt": [5, 6, 7, i], "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)
base = probe()
def mk(i):
    with httpx.Client(timeout=120) as cc:
        r = cc.post(url + "/v1/completions", json={"prompt": [9, i % 1000 + 10], "max_tokens": 1, "session_id": f"s{i}"})
        assert r.status_code == 200, r.text
t0 = time.time()
with cf.ThreadPoolExecutor(32) as ex:
    list(ex.map(mk, range(N)))
made = time.time() - t0
n = int([l for l in c.get(url + "/metrics").text.splitlines() if l.startswith("kvc_sessions_resident")][0].split()[1])
loaded = probe()
print(f"{bin}: sessions {n} (made in {made:.0f}s); 8-token request median {base*1e3:.1f} ms alone, {loaded*1e3:.1f} ms with them: {loaded/base:.2f}x")
p.terminate(); p.wait()
