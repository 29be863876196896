"""deploy/grafana/kvc.json queries only metrics that kvc exports: every
metric name in the dashboard's PromQL is compared with the /metrics of real
servers of each role (`both`; `prefill` and `decode` over Mooncake TCP;
`router`) after traffic went through all of them (a remote prefill, a
direct append, a session hit, a fallback, a failed snapshot push, an
eviction, a session moved off a dead worker): series of labelled counters
exist only once counted. Histograms count with their `_bucket`,
`_sum` and `_count` series. The dashboard must also cover what an operator
of a P/D deployment needs (latency, KV pool, host tier, reuse, P/D mix,
transfers, fallbacks, router moves, every decision by reason), and be valid Grafana JSON (unique
panel ids, every target on the dashboard's data source variable)."""

from __future__ import annotations

import json
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import test_disagg as disagg
from conftest import ROOT, launch, wait_for

DASHBOARD = ROOT / "deploy" / "grafana" / "kvc.json"
NAME = re.compile(r"\bkvc_[a-zA-Z0-9_]+")
TYPE = re.compile(r"^# (?:TYPE|HELP) (kvc_[a-zA-Z0-9_]+)")
SAMPLE = re.compile(r"^(kvc_[a-zA-Z0-9_]+)[{ ]")
# A query of one decision of the family, and an exported sample's decision.
DECISION_QUERY = re.compile(r'kvc_decisions_total\{[^}]*\bdecision="([a-z_]+)"')
DECISION_SAMPLE = re.compile(r'^kvc_decisions_total\{decision="([a-z_]+)",')

# What the issue asks the dashboard to show, by the metric that shows it.
REQUIRED = {
    "TTFT": "kvc_time_to_first_token_seconds_bucket",
    "ITL": "kvc_inter_token_latency_seconds_bucket",
    "E2E": "kvc_e2e_request_latency_seconds_bucket",
    "queue time": "kvc_request_queue_time_seconds_bucket",
    "KV free": "kvc_kv_blocks_free",
    "KV evictable": "kvc_kv_blocks_evictable",
    "KV cached": "kvc_kv_blocks_cached",
    "host tier": "kvc_host_kv_blocks_free",
    "session hits": "kvc_session_hits_total",
    "prefix hits": "kvc_prefix_cache_hits_total",
    "cold (served - hits)": "kvc_served_requests_total",
    "remote prefill / direct append mix": 'kvc_decisions_total{decision="prefill_path"}',
    "bypass": "kvc_bypass_total",
    "transfer GB/s": "kvc_kv_transfer_bytes_total",
    "fallbacks by reason": 'kvc_decisions_total{decision="prefill_fallback"}',
    "router placements by reason": 'kvc_decisions_total{decision="route_score"}',
    "429s for the queue delay": 'kvc_decisions_total{decision="queue_delay"}',
    "router moves": "kvc_router_session_moves_total",
    "engine stalls": "kvc_engine_stalled_steps_total",
    "oldest waiting request": "kvc_requests_oldest_waiting_seconds",
    "decisions by outcome and reason": "kvc_decisions_total",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def queried(d: dict) -> dict[str, list[str]]:
    """Metric name -> titles of the panels that query it; a query of
    kvc_decisions_total that selects one decision also counts as
    `kvc_decisions_total{decision="..."}`."""
    out: dict[str, list[str]] = {}
    for p in panels(d):
        for t in p.get("targets", []):
            for name in NAME.findall(t["expr"]):
                out.setdefault(name, []).append(p["title"])
            for decision in DECISION_QUERY.findall(t["expr"]):
                out.setdefault(f'kvc_decisions_total{{decision="{decision}"}}', []).append(p["title"])
    return out


def exported(text: str) -> set[str]:
    """Series names a /metrics text exports; a histogram's base name stands
    for its _bucket, _sum and _count."""
    names = set()
    for line in text.splitlines():
        m = TYPE.match(line) or SAMPLE.match(line)
        if m:
            names.add(m.group(1))
        m = DECISION_SAMPLE.match(line)
        if m:
            names.add(f'kvc_decisions_total{{decision="{m.group(1)}"}}')
        if line.startswith("# TYPE ") and line.endswith(" histogram"):
            base = line.split()[2]
            names |= {base + "_bucket", base + "_sum", base + "_count"}
    return names


def test_the_dashboard_is_valid_grafana_json_and_covers_the_operator_questions():
    d = dashboard()
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "instance"}
    for p in panels(d):
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert 'instance=~"$instance"' in t["expr"] or "$instance" not in t["expr"], p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), f"unbalanced PromQL in {p['title']!r}: {t['expr']}"
    names = queried(d)
    missing = {what: m for what, m in REQUIRED.items() if m not in names}
    assert not missing, f"the dashboard shows nothing for {missing}"


