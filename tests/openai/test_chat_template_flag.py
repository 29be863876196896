"""`--chat-template` (vLLM's flag): a template file replaces the model's, and
session KV is reused turn by turn over HTTP under the Qwen3-Coder
checkpoint's template (issue 34, item 4, over the wire).

The embedded model has random weights, so every answer here is forced: tool
calls by a named `tool_choice` whose parameters each list one value (the
qwen3_coder grammar then leaves the model no choice), text
answers by a one-choice `structured_outputs`. The client sends each answer
back as the response returned it, as an agent does; the prompts are checked
against jinja2's rendering of the same template file (set up as transformers
renders chat templates), and the reuse against the session's resident
tokens as `/v1/sessions/{id}` reports them.
"""

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import ROOT
from qwen3_template import render

CODER_TEMPLATE = ROOT / "crates/text-front/tests/fixtures/templates/qwen3-coder-30b-a3b-instruct.jinja"
BLOCK = 16


def binary() -> str:
    return os.environ.get("KVC_SERVER_BIN", str(ROOT / "target" / "debug" / "kvc-server"))


@pytest.mark.parametrize("arg, why", [
    ("/no/such/dir/template.jinja", "looks like a file path"),
    ("{% if %}", "does not compile"),
])
def test_an_unreadable_or_broken_template_stops_the_start_naming_the_flag(arg, why):
    done = subprocess.run([binary(), "--port", "0", "--chat-template", arg], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--chat-template" in done.stderr and why in done.stderr, done.stderr


def test_the_router_refuses_the_flag_by_name():
    done = subprocess.run([binary(), "--role", "router", "--decode-peer", "http://127.0.0.1:9", "--cluster-token", "t",
                           "--chat-template", str(CODER_TEMPLATE)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--chat-template" in done.stderr, done.stderr


def tool(name, properties):
    return {"type": "function", "function": {"name": name, "description": f"{name} in the repository.", "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


# Every parameter lists one value, so a forced call is fully determined and
# llguidance forces it in the tokens the template's rendering tokenizes to.
# (Given a choice, the random model may take a split no tokenizer makes,
# `sr` + `c` for `src`, which a re-rendered prompt does not reproduce: the
# session then serves only the blocks before it.)
TOOLS = [
    tool("read_file", {"path": {"type": "string", "enum": ["src/parse.rs"]}}),
    tool("run_shell", {"command": {"type": "string", "enum": ["cargo test -p parser"]},
                       "timeout_s": {"type": "integer", "enum": [120]}}),
    tool("edit_file", {"path": {"type": "string", "enum": ["src/parse.rs"]},
                       "edit": {"type": "string", "enum": ["guard empty input"]}}),
]


def named(name):
    return {"tool_choice": {"type": "function", "function": {"name": name}}}


THINK = 151667  # `<think>`: kvc lets a constrained answer open with reasoning


def says(text):
    # The Coder template has no reasoning, but a grammar's answer may still
    # start with `<think>` (the random model sometimes does): banned here.
    return {"tool_choice": "auto", "logit_bias": {str(THINK): -100}, "extra_body": {"structured_outputs": {"choice": [text]}}}


def user(text):
    return [{"role": "user", "content": text}]


RESULT = "running 12 tests\n............\ntest result: ok. 12 passed; 0 failed"
# Before each turn: what arrives (None: the results of the previous turn's
# calls), then how the answer is forced.
SCRIPT = [
    (user("The parser tests fail since the last change to src/parse.rs. Find out why and fix it."), named("read_file")),
    (None, named("run_shell")),
    (None, named("edit_file")),
    (None, named("run_shell")),
    (None, says("Fixed: `parse` now returns `Error::Empty` for empty input; all 12 tests pass.")),
    (user("Thanks. Add a regression test for the empty input, then run fmt."), named("read_file")),
    (None, named("edit_file")),
    (None, named("run_shell")),
    (None, says("Added `empty_input_is_an_error`; the tests and fmt are clean.")),
    (user("Good. Anything else to look at?"), says("No: the change is complete.")),
]


@pytest.fixture(scope="module")
def coder_server(start_server):
    # Only the session path reuses (no prefix cache to hit across turns).
    return start_server("--chat-template", str(CODER_TEMPLATE), "--no-enable-prefix-caching", "--block-size", str(BLOCK))


def prompt_tokens_of(srv, model, text):
    """Tokens of `text` as a raw prompt (no template)."""
    return srv.client().completions.create(model=model, prompt=text, max_tokens=1, temperature=0).usage.prompt_tokens


def resident_tokens(srv, session):
    r = httpx.get(f"{srv.base_url}/v1/sessions/{session}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["resident_tokens"]


def test_a_ten_turn_tool_conversation_reuses_the_session_each_turn_over_http(coder_server):
    client = coder_server.client()
    model = client.models.list().data[0].id
    source = CODER_TEMPLATE.read_text()
    session = "coder-template-reuse"
    history = [{"role": "system", "content": "You are a coding agent working in a Rust repository."}]
    previous_text, previous_resident, report = None, 0, []
    for turn, (incoming, force) in enumerate(SCRIPT, start=1):
        if incoming is not None:
            history += incoming
        # The model's own template, rendered independently: each prompt
        # extends the previous prompt and the answer as sent back.
        prompt_text = render(history, tools=TOOLS, add_generation_prompt=True, source=source)
        if previous_text is not None:
            assert prompt_text.startswith(previous_text), f"turn {turn}: the template re-rendered history"
        extra = {"session_id": session, **force.get("extra_body", {})}
        resp = client.chat.completions.create(model=model, messages=history, tools=TOOLS, tool_choice=force["tool_choice"],
                                              logit_bias=force.get("logit_bias"), max_tokens=300, temperature=0, extra_body=extra)
        choice, usage = resp.choices[0], resp.usage
        assert choice.finish_reason in ("stop", "tool_calls"), (turn, choice)
        if turn in (1, len(SCRIPT)):
            # The server rendered the --chat-template file, not the model's template.
            assert usage.prompt_tokens == prompt_tokens_of(coder_server, model, prompt_text), turn
        cached = usage.prompt_tokens_details.cached_tokens
        # kvc reuses the whole blocks of what the session holds (the previous
        # prompt and answer, less the last sampled token), at most the
        # prompt less one token.
        expected = min(previous_resident, usage.prompt_tokens - 1) // BLOCK * BLOCK
        assert cached == expected, (turn, cached, expected, previous_resident, usage)
        assert resp.model_extra["kvc"]["reason"] == ("cold" if turn == 1 else "session_hit"), (turn, resp.model_extra["kvc"])
        report.append((turn, usage.prompt_tokens, previous_resident, cached))

        message = choice.message
        sent_back = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            assert "tool_choice" in force and force["tool_choice"] != "auto", (turn, message)
            sent_back["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in message.tool_calls]
        else:
            assert message.content == force["extra_body"]["structured_outputs"]["choice"][0], (turn, message)
        history.append(sent_back)
        previous_text = render(history, tools=TOOLS, add_generation_prompt=False, source=source)
        previous_text = previous_text[:previous_text.rindex("<|im_end|>")]
        previous_resident = resident_tokens(coder_server, session)
        assert previous_resident == usage.prompt_tokens + usage.completion_tokens - 1, (turn, previous_resident, usage)
        for call in message.tool_calls or []:
            arguments = json.loads(call.function.arguments)
            history.append({"role": "tool", "tool_call_id": call.id, "content": f"{call.function.name}({arguments}): {RESULT}"})
    later = report[1:]
    share = sum(c for *_, c in later) / sum(p for _, _, p, _ in later)
    print("\nturn | prompt tokens | session tokens before | reused\n" + "\n".join(" | ".join(map(str, r)) for r in report))
    print(f"turns 2-{len(report)}: {share:.1%} of the session's tokens reused")
    # Every turn after the first reuses the session: its held tokens, less
    # at most one partial block.
    assert all(c > p - BLOCK for _, _, p, c in later), report
