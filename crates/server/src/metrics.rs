//! The worker's registry ([`crate::prom`], served at `GET /metrics`), which
//! holds the server's own metrics ([`crate::server_metrics`]), the P/D
//! metrics on those roles, and the families here, read at scrape time: the
//! engine's live counters ([`EngineStats`]) and the admission gauges.

use std::sync::Arc;

use kvc_engine::{EngineHandle, EngineStats};
use prometheus::Registry;

use crate::prom::{Family, Scrape, ScrapeTime};
use crate::request_slots::Admission;

/// One of the engine's families of one sample: the family, unlabelled, and
/// its value in a stats snapshot.
type EngineFamily = (Family, fn(&EngineStats) -> f64);

const fn gauge(name: &'static str, help: &'static str, read: fn(&EngineStats) -> f64) -> EngineFamily {
    (Family::gauge(name, help, &[]), read)
}

const fn counter(name: &'static str, help: &'static str, read: fn(&EngineStats) -> f64) -> EngineFamily {
    (Family::counter(name, help, &[]), read)
}

/// The engine's families of one sample each.
const ENGINE: &[EngineFamily] = &[
    gauge("kvc_kv_blocks_free", "KV blocks not held by any request.", |s| s.free_blocks as f64),
    gauge("kvc_kv_blocks_total", "KV blocks in the pool.", |s| s.total_blocks as f64),
    gauge("kvc_kv_blocks_evictable", "KV blocks held only by caches (prefix index, idle sessions): reclaimable.", |s| {
        s.evictable_blocks as f64
    }),
    gauge("kvc_requests_running", "Requests being prefilled or decoded.", |s| s.running as f64),
    gauge("kvc_requests_waiting", "Requests queued for admission.", |s| s.waiting as f64),
    gauge("kvc_prefill_backlog_tokens", "Prompt tokens queued or mid-prefill, not yet computed.", |s| s.pending_prefill_tokens as f64),
    gauge(
        "kvc_prefill_backlog_drain_tokens_per_second",
        "Prompt tokens per second the prefill backlog drained at while there was one (what --max-queue-delay-s estimates waits from).",
        |s| s.backlog_drain_tokens_per_s,
    ),
    counter("kvc_engine_steps_total", "Engine steps run.", |s| s.steps as f64),
    counter("kvc_preemptions_total", "Requests preempted for lack of KV blocks.", |s| s.preemptions as f64),
    counter("kvc_preempted_tokens_recomputed_total", "Tokens computed again because preemption lost their KV.", |s| {
        s.preempted_tokens_recomputed as f64
    }),
    gauge("kvc_scheduler_partial_prefills", "Running sequences mid-prefill.", |s| s.partial_prefills as f64),
    counter(
        "kvc_scheduler_head_of_line_passed_total",
        "Requests admitted past an older one held back for KV memory (within --max-head-of-line-steps).",
        |s| s.passed_head as f64,
    ),
    gauge("kvc_requests_oldest_waiting_seconds", "Age of the oldest request waiting for admission (0: none waits).", |s| {
        s.oldest_waiting_since.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }),
    counter("kvc_prompt_tokens_computed_total", "Prompt tokens run through the model.", |s| s.prompt_tokens_computed as f64),
    counter("kvc_generation_tokens_total", "Tokens generated.", |s| s.generated_tokens as f64),
    counter("kvc_structured_output_masks_total", "Grammar masks computed for structured outputs (one per constrained token).", |s| {
        s.grammar_masks as f64
    }),
    counter(
        "kvc_structured_output_errors_total",
        "Requests ended because their grammar failed (a prefill worker's token it does not allow, or a matcher error).",
        |s| s.grammar_errors as f64,
    ),
    counter("kvc_structured_output_mask_seconds_total", "Time computing grammar masks, beside the forward pass.", |s| {
        s.grammar_mask_seconds
    }),
    counter(
        "kvc_structured_output_mask_wait_seconds_total",
        "Time steps waited for grammar masks after the forward pass (their cost on the critical path).",
        |s| s.grammar_wait_seconds,
    ),
    counter("kvc_snapshot_push_enqueued_total", "Session snapshot pushes queued after committed turns (decode workers).", |s| {
        s.snapshot_pushes_enqueued as f64
    }),
    counter("kvc_snapshot_ingested_total", "Session snapshot pushes committed into this worker's snapshot store.", |s| {
        s.snapshot_stats.ingested as f64
    }),
    counter("kvc_snapshot_evicted_total", "Snapshot store entries dropped (LRU, from either tier) to make room.", |s| {
        s.snapshot_stats.evicted as f64
    }),
    counter("kvc_snapshot_aborted_total", "Snapshot pushes aborted or expired before commit.", |s| s.snapshot_stats.aborted as f64),
    gauge("kvc_snapshot_blocks_used", "KV pool blocks held by the snapshot store (its device tier).", |s| s.snapshot_used_blocks as f64),
    gauge("kvc_snapshot_blocks_capacity", "Most KV blocks the snapshot store may hold.", |s| s.snapshot_capacity_blocks as f64),
    counter("kvc_snapshot_bypass_tokens_total", "Prompt tokens served from snapshots (prefill bypass).", |s| {
        s.snapshot_stats.bypass_tokens as f64
    }),
    counter("kvc_snapshot_demoted_blocks_total", "Snapshot store blocks copied to the host tier.", |s| {
        s.snapshot_stats.demoted_blocks as f64
    }),
    counter("kvc_snapshot_restored_blocks_total", "Snapshot store blocks copied back from the host tier for a bypass.", |s| {
        s.snapshot_stats.restored_blocks as f64
    }),
    gauge("kvc_kv_blocks_cached", "KV blocks in the prefix index.", |s| s.cached_blocks as f64),
    gauge("kvc_host_kv_blocks_free", "Free blocks of the host-memory tier.", |s| s.host_free_blocks as f64),
    gauge("kvc_host_kv_blocks_total", "Blocks of the host-memory tier.", |s| s.host_total_blocks as f64),
    gauge("kvc_sessions_resident", "Sessions the engine holds (any tier).", |s| s.sessions.len() as f64),
    counter("kvc_session_hits_total", "Requests that reused their session's KV.", |s| s.cache.session_hits as f64),
    counter("kvc_prefix_cache_hits_total", "Requests that reused prefix-cache blocks (no session hit).", |s| s.cache.prefix_hits as f64),
    counter("kvc_prompt_tokens_reused_total", "Prompt tokens served from cached KV at admission.", |s| s.cache.reused_tokens as f64),
    counter("kvc_prompt_tokens_to_compute_total", "Prompt tokens left to compute at admission.", |s| s.cache.computed_tokens as f64),
    counter("kvc_host_restores_total", "Blocks copied back from the host tier.", |s| s.cache.host_restores as f64),
    counter("kvc_sessions_expired_total", "Idle sessions deleted by the TTL.", |s| s.cache.sessions_expired as f64),
    counter("kvc_sessions_capped_total", "Idle sessions dropped to keep their API key under --max-sessions-per-key.", |s| {
        s.cache.sessions_capped as f64
    }),
];

