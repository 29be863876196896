//! Sessions across turns, the prefix cache and tiered eviction, on the
//! embedded model: reuse never changes greedy output, and every block and
//! host slot comes back.

use std::collections::HashMap;

mod common;

use common::{finished, greedy, tokens, wait_for};
use kvc_engine::{EngineConfig, EngineHandle, GenerateRequest, KvCacheDtype, ReusePath, Usage};

const BS: usize = 16;

/// [`common::engine`] with 1,024 blocks of `BS` tokens.
fn engine(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    common::engine(|c| {
        (c.num_kv_blocks, c.block_size) = (Some(1024), BS);
        f(c)
    })
}

fn run(e: &EngineHandle, session: Option<&str>, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Usage) {
    let mut s = e
        .submit(GenerateRequest {
            request_id: "t".into(),
            prompt_tokens: prompt.to_vec(),
            sampling: greedy(max_tokens),
            session_id: session.map(str::to_string),
            ..Default::default()
        })
        .unwrap();
    let d = finished(&mut s);
    (d.tokens, d.usage)
}

#[test]
fn second_turn_computes_only_the_new_tokens_and_matches_a_cold_run() {
    let e = engine(|_| {});
    let turn1 = tokens(1, 50);
    let (out1, u1) = run(&e, Some("s1"), &turn1, 8);
    assert_eq!(u1.cached_tokens, 0);
    // Turn 2 = turn 1 + its answer + a new user message.
    let mut turn2 = turn1.clone();
    turn2.extend(&out1);
    turn2.extend(tokens(2, 21));
    let (out2, u2) = run(&e, Some("s1"), &turn2, 8);
    // The session holds turn 1's prompt and all but the last output token
    // (50 + 7 = 57 tokens): whole blocks of it are reused.
    let committed = turn1.len() + out1.len() - 1;
    assert_eq!(u2.cached_tokens, committed / BS * BS);
    assert_eq!(u2.computed_tokens(), turn2.len() - committed / BS * BS);
    assert_eq!(u2.reuse_reason, ReusePath::SessionHit);
    let cold = engine(|c| c.enable_prefix_caching = false);
    let (cold_out, cold_u) = run(&cold, None, &turn2, 8);
    assert_eq!(cold_u.cached_tokens, 0);
    assert_eq!(out2, cold_out);
}

#[test]
fn a_history_that_differs_at_k_reuses_exactly_the_whole_blocks_before_k() {
    let e = engine(|c| c.enable_prefix_caching = false);
    let turn1 = tokens(3, 80);
    let (out1, _) = run(&e, Some("s"), &turn1, 4);
    for k in [37usize, 48, 5] {
        // Turn 2 edits position k of the history (as Qwen3's template does
        // when it drops an old <think> block) and appends a new message.
        let mut turn2 = turn1.clone();
        turn2.extend(&out1);
        turn2[k] = turn2[k] % 1000 + 1;
        turn2.extend(tokens(4, 10));
        let (out2, u2) = run(&e, Some("s"), &turn2, 4);
        assert_eq!(u2.cached_tokens, k / BS * BS, "k = {k}");
        let cold = engine(|c| c.enable_prefix_caching = false);
        assert_eq!(out2, run(&cold, None, &turn2, 4).0, "k = {k}");
        // Re-seed the session with the original history for the next k.
        run(&e, Some("s"), &turn1, 4);
    }
}

#[test]
fn a_shared_system_prompt_is_stored_once() {
    let e = engine(|_| {});
    let total = e.stats().total_blocks;
    let system = tokens(5, 1000);
    let mut a = system.clone();
    a.extend(tokens(6, 20));
    let mut b = system.clone();
    b.extend(tokens(7, 20));
    let (_, ua) = run(&e, Some("a"), &a, 4);
    let used_after_a = total - wait_for(&e, |s| s.running == 0).free_blocks;
    let (_, ub) = run(&e, Some("b"), &b, 4);
    let used_after_b = total - wait_for(&e, |s| s.running == 0).free_blocks;
    assert_eq!(ua.cached_tokens, 0);
    assert_eq!(ub.cached_tokens, 1000 / BS * BS);
    assert_eq!(ub.reuse_reason, ReusePath::PrefixHit);
    // B adds only its own blocks: the 62 shared blocks are not stored twice.
    let b_own = (b.len() + 3).div_ceil(BS) - 1000 / BS;
    assert!(used_after_b - used_after_a <= b_own, "a {used_after_a}, b {used_after_b}, b's own {b_own}");
}

