//! The serving and security flags ([`ServingArgs`]: API keys and key
//! files, cluster token, limits, timeouts) and their mapping onto
//! [`ServerConfig`].

use std::time::Duration;

use super::{parse_bytes, parse_positive_f64};
use crate::state::ServerConfig;
use crate::tool_parser::ToolCallFormat;

/// Security, limits and lifecycle of the HTTP front (see [`ServerConfig`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ServingArgs {
    /// Require `Authorization: Bearer <key>` on /v1/* (/health and /metrics
    /// stay open). Repeat it for several keys: each key then has its own
    /// sessions (another key's session id is a 404).
    #[arg(long, env = "KVC_API_KEY", hide_env_values = true)]
    pub api_key: Vec<String>,

    /// More API keys, one per line (blank lines and lines starting with #
    /// skipped); as --api-key.
    #[arg(long, value_parser = parse_key_file)]
    pub api_key_file: Option<KeyFile>,

    /// With several API keys: keep each key's prefix-cache blocks apart too
    /// (no key reuses, or learns by timing, another key's cached prompts).
    #[arg(long)]
    pub isolate_cache_per_key: bool,

    /// Token that worker-to-worker calls (/internal/*) must carry in
    /// `x-kvc-cluster-token`; without it those routes are off.
    #[arg(long, env = "KVC_CLUSTER_TOKEN", hide_env_values = true)]
    pub cluster_token: Option<String>,

    /// Largest request body accepted (413 beyond); units as --kv-cache-memory.
    #[arg(long, default_value = "16MiB", value_parser = parse_bytes)]
    pub max_request_body_bytes: usize,

    /// Most prompt tokens accepted (400 beyond); default: --max-model-len.
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,

    /// Generation requests served at once (0: no limit).
    #[arg(long, default_value_t = 1024)]
    pub max_concurrent_requests: usize,

    /// Requests that may wait for a slot; beyond it 429 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    pub max_queued_requests: usize,

    /// Refuse a prompt with 429 (and `Retry-After`) when it would wait
    /// longer than this many seconds behind the prefill already queued:
    /// the prompt tokens ahead over the rate the backlog has drained at
    /// (`kvc_decisions_total{decision="queue_delay"}`). Past capacity this
    /// keeps the engine on prompts that will be answered instead of ones
    /// whose clients time out in the queue. Default: no bound.
    #[arg(long, value_parser = parse_positive_f64)]
    pub max_queue_delay_s: Option<f64>,

    /// Per-request deadline in seconds, queueing included (0: none). A
    /// request past it is cancelled: 504, or a final error event in a stream.
    #[arg(long, default_value_t = 0)]
    pub request_timeout_s: u64,

    /// On SIGTERM / SIGINT, how long in-flight requests may take to finish
    /// before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout_s: u64,

    /// Client connections open at once; more wait in the listen backlog
    /// until one closes. Default: the open-files limit less 256.
    #[arg(long)]
    pub max_connections: Option<usize>,

    /// Seconds a connection has to send a request's headers, from when it
    /// opens or its previous response ended; then it is closed (idle and
    /// slowloris connections).
    #[arg(long, default_value_t = 30.0, value_parser = parse_positive_f64)]
    pub header_read_timeout_s: f64,

    /// Seconds a request has to send its whole body once its headers are
    /// in; then it is answered 408 and closed (stalled bodies).
    #[arg(long, default_value_t = 30.0, value_parser = parse_positive_f64)]
    pub body_read_timeout_s: f64,

    /// How the model writes tool calls (vLLM's names): `hermes`
    /// (`<tool_call>{json}</tool_call>`, Qwen3), `qwen3_coder` (the XML
    /// `<function=...><parameter=...>` of Qwen3-Coder), or `auto`:
    /// `qwen3_coder` when the chat template shows tools in that XML style,
    /// else `hermes`.
    #[arg(long, value_enum, default_value_t = ToolCallParserArg::Auto)]
    pub tool_call_parser: ToolCallParserArg,

    /// The chat template that renders chat requests instead of the model's
    /// (vLLM's flag): a path to a Jinja file, or the template itself (an
    /// argument holding `{`, `}` or a newline that is not a readable file;
    /// its backslash escapes such as `\n` are decoded, as vLLM decodes
    /// them). `--tool-call-parser auto` reads this template. A path that
    /// cannot be read, or a template that does not compile, stops the start.
    #[arg(long, value_parser = parse_chat_template)]
    pub chat_template: Option<ChatTemplateArg>,

    /// Accepted so that vLLM command lines carry over, and changes nothing:
    /// kvc always returns the model's tool calls as `tool_calls` when a
    /// request has tools and `tool_choice` is not "none" (vLLM needs this
    /// flag for `tool_choice: "auto"`).
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
}

