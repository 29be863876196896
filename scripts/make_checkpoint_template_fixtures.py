#!/usr/bin/env python3
"""Renders conversations with Hugging Face transformers' `apply_chat_template`
under the chat templates the Qwen3 agent checkpoints ship
(crates/text-front/tests/fixtures/templates/*.jinja, provenance in the README
there) and writes the results as reference fixtures for kvc's renderer.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install -r scripts/requirements-chat-templates.txt
    /tmp/refvenv/bin/python scripts/make_checkpoint_template_fixtures.py \
        [--tokenizer /work/shared/data/qwen3-tokenizer] \
        [--out crates/text-front/tests/fixtures/checkpoint_template_cases.json]

The tokenizer only supplies transformers' environment (its special tokens);
every case passes the checkpoint's template as `chat_template=`.

Messages are stored as an OpenAI client sends them (`content: null` beside
`tool_calls`, `arguments` as a JSON string). transformers would fail on or
print those raw, so the reference is rendered from them as vLLM and kvc hand
them to a template: `content: null` -> "", `arguments` holding a JSON object
-> that object (`as_template_input` below). Each case: {template, name,
messages, tools|null, add_generation_prompt, kwargs, expected}; where
transformers raises (a template that cannot render the input, e.g. the July
2025 Coder template on a tool without `parameters`), `expected` is null and
`error` holds its message.
`crates/text-front/tests/checkpoint_templates.rs` renders every case with kvc and
asserts byte equality with `expected`.
"""

import copy
import json

from template_reference import ROOT, arguments, assistant, call, case, render, system, tokenizer, tool, user, write

TEMPLATES = ROOT / "crates/text-front/tests/fixtures/templates"

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "  Read a file of the repository.\nReturns its text.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the repository root"},
                "start_line": {"type": "integer", "minimum": 1, "default": 1},
                "max_lines": {"type": ["integer", "null"], "description": "null: to the end"},
                "ratio": {"type": "number", "minimum": 1e-05, "maximum": 1e20, "enum": [0.5, 1, True, None, "x"]},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
}

EDIT_FILE = {
    "type": "function",
    "function": {
        "name": "edit_file",
        "description": "Apply edits to a file; 编辑文件 ✏️",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "edits": {
                    "type": "array",
                    "description": "Replacements, applied in order",
                    "items": {
                        "type": "object",
                        "properties": {
                            "old": {"type": "string"},
                            "new": {"type": "string"},
                            "count": {"type": "integer", "default": 1},
                        },
                        "required": ["old", "new"],
                    },
                },
                "options": {
                    "type": "object",
                    "properties": {
                        "dry_run": {"type": "boolean", "default": False},
                        "encoding": {"type": "string", "enum": ["utf-8", "latin-1"]},
                        "threshold": {"type": "number", "default": 0.5, "maximum": 1e20, "minimum": 1e-05},
                    },
                },
            },
            "required": ["path", "edits"],
        },
    },
}

RUN_SHELL = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command in the sandbox.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "e.g. \"cargo test\" or 'ls -la'"},
                "timeout_s": {"type": "number", "default": 60.0},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "required": ["command"],
        },
    },
}

# A tool as some clients send it: no description, no parameters.
PING = {"type": "function", "function": {"name": "ping"}}

TOOLS = [READ_FILE, EDIT_FILE, RUN_SHELL]


