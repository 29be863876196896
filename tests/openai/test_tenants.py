"""Tenant isolation (issue 18, item 2): several API keys keep their
sessions apart (another key's session is a 404, cannot be deleted or
probed), `--isolate-cache-per-key` keeps their prefix-cache blocks apart,
vLLM's `cache_salt` keeps cached blocks and sessions apart per salt, and
`--max-sessions-per-key` makes a key that opens too many sessions lose its
own oldest, never another key's.

The reference for "shared or not" is the server's own report of cached
prompt tokens (`usage.prompt_tokens_details.cached_tokens`), the side
channel the issue measured: a prompt seen before under the same scope
reports its whole blocks cached; under another scope, zero.
"""

from __future__ import annotations

import random

import httpx
import pytest

K1, K2 = "key-one", "key-two"


def ids(seed: int, n: int = 80) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150000) for _ in range(n)]


def complete(server, key=None, prompt=None, session=None, salt=None, status=200):
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    if session is not None:
        body["session_id"] = session
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def cached(out) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


def auth(key):
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def two_keys(start_server):
    return start_server("--api-key", K1, "--api-key", K2)


def test_another_keys_session_is_a_404_and_stays_intact(two_keys):
    s = two_keys.base_url
    p = ids(1)
    complete(two_keys, K1, p, session="conv")
    assert httpx.get(f"{s}/v1/sessions/conv", headers=auth(K1)).json()["id"] == "conv"
    # K2 sees nothing, cannot delete it, and the probe reveals nothing.
    r = httpx.get(f"{s}/v1/sessions/conv", headers=auth(K2))
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    assert httpx.delete(f"{s}/v1/sessions/conv", headers=auth(K2)).status_code == 404
    # The probe answers another key's session as a session nobody holds: 404.
    for sid in ("conv", "nobody-has-this"):
        r = httpx.post(f"{s}/v1/admission", json={"session_id": sid, "prompt_tokens": 100}, headers=auth(K2))
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found", r.text
    fresh = httpx.post(f"{s}/v1/admission", json={"prompt_tokens": 100}, headers=auth(K2)).json()
    assert fresh["can_admit"] is True and fresh["resident_tokens"] == 0
    probe = httpx.post(f"{s}/v1/admission", json={"session_id": "conv", "prompt_tokens": 100}, headers=auth(K1)).json()
    assert probe["resident_tokens"] >= 64
    # K2's own "conv" is another session: its first turn starts cold (by
    # session; the prefix cache is shared between keys by default)...
    other = complete(two_keys, K2, ids(2), session="conv")
    assert cached(other) == 0
    # ... and K1's next turn still continues K1's session.
    nxt = complete(two_keys, K1, p + ids(3, 20), session="conv")
    assert nxt["kvc"]["reason"] == "session_hit" and cached(nxt) >= 64
    assert httpx.delete(f"{s}/v1/sessions/conv", headers=auth(K1)).status_code == 200
    assert httpx.get(f"{s}/v1/sessions/conv", headers=auth(K2)).status_code == 200, "K2's session is untouched"


def test_without_isolation_keys_share_the_prefix_cache(two_keys):
    p = ids(10)
    complete(two_keys, K1, p)
    assert cached(complete(two_keys, K2, p)) == 64


def test_isolate_cache_per_key_keeps_prefix_blocks_apart(start_server):
    srv = start_server("--api-key", K1, "--api-key", K2, "--isolate-cache-per-key")
    p = ids(20)
    complete(srv, K1, p)
    assert cached(complete(srv, K2, p)) == 0, "K2 learns nothing of K1's prompt"
    assert cached(complete(srv, K1, p)) == 64, "K1 still reuses its own"
    assert cached(complete(srv, K2, p)) == 64, "and K2 its own"


def test_cache_salt_separates_prefix_blocks_and_sessions(server):
    p = ids(30)
    complete(server, prompt=p, salt="tenant-a")
    assert cached(complete(server, prompt=p, salt="tenant-b")) == 0
    assert cached(complete(server, prompt=p)) == 0, "unsalted requests do not see salted blocks"
    assert cached(complete(server, prompt=p, salt="tenant-a")) == 64
    # Sessions are kept per salt.
    q = ids(31)
    complete(server, prompt=q, session="salted", salt="tenant-a")
    assert httpx.get(f"{server.base_url}/v1/sessions/salted").status_code == 404
    info = httpx.get(f"{server.base_url}/v1/sessions/salted", params={"cache_salt": "tenant-a"})
    assert info.status_code == 200 and info.json()["id"] == "salted"
    assert cached(complete(server, prompt=q + [5, 6], session="salted", salt="tenant-b")) == 0
    assert cached(complete(server, prompt=q + [5, 6], session="salted", salt="tenant-a")) >= 64


@pytest.mark.parametrize("salt", ["", "a\u0001b", "x" * 1025])
def test_a_bad_cache_salt_is_a_400(server, salt):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1, "cache_salt": salt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cache_salt"


def test_a_session_id_with_control_characters_is_a_400(server):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1, "session_id": "a\u001eb"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_the_session_cap_drops_the_keys_own_oldest_session(start_server):
    srv = start_server("--api-key", K1, "--api-key", K2, "--max-sessions-per-key", "2")
    s = srv.base_url
    for i, name in enumerate(("b1", "b2")):
        complete(srv, K2, ids(40 + i), session=name)
    for i, name in enumerate(("a1", "a2", "a3")):
        complete(srv, K1, ids(50 + i), session=name)
    status = {n: httpx.get(f"{s}/v1/sessions/{n}", headers=auth(K1)).status_code for n in ("a1", "a2", "a3")}
    assert status == {"a1": 404, "a2": 200, "a3": 200}, status
    for n in ("b1", "b2"):
        assert httpx.get(f"{s}/v1/sessions/{n}", headers=auth(K2)).status_code == 200, f"K2's {n} survived K1's burst"
    assert srv.metrics().get("kvc_sessions_capped_total") == 1.0


def test_with_several_keys_resetting_the_prefix_cache_needs_the_cluster_token(start_server):
    """Issue 31: tenant B's POST /reset_prefix_cache flushed every tenant's
    cache (A: 6,400 cached tokens / 41 ms -> 0 / 7.9 s) and revealed its
    size. With several keys it is now an operator's call: a key alone gets
    403 and A's cache stays; the cluster token as well lets it through."""
    srv = start_server("--api-key", K1, "--api-key", K2, "--cluster-token", "ops-secret")
    prompt = ids(31)
    complete(srv, K1, prompt)
    assert cached(complete(srv, K1, prompt)) >= 64
    r = httpx.post(f"{srv.base_url}/reset_prefix_cache", headers=auth(K2), timeout=30)
    assert r.status_code == 403 and "cluster token" in r.json()["error"]["message"], r.text
    assert "blocks_released" not in r.text
    assert cached(complete(srv, K1, prompt)) >= 64, "B's refused reset flushed A's cache"
    r = httpx.post(f"{srv.base_url}/reset_prefix_cache", headers={**auth(K2), "x-kvc-cluster-token": "ops-secret"}, timeout=30)
    assert r.status_code == 200 and r.json()["reset"] is True, r.text


def test_with_one_key_resetting_the_prefix_cache_stays_open_as_in_vllm(start_server):
    srv = start_server("--api-key", K1)
    r = httpx.post(f"{srv.base_url}/reset_prefix_cache", headers=auth(K1), timeout=30)
    assert r.status_code == 200 and r.json()["reset"] is True, r.text
