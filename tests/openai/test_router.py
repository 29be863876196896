"""`--role router` in front of real `--role both` workers, driven with the
real `openai` client: answers equal a worker's own, sessions stick to their
worker, a session moves when its worker has no room or dies, every request
succeeds, and the router's metrics count what it did."""

import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import wait_for

TOKEN = "t"
SYSTEM = "You are a careful assistant that answers questions about the weather in great detail. " * 3


def start_router(start_server, workers, *flags):
    peers = [f for w in workers for f in ("--decode-peer", w.base_url)]
    router = start_server("--role", "router", "--cluster-token", TOKEN, "--peer-poll-interval-s", "0.1", *peers, *flags)
    wait_for(lambda: all_healthy(router, workers), 60, "the router to see every worker healthy")
    return router


def all_healthy(router, workers):
    m = router.metrics()
    return all(m.get(f'kvc_router_peer_healthy{{worker="{w.base_url}"}}') == 1 for w in workers)


@pytest.fixture(scope="module")
def cluster(start_server):
    workers = [start_server("--cluster-token", TOKEN) for _ in range(2)]
    return start_router(start_server, workers), workers


def placements(m: dict[str, float], reason: str | None = None) -> float:
    """The router's placements in its /metrics (kvc_decisions_total of
    decision="route_score"), of one reason or of all."""
    return sum(v for k, v in m.items() if k.startswith('kvc_decisions_total{decision="route_score",')
               and (reason is None or k.endswith(f',reason="{reason}"}}')))


def worker_of(raw) -> str:
    return raw.headers["x-kvc-worker"]


def streamed_text(stream):
    parts, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)
            text = delta.content if delta is not None else choice.text
            if text:
                parts.append(text)
    return "".join(parts), usage


