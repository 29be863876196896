//! What every router handler shares: [`RouterState`] (its workers, the
//! sessions' homes, metrics, settings and the forwarding client).

use std::sync::Arc;
use std::time::Duration;

use kvc_disagg::routing::RouteWeights;

use super::metrics::RouterMetrics;
use super::peers::Peers;
use super::session_homes::SessionHomes;
use crate::shutdown::Lifecycle;
use crate::state::ServerConfig;

/// Connection deadline of a forward: a worker that does not accept within
/// it is treated as down (the request goes to another worker).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything the router's handlers share.
#[derive(Clone)]
pub struct RouterState {
    pub peers: Arc<Peers>,
    pub homes: Arc<SessionHomes>,
    pub metrics: Arc<RouterMetrics>,
    pub config: Arc<ServerConfig>,
    pub lifecycle: Arc<Lifecycle>,
    pub client: reqwest::Client,
    pub weights: RouteWeights,
}

impl RouterState {
    pub fn new(peer_urls: &[String], config: ServerConfig) -> anyhow::Result<Self> {
        let metrics = Arc::new(RouterMetrics::default());
        let peers = Arc::new(Peers::new(peer_urls, metrics.clone()));
        peers.export_gauges();
        Ok(Self {
            peers,
            homes: Arc::new(SessionHomes::default()),
            metrics,
            config: Arc::new(config),
            lifecycle: Arc::new(Lifecycle::default()),
            client: reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).build()?,
            weights: RouteWeights::default(),
        })
    }
}
