//! `GET /metrics`: Prometheus text exposition of the engine's live counters
//! ([`EngineStats`]) and the server's own.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use kvc_engine::EngineStats;

use crate::app::{AppState, ServerCounters};

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = render(&state.engine.stats(), &state.counters);
    state.metrics.render(&mut body);
    if let Some(pd) = &state.pd {
        pd.counters.set("kvc_kv_transport_connections_refused_total", &[], kvc_disagg::transport::refused_connections() as f64);
        pd.counters.render(&mut body);
    }
    crate::server_metrics::ServerMetrics::render_admission(&mut body, state.admission.running(), state.admission.queued());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
}

/// The exposition text; one `# HELP` / `# TYPE` pair per metric.
pub fn render(s: &EngineStats, c: &ServerCounters) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    metric("kvc_kv_blocks_free", "gauge", "KV blocks not held by any request.", &[("", s.free_blocks as u64)]);
    metric("kvc_kv_blocks_total", "gauge", "KV blocks in the pool.", &[("", s.total_blocks as u64)]);
    metric(
        "kvc_kv_blocks_evictable",
        "gauge",
        "KV blocks held only by caches (prefix index, idle sessions): reclaimable.",
        &[("", s.evictable_blocks as u64)],
    );
    metric("kvc_requests_running", "gauge", "Requests being prefilled or decoded.", &[("", s.running as u64)]);
    metric("kvc_requests_waiting", "gauge", "Requests queued for admission.", &[("", s.waiting as u64)]);
    metric("kvc_engine_steps_total", "counter", "Engine steps run.", &[("", s.steps)]);
    metric("kvc_preemptions_total", "counter", "Requests preempted for lack of KV blocks.", &[("", s.preemptions)]);
    metric(
        "kvc_preempted_tokens_recomputed_total",
        "counter",
        "Tokens computed again because preemption lost their KV.",
        &[("", s.preempted_tokens_recomputed)],
    );
    metric("kvc_scheduler_partial_prefills", "gauge", "Running sequences mid-prefill.", &[("", s.partial_prefills as u64)]);
    let admissions: Vec<(String, u64)> =
        s.admission_decisions.iter().map(|(r, n)| (crate::prom_text::labels(&[("reason", r)]), *n)).collect();
    let admissions: Vec<(&str, u64)> = admissions.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    metric(
        "kvc_scheduler_admission_decisions_total",
        "counter",
        "Scheduler admissions (reason=admitted) and, per step, why the queue's head still waits.",
        &admissions,
    );
    metric("kvc_prompt_tokens_computed_total", "counter", "Prompt tokens run through the model.", &[("", s.prompt_tokens_computed)]);
    metric("kvc_generation_tokens_total", "counter", "Tokens generated.", &[("", s.generated_tokens)]);
    metric(
        "kvc_structured_output_masks_total",
        "counter",
        "Grammar masks computed for structured outputs (one per constrained token).",
        &[("", s.grammar_masks)],
    );
    metric(
        "kvc_structured_output_errors_total",
        "counter",
        "Requests ended because their grammar failed (a prefill worker's token it does not allow, or a matcher error).",
        &[("", s.grammar_errors)],
    );
    let path_labels = crate::prom_text::labels(&[("path", kvc_engine::ServePath::Local.as_str())]);
    metric(
        "kvc_served_requests_total",
        "counter",
        "Requests handed to the engine, by serving path.",
        &[(&path_labels, c.local_requests.load(Ordering::Relaxed))],
    );
    let sn = &s.snapshot_stats;
    metric(
        "kvc_snapshot_push_enqueued_total",
        "counter",
        "Session snapshot pushes queued after committed turns (decode workers).",
        &[("", s.snapshot_pushes_enqueued)],
    );
    metric(
        "kvc_snapshot_ingested_total",
        "counter",
        "Session snapshot pushes committed into this worker's snapshot store.",
        &[("", sn.ingested)],
    );
    metric("kvc_snapshot_evicted_total", "counter", "Snapshot store entries evicted (LRU) to make room.", &[("", sn.evicted)]);
    metric("kvc_snapshot_aborted_total", "counter", "Snapshot pushes aborted or expired before commit.", &[("", sn.aborted)]);
    metric("kvc_snapshot_blocks_used", "gauge", "KV blocks held by the snapshot store.", &[("", s.snapshot_used_blocks as u64)]);
    metric(
        "kvc_snapshot_blocks_capacity",
        "gauge",
        "Most KV blocks the snapshot store may hold.",
        &[("", s.snapshot_capacity_blocks as u64)],
    );
    metric(
        "kvc_snapshot_bypass_tokens_total",
        "counter",
        "Prompt tokens served from snapshots (prefill bypass).",
        &[("", sn.bypass_tokens)],
    );
    let k = &s.cache;
    metric("kvc_kv_blocks_cached", "gauge", "KV blocks in the prefix index.", &[("", s.cached_blocks as u64)]);
    metric("kvc_host_kv_blocks_free", "gauge", "Free blocks of the host-memory tier.", &[("", s.host_free_blocks as u64)]);
    metric("kvc_host_kv_blocks_total", "gauge", "Blocks of the host-memory tier.", &[("", s.host_total_blocks as u64)]);
    metric("kvc_sessions_resident", "gauge", "Sessions the engine holds (any tier).", &[("", s.sessions.len() as u64)]);
    metric("kvc_session_hits_total", "counter", "Requests that reused their session's KV.", &[("", k.session_hits)]);
    metric("kvc_prefix_cache_hits_total", "counter", "Requests that reused prefix-cache blocks (no session hit).", &[("", k.prefix_hits)]);
    metric("kvc_prompt_tokens_reused_total", "counter", "Prompt tokens served from cached KV at admission.", &[("", k.reused_tokens)]);
    metric("kvc_prompt_tokens_to_compute_total", "counter", "Prompt tokens left to compute at admission.", &[("", k.computed_tokens)]);
    metric("kvc_host_restores_total", "counter", "Blocks copied back from the host tier.", &[("", k.host_restores)]);
    metric("kvc_sessions_expired_total", "counter", "Idle sessions deleted by the TTL.", &[("", k.sessions_expired)]);
    metric(
        "kvc_sessions_capped_total",
        "counter",
        "Idle sessions dropped to keep their API key under --max-sessions-per-key.",
        &[("", k.sessions_capped)],
    );
    let evictions: Vec<(String, u64)> =
        k.evictions.iter().map(|((tier, reason), n)| (crate::prom_text::labels(&[("tier", tier), ("reason", reason)]), *n)).collect();
    let evictions: Vec<(&str, u64)> = evictions.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    metric("kvc_evicted_blocks_total", "counter", "KV blocks evicted from the device, by destination tier and reason.", &evictions);
    let decisions: Vec<(String, u64)> = c
        .admission_decisions
        .lock()
        .map(|m| m.iter().map(|(r, n)| (crate::prom_text::labels(&[("reason", r)]), *n)).collect())
        .unwrap_or_default();
    let decisions: Vec<(&str, u64)> = decisions.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    metric("kvc_admission_decisions_total", "counter", "Admission probe answers, by reason.", &decisions);
    metric(
        "kvc_streams_cancelled_total",
        "counter",
        "Streaming responses whose client went away before the end.",
        &[("", c.streams_cancelled.load(Ordering::Relaxed))],
    );
    if let Some((alone, mixed)) = s.step_budget {
        let name = "kvc_scheduler_prefill_budget_seconds";
        let _ = writeln!(out, "# HELP {name} Seconds of prefill the next step may carry (--max-step-ms less the measured decodes).");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{step=\"alone\"}} {alone}");
        let _ = writeln!(out, "{name}{{step=\"with_decodes\"}} {mixed}");
    }
    for (name, help, value) in [
        ("kvc_structured_output_mask_seconds_total", "Time computing grammar masks, beside the forward pass.", s.grammar_mask_seconds),
        (
            "kvc_structured_output_mask_wait_seconds_total",
            "Time steps waited for grammar masks after the forward pass (their cost on the critical path).",
            s.grammar_wait_seconds,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_engine_stat_with_help_and_type() {
        let s = EngineStats {
            free_blocks: 7,
            total_blocks: 9,
            running: 1,
            waiting: 2,
            steps: 3,
            preemptions: 4,
            prompt_tokens_computed: 5,
            generated_tokens: 6,
            ..Default::default()
        };
        let text = render(&s, &ServerCounters::default());
        for line in [
            "kvc_kv_blocks_free 7",
            "kvc_kv_blocks_total 9",
            "kvc_requests_running 1",
            "kvc_requests_waiting 2",
            "kvc_engine_steps_total 3",
            "kvc_preemptions_total 4",
            "kvc_prompt_tokens_computed_total 5",
            "kvc_generation_tokens_total 6",
            "kvc_kv_blocks_evictable 0",
            "kvc_served_requests_total{path=\"local\"} 0",
            "kvc_session_hits_total 0",
            "# TYPE kvc_preemptions_total counter",
            "# TYPE kvc_kv_blocks_free gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!(helps, types);
    }
}
