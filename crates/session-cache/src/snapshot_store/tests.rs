use candle_core::DType;
use kvc_kv_pool::KvLayout;

use super::*;

const BS: usize = 4;
const LAYERS: usize = 2;

fn toks(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i * 7 + salt).collect()
}

/// A pool of `blocks` blocks in host memory (so its bytes can be read).
struct Pool {
    alloc: BlockAllocator,
    storage: KvStorage,
}

impl Pool {
    fn new(blocks: usize) -> Self {
        let layout = KvLayout { num_layers: LAYERS, num_kv_heads: 1, head_dim: 2, block_size: BS, dtype: DType::F32 };
        Self { alloc: BlockAllocator::new(blocks), storage: KvStorage::new(layout, blocks).unwrap() }
    }

    /// A push of `tokens` for `s`, the written blocks filled with bytes
    /// derived from `s` and each block's index in the session.
    fn push(&mut self, store: &mut SnapshotStore, s: &str, tokens: Vec<u32>) -> SnapshotReservation {
        let r = store.reserve(s, tokens, &mut self.alloc, &self.storage).unwrap();
        for (j, &b) in r.blocks.iter().enumerate() {
            for layer in 0..LAYERS {
                let bytes = pattern(s, r.from_block + j, layer, self.storage.layout().layer_block_bytes());
                self.storage.set_block_bytes(layer, b, &bytes).unwrap();
            }
        }
        store.commit(r.id, &mut self.alloc).unwrap();
        r
    }

    fn lookup(&mut self, store: &mut SnapshotStore, s: &str, prompt: &[u32]) -> Option<(Vec<BlockId>, usize)> {
        store.lookup(BypassAsk { session: s, prompt, min_tokens: 0 }, &mut self.alloc, &mut self.storage)
    }

    /// Asserts that `blocks` hold the bytes `push` wrote for `s`'s first blocks.
    fn assert_holds(&self, s: &str, blocks: &[BlockId]) {
        for (j, &b) in blocks.iter().enumerate() {
            for layer in 0..LAYERS {
                let want = pattern(s, j, layer, self.storage.layout().layer_block_bytes());
                assert_eq!(self.storage.block_bytes(layer, b), &want[..], "{s}: block {j}, layer {layer}");
            }
        }
    }

    /// Overwrites every free block (what other requests would do).
    fn scribble_free(&mut self) {
        let n = self.alloc.num_free();
        let blocks = self.alloc.allocate(n).unwrap();
        for &b in &blocks {
            for layer in 0..LAYERS {
                let junk = vec![0xAB; self.storage.layout().layer_block_bytes()];
                self.storage.set_block_bytes(layer, b, &junk).unwrap();
            }
        }
        self.alloc.free_all(&blocks);
    }
}

