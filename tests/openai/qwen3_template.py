"""An independent rendering of Qwen3's chat template with jinja2, set up the
way Hugging Face transformers renders chat templates (sandboxed,
trim_blocks / lstrip_blocks, loop controls, HF's `tojson`), with tool-call
arguments given as JSON strings parsed into objects first (as vLLM does).
Used to check what kvc-server renders."""

import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

CONFIG = Path(__file__).resolve().parents[2] / "crates/text-front/assets/qwen3/tokenizer_config.json"


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _normalize(messages):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        calls = []
        for call in m.get("tool_calls") or []:
            call = json.loads(json.dumps(call))
            args = call["function"].get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                    if isinstance(parsed, dict):
                        call["function"]["arguments"] = parsed
                except ValueError:
                    pass
            calls.append(call)
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


def render(messages, tools=None, add_generation_prompt=True, source=None, **kwargs) -> str:
    """Renders with Qwen3's template, or with `source` (another template's text)."""
    config = json.loads(CONFIG.read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    template = env.from_string(source if source is not None else config["chat_template"])
    return template.render(messages=_normalize(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                           bos_token=None, eos_token=config.get("eos_token"), **kwargs)
