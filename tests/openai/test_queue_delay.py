"""--max-queue-delay-s: a prompt that would wait longer than the bound
behind the prefill already queued is refused at once with 429 in OpenAI's
rate-limit shape (the `openai` client's RateLimitError) with Retry-After;
what was taken completes; an idle server takes everything; every decision
is counted in kvc_decisions_total{decision="queue_delay"}, whose label
sets are exported at 0."""

import os
import subprocess
import threading
import time

import openai
import pytest

from conftest import ROOT, wait_for

# A bound far under one step of the long prompt below: while any of it is
# still to compute, every new prompt would wait longer.
BOUND_S = "0.001"
# Small chunks stretch the long prompt's prefill over many steps.
CHUNK = "32"
LONG = 4000


@pytest.fixture(scope="module")
def bounded(start_server):
    return start_server("--max-queue-delay-s", BOUND_S, "--max-num-batched-tokens", CHUNK)


def decisions(server) -> dict[tuple[str, str], float]:
    """The queue-delay decisions counted, by (outcome, reason)."""
    out = {}
    for k, v in server.metrics().items():
        if k.startswith("kvc_decisions_total{"):
            labels = dict(p.split("=", 1) for p in k[k.index("{") + 1:-1].split(","))
            if labels["decision"] == '"queue_delay"':
                out[(labels["outcome"].strip('"'), labels["reason"].strip('"'))] = v
    return out


def test_every_label_set_is_exported_at_zero_on_a_fresh_server(bounded):
    assert decisions(bounded) == {
        ("admit", "no_bound"): 0,
        ("admit", "no_backlog"): 0,
        ("admit", "rate_unknown"): 0,
        ("admit", "within_bound"): 0,
        ("refuse", "over_bound"): 0,
    }
    m = bounded.metrics()
    assert m["kvc_prefill_backlog_tokens"] == 0
    assert m["kvc_prefill_backlog_drain_tokens_per_second"] == 0


def test_an_idle_server_takes_a_prompt_whatever_the_bound(bounded):
    c = bounded.client()
    r = c.completions.create(model="kvc-default", prompt=[11, 12, 13], max_tokens=2)
    assert r.usage.prompt_tokens == 3
    d = decisions(bounded)
    assert d[("admit", "no_backlog")] + d[("admit", "rate_unknown")] >= 1
    assert d[("refuse", "over_bound")] == 0


def test_a_prompt_behind_a_long_backlog_is_refused_with_429_and_what_was_taken_completes(bounded):
    c = bounded.client()
    long_prompt = [100 + i % 5000 for i in range(LONG)]
    done: dict = {}

    def run_long():
        try:
            started = time.monotonic()
            done["answer"] = c.completions.create(model="kvc-default", prompt=long_prompt, max_tokens=1)
            done["seconds"] = time.monotonic() - started
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            done["error"] = e

    t = threading.Thread(target=run_long)
    t.start()
    # The long prompt is queued and its drain rate measured.
    wait_for(lambda: (m := bounded.metrics())["kvc_prefill_backlog_tokens"] > 0
             and m["kvc_prefill_backlog_drain_tokens_per_second"] > 0 or "answer" in done or "error" in done,
             120, "the long prompt's backlog and its drain rate")
    refused = []
    taken = 0
    # Probe until one is refused or the long prompt is done: with the bound
    # under one step, any probe sent while its backlog remains is refused.
    while t.is_alive() and not refused:
        try:
            c.completions.create(model="kvc-default", prompt=[21, 22, 23], max_tokens=1)
            taken += 1
        except openai.RateLimitError as e:
            refused.append(e)
    t.join(timeout=300)
    assert "error" not in done, done.get("error")
    assert done["answer"].usage.prompt_tokens == LONG
    assert done["answer"].choices[0].finish_reason == "length"
    assert refused, f"no probe was refused while {LONG} prompt tokens were queued ({taken} taken)"
    e = refused[0]
    assert e.status_code == 429
    assert e.body["code"] == "queue_delay_exceeded"
    assert e.body["type"] == "rate_limit_error"
    assert "--max-queue-delay-s" in e.body["message"]
    assert 1 <= int(e.response.headers["retry-after"]) <= 60
    d = decisions(bounded)
    assert d[("refuse", "over_bound")] == len(refused)
    # The rate the wait was estimated from is the rate the client saw the
    # long prompt computed at (its request's time: an upper bound on its
    # prefill's), within the spread of a few probes computed beside it.
    seen = LONG / done["seconds"]
    rate = bounded.metrics()["kvc_prefill_backlog_drain_tokens_per_second"]
    assert 0.5 * seen <= rate <= 3 * seen, (rate, seen)
    # Once the backlog has drained, prompts are taken again.
    bounded.wait_idle()
    r = c.completions.create(model="kvc-default", prompt=[31, 32, 33], max_tokens=1)
    assert r.usage.prompt_tokens == 3
    assert decisions(bounded)[("refuse", "over_bound")] == len(refused)


def test_a_server_without_the_bound_counts_no_bound(server):
    before = decisions(server).get(("admit", "no_bound"), 0)
    server.client().completions.create(model="kvc-default", prompt=[41, 42], max_tokens=1)
    assert decisions(server)[("admit", "no_bound")] == before + 1


def test_the_router_refuses_the_flag_by_name():
    binary = os.environ.get("KVC_SERVER_BIN", str(ROOT / "target" / "debug" / "kvc-server"))
    p = subprocess.run([binary, "--role", "router", "--decode-peer", "http://127.0.0.1:9", "--max-queue-delay-s", "5"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "--max-queue-delay-s" in p.stderr + p.stdout
