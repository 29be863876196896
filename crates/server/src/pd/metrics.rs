//! Metrics of the disaggregation paths, in the worker's registry
//! ([`crate::prom`]): every transfer outcome is a named, counted event,
//! its closed label sets exported at 0 from the start. The decisions (the
//! prefill path, the fallback to local recomputation, the prefill peer)
//! are counted in `kvc_decisions_total`
//! ([`crate::metrics::register_decisions`]).

use std::sync::Arc;

use prometheus::{GaugeVec, IntCounter, IntCounterVec, Registry};

use super::kv_link::KvLink;
use crate::prom::{self, Family, ScrapeTime};

#[derive(Clone)]
pub struct PdMetrics {
    /// `{outcome}`: remote prefills asked of prefill workers.
    pub remote_prefill: IntCounterVec,
    /// `{outcome}`: remote prefills this prefill worker served.
    pub remote_prefill_served: IntCounterVec,
    /// `{result}`: hit or miss of a session's snapshot.
    pub bypass: IntCounterVec,
    pub push_sent: IntCounter,
    /// `{reason}`.
    pub push_failed: IntCounterVec,
    /// `{kind}`.
    pub transfer_bytes: IntCounterVec,
    /// `{peer}`: 1 healthy, 0 not.
    pub peer_healthy: GaugeVec,
    /// `{exposure, bound}`: the KV transport's listening ports.
    pub transport_listeners: GaugeVec,
}

const TRANSPORT: &[Family] = &[Family::counter(
    "kvc_kv_transport_connections_refused_total",
    "Connections to the KV transport refused: neither from a peer that proved the cluster token (or that this worker calls) nor from this user's processes on this host.",
    &[],
)];

/// Registered in a registry of its own (tests).
impl Default for PdMetrics {
    fn default() -> Self {
        Self::new(&Registry::new())
    }
}

impl PdMetrics {
    pub fn new(r: &Registry) -> Self {
        ScrapeTime::register(r, TRANSPORT, |out| {
            out.sample("kvc_kv_transport_connections_refused_total", &[], kvc_disagg::transport::refused_connections() as f64)
        });
        let m = Self {
            remote_prefill: prom::counter_vec(
                r,
                "kvc_remote_prefill_total",
                "Remote prefills asked of prefill workers, by outcome (ok, failed).",
                &["outcome"],
            ),
            remote_prefill_served: prom::counter_vec(
                r,
                "kvc_remote_prefill_served_total",
                "Remote prefills this prefill worker served, by outcome.",
                &["outcome"],
            ),
            bypass: prom::counter_vec(
                r,
                "kvc_bypass_total",
                "Remote prefills of a session: its snapshot covered a prefix (hit) or not (miss).",
                &["result"],
            ),
            push_sent: prom::counter(r, "kvc_snapshot_push_sent_total", "Session snapshot pushes committed at the prefill worker."),
            push_failed: prom::counter_vec(r, "kvc_snapshot_push_failed_total", "Session snapshot pushes abandoned, by reason.", &["reason"]),
            transfer_bytes: prom::counter_vec(
                r,
                "kvc_kv_transfer_bytes_total",
                "KV bytes written to peers, by kind (remote_prefill, snapshot; remote_prefill_received: written into this worker).",
                &["kind"],
            ),
            peer_healthy: prom::gauge_vec(r, "kvc_prefill_peer_healthy", "1 while a prefill peer answers its state polls.", &["peer"]),
            transport_listeners: prom::gauge_vec(
                r,
                "kvc_kv_transport_listeners",
                "The KV transport's listening ports, by exposure (loopback, network_acknowledged) and whether bound to --kv-transport-host (restricted) or still on the wildcard address.",
                &["exposure", "bound"],
            ),
        };
        // Closed label sets start at 0 (dashboards expect every series).
        for outcome in ["ok", "failed"] {
            m.remote_prefill.with_label_values(&[outcome]);
            m.remote_prefill_served.with_label_values(&[outcome]);
        }
        for result in ["hit", "miss"] {
            m.bypass.with_label_values(&[result]);
        }
        for kind in ["remote_prefill", "remote_prefill_received", "snapshot"] {
            m.transfer_bytes.with_label_values(&[kind]);
        }
        m
    }

    /// The link's listening ports, by exposure and binding.
    pub fn set_listeners(&self, link: &Arc<KvLink>) {
        let l = link.listeners();
        let exposure = link.exposure().as_str();
        self.transport_listeners.with_label_values(&[exposure, "restricted"]).set((l.bound.len() - l.wildcard_ports.len()) as f64);
        self.transport_listeners.with_label_values(&[exposure, "wildcard"]).set(l.wildcard_ports.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_help_type_and_escaped_labels() {
        let r = Registry::new();
        let c = PdMetrics::new(&r);
        c.remote_prefill.with_label_values(&["failed"]).inc();
        c.remote_prefill.with_label_values(&["failed"]).inc();
        c.peer_healthy.with_label_values(&["http://a\"b"]).set(1.0);
        c.transport_listeners.with_label_values(&["loopback", "restricted"]).set(2.0);
        let out = prom::encode(&r);
        assert!(out.contains("# TYPE kvc_remote_prefill_total counter"));
        assert!(out.contains("kvc_remote_prefill_total{outcome=\"failed\"} 2"));
        assert!(out.contains("kvc_prefill_peer_healthy{peer=\"http://a\\\"b\"} 1"));
        assert!(out.contains("kvc_kv_transport_listeners{exposure=\"loopback\",bound=\"restricted\"} 2"), "{out}");
        assert!(out.contains("kvc_kv_transport_connections_refused_total "), "{out}");
        assert_eq!(c.remote_prefill.with_label_values(&["failed"]).get(), 2);
    }

    /// Samples of `name` in an exposition: label part -> value.
    fn samples<'a>(out: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
        out.lines().filter_map(|l| l.strip_prefix(name)?.strip_prefix('{')?.split_once("} ")).collect()
    }

    #[test]
    fn a_fresh_registry_lists_every_closed_label_set_at_0() {
        let r = Registry::new();
        let _m = PdMetrics::new(&r);
        let out = prom::encode(&r);
        for (name, n) in [
            ("kvc_remote_prefill_total", 2),
            ("kvc_remote_prefill_served_total", 2),
            ("kvc_bypass_total", 2),
            ("kvc_kv_transfer_bytes_total", 3),
        ] {
            let s = samples(&out, name);
            assert_eq!(s.len(), n, "{name}: {s:?}");
            assert!(s.iter().all(|(_, v)| *v == "0"), "{name}: {s:?}");
        }
    }
}
