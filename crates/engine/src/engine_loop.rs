//! The step loop: commands in (`crate::command`), scheduler plan, one
//! forward pass, sampling, detokenization, stop checks, events out. Runs on
//! its own thread.
//!
//! What only a disaggregated role needs sits beside the core: KV handoff
//! (reservations and leases, `handoff_commands.rs`) and the role's part
//! behind [`role_parts::RolePart`] (a prefill worker's snapshot store, a
//! decode worker's snapshot pushes), whose hooks the core calls at fixed
//! points: once a second, on a command, on reclaim, on reuse, at commit,
//! export and publish.

use std::collections::HashMap;
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kvc_kv_pool::{BlockAllocator, KvPool, KvStorage};
use kvc_model_qwen3::Qwen3Model;
use kvc_scheduler::{Scheduler, SchedulerConfig, SeqId};
use kvc_session_cache::{salt_root, CacheConfig, ReusePath, SessionAwareCache};
use tokio::sync::mpsc;

use crate::command::{Command, SubmitKv};
use crate::inbox::{tokens_to_compute, Inbox};
use crate::kv_handoff::SnapshotJob;
use kvc_text_front::constrained::ConstraintState;
use kvc_text_front::detokenizer::IncrementalDecoder;

mod active;
mod backlog_drain;
mod cache_hooks;
mod handoff_commands;
mod prefill_snapshots;
mod prompt_logprobs;
mod role_parts;
mod snapshot_pushes;
mod step;
mod step_kinds;
mod watchdog;

use active::Active;
use cache_hooks::CacheHooks;
use role_parts::{Ctx, RoleParts};
use snapshot_pushes::SnapshotPushes;
pub use watchdog::stall_reasons;
use watchdog::Watchdog;

use crate::sampler::Sampler;
use crate::step_model::{StepModel, WeightReads};
use crate::{EngineConfig, EngineError, EngineStats, FinishReason, GenerateRequest, Logprobs, MatchedStop, StreamEvent, Usage};
use handoff_commands::Handoff;
use kvc_text_front::stop::StopMatcher;
use kvc_text_front::tokenizer::TextTokenizer;

pub(crate) struct EngineLoop {
    model: Qwen3Model,
    storage: KvStorage,
    allocator: BlockAllocator,
    scheduler: Scheduler,
    cache: SessionAwareCache,
    last_expiry: Instant,
    tokenizer: Arc<TextTokenizer>,
    eos_token_ids: Vec<u32>,
    active: HashMap<SeqId, Active>,
    stats: Arc<ArcSwap<EngineStats>>,
    local: EngineStats,
    max_model_len: usize,
    /// Reservations and leases: KV moved by transfer.
    handoff: Handoff,
    /// The role's parts: a prefill worker's snapshot store, a decode
    /// worker's snapshot pushes; none on role `both`.
    parts: RoleParts,
    /// Submitted prompt tokens not yet in a published snapshot, and those
    /// of them drained from the channel since the last publish.
    inbox: Arc<Inbox>,
    drained_tokens: usize,
    /// The step-time model behind the budget (prefill beside decodes) and
    /// the prefill rates.
    step_model: StepModel,
    /// Mixed or decode-only, step by step (`--itl-target-ms`).
    step_kinds: step_kinds::StepKinds,
    /// Blocks under which free plus written-back blocks start write-back
    /// of idle sessions to the host tier (0: never).
    write_back_watermark: usize,
    /// How fast the prefill backlog drains (`--max-queue-delay-s`).
    backlog_drain: backlog_drain::BacklogDrain,
    /// Steps in which requests waited and nothing ran.
    watchdog: Watchdog,
    /// The last step could schedule nothing with requests waiting: the
    /// loop sleeps on its commands until something changes.
    stalled: bool,
}

