"""/metrics, and cancellation: a client that leaves mid-stream frees its KV
blocks."""

import re

import httpx
import pytest

from conftest import wait_for

ENGINE_METRICS = [
    "kvc_kv_blocks_free",
    "kvc_kv_blocks_total",
    "kvc_kv_blocks_evictable",
    "kvc_requests_running",
    "kvc_requests_waiting",
    "kvc_preemptions_total",
    "kvc_prompt_tokens_computed_total",
    "kvc_generation_tokens_total",
    "kvc_requests_oldest_waiting_seconds",
    "kvc_scheduler_head_of_line_passed_total",
]


HISTOGRAMS = [
    "kvc_time_to_first_token_seconds",
    "kvc_inter_token_latency_seconds",
    "kvc_e2e_request_latency_seconds",
    "kvc_request_queue_time_seconds",
]


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
    # The watchdog's counter is exported at 0 for every reason on a fresh
    # server (an alert on it needs the series to exist).
    stalled = [line for line in r.text.splitlines() if line.startswith("kvc_engine_stalled_steps_total{")]
    assert {line.split('reason="')[1].split('"')[0] for line in stalled} >= {"kv_watermark", "max_num_seqs", "unknown"}
    assert all(line.endswith(" 0") for line in stalled), stalled
    # So are the typed decisions' label sets: the scheduler's admission
    # reasons (kvc_decisions_total{decision="seq_admission"}) and the
    # eviction decision's (tier, reason) pairs.
    admission = {k.rsplit('reason="', 1)[1][:-2] for k in m if k.startswith('kvc_decisions_total{decision="seq_admission",')}
    for reason in ["admitted", "max_num_seqs", "kv_watermark", "partial_prefills", "long_partial_prefills", "token_budget"]:
        assert reason in admission, reason
    for tier in ["host", "dropped"]:
        for reason in ["idle", "size", "few_turns"]:
            assert f'kvc_evicted_blocks_total{{tier="{tier}",reason="{reason}"}}' in m, (tier, reason)


