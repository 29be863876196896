"""Scoring on /v1/completions as vLLM serves it to lm-eval: `echo` with
`logprobs` returns the prompt's token logprobs (the first is null),
`max_tokens: 0` with `echo` scores without generating, a list of prompts is
a batch with `n` choices per prompt in order, and `best_of` returns the `n`
candidates with the highest mean logprob.

The independent reference for a token's logprob is the server's decode
path, not its scoring path: a request for the context alone, `max_tokens:
1`, `logit_bias` +100 on the token, whose reported logprob is the model's
raw one (vLLM's default, as kvc reports it). Scoring runs every prompt row
through the LM head in slices on the prefill side; the reference samples
the last row of a plain prefill.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from operator import itemgetter

import httpx
import openai
import pytest

from conftest import ROOT

TOL = 1e-3

# A small multiple-choice set in lm-eval's shape: (context, continuations).
ITEMS = [
    ("Question: What color is the sky on a clear day?\nAnswer:", [" blue", " green", " red"]),
    ("The capital of France is", [" Paris", " Berlin", " a city on the Seine"]),
    ("2 + 2 =", [" 4", " 5", " twenty-two"]),
    ("Water freezes at", [" 0 degrees Celsius", " 100 degrees Celsius"]),
]


@cache
def vocab() -> dict[str, int]:
    """The embedded model's vocabulary (the tokenizer.json the server
    embeds): byte-level BPE piece -> id, added tokens included."""
    path = ROOT / "crates" / "text-front" / "assets" / "qwen3" / "tokenizer.json.gz"
    t = json.loads(gzip.decompress(path.read_bytes()))
    return {**t["model"]["vocab"], **{a["content"]: a["id"] for a in t["added_tokens"]}}


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet (Qwen3's vocabulary writes bytes so)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(extra)) for b in range(256)}


def token_id(text: str) -> int:
    """The id of a token reported as `text` (its bytes as UTF-8)."""
    assert "\ufffd" not in text, f"token {text!r} is part of a character: choose another text"
    return vocab()["".join(byte_alphabet()[b] for b in text.encode())]


_ENCODED: dict[str, list[int]] = {}


def encode(text: str) -> list[int]:
    """`text`'s token ids as the server's tokenizer (Qwen3's, which
    lm-eval's Hugging Face backend would load) splits it: the tokens of an
    echo (max_tokens 0, logprobs 0), mapped to ids through the vocabulary."""
    if text not in _ENCODED:
        r = httpx.post(f"{_SERVER[0].base_url}/v1/completions",
                       json={"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 0}, timeout=120)
        assert r.status_code == 200, r.text
        _ENCODED[text] = [token_id(t) for t in r.json()["choices"][0]["logprobs"]["tokens"]]
    return _ENCODED[text]


_SERVER: list = []


@pytest.fixture(autouse=True)
def _encoder(server):
    _SERVER[:] = [server]


def encode_pair(context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's `_encode_pair` for causal models: trailing spaces of the
    context move to the continuation; the continuation's tokens are those of
    the whole after the context's."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx):]


def lm_eval_payload(model: str, inputs: list[list[int]]) -> dict:
    """lm-eval's local-completions loglikelihood request (`_create_payload`
    with generate=False) for a batch of token lists."""
    return {"model": model, "prompt": inputs, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}


def lm_eval_parse(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval's `parse_logprobs`: the continuation's summed logprobs (the
    last entry is the generated token) and whether it is greedy."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        res.append((sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops))))
    return res


def reference_logprob(server, model: str, context: list[int], token: int) -> tuple[float, bool]:
    """log p(token | context) from the decode path, and whether `token` is
    the model's most likely next token."""
    body = {"model": model, "prompt": context, "max_tokens": 1, "temperature": 0, "logprobs": 1,
            "logit_bias": {str(token): 100}}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    chosen, best = lp["token_logprobs"][0], max(lp["top_logprobs"][0].values())
    return chosen, chosen >= best


def post(server, body: dict) -> dict:
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_lm_eval_loglikelihood_requests_match_an_independent_reference(server, model):
    """Requests built as lm-eval's local-completions builds them (token
    lists, batched, echo, max_tokens 1, logprobs 1): every (context,
    continuation)'s loglikelihood and is_greedy equal the decode path's."""
    pairs = [encode_pair(ctx, cont) for ctx, conts in ITEMS for cont in conts]
    inputs, ctxlens = [c + k for c, k in pairs], [len(c) for c, _ in pairs]
    out = post(server, lm_eval_payload(model, inputs))
    assert [c["index"] for c in out["choices"]] == list(range(len(inputs)))
    assert out["usage"]["prompt_tokens"] == sum(map(len, inputs))
    got = lm_eval_parse(out, ctxlens)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        refs = [reference_logprob(server, model, ctx + cont[:i], t) for i, t in enumerate(cont)]
        assert abs(ll - sum(r[0] for r in refs)) < TOL, (ctx, cont, ll, refs)
        assert greedy == all(r[1] for r in refs)


def test_a_greedy_continuation_is_greedy_and_scores_its_own_generation_logprobs(server, model):
    """Echo-scoring a prompt followed by the model's own greedy tokens gives
    back the generation's logprobs (decode path vs scoring path), and
    lm-eval calls the continuation greedy."""
    ctx = encode("Once upon a time")
    gen = post(server, {"model": model, "prompt": ctx, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                        "ignore_eos": True, "skip_special_tokens": False})
    gen_lp = gen["choices"][0]["logprobs"]
    cont = [token_id(t) for t in gen_lp["tokens"]]
    out = post(server, lm_eval_payload(model, [ctx + cont]))
    scored = out["choices"][0]["logprobs"]["token_logprobs"][len(ctx):-1]
    assert len(scored) == 6
    assert all(abs(a - b) < TOL for a, b in zip(scored, gen_lp["token_logprobs"])), (scored, gen_lp["token_logprobs"])
    assert lm_eval_parse(out, [len(ctx)])[0][1] is True


