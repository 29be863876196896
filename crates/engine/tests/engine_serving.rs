//! End-to-end properties of the engine on the embedded model: batching,
//! chunking and preemption never change greedy output, and every block
//! comes back.

mod common;

use common::{collect, engine, greedy, wait_for};
use kvc_engine::{EngineHandle, FinishReason, GenerateRequest, SamplingParams, StreamEvent};

/// Eight prompts of different lengths (not multiples of the block size).
fn prompts() -> Vec<Vec<u32>> {
    (0..8u32).map(|i| (0..(5 + 7 * i)).map(|j| (1000 + 37 * i + 11 * j) % 150000).collect()).collect()
}

fn submit(e: &EngineHandle, prompt: &[u32], p: SamplingParams) -> kvc_engine::RequestStream {
    e.submit(GenerateRequest { request_id: "t".into(), prompt_tokens: prompt.to_vec(), sampling: p, ..Default::default() }).unwrap()
}

fn alone(e: &EngineHandle, max_tokens: usize) -> Vec<Vec<u32>> {
    prompts().iter().map(|p| collect(&mut submit(e, p, greedy(max_tokens))).tokens).collect()
}

fn concurrent(e: &EngineHandle, max_tokens: usize) -> Vec<Vec<u32>> {
    let streams: Vec<_> = prompts().iter().map(|p| submit(e, p, greedy(max_tokens))).collect();
    streams.into_iter().map(|mut s| collect(&mut s).tokens).collect()
}

#[test]
fn batch_invariance_concurrent_prompts_match_each_served_alone() {
    let e = engine(|_| {});
    let reference = alone(&e, 10);
    assert!(reference.iter().all(|t| t.len() == 10));
    assert_eq!(concurrent(&e, 10), reference);
}

#[test]
fn tiny_step_budget_chunks_prefill_without_changing_output() {
    let reference = alone(&engine(|_| {}), 6);
    let chunked = engine(|c| c.max_num_batched_tokens = 5);
    assert_eq!(concurrent(&chunked, 6), reference);
}

#[test]
fn preemption_under_a_small_pool_keeps_outputs_and_returns_every_block() {
    let reference = alone(&engine(|_| {}), 24);
    // 8 sequences need about 3-5 blocks of 16 each; 12 blocks cannot hold
    // them all. With no growth reserved at admission, decodes outgrow the
    // pool and preempt.
    let small = engine(|c| {
        c.num_kv_blocks = Some(12);
        c.growth_reserve_tokens = 0;
    });
    let initial_free = small.stats().free_blocks;
    assert_eq!(initial_free, 12);
    assert_eq!(concurrent(&small, 24), reference);
    let s = wait_for(&small, |s| s.running == 0 && s.waiting == 0);
    assert!(s.preemptions > 0, "the pool was meant to be too small: {s:?}");
    // What is not free is only the prefix cache's (reclaimable) blocks...
    assert_eq!(s.free_blocks + s.evictable_blocks, initial_free);
    // ...and dropping the prefix cache returns every block.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = rt.block_on(small.reset_prefix_cache()).unwrap();
    assert_eq!((r.freed_blocks, r.snapshot_blocks), (s.evictable_blocks, 0), "{r:?}");
    assert_eq!(wait_for(&small, |s| s.free_blocks == initial_free).free_blocks, initial_free);
}

/// Long prompts chunked beside short ones that go first, several partial
/// prefills, one long at a time, and a step budget cut to the floor by a
/// tiny latency target: greedy outputs are those of each prompt alone.
#[test]
fn fair_long_prefill_ordering_keeps_greedy_outputs() {
    let mut all = prompts();
    all.push((0..300u32).map(|j| (500 + 13 * j) % 150000).collect());
    all.push((0..280u32).map(|j| (900 + 17 * j) % 150000).collect());
    all.rotate_right(2); // the long ones arrive first
    let reference: Vec<Vec<u32>> = {
        let e = engine(|_| {});
        all.iter().map(|p| collect(&mut submit(&e, p, greedy(8))).tokens).collect()
    };
    let fair = engine(|c| {
        c.max_num_batched_tokens = 300;
        c.long_prefill_token_threshold = Some(100);
        c.max_num_partial_prefills = 3;
        c.max_long_partial_prefills = 1;
        c.max_step_ms = Some(0.001);
    });
    let streams: Vec<_> = all.iter().map(|p| submit(&fair, p, greedy(8))).collect();
    let got: Vec<Vec<u32>> = streams.into_iter().map(|mut s| collect(&mut s).tokens).collect();
    assert_eq!(got, reference);
    let s = wait_for(&fair, |s| s.running == 0 && s.waiting == 0);
    assert_eq!(s.preemptions, 0);
    assert!(s.admission_decisions.iter().any(|(r, n)| *r == "admitted" && *n == all.len() as u64), "{:?}", s.admission_decisions);
}

