//! Tests of [`SessionAwareCache`] (and helpers its child modules' tests share).

use candle_core::{DType, Device, Tensor};
use kvc_kv_pool::KvLayout;

use super::*;

pub(super) const BS: usize = 4;

pub(super) fn setup(blocks: usize, host: usize) -> (SessionAwareCache, BlockAllocator, KvStorage) {
    let layout = KvLayout { num_layers: 2, num_kv_heads: 1, head_dim: 2, block_size: BS, dtype: DType::F32 };
    let cfg = CacheConfig {
        block_size: BS,
        enable_prefix_caching: true,
        host_blocks: host,
        session_ttl: Duration::from_secs(60),
        max_sessions_per_key: 0,
    };
    (SessionAwareCache::new(cfg, blocks), BlockAllocator::new(blocks), KvStorage::new(layout, blocks).unwrap())
}

/// Writes distinct values into every slot of `blocks` and returns them.
pub(super) fn fill(storage: &mut KvStorage, blocks: &[BlockId], seed: f32) -> Vec<Vec<u8>> {
    let slots: Vec<usize> = blocks.iter().flat_map(|&b| (0..BS).map(move |o| b as usize * BS + o)).collect();
    for layer in 0..2 {
        let n = slots.len();
        let k = Tensor::arange(0f32, (n * 2) as f32, &Device::Cpu)
            .unwrap()
            .affine(1.0, (seed + layer as f32) as f64)
            .unwrap()
            .reshape((n, 1, 2))
            .unwrap();
        storage.write(layer, &slots, &k, &(k.clone() * 2.0).unwrap()).unwrap();
    }
    blocks.iter().map(|&b| (0..2).flat_map(|l| storage.block_bytes(l, b).to_vec()).collect()).collect()
}

#[test]
fn a_session_offloaded_to_host_comes_back_byte_identical() {
    let (mut cache, mut alloc, mut storage) = setup(4, 8);
    // A turn of 12 tokens ran in blocks [0, 1, 2]; commit it to "s".
    let blocks = alloc.allocate(3).unwrap();
    let original = fill(&mut storage, &blocks, 100.0);
    let tokens: Vec<u32> = (0..12).collect();
    cache.acquire(Some("s"), &tokens, None, &mut alloc, &mut storage);
    cache.commit("s", &tokens, &blocks, &mut alloc);
    alloc.free_all(&blocks); // the request ends
                             // Another request needs the whole pool: "s" must move to the host tier.
    assert_eq!(cache.reclaim(4, &mut alloc, &storage), 3);
    assert_eq!(alloc.num_free(), 4);
    assert_eq!(cache.session_info("s").unwrap().tier, crate::Tier::Host);
    let other = alloc.allocate(4).unwrap();
    fill(&mut storage, &other, -7.0); // overwrite every device block
    alloc.free_all(&other);
    // The next turn extends the session: its blocks are restored.
    let mut next = tokens.clone();
    next.extend([50, 51, 52]);
    let got = cache.acquire(Some("s"), &next, None, &mut alloc, &mut storage);
    assert_eq!((got.tokens, got.source, got.restored_blocks), (12, ReusePath::SessionHit, 3));
    for (i, &b) in got.blocks.iter().enumerate() {
        let bytes: Vec<u8> = (0..2).flat_map(|l| storage.block_bytes(l, b).to_vec()).collect();
        assert_eq!(bytes, original[i], "block {i}");
    }
    assert_eq!(cache.stats.host_restores, 3);
    // Releasing everything returns every block and host slot.
    alloc.free_all(&got.blocks);
    cache.delete("s", &mut alloc);
    cache.reset_prefix_cache(&mut alloc);
    assert_eq!((alloc.num_free(), cache.host_free_blocks()), (4, 8));
}

/// A map kept by applying [`SessionAwareCache::take_changed_sessions`]
/// after every operation equals the full listing: creation, turns,
/// abandon, offload to host, restore, drop, delete, the per-key cap.
#[test]
fn changed_sessions_keep_a_mirror_equal_to_the_listing() {
    let (mut cache, mut alloc, mut storage) = setup(6, 4);
    cache.config.max_sessions_per_key = 3;
    let mut mirror: HashMap<String, SessionInfo> = HashMap::new();
    let mut check = |cache: &mut SessionAwareCache, what: &str| {
        crate::changes::apply(&mut mirror, cache.take_changed_sessions());
        let full: HashMap<String, SessionInfo> = cache.sessions().into_iter().map(|i| (i.id.clone(), i)).collect();
        assert_eq!(mirror, full, "after {what}");
    };
    for round in 0..3u32 {
        for s in 0..4u32 {
            let id = format!("s{s}");
            let t: Vec<u32> = (0..(BS as u32 * 2 + round)).map(|x| x + 1000 * s).collect();
            let got = cache.acquire(Some(&id), &t, None, &mut alloc, &mut storage);
            check(&mut cache, "acquire");
            let need = t.len().div_ceil(BS) - got.blocks.len();
            let Some(fresh) = cache.allocate(need, &mut alloc, &storage) else {
                alloc.free_all(&got.blocks);
                cache.abandon(&id);
                check(&mut cache, "abandon");
                continue;
            };
            check(&mut cache, "allocate (may evict)");
            let blocks: Vec<BlockId> = got.blocks.iter().copied().chain(fresh).collect();
            cache.commit(&id, &t, &blocks, &mut alloc);
            alloc.free_all(&blocks);
            check(&mut cache, "commit");
        }
    }
    cache.delete("s1", &mut alloc);
    check(&mut cache, "delete");
    assert!(cache.take_changed_sessions().is_empty(), "nothing changed since");
}