/// `--tool-call-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ToolCallParserArg {
    Hermes,
    #[value(name = "qwen3_coder")]
    Qwen3Coder,
    #[default]
    Auto,
}

impl ToolCallParserArg {
    /// The format to parse with, given the model's chat template source.
    pub fn resolve(self, template: Option<&str>) -> ToolCallFormat {
        match self {
            Self::Hermes => ToolCallFormat::Hermes,
            Self::Qwen3Coder => ToolCallFormat::Qwen3Coder,
            Self::Auto => ToolCallFormat::of_template(template),
        }
    }
}

/// A `--chat-template`: the template's source text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplateArg(pub String);

/// vLLM's reading of `--chat-template`: the file at that path; if it
/// cannot be read, an argument with none of `{`, `}` and a newline is a
/// path that failed (refused), any other is the template itself, its
/// escapes decoded ([`decode_escapes`]). The template must compile.
fn parse_chat_template(arg: &str) -> Result<ChatTemplateArg, String> {
    let source = match std::fs::read_to_string(arg) {
        Ok(text) => text,
        Err(e) if !arg.contains(['{', '}', '\n']) => {
            return Err(format!("{arg:?} looks like a file path, but it cannot be read: {e}"));
        }
        Err(_) => decode_escapes(arg)?,
    };
    kvc_text_front::chat_template::ChatTemplate::new(&source).map_err(|e| format!("the chat template does not compile: {e}"))?;
    Ok(ChatTemplateArg(source))
}

/// Python's `unicode_escape` decoding, which vLLM applies to an inline
/// template: `\\`, `\'`, `\"`, `\a`, `\b`, `\f`, `\n`, `\r`, `\t`, `\v`,
/// octal `\ooo`, `\xhh`, `\uhhhh`, `\Uhhhhhhhh`, and a backslash before a
/// newline drops both; any other escape is kept as written. Unlike Python,
/// characters beyond ASCII are kept as they are (Python reads their UTF-8
/// bytes as Latin-1).
fn decode_escapes(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            return Err("the inline chat template ends with a lone backslash".into());
        };
        let simple = match e {
            '\\' | '\'' | '"' => Some(e),
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            _ => None,
        };
        if let Some(ch) = simple {
            out.push(ch);
            continue;
        }
        let hex = |chars: &mut std::iter::Peekable<std::str::Chars>, n: usize| -> Result<char, String> {
            let digits: String = (0..n).filter_map(|_| chars.next_if(char::is_ascii_hexdigit)).collect();
            u32::from_str_radix(&digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| format!("the inline chat template has a malformed \\{e} escape"))
        };
        match e {
            '\n' => {}
            'x' => out.push(hex(&mut chars, 2)?),
            'u' => out.push(hex(&mut chars, 4)?),
            'U' => out.push(hex(&mut chars, 8)?),
            '0'..='7' => {
                let mut value = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.next_if(|d| d.is_digit(8)) {
                        Some(d) => value = value * 8 + d.to_digit(8).unwrap_or(0),
                        None => break,
                    }
                }
                out.push(char::from_u32(value).unwrap_or('\u{fffd}'));
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// The keys of an `--api-key-file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile(pub Vec<String>);

fn parse_key_file(path: &str) -> Result<KeyFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let keys: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect();
    if keys.is_empty() {
        return Err(format!("{path} holds no key (one per line)"));
    }
    Ok(KeyFile(keys))
}

impl ServingArgs {
    /// Every accepted key: --api-key's, then the key file's; empty ones
    /// dropped, duplicates once.
    pub fn api_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for k in self.api_key.iter().chain(self.api_key_file.iter().flat_map(|f| f.0.iter())) {
            if !k.is_empty() && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
        keys
    }