impl EngineLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Qwen3Model,
        pool: KvPool,
        config: &EngineConfig,
        tokenizer: Arc<TextTokenizer>,
        eos_token_ids: Vec<u32>,
        stats: Arc<ArcSwap<EngineStats>>,
        commands: std_mpsc::Sender<Command>,
        snapshot_jobs: Option<mpsc::UnboundedSender<SnapshotJob>>,
        inbox: Arc<Inbox>,
    ) -> Result<Self, EngineError> {
        let block_size = pool.block_size();
        let capacity = pool.num_blocks() * block_size;
        let window = model.config().context_window();
        let mut max_model_len = window.min(capacity);
        if let Some(m) = config.max_model_len {
            if m > window {
                return Err(EngineError::Load(format!(
                    "--max-model-len {m} exceeds the model's context window {window} (max_position_embeddings {}, RoPE {})",
                    model.config().max_position_embeddings,
                    model.config().rope_scaling.name()
                )));
            }
            max_model_len = max_model_len.min(m);
        }
        if config.max_num_seqs == 0 || config.max_num_batched_tokens == 0 {
            return Err(EngineError::Load("--max-num-seqs and --max-num-batched-tokens must be at least 1".into()));
        }
        let mut sc = SchedulerConfig::new(config.max_num_seqs, config.max_num_batched_tokens, block_size, pool.num_blocks(), max_model_len);
        sc.max_num_partial_prefills = config.max_num_partial_prefills.max(1);
        sc.max_long_partial_prefills = config.max_long_partial_prefills.max(1);
        if let Some(t) = config.long_prefill_token_threshold {
            sc.long_prefill_token_threshold = t;
        }
        sc.growth_reserve_tokens = config.growth_reserve_tokens;
        sc.max_head_of_line_steps = config.max_head_of_line_steps;
        let scheduler = Scheduler::new(sc);
        let max_step = config.max_step_ms.filter(|ms| *ms > 0.0).map(|ms| Duration::from_secs_f64(ms / 1000.0));
        let weights =
            model.config().moe.as_ref().map_or(WeightReads::dense(), |m| WeightReads::routed(m.num_experts_per_tok, m.num_experts));
        let step_model = StepModel::new(max_step, weights);
        let KvPool { allocator, storage } = pool;
        let host_blocks = config.swap_space_bytes / storage.layout().bytes_per_block().max(1);
        let mut cache = SessionAwareCache::new(
            CacheConfig {
                block_size,
                enable_prefix_caching: config.enable_prefix_caching,
                host_blocks,
                session_ttl: Duration::from_secs(config.session_ttl_s),
                max_sessions_per_key: config.max_sessions_per_key,
            },
            allocator.num_blocks(),
        );
        // A GPU pool's host tier is pinned memory with copies on their own stream.
        if let Some(arena) = crate::device::host_arena(&storage, host_blocks)? {
            cache.set_host_arena(arena);
        }
        let parts = [
            prefill_snapshots::part(block_size, config.snapshot_store_blocks, allocator.num_blocks(), cache.host_tier()),
            SnapshotPushes::part(snapshot_jobs, config.snapshot_min_tokens),
        ];
        let mut parts = RoleParts::new(parts.into_iter().flatten().collect());
        let mut local = EngineStats {
            free_blocks: allocator.num_free(),
            total_blocks: allocator.num_blocks(),
            host_total_blocks: host_blocks,
            host_free_blocks: host_blocks,
            ..Default::default()
        };
        parts.publish(&mut local);
        stats.store(Arc::new(local.clone()));
        let write_back_watermark = (config.host_write_back_watermark.clamp(0.0, 1.0) * allocator.num_blocks() as f64) as usize;
        Ok(Self {
            model,
            storage,
            allocator,
            scheduler,
            cache,
            last_expiry: Instant::now(),
            tokenizer,
            eos_token_ids,
            active: HashMap::new(),
            stats,
            local,
            max_model_len,
            handoff: Handoff::new(commands),
            parts,
            inbox,
            drained_tokens: 0,
            step_model,
            step_kinds: step_kinds::StepKinds::new(config.itl_target_ms, config.itl_backlog_slack_s),
            write_back_watermark,
            backlog_drain: Default::default(),
            watchdog: Watchdog::default(),
            stalled: false,
        })
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn block_size(&self) -> usize {
        self.storage.layout().block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.allocator.num_blocks()
    }

    pub fn run(mut self, rx: std_mpsc::Receiver<Command>) {
        loop {
            // Block while idle or stalled (only a command, such as a
            // transfer's end, or the TTL can change what a step finds);
            // otherwise take what has arrived and step.
            if self.scheduler.is_idle() || self.stalled {
                match rx.recv_timeout(Duration::from_secs(1)) {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            break;
                        }
                    }
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            if self.last_expiry.elapsed() >= Duration::from_secs(1) {
                self.last_expiry = Instant::now();
                let expired = self.cache.expire(&mut self.allocator) + self.parts.expire(&mut self.allocator);
                if expired > 0 {
                    self.publish();
                }
            }
            let mut shutdown = false;
            while let Ok(cmd) = rx.try_recv() {
                if !self.handle(cmd) {
                    shutdown = true;
                    break;
                }
            }
            if shutdown {
                break;
            }
            if self.drained_tokens > 0 {
                // Show the new prompts before the step (which can take
                // seconds), then take them off the inbox: see inbox.rs.
                self.publish_backlog();
                self.inbox.remove(std::mem::take(&mut self.drained_tokens));
            }
            self.cancel_disconnected();
            let (started, before) = (Instant::now(), self.scheduler.pending_prefill_tokens());
            self.stalled = !self.scheduler.is_idle() && self.step() == step::Stepped::Stalled;
            let after = self.scheduler.pending_prefill_tokens();
            self.local.backlog_drain_tokens_per_s = self.backlog_drain.observe(started, Instant::now(), before, after);
            self.publish();
        }
        // Shutting down: everything still in flight is aborted.
        let ids: Vec<SeqId> = self.active.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Abort, None);
        }
        self.publish();
    }

    /// Returns false on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit { seq_id, req, tx, kv } => {
                self.drained_tokens += tokens_to_compute(&req, &kv);
                self.admit(seq_id, req, tx, kv);
                true
            }
            Command::SubmitGroup(group) => {
                for (seq_id, req, tx) in group {
                    self.drained_tokens += tokens_to_compute(&req, &SubmitKv::Compute);
                    self.admit(seq_id, req, tx, SubmitKv::Compute);
                }
                true
            }
            Command::Cancel(seq_id) => {
                if self.active.contains_key(&seq_id) {
                    self.finish(seq_id, FinishReason::Abort, None);
                }
                true
            }
            Command::DeleteSession(id, reply) => {
                let deleted = self.cache.delete(&id, &mut self.allocator);
                let snapshot = self.parts.delete_session(&id, &mut self.allocator);
                self.handoff.leases.revoke_sessions(|s| s == id);
                // Publish first: a caller that reads the stats once the
                // answer is in must see the session gone and its KV free.
                self.publish();
                let _ = reply.send(deleted || snapshot);
                true
            }
            cmd @ (Command::Reserve { .. }
            | Command::ReleaseReservation(_)
            | Command::ReleaseLease(_)
            | Command::SnapshotReserve { .. }
            | Command::SnapshotCommit { .. }
            | Command::SnapshotAbort(_)
            | Command::SnapshotPushed { .. }) => {
                self.handle_handoff(cmd);
                true
            }
            Command::ResetPrefixCache(reply) => {
                let free = self.allocator.num_free();
                let index_blocks = self.cache.reset_prefix_cache(&mut self.allocator);
                let answer = crate::PrefixCacheReset {
                    index_blocks,
                    freed_blocks: self.allocator.num_free() - free,
                    snapshot_blocks: self.parts.held_blocks(),
                };
                // Publish first, as for DeleteSession.
                self.publish();
                let _ = reply.send(answer);
                true
            }
            Command::Shutdown => false,
        }
    }

    /// Takes a submitted request into the scheduler.
    fn admit(&mut self, seq_id: u64, mut req: GenerateRequest, tx: mpsc::UnboundedSender<StreamEvent>, kv: SubmitKv) {
        let mut stop_token_ids = req.sampling.stop_token_ids.clone();
        if !req.sampling.ignore_eos {
            stop_token_ids.extend(self.eos_token_ids.iter().copied());
        }
        let export = matches!(kv, SubmitKv::Export);
        let constraint = req.grammar.take().map(ConstraintState::new);
        let max_new = req.sampling.max_tokens.min(self.max_model_len.saturating_sub(req.prompt_tokens.len()));
        let scoring = req.sampling.prompt_logprobs.map(prompt_logprobs::PromptScoring::new);
        let mut active = Active {
            tx,
            decoder: IncrementalDecoder::new(req.sampling.skip_special_tokens),
            stop: StopMatcher::new(req.sampling.stop.clone()),
            // Masked until min_tokens; one that still comes (a grammar that
            // allows nothing else) ends the request.
            sampler: Sampler::new(req.sampling, seq_id).with_stop_tokens(stop_token_ids.clone()),
            stop_token_ids,
            prompt_len: req.prompt_tokens.len(),
            // A prefill worker keeps no sessions: the id only names a snapshot.
            session_id: if export { None } else { req.session_id.clone() },
            turn_open: false,
            cached_tokens: 0,
            reuse_reason: ReusePath::Cold,
            cache_answer: None,
            restored_blocks: 0,
            restore_ticket: None,
            registered_blocks: 0,
            last_hash: req.cache_salt.as_deref().map(salt_root),
            cache_root: req.cache_salt.as_deref().map(salt_root),
            export,
            snapshot_session: if export { req.session_id.clone() } else { None },
            submitted: Instant::now(),
            admission_wait: Duration::ZERO,
            prefill_wait: Duration::ZERO,
            constraint,
            scoring,
        };
        tracing::debug!(request_id = %req.request_id, seq_id, prompt_tokens = active.prompt_len, "admitted");
        match kv {
            SubmitKv::Compute | SubmitKv::Export => {
                self.active.insert(seq_id, active);
                self.scheduler.add(seq_id, req.prompt_tokens);
                self.scheduler.set_max_new_tokens(seq_id, max_new);
            }
            SubmitKv::Reserved { id, computed, first } => {
                let Some(r) = self.handoff.reservations.remove(&id) else {
                    let _ = active.tx.send(StreamEvent::Error(format!("KV reservation {id} was released before use")));
                    return;
                };

                active.turn_open = r.session.is_some();
                active.cache_answer = Some((r.reason, r.held));
                active.cached_tokens = r.held;
                active.reuse_reason = r.reason;
                active.restored_blocks = r.restored;
                self.active.insert(seq_id, active);
                let computed = computed.clamp(r.held, req.prompt_tokens.len());
                self.scheduler.add_seeded(seq_id, req.prompt_tokens, r.blocks, computed, first.is_some());
                self.scheduler.set_max_new_tokens(seq_id, max_new);
                self.register_full_blocks(seq_id);
                if let Some((token, logprobs)) = first {
                    if let Some(a) = self.active.get_mut(&seq_id) {
                        a.sampler.observe(token);
                    }
                    self.scheduler.append_token(seq_id, token);
                    let at_limit = self.scheduler.get(seq_id).is_some_and(|s| s.at_token_limit());
                    self.on_token(seq_id, token, logprobs, at_limit);
                }
            }
        }
    }

    /// Offers a sequence's newly full blocks to the prefix index.
    fn register_full_blocks(&mut self, id: SeqId) {
        let (Some(seq), Some(a)) = (self.scheduler.get(id), self.active.get_mut(&id)) else {
            return;
        };
        let bs = self.storage.layout().block_size;
        let full = seq.num_computed / bs;
        for j in a.registered_blocks..full {
            a.last_hash =
                Some(self.cache.register_block(a.last_hash, &seq.tokens[j * bs..(j + 1) * bs], seq.block_table[j], &mut self.allocator));
        }
        a.registered_blocks = a.registered_blocks.max(full);
    }

    fn cancel_disconnected(&mut self) {
        let gone: Vec<SeqId> = self.active.iter().filter(|(_, a)| a.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            self.finish(id, FinishReason::Abort, None);
        }
    }

    /// Streams a token the scheduler appended and checks stop conditions;
    /// `at_limit`: the sequence generated all it may.
    fn on_token(&mut self, id: SeqId, token: u32, logprobs: Option<Logprobs>, at_limit: bool) {
        let Some(a) = self.active.get_mut(&id) else {
            return;
        };
        if let Some(c) = a.constraint.as_mut() {
            if let Err(e) = c.advance(token) {
                // A token chosen elsewhere (a prefill worker without the
                // grammar), or a grammar whose matcher hits one of its limits
                // on a token its own mask allowed (`(a{1000}){1000}`).
                tracing::warn!(event = "grammar_violation", seq_id = id, error = %e);
                self.local.grammar_errors += 1;
                let _ = a.tx.send(StreamEvent::InvalidGrammar(format!("structured output: {}", kvc_text_front::grammar::short_error(&e))));
                self.drop_seq(id);
                return;
            }
        }
        self.local.generated_tokens += 1;
        let generated = self.scheduler.get(id).expect("sequence exists").generated();

        if a.stop_token_ids.contains(&token) {
            // The stop token itself produces no text.
            let _ = a.tx.send(StreamEvent::Token { token_id: token, text: String::new(), logprobs });
            self.finish(id, FinishReason::Stop, Some(MatchedStop::TokenId(token)));
            return;
        }
        let delta = a.decoder.step(&self.tokenizer, generated);
        let outcome = a.stop_text(&delta, generated.len());
        let _ = a.tx.send(StreamEvent::Token { token_id: token, text: outcome.emit, logprobs });
        if let Some(s) = outcome.matched {
            self.finish(id, FinishReason::Stop, Some(MatchedStop::Text(s)));
        } else if at_limit {
            self.finish(id, FinishReason::Length, None);
        }
    }

    /// Sends the final event and frees the sequence's blocks.
    fn finish(&mut self, id: SeqId, reason: FinishReason, matched_stop: Option<MatchedStop>) {
        let completion_tokens = self.scheduler.get(id).map(|s| s.num_generated()).unwrap_or(0);
        self.close_turn(id, reason != FinishReason::Abort);
        let export = if reason != FinishReason::Abort { self.export_prompt(id) } else { None };
        if let Some(mut a) = self.active.remove(&id) {
            let text = match (&matched_stop, self.scheduler.get(id)) {
                (None, Some(seq)) => {
                    // Release a trailing partial character and held-back text.
                    let tail = a.decoder.flush(&self.tokenizer, seq.generated());
                    let o = a.stop_text(&tail, seq.generated().len());
                    if o.matched.is_some() {
                        o.emit
                    } else {
                        o.emit + &a.stop.flush()
                    }
                }
                _ => String::new(),
            };
            let usage = Usage {
                prompt_tokens: a.prompt_len,
                completion_tokens,
                cached_tokens: a.cached_tokens,
                reuse_reason: a.reuse_reason,
                restored_blocks: a.restored_blocks,
                admission_wait: a.admission_wait,
                prefill_wait: a.prefill_wait,
                ..Default::default()
            };
            let _ = a.tx.send(StreamEvent::Finished { reason, text, matched_stop, usage, export });
        }
        self.scheduler.remove(id, &mut self.allocator);
    }

    /// Commits a finished turn's KV to its session, or releases the
    /// session's busy mark without committing.
    fn close_turn(&mut self, id: SeqId, commit: bool) {
        let Some(a) = self.active.get_mut(&id) else {
            return;
        };
        let Some(session) = a.session_id.clone() else {
            return;
        };
        let was_open = std::mem::replace(&mut a.turn_open, false);
        match self.scheduler.get(id) {
            Some(seq) if commit && seq.num_computed > 0 => {
                if !was_open {
                    // Never admitted (finished while waiting): nothing to keep.
                    return;
                }
                let tokens = seq.tokens[..seq.num_computed].to_vec();
                let blocks = seq.block_table.clone();
                self.cache.commit(&session, &tokens, &blocks, &mut self.allocator);
                if self.with_parts(|parts, ctx| parts.committed(&session, &tokens, &blocks, ctx)) {
                    self.local.snapshot_pushes_enqueued += 1;
                }
            }
            _ if was_open => self.cache.abandon(&session),
            _ => {}
        }
    }

    /// Calls `f` with the role's parts and what their hooks may touch.
    fn with_parts<R>(&mut self, f: impl FnOnce(&mut RoleParts, Ctx<'_>) -> R) -> R {
        let ctx = Ctx { alloc: &mut self.allocator, cache: &mut self.cache, storage: &self.storage, leases: &mut self.handoff.leases };
        f(&mut self.parts, ctx)
    }

    fn drop_seq(&mut self, id: SeqId) {
        self.close_turn(id, false);
        self.active.remove(&id);
        self.scheduler.remove(id, &mut self.allocator);
    }

    /// Publishes the queue counts only (no cache or session walk): what
    /// the new submissions changed before a step. [`Self::publish`] ends
    /// with it.
    fn publish_backlog(&mut self) {
        self.local.running = self.scheduler.num_running();
        self.local.waiting = self.scheduler.num_waiting();
        self.local.pending_prefill_tokens = self.scheduler.pending_prefill_tokens();
        self.local.partial_prefills = self.scheduler.num_partial_prefills();
        self.local.oldest_waiting_since = self.scheduler.waiting().filter_map(|s| Some(self.active.get(&s.id)?.submitted)).min();
        if self.local.waiting == 0 {
            // Nothing waits (a stalled request may have been cancelled).
            self.watchdog.progressed(&mut self.local);
        }
        self.local.published_at = Some(Instant::now());
        self.stats.store(Arc::new(self.local.clone()));
    }

    /// Publishes an immutable snapshot; readers never touch the loop.
    fn publish(&mut self) {
        self.local.free_blocks = self.allocator.num_free();
        self.local.evictable_blocks = self.cache.evictable_blocks(&self.allocator);
        self.local.cached_blocks = self.cache.indexed_blocks();
        self.local.host_free_blocks = self.cache.host_free_blocks();
        self.local.host_bytes_moved = self.cache.host_bytes_moved();
        self.local.cache = self.cache.stats.clone();
        // Only what changed since the last publish: O(changes), not O(sessions).
        apply_changes(&mut self.local.sessions, self.cache.take_changed_sessions());
        if !self.handoff.leases.is_empty() {
            let sessions = &self.local.sessions;
            self.handoff.leases.revoke_sessions(|s| !sessions.contains_key(s));
        }
        self.parts.publish(&mut self.local);
        self.publish_backlog();
    }
}

/// Brings a published map up to date with the entries changed since the
/// last publish (None: removed).
pub(super) fn apply_changes<T: Clone>(map: &mut imbl::HashMap<String, T>, changes: Vec<(String, Option<T>)>) {
    for (id, info) in changes {
        match info {
            Some(info) => map.insert(id, info),
            None => map.remove(&id),
        };
    }
}
