"""`--tool-call-parser qwen3_coder` (issue 34, item 1): Qwen3-Coder's XML
tool calls become OpenAI `tool_calls`, typed by the tool's schema, through
the real openai client.

The embedded model has random weights and never writes a call on its own:
the client prefills the call text as the final assistant message
(`continue_final_message`), the model's one token (forced by logit_bias)
closes the block, and `echo` returns the whole answer to the parser. With
`tool_choice` "required" or named, the XML grammar forces the call; tools
with bounded parameters (none, a boolean) keep the random model's answer
short.
"""

import json

import jsonschema
import openai
import pytest

from conftest import collect_stream

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
QUESTION = [{"role": "user", "content": "Write the file."}]
TOOL_CALL_END = 151658  # `</tool_call>`, one token in the Qwen3 vocabulary

WRITE_TOOL = {"type": "function", "function": {"name": "write_file", "description": "Write a file.", "parameters": {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "lines": {"type": "integer"},
                   "ratio": {"type": "number"}, "force": {"type": "boolean"}},
    "required": ["path", "content", "lines"],
}}}
PING_TOOL = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
FLAG_TOOL = {"type": "function", "function": {"name": "set_flag", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}

CODE = 'fn main() {\n    let p = "C:\\\\tmp\\\\a.txt";\n    println!("{}\\n", p);\n}'
CALL_OPEN = (
    "<tool_call>\n<function=write_file>\n"
    "<parameter=path>\nsrc\\main.rs\n</parameter>\n"
    f"<parameter=content>\n{CODE}\n</parameter>\n"
    "<parameter=lines>\n4\n</parameter>\n"
    "<parameter=ratio>\n0.5\n</parameter>\n"
    "<parameter=force>\ntrue\n</parameter>\n"
    "</function>\n"
)
EXPECTED = {"path": "src\\main.rs", "content": CODE, "lines": 4, "ratio": 0.5, "force": True}


@pytest.fixture(scope="module")
def coder(start_server):
    return start_server("--tool-call-parser", "qwen3_coder").client()


def prefilled(model, answer, **kw):
    return dict(model=model, messages=[*QUESTION, {"role": "assistant", "content": answer}], tools=[WRITE_TOOL, PING_TOOL],
                max_tokens=1, temperature=0, logit_bias={str(TOOL_CALL_END): 100},
                extra_body={"continue_final_message": True, "add_generation_prompt": False, "echo": True}, **kw)


def test_an_xml_call_becomes_typed_tool_calls_streamed_and_whole(coder, model):
    kw = prefilled(model, "I will write it.\n" + CALL_OPEN)
    choice = coder.chat.completions.create(**kw).choices[0]
    message = choice.message
    assert [c.function.name for c in message.tool_calls] == ["write_file"]
    arguments = json.loads(message.tool_calls[0].function.arguments)
    assert arguments == EXPECTED
    assert type(arguments["lines"]) is int and type(arguments["force"]) is bool
    assert arguments["content"] == CODE, "multi-line code with backslashes is kept verbatim"
    assert message.content == "I will write it."
    assert choice.finish_reason == "tool_calls"
    content, _, calls, finish = collect_stream(coder.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("I will write it.", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("write_file", EXPECTED)]
    assert [c["arguments"] for c in calls] == [message.tool_calls[0].function.arguments]


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_keeps_the_first_xml_call(coder, model, parallel):
    ping = "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n"
    kw = prefilled(model, ping + CALL_OPEN, parallel_tool_calls=parallel)
    message = coder.chat.completions.create(**kw).choices[0].message
    names = [c.function.name for c in message.tool_calls]
    assert names == (["ping", "write_file"] if parallel else ["ping"])
    _, _, calls, _ = collect_stream(coder.chat.completions.create(stream=True, **kw))
    assert [c["name"] for c in calls] == names


def test_the_default_hermes_server_leaves_xml_calls_as_text(client, model):
    # The embedded model's template is Qwen3's (JSON calls): auto picks hermes.
    message = client.chat.completions.create(**prefilled(model, CALL_OPEN)).choices[0].message
    assert message.tool_calls is None
    assert "<function=write_file>" in message.content


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_force_an_xml_call(coder, model, stream):
    for tool_choice, tools, name in [("required", [PING_TOOL], "ping"),
                                     ({"type": "function", "function": {"name": "set_flag"}}, [PING_TOOL, FLAG_TOOL], "set_flag")]:
        kw = dict(model=model, messages=QUESTION, tools=tools, tool_choice=tool_choice, max_tokens=200, temperature=0,
                  extra_body=NO_THINKING)
        if stream:
            _, _, calls, finish = collect_stream(coder.chat.completions.create(stream=True, **kw))
        else:
            choice = coder.chat.completions.create(**kw).choices[0]
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
            finish = choice.finish_reason
        assert [c["name"] for c in calls][:1] == [name], (tool_choice, calls)
        arguments = json.loads(calls[0]["arguments"])
        if name == "set_flag":
            assert type(arguments["on"]) is bool
        else:
            assert arguments == {}
        # A named choice finishes with "stop" (OpenAI's), required with "tool_calls".
        assert finish == ("tool_calls" if tool_choice == "required" else "stop")


def test_a_whole_tool_loop_renders_and_answers(coder, model):
    first = coder.chat.completions.create(**prefilled(model, CALL_OPEN)).choices[0].message
    call = first.tool_calls[0]
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "wrote 4 lines"},
    ]
    reply = coder.chat.completions.create(model=model, messages=messages, tools=[WRITE_TOOL], max_tokens=5, temperature=0,
                                          extra_body=NO_THINKING)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > 0


