//! Prompt logprobs (`SamplingParams::prompt_logprobs`) on the embedded
//! model, against a reference outside the engine loop
//! (`kvc_engine::reference_score`: one plain forward pass over the whole
//! sequence, log-softmax in f64): through chunked prefill, beside cached
//! prefixes and sessions, and with `max_tokens: 0`.

mod common;

use common::{finished, greedy, tokens, Done};
use kvc_engine::reference_score::{embedded_model, reference_logprobs};
use kvc_engine::{EngineConfig, EngineHandle, FinishReason, GenerateRequest, SamplingParams};

/// Within what the engine's and the reference's logprobs agree (f32
/// through paged attention in chunks vs one f64-reduced pass).
const TOL: f64 = 1e-3;

fn engine(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    common::engine(|c| {
        c.block_size = 16;
        f(c)
    })
}

fn scoring(top: usize, max_tokens: usize) -> SamplingParams {
    SamplingParams { prompt_logprobs: Some(top), logprobs: Some(top), ..greedy(max_tokens) }
}

fn run(e: &EngineHandle, prompt: &[u32], sampling: SamplingParams, session: Option<&str>) -> Done {
    let req = GenerateRequest {
        request_id: "t".into(),
        prompt_tokens: prompt.to_vec(),
        sampling,
        session_id: session.map(str::to_string),
        ..Default::default()
    };
    finished(&mut e.submit(req).unwrap())
}

/// Every prompt token after the first has the reference's logprob, and
/// its alternatives are the best `top`, best first.
fn assert_matches_reference(d: &Done, prompt: &[u32], top: usize) {
    let reference = reference_logprobs(&embedded_model(0).unwrap(), prompt).unwrap();
    assert_eq!(d.prompt_logprobs.len(), prompt.len() - 1);
    let mut worst = 0f64;
    for (i, (lp, r)) in d.prompt_logprobs.iter().zip(&reference).enumerate() {
        assert_eq!(lp.chosen.token_id, prompt[i + 1], "entry {i} scores prompt token {}", i + 1);
        worst = worst.max((f64::from(lp.chosen.logprob) - r).abs());
        assert_eq!(lp.top.len(), top);
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        if let Some(best) = lp.top.first() {
            assert!(best.logprob >= lp.chosen.logprob);
        }
    }
    assert!(worst < TOL, "largest difference from the reference: {worst}");
}

#[test]
fn prompt_logprobs_match_a_plain_forward_pass_across_chunked_prefill() {
    // Chunks of at most 16 tokens: the 70-token prompt is prefilled in 5.
    let e = engine(|c| c.max_num_batched_tokens = 16);
    let prompt = tokens(1, 70);
    let d = run(&e, &prompt, scoring(3, 2), None);
    assert!(d.prompt_events >= 5, "one event per scored chunk, got {}", d.prompt_events);
    assert_matches_reference(&d, &prompt, 3);
    // The generated tokens follow the prompt's logprobs, and the first
    // one's logprob is the reference's at the prompt's end.
    assert_eq!(d.tokens.len(), 2);
    let mut extended = prompt.clone();
    extended.push(d.tokens[0]);
    let reference = reference_logprobs(&embedded_model(0).unwrap(), &extended).unwrap();
    assert!((f64::from(d.logprobs[0].chosen.logprob) - reference[prompt.len() - 1]).abs() < TOL);
}

#[test]
fn a_cached_prefix_is_computed_again_for_scoring_and_reused_otherwise() {
    let e = engine(|_| {});
    let prompt = tokens(2, 64);
    run(&e, &prompt, greedy(1), None);
    // The prefix index holds the prompt: a plain request reuses it...
    assert!(run(&e, &prompt, greedy(1), None).usage.cached_tokens >= 48);
    // ...a scoring one computes it all, so every position has logits.
    let d = run(&e, &prompt, scoring(1, 1), None);
    assert_eq!(d.usage.cached_tokens, 0);
    assert_matches_reference(&d, &prompt, 1);
    // Its blocks went back to the index: reused by the next plain request.
    assert!(run(&e, &prompt, greedy(1), None).usage.cached_tokens >= 48);
}

#[test]
fn a_scoring_turn_of_a_session_recomputes_the_history_and_still_commits() {
    let e = engine(|_| {});
    let turn1 = tokens(3, 40);
    let out1 = run(&e, &turn1, greedy(4), Some("s")).tokens;
    let mut turn2 = turn1.clone();
    turn2.extend(&out1);
    turn2.extend(tokens(4, 10));
    let d = run(&e, &turn2, scoring(0, 4), Some("s"));
    assert_eq!(d.usage.cached_tokens, 0);
    assert_matches_reference(&d, &turn2, 0);
    // The session holds the scoring turn: the next turn reuses it.
    let mut turn3 = turn2.clone();
    turn3.extend(&d.tokens);
    turn3.extend(tokens(5, 5));
    assert!(run(&e, &turn3, greedy(1), Some("s")).usage.cached_tokens >= 48);
}

#[test]
fn max_tokens_zero_scores_the_prompt_without_generating() {
    let e = engine(|_| {});
    let prompt = tokens(6, 33);
    let d = run(&e, &prompt, scoring(0, 0), None);
    assert!(d.tokens.is_empty());
    assert_eq!((d.reason, d.usage.completion_tokens, d.usage.prompt_tokens), (FinishReason::Length, 0, prompt.len()));
    assert_matches_reference(&d, &prompt, 0);
    // Without prompt logprobs, max_tokens 0 only computes the prompt.
    let d = run(&e, &prompt, greedy(0), None);
    assert!(d.tokens.is_empty() && d.prompt_logprobs.is_empty());
    assert_eq!(d.reason, FinishReason::Length);
    // A one-token prompt has nothing to score.
    let d = run(&e, &prompt[..1], scoring(2, 0), None);
    assert_eq!((d.prompt_logprobs.len(), d.prompt_events), (0, 0));
}

#[test]
fn many_scoring_requests_at_once_each_get_their_own_prompt_scored() {
    // Several scoring and plain requests share steps (and the 64-row LM
    // head slices): each gets its own prompt's logprobs.
    let e = engine(|c| c.max_num_batched_tokens = 96);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(10 + i, 30 + 7 * i as usize)).collect();
    let mut streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sampling = if i % 3 == 2 { greedy(3) } else { scoring(2, i % 2) };
            e.submit(GenerateRequest { request_id: format!("r{i}"), prompt_tokens: p.clone(), sampling, ..Default::default() }).unwrap()
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let d = finished(s);
        if i % 3 == 2 {
            assert!(d.prompt_logprobs.is_empty());
        } else {
            assert_matches_reference(&d, &prompts[i], 2);
        }
    }
}
