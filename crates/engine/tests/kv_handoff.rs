//! The engine's side of prefill/decode disaggregation, in one process: a
//! "prefill" engine computes a prompt and leases its blocks, the blocks are
//! copied byte for byte into a "decode" engine's reserved blocks (what the
//! Mooncake transport does between processes), and the decode engine
//! continues. Snapshot pushes go the other way and make a later prefill of
//! the session skip the covered prefix (bypass). Greedy output must equal a
//! single engine's, whatever path the KV took.

mod common;

use common::{finished, greedy, tokens, wait_for, Done};
use kvc_engine::{EngineConfig, EngineHandle, GenerateRequest, ModelInfo, ReusePath, SamplingParams, Usage};

const BS: usize = 16;

/// [`common::engine`] with blocks of `BS` tokens.
fn engine(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    common::engine(|c| {
        c.block_size = BS;
        f(c)
    })
}

fn req(session: Option<&str>, prompt: &[u32], sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        request_id: "t".into(),
        prompt_tokens: prompt.to_vec(),
        sampling,
        session_id: session.map(str::to_string),
        ..Default::default()
    }
}

/// Copies whole blocks (every layer) between two engines' pools, as the
/// transport does: raw bytes at the offsets the layout gives.
fn copy_blocks(src: &ModelInfo, src_blocks: &[u32], dst: &ModelInfo, dst_blocks: &[u32]) {
    assert_eq!(src.kv_layout, dst.kv_layout);
    assert_eq!(src_blocks.len(), dst_blocks.len());
    let l = &src.kv_layout;
    let elem = l.dtype.size_in_bytes();
    let len = l.layer_block_bytes();
    for layer in 0..l.num_layers {
        for (&s, &d) in src_blocks.iter().zip(dst_blocks) {
            let so = l.block_offset(src.num_kv_blocks, layer, s as usize) * elem;
            let d_o = l.block_offset(dst.num_kv_blocks, layer, d as usize) * elem;
            let (sr, dr) = (src.kv_region.expect("host pool"), dst.kv_region.expect("host pool"));
            assert!(so + len <= sr.len && d_o + len <= dr.len);
            // SAFETY: in-bounds ranges of two live pools; the blocks are
            // leased (source) and reserved (destination), so neither engine
            // writes them meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping((sr.addr + so) as *const u8, (dr.addr + d_o) as *mut u8, len);
            }
        }
    }
}

/// A remote prefill: D reserves, P computes and exports, the missing
/// blocks are copied, D continues. Returns D's output and P's usage.
fn remote_turn(p: &EngineHandle, d: &EngineHandle, session: &str, prompt: &[u32], max_tokens: usize) -> (Done, Usage, usize) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reservation = rt.block_on(d.reserve(Some(session), None, prompt)).expect("reserve");
    let held = reservation.held_tokens;
    let mut sampling = greedy(1);
    sampling.logprobs = Some(2);
    let mut ps = p.submit_export(req(Some(session), prompt, sampling)).unwrap();
    let done = finished(&mut ps);
    let lease = done.export.expect("export lease");
    assert_eq!(lease.blocks().len(), prompt.len().div_ceil(BS));
    let skip = held / BS;
    copy_blocks(p.info(), &lease.blocks()[skip..], d.info(), reservation.blocks_to_fill(BS));
    drop(lease);
    let first = (done.tokens[0], done.first_logprobs.clone());
    let mut sampling = greedy(max_tokens);
    sampling.logprobs = Some(2);
    let mut ds = d.submit_reserved(req(Some(session), prompt, sampling), reservation, prompt.len(), Some(first)).unwrap();
    (finished(&mut ds), done.usage, held)
}

fn run_local(e: &EngineHandle, session: Option<&str>, prompt: &[u32], max_tokens: usize) -> Done {
    let mut sampling = greedy(max_tokens);
    sampling.logprobs = Some(2);
    finished(&mut e.submit(req(session, prompt, sampling)).unwrap())
}

/// Waits (bounded) until `f` holds for the engine's published state.
fn wait_until(e: &EngineHandle, what: &str, f: impl Fn(&kvc_engine::EngineStats) -> bool) {
    assert!(f(&wait_for(e, &f)), "timed out waiting for {what}");
}

#[test]
fn remote_prefill_then_local_decode_equals_one_engine() {
    let both = engine(|_| {});
    let p = engine(|c| c.snapshot_store_blocks = 128);
    let d = engine(|_| {});
    let prompt = tokens(1, 70);
    let want = run_local(&both, None, &prompt, 12);
    let (got, p_usage, held) = remote_turn(&p, &d, "s", &prompt, 12);
    assert_eq!(held, 0);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.first_logprobs, want.first_logprobs, "the first token's logprobs travel with it");
    assert_eq!(p_usage.computed_tokens(), 70);
    assert_eq!(got.usage.completion_tokens, 12);
    // Turn 2 on D: the session is resident, only the suffix is computed.
    let mut prompt2 = prompt.clone();
    prompt2.extend(&got.tokens);
    prompt2.extend(tokens(2, 9));
    let want2 = run_local(&both, None, &prompt2, 6);
    let got2 = run_local(&d, Some("s"), &prompt2, 6);
    assert_eq!(got2.tokens, want2.tokens);
    assert_eq!(got2.usage.reuse_reason, ReusePath::SessionHit);
    // Everything is given back: D's pool minus its session, P's minus its snapshot and prefix cache.
    drop(got);
    let snap_blocks = p.stats().snapshot_used_blocks;
    assert_eq!(snap_blocks, 70 / BS, "P keeps the prompt's full blocks as the session's snapshot");
    wait_until(&d, "D's reservation and session blocks only", |s| s.running == 0);
}

