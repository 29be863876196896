//! `min_tokens` on the embedded model: before it, stop tokens (EOS among
//! them) are masked and stop strings do not match; after it, they end the
//! output where they would have; a grammar that allows only the end wins.

mod common;

use common::{collect, engine, greedy};
use kvc_engine::{Constraint, EngineError, EngineHandle, FinishReason, GenerateRequest, Grammar, ReasoningGate, SamplingParams};

fn prompt() -> Vec<u32> {
    common::tokens(3, 11)
}

fn run(e: &EngineHandle, sampling: SamplingParams) -> common::Done {
    collect(&mut e.submit(GenerateRequest { request_id: "m".into(), prompt_tokens: prompt(), sampling, ..Default::default() }).unwrap())
}

#[test]
fn a_stop_token_the_model_emits_first_cannot_end_the_output_before_min_tokens() {
    let e = engine(|_| {});
    let first = run(&e, greedy(1)).tokens[0];
    let stop = |min_tokens| SamplingParams { stop_token_ids: vec![first], min_tokens, ..greedy(30) };
    let early = run(&e, stop(0));
    assert_eq!((early.tokens.as_slice(), early.reason), ([first].as_slice(), FinishReason::Stop));
    let out = run(&e, stop(5));
    assert!(out.tokens.len() >= 5, "{:?}", out.tokens);
    // Masked, not only ignored: the token is not even sampled before the minimum.
    assert!(!out.tokens[..5].contains(&first), "{:?}", out.tokens);
    if out.reason == FinishReason::Stop {
        assert_eq!(out.tokens.iter().position(|&t| t == first), Some(out.tokens.len() - 1), "{:?}", out.tokens);
    }
    assert_eq!(out.usage.completion_tokens, out.tokens.len());
}

#[test]
fn eos_is_masked_until_min_tokens_then_ends_the_output() {
    let e = engine(|_| {});
    let eos = e.info().eos_token_ids[0];
    // A bias that makes EOS the greedy choice at every step.
    let forced = |min_tokens| SamplingParams { ignore_eos: false, logit_bias: vec![(eos, 100.0)], min_tokens, ..greedy(30) };
    assert_eq!(run(&e, forced(0)).tokens, vec![eos]);
    let out = run(&e, forced(4));
    assert_eq!(out.reason, FinishReason::Stop);
    assert_eq!(out.tokens.len(), 5, "{:?}", out.tokens);
    assert!(!out.tokens[..4].contains(&eos) && out.tokens[4] == eos, "{:?}", out.tokens);
}

#[test]
fn after_min_tokens_a_stop_token_ends_the_output_where_it_would_have() {
    let e = engine(|_| {});
    let reference = run(&e, greedy(24)).tokens;
    // A token first emitted at k >= 4: masking it for the first 4 tokens
    // changes nothing (greedy never chose it there).
    let min_tokens = 4;
    let k = (min_tokens..reference.len())
        .find(|&k| !reference[..k].contains(&reference[k]))
        .unwrap_or_else(|| panic!("no token first emitted after {min_tokens}: {reference:?}"));
    let stop = |min_tokens| SamplingParams { stop_token_ids: vec![reference[k]], min_tokens, ..greedy(24) };
    let without = run(&e, stop(0));
    let with = run(&e, stop(min_tokens));
    assert_eq!(without.tokens, reference[..=k]);
    assert_eq!((with.tokens, with.reason), (without.tokens, FinishReason::Stop));
    // min_tokens = max_tokens: exactly that many.
    let exact = run(&e, SamplingParams { min_tokens: 6, ..greedy(6) });
    assert_eq!((exact.tokens.len(), exact.reason), (6, FinishReason::Length));
}

#[test]
fn stop_strings_inside_the_first_min_tokens_do_not_end_the_output() {
    let e = engine(|_| {});
    let full = run(&e, greedy(24));
    let head = run(&e, greedy(8)).text;
    let chars: Vec<char> = head.chars().collect();
    assert!(chars.len() > 4, "need some text: {head:?}");
    let stop: String = chars[1..3].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let strings = |min_tokens| SamplingParams { stop: vec![stop.clone()], min_tokens, ..greedy(24) };
    assert_eq!(run(&e, strings(0)).text, full.text[..cut]);
    let out = run(&e, strings(8));
    assert!(out.tokens.len() >= 8, "{:?}", out.tokens);
    // Stop strings do not change what is sampled, only where the text ends.
    assert_eq!(out.tokens, full.tokens[..out.tokens.len()]);
    assert!(full.text.starts_with(&out.text) && out.text.len() > cut, "{:?} vs {:?}", out.text, full.text);
}

#[test]
fn a_grammar_that_allows_only_the_end_wins_over_min_tokens() {
    let e = engine(|_| {});
    let grammar = Constraint { grammar: Grammar::Regex("(yes|no)".into()), reasoning: ReasoningGate::Off };
    for seed in 0..4 {
        let sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            max_tokens: 40,
            min_tokens: 20,
            constraint: Some(grammar.clone()),
            ..Default::default()
        };
        let out = run(&e, sampling);
        assert_eq!(out.reason, FinishReason::Stop, "seed {seed}: {:?}", out.text);
        assert!(out.text == "yes" || out.text == "no", "seed {seed}: {:?}", out.text);
        assert!(out.tokens.len() < 20, "seed {seed}: {:?}", out.tokens);
    }
}

#[test]
fn min_tokens_above_max_tokens_is_refused_naming_it() {
    let e = engine(|_| {});
    let req = GenerateRequest {
        request_id: "m".into(),
        prompt_tokens: prompt(),
        sampling: SamplingParams { min_tokens: 9, ..greedy(8) },
        ..Default::default()
    };
    assert!(matches!(e.submit(req), Err(EngineError::InvalidParam { param, .. }) if param == "min_tokens"));
}
