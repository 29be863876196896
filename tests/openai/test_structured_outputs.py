"""Structured outputs through the real openai client: `response_format`
(json_schema, json_object), `tool_choice` "required" and named, vLLM's
`guided_*` / `structured_outputs` fields.

The embedded model has random weights, so whatever it "wants" to say is
noise: every answer below is valid only because the grammar allowed
nothing else. Answers are checked with independent validators (the
`jsonschema` package, Python's `re`), over many seeds at temperature 1.

Schemas bound their strings, numbers and arrays: a random model inside an
unbounded JSON string almost never picks one of the few tokens that close
it, and would run to `max_tokens` (finish_reason "length", as OpenAI).
"""

import json
import re

import jsonschema
import openai
import pytest

from conftest import collect_stream

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
THINK, END_THINK = 151667, 151668
QUESTION = [{"role": "user", "content": "Plan a trip. Answer in JSON."}]

PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "destination": {"type": "string", "maxLength": 16},
        "mode": {"enum": ["train", "plane", "bike"]},
        "nights": {"type": "integer", "minimum": 1, "maximum": 30},
        "budget": {"type": "object", "properties": {
            "currency": {"enum": ["EUR", "USD"]},
            "amount": {"type": "integer", "minimum": 0, "maximum": 99999},
        }, "required": ["currency", "amount"], "additionalProperties": False},
        "stops": {"type": "array", "maxItems": 3, "items": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 10}, "day": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["city", "day"], "additionalProperties": False}},
        "confirmed": {"type": "boolean"},
    },
    "required": ["destination", "mode", "nights", "budget", "stops", "confirmed"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "plan", "strict": True, "schema": PLAN_SCHEMA}}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
