//! The worker-to-worker credential (`--cluster-token`): the header that
//! carries it, sent by peers' pollers and clients and checked on
//! `/internal/*` ([`crate::auth::check_cluster_token`]).

/// Header carrying the cluster token on worker-to-worker calls.
pub const CLUSTER_TOKEN_HEADER: &str = "x-kvc-cluster-token";
