//! The record two workers exchange before moving KV: what each pool looks
//! like in memory and where it is. A transfer writes raw bytes at computed
//! offsets, so any disagreement on the layout would corrupt the receiver's
//! KV silently, and KV computed by other weights (another checkpoint, or
//! the same one quantized) would answer wrongly without a word;
//! [`HandshakeRecord::check_compatible`] refuses either up front, naming
//! the field.

use candle_core::DType;
use kvc_kv_pool::{KvLayout, MemoryRegion};
use serde::{Deserialize, Serialize};

use crate::control::ControlChannel;
use crate::{DisaggError, Result};

/// Bumped whenever the record's meaning or the transfer protocol changes.
pub const PROTOCOL_VERSION: u32 = 2;

/// kv-pool's storage order, outermost first. A pool stored another way
/// (a future device layout) says so here and is refused by this one.
pub const STORAGE_ORDER: &str = "layer,block,kv,slot,kv_head,head_dim";

/// One pool, as its owner describes it to a peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeRecord {
    pub protocol_version: u32,
    /// The Mooncake segment to open to reach this pool ("host:port").
    pub segment: String,
    /// candle's name of the element type ("bf16", "f16", "f32").
    pub dtype: String,
    pub storage_order: String,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks per layer; may differ between peers.
    pub num_blocks: usize,
    /// Address of the pool's region in its owner's address space.
    pub base_addr: u64,
    /// Bytes of the region.
    pub region_len: u64,
    /// Bytes from (layer l, block b) to (layer l + 1, block b).
    pub layer_stride: u64,
    /// Bytes from (layer l, block b) to (layer l, block b + 1): one block's
    /// K and V in one layer.
    pub block_stride: u64,
    /// What computes the KV: the engine's weights identity (the
    /// checkpoint's config and weight files, the compute dtype and any
    /// quantization at load; not its path or device). Empty where nobody
    /// set it (tools, tests); compared as it is.
    #[serde(default)]
    pub weights: String,
}

impl HandshakeRecord {
    /// The record of a kv-pool storage of `num_blocks` blocks held in `region`.
    pub fn describe(layout: &KvLayout, num_blocks: usize, region: MemoryRegion, segment: impl Into<String>) -> Self {
        let block_stride = layout.layer_block_bytes() as u64;
        Self {
            protocol_version: PROTOCOL_VERSION,
            segment: segment.into(),
            dtype: layout.dtype.as_str().to_string(),
            storage_order: STORAGE_ORDER.to_string(),
            num_layers: layout.num_layers,
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            block_size: layout.block_size,
            num_blocks,
            base_addr: region.addr as u64,
            region_len: region.len as u64,
            layer_stride: block_stride * num_blocks as u64,
            block_stride,
            weights: String::new(),
        }
    }

    /// Bytes of one block of one layer (K and V) implied by the shape fields.
    pub fn block_bytes(&self) -> Result<u64> {
        let elem = dtype_size(&self.dtype)?;
        [self.block_size, self.num_kv_heads, self.head_dim, elem]
            .iter()
            .try_fold(2u64, |acc, &x| acc.checked_mul(x as u64))
            .ok_or_else(|| invalid("block_size", "overflows the block size".into()))
    }

    /// Byte offset of (layer, block) from the start of the region.
    pub fn offset(&self, layer: usize, block: usize) -> u64 {
        layer as u64 * self.layer_stride + block as u64 * self.block_stride
    }

