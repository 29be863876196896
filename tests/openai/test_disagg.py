"""Prefill/decode disaggregation end to end: separate `kvc-server`
processes on 127.0.0.1, KV over the Mooncake TCP transport, the embedded
model on CPU. Every answer must equal a colocated (`--role both`) worker's
greedy answer, whatever path the KV took (remote prefill, direct append,
bypass, fallback).

Prompts are token ids, so the tests know exactly which tokens a worker
holds: a later turn extends the earlier prompt (the session keeps it), and
the engine reuses whole 16-token blocks.
"""

from __future__ import annotations

import os
import random
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import launch, wait_for

BS = 16
TOKEN = "t"
# Suffixes of at least this many tokens go to the prefill worker
# (`threshold` policy: the classic deployment, deterministic for tests).
MIN_REMOTE = 64


def prefill_flags(*extra: str) -> list[str]:
    return ["--role", "prefill", "--cluster-token", TOKEN, "--num-kv-blocks", "4096", *extra]


def decode_flags(p, *extra: str, min_remote: int = MIN_REMOTE, blocks: int = 2048) -> list[str]:
    return ["--role", "decode", "--cluster-token", TOKEN, "--remote-prefill-min-tokens", str(min_remote),
            "--remote-prefill-policy", "threshold", "--prefill-peer", p.base_url, "--snapshot-min-tokens", "64",
            "--peer-poll-interval-s", "0.1", "--num-kv-blocks", str(blocks), *extra]


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150000) for _ in range(n)]


def complete(server, prompt, session=None, max_tokens=8):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if session is not None:
        body["session_id"] = session
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert r.headers["x-kvc-path"] == out["kvc"]["path"]
    return out


def text(out) -> str:
    return out["choices"][0]["text"]


def wait_healthy_peer(d):
    wait_for(lambda: d.metrics().get(f'kvc_prefill_peer_healthy{{peer="{PEER[d]}"}}') == 1.0, 30, "a healthy prefill peer")


PEER: dict = {}


def start_decode(start_server, p, *extra, min_remote: int = MIN_REMOTE, blocks: int = 2048):
    d = start_server(*decode_flags(p, *extra, min_remote=min_remote, blocks=blocks))
    PEER[d] = p.base_url
    wait_healthy_peer(d)
    return d


def decided(m: dict[str, float], decision: str, reason: str, outcome: str | None = None) -> float:
    """A /metrics' count of `decision` with `reason` (kvc_decisions_total),
    of one outcome, or of all when none is given."""
    head = f'kvc_decisions_total{{decision="{decision}",outcome="'
    tail = f'",reason="{reason}"}}'
    return sum(v for k, v in m.items() if k.startswith(head) and k.endswith(tail)
               and (outcome is None or k == f"{head}{outcome}{tail}"))


def snapshot(p, session) -> dict:
    return httpx.get(f"{p.base_url}/v1/sessions/{session}/snapshot", timeout=10).json()


def snapshot_tokens(p, session) -> int:
    r = snapshot(p, session)
    return r["tokens"] if r["exists"] else 0


@pytest.fixture(scope="module")
def both(start_server):
    return start_server("--num-kv-blocks", "4096")


def test_1p1d_twenty_sessions_match_a_colocated_worker(start_server, both):
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)

    def session(i: int):
        sid = f"pd-{i}"
        turns = [ids(i, 96 + BS * (i % 4))]
        turns.append(turns[0] + ids(1000 + i, 20))
        turns.append(turns[1] + ids(2000 + i, 37))
        got = []
        for t, prompt in enumerate(turns):
            out = complete(d, prompt, session=sid)
            want = complete(both, prompt)
            got.append((t, prompt, out, text(want)))
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(session, range(20)))
    for turns in results:
        for t, prompt, out, want in turns:
            assert text(out) == want, f"turn {t}: output differs from the colocated worker"
            k = out["kvc"]
            if t == 0:
                assert k["path"] == "remote_prefill" and k["reason"] == "suffix_above_threshold"
                assert k["transferred_tokens"] == len(prompt)
            else:
                previous = turns[t - 1][1]
                held = len(previous) // BS * BS
                assert k["path"] == "direct_append", k
                assert k["computed_tokens"] == len(prompt) - held, "only the new suffix (and its partial block) is computed"
                assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == held
    m = d.metrics()
    assert decided(m, "prefill_path", "suffix_above_threshold", "remote_prefill") == 20
    assert decided(m, "prefill_path", "suffix_below_threshold", "direct_append") == 40
    assert m['kvc_remote_prefill_total{outcome="ok"}'] == 20
    # Every turn's commit pushed (or offered) the session's new blocks.
    wait_for(lambda: d.metrics().get("kvc_snapshot_push_sent_total", 0) >= 20, 60, "snapshot pushes")
    d.wait_idle()