    pub fn server_config(&self) -> ServerConfig {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        ServerConfig {
            api_keys: self.api_keys(),
            isolate_cache_per_key: self.isolate_cache_per_key,
            cluster_token: self.cluster_token.clone().filter(|k| !k.is_empty()),
            max_request_body_bytes: self.max_request_body_bytes,
            max_prompt_tokens: self.max_prompt_tokens,
            max_concurrent_requests: self.max_concurrent_requests,
            max_queued_requests: self.max_queued_requests,
            request_timeout: secs(self.request_timeout_s),
            max_queue_delay_s: self.max_queue_delay_s,
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout_s),
            conn_limits: crate::shutdown::ConnLimits {
                max_connections: self.max_connections.unwrap_or_else(crate::shutdown::default_max_connections).max(1),
                header_read_timeout: Duration::from_secs_f64(self.header_read_timeout_s),
            },
            body_read_timeout: Duration::from_secs_f64(self.body_read_timeout_s),
            enable_session_cache: true,
            tool_call_parser: self.tool_call_parser,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flag(args: &[&str]) -> Result<ToolCallParserArg, clap::Error> {
        let argv = ["kvc-server"].iter().chain(args).copied();
        crate::args::Args::try_parse_from(argv).map(|a| a.serving.tool_call_parser)
    }

    #[test]
    fn tool_call_parser_defaults_to_auto_which_follows_the_template() {
        assert_eq!(flag(&[]).unwrap(), ToolCallParserArg::Auto);
        let xml = Some("<tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>");
        let json = Some("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
        assert_eq!(ToolCallParserArg::Auto.resolve(xml), ToolCallFormat::Qwen3Coder);
        assert_eq!(ToolCallParserArg::Auto.resolve(json), ToolCallFormat::Hermes);
        assert_eq!(ToolCallParserArg::Auto.resolve(None), ToolCallFormat::Hermes);
        // An explicit choice wins over the template.
        assert_eq!(flag(&["--tool-call-parser", "hermes"]).unwrap().resolve(xml), ToolCallFormat::Hermes);
        assert_eq!(flag(&["--tool-call-parser", "qwen3_coder"]).unwrap().resolve(json), ToolCallFormat::Qwen3Coder);
        assert_eq!(parse_default_config().tool_call_parser, ToolCallParserArg::Auto);
    }

    fn parse_default_config() -> ServerConfig {
        crate::args::Args::try_parse_from(["kvc-server"]).unwrap().serving.server_config()
    }

    #[test]
    fn vllms_auto_tool_choice_flag_is_accepted_and_changes_nothing() {
        let with =
            crate::args::Args::try_parse_from(["kvc-server", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]).unwrap();
        assert!(with.serving.enable_auto_tool_choice);
        assert_eq!(with.serving.tool_call_parser, ToolCallParserArg::Qwen3Coder);
        let without = crate::args::Args::try_parse_from(["kvc-server", "--tool-call-parser", "qwen3_coder"]).unwrap();
        assert!(with.serving.server_config() == without.serving.server_config());
    }

    fn chat_template(args: &[&str]) -> Result<Option<String>, String> {
        let argv = ["kvc-server"].iter().chain(args).copied();
        crate::args::Args::try_parse_from(argv).map(|a| a.serving.chat_template.map(|t| t.0)).map_err(|e| e.to_string())
    }

    #[test]
    fn chat_template_reads_a_file_or_takes_an_inline_template_as_vllm_does() {
        let dir = std::env::temp_dir().join(format!("kvc-chat-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.jinja");
        // A file's text is taken as it is: no escapes decoded.
        std::fs::write(&file, "{% for m in messages %}{{ m.content }}\\n{% endfor %}").unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(
            chat_template(&["--chat-template", path]).unwrap().as_deref(),
            Some("{% for m in messages %}{{ m.content }}\\n{% endfor %}")
        );
        // Inline: Python's unicode_escape (vLLM's codecs.decode).
        let inline = r"{{ messages[0].content }}\n\t\x41\u00e9\101\q\\";
        assert_eq!(chat_template(&["--chat-template", inline]).unwrap().as_deref(), Some("{{ messages[0].content }}\n\tA\u{e9}A\\q\\"));
        assert_eq!(chat_template(&[]).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unreadable_or_broken_chat_template_is_refused_naming_the_flag() {
        for (arg, why) in [
            ("/no/such/template.jinja", "looks like a file path"),
            ("/", "looks like a file path"),
            ("{% if %}", "does not compile"),
            ("{{ x }}\\xZZ", "malformed"),
        ] {
            let e = chat_template(&["--chat-template", arg]).unwrap_err();
            assert!(e.contains("--chat-template") && e.contains(why), "{arg}: {e}");
        }
    }

    #[test]
    fn an_unknown_tool_call_parser_is_refused_listing_the_values() {
        let e = flag(&["--tool-call-parser", "mistral"]).unwrap_err().to_string();
        assert!(e.contains("hermes") && e.contains("qwen3_coder") && e.contains("auto"), "{e}");
    }
}
