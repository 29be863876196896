"""Security and limits on a server started with them: --api-key,
--cluster-token, --max-request-body-bytes, --max-prompt-tokens,
--max-concurrent-requests / --max-queued-requests (429 + Retry-After), and
--request-timeout-s (504, or a final error event in a stream)."""

import json
import threading

import httpx
import openai
import pytest

from conftest import wait_for

KEY = "test-key-123"
TOKEN = "cluster-secret"


@pytest.fixture(scope="module")
def limited(start_server):
    return start_server(
        "--api-key", KEY, "--cluster-token", TOKEN, "--max-request-body-bytes", "1MiB", "--max-prompt-tokens", "64",
        "--max-concurrent-requests", "1", "--max-queued-requests", "1",
    )


@pytest.fixture(scope="module")
def timed(start_server):
    return start_server("--request-timeout-s", "2")


def bearer(key):
    return {"authorization": f"Bearer {key}"}


def test_api_key_is_required_on_v1_routes(limited):
    for headers in ({}, bearer("wrong"), {"authorization": f"Basic {KEY}"}):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
            r = httpx.request(method, f"{limited.base_url}{path}", headers=headers, json={"prompt": "x"}, timeout=10)
            assert r.status_code == 401, (headers, path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        limited.client(api_key="wrong").models.list()
    ok = limited.client(api_key=KEY)
    assert ok.models.list().data[0].id == "kvc-default"
    r = ok.completions.create(model="kvc-default", prompt=[1, 2, 3], max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_probes_and_metrics_stay_open_with_an_api_key(limited):
    assert httpx.get(f"{limited.base_url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{limited.base_url}/health/live", timeout=10).status_code == 200
    assert httpx.get(f"{limited.base_url}/metrics", timeout=10).status_code == 200


def test_internal_routes_need_the_cluster_token(limited):
    url = f"{limited.base_url}/internal/ping"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"x-kvc-cluster-token": "nope"}, timeout=10).status_code == 401
    # The API key is not a cluster token.
    assert httpx.get(url, headers=bearer(KEY), timeout=10).status_code == 401
    r = httpx.get(url, headers={"x-kvc-cluster-token": TOKEN}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_body_over_the_limit_is_413(limited):
    body = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    r = httpx.post(f"{limited.base_url}/v1/completions", content=body, headers=bearer(KEY), timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert "1048576" in r.json()["error"]["message"]


def test_prompt_over_max_prompt_tokens_is_400(limited):
    c = limited.client(api_key=KEY)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="kvc-default", prompt=[7] * 65, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="kvc-default", messages=[{"role": "user", "content": "word " * 100}], max_tokens=1)
    assert e.value.body["param"] == "messages"
    assert c.completions.create(model="kvc-default", prompt=[7] * 64, max_tokens=1).usage.prompt_tokens == 64


def test_beyond_slots_and_queue_requests_get_429_with_retry_after(limited):
    c = limited.client(api_key=KEY)
    # 1. Hold the only slot with a long stream.
    stream = c.completions.create(model="kvc-default", prompt=[1, 2, 3], max_tokens=2000, stream=True,
                                  extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices
    # 2. A second request waits in the (one-place) queue.
    results = {}

    def queued():
        r = c.completions.create(model="kvc-default", prompt=[4, 5], max_tokens=2)
        results["queued"] = r.usage.completion_tokens

    t = threading.Thread(target=queued)
    t.start()
    wait_for(lambda: limited.metrics()["kvc_http_requests_queued"] == 1, 30, "the second request to queue")
    # 3. The third finds slot and queue taken.
    r = httpx.post(f"{limited.base_url}/v1/completions", headers=bearer(KEY), json={"prompt": [1], "max_tokens": 1}, timeout=30)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "server_busy"
    with pytest.raises(openai.RateLimitError):
        c.completions.create(model="kvc-default", prompt=[1], max_tokens=1)
    # 4. Leaving frees the slot: the queued request runs.
    stream.close()
    t.join(timeout=120)
    assert results.get("queued", 0) >= 1
    limited.wait_idle()
    assert limited.metrics()['kvc_requests_total{status="4xx"}'] >= 2


def test_request_past_the_timeout_is_504_and_cancelled(timed):
    c = timed.client()
    before = timed.metrics()
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="kvc-default", messages=[{"role": "user", "content": "go"}], max_tokens=5000,
                                  extra_body={"ignore_eos": True})
    assert e.value.status_code == 504
    assert e.value.body["code"] == "request_timeout"
    assert e.value.response.headers["x-should-retry"] == "false"
    idle = timed.wait_idle()
    generated = idle["kvc_generation_tokens_total"] - before["kvc_generation_tokens_total"]
    assert 0 < generated < 5000, "the engine request was not cancelled"
    assert idle['kvc_request_finishes_total{reason="timeout"}'] >= 1


def test_stream_past_the_timeout_ends_with_an_error_event(timed):
    c = timed.client()
    stream = c.completions.create(model="kvc-default", prompt=[1, 2, 3], max_tokens=5000, stream=True,
                                  extra_body={"ignore_eos": True})
    received = 0
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            received += 1
    assert received > 0
    assert "timeout" in e.value.message
    timed.wait_idle()
    # The server is fine afterwards.
    assert c.completions.create(model="kvc-default", prompt=[1, 2], max_tokens=2).usage.completion_tokens >= 1


def _mem_mib(pid: int) -> dict[str, int]:
    out = {}
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) // 1024
    return out


