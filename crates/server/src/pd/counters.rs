//! Counters of the disaggregation paths, exported by `/metrics`: every
//! decision, fallback and transfer outcome is a named, counted event.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// `(metric, labels) -> value`; labels already rendered (`{k="v"}`).
#[derive(Debug, Default)]
pub struct PdCounters {
    values: Mutex<BTreeMap<(&'static str, String), f64>>,
}

/// Metric names and help texts; the exposition lists only these.
const HELP: &[(&str, &str, &str)] = &[
    ("kvc_prefill_path_decisions_total", "counter", "Where decode workers computed prompt suffixes, by path and reason."),
    ("kvc_remote_prefill_total", "counter", "Remote prefills asked of prefill workers, by outcome (ok, failed)."),
    ("kvc_remote_prefill_served_total", "counter", "Remote prefills this prefill worker served, by outcome."),
    ("kvc_bypass_total", "counter", "Remote prefills of a session: its snapshot covered a prefix (hit) or not (miss)."),
    ("kvc_disagg_fallbacks_total", "counter", "Transfers or peers that failed and were replaced by local recomputation, by reason."),
    ("kvc_snapshot_push_sent_total", "counter", "Session snapshot pushes committed at the prefill worker."),
    ("kvc_snapshot_push_failed_total", "counter", "Session snapshot pushes abandoned, by reason."),
    ("kvc_kv_transfer_bytes_total", "counter", "KV bytes written to peers, by kind (remote_prefill, snapshot)."),
    ("kvc_kv_transfer_bandwidth_bytes_per_second", "gauge", "Moving average of measured KV transfer bandwidth."),
    ("kvc_prefill_peer_healthy", "gauge", "1 while a prefill peer answers its state polls."),
    ("kvc_prefill_peer_choices_total", "counter", "Prefill workers chosen by decode workers, by reason (snapshot_holder, session_home, least_loaded, none_healthy)."),
    ("kvc_kv_transport_connections_refused_total", "counter", "Connections to the KV transport refused: neither from a peer that proved the cluster token (or that this worker calls) nor from this user's processes on this host."),
    ("kvc_kv_transport_listeners", "gauge", "The KV transport's listening ports, by exposure (loopback, network_acknowledged) and whether bound to --kv-transport-host (restricted) or still on the wildcard address."),
];

impl PdCounters {
    pub fn add(&self, metric: &'static str, labels: &[(&str, &str)], v: f64) {
        debug_assert!(HELP.iter().any(|h| h.0 == metric), "{metric} has no help text");
        let mut m = self.values.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((metric, crate::prom_text::labels(labels))).or_insert(0.0) += v;
    }

    pub fn inc(&self, metric: &'static str, labels: &[(&str, &str)]) {
        self.add(metric, labels, 1.0);
    }

    pub fn set(&self, metric: &'static str, labels: &[(&str, &str)], v: f64) {
        let mut m = self.values.lock().unwrap_or_else(|e| e.into_inner());
        m.insert((metric, crate::prom_text::labels(labels)), v);
    }

    pub fn get(&self, metric: &'static str, labels: &[(&str, &str)]) -> f64 {
        let m = self.values.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(metric, crate::prom_text::labels(labels))).copied().unwrap_or(0.0)
    }

    /// Appends the exposition of every metric seen so far.
    pub fn render(&self, out: &mut String) {
        let m = self.values.lock().unwrap_or_else(|e| e.into_inner());
        for (name, kind, help) in HELP {
            let samples: Vec<_> = m.iter().filter(|((n, _), _)| n == name).collect();
            if samples.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for ((_, labels), v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_help_type_and_escaped_labels() {
        let c = PdCounters::default();
        c.inc("kvc_disagg_fallbacks_total", &[("reason", "remote_prefill_failed")]);
        c.inc("kvc_disagg_fallbacks_total", &[("reason", "remote_prefill_failed")]);
        c.set("kvc_prefill_peer_healthy", &[("peer", "http://a\"b")], 1.0);
        let mut out = String::new();
        c.render(&mut out);
        assert!(out.contains("# TYPE kvc_disagg_fallbacks_total counter"));
        assert!(out.contains("kvc_disagg_fallbacks_total{reason=\"remote_prefill_failed\"} 2"));
        assert!(out.contains("kvc_prefill_peer_healthy{peer=\"http://a\\\"b\"} 1"));
        assert_eq!(c.get("kvc_disagg_fallbacks_total", &[("reason", "remote_prefill_failed")]), 2.0);
    }
}