/// `max_sessions_per_key`: a key at its cap loses its own least
/// recently used idle session, never another key's.
#[test]
fn a_key_at_its_session_cap_drops_its_own_oldest_idle_session() {
    let (mut cache, mut alloc, mut storage) = setup(16, 0);
    cache.config.max_sessions_per_key = 2;
    let turn = |cache: &mut SessionAwareCache, alloc: &mut BlockAllocator, storage: &mut KvStorage, id: &str| {
        let t: Vec<u32> = (0..BS as u32).collect();
        let got = cache.acquire(Some(id), &t, None, alloc, storage);
        alloc.free_all(&got.blocks);
        let b = alloc.allocate(1).unwrap();
        cache.commit(id, &t, &b, alloc);
        alloc.free_all(&b);
        std::thread::sleep(Duration::from_millis(2)); // distinct last-use times
    };
    let id = |key: &str, s: &str| crate::scoped_session_id(key, None, s);
    for s in ["a1", "a2"] {
        turn(&mut cache, &mut alloc, &mut storage, &id("A", s));
    }
    for s in ["b1", "b2"] {
        turn(&mut cache, &mut alloc, &mut storage, &id("B", s));
    }
    // A third session of A: A's oldest goes, B keeps both.
    turn(&mut cache, &mut alloc, &mut storage, &id("A", "a3"));
    let mut left: Vec<String> = cache.sessions().iter().map(|s| crate::client_session_id(&s.id).to_string()).collect();
    left.sort();
    assert_eq!(left, ["a2", "a3", "b1", "b2"]);
    assert_eq!(cache.stats.sessions_capped, 1);
    // A busy session is not dropped: the cap is exceeded instead.
    let t: Vec<u32> = (0..BS as u32).collect();
    for s in ["a2", "a3"] {
        let got = cache.acquire(Some(&id("A", s)), &t, None, &mut alloc, &mut storage);
        alloc.free_all(&got.blocks);
    }
    let got = cache.acquire(Some(&id("A", "a4")), &t, None, &mut alloc, &mut storage);
    alloc.free_all(&got.blocks);
    assert_eq!(cache.sessions().len(), 5);
    // Every block comes back.
    for s in cache.sessions() {
        cache.delete(&s.id, &mut alloc);
    }
    cache.reset_prefix_cache(&mut alloc);
    assert_eq!(alloc.num_free(), 16);
}

/// vLLM's `cache_salt`: blocks registered under one salt are found by
/// that salt only, not by another or by an unsalted prompt.
#[test]
fn the_prefix_index_is_shared_only_within_a_salt() {
    let (mut cache, mut alloc, mut storage) = setup(8, 0);
    let tokens: Vec<u32> = (0..(3 * BS as u32)).collect();
    let a = Some(crate::salt_root("a"));
    let blocks = alloc.allocate(3).unwrap();
    let mut parent = a;
    for (j, &b) in blocks.iter().enumerate() {
        parent = Some(cache.register_block(parent, &tokens[j * BS..(j + 1) * BS], b, &mut alloc));
    }
    alloc.free_all(&blocks);
    for (root, hit) in [(a, 2 * BS), (None, 0), (Some(crate::salt_root("b")), 0)] {
        let got = cache.acquire(None, &tokens, root, &mut alloc, &mut storage);
        // At most the prompt less one token is reused: two whole blocks.
        assert_eq!(got.tokens, hit, "root {root:?}");
        alloc.free_all(&got.blocks);
    }
}

#[test]
fn blocks_of_a_running_request_are_never_evicted() {
    let (mut cache, mut alloc, mut storage) = setup(3, 8);
    let blocks = alloc.allocate(2).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    cache.acquire(Some("s"), &tokens, None, &mut alloc, &mut storage);
    cache.commit("s", &tokens, &blocks, &mut alloc);
    // The request still runs (holds its references): nothing can be freed.
    assert_eq!(cache.reclaim(3, &mut alloc, &storage), 0);
    assert_eq!(cache.evictable_blocks(&alloc), 0);
    alloc.free_all(&blocks);
    assert_eq!(cache.evictable_blocks(&alloc), 2);
    assert_eq!(cache.reclaim(3, &mut alloc, &storage), 2);
}