def test_a_moved_or_restarted_session_comes_back_by_bypass(start_server, both, tmp_path):
    p = start_server(*prefill_flags())
    d1 = start_decode(start_server, p)
    d2 = start_decode(start_server, p)
    sid = "moving"
    t1 = ids(7, 96)
    t2 = t1 + ids(8, 60)
    paths = [complete(d1, prompt, session=sid) for prompt in (t1, t2)]
    assert [o["kvc"]["path"] for o in paths] == ["remote_prefill", "direct_append"]
    assert [text(o) for o in paths] == [text(complete(both, t)) for t in (t1, t2)]
    # D1 committed 156 prompt tokens + 7 of output: 10 full blocks, the
    # last 4 of them new to P (which kept turn 1's 6 from its own prefill).
    wait_for(lambda: snapshot_tokens(p, sid) == 160, 60, "P's snapshot of the session")

    # The next turn lands on D2, which never saw the session.
    t3 = t2 + ids(9, 40)
    out = complete(d2, t3, session=sid)
    assert text(out) == text(complete(both, t3)), "a moved session answers as if it never moved"
    k = out["kvc"]
    assert k["path"] == "bypass", k
    # The snapshot's last block holds turn 2's output, which turn 3 does not
    # repeat: P reuses the whole blocks of the common prefix (t2).
    covered = len(t2) // BS * BS
    assert k["computed_tokens"] == len(t3) - covered, "P computed only what the snapshot does not cover"
    assert k["transferred_tokens"] == len(t3)

    # D1 restarts (loses everything); its next turn comes back through P.
    d1.stop(signal.SIGKILL)
    d1 = start_decode(start_server, p)
    wait_for(lambda: snapshot_tokens(p, sid) >= 192, 60, "D2's push of turn 3")
    covered = min(snapshot_tokens(p, sid), len(t3)) // BS * BS
    t4 = t3 + ids(10, 50)
    out = complete(d1, t4, session=sid)
    assert text(out) == text(complete(both, t4))
    assert out["kvc"]["path"] == "bypass"
    assert out["kvc"]["computed_tokens"] == len(t4) - covered
    m = p.metrics()
    assert m['kvc_bypass_total{result="hit"}'] >= 2
    assert m["kvc_snapshot_ingested_total"] >= 2


def test_a_snapshot_store_smaller_than_its_sessions_serves_bypass_from_the_host_tier(start_server, both):
    """Issue 20 item 3: P's snapshot store holds 16 device blocks; four
    sessions of 8 blocks are pushed to it, so the two oldest are demoted to
    P's host tier (still listed, still servable). A later turn of the oldest
    on a decode worker that never saw it is served by bypass: P copies the
    session's blocks back from host memory instead of recomputing them."""
    p = start_server(*prefill_flags("--snapshot-store-blocks", "16"))
    # Turns computed on D1 (never remote), which then pushes each session to P.
    d1 = start_decode(start_server, p, min_remote=100000)
    sessions = [f"spill-{i}" for i in range(4)]
    first = {s: ids(700 + i, 128) for i, s in enumerate(sessions)}
    for s in sessions:
        assert text(complete(d1, first[s], session=s)) == text(complete(both, first[s]))
        # 128 + 7 committed tokens: 8 full blocks, pushed before the next session.
        wait_for(lambda: snapshot_tokens(p, s) == 128, 60, f"P's snapshot of {s}")
    tiers = {s: snapshot(p, s)["tier"] for s in sessions}
    assert tiers == {"spill-0": "host", "spill-1": "host", "spill-2": "device", "spill-3": "device"}, tiers
    m = p.metrics()
    assert (m['kvc_snapshot_store_blocks{tier="device"}'], m['kvc_snapshot_store_blocks{tier="host"}']) == (16, 16)
    assert decided(m, "spill", "host_room", "demote") == 2
    assert m["kvc_snapshot_evicted_total"] == 0, "nothing was dropped"

    # The oldest session's next turn lands on D2, which holds nothing.
    d2 = start_decode(start_server, p)
    t2 = first["spill-0"] + ids(799, 40)
    out = complete(d2, t2, session="spill-0")
    assert text(out) == text(complete(both, t2)), "served from the host tier, the answer is unchanged"
    k = out["kvc"]
    assert k["path"] == "bypass", k
    assert k["computed_tokens"] == len(t2) - 128, "P computed only what the snapshot does not cover"
    m = p.metrics()
    assert m['kvc_snapshot_bypass_hits_total{tier="host"}'] == 1
    assert m['kvc_snapshot_bypass_hits_total{tier="device"}'] == 0
    assert m["kvc_snapshot_restored_blocks_total"] == 8
    assert m['kvc_bypass_total{result="hit"}'] == 1
    assert m['kvc_host_tier_bytes_total{direction="to_device"}'] > 0
    # Room for it was made by demoting the least recently used device entry.
    assert snapshot(p, "spill-2")["tier"] == "host"
    assert all(snapshot(p, s)["exists"] for s in sessions)
    d2.wait_idle()


