"""Tools whose `parameters` use local references (`$defs`, `definitions`),
as `openai.pydantic_function_tool` makes them for nested models, and
`parallel_tool_calls: false`, through the real openai client (issue 33).

The tool-call grammar nests each tool's parameters under `arguments`, so
the server rewrites their `$ref`s to resolve there; before, such a tool
with `tool_choice` "required" or named was a 400 ("Reference segment
'$defs' not found").

The embedded model has random weights: only structure is asserted (the
arguments validate against the pydantic model or the schema, call counts),
never content. Strings, numbers and arrays are bounded so that a random
model finishes (see test_structured_outputs.py).
"""

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import collect_stream

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTION = [{"role": "user", "content": "Plan a route and pick a unit."}]
SEEDS = range(3)


class Point(BaseModel):
    x: int = Field(ge=-9, le=9)
    y: int = Field(ge=-9, le=9)


class Stop(BaseModel):
    city: str = Field(max_length=8)
    at: Point


class Route(BaseModel):
    """Nested models: the schema has `$defs` (Point, Stop), Stop refers to Point."""
    start: Point
    stops: list[Stop] = Field(max_length=2)
    mode: Literal["car", "bike"]


def _other_point():
    class Point(BaseModel):  # the same definition name as above, another shape
        label: Literal["a", "b"]
        on: bool

    class Mark(BaseModel):
        where: Point
        also: list[Point] = Field(max_length=2)

    return Mark


Mark = _other_point()
ROUTE_TOOL = openai.pydantic_function_tool(Route, name="plan_route")
MARK_TOOL = openai.pydantic_function_tool(Mark, name="mark")

# A hand-written draft-07 schema: `definitions`, refs inside definitions.
UNIT_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "reading": {"type": "object", "properties": {
            "value": {"type": "integer", "minimum": -50, "maximum": 50},
            "unit": {"$ref": "#/definitions/unit"}},
            "required": ["value", "unit"], "additionalProperties": False},
    },
    "type": "object",
    "properties": {
        "now": {"$ref": "#/definitions/reading"},
        "history": {"type": "array", "items": {"$ref": "#/definitions/reading"}, "maxItems": 2},
    },
    "required": ["now", "history"],
    "additionalProperties": False,
}
UNIT_TOOL = {"type": "function", "function": {"name": "read_unit", "parameters": UNIT_SCHEMA}}


def named(name):
    return {"type": "function", "function": {"name": name}}


def chat(client, model, seed, **kw):
    extra = dict(NO_THINKING)
    extra.update(kw.pop("extra_body", {}))
    return client.chat.completions.create(model=model, messages=kw.pop("messages", QUESTION), temperature=1.0, seed=seed,
                                          max_tokens=kw.pop("max_tokens", 400), extra_body=extra, **kw)


def calls_of(client, model, seed, stream, **kw):
    """(calls as {name, arguments}, finish_reason), streamed or not."""
    if stream:
        _, _, calls, finish = collect_stream(chat(client, model, seed, stream=True, **kw))
        return [{"name": c["name"], "arguments": c["arguments"]} for c in calls], finish
    choice = chat(client, model, seed, **kw).choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
    return calls, choice.finish_reason


def check_call(call):
    """The call's arguments validate against its tool's model or schema."""
    if call["name"] == "plan_route":
        Route.model_validate_json(call["arguments"])
    elif call["name"] == "mark":
        Mark.model_validate_json(call["arguments"])
    elif call["name"] == "read_unit":
        jsonschema.validate(json.loads(call["arguments"]), UNIT_SCHEMA)
    else:
        raise AssertionError(f"call of an unknown tool: {call}")


