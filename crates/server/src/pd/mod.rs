//! Prefill/decode disaggregation in the server (docs/disaggregation.md):
//! the KV link ([`kv_link`]), prefill peers ([`peers`]), the decode
//! worker's request start ([`decode`]) and snapshot pusher ([`pusher`]),
//! the prefill worker's routes ([`prefill`]), and their metrics ([`metrics`]).

pub mod decode;
pub mod exposure;
pub mod kv_link;
pub mod metrics;
pub mod peers;
pub mod prefill;
pub mod pusher;

use std::sync::Arc;
use std::time::Duration;

use kvc_disagg::prefill_path::PathPolicy;
use kvc_engine::EngineHandle;
use kvc_policy::Ewma;

use crate::args::{Args, PathPolicyArg, Role};
use kv_link::KvLink;
use metrics::PdMetrics;
use peers::{PeerClient, PrefillPeers};

#[derive(Debug, Clone)]
pub struct PdConfig {
    pub min_remote_tokens: usize,
    pub policy: PathPolicy,
    /// Longest a remote prefill may take (then: fallback to local).
    pub remote_prefill_budget: Duration,
}

/// Disaggregation state of a prefill or decode worker.
pub struct PdState {
    /// Dropped before `_engine` (field order): the link's registered
    /// memory is the engine's pool.
    pub link: Arc<KvLink>,
    pub peers: Arc<PrefillPeers>,
    pub client: PeerClient,
    pub metrics: PdMetrics,
    pub config: PdConfig,
    /// Fault injection for tests: points where a handler waits forever
    /// (`KVC_FAULT_HOLD=remote_prefill,snapshot_reserve`), so a test can
    /// kill the process in the middle of a transfer.
    hold: Vec<String>,
    /// Moving average of a remote prefill's time beyond P's compute and
    /// the transfer (HTTP, queueing, reservation), seconds.
    remote_overhead: std::sync::Mutex<Ewma>,
    _engine: EngineHandle,
}

impl PdState {
    /// Starts the KV link and, on a decode worker, the peer monitor and
    /// the snapshot pusher; the metrics join the worker's `registry`. Call
    /// inside the runtime.
    pub fn start(engine: &EngineHandle, args: &Args, registry: &prometheus::Registry) -> anyhow::Result<Arc<Self>> {
        let d = &args.disagg;
        let host = exposure::transport_host(d.kv_transport_host.as_deref(), &args.host);
        let link = Arc::new(KvLink::start(
            engine,
            &host,
            d.allow_unauthenticated_kv_transport,
            &d.kv_transport_protocol,
            Duration::from_secs(d.kv_transfer_timeout_s.max(1)),
        )?);
        let token = args.serving.cluster_token.clone().unwrap_or_default();
        let state = Arc::new(Self {
            link,
            peers: Arc::new(PrefillPeers::new(&d.prefill_peers)),
            client: PeerClient::new(&token),
            metrics: PdMetrics::new(registry),
            config: PdConfig {
                min_remote_tokens: d.remote_prefill_min_tokens,
                policy: match d.remote_prefill_policy {
                    PathPolicyArg::Cost => PathPolicy::Cost,
                    PathPolicyArg::Threshold => PathPolicy::Threshold,
                },
                remote_prefill_budget: Duration::from_secs(d.remote_prefill_timeout_s.max(1)),
            },
            hold: std::env::var("KVC_FAULT_HOLD").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default(),
            remote_overhead: std::sync::Mutex::new(Ewma::new()),
            _engine: engine.clone(),
        });
        state.metrics.set_listeners(&state.link);
        if args.role == Role::Decode {
            let interval = Duration::from_secs_f64(d.peer_poll_interval_s.max(0.05));
            state.peers.spawn_pollers(&state.client, interval, state.metrics.clone());
            if let Some(jobs) = engine.take_snapshot_jobs() {
                tokio::spawn(pusher::run(engine.clone(), state.clone(), jobs));
            }
        }
        Ok(state)
    }

    /// The measured fixed cost of a remote prefill (2 ms until measured).
    pub fn remote_overhead_s(&self) -> f64 {
        match self.remote_overhead.lock().unwrap_or_else(|e| e.into_inner()).get() {
            x if x > 0.0 => x,
            _ => 0.002,
        }
    }

    pub fn observe_remote_overhead(&self, s: f64) {
        self.remote_overhead.lock().unwrap_or_else(|e| e.into_inner()).update(s.max(0.0));
    }

    /// Waits forever at a fault-injection point named in `KVC_FAULT_HOLD`.
    pub async fn hold_if_asked(&self, point: &str) {
        if self.hold.iter().any(|h| h == point) {
            tracing::warn!(event = "fault_hold", point, "holding here (KVC_FAULT_HOLD)");
            std::future::pending::<()>().await;
        }
    }
}
