//! Which prefill worker a decode worker asks: the decision lives in
//! kvc-policy (issue 32: one house for decisions); re-exported here for
//! its callers.

pub use kvc_policy::prefill_peer::*;
