//! Where a decode worker's prompt suffix gets computed: the decision lives
//! in `kvc-policy` ([`kvc_policy::prefill_path`], issue 32), re-exported
//! here so callers keep `kvc_disagg::prefill_path::decide`.

pub use kvc_policy::prefill_path::*;
