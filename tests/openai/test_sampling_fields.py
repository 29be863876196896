"""Sampling fields users send (vLLM's meaning where OpenAI has none):
`min_tokens` keeps stop tokens, EOS and stop strings from ending the output
before it (chat and completions), and is refused above `max_tokens`;
`stream_options.continuous_usage_stats` puts the usage so far on every
chunk; `temperature` outside [0, 2] is refused like OpenAI does.

The embedded model is random: a `logit_bias` of 100 makes a token the
greedy choice at every step, so "the model would stop at once" is a fact
of the request, not of the weights."""

import httpx
import openai
import pytest

HELLO = [{"role": "user", "content": "Hello! Tell me a story about a fox."}]
PARIS = 12095  # " Paris" in the Qwen3 vocabulary
EOS = 151645  # <|im_end|>: the embedded model's EOS


def generate(client, model, endpoint, **kw):
    """One request to `endpoint` ("chat" or "completions"): (text, finish
    reason, stop_reason, usage)."""
    if endpoint == "chat":
        r = client.chat.completions.create(model=model, messages=HELLO, **kw)
        text = r.choices[0].message.content or ""
    else:
        r = client.completions.create(model=model, prompt="Once upon a time", **kw)
        text = r.choices[0].text
    choice = r.choices[0]
    return text, choice.finish_reason, choice.model_extra.get("stop_reason"), r.usage


def forcing(token, **extra):
    """Greedy, with `token` the model's choice at every step."""
    return dict(max_tokens=30, temperature=0, logit_bias={str(token): 100}, extra_body=extra)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_min_tokens_masks_a_stop_token_the_model_would_emit_first(client, model, endpoint):
    _, finish, stop, usage = generate(client, model, endpoint, **forcing(PARIS, stop_token_ids=[PARIS]))
    assert (finish, stop, usage.completion_tokens) == ("stop", PARIS, 1)
    _, finish, stop, usage = generate(client, model, endpoint, **forcing(PARIS, stop_token_ids=[PARIS], min_tokens=5))
    assert usage.completion_tokens >= 5
    # Masked until the minimum, then the forced token comes and ends it.
    assert (finish, stop, usage.completion_tokens) == ("stop", PARIS, 6)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_min_tokens_masks_eos(client, model, endpoint):
    _, finish, _, usage = generate(client, model, endpoint, **forcing(EOS))
    assert (finish, usage.completion_tokens) == ("stop", 1)
    _, finish, _, usage = generate(client, model, endpoint, **forcing(EOS, min_tokens=7))
    assert usage.completion_tokens >= 7
    assert (finish, usage.completion_tokens) == ("stop", 8)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stop_strings_do_not_match_before_min_tokens(client, model, endpoint):
    text, finish, stop, usage = generate(client, model, endpoint, stop=["Paris"], **forcing(PARIS, ignore_eos=True))
    assert (finish, stop, usage.completion_tokens, "Paris" in text) == ("stop", "Paris", 1, False)
    text, finish, stop, usage = generate(client, model, endpoint, stop=["Paris"],
                                         **forcing(PARIS, ignore_eos=True, min_tokens=4))
    assert usage.completion_tokens >= 4
    # The first four " Paris" stay; the fifth completes the stop string.
    assert (finish, stop, usage.completion_tokens, text.count("Paris")) == ("stop", "Paris", 5, 4)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_min_tokens_above_max_tokens_is_refused_naming_it(client, model, endpoint):
    with pytest.raises(openai.BadRequestError) as e:
        generate(client, model, endpoint, max_tokens=3, extra_body={"min_tokens": 4})
    assert (e.value.status_code, e.value.body["param"], e.value.body["type"]) == (400, "min_tokens", "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as e:
        generate(client, model, endpoint, max_tokens=3, extra_body={"min_tokens": -1})
    assert e.value.body["param"] == "min_tokens"


def test_min_tokens_above_the_default_max_tokens_is_refused(client, model):
    # Completions default to 16 tokens (as OpenAI and vLLM).
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", extra_body={"min_tokens": 17})
    assert e.value.body["param"] == "min_tokens"
    r = client.completions.create(model=model, prompt="x", temperature=0, extra_body={"min_tokens": 16})
    assert r.usage.completion_tokens == 16


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client, model, endpoint):
    kw = dict(max_tokens=8, temperature=0, stream=True, extra_body={"ignore_eos": True},
              stream_options={"include_usage": True, "continuous_usage_stats": True})
    if endpoint == "chat":
        chunks = list(client.chat.completions.create(model=model, messages=HELLO, **kw))
    else:
        chunks = list(client.completions.create(model=model, prompt="Once upon a time", **kw))
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == 8
    assert len(chunks) > 2
    assert all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion), completion
    assert {c.usage.prompt_tokens for c in chunks} == {final.usage.prompt_tokens}
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)
    # The last chunk with a choice already says what the final usage says.
    assert chunks[-2].usage.completion_tokens == final.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == "length"


def test_continuous_usage_stats_need_include_usage_and_unknown_stream_options_are_refused(client, model):
    kw = dict(model=model, messages=HELLO, max_tokens=3, temperature=0, stream=True)
    chunks = list(client.chat.completions.create(stream_options={"continuous_usage_stats": True}, **kw))
    assert all(c.usage is None for c in chunks)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(stream_options={"include_usage": True, "every_chunk": True}, **kw)
    assert e.value.body["param"] == "stream_options"
    assert "every_chunk" in e.value.message


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("temperature", [2.5, -0.1])
def test_temperature_outside_zero_to_two_is_refused(client, model, endpoint, temperature):
    with pytest.raises(openai.BadRequestError) as e:
        generate(client, model, endpoint, max_tokens=1, temperature=temperature)
    assert (e.value.status_code, e.value.body["param"], e.value.body["type"]) == (400, "temperature", "invalid_request_error")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("temperature", [2.0, 0])
def test_temperature_at_the_ends_of_the_range_is_accepted(client, model, endpoint, temperature):
    _, finish, _, usage = generate(client, model, endpoint, max_tokens=2, temperature=temperature, seed=1,
                                   extra_body={"ignore_eos": True})
    assert (finish, usage.completion_tokens) == ("length", 2)


def test_min_tokens_holds_through_a_remote_prefill(start_server):
    # The prefill worker samples the first token (min_tokens capped to its
    # one token there); the decode worker keeps the rest from stopping.
    from test_disagg import ids, prefill_flags, start_decode

    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    body = {"prompt": ids(7, 96), "max_tokens": 30, "temperature": 0, "logit_bias": {str(EOS): 100}, "min_tokens": 5}
    out = httpx.post(f"{d.base_url}/v1/completions", json=body, timeout=300).json()
    assert out["kvc"]["path"] == "remote_prefill", out
    assert (out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"]) == ("stop", 6)