/// The engine's families with labels ([`read_labelled`]).
const ENGINE_LABELLED: &[Family] = &[
    Family::counter(
        "kvc_engine_stalled_steps_total",
        "Steps in which requests waited and nothing could be scheduled, by why the oldest waited (0 in a healthy engine).",
        &["reason"],
    ),
    Family::gauge(
        "kvc_snapshot_store_blocks",
        "Blocks of the snapshot store's entries by tier: device (pool blocks) and host (demoted to the host tier).",
        &["tier"],
    ),
    Family::counter(
        "kvc_snapshot_bypass_hits_total",
        "Remote prefills served from a snapshot, by the tier they came from (host: blocks were copied back first).",
        &["tier"],
    ),
    Family::counter(
        "kvc_host_tier_bytes_total",
        "Bytes the host tier copied: to_host (demotion) and to_device (restore).",
        &["direction"],
    ),
    Family::counter(
        "kvc_host_tier_write_back_blocks_total",
        "Idle sessions' blocks written back to the host tier ahead of pressure: copied, used (evicted with no copy), discarded (released unused).",
        &["outcome"],
    ),
    Family::counter("kvc_evicted_blocks_total", "KV blocks evicted from the device, by destination tier and reason.", &["tier", "reason"]),
    Family::gauge(
        "kvc_scheduler_prefill_budget_seconds",
        "Seconds of prefill the next step may carry (--max-step-ms less the measured decodes).",
        &["step"],
    ),
];