    /// Whether the record describes memory it could really have: non-zero
    /// shape, block stride equal to the block's bytes, every block inside
    /// the region.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("num_layers", self.num_layers),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
        ] {
            if v == 0 {
                return Err(invalid(field, "is 0".into()));
            }
        }
        if self.segment.is_empty() {
            return Err(invalid("segment", "is empty".into()));
        }
        let block = self.block_bytes()?;
        if self.block_stride != block {
            return Err(invalid("block_stride", format!("is {} but a block of this shape has {block} bytes", self.block_stride)));
        }
        let row = self.num_blocks as u64 * self.block_stride;
        if self.layer_stride < row {
            return Err(invalid("layer_stride", format!("is {} but {} blocks need {row}", self.layer_stride, self.num_blocks)));
        }
        let end = (self.num_layers as u64 - 1).checked_mul(self.layer_stride).and_then(|x| x.checked_add(row));
        match end {
            Some(end) if end <= self.region_len => {}
            _ => return Err(invalid("region_len", format!("is {} but the last block ends beyond it", self.region_len))),
        }
        if self.base_addr.checked_add(self.region_len).is_none() {
            return Err(invalid("base_addr", "plus region_len overflows".into()));
        }
        Ok(())
    }

    /// Refuses a peer whose blocks are not byte-compatible with ours, or
    /// whose KV other weights compute: the first differing field (protocol
    /// version, storage order, dtype, weights, layers, kv heads, head dim,
    /// block size) is named in the error. Pool
    /// sizes (`num_blocks`) and addresses may differ.
    pub fn check_compatible(&self, remote: &HandshakeRecord) -> Result<()> {
        fn same<T: PartialEq + ToString>(field: &'static str, local: T, remote: T) -> Result<()> {
            if local == remote {
                Ok(())
            } else {
                Err(DisaggError::Incompatible { field, local: local.to_string(), remote: remote.to_string() })
            }
        }
        same("protocol_version", self.protocol_version, remote.protocol_version)?;
        same("storage_order", self.storage_order.as_str(), remote.storage_order.as_str())?;
        same("dtype", self.dtype.as_str(), remote.dtype.as_str())?;
        same("weights", self.weights.as_str(), remote.weights.as_str())?;
        same("num_layers", self.num_layers, remote.num_layers)?;
        same("num_kv_heads", self.num_kv_heads, remote.num_kv_heads)?;
        same("head_dim", self.head_dim, remote.head_dim)?;
        same("block_size", self.block_size, remote.block_size)?;
        remote.validate()
    }
}

fn invalid(field: &'static str, reason: String) -> DisaggError {
    DisaggError::InvalidRecord { field, reason }
}

fn dtype_size(name: &str) -> Result<usize> {
    name.parse::<DType>().map(|d| d.size_in_bytes()).map_err(|_| invalid("dtype", format!("{name:?} is not a known dtype")))
}

/// What the two sides say to each other during the handshake.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum HandshakeMessage {
    Hello { record: HandshakeRecord },
    Accept,
    Refuse { reason: String },
}

