"""logprobs / top_logprobs (chat and completions shapes, streamed and
not), n > 1 with per-choice seeds, echo, logit_bias, stop strings held back
correctly in streams, max_completion_tokens, user, response_format."""

import pytest

HELLO = [{"role": "user", "content": "Hello! Tell me a story about a fox."}]
IGNORE_EOS = {"ignore_eos": True}


def chat(client, model, **kw):
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(model=model, **kw)


def test_chat_logprobs_have_openai_shape_and_match_the_text(client, model):
    r = chat(client, model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, extra_body=IGNORE_EOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 6 == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        ranked = [t.logprob for t in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob)
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text == r.choices[0].message.content


def test_chat_logprobs_stream_equal_the_whole_answer(client, model):
    kw = dict(max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, extra_body=IGNORE_EOS)
    whole = chat(client, model, **kw).choices[0].logprobs.content
    streamed = []
    for chunk in chat(client, model, stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.extend(c.logprobs.content)
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in whole]
    assert [len(e.top_logprobs) for e in streamed] == [2] * 8


def test_chat_without_logprobs_has_none(client, model):
    r = chat(client, model, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs_have_tokens_offsets_and_top_dicts(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2,
                                  extra_body=IGNORE_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0
    for i in range(5):
        assert lp.text_offset[i + 1] == lp.text_offset[i] + len(lp.tokens[i])
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert token in top and top[token] == pytest.approx(logprob)
        assert 1 <= len(top) <= 3
    streamed = []
    for chunk in client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0,
                                           logprobs=2, stream=True, extra_body=IGNORE_EOS):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed.extend(chunk.choices[0].logprobs.tokens)
    assert streamed == lp.tokens


def test_n_choices_differ_and_a_seed_reproduces_them(client, model):
    # Note: equality is only asserted between requests with the same batch
    # shape and prefix-cache state. The random MoE's next-token distribution
    # is nearly flat, and which experts a batch's tokens share changes the
    # float sums slightly, so sampled text is not batch-invariant.
    kw = dict(n=3, max_tokens=8, temperature=1.0, seed=100, extra_body=IGNORE_EOS)
    chat(client, model, max_tokens=1)  # warm the prefix cache for this prompt
    r = chat(client, model, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3, texts
    assert r.usage.completion_tokens == 24
    assert [c.message.content for c in chat(client, model, **kw).choices] == texts
    single = chat(client, model, max_tokens=8, temperature=1.0, seed=100, extra_body=IGNORE_EOS)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens


def test_n_choices_stream_interleaved_and_each_finishes(client, model):
    kw = dict(n=2, max_tokens=6, temperature=0, extra_body=IGNORE_EOS)
    chat(client, model, max_tokens=1)  # warm the prefix cache for this prompt
    whole = chat(client, model, **kw)
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in chat(client, model, stream=True, stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert finishes == {0: "length", 1: "length"}
    assert usage.completion_tokens == 12
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]


def test_completion_n_and_echo(client, model):
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, n=2, echo=True, temperature=0,
                                  extra_body=IGNORE_EOS)
    plain = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, temperature=0,
                                      extra_body=IGNORE_EOS)
    for c in r.choices:
        assert c.text == "Once upon a time" + plain.choices[0].text
    # Streaming: the prompt comes first.
    chunks = list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, echo=True,
                                            temperature=0, stream=True, extra_body=IGNORE_EOS))
    assert chunks[0].choices[0].text == "Once upon a time"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    # Token-id prompts are echoed as their text.
    ids = client.completions.create(model=model, prompt=[9707, 11, 1879], max_tokens=1, echo=True, temperature=0)
    assert ids.choices[0].text.startswith("Hello, world")


def test_logit_bias_forces_and_bans_tokens(client, model):
    paris, london = 12095, 7148  # " Paris", " London" in the Qwen3 vocabulary

    def tokens(bias):
        r = chat(client, model, max_tokens=3, temperature=0, logit_bias=bias, logprobs=True, extra_body=IGNORE_EOS)
        return [e.token for e in r.choices[0].logprobs.content]

    assert tokens({str(paris): 100}) == [" Paris"] * 3
    assert tokens({str(paris): 100, str(london): 90}) == [" Paris"] * 3
    # Banning the winner hands every step to the runner-up.
    assert tokens({str(paris): -100, str(london): 90}) == [" London"] * 3


def test_stop_strings_are_held_back_across_token_boundaries_in_streams(client, model):
    kw = dict(max_tokens=40, temperature=1.0, seed=7, extra_body=IGNORE_EOS)
    full = chat(client, model, logprobs=True, **kw)
    tokens = [e.token for e in full.choices[0].logprobs.content]
    text = full.choices[0].message.content
    # A stop string made of the last character of one token and the first
    # of the next: a stream that did not hold text back would already have
    # sent the first character when the match completes.
    stop, pos = None, 0
    for k, tok in enumerate(tokens[:-1]):
        pos += len(tok)
        if "".join(tokens[: k + 1]) != text[:pos]:
            break  # a token cut a character in two: offsets no longer line up
        candidate = text[pos - 1: pos + 1]
        if (pos > 10 and len(candidate) == 2 and candidate.strip() == candidate and "\ufffd" not in candidate
                and text.index(candidate) == pos - 1):
            stop = candidate
            break
    assert stop, f"no stop string spanning two tokens in {tokens}"
    cut = text[: text.index(stop)]
    stops = ["\u2603never", stop, "zzzzzz", "\u2601"]  # four strings, OpenAI's maximum
    whole = chat(client, model, stop=stops, **kw)
    assert whole.choices[0].message.content == cut
    assert whole.choices[0].finish_reason == "stop"
    pieces = []
    for chunk in chat(client, model, stop=stops, stream=True, **kw):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            if c.finish_reason:
                assert c.finish_reason == "stop"
                assert c.model_extra.get("stop_reason") == stop
    assert "".join(pieces) == cut


def test_max_completion_tokens_user_and_text_response_format_are_honoured(client, model):
    r = chat(client, model, max_completion_tokens=3, user="user-1234", response_format={"type": "text"},
             temperature=0, extra_body=IGNORE_EOS)
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"