BOOK = {"type": "function", "function": {
    "name": "book_table", "description": "Book a restaurant table",
    "parameters": {"type": "object", "properties": {
        "people": {"type": "integer", "minimum": 1, "maximum": 12},
        "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
        "required": ["people", "time"], "additionalProperties": False}}}
TOOLS = [WEATHER, BOOK]
SEEDS = range(10)


def chat(client, model, seed, **kw):
    extra = dict(NO_THINKING)
    extra.update(kw.pop("extra_body", {}))
    return client.chat.completions.create(model=model, messages=kw.pop("messages", QUESTION), temperature=1.0, seed=seed,
                                          max_tokens=kw.pop("max_tokens", 400), extra_body=extra, **kw)


def check_calls(calls, allowed):
    """Each call names an allowed tool and its arguments validate."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls, "no tool call"
    for call in calls:
        assert call["name"] in allowed, call
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def test_json_schema_answers_validate_for_every_seed(client, model):
    validator = jsonschema.Draft202012Validator(PLAN_SCHEMA)
    for seed in SEEDS:
        r = chat(client, model, seed, response_format=RESPONSE_FORMAT)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (seed, choice.message.content)
        validator.validate(json.loads(choice.message.content))


def test_json_object_answer_is_an_object(client, model):
    for seed in SEEDS:
        r = chat(client, model, seed, response_format={"type": "json_object"}, max_tokens=60)
        text = r.choices[0].message.content
        assert text.startswith("{"), text
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_streaming_equals_non_streaming_for_the_same_seed(client, model):
    for seed in (1, 2, 3):
        whole = chat(client, model, seed, response_format=RESPONSE_FORMAT)
        content, _, _, finish = collect_stream(chat(client, model, seed, response_format=RESPONSE_FORMAT, stream=True))
        assert (content, finish) == (whole.choices[0].message.content, whole.choices[0].finish_reason)
        whole = chat(client, model, seed, tools=TOOLS, tool_choice="required")
        _, _, calls, finish = collect_stream(chat(client, model, seed, tools=TOOLS, tool_choice="required", stream=True))
        expected = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.choices[0].message.tool_calls]
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == expected
        assert finish == whole.choices[0].finish_reason == "tool_calls"


def test_tool_choice_required_always_calls_a_tool_with_valid_arguments(client, model):
    for seed in SEEDS:
        r = chat(client, model, seed, tools=TOOLS, tool_choice="required")
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", (seed, m)
        assert not m.content
        check_calls([{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls], {"get_weather", "book_table"})


def test_named_tool_choice_calls_exactly_that_tool(client, model):
    for name in ("get_weather", "book_table"):
        for seed in SEEDS:
            r = chat(client, model, seed, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}})
            # A forced function finishes with "stop" (OpenAI's behaviour).
            assert r.choices[0].finish_reason == "stop"
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in r.choices[0].message.tool_calls]
            assert len(calls) == 1
            check_calls(calls, {name})


def test_the_grammar_starts_after_the_reasoning_block(client, model):
    # Thinking on: the model may open <think> first (forced here), reason
    # freely (closed at once here), then the answer must match the schema.
    r = chat(client, model, 0, response_format=RESPONSE_FORMAT, logit_bias={str(THINK): 50, str(END_THINK): 100},
             extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(m.content), PLAN_SCHEMA)
    assert (m.model_extra or {}).get("reasoning_content") in (None, "")
    # Thinking on and left to the model: either way, a finished answer validates.
    for seed in range(4):
        r = chat(client, model, seed, response_format=RESPONSE_FORMAT, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), PLAN_SCHEMA)


def test_vllm_guided_fields_on_chat_and_completions(client, model):
    pattern = r"[A-Z]{2}-[0-9]{3}"
    for seed in range(4):
        r = chat(client, model, seed, extra_body={"guided_regex": pattern})
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
        r = chat(client, model, seed, extra_body={"guided_choice": ["yes", "no", "maybe not"]})
        assert r.choices[0].message.content in ("yes", "no", "maybe not")
        r = chat(client, model, seed, extra_body={"structured_outputs": {"json": PLAN_SCHEMA}})
        jsonschema.validate(json.loads(r.choices[0].message.content), PLAN_SCHEMA)
        c = client.completions.create(model=model, prompt="Answer:", max_tokens=20, seed=seed, temperature=1.0,
                                      extra_body={"guided_regex": pattern})
        assert re.fullmatch(pattern, c.choices[0].text), c.choices[0].text
        c = client.completions.create(model=model, prompt="Pick:", max_tokens=300, seed=seed, temperature=1.0,
                                      extra_body={"guided_json": PLAN_SCHEMA})
        jsonschema.validate(json.loads(c.choices[0].text), PLAN_SCHEMA)
        grammar = 'start: "go " DIR\nDIR: "north" | "south"\n'
        c = client.completions.create(model=model, prompt="Where:", max_tokens=20, seed=seed, temperature=1.0,
                                      extra_body={"guided_grammar": grammar})
        assert c.choices[0].text in ("go north", "go south")


def test_strict_refuses_keywords_it_cannot_enforce(client, model):
    schema = {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "maxItems": 2}
    fmt = lambda strict: {"type": "json_schema", "json_schema": {"name": "u", "strict": strict, "schema": schema}}  # noqa: E731
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model, 0, response_format=fmt(True))
    assert e.value.body["param"] == "response_format"
    assert "uniqueItems" in e.value.message
    r = chat(client, model, 0, response_format=fmt(False))
    items = json.loads(r.choices[0].message.content)
    assert isinstance(items, list) and len(items) <= 2 and set(items) <= {1, 2, 3}


SHAPES = {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "format": "int64"}},
     "required": ["kind", "r"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1}},
     "required": ["kind", "side"], "additionalProperties": False},
    {"type": "string", "format": "my-own-format", "maxLength": 8},
]}


def test_one_of_that_cannot_overlap_and_unknown_formats_are_accepted_under_strict(client, model):
    """llguidance proves the branches disjoint (so `oneOf` is `anyOf`
    exactly); the unknown formats are dropped. Every answer validates,
    `oneOf` included (jsonschema, formats unasserted as by default)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "shape", "strict": True, "schema": SHAPES}}
    for seed in range(6):
        r = chat(client, model, seed, response_format=fmt)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SHAPES)


def test_an_overlapping_one_of_is_refused_under_strict_and_taken_as_any_of_without(client, model):
    # 3 to 5 match both branches: only `anyOf` can be enforced.
    schema = {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "integer", "minimum": 3, "maximum": 9}]}
    fmt = lambda strict: {"type": "json_schema", "json_schema": {"name": "n", "strict": strict, "schema": schema}}  # noqa: E731
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model, 0, response_format=fmt(True))
    assert e.value.status_code == 400 and e.value.body["param"] == "response_format"
    assert "oneOf" in e.value.message and "anyOf" in e.value.message
    for seed in range(3):
        r = chat(client, model, seed, response_format=fmt(False), max_tokens=30)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), {"anyOf": schema["oneOf"]})


def test_masks_are_counted_in_metrics(server, client, model):
    before = server.metrics()
    r = chat(client, model, 0, extra_body={"guided_choice": ["alpha", "beta"]})
    after = server.metrics()
    tokens = r.usage.completion_tokens
    assert after["kvc_structured_output_masks_total"] - before["kvc_structured_output_masks_total"] >= tokens
    assert after["kvc_structured_output_mask_seconds_total"] >= before["kvc_structured_output_mask_seconds_total"]
    assert after["kvc_structured_output_errors_total"] == 0


