"""Reproducible seeds (issue 33, item 4): with `seed`, a request's sampled
tokens do not depend on what else is batched with it or on whether its
prompt's prefix came from the prefix cache.

The reference for each request is the same request run alone on a fresh
server (nothing cached, nothing beside it). The tests run it again on other
fresh servers, beside concurrent requests and after another request cached
its prefix, and compare the sampled tokens and their logprobs: on the CPU a
sequence's logits are bitwise the same in every batch
(crates/model-qwen3/src/row_invariant.rs), so the logprobs are equal too,
not just close.

`system_fingerprint` is on every response and streamed chunk, the same for
two processes of one build and model, different for other weights."""

import random
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

IGNORE_EOS = {"ignore_eos": True}
MAX_TOKENS = 40


def ids(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(100, 150_000) for _ in range(n)]


PREFIX = ids(1, 120)  # 7 full blocks of 16 and change
# Each case's own prompt (the shared prefix, its own suffix) and sampling.
CASES = {
    "temperature": (PREFIX + ids(2, 9), dict(temperature=1.0, seed=11)),
    "top_p": (PREFIX + ids(3, 9), dict(temperature=1.0, top_p=0.9, seed=12)),
    "top_k_min_p": (PREFIX + ids(4, 9), dict(temperature=1.3, seed=13, extra={"top_k": 50, "min_p": 0.02})),
}


def complete(client, name):
    """Case `name` on `client`: (tokens, their logprobs, cached prompt
    tokens)."""
    prompt, kw = CASES[name]
    kw = dict(kw)
    extra = {**IGNORE_EOS, **kw.pop("extra", {})}
    r = client.completions.create(model="kvc-default", prompt=prompt, max_tokens=MAX_TOKENS, logprobs=1,
                                  extra_body=extra, **kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == MAX_TOKENS
    details = r.usage.prompt_tokens_details
    return lp.tokens, lp.token_logprobs, (details.cached_tokens if details else 0) or 0


@pytest.fixture(scope="module")
def reference(start_server):
    """Each case alone on a fresh server, one after another (their prompts
    share a prefix: each runs on a server of its own so none hits the
    cache), and that server's fingerprint."""
    out, fingerprint = {}, None
    for name in CASES:
        srv = start_server()
        tokens, logprobs, cached = complete(srv.client(), name)
        assert cached == 0
        out[name] = (tokens, logprobs)
        fingerprint = srv.client().completions.create(model="kvc-default", prompt="x", max_tokens=1).system_fingerprint
        srv.stop()
    return out, fingerprint


def test_a_seeded_request_after_another_cached_its_prefix_draws_the_reference_tokens(start_server, reference):
    refs, _ = reference
    srv = start_server()
    c = srv.client()
    for name in CASES:
        # Another request with the same 120-token prefix (and another seed)
        # runs first; its full blocks go to the prefix cache.
        other = c.completions.create(model="kvc-default", prompt=PREFIX + ids(50, 20), max_tokens=4,
                                     temperature=1.0, seed=99)
        assert other.choices[0].text is not None
        tokens, logprobs, cached = complete(c, name)
        assert cached >= 112, f"{name}: the prefix did not come from the cache ({cached} tokens)"
        assert tokens == refs[name][0], name
        assert logprobs == refs[name][1], name


def test_seeded_requests_beside_concurrent_ones_draw_the_reference_tokens(start_server, reference):
    refs, _ = reference
    srv = start_server()
    c = srv.client()
    # Long unseeded streams, each seen running (its first chunk received)
    # before any seeded request is sent.
    streams = [
        c.completions.create(model="kvc-default", prompt=ids(200 + i, 30 + 40 * i), max_tokens=2000,
                             temperature=1.0, stream=True, extra_body=IGNORE_EOS)
        for i in range(3)
    ]
    for s in streams:
        next(iter(s))
    # The seeded cases at once, beside a long prompt's prefill.
    jobs = {name: (lambda n=name: complete(c, n)) for name in CASES}
    jobs["prefill"] = lambda: c.completions.create(model="kvc-default", prompt=ids(300, 700), max_tokens=8,
                                                   temperature=1.0)
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results = {name: f.result() for name, f in futures.items()}
    # Still running now: the streams ran beside every seeded request.
    assert srv.metrics()["kvc_requests_running"] >= len(streams)
    for s in streams:
        s.close()
    for name in CASES:
        tokens, logprobs, _ = results[name]
        assert tokens == refs[name][0], name
        assert logprobs == refs[name][1], name


FINGERPRINT = re.compile(r"fp_[0-9a-f]{12}")


def test_system_fingerprint_is_on_every_response_and_chunk(start_server, reference):
    _, first = reference
    srv = start_server()
    c = srv.client()
    msgs = [{"role": "user", "content": "Hi"}]
    seen = [
        c.chat.completions.create(model="kvc-default", messages=msgs, max_tokens=3).system_fingerprint,
        c.completions.create(model="kvc-default", prompt="Hi", max_tokens=3).system_fingerprint,
    ]
    for stream in (
        c.chat.completions.create(model="kvc-default", messages=msgs, max_tokens=3, stream=True,
                                  stream_options={"include_usage": True}),
        c.completions.create(model="kvc-default", prompt="Hi", max_tokens=3, stream=True,
                             stream_options={"include_usage": True}),
    ):
        chunks = list(stream)
        assert len(chunks) >= 2
        seen += [chunk.system_fingerprint for chunk in chunks]
    assert FINGERPRINT.fullmatch(seen[0]), seen[0]
    assert set(seen) == {seen[0]}
    # Another process of the same build and model: the same fingerprint.
    assert seen[0] == first
    # Other weights (dummy weights from another seed): another fingerprint.
    other = start_server("--seed", "1")
    fp = other.client().completions.create(model="kvc-default", prompt="Hi", max_tokens=1).system_fingerprint
    assert FINGERPRINT.fullmatch(fp) and fp != first
