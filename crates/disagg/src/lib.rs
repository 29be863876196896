//! Prefill/decode disaggregation. So far: moving KV blocks between workers'
//! pools over the Mooncake Transfer Engine ([`transport`]), the record two
//! workers exchange to agree on their pools' layout ([`handshake`]) over a
//! small JSON-lines control channel ([`control`]), and the loopback peer
//! process used by the two-process tests and `kvc-transfer-bench`
//! ([`loopback`]).

pub mod control;
mod error;
pub mod handshake;
pub mod loopback;
pub mod plan;
pub mod prefill_path;
pub mod protocol;
pub mod routing;
pub mod transport;

pub use error::{DisaggError, Result};
pub use handshake::HandshakeRecord;
pub use plan::BlockCopy;
pub use transport::{InProcessTransport, KvTransport, MooncakeConfig, MooncakeTransport, Peer, PoolMemory, TransferReport};