# Parameters of every shape the format types: listed values (strings raw,
# others as JSON; an Optional[Literal] as pydantic writes it), an object and
# an array (through $defs/$ref), nullable and bounded integers, a boolean.
# Free text is left out: the random model would write it until max_tokens.
CONFIGURE_PARAMETERS = {
    "$defs": {
        "Limit": {"type": "object", "properties": {"max": {"type": "integer", "minimum": 1, "maximum": 9},
                                                   "unit": {"enum": ["s", "ms"]}},
                  "required": ["max", "unit"], "additionalProperties": False},
    },
    "type": "object",
    "properties": {
        "mode": {"enum": ["fast", "slow", 3]},
        "level": {"anyOf": [{"enum": ["low", "high"]}, {"type": "null"}]},
        "limit": {"$ref": "#/$defs/Limit"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "retries": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
        "dry_run": {"type": "boolean"},
    },
    "required": ["mode", "level", "limit", "tags", "retries"],
    "additionalProperties": False,
}
CONFIGURE_TOOL = {"type": "function", "function": {"name": "configure", "parameters": CONFIGURE_PARAMETERS}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "configure"}}])
def test_forced_xml_calls_follow_the_schema_for_listed_object_array_and_nullable_values(coder, model, stream, tool_choice):
    validator = jsonschema.Draft202012Validator(CONFIGURE_PARAMETERS)
    seen = {}
    for seed in range(4):
        kw = dict(model=model, messages=QUESTION, tools=[CONFIGURE_TOOL], tool_choice=tool_choice, parallel_tool_calls=False,
                  max_tokens=400, temperature=1.0, seed=seed, extra_body=NO_THINKING)
        if stream:
            content, _, calls, finish = collect_stream(coder.chat.completions.create(stream=True, **kw))
        else:
            choice = coder.chat.completions.create(**kw).choices[0]
            content, finish = choice.message.content, choice.finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
        assert [c["name"] for c in calls] == ["configure"], (seed, content, calls, finish)
        arguments = json.loads(calls[0]["arguments"])
        # The independent validator: every value, typed back by the parser,
        # is what the schema allows.
        errors = [e.message for e in validator.iter_errors(arguments)]
        assert not errors, (seed, arguments, errors)
        for key, value in arguments.items():
            seen.setdefault(key, set()).add(json.dumps(value))
    # The random model's samples vary: the grammar, not luck, made them valid.
    assert any(len(values) > 1 for values in seen.values()), seen


def test_a_listed_value_the_format_cannot_write_is_refused_naming_tools(coder, model):
    tool = {"type": "function", "function": {"name": "close", "parameters": {
        "type": "object", "properties": {"tag": {"enum": ["</parameter>"]}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        coder.chat.completions.create(model=model, messages=QUESTION, tools=[tool], tool_choice="required", max_tokens=5)
    assert e.value.body["param"] == "tools" and "tag" in e.value.body["message"], e.value.body
