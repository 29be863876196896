//! The one house for decisions (issue 32): pure decision functions and the
//! rules they share, depending on nothing but `kvc-wire` (and, for now, not
//! even on that). No I/O, no clocks, no locks: a caller gathers the inputs,
//! a function here decides, and every place that estimates the same thing
//! calls the same rule instead of writing it again.
//!
//! For now it holds the two rules that were written several times over:
//! - [`reusable_tokens`]: how much of a prompt a worker's resident KV spares
//!   (engine admission, router placement, the prefill-path cost function);
//! - [`Ewma`]: the moving average of measured rates and costs (prefill
//!   tokens/s, KV transfer bandwidth, a remote prefill's overhead).
//!
//! More decisions move here later.

mod ewma;
mod reusable_tokens;

pub use ewma::Ewma;
pub use reusable_tokens::reusable_tokens;
