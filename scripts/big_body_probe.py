"""Peak memory and time of a chat body of many tiny messages (issue 18,
item 3): starts kvc-server (the binary given), posts 480K and 50K
one-character messages, prints the 400 and the server's VmRSS / VmHWM before
and after.

    python3 scripts/big_body_probe.py target/debug/kvc-server
"""
import json, time, httpx, sys, os
import kvc_local
bin = sys.argv[1]
p, url = kvc_local.start(bin)
def mem():
    d = {}
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith(("VmRSS", "VmHWM")): k, v = l.split(":"); d[k] = int(v.split()[0]) // 1024
    return d
def cpu():
    f = open(f"/proc/{p.pid}/stat").read().split(")")[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=60)
for n in [480_000, 50_000]:
    body = json.dumps({"messages": [{"role": "user", "content": "x"}] * n, "max_tokens": 1}).encode()
    m0, c0, t0 = mem(), cpu(), time.time()
    r = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=120)
    m1, c1 = mem(), cpu()
    print(n, "msgs", len(body) >> 20, "MiB", r.status_code, r.json()["error"]["message"][:90], f"wall {time.time()-t0:.2f}s cpu {c1-c0:.2f}s", m0, m1)
p.terminate(); p.wait()
