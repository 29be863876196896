//! Shared state, the router, and serving.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use kvc_engine::EngineHandle;

use crate::auth::{require_api_key, require_cluster_token};
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
    /// Both, Prefill or Decode (a router has a state of its own).
    pub role: crate::args::Role,
    /// Prefill and decode workers: the KV link, peers, counters.
    pub pd: Option<Arc<crate::pd::PdState>>,
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
            role: crate::args::Role::Both,
            pd: None,
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

    /// `--max-prompt-tokens`, or the context length.
    pub fn max_prompt_tokens(&self) -> usize {
        self.config.max_prompt_tokens.unwrap_or(self.engine.info().max_model_len)
    }
}

/// When the request arrived (set by [`track_request`] on every request).
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// The body limits in force, for the extractor: most bytes, and the time
/// the body may take to arrive.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    pub bytes: usize,
    pub read_timeout: Duration,
}

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/models", get(crate::models::list_models))
        .route("/v1/models/{model}", get(crate::models::get_model))
        .route("/v1/sessions/{id}", get(crate::sessions::get_session).delete(crate::sessions::delete_session))
        .route("/v1/sessions/{id}/snapshot", get(crate::pd::prefill::snapshot_status))
        .route("/v1/admission", post(crate::sessions::admission))
        .route("/reset_prefix_cache", post(crate::sessions::reset_prefix_cache))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    let internal = crate::internal::router().route_layer(middleware::from_fn_with_state(state.clone(), require_cluster_token));
    let ops = Router::new()
        .route("/health", get(crate::health::health))
        .route("/health/live", get(crate::health::live))
        .route("/metrics", get(crate::metrics::metrics));
    Router::new()
        .merge(v1)
        .merge(internal)
        .merge(ops)
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), track_request))
        .layer(DefaultBodyLimit::max(state.config.max_request_body_bytes))
        .with_state(state)
}

/// Stamps the arrival time and body limit on the request, and counts the
/// answer's status class (probes and scrapes excluded).
async fn track_request(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let probe = matches!(req.uri().path(), "/health" | "/health/live" | "/metrics");
    req.extensions_mut().insert(Arrival(Instant::now()));
    req.extensions_mut().insert(BodyLimit { bytes: state.config.max_request_body_bytes, read_timeout: state.config.body_read_timeout });
    let response = next.run(req).await;
    if !probe {
        state.metrics.count_status(response.status().as_u16());
    }
    response
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NoRoute { method: method.to_string(), path: uri.path().to_string() }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
}

/// Serves a worker role (`both`, `prefill`, `decode`) as the flags say:
/// binds the port at once, answers probes while the engine loads
/// ([`crate::loading`]), then serves everything on the same socket.
pub async fn serve_worker(engine_config: kvc_engine::EngineConfig, args: &crate::args::Args) -> anyhow::Result<()> {
    use crate::args::Role;
    let host = args.host.as_str();
    let listener = std::net::TcpListener::bind((host, args.port)).map_err(|e| anyhow::anyhow!("cannot bind {host}:{}: {e}", args.port))?;
    listener.set_nonblocking(true)?;
    tracing::info!(addr = %listener.local_addr()?, role = %args.role_name(), "answering probes while the engine loads (/health 503 until ready, /health/live 200)");
    let config = ServerConfig { enable_session_cache: !args.no_enable_session_cache, ..args.serving.server_config() };
    let Some(engine) = crate::loading::start_engine(engine_config, &listener, config.conn_limits).await? else {
        return Ok(());
    };
    let mut state = AppState::with_config(engine.clone(), config);
    state.role = match args.role {
        Role::Router => Role::Both,
        r => r,
    };
    if matches!(args.role, Role::Prefill | Role::Decode) {
        state.pd = Some(crate::pd::PdState::start(&engine, args, &state.metrics.registry)?);
    }
    serve_state(state, tokio::net::TcpListener::from_std(listener)?).await
}

/// The warning a server listening on `addr` without an API key deserves:
/// on any address but loopback, every route (generation, `DELETE
/// /v1/sessions/*`, `/reset_prefix_cache`) is open to whoever reaches it.
/// vLLM binds 0.0.0.0 by default too; the warning is the point.
pub fn exposure_warning(addr: &std::net::SocketAddr, api_key: bool) -> Option<String> {
    (!api_key && !addr.ip().is_loopback()).then(|| {
        format!(
            "listening on {} without --api-key: anyone who can reach this address can generate, read and delete \
             sessions and reset the prefix cache; pass --api-key (or KVC_API_KEY) or --host 127.0.0.1",
            addr.ip()
        )
    })
}

/// Binds `host:port` and serves until SIGINT / SIGTERM, then drains
/// ([`crate::shutdown`]).
pub async fn serve(engine: EngineHandle, host: &str, port: u16, config: ServerConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| anyhow::anyhow!("cannot bind {host}:{port}: {e}"))?;
    serve_state(AppState::with_config(engine, config), listener).await
}

async fn serve_state(state: AppState, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let engine = state.engine.clone();
    let config = (*state.config).clone();
    let info = engine.info();
    tracing::info!(
        addr = %listener.local_addr()?, role = state.role.as_str(), model = %info.id, max_model_len = info.max_model_len,
        num_kv_blocks = info.num_kv_blocks, block_size = info.block_size,
        api_key = !config.api_keys.is_empty(), cluster_token = config.cluster_token.is_some(),
        max_concurrent_requests = config.max_concurrent_requests, max_queued_requests = config.max_queued_requests,
        "kvc-server listening"
    );
    if let Some(w) = exposure_warning(&listener.local_addr()?, !config.api_keys.is_empty()) {
        tracing::warn!(addr = %listener.local_addr()?, "{w}");
    }
    let (shutdown_timeout, limits) = (config.shutdown_timeout, config.conn_limits);
    let lifecycle = state.lifecycle.clone();
    crate::shutdown::serve_until(listener, router(state), lifecycle, shutdown_timeout, limits, crate::shutdown::signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::exposure_warning;

    #[test]
    fn only_a_non_loopback_address_without_a_key_is_warned_about() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(exposure_warning(&addr("0.0.0.0:8000"), false).is_some_and(|w| w.contains("--api-key")));
        assert!(exposure_warning(&addr("[::]:8000"), false).is_some());
        assert!(exposure_warning(&addr("10.1.2.3:8000"), false).is_some());
        assert!(exposure_warning(&addr("0.0.0.0:8000"), true).is_none());
        assert!(exposure_warning(&addr("127.0.0.1:8000"), false).is_none());
        assert!(exposure_warning(&addr("[::1]:8000"), false).is_none());
    }
}
