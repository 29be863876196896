//! Helpers shared by the engine's test files (engine_serving.rs,
//! sessions.rs, kv_handoff.rs): an engine on the embedded model, greedy
//! sampling, deterministic prompts, draining a stream, waiting for the
//! published stats.
#![allow(dead_code)] // each test file uses its own part

use kvc_engine::{
    EngineConfig, EngineHandle, EngineStats, FinishReason, KvLease, Logprobs, RequestStream, SamplingParams, StreamEvent, Usage,
};

/// An engine on the embedded model with a 512-block pool, as `f` adjusts it.
pub fn engine(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    let mut c = EngineConfig { num_kv_blocks: Some(512), ..Default::default() };
    f(&mut c);
    EngineHandle::start(c).expect("engine starts")
}

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, max_tokens, ignore_eos: true, ..Default::default() }
}

/// `n` token ids in the vocabulary, different for each `seed`.
pub fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|j| (seed.wrapping_mul(7919) + j * 104_729) % 150_000 + 10).collect()
}

/// What a request produced.
pub struct Done {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    pub first_logprobs: Option<Logprobs>,
    /// Every generated token's logprobs (when asked for).
    pub logprobs: Vec<Logprobs>,
    /// The prompt's logprobs (`prompt_logprobs`), from its second token.
    pub prompt_logprobs: Vec<Logprobs>,
    /// Prompt-logprob events received (one per scored prefill chunk).
    pub prompt_events: usize,
    /// A prefill worker's export: the prompt's KV, leased.
    pub export: Option<KvLease>,
}

/// Drains a stream to its end (panics on an engine error).
pub fn collect(s: &mut RequestStream) -> Done {
    let mut out = Done {
        tokens: vec![],
        text: String::new(),
        reason: FinishReason::Abort,
        usage: Usage::default(),
        first_logprobs: None,
        logprobs: vec![],
        prompt_logprobs: vec![],
        prompt_events: 0,
        export: None,
    };
    while let Some(ev) = s.blocking_recv() {
        match ev {
            StreamEvent::Token { token_id, text, logprobs, .. } => {
                if out.tokens.is_empty() {
                    out.first_logprobs = logprobs.clone();
                }
                out.logprobs.extend(logprobs);
                out.tokens.push(token_id);
                out.text.push_str(&text);
            }
            StreamEvent::Finished { reason, text, usage, export, .. } => {
                out.text.push_str(&text);
                (out.reason, out.usage, out.export) = (reason, usage, export);
                return out;
            }
            StreamEvent::PromptLogprobs(lps) => {
                assert!(out.tokens.is_empty(), "prompt logprobs after a token");
                out.prompt_logprobs.extend(lps);
                out.prompt_events += 1;
            }
            StreamEvent::Error(e) | StreamEvent::InvalidGrammar(e) => panic!("engine error: {e}"),
        }
    }
    panic!("stream ended without a result")
}

/// [`collect`], and the request was not aborted.
pub fn finished(s: &mut RequestStream) -> Done {
    let d = collect(s);
    assert_ne!(d.reason, FinishReason::Abort);
    d
}

/// Waits (bounded, ~20 s) until the published stats satisfy `f`; returns
/// the last stats seen either way.
pub fn wait_for(e: &EngineHandle, f: impl Fn(&EngineStats) -> bool) -> EngineStats {
    for _ in 0..4000 {
        let s = e.stats();
        if f(&s) {
            return s;
        }
        std::thread::park_timeout(std::time::Duration::from_millis(5));
    }
    e.stats()
}
