"""Malformed and hostile requests: each gets the right 4xx with OpenAI's
error JSON ({"error": {message, type, param, code}}), and the server stays
healthy and serves a normal request right after every one of them."""

import json

import httpx
import openai
import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def chat(**extra):
    return ("POST", CHAT, json.dumps({"messages": HELLO, "max_tokens": 2, **extra}).encode())


def completion(**extra):
    return ("POST", COMPLETIONS, json.dumps({"prompt": "Hello", "max_tokens": 2, **extra}).encode())


def raw(path, body: bytes, method="POST"):
    return (method, path, body)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (id, request, status, param or None). `param` is checked when given.
CASES = [
    # wrong types
    ("temperature-string", chat(temperature="hot"), 400, "temperature"),
    ("stop-number", chat(stop=5), 400, "stop"),
    ("messages-string", raw(CHAT, b'{"messages": "not a list"}'), 400, "messages"),
    ("role-unknown", raw(CHAT, b'{"messages": [{"role": "wizard", "content": "x"}]}'), 400, "messages"),
    ("content-number", raw(CHAT, b'{"messages": [{"role": "user", "content": 5}]}'), 400, "messages"),
    ("seed-string", chat(seed="abc"), 400, "seed"),
    ("n-float", chat(n=1.5), 400, "n"),
    ("logprobs-string", chat(logprobs="yes"), 400, "logprobs"),
    ("body-is-array", raw(CHAT, b"[1, 2, 3]"), 400, None),
    ("body-is-null", raw(CHAT, b"null"), 400, None),
    ("duplicate-field", raw(CHAT, b'{"messages": [], "messages": []}'), 400, None),
    # out-of-range and negative values
    ("max-tokens-zero", chat(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", chat(max_tokens=-1), 400, "max_tokens"),
    ("max-completion-tokens-zero", chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("max-tokens-huge", chat(max_tokens=10**12), 400, "messages"),
    ("temperature-negative", chat(temperature=-0.5), 400, "temperature"),
    ("temperature-overflow", raw(CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}'), 400, None),
    ("top-p-above-one", chat(top_p=1.5), 400, "top_p"),
    ("top-p-zero", chat(top_p=0), 400, "top_p"),
    ("top-k-negative", chat(top_k=-5), 400, "top_k"),
    ("min-p-above-one", chat(min_p=2), 400, "min_p"),
    ("presence-penalty-large", chat(presence_penalty=3), 400, "presence_penalty"),
    ("n-zero", chat(n=0), 400, "n"),
    ("n-negative", chat(n=-3), 400, "n"),
    ("n-huge", chat(n=1_000_000), 400, "n"),
    ("five-stop-strings", chat(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("top-logprobs-too-many", chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("top-logprobs-negative", chat(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
    ("top-logprobs-without-logprobs", chat(top_logprobs=3), 400, "top_logprobs"),
    ("completion-logprobs-too-many", completion(logprobs=21), 400, "logprobs"),
    ("completion-logprobs-negative", completion(logprobs=-1), 400, "logprobs"),
    # token ids out of range
    ("prompt-token-out-of-range", completion(prompt=[1, 10_000_000]), 400, "prompt"),
    ("prompt-token-beyond-u32", completion(prompt=[2**32 + 5]), 400, "prompt"),
    ("prompt-token-negative", completion(prompt=[-1]), 400, "prompt"),
    ("logit-bias-token-out-of-range", chat(logit_bias={"10000000": 5}), 400, "logit_bias"),
    ("logit-bias-key-not-a-number", chat(logit_bias={"hello": 5}), 400, "logit_bias"),
    ("logit-bias-value-too-large", chat(logit_bias={"100": 101}), 400, "logit_bias"),
    ("stop-token-id-out-of-range", chat(stop_token_ids=[10_000_000]), 400, "stop_token_ids"),
    # unsupported or inconsistent options, unknown fields
    ("response-format-unknown-type", chat(response_format={"type": "yaml"}), 400, "response_format"),
    ("response-format-schema-missing", chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400, "response_format"),
    ("response-format-schema-bad-type", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}), 400, "response_format"),
    ("guided-regex-does-not-compile", chat(guided_regex="(unclosed"), 400, "guided_regex"),
    ("guided-grammar-does-not-compile", chat(guided_grammar="start: undefined_rule"), 400, "guided_grammar"),
    ("two-structured-constraints", chat(response_format={"type": "json_object"}, guided_regex="a+"), 400, "guided_regex"),
    ("tool-choice-unknown-function", chat(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), 400, "tool_choice"),
    ("stream-options-without-stream", chat(stream_options={"include_usage": True}), 400, "stream_options"),
    ("tool-choice-required-without-tools", chat(tool_choice="required"), 400, "tool_choice"),
    ("tool-choice-without-tools", chat(tool_choice="auto"), 400, "tool_choice"),
    ("tools-malformed", chat(tools=[{"type": "function"}]), 400, "tools"),
    ("unknown-field", chat(max_token=5), 400, "max_token"),
    ("unsupported-guided-backend", chat(guided_decoding_backend="xgrammar"), 400, "guided_decoding_backend"),
    ("parallel-tool-calls-false-on-completions", completion(parallel_tool_calls=False), 400, "parallel_tool_calls"),
    ("chat-echo-without-continue", chat(echo=True), 400, "echo"),
    ("continue-without-assistant-message", chat(continue_final_message=True), 400, "continue_final_message"),
    ("empty-messages", raw(CHAT, b'{"messages": []}'), 400, "messages"),
    ("missing-messages", raw(CHAT, b'{"max_tokens": 3}'), 400, None),
    ("missing-prompt", raw(COMPLETIONS, b'{"max_tokens": 3}'), 400, None),
    ("mixed-prompt-list", completion(prompt=["one", [1, 2]]), 400, "prompt"),
    ("empty-prompt-list", completion(prompt=[]), 400, "prompt"),
    ("empty-prompt-text", completion(prompt=""), 400, "prompt"),
    ("max-tokens-zero-without-echo", completion(max_tokens=0), 400, "max_tokens"),
    ("suffix", completion(suffix="the end"), 400, "suffix"),
    ("best-of-below-n", completion(best_of=1, n=2), 400, "best_of"),
    ("best-of-streamed", completion(best_of=3, stream=True), 400, "best_of"),
    ("session-with-several-prompts", completion(prompt=["one", "two"], session_id="s"), 400, "session_id"),
    ("chat-field-on-completions", completion(messages=HELLO), 400, "messages"),
    # malformed bytes and hostile shapes
    ("json-syntax-error", raw(CHAT, b'{"messages": ['), 400, None),
    ("json-nan-literal", raw(CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'), 400, None),
    ("invalid-utf8", raw(CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}'), 400, None),
    ("lone-surrogate", raw(CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400, None),
    ("nested-100k-in-tools", raw(CHAT, ('{"messages": [{"role": "user", "content": "x"}], "tools": %s}' % nested(100_000)).encode()), 400, None),
    ("nested-100k-in-messages", raw(CHAT, ('{"messages": %s}' % nested(100_000)).encode()), 400, None),
    ("nested-100k-in-unknown-field", raw(COMPLETIONS, ('{"prompt": "x", "junk": %s}' % nested(100_000)).encode()), 400, None),
    ("garbage-10mb", raw(COMPLETIONS, b"\x00" * (10 << 20)), 400, None),
    ("body-17mb", raw(COMPLETIONS, b'{"prompt": "' + b"a" * (17 << 20) + b'"}'), 413, None),
    # routing
    ("unknown-model", chat(model="gpt-4-does-not-exist"), 404, "model"),
    ("unknown-route", raw("/v1/nothing", b"", method="GET"), 404, None),
    ("wrong-method", raw(CHAT, b"", method="GET"), 405, None),
    ("internal-routes-off-without-cluster-token", raw("/internal/ping", b"", method="GET"), 403, None),
]


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


def assert_serves_normally(server):
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    r = httpx.post(f"{server.base_url}{COMPLETIONS}", json={"prompt": [1, 2, 3], "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    assert server.proc.poll() is None


def test_there_are_at_least_forty_hostile_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_openai_error_and_server_keeps_serving(server, case):
    _, (method, path, body), status, param = case
    r = httpx.request(method, f"{server.base_url}{path}", content=body, timeout=120,
                      headers={"content-type": "application/json"})
    err = assert_openai_error(r, status)
    if param is not None:
        assert err["param"] == param, err
    if status == 400:
        assert err["type"] == "invalid_request_error"
    assert_serves_normally(server)


def test_prompt_longer_than_context_is_a_bad_request(client, model, max_model_len):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=[100] * max_model_len, max_tokens=1)
    assert "maximum context length" in e.value.message or "more than this server accepts" in e.value.message
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi " * max_model_len}])
    assert e.value.body["code"] == "context_length_exceeded"
    # Prompt fits but prompt + max_tokens does not.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=[100, 101], max_tokens=max_model_len)


def test_body_without_content_type_is_still_parsed(server):
    r = httpx.post(f"{server.base_url}{COMPLETIONS}", content=b'{"prompt": [1, 2], "max_tokens": 1}', timeout=60)
    assert r.status_code == 200, r.text


def test_openai_client_maps_errors_to_its_exception_classes(client, model):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4-does-not-exist", messages=HELLO)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4-does-not-exist")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=HELLO, temperature=-1)
    assert e.value.body["param"] == "temperature"