@pytest.fixture(scope="module")
def roles(start_server, tmp_path_factory):
    both = start_server()
    p = start_server(*disagg.prefill_flags())
    d = disagg.start_decode(start_server, p)
    router = start_server("--role", "router", "--cluster-token", disagg.TOKEN, "--peer-poll-interval-s", "0.1",
                          "--decode-peer", d.base_url)
    wait_for(lambda: router.metrics().get(f'kvc_router_peer_healthy{{worker="{d.base_url}"}}') == 1.0, 60,
             "the router to see the decode worker healthy")
    # Traffic through every role: turn 1 is prefilled remotely (P -> D over
    # Mooncake), turn 2 appended on D (a session hit); the colocated worker
    # serves a cold request and a prefix hit.
    turn1 = disagg.ids(1, 96)
    turn2 = turn1 + disagg.ids(2, 20)
    for prompt in (turn1, turn2):
        out = disagg.complete(router, prompt, session="dash")
        assert out["kvc"]["path"] in {"remote_prefill", "direct_append"}, out["kvc"]
    for _ in range(2):
        disagg.complete(both, turn1)

    # Failures, so that the series they create exist: a prefill worker
    # killed mid remote prefill (a fallback) and one killed mid snapshot
    # push (a failed push), as in test_disagg.py.
    started = []

    def faulty_prefill(point):
        srv = launch(tmp_path_factory.mktemp("faulty"), *disagg.prefill_flags(), env={"KVC_FAULT_HOLD": point})
        started.append(srv)
        return srv

    def held(srv):
        return 'event="fault_hold"' in Path(srv.log_path).read_text(errors="replace")

    p_a = faulty_prefill("remote_prefill")
    d_a = disagg.start_decode(start_server, p_a)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(disagg.complete, d_a, disagg.ids(3, 200))
        wait_for(lambda: held(p_a), 60, "P to hold mid remote prefill")
        p_a.stop(signal.SIGKILL)
        assert pending.result(timeout=120)["kvc"]["reason"] == "fallback_remote_prefill_failed"
    p_b = faulty_prefill("snapshot_reserve")
    d_b = disagg.start_decode(start_server, p_b, min_remote=100000)
    disagg.complete(d_b, disagg.ids(4, 120), session="push")
    wait_for(lambda: held(p_b), 60, "P to hold mid push")
    p_b.stop(signal.SIGKILL)
    wait_for(lambda: any(k.startswith("kvc_snapshot_push_failed_total") for k in d_b.metrics()), 60, "the failed push")
    # Evictions: a worker whose pool holds about two sessions serves three.
    tiny = start_server("--num-kv-blocks", "24")
    for i in range(3):
        disagg.complete(tiny, disagg.ids(10 + i, 160), session=f"evict-{i}")
    # (Its label sets are exported at 0 from the start: wait for a count.)
    wait_for(lambda: any(k.startswith("kvc_evicted_blocks_total") and v > 0 for k, v in tiny.metrics().items()), 30, "an eviction")
    # A session moved by the router: its worker dies between two turns.
    pair = [start_server("--cluster-token", disagg.TOKEN) for _ in range(2)]
    mover = start_server("--role", "router", "--cluster-token", disagg.TOKEN, "--peer-poll-interval-s", "0.1",
                         *[f for w in pair for f in ("--decode-peer", w.base_url)])
    wait_for(lambda: all(mover.metrics().get(f'kvc_router_peer_healthy{{worker="{w.base_url}"}}') == 1.0 for w in pair), 60,
             "the second router to see both workers healthy")
    body = {"prompt": disagg.ids(20, 40), "max_tokens": 2, "temperature": 0, "session_id": "moving"}
    first = httpx.post(f"{mover.base_url}/v1/completions", json=body, timeout=120)
    assert first.status_code == 200, first.text
    victim = next(w for w in pair if w.base_url == first.headers["x-kvc-worker"])
    victim.stop(signal.SIGKILL)
    second = httpx.post(f"{mover.base_url}/v1/completions", json={**body, "prompt": body["prompt"] + [5, 6]}, timeout=120)
    assert second.status_code == 200 and second.headers["x-kvc-worker"] != victim.base_url, second.text
    yield {"both": both, "prefill": p, "decode": d, "router": router, "decode after a remote prefill failed": d_a,
           "decode after a push failed": d_b, "both with a small pool": tiny, "router after a worker died": mover}
    for srv in started:
        if srv.proc.poll() is None:
            srv.stop(timeout_s=20)


def test_every_metric_the_dashboard_queries_is_exported_by_a_running_server(roles):
    texts = {role: httpx.get(f"{srv.base_url}/metrics", timeout=10).text for role, srv in roles.items()}
    by_role = {role: exported(t) for role, t in texts.items()}
    everywhere = set().union(*by_role.values())
    names = queried(dashboard())
    missing = {n: titles for n, titles in names.items() if n not in everywhere}
    assert not missing, f"the dashboard queries series no role exports: {missing}"
    # Each role's own metrics are on the dashboard (none is left out).
    for role, have in by_role.items():
        assert have & set(names), f"no panel shows anything the {role} role exports"
    # Histograms are queried through their series, never by the bare name.
    histograms = {line.split()[2] for t in texts.values() for line in t.splitlines()
                  if line.startswith("# TYPE ") and line.endswith(" histogram")}
    bare = sorted(n for n in names if n in histograms)
    assert not bare, f"histograms must be queried as _bucket/_sum/_count: {bare}"