/// The engine's labelled families, from one stats snapshot.
fn read_labelled(s: &EngineStats, out: &mut Scrape) {
    let k = &s.cache;
    for reason in kvc_engine::stall_reasons() {
        let n = s.stalled_steps.iter().find(|(r, _)| *r == reason).map_or(0, |(_, n)| *n);
        out.sample("kvc_engine_stalled_steps_total", &[reason], n as f64);
    }
    out.sample("kvc_host_tier_bytes_total", &["to_host"], s.host_bytes_moved.0 as f64);
    out.sample("kvc_host_tier_bytes_total", &["to_device"], s.host_bytes_moved.1 as f64);
    let wb = &k.write_back_blocks;
    for (outcome, n) in [("copied", wb.copied), ("used", wb.used), ("discarded", wb.discarded)] {
        out.sample("kvc_host_tier_write_back_blocks_total", &[outcome], n as f64);
    }
    // Every (tier, reason) the eviction decision can give, at 0 until
    // counted, then the evictions made without it (prefix LRU, host room,
    // the per-key session cap) as they occur.
    let decided: Vec<(&str, &str)> = kvc_policy::eviction::EvictionReason::pairs().map(|(a, r)| (a.tier(), r.as_str())).collect();
    for &(tier, reason) in &decided {
        let n = k.evictions.iter().find(|((t, r), _)| (t.as_str(), r.as_str()) == (tier, reason)).map_or(0, |(_, n)| *n);
        out.sample("kvc_evicted_blocks_total", &[tier, reason], n as f64);
    }
    for ((tier, reason), n) in &k.evictions {
        if !decided.contains(&(tier.as_str(), reason.as_str())) {
            out.sample("kvc_evicted_blocks_total", &[tier, reason], *n as f64);
        }
    }
    out.sample("kvc_snapshot_store_blocks", &["device"], s.snapshot_used_blocks as f64);
    out.sample("kvc_snapshot_store_blocks", &["host"], s.snapshot_host_blocks as f64);
    out.sample("kvc_snapshot_bypass_hits_total", &["device"], (s.snapshot_stats.bypass_hits - s.snapshot_stats.bypass_hits_host) as f64);
    out.sample("kvc_snapshot_bypass_hits_total", &["host"], s.snapshot_stats.bypass_hits_host as f64);
    if let Some((alone, mixed)) = s.step_budget {
        out.sample("kvc_scheduler_prefill_budget_seconds", &["alone"], alone);
        out.sample("kvc_scheduler_prefill_budget_seconds", &["with_decodes"], mixed);
    }
}

/// Registers the engine's families, read from `stats()` at each scrape.
pub fn register_engine(registry: &Registry, stats: impl Fn() -> EngineStats + Send + Sync + 'static) {
    let families: Vec<Family> = ENGINE.iter().map(|(family, _)| *family).chain(ENGINE_LABELLED.iter().copied()).collect();
    ScrapeTime::register(registry, &families, move |out| {
        let s = stats();
        for (family, value) in ENGINE {
            out.sample(family.name, &[], value(&s));
        }
        read_labelled(&s, out);
    });
}

const DECISIONS: &[Family] = &[Family::counter(
    "kvc_decisions_total",
    "Decisions taken (kvc-policy), by decision, what it decided (outcome) and why (reason); every label set from the start.",
    &["decision", "outcome", "reason"],
)];

/// Registers `kvc_decisions_total`, read at each scrape from the
/// process-wide counts ([`kvc_policy::decisions_total::counts`]): the router's
/// decisions on a router, every other decision on a worker, each label set
/// exported at 0 until counted.
pub fn register_decisions(registry: &Registry, router: bool) {
    ScrapeTime::register(registry, DECISIONS, move |out| {
        for (set, n) in kvc_policy::decisions_total::counts() {
            if kvc_policy::decisions_total::ROUTER_DECISIONS.contains(&set.decision) == router {
                out.sample("kvc_decisions_total", &[set.decision, set.outcome, set.reason], n as f64);
            }
        }
    });
}

const ADMISSION: &[Family] = &[
    Family::gauge("kvc_http_requests_running", "Generation requests holding a concurrency slot.", &[]),
    Family::gauge("kvc_http_requests_queued", "Generation requests waiting for a concurrency slot.", &[]),
];

/// Registers the request-slot gauges ([`Admission`]).
pub fn register_admission(registry: &Registry, admission: Arc<Admission>) {
    ScrapeTime::register(registry, ADMISSION, move |out| {
        out.sample("kvc_http_requests_running", &[], admission.running() as f64);
        out.sample("kvc_http_requests_queued", &[], admission.queued() as f64);
    });
}