def test_pydantic_tool_schema_has_defs():
    # What the rest of this file relies on: the client's schema uses local refs.
    params = ROUTE_TOOL["function"]["parameters"]
    assert set(params["$defs"]) == {"Point", "Stop"}
    assert params["properties"]["start"] == {"$ref": "#/$defs/Point"}
    assert set(MARK_TOOL["function"]["parameters"]["$defs"]) == {"Point"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("tool_choice", ["required", named("plan_route")], ids=["required", "named"])
def test_pydantic_tool_with_nested_models_gives_valid_arguments(client, model, tool_choice, stream):
    for seed in SEEDS:
        calls, finish = calls_of(client, model, seed, stream, tools=[ROUTE_TOOL], tool_choice=tool_choice)
        assert calls, (seed, finish)
        if tool_choice == "required":
            assert finish == "tool_calls", seed
        else:
            # A forced function finishes with "stop" (OpenAI's behaviour).
            assert (len(calls), finish) == (1, "stop"), seed
        for call in calls:
            assert call["name"] == "plan_route", call
            check_call(call)


@pytest.mark.parametrize("tool_choice", ["required", named("plan_route")], ids=["required", "named"])
def test_parse_returns_the_pydantic_model(client, model, tool_choice):
    for seed in SEEDS:
        r = client.chat.completions.parse(model=model, messages=QUESTION, tools=[ROUTE_TOOL], tool_choice=tool_choice,
                                          temperature=1.0, seed=seed, max_tokens=400, extra_body=NO_THINKING)
        calls = r.choices[0].message.tool_calls
        assert calls, seed
        for call in calls:
            assert isinstance(call.function.parsed_arguments, Route), call
            assert Route.model_validate_json(call.function.arguments) == call.function.parsed_arguments


def test_raw_schema_with_definitions_gives_valid_arguments(client, model):
    for tool_choice in ("required", named("read_unit")):
        for seed in SEEDS:
            calls, _ = calls_of(client, model, seed, False, tools=[UNIT_TOOL], tool_choice=tool_choice)
            assert calls and all(c["name"] == "read_unit" for c in calls), (seed, calls)
            for call in calls:
                check_call(call)


def test_tools_with_different_defs_each_keep_their_own(client, model):
    # Route's and Mark's `$defs` both define a "Point", of different shapes.
    tools = [ROUTE_TOOL, MARK_TOOL, UNIT_TOOL]
    for seed in SEEDS:
        calls, finish = calls_of(client, model, seed, False, tools=tools, tool_choice="required")
        assert calls and finish == "tool_calls", seed
        for call in calls:
            check_call(call)
    for name in ("plan_route", "mark", "read_unit"):
        calls, _ = calls_of(client, model, 0, False, tools=tools, tool_choice=named(name))
        assert [c["name"] for c in calls] == [name]
        check_call(calls[0])


def test_parallel_tool_calls_false_with_required_gives_exactly_one_call(client, model):
    tools = [ROUTE_TOOL, UNIT_TOOL]
    for seed in SEEDS:
        whole, finish = calls_of(client, model, seed, False, tools=tools, tool_choice="required", parallel_tool_calls=False)
        assert (len(whole), finish) == (1, "tool_calls"), (seed, whole)
        check_call(whole[0])
        streamed, finish = calls_of(client, model, seed, True, tools=tools, tool_choice="required", parallel_tool_calls=False)
        assert (streamed, finish) == (whole, "tool_calls"), seed


TOOL_CALL_END = 151658
FIRST = '<tool_call>\n{"name": "read_unit", "arguments": {"now": {"value": 1, "unit": "celsius"}, "history": []}}\n</tool_call>'
SECOND_OPEN = '\n<tool_call>\n{"name": "read_unit", "arguments": {"now": {"value": 2, "unit": "celsius"}, "history": []}}\n'


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_keeps_the_first_call_in_auto_mode(client, model, parallel):
    # The random model never writes calls on its own: the client prefills
    # two (continue_final_message), the model's one token (forced by
    # logit_bias) closes the second, and echo returns the whole answer.
    kw = dict(model=model, messages=[*QUESTION, {"role": "assistant", "content": FIRST + SECOND_OPEN}], tools=[UNIT_TOOL],
              parallel_tool_calls=parallel, max_tokens=1, temperature=0, logit_bias={str(TOOL_CALL_END): 100},
              extra_body={"continue_final_message": True, "add_generation_prompt": False, "echo": True})
    expected = 2 if parallel else 1
    message = client.chat.completions.create(**kw).choices[0].message
    assert len(message.tool_calls) == expected
    assert json.loads(message.tool_calls[0].function.arguments)["now"]["value"] == 1
    assert message.content is None
    content, _, calls, finish = collect_stream(client.chat.completions.create(stream=True, **kw))
    assert (content, len(calls), finish) == ("", expected, "tool_calls")
    assert [c["arguments"] for c in calls] == [c.function.arguments for c in message.tool_calls]