fn pattern(s: &str, block: usize, layer: usize, len: usize) -> Vec<u8> {
    let seed = s.bytes().fold(block as u32 * 131 + layer as u32 * 7, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
    (0..len as u32).map(|i| (seed.wrapping_add(i * 13) % 251) as u8).collect()
}

/// A pool of `blocks` blocks and a store of at most `capacity` of them (no
/// host tier).
fn pool_and_store(blocks: usize, capacity: usize) -> (Pool, SnapshotStore) {
    (Pool::new(blocks), SnapshotStore::new(BS, capacity))
}

fn store_with_host(capacity: usize, host: usize) -> SnapshotStore {
    let mut store = SnapshotStore::new(BS, capacity);
    store.set_host_tier(HostTier::new(host));
    store
}

#[test]
fn a_delta_push_sends_only_new_blocks_and_lookup_verifies_tokens() {
    let (mut p, mut store) = pool_and_store(64, 32);
    let t = toks(24, 1);
    let r1 = p.push(&mut store, "s", t[..8].to_vec());
    assert_eq!((r1.from_block, r1.blocks.len()), (0, 2));
    let r2 = store.reserve("s", t[..16].to_vec(), &mut p.alloc, &p.storage).unwrap();
    assert_eq!((r2.from_block, r2.blocks.len()), (2, 2), "only the two new blocks");
    assert_eq!(store.commit(r2.id, &mut p.alloc).unwrap(), 16);
    assert_eq!(store.used_blocks(), 4);
    // A prompt that diverges inside block 2 reuses blocks 0 and 1 only.
    let mut prompt = t.clone();
    prompt[9] = 999;
    let (blocks, n) = p.lookup(&mut store, "s", &prompt).unwrap();
    assert_eq!((blocks.len(), n), (2, 8));
    p.alloc.free_all(&blocks);
    // Exact-match session ids only.
    assert!(p.lookup(&mut store, "s2", &t).is_none());
    // The prompt's last token is always left to compute.
    let (b, n) = p.lookup(&mut store, "s", &t[..16]).unwrap();
    assert_eq!(n, 12);
    p.alloc.free_all(&b);
    // A caller that already holds as much gets nothing (and nothing is counted as reused).
    let hits = store.stats.bypass_hits;
    assert!(store.lookup(BypassAsk { session: "s", prompt: &t[..16], min_tokens: 13 }, &mut p.alloc, &mut p.storage).is_none());
    assert_eq!(store.stats.bypass_hits, hits);
}

#[test]
fn covered_is_what_lookup_serves_without_touching_the_store() {
    let (mut p, mut store) = pool_and_store(64, 32);
    let t = toks(24, 1);
    p.push(&mut store, "s", t[..16].to_vec());
    let mut diverged = t.clone();
    diverged[9] = 999;
    for prompt in [&t[..], &t[..16], &t[..3], &diverged[..], &toks(24, 2)[..]] {
        let (used, stats) = (store.used_blocks(), store.stats.clone());
        let covered = store.covered("s", prompt);
        assert_eq!((store.used_blocks(), &store.stats), (used, &stats), "a query only");
        let served = p.lookup(&mut store, "s", prompt).map(|(b, n)| {
            p.alloc.free_all(&b);
            n
        });
        assert_eq!(served.unwrap_or(0), covered, "{prompt:?}");
    }
    assert_eq!(store.covered("other", &t), 0);
    let misses = store.stats.bypass_misses;
    store.missed();
    assert_eq!(store.stats.bypass_misses, misses + 1);
}

#[test]
fn a_diverged_history_replaces_the_tail_and_frees_it() {
    let (mut p, mut store) = pool_and_store(64, 32);
    p.push(&mut store, "s", toks(16, 1));
    let mut t2 = toks(16, 1);
    t2[5] = 1000;
    let r = store.reserve("s", t2.clone(), &mut p.alloc, &p.storage).unwrap();
    assert_eq!(r.from_block, 1);
    store.commit(r.id, &mut p.alloc).unwrap();
    assert_eq!(store.used_blocks(), 4);
    assert_eq!(p.alloc.num_free(), 60, "old tail blocks returned");
    assert!(store.remove("s", &mut p.alloc));
    assert_eq!(p.alloc.num_free(), 64);
}

#[test]
fn bounded_in_blocks_with_lru_eviction() {
    let (mut p, mut store) = pool_and_store(64, 5);
    p.push(&mut store, "a", toks(8, 1));
    p.push(&mut store, "b", toks(8, 2));
    // Touch a: b becomes the least recently used.
    let (bl, _) = p.lookup(&mut store, "a", &toks(9, 1)).unwrap();
    p.alloc.free_all(&bl);
    p.push(&mut store, "c", toks(8, 3));
    let info = store.info();
    assert!(info.contains_key("a") && info.contains_key("c") && !info.contains_key("b"));
    assert_eq!(store.stats.evicted, 1);
    assert_eq!(store.stats.spills.get(&("drop".into(), "no_host_tier".into())), Some(&1));
    assert!(store.used_blocks() <= 5);
    // Larger than the store: refused, nothing lost.
    assert!(matches!(store.reserve("d", toks(28, 4), &mut p.alloc, &p.storage), Err(SnapshotError::NoRoom { .. })));
    assert_eq!(store.info().len(), 0, "everything was evicted trying");
    assert_eq!(p.alloc.num_free(), 64);
}

#[test]
fn abort_and_expiry_return_blocks_and_blocks_in_use_survive_eviction() {
    let (mut p, mut store) = pool_and_store(16, 8);
    let r = store.reserve("s", toks(8, 1), &mut p.alloc, &p.storage).unwrap();
    assert!(store.abort(r.id, &mut p.alloc));
    assert_eq!(p.alloc.num_free(), 16);
    store.reserve("s", toks(8, 1), &mut p.alloc, &p.storage).unwrap();
    assert_eq!(store.expire_pending(Duration::ZERO, &mut p.alloc), 1);
    assert_eq!((p.alloc.num_free(), store.used_blocks()), (16, 0));
    // A running bypass keeps its blocks when the entry is evicted.
    p.push(&mut store, "s", toks(8, 1));
    let (held, _) = p.lookup(&mut store, "s", &toks(9, 1)).unwrap();
    assert!(store.remove("s", &mut p.alloc));
    assert!(held.iter().all(|&b| p.alloc.refcount(b) == 1));
    p.alloc.free_all(&held);
    assert_eq!(p.alloc.num_free(), 16);
}

#[test]
fn local_ingest_keeps_the_longer_snapshot() {
    let (mut p, mut store) = pool_and_store(16, 8);
    let blocks = p.alloc.allocate(3).unwrap();
    store.ingest_local("s", &toks(10, 1), &blocks, &mut p.alloc, &p.storage);
    assert_eq!(store.tokens_of("s"), 8);
    p.alloc.free_all(&blocks);
    assert_eq!(p.alloc.num_free(), 14, "the store keeps two blocks");
    let r = store.reserve("s", toks(12, 1), &mut p.alloc, &p.storage).unwrap();
    assert_eq!((r.from_block, r.blocks.len()), (2, 1));
}

#[test]
fn reclaim_evicts_least_recently_used_entries_until_enough_is_free() {
    let (mut p, mut store) = pool_and_store(12, 12);
    p.push(&mut store, "old", toks(16, 1));
    p.push(&mut store, "new", toks(16, 2));
    assert_eq!(p.alloc.num_free(), 4);
    assert_eq!(store.reclaim(6, &mut p.alloc, &p.storage), 4, "one entry (the older) is enough");
    assert_eq!(store.tokens_of("old"), 0);
    assert_eq!(store.tokens_of("new"), 16);
    assert_eq!(store.reclaim(100, &mut p.alloc, &p.storage), 4, "then everything, and no more");
    assert_eq!((p.alloc.num_free(), store.used_blocks()), (12, 0));
}

/// Issue 20 item 3: a store of 4 device blocks keeps 4 sessions of 2
/// blocks each (2 on the device, 2 demoted), and a bypass of a demoted one
/// gets byte-identical KV back in fresh blocks.
#[test]
fn a_store_smaller_than_its_sessions_keeps_them_on_the_host_tier() {
    let mut p = Pool::new(16);
    let mut store = store_with_host(4, 16);
    let sessions = ["a", "b", "c", "d"];
    for (i, s) in sessions.iter().enumerate() {
        p.push(&mut store, s, toks(8, i as u32));
    }
    let info = store.info();
    assert_eq!(info.len(), 4, "every session is still listed (servable)");
    assert_eq!((store.used_blocks(), store.host_blocks()), (4, 4));
    assert_eq!(
        (info["a"].tier(), info["b"].tier(), info["c"].tier(), info["d"].tier()),
        (Tier::Host, Tier::Host, Tier::Device, Tier::Device)
    );
    assert_eq!((store.stats.demoted, store.stats.demoted_blocks, store.stats.evicted), (2, 4, 0));
    assert_eq!(store.stats.spills.get(&("demote".into(), "host_room".into())), Some(&2));
    // Other requests overwrite every free device block.
    p.scribble_free();
    // A bypass of "a" (demoted) copies its blocks back, bit for bit.
    let mut prompt = toks(8, 0);
    prompt.extend([1, 2, 3]);
    let (blocks, n) = p.lookup(&mut store, "a", &prompt).unwrap();
    assert_eq!((blocks.len(), n), (2, 8));
    p.assert_holds("a", &blocks);
    assert_eq!((store.stats.bypass_hits, store.stats.bypass_hits_host, store.stats.restored_blocks), (1, 1, 2));
    // Room for it was made by demoting the least recently used device entry ("c").
    let info = store.info();
    assert_eq!((info["a"].tier(), info["c"].tier(), info["d"].tier()), (Tier::Device, Tier::Host, Tier::Device));
    assert!(store.used_blocks() <= 4);
    // A device-resident entry is served without a copy.
    let (held_d, _) = p.lookup(&mut store, "d", &toks(9, 3)).unwrap();
    p.assert_holds("d", &held_d);
    assert_eq!((store.stats.bypass_hits, store.stats.bypass_hits_host), (2, 1));
    // Every block and host slot comes back.
    p.alloc.free_all(&blocks);
    p.alloc.free_all(&held_d);
    for s in sessions {
        assert!(store.remove(s, &mut p.alloc));
    }
    assert_eq!((p.alloc.num_free(), store.used_blocks(), store.host_blocks(), store.host.num_free()), (16, 0, 0, 16));
}

/// Least recently used first across both tiers: the device's LRU entry is
/// demoted; with the host tier full, the coldest host entry is dropped, and
/// a touched entry is the last to go.
#[test]
fn eviction_order_is_least_recently_used_across_tiers() {
    let mut p = Pool::new(16);
    let mut store = store_with_host(2, 2);
    let one_block = |salt| toks(BS, salt);
    for (i, s) in ["a", "b", "c", "d"].iter().enumerate() {
        p.push(&mut store, s, one_block(i as u32));
    }
    let tiers = |store: &SnapshotStore| {
        let mut v: Vec<(String, Tier)> = store.info().into_iter().map(|(s, i)| (s, i.tier())).collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let t = |s: &str, tier| (s.to_string(), tier);
    assert_eq!(tiers(&store), [t("a", Tier::Host), t("b", Tier::Host), t("c", Tier::Device), t("d", Tier::Device)]);
    // A bypass of "a": its block comes back; "b" (colder than "c") is
    // dropped for host room, then "c" is demoted.
    let mut prompt = one_block(0);
    prompt.push(9);
    let (held, _) = p.lookup(&mut store, "a", &prompt).unwrap();
    p.alloc.free_all(&held);
    assert_eq!(tiers(&store), [t("a", Tier::Device), t("c", Tier::Host), t("d", Tier::Device)]);
    assert_eq!(store.stats.spills.get(&("drop_host_entry".into(), "host_full".into())), Some(&1));
    // New pushes demote "d", then drop "c" (the coldest host entry) and demote "a".
    p.push(&mut store, "e", one_block(4));
    p.push(&mut store, "f", one_block(5));
    assert_eq!(tiers(&store), [t("a", Tier::Host), t("d", Tier::Host), t("e", Tier::Device), t("f", Tier::Device)]);
    assert_eq!(store.stats.evicted, 2, "b, then c");
    for s in ["a", "d", "e", "f"] {
        store.remove(s, &mut p.alloc);
    }
    assert_eq!((p.alloc.num_free(), store.host.num_free()), (16, 2));
}

/// Pool pressure demotes snapshots (they stay servable); a later push
/// extends a demoted entry, keeping its host prefix; a bypass restores it.
#[test]
fn pool_pressure_demotes_and_a_push_builds_on_the_host_prefix() {
    let mut p = Pool::new(8);
    let mut store = store_with_host(8, 8);
    let t = toks(16, 1);
    p.push(&mut store, "s", t[..8].to_vec());
    p.push(&mut store, "x", toks(8, 9));
    // The scheduler needs every block: both entries go to the host tier.
    assert_eq!(store.reclaim(8, &mut p.alloc, &p.storage), 4);
    assert_eq!((store.used_blocks(), store.host_blocks(), store.info().len()), (0, 4, 2));
    p.scribble_free();
    // The session's next push sends only its new blocks.
    let r = p.push(&mut store, "s", t.clone());
    assert_eq!((r.from_block, r.blocks.len()), (2, 2));
    let info = store.info()["s"];
    assert_eq!((info.tokens, info.blocks, info.host_blocks, info.tier()), (16, 4, 2, Tier::Mixed));
    let mut prompt = t.clone();
    prompt.push(7);
    let (blocks, n) = p.lookup(&mut store, "s", &prompt).unwrap();
    assert_eq!(n, 16);
    p.assert_holds("s", &blocks);
    assert_eq!(store.stats.restored_blocks, 2);
    p.alloc.free_all(&blocks);
    store.reclaim(8, &mut p.alloc, &p.storage);
    store.remove("s", &mut p.alloc);
    store.remove("x", &mut p.alloc);
    assert_eq!((p.alloc.num_free(), store.used_blocks(), store.host_blocks(), store.host.num_free()), (8, 0, 0, 8));
}

/// Without room in the pool for a demoted entry's blocks, a bypass serves
/// the part of the prefix it could restore, or misses.
#[test]
fn a_bypass_restores_only_what_the_pool_has_room_for() {
    let mut p = Pool::new(6);
    let mut store = store_with_host(6, 8);
    let t = toks(16, 1);
    p.push(&mut store, "s", t.clone());
    store.reclaim(6, &mut p.alloc, &p.storage);
    let running = p.alloc.allocate(4).unwrap();
    let mut prompt = t.clone();
    prompt.push(3);
    let (blocks, n) = p.lookup(&mut store, "s", &prompt).unwrap();
    assert_eq!((blocks.len(), n), (2, 8), "two free blocks: the first two of four");
    p.assert_holds("s", &blocks);
    assert_eq!(store.info()["s"].tier(), Tier::Mixed);
    p.alloc.free_all(&blocks);
    p.alloc.free_all(&running);
    // With the pool full again, the restored half is still served (it stays on the device).
    let all = p.alloc.allocate(p.alloc.num_free()).unwrap();
    let (blocks, n) = p.lookup(&mut store, "s", &prompt).unwrap();
    assert_eq!(n, 8);
    p.alloc.free_all(&blocks);
    store.remove("s", &mut p.alloc);
    p.alloc.free_all(&all);
    assert_eq!((p.alloc.num_free(), store.host.num_free()), (6, 8));
}

/// One host tier for the engine: slots the store holds are not the
/// cache's, and each side frees only its own.
#[test]
fn the_session_cache_and_the_store_share_one_host_tier() {
    let mut p = Pool::new(8);
    let cfg = crate::CacheConfig {
        block_size: BS,
        enable_prefix_caching: false,
        host_blocks: 4,
        session_ttl: Duration::from_secs(60),
        max_sessions_per_key: 0,
    };
    let cache = crate::SessionAwareCache::new(cfg, 8);
    let mut store = SnapshotStore::new(BS, 8);
    store.set_host_tier(cache.host_tier());
    p.push(&mut store, "s", toks(12, 1));
    store.reclaim(8, &mut p.alloc, &p.storage);
    assert_eq!((store.host_blocks(), cache.host_free_blocks(), cache.host_capacity()), (3, 1, 4));
    store.remove("s", &mut p.alloc);
    assert_eq!(cache.host_free_blocks(), 4);
}

/// A map kept by applying [`SnapshotStore::take_changed`] after every
/// operation equals [`SnapshotStore::info`]: pushes, replacements, local
/// ingests, demotion, restore, LRU eviction, removal.
#[test]
fn changed_entries_keep_a_mirror_equal_to_the_listing() {
    let mut p = Pool::new(64);
    let mut store = store_with_host(12, 6);
    let mut mirror: HashMap<String, SnapshotInfo> = HashMap::new();
    let mut check = |store: &mut SnapshotStore, what: &str| {
        crate::changes::apply(&mut mirror, store.take_changed());
        assert_eq!(mirror, store.info(), "after {what}");
    };
    for (i, s) in ["a", "b", "c", "a", "d"].iter().enumerate() {
        p.push(&mut store, s, toks(BS * (2 + i), i as u32));
        check(&mut store, "a push");
    }
    let blocks = p.alloc.allocate(3).unwrap();
    store.ingest_local("e", &toks(BS * 3, 9), &blocks, &mut p.alloc, &p.storage);
    p.alloc.free_all(&blocks);
    check(&mut store, "a local ingest");
    let mut prompt = toks(BS * 5, 3);
    prompt.push(1);
    if let Some((b, _)) = p.lookup(&mut store, "a", &prompt) {
        p.alloc.free_all(&b);
    }
    check(&mut store, "a bypass");
    store.reclaim(64, &mut p.alloc, &p.storage);
    check(&mut store, "reclaim");
    p.push(&mut store, "f", toks(BS * 2, 11));
    store.remove("f", &mut p.alloc);
    check(&mut store, "remove");
    assert!(store.take_changed().is_empty());
}