#[test]
fn a_snapshot_push_lets_another_decode_worker_resume_by_bypass() {
    let both = engine(|_| {});
    let p = engine(|c| c.snapshot_store_blocks = 256);
    let d1 = engine(|c| c.snapshot_min_tokens = 32);
    let d2 = engine(|_| {});
    let jobs = d1.take_snapshot_jobs().expect("snapshot jobs");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();

    // Two turns on D1 computed locally; each commit may queue a push.
    let mut jobs = jobs;
    let push_all = |jobs: &mut tokio::sync::mpsc::UnboundedReceiver<kvc_engine::SnapshotJob>| {
        let mut last = None;
        while let Ok(job) = jobs.try_recv() {
            // D -> P: offer, copy only what P lacks, commit.
            let slot = rt.block_on(p.snapshot_reserve(&job.session_id, job.tokens.clone())).unwrap();
            copy_blocks(d1.info(), &job.lease.blocks()[slot.from_block..], p.info(), &slot.blocks);
            let covered = rt.block_on(p.snapshot_commit(slot.reservation)).unwrap();
            assert_eq!(covered, job.tokens.len());
            // The pusher's report reaches D1 before the next turn (one command queue).
            d1.snapshot_pushed(&job.session_id, true);
            last = Some((slot.from_block, covered));
        }
        last
    };
    let t1 = tokens(3, 40);
    let o1 = run_local(&d1, Some("m"), &t1, 8);
    // Committed: 40 + 7 = 47 tokens -> 2 full blocks pushed.
    assert_eq!(push_all(&mut jobs), Some((0, 32)));
    let mut t2 = t1.clone();
    t2.extend(&o1.tokens);
    t2.extend(tokens(4, 30));
    let o2 = run_local(&d1, Some("m"), &t2, 8);
    // Committed: 40 + 8 + 30 + 7 = 85 tokens -> 5 full blocks, only 3 new ones sent.
    let last_tokens = push_all(&mut jobs).map(|(from, n)| {
        assert_eq!(from, 2, "the delta only");
        n
    });
    let last_tokens = last_tokens.unwrap_or(0);
    assert_eq!(last_tokens, 80);
    wait_until(&p, "the snapshot", |s| s.snapshots.get("m").map(|i| i.tokens) == Some(80));

    // Turn 3 goes to D2, which holds nothing: P bypasses the 80 tokens.
    let mut t3 = t2.clone();
    t3.extend(&o2.tokens);
    t3.extend(tokens(5, 11));
    let want = run_local(&both, None, &t3, 10);
    let (got, p_usage, held) = remote_turn(&p, &d2, "m", &t3, 10);
    assert_eq!(held, 0);
    assert_eq!(p_usage.reuse_reason, ReusePath::Bypass);
    assert_eq!(p_usage.cached_tokens, 80);
    assert_eq!(p_usage.computed_tokens(), t3.len() - 80);
    assert_eq!(got.tokens, want.tokens, "a session moved by bypass answers as if it never moved");

    // A prefix-cache reset on P reports what it freed, not what it dropped
    // from the index: the snapshot store still holds its blocks.
    wait_until(&p, "P idle", |s| s.running == 0 && s.waiting == 0);
    let free = p.stats().free_blocks;
    let r = rt.block_on(p.reset_prefix_cache()).unwrap();
    assert_eq!(r.snapshot_blocks, p.stats().snapshot_used_blocks);
    assert!(r.snapshot_blocks >= 5, "{r:?}");
    wait_until(&p, "the reset's snapshot", |s| s.free_blocks == free + r.freed_blocks);
    assert!(r.freed_blocks <= r.index_blocks, "{r:?}");
}

#[test]
fn a_released_session_revokes_its_push_and_dropped_reservations_free_their_blocks() {
    let d = engine(|c| {
        c.snapshot_min_tokens = 16;
        c.num_kv_blocks = Some(64);
    });
    let mut jobs = d.take_snapshot_jobs().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let free0 = d.stats().free_blocks;
    run_local(&d, Some("gone"), &tokens(6, 40), 4);
    let job = jobs.blocking_recv().expect("a push is queued");
    assert!(!job.lease.is_revoked());
    assert!(rt.block_on(d.delete_session("gone")).unwrap());
    wait_until(&d, "the revocation", |_| job.lease.is_revoked());
    d.snapshot_pushed("gone", false);
    drop(job);
    // A reservation dropped unsubmitted gives its blocks back.
    let r = rt.block_on(d.reserve(None, None, &tokens(7, 100))).unwrap();
    assert_eq!(r.blocks.len(), 7);
    drop(r);
    rt.block_on(d.reset_prefix_cache()).unwrap();
    wait_until(&d, "every block back", |s| s.free_blocks == free0);
}
