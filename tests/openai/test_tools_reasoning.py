"""Qwen3 tool calls and reasoning, end to end through the real openai
client.

The embedded model has random weights: it never writes `<think>` or
`<tool_call>` on its own. The tests use two honest API features instead of
a test-only backdoor:

- `continue_final_message` (vLLM's extension): the client prefills the
  start of the assistant's answer, e.g. a reasoning block and an unfinished
  `<tool_call>`. kvc starts its parsers from the open assistant turn of the
  prompt (as vLLM reads the prompt to decide whether reasoning has ended),
  so a block opened in the prefill and closed by the model is one call;
  `echo` returns the continued part too.
- `logit_bias` at +100 makes the model's one generated token the closing
  tag (`</tool_call>` = 151658): the parsers must recognise a tag the model
  generated, token by token, in a stream.

The parsers themselves are tested on real Qwen3 token streams in Rust
(chat_output.rs, tool_parser.rs, reasoning_parser.rs).
"""

import json

import openai
import pytest

from conftest import collect_stream
from qwen3_template import render

TOOL_CALL_END = 151658
IM_END = 151645
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
REASONING = "The user wants the weather in Paris; I will call the tool."
OPEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
PREFILL = f"<think>\n{REASONING}\n</think>\n\n{OPEN_CALL}"


def continue_with(client, model, prefill, *, echo=True, force=TOOL_CALL_END, tools=(WEATHER_TOOL,), **kw):
    """Continues an assistant message that starts with `prefill`; the model
    generates one token, forced to `force`."""
    extra = {"continue_final_message": True, "add_generation_prompt": False, "echo": echo}
    extra.update(kw.pop("extra_body", {}))
    return client.chat.completions.create(
        model=model, messages=[QUESTION, {"role": "assistant", "content": prefill}], tools=list(tools) or openai.NOT_GIVEN,
        max_tokens=1, temperature=0, logit_bias={str(force): 100}, extra_body=extra, **kw)


def test_tool_call_closed_by_the_model_becomes_tool_calls(client, model):
    r = continue_with(client, model, PREFILL, logprobs=True)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.logprobs.content[0].token == "</tool_call>"
    assert r.usage.completion_tokens == 1
    message = choice.message
    assert message.content is None
    assert message.model_extra["reasoning_content"] == REASONING
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_without_echo_only_what_the_model_completed_is_returned(client, model):
    message = continue_with(client, model, PREFILL, echo=False).choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]


def test_streamed_tool_call_arrives_as_openai_deltas(client, model):
    content, reasoning, calls, finish = collect_stream(continue_with(client, model, PREFILL, stream=True))
    assert finish == "tool_calls"
    assert reasoning == REASONING
    assert content == ""
    assert len(calls) == 1 and calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_malformed_tool_json_comes_back_as_text(client, model):
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n'
    r = continue_with(client, model, bad)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == bad + "</tool_call>"
    content, _, calls, finish = collect_stream(continue_with(client, model, bad, stream=True))
    assert (content, calls, finish) == (bad + "</tool_call>", [], "length")


def test_tool_choice_none_renders_tools_but_leaves_the_text_alone(client, model):
    r = continue_with(client, model, OPEN_CALL, tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == OPEN_CALL + "</tool_call>"
    assert r.choices[0].finish_reason == "length"


def test_reasoning_is_separated_from_generated_content(client, model):
    prefill = "<think>\nweighing the options\n</think>\n\nThe answer is"
    kw = dict(max_tokens=6, temperature=0, extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                       "echo": True, "ignore_eos": True})
    messages = [QUESTION, {"role": "assistant", "content": prefill}]
    r = client.chat.completions.create(model=model, messages=messages, **kw)
    message = r.choices[0].message
    assert message.model_extra["reasoning_content"] == "weighing the options"
    assert message.content.startswith("The answer is") and len(message.content) > len("The answer is")
    content, reasoning, _, finish = collect_stream(
        client.chat.completions.create(model=model, messages=messages, stream=True, **kw))
    assert (content, reasoning, finish) == (message.content, "weighing the options", "length")


def test_thinking_disabled_answer_has_no_reasoning(client, model):
    r = client.chat.completions.create(model=model, messages=[QUESTION], max_tokens=5, temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True})
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    assert r.choices[0].message.content


def test_tool_round_trip_is_accepted_and_rendered_like_the_reference_template(client, model):
    # Turn 1: the assistant calls the tool.
    first = continue_with(client, model, PREFILL).choices[0].message
    call = first.tool_calls[0]
    # Turn 2: the call and the tool's result go back.
    messages = [
        QUESTION,
        {"role": "assistant", "content": first.content, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "weather": "sunny", "celsius": 22})},
    ]
    r = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The server rendered exactly what the reference template renders: the
    # same text sent as a raw prompt counts the same tokens.
    rendered = render(messages, tools=[WEATHER_TOOL])
    assert "<tool_response>" in rendered and '"arguments": {"city": "Paris"}' in rendered
    raw = client.completions.create(model=model, prompt=rendered, max_tokens=1, extra_body={"add_special_tokens": False})
    assert r.usage.prompt_tokens == raw.usage.prompt_tokens


def test_continued_prompt_ends_with_the_prefill(client, model):
    r = continue_with(client, model, PREFILL)
    rendered = render([QUESTION, {"role": "assistant", "content": PREFILL}], tools=[WEATHER_TOOL], add_generation_prompt=False)
    cut = rendered[: rendered.rindex(PREFILL.rstrip()) + len(PREFILL.rstrip())]
    raw = client.completions.create(model=model, prompt=cut, max_tokens=1, extra_body={"add_special_tokens": False})
    assert r.usage.prompt_tokens == raw.usage.prompt_tokens
