"""/v1/completions and /v1/models through the real openai client."""

import httpx

IDS = [9707, 11, 1879, 0, 3555, 374, 279, 6722]  # arbitrary ids well inside the Qwen3 vocabulary


def test_token_id_prompt_counts_exactly_those_tokens(client, model):
    r = client.completions.create(model=model, prompt=IDS, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.usage.prompt_tokens == len(IDS)
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == len(IDS) + 5
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].text, str)
    assert r.model_extra["kvc"]["path"] == "local"


def test_prompt_shapes_are_equivalent(client, model):
    def greedy(prompt):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
        return r.choices[0].text, r.usage.prompt_tokens

    assert greedy(IDS) == greedy([IDS])
    assert greedy("Once upon a time") == greedy(["Once upon a time"])


def test_streamed_completion_equals_non_streamed(client, model):
    kw = dict(model=model, prompt="Once upon a time", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_default_max_tokens_is_16(client, model):
    r = client.completions.create(model=model, prompt=IDS, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


def test_completion_stop_string(client, model):
    kw = dict(model=model, prompt=IDS, max_tokens=40, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    stop = next(text[i:i + 2] for i in range(len(text) // 2, len(text) - 2)
                if text[i:i + 2].strip() == text[i:i + 2] and "\ufffd" not in text[i:i + 2])
    r = client.completions.create(stop=stop, **kw)
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_models_lists_the_served_model(server, client, max_model_len):
    models = client.models.list().data
    assert len(models) == 1
    m = models[0]
    assert m.object == "model" and m.owned_by == "kvc"
    assert m.id == "kvc-default"
    assert max_model_len > 0
    assert client.models.retrieve(m.id).id == m.id
    body = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()
    assert body["object"] == "list"


def test_health_is_readiness_and_health_live_is_liveness(server):
    r = httpx.get(f"{server.base_url}/health", timeout=10)
    assert r.status_code == 200
    assert r.json() == {"status": "ready"}
    r = httpx.get(f"{server.base_url}/health/live", timeout=10)
    assert (r.status_code, r.json()) == (200, {"status": "alive"})
