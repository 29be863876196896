#!/usr/bin/env python3
"""Renders a set of conversations with Hugging Face transformers' own
`apply_chat_template` for the real Qwen3 tokenizer and writes them as
reference fixtures for kvc's minijinja renderer.

    /tmp/refvenv/bin/python scripts/make_chat_template_fixtures.py \
        [--tokenizer /work/shared/data/qwen3-tokenizer] \
        [--out crates/text-front/tests/fixtures/chat_template_cases.json]

Each case: {name, messages, tools|null, add_generation_prompt, kwargs, expected}.
`crates/text-front/tests/chat_template_reference.rs` renders every case with the
template embedded in kvc and asserts byte equality with `expected`.
"""

from template_reference import arguments, assistant, call, case, render, system, tokenizer, tool, user, write

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\" or 'Tokyo'"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.\nReturns <= 10 hits & snippets; 搜索文档 🔎",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10, "default": 5},
                "threshold": {"type": "number", "default": 0.5, "minimum": 1e-05, "maximum": 1e20},
                "exact": {"type": "boolean", "default": False},
                "filter": {"type": ["string", "null"], "default": None},
                "path": {"type": "string", "default": "C:\\docs\\\ttab"},
            },
            "required": ["query"],
        },
    },
}

TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def cases():
    return [
        case("single_user", [user("Hello!")]),
        case("system_and_user", [system("You are a terse assistant."), user("What is 2+2?")]),
        case(
            "multi_turn",
            [
                system("You are helpful."),
                user("Hi"),
                assistant("Hello! How can I help?"),
                user("Tell me a joke."),
                assistant("Why did the chicken cross the road?"),
                user("Why?"),
            ],
        ),
        case(
            "previous_turn_reasoning_is_dropped",
            [user("What is 3*7?"), assistant("<think>\n3 times 7 is 21.\n</think>\n\n21"), user("And 3*8?")],
        ),
        case(
            "current_turn_reasoning_is_kept",
            [user("What is 3*7?"), assistant("<think>\n3 times 7 is 21.\n</think>\n\n21")],
            add_generation_prompt=False,
        ),
        case(
            "reasoning_content_field",
            [user("Capital of France?"), assistant("Paris.", reasoning="The user asks about France.")],
            add_generation_prompt=False,
        ),
        case("enable_thinking_false", [user("Answer quickly: 1+1?")], kwargs={"enable_thinking": False}),
        case("enable_thinking_true", [user("Answer quickly: 1+1?")], kwargs={"enable_thinking": True}),
        case("tools", [user("What's the weather in Paris?")], tools=TOOLS),
        case("tools_with_system", [system("You are a weather bot."), user("Weather in Tokyo?")], tools=TOOLS),
        case(
            "tool_call_and_result",
            [
                user("What's the weather in Paris and in 東京?"),
                assistant(
                    "",
                    tool_calls=[
                        call("call_1", "get_weather", {"city": "Paris"}),
                        call("call_2", "get_weather", {"city": "東京", "unit": "celsius"}),
                    ],
                ),
                tool("call_1", "{\"temp\": 18, \"sky\": \"cloudy\"}"),
                tool("call_2", "{\"temp\": 22.5, \"sky\": \"晴れ\"}"),
            ],
            tools=TOOLS,
        ),
        case(
            "tool_call_with_text_then_final_answer",
            [
                user("Search the docs for 'rope scaling'."),
                assistant(
                    "<think>\nI should search.\n</think>\n\nLet me search.",
                    tool_calls=[
                        call(None, "search_docs", {"query": "rope scaling", "limit": 3, "threshold": 0.25, "exact": True}),
                    ],
                ),
                tool(None, "1 hit: rope_scaling.md"),
                assistant("<think>\nFound it.\n</think>\n\nSee rope_scaling.md."),
            ],
            tools=TOOLS,
            add_generation_prompt=False,
        ),
        case("add_generation_prompt_false", [user("Hi"), assistant("Hello.")], add_generation_prompt=False),
        case(
            "non_ascii",
            [
                system("你是一个乐于助人的助手。"),
                user("你好！今天天气怎么样？🌤️👍🏽 Ünïcödé — “quotes” \\ back\\slash\ttab"),
                assistant("今天晴朗 ☀️，气温 25°C。"),
                user("谢谢 🙏\n\n多行\n文本"),
            ],
        ),
        case("extra_unused_kwargs", [user("ping")], kwargs={"some_flag": 1, "enable_thinking": True}),
    ]


def main():
    args = arguments("crates/text-front/tests/fixtures/chat_template_cases.json")
    tok = tokenizer(args.tokenizer)
    write([{**c, "expected": render(tok, c, c["messages"])} for c in cases()], args.out, indent=2)


if __name__ == "__main__":
    main()
