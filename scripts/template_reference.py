"""What the chat-template fixture scripts share
(make_chat_template_fixtures.py, make_checkpoint_template_fixtures.py):
a case and its messages, their command line, transformers' tokenizer
(offline), a case rendered as transformers renders it, and the fixture
file."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


def case(name, messages, tools=None, add_generation_prompt=True, kwargs=None):
    return {
        "name": name,
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": add_generation_prompt,
        "kwargs": kwargs or {},
    }


def system(content):
    return {"role": "system", "content": content}


def user(content):
    return {"role": "user", "content": content}


def assistant(content, reasoning=None, tool_calls=None):
    """`reasoning`: its `reasoning_content`; either key only where given."""
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if tool_calls is not None:
        m["tool_calls"] = tool_calls
    return m


def call(cid, name, arguments):
    """A tool call; `cid` None: one without an `id`."""
    return {**({"id": cid} if cid is not None else {}), "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(cid, content):
    """A tool result; `cid` None: one without a `tool_call_id`."""
    return {"role": "tool", **({"tool_call_id": cid} if cid is not None else {}), "content": content}


def arguments(default_out):
    """`--tokenizer` and `--out` (relative to the repository by default)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/work/shared/data/qwen3-tokenizer")
    ap.add_argument("--out", default=str(ROOT / default_out))
    return ap.parse_args()


def tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def render(tok, c, messages, **template):
    """Case `c` with `messages` through `apply_chat_template` (`template`:
    `chat_template=` where the case's template is not the tokenizer's)."""
    return tok.apply_chat_template(
        messages,
        tools=c["tools"],
        add_generation_prompt=c["add_generation_prompt"],
        tokenize=False,
        **template,
        **c["kwargs"],
    )


def write(out, path, indent):
    """The rendered cases (`expected`: the text, or None where rendering
    failed) as the fixture file at `path`."""
    for c in out:
        assert c["expected"] is None or isinstance(c["expected"], str), type(c["expected"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=indent)
        f.write("\n")
    print(f"wrote {len(out)} cases to {path}")
