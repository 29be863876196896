"""Sessions across turns over HTTP: reuse reported in usage and the `kvc`
field, the session endpoints, the admission probe, and their metrics."""

import httpx

from conftest import wait_for


def completion(server, session=None, header=None, prompt=None, max_tokens=6):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if session is not None:
        body["session_id"] = session
    headers = {"x-session-id": header} if header else {}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_second_turn_reuses_the_session_and_reports_it(server):
    turn1 = list(range(1000, 1060))
    r1 = completion(server, session="conv-a", prompt=turn1)
    assert r1.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    turn2 = turn1 + list(range(5000, 5030))
    r2 = completion(server, session="conv-a", prompt=turn2)
    body = r2.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Turn 1's 60 prompt tokens are held in whole 16-token blocks: 48 reusable.
    assert cached == 48
    assert body["kvc"]["reason"] == "session_hit"
    assert body["kvc"]["cached_tokens"] == cached
    assert body["kvc"]["computed_tokens"] == len(turn2) - cached
    assert r2.headers["x-kvc-path"] == "local"


def test_the_session_header_names_the_session_when_the_body_does_not(server):
    p = list(range(2000, 2040))
    completion(server, header="conv-h", prompt=p)
    r = completion(server, header="conv-h", prompt=p + [7, 8, 9])
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


def test_session_endpoints_show_and_delete_a_session(server):
    p = list(range(3000, 3050))
    completion(server, session="conv-d", prompt=p)
    info = httpx.get(f"{server.base_url}/v1/sessions/conv-d").json()
    assert info["id"] == "conv-d" and info["tier"] == "device"
    assert info["resident_tokens"] >= 48 and info["turns"] == 1
    # A different id that shares a prefix is a different session.
    assert httpx.get(f"{server.base_url}/v1/sessions/conv").status_code == 404
    probe = httpx.post(f"{server.base_url}/v1/admission", json={"session_id": "conv-d", "prompt_tokens": 80}).json()
    assert probe["can_admit"] is True and probe["reason"] == "ok"
    assert probe["resident_tokens"] == info["resident_tokens"]
    assert probe["estimated_computed_tokens"] < 80
    r = httpx.delete(f"{server.base_url}/v1/sessions/conv-d")
    assert r.status_code == 200 and r.json()["deleted"] is True
    gone = httpx.get(f"{server.base_url}/v1/sessions/conv-d")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"
    assert httpx.delete(f"{server.base_url}/v1/sessions/conv-d").status_code == 404


def test_bad_session_and_admission_input_is_a_4xx_with_openai_json(server):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": [1, 2], "session_id": "x" * 1000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
    for bad in [{}, {"prompt_tokens": 0}, {"prompt_tokens": -1}, {"prompt_tokens": 5, "nope": 1}, "not json"]:
        r = httpx.post(f"{server.base_url}/v1/admission", json=bad) if not isinstance(bad, str) else httpx.post(
            f"{server.base_url}/v1/admission", content=bad)
        assert r.status_code == 400, (bad, r.text)
        assert "message" in r.json()["error"]


def test_metrics_count_session_hits_and_reuse(server):
    p = list(range(4000, 4040))
    completion(server, session="conv-m", prompt=p)
    completion(server, session="conv-m", prompt=p + [1, 2, 3])
    m = server.metrics()
    assert m["kvc_session_hits_total"] >= 1
    assert m["kvc_prompt_tokens_reused_total"] >= 32
    assert m["kvc_sessions_resident"] >= 1
    assert "kvc_host_kv_blocks_total" in m


def test_without_the_session_cache_every_turn_starts_cold(start_server):
    # --no-enable-session-cache (the naive P/D baseline of the headline
    # experiment): ids are still checked, but no KV is kept for them. With
    # the prefix cache off too, a repeated prefix is computed again.
    srv = start_server("--no-enable-session-cache", "--no-enable-prefix-caching")
    turn1 = list(range(1000, 1060))
    r1 = completion(srv, session="conv-cold", prompt=turn1)
    r2 = completion(srv, session="conv-cold", prompt=turn1 + list(range(5000, 5030)))
    for r in (r1, r2):
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2.json()["kvc"]["computed_tokens"] == 90
    assert httpx.get(f"{srv.base_url}/v1/sessions/conv-cold").status_code == 404
    # A bad id is still refused.
    bad = httpx.post(f"{srv.base_url}/v1/completions", json={"prompt": [1, 2], "session_id": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
    # The prefix cache alone still reuses the earlier prompt's whole blocks.
    warm = start_server("--no-enable-session-cache")
    completion(warm, session="conv-p", prompt=turn1)
    r = completion(warm, session="conv-p", prompt=turn1 + [7, 8, 9])
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
    assert r.json()["kvc"]["reason"] != "session_hit"


def test_a_session_pushed_to_the_host_tier_comes_back_by_copy_and_is_counted(start_server):
    # A pool of 8 blocks (128 tokens) holds one 100-token session at a time:
    # B's turn pushes A's idle blocks to the host tier, and A's next turn
    # copies them back (pushing B out) instead of recomputing them.
    srv = start_server("--num-kv-blocks", "8", "--swap-space", "0.01", "--max-model-len", "128")
    a = list(range(1000, 1100))
    completion(srv, session="tier-a", prompt=a)
    completion(srv, session="tier-b", prompt=list(range(3000, 3100)))
    r = completion(srv, session="tier-a", prompt=a + [7, 8, 9])
    kvc = r.json()["kvc"]
    # A's first 96 tokens (6 whole blocks) are reused, not recomputed.
    assert kvc["reason"] == "session_hit" and kvc["cached_tokens"] == 96, kvc
    # The step loop publishes its stats after the step: wait for them.
    def restored():
        m = srv.metrics()
        return m if m.get("kvc_host_restores_total", 0) >= 6 else None

    m = wait_for(restored, 10, "the restores in /metrics")
    restores = m["kvc_host_restores_total"]
    to_host = m['kvc_host_tier_bytes_total{direction="to_host"}']
    to_device = m['kvc_host_tier_bytes_total{direction="to_device"}']
    offloaded = sum(v for k, v in m.items() if k.startswith("kvc_evicted_blocks_total{") and 'tier="host"' in k)
    assert restores >= 6 and offloaded >= restores, m
    # Both directions move whole blocks of the same size.
    assert to_device > 0 and to_host / offloaded == to_device / restores, (to_host, offloaded, to_device, restores)
