//! This worker's end of the KV transport: the Mooncake engine over the
//! pool's memory, opened peers (by segment), and block writes run off the
//! async threads. Measured bandwidth feeds the path cost model.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kvc_disagg::transport::KvTransport;
use kvc_disagg::transport::{host_ip, Listeners};
use kvc_disagg::{BlockCopy, HandshakeRecord, MooncakeConfig, MooncakeTransport, Peer, PoolMemory, TransferReport};
use kvc_engine::EngineHandle;
use kvc_policy::Ewma;

use super::exposure::{decide_exposure, refusal, Exposure};

pub struct KvLink {
    transport: MooncakeTransport,
    exposure: Exposure,
    peers: Mutex<HashMap<(String, u64), Peer>>,
    /// Moving average, bytes/s (0 until measured).
    bandwidth: Mutex<Ewma>,
    pub timeout: Duration,
}

impl KvLink {
    /// Registers the engine's pool with a Mooncake engine whose listeners
    /// bind only `host` (refused on a network address unless `acknowledged`,
    /// see [`super::exposure`]).
    pub fn start(engine: &EngineHandle, host: &str, acknowledged: bool, protocol: &str, timeout: Duration) -> anyhow::Result<Self> {
        let addr = host_ip(host).map_err(|e| anyhow::anyhow!("--kv-transport-host: {e}"))?;
        let exposure = decide_exposure(addr, acknowledged);
        tracing::info!(event = "kv_transport_exposure", host, %addr, decision = exposure.as_str());
        if !exposure.allowed() {
            anyhow::bail!(refusal(addr, exposure));
        }
        let info = engine.info();
        let region = info
            .kv_region
            .ok_or_else(|| anyhow::anyhow!("the KV pool's memory cannot be registered with a KV transport on this device"))?;
        let memory = PoolMemory { layout: info.kv_layout, num_blocks: info.num_kv_blocks, region };
        let config = MooncakeConfig { host: host.to_string(), protocol: protocol.to_string(), ..MooncakeConfig::default() };
        // The region lives as long as the engine; the link is dropped
        // before the engine (field order of `PdState`).
        let mut transport = MooncakeTransport::new(&config, memory).map_err(|e| {
            anyhow::anyhow!("cannot start the KV transport ({e}); prefill/decode roles need Mooncake: run scripts/mooncake_setup.sh")
        })?;
        transport.set_weights(info.weights.clone());
        let l = transport.listeners();
        let bound: Vec<String> = l.bound.iter().map(|a| a.to_string()).collect();
        tracing::info!(event = "kv_link_started", segment = %transport.local_record().segment, protocol, location = ?region.location, listening = ?bound, "KV transport ready");
        if l.interposed && !l.wildcard_ports.is_empty() {
            // A listener that could not be moved to the transport's address
            // listens on every address of the host, unauthenticated: refuse.
            anyhow::bail!(
                "the KV transport could not bind ports {:?} to {host}: they stayed on the wildcard address (the address's \
                 family, IPv4 or IPv6, must be one Mooncake listens on); refusing to start",
                l.wildcard_ports
            );
        }
        if !l.restricted() {
            // Mooncake's listeners could not be moved off the wildcard
            // address (a build that cannot interpose bind): say so.
            tracing::warn!(
                event = "kv_transport_unrestricted",
                ports = ?l.wildcard_ports,
                interposed = l.interposed,
                "the KV transport listens on every address of this host (ports {:?}{}), with no authentication: \
                 firewall them so that only kvc workers reach them",
                l.wildcard_ports,
                if l.interposed { "" } else { "; its listening ports are unknown" }
            );
        }
        Ok(Self { transport, exposure, peers: Mutex::new(HashMap::new()), bandwidth: Mutex::new(Ewma::new()), timeout })
    }

    /// Where the transport listens.
    pub fn listeners(&self) -> &Listeners {
        self.transport.listeners()
    }

    pub fn exposure(&self) -> Exposure {
        self.exposure
    }

    pub fn record(&self) -> &HandshakeRecord {
        self.transport.local_record()
    }

    pub fn bandwidth(&self) -> f64 {
        self.bandwidth.lock().unwrap_or_else(|e| e.into_inner()).get()
    }

    fn peer(&self, remote: &HandshakeRecord) -> Result<Peer, kvc_disagg::DisaggError> {
        let key = (remote.segment.clone(), remote.base_addr);
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = peers.get(&key) {
            return Ok(p.clone());
        }
        let p = self.transport.connect(remote)?;
        peers.insert(key, p.clone());
        Ok(p)
    }

    /// Writes local blocks `src` into the remote pool's blocks `dst`
    /// (every layer) and waits for confirmation. Blocking: call from
    /// `spawn_blocking`.
    pub fn write(&self, remote: &HandshakeRecord, src: &[u32], dst: &[u32]) -> Result<TransferReport, kvc_disagg::DisaggError> {
        if src.len() != dst.len() {
            return Err(kvc_disagg::DisaggError::Control(format!("{} source blocks for {} destination blocks", src.len(), dst.len())));
        }
        if src.is_empty() {
            return Ok(TransferReport { bytes: 0, ranges: 0, elapsed: Duration::ZERO });
        }
        let peer = self.peer(remote)?;
        let copies = BlockCopy::all_layers(self.record().num_layers, src, dst);
        let result = self.transport.write_blocks(&peer, &copies, self.timeout);
        match &result {
            Ok(r) if r.bytes >= 1 << 16 && !r.elapsed.is_zero() => {
                let rate = r.bytes as f64 / r.elapsed.as_secs_f64();
                tracing::info!(
                    event = "kv_transfer",
                    peer = %remote.segment,
                    blocks = src.len(),
                    bytes = r.bytes,
                    ranges = r.ranges,
                    elapsed_ms = r.elapsed.as_secs_f64() * 1e3,
                    gb_per_s = rate / 1e9,
                    "KV blocks written"
                );
                self.bandwidth.lock().unwrap_or_else(|e| e.into_inner()).update(rate);
            }
            Ok(_) => {}
            Err(_) => {
                // The peer may have restarted: reopen next time.
                self.peers.lock().unwrap_or_else(|e| e.into_inner()).remove(&(remote.segment.clone(), remote.base_addr));
            }
        }
        result
    }
}