#[test]
fn dropping_a_stream_cancels_and_frees_blocks() {
    let e = engine(|_| {});
    let total = e.stats().total_blocks;
    let mut s = submit(&e, &prompts()[7], greedy(4000));
    // Wait for generation to start, then walk away.
    assert!(matches!(s.blocking_recv(), Some(StreamEvent::Token { .. })));
    drop(s);
    let stats = wait_for(&e, |s| s.free_blocks + s.evictable_blocks == total && s.running == 0);
    assert_eq!(stats.free_blocks + stats.evictable_blocks, total);
}

#[test]
fn max_tokens_and_stop_strings_end_generation() {
    let e = engine(|_| {});
    let out = collect(&mut submit(&e, &prompts()[2], greedy(7)));
    assert_eq!(out.reason, FinishReason::Length);
    assert_eq!(out.usage.completion_tokens, 7);
    // A stop string taken from the unconstrained output ends it there.
    let full = collect(&mut submit(&e, &prompts()[2], greedy(20)));
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() > 6, "need some text: {:?}", full.text);
    let stop: String = chars[3..5].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let out = collect(&mut submit(&e, &prompts()[2], SamplingParams { stop: vec![stop.clone()], ..greedy(20) }));
    assert_eq!(out.reason, FinishReason::Stop);
    assert_eq!(out.text, full.text[..cut]);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let e = engine(|_| {});
    let p = |seed| SamplingParams { temperature: 1.0, seed: Some(seed), max_tokens: 12, ignore_eos: true, ..Default::default() };
    let a = collect(&mut submit(&e, &prompts()[1], p(42))).tokens;
    let b = collect(&mut submit(&e, &prompts()[1], p(42))).tokens;
    let c = collect(&mut submit(&e, &prompts()[1], p(43))).tokens;
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn invalid_requests_are_refused_before_scheduling() {
    let e = engine(|_| {});
    let vocab = e.info().vocab_size as u32;
    let bad_token =
        e.submit(GenerateRequest { request_id: "t".into(), prompt_tokens: vec![1, vocab], sampling: greedy(1), ..Default::default() });
    assert!(matches!(bad_token, Err(kvc_engine::EngineError::TokenOutOfRange { .. })));
    let long = vec![1u32; e.info().max_model_len];
    assert!(matches!(
        e.submit(GenerateRequest { request_id: "t".into(), prompt_tokens: long, sampling: greedy(1), ..Default::default() }),
        Err(kvc_engine::EngineError::PromptTooLong { .. })
    ));
    let bad_temp = SamplingParams { temperature: -1.0, ..greedy(1) };
    assert!(e
        .submit(GenerateRequest { request_id: "t".into(), prompt_tokens: vec![1], sampling: bad_temp, ..Default::default() })
        .is_err());
}

#[test]
fn a_group_of_seeded_requests_reproduces_and_an_invalid_member_submits_none() {
    // The `n` choices of one prompt: submitted as one group they share the
    // same steps every time, so the sampled tokens repeat exactly; each
    // member alone (its own batches) is the reference for "they differ".
    let e = engine(|_| {});
    let p = |seed| SamplingParams { temperature: 1.0, seed: Some(seed), max_tokens: 10, ignore_eos: true, ..Default::default() };
    let req = |seed| GenerateRequest {
        request_id: format!("g{seed}"),
        prompt_tokens: prompts()[3].clone(),
        sampling: p(seed),
        ..Default::default()
    };
    let run = || -> Vec<Vec<u32>> {
        let streams = e.submit_group((0..3).map(|i| req(100 + i)).collect()).expect("valid group");
        streams.into_iter().map(|mut s| collect(&mut s).tokens).collect()
    };
    // Same prefix-cache state for every run: the prompt's whole blocks are
    // cached first (a group's members then each compute only the rest).
    collect(&mut submit(&e, &prompts()[3], greedy(1)));
    let first = run();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|t| t.len() == 10));
    assert_eq!(first, run());
    assert_eq!(first, run());
    let distinct: std::collections::HashSet<_> = first.iter().collect();
    assert_eq!(distinct.len(), 3, "different seeds, different samples: {first:?}");
    // One invalid member: the group is refused as a whole (its valid
    // member is not submitted either: generated tokens stay as they were).
    let before = wait_for(&e, |s| s.running + s.waiting == 0).generated_tokens;
    let bad = SamplingParams { temperature: -1.0, ..greedy(1) };
    let group = vec![req(1), GenerateRequest { request_id: "bad".into(), prompt_tokens: vec![1], sampling: bad, ..Default::default() }];
    assert!(matches!(e.submit_group(group), Err(kvc_engine::EngineError::InvalidParam { .. })));
    // A later request runs behind whatever was sent before it.
    assert_eq!(collect(&mut submit(&e, &prompts()[0], greedy(2))).tokens.len(), 2);
    assert_eq!(wait_for(&e, |s| s.running + s.waiting == 0 && s.generated_tokens >= before + 2).generated_tokens, before + 2);
}