def test_prefill_worker_killed_mid_transfer_falls_back_without_changing_answers(start_server, both, monkeypatch):
    # P holds right after computing, before writing into D's blocks.
    monkeypatch.setenv("KVC_FAULT_HOLD", "remote_prefill")
    p = start_server(*prefill_flags())
    monkeypatch.delenv("KVC_FAULT_HOLD")
    d = start_decode(start_server, p)
    prompt = ids(11, 200)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(complete, d, prompt, "fault-1")
        wait_for(lambda: 'event="fault_hold"' in Path(p.log_path).read_text(errors="replace"), 60, "P to hold mid remote prefill")
        p.stop(signal.SIGKILL)
        out = pending.result(timeout=120)
    assert text(out) == text(complete(both, prompt))
    assert out["kvc"]["reason"] == "fallback_remote_prefill_failed"
    m = d.metrics()
    assert decided(m, "prefill_fallback", "remote_prefill_failed") == 1
    assert m['kvc_remote_prefill_total{outcome="failed"}'] == 1
    # With P gone, D serves alone: later turns are direct appends, answers unchanged.
    wait_for(lambda: d.metrics().get(f'kvc_prefill_peer_healthy{{peer="{p.base_url}"}}') == 0.0, 30, "P marked unhealthy")
    t2 = prompt + ids(12, 100)
    out = complete(d, t2, session="fault-1")
    assert text(out) == text(complete(both, t2))
    assert out["kvc"]["reason"] == "prefill_peer_unhealthy"
    d.wait_idle()


def test_prefill_worker_killed_during_a_snapshot_push_changes_nothing(start_server, both, monkeypatch):
    # P holds after setting blocks aside for a push, before D writes them.
    monkeypatch.setenv("KVC_FAULT_HOLD", "snapshot_reserve")
    p = start_server(*prefill_flags())
    monkeypatch.delenv("KVC_FAULT_HOLD")
    # Prompts stay below the threshold: computed on D, which then pushes.
    d = start_decode(start_server, p, min_remote=100000)
    t1 = ids(13, 120)
    assert text(complete(d, t1, session="push-fault")) == text(complete(both, t1))
    wait_for(lambda: 'event="fault_hold"' in Path(p.log_path).read_text(errors="replace"), 60, "P to hold mid push")
    p.stop(signal.SIGKILL)
    wait_for(lambda: d.metrics().get('kvc_snapshot_push_failed_total{reason="reserve_failed"}') == 1, 60, "the failed push to be counted")
    t2 = t1 + ids(14, 30)
    out = complete(d, t2, session="push-fault")
    assert text(out) == text(complete(both, t2))
    assert out["kvc"]["path"] == "direct_append"
    assert d.metrics()["kvc_snapshot_push_enqueued_total"] >= 1
    d.wait_idle()


