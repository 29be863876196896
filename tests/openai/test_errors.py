"""Invalid requests get OpenAI errors: 400 (openai.BadRequestError), 404
(openai.NotFoundError), 413, each with {"error": {message, type, param, code}}."""

import httpx
import openai
import pytest

HELLO = [{"role": "user", "content": "Hello"}]


def assert_openai_error(r: httpx.Response, status: int):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 3}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_invalid_chat_parameters_are_bad_requests(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=HELLO, **extra)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body


def test_wrong_types_are_bad_requests_naming_the_field(client, model):
    for kw, param in [
        ({"messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"messages": HELLO, "stop": 5}, "stop"),
        ({"messages": "not a list"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, **kw)
        assert e.value.body["param"] == param, e.value.body
        assert param in e.value.message


def test_empty_messages_is_a_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[])
    assert e.value.body["param"] == "messages"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4-does-not-exist", messages=HELLO)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4-does-not-exist", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4-does-not-exist")


def test_prompt_longer_than_context_is_a_bad_request(client, model, max_model_len):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=[100] * max_model_len, max_tokens=1)
    assert "maximum context length" in e.value.message
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi " * max_model_len}])
    assert "maximum context length" in e.value.message
    # Prompt fits but prompt + max_tokens does not.
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=[100, 101], max_tokens=max_model_len)


def test_token_ids_outside_the_vocabulary_are_bad_requests(client, model):
    for ids in ([1, 10_000_000], [2**32 + 5], [-1]):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt=ids, max_tokens=1)
        assert e.value.body["param"] == "prompt"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "the end"}, "suffix"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"n": 2}, "n"),
    ],
)
def test_invalid_completion_parameters_are_bad_requests(client, model, extra, param):
    kw = {"prompt": "Hello", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, **kw)
    assert e.value.body["param"] == param, e.value.body


def test_malformed_json_gets_openai_error_json(server):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = httpx.post(f"{server.base_url}{path}", content=b'{"messages": [', timeout=10,
                       headers={"content-type": "application/json"})
        err = assert_openai_error(r, 400)
        assert err["type"] == "invalid_request_error"


def test_missing_fields_get_openai_error_json(server):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"max_tokens": 3}, timeout=10)
    assert "messages" in assert_openai_error(r, 400)["message"]
    r = httpx.post(f"{server.base_url}/v1/completions", json={"max_tokens": 3}, timeout=10)
    assert "prompt" in assert_openai_error(r, 400)["message"]


def test_body_without_content_type_is_still_parsed(server):
    r = httpx.post(f"{server.base_url}/v1/completions", content=b'{"prompt": [1, 2], "max_tokens": 1}', timeout=60)
    assert r.status_code == 200, r.text


def test_oversized_body_is_413(server):
    big = b'{"prompt": "' + b"a" * (17 << 20) + b'"}'
    r = httpx.post(f"{server.base_url}/v1/completions", content=big, timeout=60,
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 413)


def test_unknown_route_and_wrong_method_get_json_errors(server):
    assert_openai_error(httpx.get(f"{server.base_url}/v1/nothing", timeout=10), 404)
    assert_openai_error(httpx.get(f"{server.base_url}/v1/chat/completions", timeout=10), 405)
