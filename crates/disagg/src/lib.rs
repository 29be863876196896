//! Prefill/decode disaggregation:
//! - moving KV blocks between workers' pools over the Mooncake Transfer
//!   Engine, with its listeners bound and guarded ([`transport`]);
//! - the record two workers exchange to agree on their pools' layout
//!   ([`handshake`]) and the wire types of the worker-to-worker HTTP calls
//!   ([`protocol`]);
//! - the placement decisions, pure functions over typed inputs returning a
//!   decision and its reason: where a prompt's suffix is computed
//!   ([`prefill_path`]), which prefill worker computes it
//!   ([`prefill_peer`]) and which worker the router sends a request to
//!   ([`routing`]);
//! - the write planner ([`plan`]), the JSON-lines control channel
//!   ([`control`]) and the loopback peer process of the two-process tests
//!   and `kvc-transfer-bench` ([`loopback`]).
//!
//! It depends on `kvc-wire`, not on the engine.

pub mod control;
mod error;
pub mod handshake;
pub mod loopback;
pub mod plan;
pub mod prefill_path;
pub mod prefill_peer;
pub mod protocol;
pub mod routing;
pub mod transport;

pub use error::{DisaggError, Result};
pub use handshake::HandshakeRecord;
pub use plan::BlockCopy;
pub use transport::{InProcessTransport, KvTransport, MooncakeConfig, MooncakeTransport, Peer, PoolMemory, TransferReport};