def test_worker_routes_refuse_calls_without_the_cluster_token(start_server):
    p = start_server(*prefill_flags())
    r = httpx.post(f"{p.base_url}/internal/prefill", json={})
    assert r.status_code in (401, 403) and "error" in r.json()
    r = httpx.post(f"{p.base_url}/internal/prefill", json={"bad": 1}, headers={"x-kvc-cluster-token": TOKEN})
    assert 400 <= r.status_code < 500 and "error" in r.json()
    assert httpx.get(f"{p.base_url}/v1/sessions/none/snapshot").json() == {"exists": False, "tokens": 0, "age_s": 0.0}


def test_cache_salt_reaches_the_prefill_worker(start_server):
    """A remote prefill carries the request's `cache_salt`: P's prefix
    cache is shared only within a salt, as D's is."""
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    prompt = ids(91, 160)

    def run(salt):
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "cache_salt": salt}
        r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    first = run("salt-a")
    assert first["kvc"]["path"] == "remote_prefill"
    reused = p.metrics().get("kvc_prompt_tokens_reused_total", 0.0)
    second = run("salt-b")
    assert second["kvc"]["path"] == "remote_prefill", "D's cache does not serve another salt"
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert p.metrics().get("kvc_prompt_tokens_reused_total", 0.0) == reused, "P reused salt-a blocks for salt-b"
    assert text(second) == text(first), "the same answer either way"


def test_1p2d_behind_the_router_moves_a_full_workers_session_by_bypass(start_server, both):
    p = start_server(*prefill_flags())
    # D1 holds 40 blocks (640 tokens) and is listed first (equal scores go to it).
    d1 = start_decode(start_server, p, blocks=40)
    d2 = start_decode(start_server, p)
    router = start_server("--role", "router", "--cluster-token", TOKEN, "--peer-poll-interval-s", "0.1",
                          "--decode-peer", d1.base_url, "--decode-peer", d2.base_url)
    wait_for(lambda: all(router.metrics().get(f'kvc_router_peer_healthy{{worker="{d.base_url}"}}') == 1 for d in (d1, d2)),
             60, "the router to see both decode workers")

    def via_router(prompt, session):
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "session_id": session}
        r = httpx.post(f"{router.base_url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.headers["x-kvc-worker"], r.json()

    t1 = ids(21, 200)
    where, out = via_router(t1, "big-session")
    assert where == d1.base_url and out["kvc"]["path"] == "remote_prefill"
    assert text(out) == text(complete(both, t1))
    wait_for(lambda: snapshot_tokens(p, "big-session") >= 192, 60, "P's snapshot")
    # Turn 2 outgrows D1's pool: the router moves the session to D2, which
    # gets the covered prefix from P's snapshot.
    t2 = t1 + ids(22, 600)
    where, out = via_router(t2, "big-session")
    assert where == d2.base_url
    assert out["kvc"]["path"] == "bypass", out["kvc"]
    assert out["kvc"]["computed_tokens"] == len(t2) - 192
    assert text(out) == text(complete(both, t2))
    # Other sessions keep working on both workers; every request succeeds.
    for i in range(6):
        prompt = ids(30 + i, 100 + 40 * i)
        _, out = via_router(prompt, f"other-{i}")
        assert text(out) == text(complete(both, prompt))
    m = router.metrics()
    assert m['kvc_router_session_moves_total{reason="moved_full"}'] == 1
    assert sum(v for k, v in m.items() if k.startswith("kvc_router_requests_total") and 'status="200"' in k) == 8


STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["read", "write", "search"]},
        "args": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 8}},
        "line": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["action", "args", "line"],
    "additionalProperties": False,
}


