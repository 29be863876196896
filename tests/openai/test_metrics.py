"""/metrics, and cancellation: a client that leaves mid-stream frees its KV
blocks."""

import time

import httpx
import pytest

ENGINE_METRICS = [
    "kvc_kv_blocks_free",
    "kvc_kv_blocks_total",
    "kvc_requests_running",
    "kvc_requests_waiting",
    "kvc_preemptions_total",
    "kvc_prompt_tokens_computed_total",
    "kvc_generation_tokens_total",
]


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def test_metrics_expose_engine_stats_in_prometheus_text(server):
    r = httpx.get(f"{server.base_url}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    m = server.metrics()
    for name in ENGINE_METRICS:
        assert name in m, f"{name} missing from /metrics"
        assert f"# TYPE {name} " in r.text
    assert m["kvc_kv_blocks_total"] > 0
    assert 0 <= m["kvc_kv_blocks_free"] <= m["kvc_kv_blocks_total"]


def test_generation_moves_the_counters(server, client, model):
    before = server.metrics()
    client.completions.create(model=model, prompt=[1, 2, 3, 4], max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = wait_for(
        lambda: (m := server.metrics())["kvc_generation_tokens_total"] >= before["kvc_generation_tokens_total"] + 5 and m,
        10, "generation counter")
    assert after["kvc_prompt_tokens_computed_total"] >= before["kvc_prompt_tokens_computed_total"] + 1


def test_client_disconnect_mid_stream_cancels_and_frees_blocks(server, client, model, max_model_len):
    idle = wait_for(lambda: (m := server.metrics())["kvc_requests_running"] == 0 and m, 30, "an idle engine")
    assert idle["kvc_kv_blocks_free"] == idle["kvc_kv_blocks_total"]
    # Ask for far more tokens than will be produced before we hang up.
    max_tokens = max_model_len - 64
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Talk forever."}], stream=True,
        max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
    )
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
        if received >= 3:
            break
    busy = server.metrics()
    assert busy["kvc_requests_running"] + busy["kvc_requests_waiting"] >= 1
    assert busy["kvc_kv_blocks_free"] < busy["kvc_kv_blocks_total"]

    stream.close()  # the client goes away mid-stream

    freed = wait_for(
        lambda: (m := server.metrics())["kvc_kv_blocks_free"] == m["kvc_kv_blocks_total"]
        and m["kvc_requests_running"] == 0 and m,
        30, "the cancelled request's blocks to be freed")
    generated = freed["kvc_generation_tokens_total"] - idle["kvc_generation_tokens_total"]
    assert generated < max_tokens, "the request ran to completion instead of being cancelled"
    # The server saw the stream end early.
    assert server.metrics()["kvc_streams_cancelled_total"] >= 1


def test_client_disconnect_during_non_streaming_request_cancels_it(server, model, max_model_len):
    idle = wait_for(lambda: (m := server.metrics())["kvc_requests_running"] == 0 and m, 30, "an idle engine")
    max_tokens = max_model_len - 64
    body = {"model": model, "messages": [{"role": "user", "content": "Talk forever."}],
            "max_tokens": max_tokens, "ignore_eos": True}
    # The client gives up (and closes the connection) long before the answer.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=2.0))
    freed = wait_for(
        lambda: (m := server.metrics())["kvc_kv_blocks_free"] == m["kvc_kv_blocks_total"]
        and m["kvc_requests_running"] == 0 and m,
        30, "the abandoned request's blocks to be freed")
    generated = freed["kvc_generation_tokens_total"] - idle["kvc_generation_tokens_total"]
    assert 0 < generated < max_tokens, "the request ran to completion instead of being cancelled"
