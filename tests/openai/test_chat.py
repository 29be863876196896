"""/v1/chat/completions through the real openai client."""

import httpx

HELLO = [{"role": "user", "content": "Hello! Tell me a story about a fox."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def chat(client, model, **kw):
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(model=model, **kw)


def stream_text(stream):
    parts, finish, usage, chunks = [], None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    return "".join(parts), finish, usage, chunks


def test_non_streaming_answer_has_openai_shape_and_kvc_extension(client, model):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=HELLO, max_tokens=8, temperature=0)
    assert raw.headers["x-kvc-path"] == "local"
    r = raw.parse()
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == model
    assert len(r.choices) == 1
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    kvc = r.model_extra["kvc"]
    assert kvc["path"] == "local" and kvc["reason"] in ("cold", "prefix_hit", "session_hit")
    assert kvc["transferred_tokens"] == 0
    assert kvc["cached_tokens"] + kvc["computed_tokens"] == r.usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == kvc["cached_tokens"]


def test_streamed_text_equals_non_streamed_text_for_greedy(client, model):
    full = chat(client, model, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text, finish, _, chunks = stream_text(
        chat(client, model, max_tokens=24, temperature=0, stream=True, extra_body={"ignore_eos": True})
    )
    assert full.choices[0].message.content
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason == "length"
    # First chunk announces the role with empty content; no empty text deltas after it.
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.content for c in chunks[1:-1])
    assert chunks[-1].choices[0].finish_reason == "length"
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_include_usage_sends_final_usage_chunk(client, model):
    stream = chat(client, model, max_tokens=5, temperature=0, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    _, finish, usage, chunks = stream_text(stream)
    assert finish == "length"
    last = chunks[-1]
    assert last.choices == []
    assert usage is last.usage
    assert usage.completion_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + 5
    # Every earlier chunk carries "usage": null.
    assert all(c.usage is None and "usage" in c.model_fields_set for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage(client, model):
    _, _, usage, chunks = stream_text(chat(client, model, max_tokens=3, temperature=0, stream=True))
    assert usage is None
    assert all("usage" not in c.model_fields_set for c in chunks)


def test_max_tokens_with_ignore_eos_generates_exactly_max_tokens(client, model):
    for field in ("max_tokens", "max_completion_tokens"):
        r = chat(client, model, temperature=0, extra_body={"ignore_eos": True}, **{field: 7})
        assert r.usage.completion_tokens == 7, field
        assert r.choices[0].finish_reason == "length"


def test_stop_string_ends_output_before_it(client, model):
    # Seeded sampling: reproducible, and more varied text than greedy
    # decoding of the random model (which repeats itself).
    kw = dict(max_tokens=40, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    text = chat(client, model, **kw).choices[0].message.content
    # A stop string from the middle of the unconstrained answer.
    stop = next(
        text[i:i + 3] for i in range(len(text) // 3, len(text) - 3)
        if text[i:i + 3].strip() == text[i:i + 3] and "\ufffd" not in text[i:i + 3]
    )
    cut = text[: text.index(stop)]
    r = chat(client, model, stop=[stop], **kw)
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra.get("stop_reason") == stop
    assert r.usage.completion_tokens < 40
    # Streaming stops at the same place.
    s_text, s_finish, _, _ = stream_text(chat(client, model, stop=stop, stream=True, **kw))
    assert (s_text, s_finish) == (cut, "stop")


def test_same_seed_same_text_different_seed_different_text(client, model):
    def sample(seed):
        r = chat(client, model, max_tokens=20, temperature=1.0, seed=seed, extra_body={"ignore_eos": True})
        return r.choices[0].message.content

    a, b, c = sample(1234), sample(1234), sample(4321)
    assert a == b
    assert a != c


def test_usage_counts_the_rendered_prompt(client, model):
    r = chat(client, model, messages=[{"role": "user", "content": "Hello"}], max_tokens=3, temperature=0)
    # The same prompt rendered by hand in Qwen3's chat format, counted by
    # /v1/completions (whose prompt_tokens is the tokenized prompt).
    rendered = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    c = client.completions.create(model=model, prompt=rendered, max_tokens=1)
    assert r.usage.prompt_tokens == c.usage.prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 1 <= r.usage.completion_tokens <= 3


def test_chat_template_kwargs_reach_the_template(client, model):
    plain = chat(client, model, messages=[{"role": "user", "content": "Hello"}], max_tokens=1)
    no_think = chat(client, model, messages=[{"role": "user", "content": "Hello"}], max_tokens=1, extra_body=NO_THINK)
    # enable_thinking=false appends an empty <think></think> block.
    assert no_think.usage.prompt_tokens > plain.usage.prompt_tokens


def test_rich_message_shapes_are_accepted(client, model):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "the weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather by city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = chat(client, model, messages=messages, tools=tools, max_tokens=4, user="someone", temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    without_tools = chat(client, model, messages=messages, max_tokens=1)
    assert r.usage.prompt_tokens > without_tools.usage.prompt_tokens


def test_model_field_is_optional_and_known_extensions_are_accepted(server):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "messages": HELLO, "max_tokens": 2, "session_id": "s1", "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1,
        "skip_special_tokens": True, "metadata": {"team": "a"}, "store": False, "functions": None,
    })
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_unknown_top_level_fields_are_refused_like_openai(client, model):
    import openai
    import pytest

    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model, max_tokens=2, extra_body={"some_future_field": {"x": 1}})
    assert e.value.body["param"] == "some_future_field"
    assert "Unrecognized request argument supplied: some_future_field" in e.value.message
