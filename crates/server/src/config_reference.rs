//! docs/configuration.md, generated from the clap definitions: every flag
//! with its value, default, environment variable, choices and help text,
//! grouped by the argument struct that defines it. The test
//! `crates/server/tests/configuration_reference.rs` fails when the file
//! differs; `KVC_UPDATE_DOCS=1 cargo test -p kvc-server --test
//! configuration_reference` rewrites it.

use std::fmt::Write;

use clap::{Arg, ArgAction, Command};

/// The section title of each argument struct (clap names a flattened
/// struct's group after it); an unknown group is titled by its name.
fn section_title(group: &str) -> String {
    match group {
        "Args" => "Model, engine and KV cache".into(),
        "ServingArgs" => "HTTP serving, security and limits".into(),
        "DisaggArgs" => "Disaggregation (prefill / decode) and routing".into(),
        other => other.to_string(),
    }
}

const INTRO: &str = "\
# kvc-server configuration reference

Generated from the flag definitions (`crates/server/src/args.rs`) by
`crates/server/src/config_reference.rs`; do not edit by hand. After changing
a flag, regenerate it with

```sh
KVC_UPDATE_DOCS=1 cargo test -p kvc-server --test configuration_reference
```

(the same test, without the variable, fails while this file is out of date).
Flags follow vLLM's spelling where vLLM has the same setting. `kvc-server
--help` prints the same text; docs/deployment.md says how to combine them.

## Environment variables

| variable | meaning |
| --- | --- |
| `HF_ENDPOINT` | hub to download `--model ORG/NAME` from (a mirror); default `https://huggingface.co` |
| `HF_TOKEN` | hub token for gated and private models (else `HUGGING_FACE_HUB_TOKEN`, else the token file of `huggingface-cli login` in `$HF_HOME`) |
| `HF_HUB_OFFLINE` | `1`: never contact the hub; hub models must already be in the cache |
| `HF_HUB_CACHE`, `HF_HOME` | the hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (`--download-dir` overrides) |
| `RUST_LOG` | log filter (default `info`), e.g. `info,kvc_server=debug` |
| `KVC_API_KEY`, `KVC_CLUSTER_TOKEN` | as `--api-key` and `--cluster-token` (kept out of `ps` and shell history) |

## Serving Qwen3-Coder-30B-A3B-Instruct for an agent

```sh
kvc-server --model Qwen/Qwen3-Coder-30B-A3B-Instruct --served-model-name qwen3-coder \\
  --tool-call-parser qwen3_coder --max-model-len 131072
```

- `--tool-call-parser qwen3_coder`: the checkpoint writes calls as
  `<function=...><parameter=...>`; `auto` (the default) reads that off its
  chat template too. Tool calls are parsed whenever a request has tools and
  `tool_choice` is not `\"none\"`: vLLM's `--enable-auto-tool-choice` is
  accepted, so vLLM command lines carry over, and changes nothing.
- `--chat-template FILE` (vLLM's flag) serves another template than the
  checkpoint's, e.g. the July 2025 revision that GGUF conversions embed;
  `--tool-call-parser auto` then reads the format off that file.
- `--max-model-len`: the checkpoint's window is 262,144 tokens; its KV is
  96 KiB a token (12 GiB for a 131,072-token sequence), so size
  `--kv-cache-memory` / `--num-kv-blocks` for the sessions to keep.
- Up to 1,048,576 tokens with YaRN, from the checkpoint's config as Qwen
  documents it: add `\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0,
  \"original_max_position_embeddings\": 262144}` to a local copy's
  `config.json` and serve that directory with `--max-model-len 1048576`
  (CPU and CUDA).
- Sessions (`session_id` / `x-session-id`): the Coder template re-renders no
  earlier turn, so each turn computes only its new messages (README, \"Chat
  templates, tools and reasoning\").
";

fn flag_line(arg: &Arg) -> String {
    let mut s = match (arg.get_long(), arg.get_short()) {
        (Some(l), Some(c)) => format!("-{c}, --{l}"),
        (Some(l), None) => format!("--{l}"),
        (None, Some(c)) => format!("-{c}"),
        (None, None) => arg.get_id().to_string(),
    };
    if arg.get_action().takes_values() {
        let names: Vec<String> = arg
            .get_value_names()
            .map(|n| n.iter().map(|v| v.to_string()).collect())
            .unwrap_or_else(|| vec![arg.get_id().to_string().to_uppercase()]);
        write!(s, " <{}>", names.join("> <")).unwrap();
    }
    s
}

fn help_text(arg: &Arg) -> String {
    arg.get_long_help().or_else(|| arg.get_help()).map(|h| h.to_string()).unwrap_or_default()
}

fn describe(out: &mut String, arg: &Arg) {
    writeln!(out, "### `{}`\n", flag_line(arg)).unwrap();
    let mut facts = Vec::new();
    let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if !defaults.is_empty() {
        facts.push(format!("Default: `{}`.", defaults.join(" ")));
    } else if matches!(arg.get_action(), ArgAction::SetTrue) {
        facts.push("A switch (off unless given).".to_string());
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        facts.push("Repeatable.".to_string());
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("Environment: `{}`.", env.to_string_lossy()));
    }
    if !facts.is_empty() {
        writeln!(out, "{}\n", facts.join(" ")).unwrap();
    }
    let help = help_text(arg);
    if !help.is_empty() {
        writeln!(out, "{}\n", help.trim_end()).unwrap();
    }
    let values: Vec<_> = arg.get_possible_values().into_iter().filter(|v| !v.is_hide_set()).collect();
    if !values.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        writeln!(out, "Values:\n").unwrap();
        for v in values {
            match v.get_help() {
                Some(h) => writeln!(out, "- `{}`: {}", v.get_name(), h).unwrap(),
                None => writeln!(out, "- `{}`", v.get_name()).unwrap(),
            }
        }
        writeln!(out).unwrap();
    }
}

/// Every documented flag of `cmd` (help and version excluded).
pub fn documented_args(cmd: &Command) -> Vec<&Arg> {
    cmd.get_arguments().filter(|a| !a.is_hide_set() && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)).collect()
}

/// The whole reference for `cmd` (kvc-server's `Args::command()`).
pub fn render(cmd: &Command) -> String {
    let mut out = String::from(INTRO);
    if let Some(about) = cmd.get_about() {
        writeln!(out, "\n## Flags\n\n{about}\n").unwrap();
    }
    let args = documented_args(cmd);
    // Sections in the order their groups are defined; flags in definition order.
    let mut sections: Vec<(String, Vec<&Arg>)> = Vec::new();
    for arg in args {
        let group = cmd
            .get_groups()
            .find(|g| g.get_args().any(|id| id == arg.get_id()))
            .map(|g| g.get_id().to_string())
            .unwrap_or_else(|| "Args".to_string());
        let title = section_title(&group);
        match sections.iter_mut().find(|(t, _)| *t == title) {
            Some((_, list)) => list.push(arg),
            None => sections.push((title, vec![arg])),
        }
    }
    for (title, list) in sections {
        writeln!(out, "## {title}\n").unwrap();
        for arg in list {
            describe(&mut out, arg);
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}