/// Symmetric handshake over a control channel: both sides send their
/// record, check the other's, and send their verdict. Returns the peer's
/// record when both accept; otherwise our own refusal (naming the field)
/// or the peer's ([`DisaggError::RefusedByPeer`]).
pub fn exchange(channel: &mut ControlChannel, local: &HandshakeRecord) -> Result<HandshakeRecord> {
    channel.send(&HandshakeMessage::Hello { record: local.clone() })?;
    let remote = match channel.recv::<HandshakeMessage>()? {
        HandshakeMessage::Hello { record } => record,
        other => return Err(DisaggError::Control(format!("expected the peer's hello, got {other:?}"))),
    };
    let verdict = local.check_compatible(&remote);
    match &verdict {
        Ok(()) => channel.send(&HandshakeMessage::Accept)?,
        Err(e) => channel.send(&HandshakeMessage::Refuse { reason: e.to_string() })?,
    }
    let theirs = channel.recv::<HandshakeMessage>()?;
    verdict?;
    match theirs {
        HandshakeMessage::Accept => Ok(remote),
        HandshakeMessage::Refuse { reason } => Err(DisaggError::RefusedByPeer { reason }),
        other => Err(DisaggError::Control(format!("expected the peer's verdict, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use kvc_kv_pool::KvStorage;

    use super::*;

    fn layout() -> KvLayout {
        KvLayout { num_layers: 3, num_kv_heads: 2, head_dim: 8, block_size: 4, dtype: DType::BF16 }
    }

    fn record(layout: KvLayout, num_blocks: usize) -> HandshakeRecord {
        let block = layout.layer_block_bytes();
        let region = MemoryRegion::host(0x10000, block * num_blocks * layout.num_layers);
        HandshakeRecord::describe(&layout, num_blocks, region, "127.0.0.1:1234")
    }

    #[test]
    fn offsets_match_the_pool_storage() {
        let storage = KvStorage::new(layout(), 5).unwrap();
        let r = HandshakeRecord::describe(&layout(), 5, storage.regions()[0], "x:1");
        r.validate().unwrap();
        for layer in 0..3 {
            for block in 0..5u32 {
                assert_eq!(r.offset(layer, block as usize), storage.byte_offset(layer, block) as u64);
            }
        }
        assert_eq!(r.region_len, storage.regions()[0].len as u64);
    }

    #[test]
    fn pools_of_different_sizes_are_compatible() {
        record(layout(), 8).check_compatible(&record(layout(), 3)).unwrap();
    }

    #[test]
    fn each_layout_field_mismatch_is_refused_by_name() {
        let local = record(layout(), 8);
        let cases: Vec<(&str, HandshakeRecord)> = vec![
            ("dtype", record(KvLayout { dtype: DType::F16, ..layout() }, 8)),
            // A bf16 worker and one with `--kv-cache-dtype fp8`.
            ("dtype", record(KvLayout { dtype: DType::F8E4M3, ..layout() }, 8)),
            ("num_layers", record(KvLayout { num_layers: 4, ..layout() }, 8)),
            ("num_kv_heads", record(KvLayout { num_kv_heads: 4, ..layout() }, 8)),
            ("head_dim", record(KvLayout { head_dim: 16, ..layout() }, 8)),
            ("block_size", record(KvLayout { block_size: 16, ..layout() }, 8)),
            ("protocol_version", HandshakeRecord { protocol_version: PROTOCOL_VERSION + 1, ..record(layout(), 8) }),
            ("storage_order", HandshakeRecord { storage_order: "block,layer".into(), ..record(layout(), 8) }),
            // The same layout, computed by a checkpoint quantized at load.
            ("weights", HandshakeRecord { weights: "w_0123456789ab".into(), ..record(layout(), 8) }),
        ];
        for (field, remote) in cases {
            match local.check_compatible(&remote) {
                Err(DisaggError::Incompatible { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected a refusal naming it, got {other:?}"),
            }
        }
    }

    #[test]
    fn records_contradicting_themselves_are_refused() {
        let good = record(layout(), 8);
        let bad_stride = HandshakeRecord { block_stride: good.block_stride * 2, ..good.clone() };
        let short_region = HandshakeRecord { region_len: good.region_len - 1, ..good.clone() };
        let unknown_dtype = HandshakeRecord { dtype: "q4".into(), ..good.clone() };
        for (field, r) in [("block_stride", bad_stride), ("region_len", short_region), ("dtype", unknown_dtype)] {
            match r.validate() {
                Err(DisaggError::InvalidRecord { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidRecord, got {other:?}"),
            }
        }
    }

    #[test]
    fn record_round_trips_through_json() {
        let r = record(layout(), 8);
        let back: HandshakeRecord = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn exchange_refuses_on_both_sides_with_the_field_named() {
        let (mut a, mut b) = crate::control::tests::channel_pair();
        let ra = record(layout(), 8);
        let rb = record(KvLayout { head_dim: 16, ..layout() }, 8);
        let t = std::thread::spawn(move || exchange(&mut b, &rb));
        let ours = exchange(&mut a, &ra).unwrap_err();
        let theirs = t.join().unwrap().unwrap_err();
        assert!(matches!(ours, DisaggError::Incompatible { field: "head_dim", .. }), "{ours}");
        assert!(matches!(theirs, DisaggError::Incompatible { field: "head_dim", .. }), "{theirs}");
    }

    #[test]
    fn exchange_returns_the_peer_record_when_compatible() {
        let (mut a, mut b) = crate::control::tests::channel_pair();
        let (ra, rb) = (record(layout(), 8), record(layout(), 3));
        let rb2 = rb.clone();
        let t = std::thread::spawn(move || exchange(&mut b, &rb2));
        assert_eq!(exchange(&mut a, &ra).unwrap(), rb);
        assert_eq!(t.join().unwrap().unwrap(), ra);
    }
}