def test_structured_output_through_a_remote_prefill_matches_a_colocated_worker(start_server, both):
    # The prefill worker samples the first token under the same grammar (it
    # travels in the sampling parameters) and the decode worker advances its
    # own matcher over it: the answer equals a colocated worker's for the
    # same seed, and it validates.
    import json

    import jsonschema

    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    for seed in range(6):
        body = {"prompt": ids(500 + seed, 96), "max_tokens": 200, "temperature": 1.0, "seed": seed,
                "guided_json": STRUCTURED_SCHEMA}
        r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["kvc"]["path"] == "remote_prefill"
        want = httpx.post(f"{both.base_url}/v1/completions", json=body, timeout=300).json()
        assert text(out) == text(want)
        assert out["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(text(out)), STRUCTURED_SCHEMA)


def test_several_choices_on_a_decode_worker_are_computed_there_and_say_so(start_server, both):
    """Issue 32: `n` > 1 on a decode worker ran locally without a word (the
    request said nothing of its path). It is a decision now: computed here
    once for all choices, `kvc.reason` `multiple_choices`, counted; the
    choices are those of a colocated worker."""
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    prompt = ids(77, 200)
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "n": 2}
    before = decided(d.metrics(), "prefill_path", "multiple_choices", "local")
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["kvc"]["path"] == "local" and out["kvc"]["reason"] == "multiple_choices", out["kvc"]
    assert r.headers["x-kvc-path"] == "local"
    want = httpx.post(f"{both.base_url}/v1/completions", json=body, timeout=300).json()
    assert [c["text"] for c in out["choices"]] == [c["text"] for c in want["choices"]]
    assert decided(d.metrics(), "prefill_path", "multiple_choices", "local") == before + 1
    # One choice still goes the usual way (another prompt: this one is in
    # D's prefix cache now).
    assert complete(d, ids(78, 200))["kvc"]["path"] == "remote_prefill"


def test_scoring_on_a_decode_worker_is_computed_there_and_says_so(start_server, both):
    """Issue 33: echo + logprobs needs the prompt's logits, which a remote
    prefill (KV only) cannot return: computed here, `kvc.reason`
    `prompt_logprobs`, counted; the same scores as a colocated worker's."""
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    body = {"prompt": ids(79, 200), "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    before = decided(d.metrics(), "prefill_path", "prompt_logprobs", "local")
    r = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["kvc"]["path"] == "local" and out["kvc"]["reason"] == "prompt_logprobs", out["kvc"]
    want = httpx.post(f"{both.base_url}/v1/completions", json=body, timeout=300).json()
    got_lp, want_lp = out["choices"][0]["logprobs"]["token_logprobs"], want["choices"][0]["logprobs"]["token_logprobs"]
    assert len(got_lp) == 201 and got_lp[0] is None
    assert all(abs(a - b) < 1e-4 for a, b in zip(got_lp[1:], want_lp[1:]))
    assert decided(d.metrics(), "prefill_path", "prompt_logprobs", "local") == before + 1


def test_an_fp8_kv_pair_moves_half_of_bf16s_bytes_and_answers_as_a_colocated_worker_of_its_dtype(start_server):
    """`--kv-cache-dtype fp8` on both sides of a P/D pair: the prompt's KV
    moves as e4m3 (half of bf16's bytes per token) and the decode worker
    answers as a colocated worker with the same cache dtype."""
    per_token = {}
    for kv in ("bf16", "fp8"):
        colocated = start_server("--num-kv-blocks", "4096", "--kv-cache-dtype", kv)
        p = start_server(*prefill_flags("--kv-cache-dtype", kv))
        d = start_decode(start_server, p, "--kv-cache-dtype", kv)
        prompt = ids(77, 160)
        out = complete(d, prompt, session=f"kv-{kv}")
        assert out["kvc"]["path"] == "remote_prefill", out["kvc"]
        assert text(out) == text(complete(colocated, prompt)), f"{kv}: output differs from the colocated worker"
        sent = p.metrics()['kvc_kv_transfer_bytes_total{kind="remote_prefill"}']
        per_token[kv] = sent / out["kvc"]["transferred_tokens"]
        d.wait_idle()
    assert per_token["fp8"] * 2 == per_token["bf16"], per_token


@pytest.mark.parametrize("flag,value,field", [
    # Other KV bytes: a bf16 pool and an e4m3 one.
    ("--kv-cache-dtype", "fp8", "dtype"),
    # The same layout, but the prefill worker quantizes its weights at
    # load: its KV would be another model's.
    ("--quantization", "fp8", "weights"),
])
def test_a_pair_that_differs_is_refused_at_the_handshake_naming_the_field_and_answers_locally(
        start_server, both, flag, value, field):
    p = start_server(*prefill_flags(flag, value))
    d = start_decode(start_server, p)
    prompt = ids(78, 160)
    out = complete(d, prompt, session=f"{field}-mismatch")
    assert out["kvc"]["path"] != "remote_prefill", out["kvc"]
    assert text(out) == text(complete(both, prompt))
    assert f"incompatible KV peer: {field} is " in d.log_tail() + p.log_tail(), d.log_tail()