BLOW_UP = "(a{1000}){1000}"  # a million forced bytes


def test_impossible_and_exploding_grammars_are_400s_that_reveal_no_matcher_state(start_server):
    """Issue 31: grammars that can match nothing (`$ref: "#"`, `[^\\s\\S]`,
    `start: start`) and ones that blow up (`(a{1000}){1000}` as a regex, a
    schema's pattern or a tool's) were 500s whose body dumped the grammar
    engine's state; the blow-up took ~1.5 s of CPU to compile, then failed
    on its first token inside an engine step. Each is now a 400 in OpenAI's
    error shape with a short message, before anything is generated (the
    blow-ups cut off by the compile's lexer budget, in tens of ms); a
    grammar whose matcher fails while generating (`b{1000}` of `a{1000}`)
    is a 400 too, or the error event of a stream. /health answers
    meanwhile, and a strict tool call still works."""
    import concurrent.futures
    import time

    import httpx

    srv = start_server()
    url = f"{srv.base_url}/v1"
    model = httpx.get(f"{url}/models", timeout=10).json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    strict = lambda props: {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}  # noqa: E731
    blow_up_schema = strict({"s": {"type": "string", "pattern": f"^{BLOW_UP}$"}})
    cases = [
        ("chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}, None),
        ("chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": blow_up_schema}}}, "response_format"),
        ("chat/completions", {**chat, "tool_choice": "required", "tools": [{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": blow_up_schema}}]}, "tools"),
    ] + [
        ("completions", {"model": model, "prompt": "hi", "max_tokens": 4, field: value}, budget)
        for field, value, budget in [("guided_regex", r"[^\s\S]", None), ("guided_grammar", "start: start", None),
                                     ("guided_regex", BLOW_UP, "guided_regex"),
                                     ("guided_grammar", 'start: b{1000}\nb: a{1000}\na: "x"\n', None)]
    ]

    def post(ep, body):
        return httpx.post(f"{url}/{ep}", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        answers = [pool.submit(post, ep, body) for ep, body, _ in cases]
        # The HTTP front is not held up by grammars being compiled or run.
        while not all(a.done() for a in answers):
            t = time.monotonic()
            assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
            assert time.monotonic() - t < 0.5, "/health waited behind the grammars"
            time.sleep(0.05)
    for (ep, body, budget), a in zip(cases, answers):
        r = a.result()
        assert r.status_code == 400, (body, r.status_code, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "<" not in err["message"] and len(err["message"]) < 400, err
        if budget:
            # Refused at compile by the lexer budget, naming the field (how
            # fast: crates/engine/tests/structured.rs reports it; not a
            # timed assert here).
            assert err["param"] == budget and "lexer budget" in err["message"], err
    # Refused at compile: a stream is not even started.
    r = httpx.post(f"{url}/completions", timeout=120, json={**cases[-2][1], "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex", r.text
    # Failing while generating: the stream's error event.
    stream = httpx.post(f"{url}/completions", timeout=120, json={**cases[-1][1], "stream": True}).text
    assert '"error"' in stream and "<" not in stream and stream.rstrip().endswith("data: [DONE]"), stream
    # The server is fine for an ordinary strict tool call.
    r = httpx.post(f"{url}/chat/completions", timeout=120, json={
        **chat, "max_tokens": 60, "temperature": 1.0, "seed": 0, "tools": [WEATHER], "tool_choice": "required", **NO_THINKING})
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    check_calls([c["function"] for c in calls], {"get_weather"})


def test_a_grammar_over_the_size_limit_is_a_400_naming_the_limit_and_field(client, model):
    """Issue 31: a schema, regex or grammar over 512 KiB of text (for tools,
    all their parameters together) is refused before it is compiled."""
    big = {"type": "object", "description": "x" * (512 * 1024)}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model, 0, response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": big}})
    assert e.value.body["param"] == "response_format" and "512 KiB" in e.value.message
    assert e.value.code == "grammar_too_large"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"guided_regex": "a" * (600 << 10)})
    assert e.value.body["param"] == "guided_regex" and "512 KiB" in e.value.message
    assert e.value.code == "grammar_too_large"
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {**big, "description": "y" * (150 << 10)}}}
             for i in range(4)]
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model, 0, tools=tools, tool_choice="required")
    assert e.value.body["param"] == "tools" and "512 KiB" in e.value.message
    assert e.value.code == "grammar_too_large"