def cases():
    edit_args = {
        "path": "src/lib.rs",
        "edits": [{"old": "fn a()", "new": "fn b()", "count": 2}, {"old": "x\ty", "new": "“quoted” é"}],
        "options": {"dry_run": True, "encoding": "utf-8", "threshold": 0.25},
    }
    multi_turn = [
        system("You are a coding agent. Be terse."),
        user("What does src/main.rs print?"),
        assistant(
            "<think>\nI should read the file.\n</think>\n\nLet me look.",
            tool_calls=[call("call_1", "read_file", {"path": "src/main.rs", "max_lines": None})],
        ),
        tool("call_1", 'fn main() {\n    println!("hi");\n}'),
        assistant("It prints `hi`.", reasoning="The file prints hi."),
        user("Change it to print bye, then run it."),
        assistant(
            None,
            reasoning="Edit, then run.",
            tool_calls=[
                call("call_2", "edit_file", json.dumps({"path": "src/main.rs", "edits": [{"old": "hi", "new": "bye"}]})),
                call("call_3", "run_shell", '{"command": "cargo run -q", "timeout_s": 30.5}'),
            ],
        ),
        tool("call_2", '{"ok": true, "replaced": 1}'),
        tool("call_3", "bye\n"),
    ]
    return [
        case("user_only", [user("Hello!")]),
        case("system_and_user", [system("You are terse."), user("What is 2+2?")]),
        case("tools_without_system", [user("List the files.")], tools=TOOLS + [PING]),
        case("tools_with_system", [system("You are a coding agent."), user("Fix the build.")], tools=TOOLS),
        case(
            "tool_call_with_object_arguments_and_one_result",
            [
                user("Read src/lib.rs"),
                assistant("", tool_calls=[call("c1", "read_file", {"path": "src/lib.rs", "start_line": 3})]),
                tool("c1", "pub fn add(a: i32, b: i32) -> i32 { a + b }"),
            ],
            tools=TOOLS,
        ),
        case(
            "tool_calls_with_string_arguments_and_consecutive_results",
            [
                system("You edit code."),
                user("Rename a to b in src/lib.rs and test."),
                assistant(
                    "I'll edit, then test.",
                    tool_calls=[
                        call("c1", "edit_file", json.dumps(edit_args)),
                        call("c2", "run_shell", json.dumps({"command": "cargo test", "env": {"RUST_LOG": "debug"}, "timeout_s": 120})),
                    ],
                ),
                tool("c1", '{"ok": true}'),
                tool("c2", "test result: ok. 3 passed; 0 failed"),
            ],
            tools=TOOLS,
        ),
        case(
            "tool_call_with_null_content_and_scalar_arguments",
            [
                user("Read 10 lines of a.txt"),
                assistant(
                    None,
                    tool_calls=[call("c1", "read_file", '{"path": "a.txt", "start_line": 1, "max_lines": 10, "ratio": 1e-05, "big": 1e16, "exact": true, "none": null}')],
                ),
                tool("c1", "line 1\nline 2"),
                assistant("It has two lines."),
            ],
            tools=TOOLS,
            add_generation_prompt=False,
        ),
        case("multi_turn_with_reasoning_and_tools", multi_turn, tools=TOOLS),
        case(
            "multi_turn_ends_with_final_answer",
            multi_turn + [assistant("<think>\nIt printed bye.\n</think>\n\nDone: it prints `bye`.")],
            tools=TOOLS,
            add_generation_prompt=False,
        ),
        case(
            "multi_turn_next_question",
            multi_turn + [assistant("Done.", reasoning="It printed bye."), user("Thanks. And in French?")],
            tools=TOOLS,
        ),
        case(
            "previous_reasoning_without_tools",
            [user("What is 3*7?"), assistant("<think>\n3 times 7 is 21.\n</think>\n\n21"), user("And 3*8?")],
        ),
        case(
            "last_assistant_reasoning_is_kept",
            [user("Capital of France?"), assistant("Paris.", reasoning="\nThe user asks about France.\n")],
            add_generation_prompt=False,
        ),
        case(
            "tool_response_sent_as_a_user_message",
            [
                user("Ping the server."),
                assistant("", reasoning="Call ping.", tool_calls=[call("c1", "ping", "{}")]),
                user("<tool_response>\npong\n</tool_response>"),
            ],
            tools=[PING],
        ),
        case("enable_thinking_false_is_passed", [user("Answer quickly: 1+1?")], kwargs={"enable_thinking": False}),
        case(
            "non_ascii_and_empty_tool_result",
            [
                system("你是一个编程助手。"),
                user("运行 ls 🌤️ — “quotes” \\ back\\slash\ttab"),
                assistant("", tool_calls=[call("c1", "run_shell", {"command": "ls -la /tmp/数据"})]),
                tool("c1", ""),
            ],
            tools=TOOLS,
        ),
    ]


def as_template_input(messages):
    """What vLLM and kvc hand the template: null content as "", JSON-object
    argument strings parsed."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("content") is None:
            m["content"] = ""
        for c in m.get("tool_calls") or []:
            args = c.get("function", {}).get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    c["function"]["arguments"] = parsed
    return out


def main():
    args = arguments("crates/text-front/tests/fixtures/checkpoint_template_cases.json")
    tok = tokenizer(args.tokenizer)
    out = []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        template = path.read_text(encoding="utf-8")
        for c in cases():
            try:
                expected = render(tok, c, as_template_input(c["messages"]), chat_template=template)
            except Exception as e:  # the template itself refuses the input
                out.append({"template": path.name, **c, "expected": None, "error": f"{type(e).__name__}: {e}"})
                continue
            out.append({"template": path.name, **c, "expected": expected})
    write(out, args.out, indent=1)


if __name__ == "__main__":
    main()