#[test]
fn without_a_host_tier_the_coldest_session_is_dropped() {
    let (mut cache, mut alloc, mut storage) = setup(2, 0);
    for (id, first) in [("old", 0u32), ("new", 100)] {
        let b = alloc.allocate(1).unwrap();
        let t: Vec<u32> = (first..first + 4).collect();
        cache.acquire(Some(id), &t, None, &mut alloc, &mut storage);
        cache.commit(id, &t, &b, &mut alloc);
        alloc.free_all(&b);
        std::thread::sleep(Duration::from_millis(2)); // distinct last-use times
    }
    cache.reset_prefix_cache(&mut alloc);
    assert_eq!(cache.reclaim(1, &mut alloc, &storage), 1);
    assert_eq!(cache.session_info("old").unwrap().tier, crate::Tier::None);
    assert_eq!(cache.session_info("new").unwrap().tier, crate::Tier::Device);
    assert!(cache.stats.evictions.keys().any(|(tier, _)| tier == "dropped"), "{:?}", cache.stats.evictions);
}

/// What admission may count on before acquiring: the device-resident
/// blocks acquire then hands over, no side effects (host blocks are not
/// counted: they need device blocks first); and a request that gives its
/// acquisition back leaves the session idle (evictable) and the counters
/// as they were.
#[test]
fn resident_blocks_predict_acquire_and_give_back_undoes_it() {
    let (mut cache, mut alloc, mut storage) = setup(8, 8);
    let blocks = alloc.allocate(3).unwrap();
    fill(&mut storage, &blocks, 1.0);
    let tokens: Vec<u32> = (0..12).collect();
    cache.acquire(Some("s"), &tokens, None, &mut alloc, &mut storage);
    // As the engine does: full blocks to the index as they are computed.
    let mut parent = None;
    for (i, &b) in blocks.iter().enumerate() {
        parent = Some(cache.register_block(parent, &tokens[i * BS..(i + 1) * BS], b, &mut alloc));
    }
    cache.commit("s", &tokens, &blocks, &mut alloc);
    alloc.free_all(&blocks);
    let mut next = tokens.clone();
    next.extend([50, 51, 52]);
    // 3 blocks, the session's (the index holds the same ones).
    assert_eq!(cache.resident_blocks(Some("s"), &next, None), 3);
    // Without the session: the prefix index's whole blocks.
    assert_eq!(cache.resident_blocks(None, &next, None), 3);
    // A different prompt shares nothing.
    assert_eq!(cache.resident_blocks(Some("s"), &[9; 15], None), 0);
    let before = cache.stats.clone();
    let got = cache.acquire(Some("s"), &next, None, &mut alloc, &mut storage);
    assert_eq!((got.tokens, got.blocks.len()), (12, 3));
    assert!(cache.session_info("s").unwrap().busy);
    // Given back: blocks freed by the caller, session idle, counters restored.
    alloc.free_all(&got.blocks);
    cache.give_back(Some("s"), got.source, got.tokens, next.len());
    assert!(!cache.session_info("s").unwrap().busy);
    assert_eq!(cache.stats, before);
    assert_eq!(cache.evictable_blocks(&alloc), 3, "an idle session's blocks are evictable");
    // Offloaded, the session's blocks no longer count as resident.
    cache.reset_prefix_cache(&mut alloc);
    assert_eq!(cache.reclaim(8, &mut alloc, &storage), 3);
    assert_eq!(cache.resident_blocks(Some("s"), &next, None), 0);
    assert_eq!(cache.session_info("s").unwrap().tier, crate::Tier::Host);
}

/// A request that needs the logits of its whole prompt (prompt logprobs)
/// reuses nothing, though the prefix index holds its blocks, and counts the
/// whole prompt as computed; with a limit of one block it reuses that one.
#[test]
fn acquire_at_most_reuses_no_more_than_its_limit() {
    let (mut cache, mut alloc, mut storage) = setup(8, 0);
    let tokens: Vec<u32> = (0..(3 * BS as u32)).collect();
    let blocks = alloc.allocate(3).unwrap();
    let mut parent = None;
    for (j, &b) in blocks.iter().enumerate() {
        parent = Some(cache.register_block(parent, &tokens[j * BS..(j + 1) * BS], b, &mut alloc));
    }
    alloc.free_all(&blocks);
    let computed = cache.stats.computed_tokens;
    let got = cache.acquire_at_most(None, &tokens, 0, None, &mut alloc, &mut storage);
    assert_eq!((got.tokens, got.blocks.len(), got.source), (0, 0, ReusePath::Cold));
    assert_eq!(cache.stats.computed_tokens - computed, tokens.len() as u64);
    let got = cache.acquire_at_most(None, &tokens, BS + 1, None, &mut alloc, &mut storage);
    assert_eq!((got.tokens, got.source), (BS, ReusePath::PrefixHit));
    alloc.free_all(&got.blocks);
    // Without a limit: the prompt less one token, two whole blocks.
    let got = cache.acquire(None, &tokens, None, &mut alloc, &mut storage);
    assert_eq!(got.tokens, 2 * BS);
    alloc.free_all(&got.blocks);
}
