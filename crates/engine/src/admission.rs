//! The admission probe: can this engine take a turn now? Answered from the
//! published snapshot only, never by entering the step loop (the
//! predecessor's in-loop probe multiplied its errors 46x under 1 Hz polling).

use serde::{Serialize, Serializer};

use crate::EngineStats;

pub use kvc_policy::admission_probe::AdmissionProbeReason;
use kvc_policy::admission_probe::{decide_admission_probe, AdmissionProbeInputs};

/// As its label (the probe's JSON is unchanged: `"reason": "ok"`).
fn reason_label<S: Serializer>(r: &AdmissionProbeReason, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

/// What a caller (router, client, prefill worker) asks.
#[derive(Debug, Clone, Default)]
pub struct AdmissionQuery<'a> {
    pub session_id: Option<&'a str>,
    pub prompt_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionDecision {
    pub can_admit: bool,
    #[serde(serialize_with = "reason_label")]
    pub reason: AdmissionProbeReason,
    /// Tokens of the session's KV this engine holds (any tier).
    pub resident_tokens: usize,
    /// Prompt tokens the engine expects to compute (the rest is reused).
    pub estimated_computed_tokens: usize,
    /// How long to wait before trying again (0 when admitted).
    pub recommended_pause_ms: u64,
}

/// The probe's answer: the engine gathers the view from its published
/// snapshot, [`decide_admission_probe`] decides (the rule, in
/// `kvc-policy`), and the decision is logged and counted.
pub fn decide_admission(
    s: &EngineStats,
    q: &AdmissionQuery,
    block_size: usize,
    max_model_len: usize,
    max_num_seqs: usize,
) -> AdmissionDecision {
    let resident = q.session_id.and_then(|id| s.sessions.get(id)).map(|i| i.resident_tokens).unwrap_or(0);
    let d = decide_admission_probe(&AdmissionProbeInputs {
        prompt_tokens: q.prompt_tokens,
        resident_tokens: resident,
        block_size,
        max_model_len,
        max_num_seqs,
        free_blocks: s.free_blocks,
        evictable_blocks: s.evictable_blocks,
        waiting: s.waiting,
    });
    let (reason, computed, can_admit) = (d.reason, d.computed_tokens, d.reason.admits());
    kvc_policy::log_decision(&d.decision());
    tracing::debug!(event = "admission", session = ?q.session_id, can_admit, reason = reason.as_str(), resident, computed, "admission probe");
    AdmissionDecision {
        can_admit,
        reason,
        resident_tokens: resident,
        estimated_computed_tokens: computed,
        recommended_pause_ms: d.recommended_pause_ms,
    }
}

#[cfg(test)]
mod tests {
    use kvc_session_cache::{SessionInfo, Tier};

    use super::*;

    fn snapshot(free: usize, evictable: usize, waiting: usize) -> EngineStats {
        let info = SessionInfo {
            id: "s".into(),
            resident_tokens: 100,
            device_blocks: 7,
            host_blocks: 0,
            tier: Tier::Device,
            turns: 1,
            last_use: std::time::Instant::now(),
            busy: false,
        };
        EngineStats {
            free_blocks: free,
            evictable_blocks: evictable,
            waiting,
            sessions: imbl::HashMap::from_iter([("s".to_string(), info)]),
            ..Default::default()
        }
    }

    #[test]
    fn a_resident_session_only_needs_blocks_for_its_new_tokens() {
        let d = decide_admission(&snapshot(3, 0, 0), &AdmissionQuery { session_id: Some("s"), prompt_tokens: 120 }, 16, 1000, 8);
        assert_eq!((d.can_admit, d.reason, d.resident_tokens, d.estimated_computed_tokens), (true, AdmissionProbeReason::Ok, 100, 24));
        let cold = decide_admission(&snapshot(3, 0, 0), &AdmissionQuery { session_id: Some("other"), prompt_tokens: 120 }, 16, 1000, 8);
        assert_eq!((cold.can_admit, cold.reason), (false, AdmissionProbeReason::KvPoolFull));
        assert!(cold.recommended_pause_ms > 0);
    }

    #[test]
    fn reclaimable_blocks_count_as_available_and_a_long_queue_refuses() {
        let q = AdmissionQuery { session_id: None, prompt_tokens: 64 };
        assert!(decide_admission(&snapshot(0, 10, 0), &q, 16, 1000, 8).can_admit);
        assert_eq!(decide_admission(&snapshot(100, 0, 8), &q, 16, 1000, 8).reason, AdmissionProbeReason::QueueFull);
        assert_eq!(
            decide_admission(&snapshot(100, 0, 0), &AdmissionQuery { prompt_tokens: 1000, ..q }, 16, 1000, 8).reason,
            AdmissionProbeReason::PromptTooLong
        );
    }

    #[test]
    fn the_reasons_serialize_as_their_labels() {
        let d = decide_admission(&snapshot(3, 0, 0), &AdmissionQuery { session_id: Some("s"), prompt_tokens: 120 }, 16, 1000, 8);
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["reason"], "ok");
        assert_eq!(json["can_admit"], true);
        let labels: Vec<_> = AdmissionProbeReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["ok", "prompt_too_long", "kv_pool_full", "queue_full"]);
        for (r, free, prompt_tokens) in [(AdmissionProbeReason::KvPoolFull, 0, 120), (AdmissionProbeReason::PromptTooLong, 3, 1000)] {
            let d = decide_admission(&snapshot(free, 0, 0), &AdmissionQuery { session_id: None, prompt_tokens }, 16, 1000, 8);
            assert_eq!(serde_json::to_value(&d).unwrap()["reason"], r.as_str());
        }
    }
}