def test_generation_moves_the_counters(server, client, model):
    before = server.metrics()
    client.completions.create(model=model, prompt=[1, 2, 3, 4], max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = wait_for(
        lambda: (m := server.metrics())["kvc_generation_tokens_total"] >= before["kvc_generation_tokens_total"] + 5 and m,
        10, "generation counter")
    assert after["kvc_prompt_tokens_computed_total"] >= before["kvc_prompt_tokens_computed_total"] + 1


def test_client_disconnect_mid_stream_cancels_and_frees_blocks(server, client, model, max_model_len):
    idle = server.wait_idle()
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

    # Freed, or kept only by the prefix cache (reclaimable).
    freed = server.wait_idle()
    generated = freed["kvc_generation_tokens_total"] - idle["kvc_generation_tokens_total"]
    assert generated < max_tokens, "the request ran to completion instead of being cancelled"
    # The server saw the stream end early.
    assert server.metrics()["kvc_streams_cancelled_total"] >= 1


def test_client_disconnect_during_non_streaming_request_cancels_it(server, model, max_model_len):
    idle = server.wait_idle()
    max_tokens = max_model_len - 64
    body = {"model": model, "messages": [{"role": "user", "content": "Talk forever."}],
            "max_tokens": max_tokens, "ignore_eos": True}
    # The client gives up (and closes the connection) long before the answer.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=2.0))
    freed = server.wait_idle()
    generated = freed["kvc_generation_tokens_total"] - idle["kvc_generation_tokens_total"]
    assert 0 < generated < max_tokens, "the request ran to completion instead of being cancelled"


def test_latency_histograms_and_request_counters_move(server, client, model):
    before = server.metrics()
    r = client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4
    with pytest.raises(Exception):
        client.completions.create(model=model, prompt="x", max_tokens=0)
    after = wait_for(
        lambda: (m := server.metrics())["kvc_e2e_request_latency_seconds_count"]
        >= before["kvc_e2e_request_latency_seconds_count"] + 1 and m, 10, "the e2e histogram")
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text
        assert f'{name}_bucket{{le="+Inf"}}' in after
        assert after[f"{name}_count"] == after[f'{name}_bucket{{le="+Inf"}}']
    delta = lambda k: after[k] - before[k]
    assert delta("kvc_time_to_first_token_seconds_count") >= 1
    assert delta("kvc_inter_token_latency_seconds_count") >= 3  # 4 tokens, 3 gaps
    assert delta("kvc_request_queue_time_seconds_count") >= 1
    assert delta('kvc_requests_total{status="2xx"}') >= 1
    assert delta('kvc_requests_total{status="4xx"}') >= 1
    assert delta('kvc_request_finishes_total{reason="length"}') >= 1
    assert after["kvc_http_requests_queued"] == 0


# Every (path, reason) that kvc_policy::prefill_path::decide can return, and
# the decode worker's own no_room_to_reserve, multiple_choices and
# prompt_logprobs (PathReason::pairs).
HERE = ("direct_append", "local")
PATH_DECISIONS = {
    *((p, r) for r in ("no_prefill_peer", "prefill_peer_unhealthy", "suffix_below_threshold", "local_cheaper") for p in HERE),
    *(("remote_prefill", r) for r in ("suffix_above_threshold", "snapshot_covers_prefix", "snapshot_bypass_cheaper",
                                      "remote_cheaper")),
    ("local", "no_room_to_reserve"),
    ("local", "multiple_choices"),
    ("local", "prompt_logprobs"),
}


def test_decision_and_fallback_counters_list_every_reason_at_0_on_a_fresh_worker(start_server):
    """Closed label sets exist from the start (no empty dashboard panels)."""
    import test_disagg as disagg

    def series(srv, decision):
        """kvc_decisions_total{decision=...} by (outcome, reason)."""
        out = {}
        for k, v in srv.metrics().items():
            m = DECISION.match(k[len("kvc_decisions_total"):]) if k.startswith("kvc_decisions_total{") else None
            if m and m.group(1) == decision:
                out[(m.group(2), m.group(3))] = v
        return out

    both = start_server()
    assert series(both, "admission_probe") == {
        ("admit" if r == "ok" else "refuse", r): 0.0 for r in ("ok", "prompt_too_long", "kv_pool_full", "queue_full")}
    assert series(both, "spill") == {
        (a, r): 0.0 for a, r in (
            ("demote", "host_room"), ("drop_host_entry", "host_full"), ("drop", "no_host_tier"), ("drop", "larger_than_host"),
            ("drop", "host_held_by_newer"))}
    assert series(both, "step_kind") == {
        (k, r): 0.0 for k, r in (
            ("mixed", "no_target"), ("mixed", "no_decodes"), ("mixed", "no_prefill"), ("mixed", "mixed_within_target"),
            ("mixed", "decode_only_over_target"), ("mixed", "backlog"), ("mixed", "interleaved"),
            ("decode_only", "interleave"))}
    d = disagg.start_decode(start_server, start_server(*disagg.prefill_flags()))
    assert series(d, "prefill_path") == {pr: 0.0 for pr in PATH_DECISIONS}
    fallbacks = series(d, "prefill_fallback")
    assert {r for _, r in fallbacks} == {"remote_prefill_failed"} and set(fallbacks.values()) == {0.0}, fallbacks


# Every decision of kvc-policy (kvc_decisions_total{decision,outcome,reason}):
# a worker exports all of them but the router's, the router only its own.
WORKER_DECISIONS = {"seq_admission", "preemption", "admission_probe", "eviction", "write_back", "spill", "host_drop",
                    "session_cap", "prefill_path", "prefill_fallback", "prefill_peer", "snapshot_push", "step_kind",
                    "queue_delay", "step_budget", "kernel_plan", "kv_reuse", "fp8_attention"}
DECISION = re.compile(r'^\{decision="([a-z0-9_]+)",outcome="([a-z0-9_]+)",reason="([a-z0-9_]+)"\}$')


def test_every_decision_label_set_is_exported_at_0_on_a_fresh_server_of_each_role(start_server):
    """The one family's label sets are closed: all at 0 before any traffic."""
    import test_disagg as disagg

    def decisions(srv):
        name = "kvc_decisions_total"
        out = {}
        for k, v in srv.metrics().items():
            if k.startswith(name + "{"):
                m = DECISION.match(k[len(name):])
                assert m, k
                out[m.groups()] = v
        return out

    both = start_server()
    p = start_server(*disagg.prefill_flags())
    d = disagg.start_decode(start_server, p)
    router = start_server("--role", "router", "--cluster-token", disagg.TOKEN, "--decode-peer", d.base_url)
    worker_sets = decisions(both)
    assert {s[0] for s in worker_sets} == WORKER_DECISIONS
    assert set(worker_sets.values()) == {0.0}
    # The labels that tests and the dashboard rely on are among them.
    for s in [("step_kind", "decode_only", "interleave"), ("prefill_path", "remote_prefill", "remote_cheaper"),
              ("prefill_fallback", "local", "remote_prefill_failed"), ("admission_probe", "refuse", "kv_pool_full"),
              ("queue_delay", "refuse", "over_bound"), ("seq_admission", "admit", "admitted"),
              ("eviction", "offload", "idle"), ("write_back", "copy", "below_watermark")]:
        assert s in worker_sets, s
    for srv in (p, d):
        got = decisions(srv)
        assert set(got) == set(worker_sets) and set(got.values()) == {0.0}
    routed = decisions(router)
    assert routed == {("route_score", o, r): 0.0 for o, r in (
        ("place", "session_resident"), ("place", "least_cost"), ("place", "moved_full"), ("place", "moved_unhealthy"),
        ("place", "moved_load"), ("queue", "no_room"), ("refuse", "no_healthy_worker"))}