def test_chat_and_completions_through_the_router_equal_a_worker_hit_directly(cluster):
    router, (w1, _) = cluster
    via, direct = router.client(), w1.client()
    messages = [{"role": "user", "content": "Say something about routers."}]
    kw = dict(model="kvc-default", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    want = direct.chat.completions.create(messages=messages, **kw).choices[0].message.content
    raw = via.chat.completions.with_raw_response.create(messages=messages, **kw)
    assert worker_of(raw) in {w.base_url for w in cluster[1]}
    assert raw.headers["x-kvc-path"] == "local" and raw.headers["x-request-id"].startswith("chatcmpl-")
    assert raw.parse().choices[0].message.content == want
    text, usage = streamed_text(via.chat.completions.create(
        messages=messages, stream=True, stream_options={"include_usage": True}, **kw))
    assert text == want and usage.completion_tokens == 12

    want = direct.completions.create(prompt="The router says", **kw).choices[0].text
    assert via.completions.create(prompt="The router says", **kw).choices[0].text == want
    text, _ = streamed_text(via.completions.create(prompt="The router says", stream=True, **kw))
    assert text == want


def test_a_multi_turn_session_sticks_to_one_worker_and_reuses_its_kv(cluster):
    router, _ = cluster
    client = router.client()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather like?"}]
    seen = []
    for turn in range(3):
        kw = dict(model="kvc-default", messages=messages, max_tokens=6, temperature=0)
        if turn == 2:  # the header names the session as well as the body field
            raw = client.chat.completions.with_raw_response.create(extra_headers={"x-session-id": "stick-1"}, **kw)
        else:
            raw = client.chat.completions.with_raw_response.create(extra_body={"session_id": "stick-1"}, **kw)
        r = raw.parse()
        seen.append((worker_of(raw), r.usage.prompt_tokens_details.cached_tokens))
        messages = messages + [{"role": "assistant", "content": r.choices[0].message.content},
                               {"role": "user", "content": f"And tomorrow, turn {turn}?"}]
    assert len({w for w, _ in seen}) == 1, seen
    assert seen[0][1] == 0 and seen[1][1] > 0 and seen[2][1] > 0, seen
    info = httpx.get(f"{router.base_url}/v1/sessions/stick-1", timeout=30)
    assert info.status_code == 200 and info.headers["x-kvc-worker"] == seen[0][0]
    assert info.json()["turns"] == 3
    # Exact ids only: a prefix of the id is another (unknown) session.
    gone = httpx.get(f"{router.base_url}/v1/sessions/stick-", timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"
    assert placements(router.metrics(), "session_resident") >= 2


def test_concurrent_new_sessions_spread_over_both_workers_and_all_succeed(cluster):
    router, workers = cluster
    client = router.client()

    def one(i):
        raw = client.completions.with_raw_response.create(
            model="kvc-default", prompt=list(range(500 + i, 600 + i)), max_tokens=16, temperature=0,
            extra_body={"session_id": f"burst-{i}", "ignore_eos": True})
        return worker_of(raw), raw.parse().usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert all(n == 16 for _, n in results), results
    used = {w for w, _ in results}
    assert used == {w.base_url for w in workers}, results


def test_bad_input_through_the_router_is_the_workers_openai_error(cluster):
    router, _ = cluster
    client = router.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="kvc-default", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    for body in (b"{not json", b'{"prompt": [1, 2], "session_id": ""}', b'{"messages": 5}'):
        r = httpx.post(f"{router.base_url}/v1/chat/completions", content=body, timeout=30)
        assert 400 <= r.status_code < 500, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(f"{router.base_url}/v1/nowhere", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"


def test_health_models_and_metrics(cluster):
    router, workers = cluster
    h = httpx.get(f"{router.base_url}/health", timeout=10)
    assert h.status_code == 200 and h.json()["healthy_workers"] == 2
    assert httpx.get(f"{router.base_url}/health/live", timeout=10).json()["status"] == "alive"
    models = router.client().models.list().data
    assert [m.id for m in models] == ["kvc-default"]
    m = router.metrics()
    assert sum(v for k, v in m.items() if k.startswith("kvc_router_requests_total")) >= 4
    assert placements(m) >= 4
    for w in workers:
        assert m[f'kvc_router_peer_health_changes_total{{worker="{w.base_url}",to="healthy"}}'] == 1


def test_api_key_and_body_limit_apply_on_the_router(start_server, cluster):
    _, workers = cluster
    router = start_router(start_server, workers, "--api-key", "k3y", "--max-request-body-bytes", "2KiB")
    with pytest.raises(openai.AuthenticationError):
        router.client().models.list()
    with pytest.raises(openai.AuthenticationError):
        router.client(api_key="wrong").completions.create(model="kvc-default", prompt="x", max_tokens=2)
    ok = router.client(api_key="k3y").completions.create(model="kvc-default", prompt="hi", max_tokens=2)
    assert ok.choices[0].text is not None
    r = httpx.post(f"{router.base_url}/v1/completions", headers={"authorization": "Bearer k3y"},
                   json={"prompt": "x" * 4096, "max_tokens": 2}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{router.base_url}/health", timeout=10).status_code == 200


def test_sigterm_lets_a_stream_through_the_router_finish_then_exits_zero(start_server, cluster):
    _, workers = cluster
    router = start_router(start_server, workers, "--shutdown-timeout-s", "120")
    stream = iter(router.client().completions.create(
        model="kvc-default", prompt=[1, 2, 3], max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    chunks = [next(stream)]
    router.proc.send_signal(signal.SIGTERM)
    host, port = router.base_url.removeprefix("http://").split(":")

    def refuses():
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return False
        except OSError:
            return True

    wait_for(refuses, 30, "the router's listener to close")
    chunks += list(stream)
    assert chunks[-1].usage.completion_tokens == 30
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert router.proc.wait(timeout=30) == 0


def test_a_worker_without_room_gets_no_new_sessions_and_its_session_moves(start_server):
    # The tiny worker (40 blocks = 640 tokens) comes first: equal scores go to it.
    tiny = start_server("--cluster-token", TOKEN, "--num-kv-blocks", "40")
    big = start_server("--cluster-token", TOKEN)
    router = start_router(start_server, [tiny, big])
    client = router.client()

    def complete(session, prompt, max_tokens=4):
        raw = client.completions.with_raw_response.create(
            model="kvc-default", prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body={"session_id": session, "ignore_eos": True})
        return worker_of(raw), raw.parse()

    history = list(range(1000, 1100))
    where, _ = complete("full-1", history)
    assert where == tiny.base_url
    # Next turn: 800 tokens, more than the tiny pool can hold: the session moves.
    history = history + list(range(2000, 2700))
    where, r = complete("full-1", history)
    assert where == big.base_url and r.usage.prompt_tokens == 800
    wait_for(lambda: httpx.get(f"{tiny.base_url}/v1/sessions/full-1", timeout=10).status_code == 404, 30,
             "the moved session's stale copy to be dropped from the tiny worker")
    # It stays on its new worker.
    where, r = complete("full-1", history + [7, 8, 9])
    assert where == big.base_url and r.usage.prompt_tokens_details.cached_tokens >= 784
    # New sessions too large for the tiny worker all go to the big one, and all succeed.
    for i in range(3):
        where, r = complete(f"full-new-{i}", list(range(3000 + i, 3700 + i)))
        assert where == big.base_url and r.choices[0].finish_reason == "length"
    m = router.metrics()
    assert m['kvc_router_session_moves_total{reason="moved_full"}'] == 1
    assert placements(m, "moved_full") == 1
    assert placements(m, "least_cost") == 4
    assert m.get(f'kvc_router_requests_total{{worker="{big.base_url}",status="200"}}') == 5


def test_a_session_whose_worker_dies_moves_to_the_other_and_succeeds(start_server):
    workers = [start_server("--cluster-token", TOKEN) for _ in range(2)]
    router = start_router(start_server, workers)
    client = router.client()
    kw = dict(model="kvc-default", max_tokens=5, temperature=0, extra_body={"session_id": "doomed", "ignore_eos": True})
    raw = client.chat.completions.with_raw_response.create(messages=[{"role": "user", "content": SYSTEM}], **kw)
    first = worker_of(raw)
    victim = next(w for w in workers if w.base_url == first)
    survivor = next(w for w in workers if w is not victim)
    victim.proc.kill()
    victim.proc.wait()
    messages = [{"role": "user", "content": SYSTEM}, {"role": "assistant", "content": raw.parse().choices[0].message.content},
                {"role": "user", "content": "Go on."}]
    raw = client.chat.completions.with_raw_response.create(messages=messages, **kw)
    assert worker_of(raw) == survivor.base_url
    assert raw.parse().choices[0].finish_reason == "length"
    m = router.metrics()
    assert m['kvc_router_session_moves_total{reason="moved_unhealthy"}'] == 1
    wait_for(lambda: router.metrics()[f'kvc_router_peer_healthy{{worker="{victim.base_url}"}}'] == 0, 30,
             "the dead worker to be marked unhealthy")
    assert router.metrics()[f'kvc_router_peer_health_changes_total{{worker="{victim.base_url}",to="unhealthy"}}'] == 1
    # New work keeps flowing to the survivor while the dead worker is retried with backoff.
    for i in range(3):
        raw = client.completions.with_raw_response.create(model="kvc-default", prompt=f"n{i}", max_tokens=2)
        assert worker_of(raw) == survivor.base_url
    # With no worker left the router is unready and answers 503 with OpenAI's error JSON.
    survivor.proc.kill()
    survivor.proc.wait()
    r = httpx.post(f"{router.base_url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 503 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    wait_for(lambda: httpx.get(f"{router.base_url}/health", timeout=10).status_code == 503, 30, "the router to be unready")


def test_with_two_keys_and_a_salt_sessions_are_placed_kept_and_found_as_the_workers_keep_them(start_server):
    """Issue 31: workers keep sessions under scoped ids (key namespace,
    cache_salt); the router looked them up by the client's raw id, so with
    two keys or a salt its placement never saw them resident, B's DELETE of
    A's id made the router forget A's session, and a salted session was
    never reachable through the router. Now the router scopes ids as the
    workers do: A's turns follow A's session, B's DELETE of "s" leaves A's
    "s" reachable, a salted session is found with ?cache_salt=, and a new
    router finds A's session from the workers' published state alone."""
    k1, k2 = "key-one", "key-two"
    keys = ("--api-key", k1, "--api-key", k2)
    workers = [start_server("--cluster-token", TOKEN, *keys) for _ in range(2)]
    router = start_router(start_server, workers, *keys)
    a, b = router.client(api_key=k1), router.client(api_key=k2)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather like?"}]
    kw = dict(model="kvc-default", max_tokens=6, temperature=0)

    def turn(client, session, salt=None):
        extra = {"session_id": session, **({"cache_salt": salt} if salt else {})}
        raw = client.chat.completions.with_raw_response.create(messages=messages, extra_body=extra, **kw)
        return worker_of(raw), raw.parse().usage.prompt_tokens_details.cached_tokens

    home, _ = turn(a, "s")
    turn(b, "s")  # B's own "s": another session
    # A's next turn goes home, placed as resident (the router sees it in
    # the workers' state under A's scoped id).
    before = placements(router.metrics(), "session_resident")
    again, cached = turn(a, "s")
    assert again == home and cached > 0
    assert placements(router.metrics(), "session_resident") == before + 1
    # B deletes "s": its own; A's stays reachable.
    auth = lambda k: {"authorization": f"Bearer {k}"}  # noqa: E731
    assert httpx.delete(f"{router.base_url}/v1/sessions/s", headers=auth(k2), timeout=30).status_code == 200
    r = httpx.get(f"{router.base_url}/v1/sessions/s", headers=auth(k1), timeout=30)
    assert r.status_code == 200 and r.headers["x-kvc-worker"] == home and r.json()["turns"] == 2, r.text
    # A salted session, through the router.
    salted_home, _ = turn(a, "t", salt="tenant-x")
    r = httpx.get(f"{router.base_url}/v1/sessions/t", params={"cache_salt": "tenant-x"}, headers=auth(k1), timeout=30)
    assert r.status_code == 200 and r.headers["x-kvc-worker"] == salted_home, r.text
    assert httpx.get(f"{router.base_url}/v1/sessions/t", headers=auth(k1), timeout=30).status_code == 404, "unsalted: another id"
    # A router that never saw these requests finds A's session on its worker.
    fresh = start_router(start_server, workers, *keys)
    r = wait_for(lambda: (x := httpx.get(f"{fresh.base_url}/v1/sessions/s", headers=auth(k1), timeout=30)).status_code == 200 and x,
                 30, "the new router to find A's session")
    assert r.headers["x-kvc-worker"] == home
