//! The prefill/decode disaggregation and routing flags ([`DisaggArgs`]):
//! peers, the remote-prefill path choice, session snapshots, the KV
//! transport and the router's score (docs/disaggregation.md).

use clap::ValueEnum;

use super::parse_nonneg_f64;

/// How a decode worker places a prompt suffix at or above
/// `--remote-prefill-min-tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathPolicyArg {
    Cost,
    Threshold,
}

/// Prefill/decode disaggregation and routing (docs/disaggregation.md).
#[derive(Debug, Clone, clap::Args)]
pub struct DisaggArgs {
    /// A prefill worker's base URL (repeatable). Decode workers send remote
    /// prefills and session snapshots there.
    #[arg(long = "prefill-peer", value_name = "URL")]
    pub prefill_peers: Vec<String>,

    /// A decode (or `both`) worker's base URL (repeatable). The router
    /// places requests on these.
    #[arg(long = "decode-peer", value_name = "URL")]
    pub decode_peers: Vec<String>,

    /// Decode workers: a prompt suffix shorter than this is always computed
    /// locally (direct append); longer ones go to the cost function. The
    /// default is where a remote prefill stopped losing to a local one on
    /// loopback (64 tokens: 68.2 vs 67.1 ms; docs/benchmarks.md).
    #[arg(long, default_value_t = 64)]
    pub remote_prefill_min_tokens: usize,

    /// Decode workers: how suffixes at or above --remote-prefill-min-tokens
    /// are placed: `cost` (the cost model: measured rates, queues,
    /// bandwidth) or `threshold` (always remote, the classic deployment).
    #[arg(long, value_enum, default_value_t = PathPolicyArg::Cost)]
    pub remote_prefill_policy: PathPolicyArg,

    /// Decode workers: push a session's new KV to a prefill worker after a
    /// turn once this many tokens are not yet snapshotted (0: never push).
    #[arg(long, default_value_t = 1024)]
    pub snapshot_min_tokens: usize,

    /// Prefill workers: most KV blocks of the pool the snapshot store may
    /// hold (default: half of the pool). Past it, or when the pool runs
    /// short, its least recently used entries move to the host tier
    /// (--swap-space) while that has room, and are dropped after.
    #[arg(long)]
    pub snapshot_store_blocks: Option<usize>,

    /// Address of this worker's KV transport: peers reach it there, and its
    /// listeners bind only it. Default: --host when that is one address,
    /// else 127.0.0.1 (a single-host deployment). The transport has no
    /// authentication (docs/disaggregation.md, "Network model").
    #[arg(long)]
    pub kv_transport_host: Option<String>,

    /// Let the KV transport listen on a non-loopback address. Anyone who
    /// can reach that address can read and write this worker's KV pool
    /// (Mooncake authenticates no peer): use only on a private network.
    #[arg(long)]
    pub allow_unauthenticated_kv_transport: bool,

    /// Mooncake transport protocol between workers: `tcp` (any pool; GPU
    /// memory is staged through host buffers), `nvlink_intra` (GPU pools on
    /// one host, CUDA IPC) or `rdma`.
    #[arg(long, default_value = "tcp")]
    pub kv_transport_protocol: String,

    /// Router: weight of a block of prompt a worker would have to compute,
    /// against a block of its decode load, in the routing score (Dynamo's
    /// flag). Above 1 a session stays with its KV longer before load moves it.
    #[arg(long, default_value_t = 1.0, value_parser = parse_nonneg_f64)]
    pub kv_overlap_score_weight: f64,

    /// Decode workers: longest a remote prefill may take (queueing and
    /// compute on the prefill worker); past it the prompt is computed
    /// locally instead.
    #[arg(long, default_value_t = 600)]
    pub remote_prefill_timeout_s: u64,

    /// Deadline of one KV transfer (remote prefill or snapshot push).
    #[arg(long, default_value_t = 30)]
    pub kv_transfer_timeout_s: u64,

    /// Router and decode workers: seconds between polls of each peer's
    /// published state (health and load).
    #[arg(long, default_value_t = 0.5)]
    pub peer_poll_interval_s: f64,
}