def test_echo_with_logprobs_has_the_openai_shape(client, model):
    prompt = "The quick brown fox"
    ids = encode(prompt)
    r = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    lp = c.logprobs
    assert c.text.startswith(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids) + 3
    assert "".join(lp.tokens[: len(ids)]) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    # The token itself and the best 2 alternatives.
    assert all(2 <= len(t) <= 3 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(prompt)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3


def test_max_tokens_zero_with_echo_scores_without_generating(client, model):
    prompt = "Scoring only, nothing generated"
    ids = encode(prompt)
    r = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=0, max_tokens=0)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    assert len(c.logprobs.token_logprobs) == len(ids) and c.logprobs.token_logprobs[0] is None
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    # The same scores as with max_tokens 1 (lm-eval's request), less the
    # generated token.
    one = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=0, max_tokens=1, temperature=0)
    assert one.choices[0].logprobs.token_logprobs[:-1] == c.logprobs.token_logprobs
    # Without echo there is nothing to return: refused, naming the field.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=prompt, max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def test_a_stream_sends_the_echo_and_prompt_logprobs_with_the_first_token(client, model):
    kw = dict(model=model, prompt="Streaming the echo", echo=True, logprobs=1, max_tokens=4, temperature=0,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    chunks = [ch for ch in client.completions.create(stream=True, **kw) if ch.choices]
    assert chunks[0].choices[0].text.startswith("Streaming the echo")
    assert "".join(ch.choices[0].text for ch in chunks) == whole.text
    streamed = [x for ch in chunks if ch.choices[0].logprobs for x in ch.choices[0].logprobs.token_logprobs]
    assert streamed == whole.logprobs.token_logprobs


def test_chunked_prefill_and_a_cached_prefix_score_the_same(server, start_server, model):
    """A prompt prefilled in chunks of 16 tokens, and one whose prefix the
    cache holds, are scored as a prompt computed at once."""
    ids = encode(" ".join(f"word{i}" for i in range(40)))
    assert len(ids) > 64
    body = {"model": model, "prompt": ids, "echo": True, "logprobs": 3, "max_tokens": 0}
    fresh = post(server, body)["choices"][0]["logprobs"]
    chunked_server = start_server("--max-num-batched-tokens", "16")
    chunked = post(chunked_server, body)["choices"][0]["logprobs"]
    assert chunked["tokens"] == fresh["tokens"]
    assert all(abs(a - b) < TOL for a, b in zip(chunked["token_logprobs"][1:], fresh["token_logprobs"][1:]))
    # Cache the prompt with plain requests: the second one reuses it.
    plain = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0}
    post(server, plain)
    assert post(server, plain)["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    cached = post(server, body)
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "scoring computes the whole prompt"
    again = cached["choices"][0]["logprobs"]["token_logprobs"]
    assert all(abs(a - b) < 1e-5 for a, b in zip(again[1:], fresh["token_logprobs"][1:]))
    # Spot checks against the decode path.
    for i in (1, 17, 40, len(ids) - 1):
        assert abs(fresh["token_logprobs"][i] - reference_logprob(server, model, ids[:i], ids[i])[0]) < TOL


def test_a_list_of_prompts_gives_n_choices_per_prompt_in_order(client, model):
    prompts = ["First prompt:", "The second, longer prompt:"]
    r = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=3, temperature=0.9, seed=5, echo=True,
                                  logprobs=0, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        p = prompts[c.index // 2]
        assert c.text.startswith(p)
        assert len(c.logprobs.tokens) == len(encode(p)) + 3
    assert r.usage.prompt_tokens == sum(len(encode(p)) for p in prompts)
    assert r.usage.completion_tokens == 4 * 3
    # Token-list prompts: the same batch.
    t = client.completions.create(model=model, prompt=[encode(p) for p in prompts], n=2, max_tokens=3, temperature=0.9,
                                  seed=5, echo=True, logprobs=0, extra_body={"ignore_eos": True})
    assert [c.text for c in t.choices] == [c.text for c in r.choices]
    # Each prompt's choices are those it gets alone.
    alone = client.completions.create(model=model, prompt=prompts[1], n=2, max_tokens=3, temperature=0.9, seed=5,
                                      extra_body={"ignore_eos": True})
    assert [prompts[1] + c.text for c in alone.choices] == [c.text for c in r.choices[2:]]


def test_best_of_returns_the_n_candidates_with_the_highest_mean_logprob(client, model):
    kw = dict(model=model, prompt="Pick the best:", max_tokens=5, temperature=1.0, seed=21)
    # The candidates: best_of sequences are the n=4 choices of the same seed.
    cands = client.completions.create(n=4, logprobs=0, **kw)
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in cands.choices]
    order = sorted(range(4), key=lambda i: (-means[i], i))
    best = client.completions.create(n=2, best_of=4, **kw)
    assert [c.index for c in best.choices] == [0, 1]
    assert [c.text for c in best.choices] == [cands.choices[i].text for i in order[:2]]
    assert best.choices[0].logprobs is None, "logprobs were not asked for"
    assert best.usage.completion_tokens == cands.usage.completion_tokens, "every candidate counts"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(n=2, best_of=4, stream=True, **kw)
    assert e.value.body["param"] == "best_of"