/// A worker's metrics in one registry: the server's own, the engine's, the slots'.
pub fn worker_metrics(engine: &EngineHandle, admission: &Arc<Admission>) -> crate::server_metrics::ServerMetrics {
    let metrics = crate::server_metrics::ServerMetrics::default();
    let engine = engine.clone();
    register_engine(&metrics.registry, move || engine.stats());
    register_admission(&metrics.registry, admission.clone());
    register_decisions(&metrics.registry, false);
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_metrics::ServerMetrics;

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
        let m = ServerMetrics::default();
        register_engine(&m.registry, move || s.clone());
        let text = m.render();
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
        // The eviction decision's (tier, reason) pairs, at 0 before any is
        // counted.
        for tier in ["host", "dropped"] {
            for reason in ["idle", "size", "few_turns"] {
                let line = format!("kvc_evicted_blocks_total{{tier=\"{tier}\",reason=\"{reason}\"}} 0");
                assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
            }
        }
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!(helps, types);
    }

    #[test]
    fn a_worker_exports_every_decision_label_set_but_the_routers() {
        let m = ServerMetrics::default();
        register_decisions(&m.registry, false);
        let text = m.render();
        let sets: Vec<_> = kvc_policy::decisions_total::label_sets()
            .iter()
            .filter(|s| !kvc_policy::decisions_total::ROUTER_DECISIONS.contains(&s.decision))
            .map(|s| format!("kvc_decisions_total{{decision=\"{}\",outcome=\"{}\",reason=\"{}\"}} ", s.decision, s.outcome, s.reason))
            .collect();
        for set in &sets {
            assert!(text.lines().any(|l| l.starts_with(set.as_str())), "missing {set:?} in\n{text}");
        }
        let lines = text.lines().filter(|l| l.starts_with("kvc_decisions_total{")).count();
        assert_eq!(lines, sets.len());
        assert!(!text.contains("decision=\"route_score\""));
        assert!(text.contains("# TYPE kvc_decisions_total counter"));
    }

    /// The label sets of the per-decision counters this family replaced
    /// (each from the typed reasons they were exported from), as
    /// (decision, outcome or None where the old counter had no such label,
    /// reason).
    fn retired_label_sets() -> Vec<(&'static str, Option<&'static str>, &'static str)> {
        use kvc_policy::{admission_probe, prefill_path, prefill_peer, queue_delay, seq_admission, spill, step_kind};
        let mut out = Vec::new();
        // The admission probe's, by reason.
        out.extend(admission_probe::AdmissionProbeReason::ALL.map(|r| ("admission_probe", None, r.as_str())));
        // --max-queue-delay-s's, by decision and reason.
        out.extend(queue_delay::QueueDelayReason::pairs().map(|(d, r)| ("queue_delay", Some(d), r.as_str())));
        // The prefill path's, by path and reason.
        out.extend(prefill_path::PathReason::pairs().map(|(p, r)| ("prefill_path", Some(p.as_str()), r.as_str())));
        // The fallbacks to local recomputation, by reason.
        out.extend(prefill_path::FallbackReason::ALL.map(|r| ("prefill_fallback", None, r.as_str())));
        // The prefill peer's, by reason.
        out.extend(prefill_peer::PeerReason::ALL.map(|r| ("prefill_peer", None, r.as_str())));
        // The scheduler's admission, by reason.
        out.extend(seq_admission::AdmitReason::ALL.map(|r| ("seq_admission", None, r.as_str())));
        // The snapshot store's spill, by action and reason.
        out.extend(spill::SpillReason::pairs().map(|(a, r)| ("spill", Some(a.as_str()), r.as_str())));
        // The step kind, by kind and reason.
        out.extend(step_kind::StepKindReason::pairs().map(|(k, r)| ("step_kind", Some(k.as_str()), r.as_str())));
        out
    }

    #[test]
    fn every_label_set_of_the_retired_decision_counters_is_one_of_the_familys() {
        let m = ServerMetrics::default();
        register_engine(&m.registry, EngineStats::default);
        register_decisions(&m.registry, false);
        let text = m.render();
        let family: Vec<(&str, &str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("kvc_decisions_total{decision=\"")?.split_once("\"} "))
            .filter_map(|(labels, _)| {
                let (decision, rest) = labels.split_once("\",outcome=\"")?;
                let (outcome, reason) = rest.split_once("\",reason=\"")?;
                Some((decision, outcome, reason))
            })
            .collect();
        for (decision, outcome, reason) in retired_label_sets() {
            let found = family.iter().any(|&(d, o, r)| d == decision && r == reason && outcome.is_none_or(|want| o == want));
            assert!(found, "{decision} {outcome:?} {reason}: not in\n{text}");
        }
        // Nothing but the family counts decisions.
        let others = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("_decisions_total"))
            .filter(|l| !l.starts_with("kvc_decisions_total{"));
        assert_eq!(others.count(), 0, "{text}");
    }

    #[test]
    fn the_router_exports_every_placement_reason() {
        let m = ServerMetrics::default();
        register_decisions(&m.registry, true);
        let text = m.render();
        // Every placement reason, each under decision="route_score".
        for r in kvc_disagg::routing::RouteReason::ALL {
            let reason = format!(",reason=\"{}\"}} ", r.as_str());
            let found = text.lines().any(|l| l.starts_with("kvc_decisions_total{decision=\"route_score\",") && l.contains(&reason));
            assert!(found, "{r:?} not in\n{text}");
        }
    }
}
