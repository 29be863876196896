//! What every worker handler shares: [`AppState`] (the engine handle, the
//! HTTP front's settings, metrics, admission and lifecycle) and
//! [`ServerConfig`], plus the request extensions the route table stamps
//! ([`Arrival`], [`BodyLimit`]). Handlers import this module, never the
//! route table ([`crate::routes`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvc_engine::EngineHandle;

use crate::error::ApiError;
use crate::request_slots::Admission;
use crate::server_metrics::ServerMetrics;
use crate::shutdown::Lifecycle;

/// Default largest request body (vLLM has no limit; 16 MiB holds a
/// ~4M-token prompt).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Security, limits and lifecycle settings of the HTTP front. Its `Debug`
/// never shows the secrets.
#[derive(Clone, PartialEq)]
pub struct ServerConfig {
    /// Accepted API keys (none: no key needed); with several, each is a
    /// namespace for sessions ([`crate::tenant`]).
    pub api_keys: Vec<String>,
    /// `--isolate-cache-per-key`: each key's prefix-cache blocks apart.
    pub isolate_cache_per_key: bool,
    pub cluster_token: Option<String>,
    pub max_request_body_bytes: usize,
    /// `None`: the model's context length.
    pub max_prompt_tokens: Option<usize>,
    /// 0: no limit.
    pub max_concurrent_requests: usize,
    pub max_queued_requests: usize,
    pub request_timeout: Option<Duration>,
    /// `--max-queue-delay-s` (None: no bound).
    pub max_queue_delay_s: Option<f64>,
    pub shutdown_timeout: Duration,
    /// Client connections at once, and the time a connection has to send
    /// a request's headers.
    pub conn_limits: crate::shutdown::ConnLimits,
    /// The time a request has to send its body once its headers are in.
    pub body_read_timeout: Duration,
    /// False (`--no-enable-session-cache`): session ids are accepted and
    /// checked, but no KV is kept for them (every turn is a cold request).
    pub enable_session_cache: bool,
    /// `--tool-call-parser` (`auto` is resolved against the model's chat
    /// template when the state is built: [`AppState::tool_call_format`]).
    pub tool_call_parser: crate::args::ToolCallParserArg,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |s: &Option<String>| if s.is_some() { "<set>" } else { "<none>" };
        f.debug_struct("ServerConfig")
            .field("api_keys", &format!("<{} keys>", self.api_keys.len()))
            .field("isolate_cache_per_key", &self.isolate_cache_per_key)
            .field("cluster_token", &secret(&self.cluster_token))
            .field("max_request_body_bytes", &self.max_request_body_bytes)
            .field("max_prompt_tokens", &self.max_prompt_tokens)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_queued_requests", &self.max_queued_requests)
            .field("request_timeout", &self.request_timeout)
            .field("max_queue_delay_s", &self.max_queue_delay_s)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("conn_limits", &self.conn_limits)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("enable_session_cache", &self.enable_session_cache)
            .field("tool_call_parser", &self.tool_call_parser)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_keys: Vec::new(),
            isolate_cache_per_key: false,
            cluster_token: None,
            max_request_body_bytes: MAX_BODY_BYTES,
            max_prompt_tokens: None,
            max_concurrent_requests: 1024,
            max_queued_requests: 1024,
            request_timeout: None,
            max_queue_delay_s: None,
            shutdown_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            conn_limits: crate::shutdown::ConnLimits::default(),
            enable_session_cache: true,
            tool_call_parser: crate::args::ToolCallParserArg::Auto,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub engine: EngineHandle,
    pub config: Arc<ServerConfig>,
    /// The server's metrics and its one registry (`/metrics`).
    pub metrics: Arc<ServerMetrics>,
    pub admission: Arc<Admission>,
    pub lifecycle: Arc<Lifecycle>,
    /// How generations are served, chosen once at start from the role
    /// ([`crate::backend::choice::choose`]; a router has a state of its own).
    pub backend: Arc<dyn crate::backend::Backend>,
    /// Tokens every chat message costs at least under this model's
    /// template (measured once: [`crate::chat_messages::message_token_floor`]).
    pub message_floor: Arc<std::sync::OnceLock<usize>>,
    /// How tool calls are parsed out of chat answers (`--tool-call-parser`,
    /// `auto` resolved once, at start-up).
    pub tool_call_format: crate::tool_parser::ToolCallFormat,
}

impl AppState {
    pub fn new(engine: EngineHandle) -> Self {
        Self::with_config(engine, ServerConfig::default())
    }

    pub fn with_config(engine: EngineHandle, config: ServerConfig) -> Self {
        let admission = Arc::new(Admission::new(config.max_concurrent_requests, config.max_queued_requests));
        let tool_call_format = config.tool_call_parser.resolve(engine.tokenizer().chat_template_source());
        tracing::info!(
            tool_call_parser = tool_call_format.as_str(),
            flag = ?config.tool_call_parser,
            "tool-call parser chosen (--tool-call-parser; auto: qwen3_coder when the chat template shows tools as <function=...><parameter=...>)"
        );
        Self {
            metrics: Arc::new(crate::metrics::worker_metrics(&engine, &admission)),
            engine,
            admission,
            config: Arc::new(config),
            lifecycle: Arc::new(Lifecycle::default()),
            backend: Arc::new(crate::backend::local::Local::colocated()),
            message_floor: Arc::new(std::sync::OnceLock::new()),
            tool_call_format,
        }
    }

    /// The name clients must use in `model`.
    pub fn model_name(&self) -> &str {
        &self.engine.info().id
    }

    /// `model` is optional (as in vLLM); when given it must be ours.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            Some(m) if m != self.model_name() => Err(ApiError::ModelNotFound { model: m.to_string() }),
            _ => Ok(()),
        }
    }

    /// What the backend serves a submission with.
    pub fn serving(&self) -> crate::backend::Serving<'_> {
        crate::backend::Serving { engine: &self.engine, metrics: &self.metrics, max_queue_delay_s: self.config.max_queue_delay_s }
    }

    /// `--max-prompt-tokens`, or the context length.
    pub fn max_prompt_tokens(&self) -> usize {
        self.config.max_prompt_tokens.unwrap_or(self.engine.info().max_model_len)
    }
}

/// When the request arrived (stamped on every request by the route table,
/// [`crate::routes`]).
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// A handler's arrival: the route table's stamp, else now (a handler served
/// without it).
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Arrival {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Arrival>().copied().unwrap_or_else(|| Arrival(Instant::now())))
    }
}

/// The body limits in force, for the extractor: most bytes, and the time
/// the body may take to arrive.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    pub bytes: usize,
    pub read_timeout: Duration,
}