def test_a_body_of_many_tiny_messages_is_refused_before_rendering(start_server):
    """Issue 18, item 3: 480K one-character messages (a 16 MB body) used
    to cost ~2.2 s of CPU and +470 MB before their 400. Now the message
    count alone refuses them (each message costs at least the template's
    framing), and the peak memory stays a small multiple of the body."""
    srv = start_server()
    url = f"{srv.base_url}/v1/chat/completions"
    httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=60)
    # The grammar compiler (structured outputs) is built on a thread of its
    # own after start-up; a structured request waits for it, so its memory
    # is in the baseline instead of being counted against the body.
    warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "response_format": {"type": "json_object"}}
    assert httpx.post(url, json=warm, timeout=60).status_code == 200
    body = json.dumps({"messages": [{"role": "user", "content": "x"}] * 480_000, "max_tokens": 1}).encode()
    before = _mem_mib(srv.proc.pid)
    r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=120)
    after = _mem_mib(srv.proc.pid)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "at least" in err["message"], err
    growth = after["VmHWM"] - before["VmRSS"]
    assert growth < 10 * (len(body) >> 20), f"peak memory grew {growth} MiB for a {len(body) >> 20} MiB body"
    # A conversation under the count bound but over the token limit is
    # rendered and counted: its number is exact, not a bound.
    limit = int(err["message"].split("accepts (")[1].split(",")[0])
    n = limit // 4
    r = httpx.post(url, json={"messages": [{"role": "user", "content": "x y z"}] * n, "max_tokens": 1}, timeout=120)
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "at least" not in msg and int(msg.split("has ")[1].split(" tokens")[0]) > limit, msg


def raw_exchange(port: int, data: bytes, wait_s: float) -> tuple[str, float]:
    """Sends `data` on a fresh connection and reads until the server closes
    it (or `wait_s` passes): what came back, and after how long."""
    import socket
    import time
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    start = time.monotonic()
    s.sendall(data)
    s.settimeout(wait_s)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except socket.timeout:
        pass
    finally:
        s.close()
    return got.decode(errors="replace"), time.monotonic() - start


def port_of(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def test_a_stalled_body_is_answered_408_and_closed(start_server):
    """Issue 31: full headers, then a body that stalls, held the connection
    open forever (200 of 200 still open after 90 s). Now the body has
    --body-read-timeout-s to arrive: then a 408 in OpenAI's error shape and
    the connection closes; /health answers meanwhile."""
    srv = start_server("--body-read-timeout-s", "1")
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n")
    result = {}
    t = threading.Thread(target=lambda: result.update(r=raw_exchange(port_of(srv), head + b'{"prompt": "', 30)))
    t.start()
    assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
    t.join()
    text, took = result["r"]
    assert text.startswith("HTTP/1.1 408"), text
    body = json.loads(text.split("\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_body_timeout", body
    assert took < 10, f"the connection stayed open {took:.1f} s"


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(limited):
    """A Content-Length over --max-request-body-bytes is answered at once,
    without waiting for (or reading) the body, and the connection closes."""
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 17000000\r\n\r\n")
    text, took = raw_exchange(port_of(limited), head, 20)
    assert text.startswith("HTTP/1.1 413"), text
    assert json.loads(text.split("\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"
    assert took < 5, f"413 after {took:.1f} s"


def test_too_many_tools_are_a_400_and_health_answers_meanwhile(start_server):
    """Issue 31: 223K tool definitions in one request cost ~380 MB and 1.2 s
    of CPU each, and with 8 at once /health took 9.2 s. More than 128 tools
    (OpenAI's limit) are refused, the large bodies are parsed off the
    async runtime, and /health keeps answering quickly."""
    import concurrent.futures
    import time
    srv = start_server()
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    many = json.dumps({"model": "kvc-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "tools": [tool] * 200_000}).encode()
    assert len(many) < 16 << 20
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(httpx.post, f"{srv.base_url}/v1/chat/completions", content=many,
                               headers={"content-type": "application/json"}, timeout=120) for _ in range(8)]
        slowest = 0.0
        while not all(a.done() for a in answers):
            t = time.monotonic()
            assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
            slowest = max(slowest, time.monotonic() - t)
            time.sleep(0.02)
    for a in answers:
        r = a.result()
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text[:300]
        assert "128" in r.json()["error"]["message"]
    # 0.2-0.6 s on a 2-core machine whose one other process sends the 64 MB
    # (9.2 s before); the bound is for a runtime thread held by a parse.
    assert slowest < 2.0, f"/health took {slowest:.2f} s behind the requests"
    ok = [tool] * 128
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", timeout=120,
                   json={"model": "kvc-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": ok})
    assert r.status_code == 200, r.text[:300]