/// A submitted prompt counts in the backlog that placement decisions read
/// (`pending_prefill_tokens`) from the moment `submit` returns until it is
/// computed, also while the loop has not picked it up yet. Each prompt here
/// fits one step, so a count below its length means it was computed, and
/// then its first token has been sent.
#[test]
fn submitted_prompts_count_in_the_backlog_until_computed() {
    let e = engine(|_| {});
    for p in prompts() {
        let mut s = submit(&e, &p, greedy(3));
        let pending = e.pending_prefill_tokens();
        if pending < p.len() {
            assert!(s.try_recv().is_some(), "backlog {pending} < prompt {} but the prompt was not computed", p.len());
        }
        collect(&mut s);
        assert_eq!(e.pending_prefill_tokens(), 0, "nothing left once the request finished");
    }
}

/// `--itl-target-ms` between a decode-only step and a step with a prefill
/// chunk (both timed here first, on this machine): decode-only steps are
/// interleaved after the long steps, every request finishes, and greedy
/// outputs are those of each prompt alone; every step's decision is
/// counted. The backlog slack is raised out of the way (a slow machine's
/// chunks would exceed 0.5 s of backlog); its rule is kvc-policy's unit
/// test.
#[test]
fn decode_only_steps_interleave_without_changing_outputs() {
    use std::time::Instant;
    // Steps cut by tokens only (512), so that a step with a chunk takes a
    // 512-token chunk's time whatever this machine's speed.
    let config = |c: &mut kvc_engine::EngineConfig| {
        c.max_num_batched_tokens = 512;
        c.max_step_ms = None;
    };
    let long: Vec<Vec<u32>> = (0..2).map(|i| common::tokens(40 + i, 600)).collect();
    let short = prompts();
    let probe = engine(config);
    // The quickest of three 512-token steps alone, after a warm-up...
    collect(&mut submit(&probe, &short[0], greedy(2)));
    let chunk_s = (0..3)
        .map(|i| {
            let t = Instant::now();
            collect(&mut submit(&probe, &common::tokens(90 + i, 512), greedy(1)));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    // ... and the decode-only steps of the eight short prompts together.
    let mut streams: Vec<_> = short.iter().map(|p| submit(&probe, p, greedy(21))).collect();
    for s in &mut streams {
        assert!(matches!(s.blocking_recv(), Some(StreamEvent::Token { .. })));
    }
    let t = Instant::now();
    streams.iter_mut().for_each(|s| drop(collect(s)));
    let decode_s = t.elapsed().as_secs_f64() / 20.0;
    assert!(decode_s < chunk_s, "a decode step ({decode_s} s) should be quicker than a 512-token chunk ({chunk_s} s)");
    let target_ms = (decode_s * chunk_s).sqrt() * 1e3;

    // The short prompts decode 40 tokens, through the long prompts' prefill.
    let work: Vec<(&Vec<u32>, usize)> = short.iter().map(|p| (p, 40)).chain(long.iter().map(|p| (p, 8))).collect();
    let reference: Vec<Vec<u32>> = work.iter().map(|(p, n)| collect(&mut submit(&probe, p, greedy(*n))).tokens).collect();
    let e = engine(|c| {
        config(c);
        c.itl_target_ms = Some(target_ms);
        c.itl_backlog_slack_s = 3600.0;
    });
    // A first round of the same shape (other long prompts) lets the engine's
    // step-time model learn this machine's decode-only and mixed steps,
    // which the decision reads.
    let warm: Vec<Vec<u32>> = (0..2).map(|i| common::tokens(60 + i, 600)).collect();
    let mut streams: Vec<_> = short.iter().map(|p| submit(&e, p, greedy(20))).collect();
    streams.extend(warm.iter().map(|p| submit(&e, p, greedy(4))));
    streams.iter_mut().for_each(|s| drop(collect(s)));
    // Decodes first, then the long prompts arrive behind them.
    let mut streams: Vec<_> = work[..short.len()].iter().map(|(p, n)| submit(&e, p, greedy(*n))).collect();
    let mut first = Vec::new();
    for s in &mut streams {
        match s.blocking_recv() {
            Some(StreamEvent::Token { token_id, .. }) => first.push(token_id),
            other => panic!("expected a first token, got {other:?}"),
        }
    }
    streams.extend(work[short.len()..].iter().map(|(p, n)| submit(&e, p, greedy(*n))));
    let got: Vec<Vec<u32>> = streams
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let mut tokens = first.get(i).map(|t| vec![*t]).unwrap_or_default();
            tokens.extend(collect(&mut s).tokens);
            tokens
        })
        .collect();
    assert_eq!(got, reference);
    let s = wait_for(&e, |s| s.running == 0 && s.waiting == 0);
    let count = |kind: &str, reason: &str| s.step_kinds.iter().find(|(k, _)| *k == (kind, reason)).map_or(0, |(_, n)| *n);
    let why = format!("target {target_ms:.2} ms (decode step {decode_s:.4} s, chunk {chunk_s:.4} s): {:?}", s.step_kinds);
    assert!(count("decode_only", "interleave") > 0, "no decode-only step; {why}");
    assert!(count("mixed", "interleaved") > 0, "prefill did not resume after the decode-only steps; {why}");
    let decided: u64 = s.step_kinds.iter().map(|(_, n)| n).sum();
    assert!(decided >= s.steps, "every step is decided ({decided} decisions, {} steps)", s.steps);
}