/// 50 sessions x 6 turns against a pool that holds about 5 sessions.
#[test]
fn fifty_sessions_under_pressure_fail_nothing_and_match_an_unconstrained_run() {
    fifty_sessions_under_pressure(KvCacheDtype::Auto);
}

/// The same with an FP8 cache (`--kv-cache-dtype fp8`): blocks demoted to
/// the host tier and restored, or evicted and recomputed, come back as the
/// same e4m3 bytes, so greedy output still equals the unconstrained run's.
#[test]
fn fifty_sessions_under_pressure_with_an_fp8_cache_match_an_unconstrained_run() {
    fifty_sessions_under_pressure(KvCacheDtype::Fp8E4m3);
}

fn fifty_sessions_under_pressure(kv: KvCacheDtype) {
    const SESSIONS: u32 = 50;
    const TURNS: usize = 6;
    let play = |e: &EngineHandle| -> HashMap<(u32, usize), Vec<u32>> {
        let mut history: HashMap<u32, Vec<u32>> = (0..SESSIONS).map(|s| (s, tokens(100 + s, 40))).collect();
        let mut outputs = HashMap::new();
        for turn in 0..TURNS {
            // Every session's turn runs concurrently.
            let mut streams: Vec<_> = (0..SESSIONS)
                .map(|s| {
                    let prompt = history[&s].clone();
                    let stream = e
                        .submit(GenerateRequest {
                            request_id: format!("{s}-{turn}"),
                            prompt_tokens: prompt,
                            sampling: greedy(6),
                            session_id: Some(format!("session-{s}")),
                            ..Default::default()
                        })
                        .unwrap();
                    (s, stream)
                })
                .collect();
            for (s, stream) in streams.iter_mut() {
                let out = finished(stream).tokens;
                let h = history.get_mut(s).unwrap();
                h.extend(&out);
                h.extend(tokens(1000 + *s * 10 + turn as u32, 10));
                outputs.insert((*s, turn), out);
            }
        }
        outputs
    };
    let reference = play(&engine(|c| (c.num_kv_blocks, c.kv_cache_dtype) = (Some(4096), kv)));
    // A final history is 40 + 6 * 16 = 136 tokens = 9 blocks; 5 sessions ~ 45 blocks.
    let tight = engine(|c| {
        c.kv_cache_dtype = kv;
        c.num_kv_blocks = Some(48);
        c.swap_space_bytes = 64 << 20;
    });
    let initial = tight.stats();
    assert_eq!(play(&tight), reference);
    let s = wait_for(&tight, |s| s.running == 0 && s.waiting == 0);
    assert!(s.cache.host_restores > 0, "expected host-tier restores: {:?}", s.cache);
    assert!(s.cache.evictions.keys().any(|(tier, _)| tier == "host"), "{:?}", s.cache.evictions);
    assert!(s.cache.session_hits > 0);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for sid in 0..SESSIONS {
        rt.block_on(tight.delete_session(&format!("session-{sid}"))).unwrap();
    }
    rt.block_on(tight.reset_prefix_cache()).unwrap();
    let after = wait_for(&tight, |s| s.sessions.is_empty() && s.free_blocks == initial.free_blocks);
    assert_eq!(after.free_blocks, initial.free_blocks);
    assert_eq!(after.host_free_blocks, initial.host_free_blocks);
}

#[test]
fn session_ids_match_exactly() {
    let e = engine(|c| c.enable_prefix_caching = false);
    let p = tokens(9, 40);
    run(&e, Some("session-1"), &p, 2);
    let (_, u) = run(&e, Some("session-12"), &p, 2);
    assert_eq!(u.cached_tokens, 0);
    let (_, u) = run(&e, Some("session-1"), &p, 2);
    assert_eq!(u.cached_tokens, 32);
}
