//! The cloneable front of the engine: submit, cancel, render, inspect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};

use arc_swap::ArcSwap;
use kvc_kv_pool::{KvLayout, MemoryRegion};

use tokio::sync::mpsc;

use crate::command::{Command, PrefixCacheReset, SnapshotSlot, SubmitKv};
use crate::engine_loop::EngineLoop;
use crate::inbox::{tokens_to_compute, Inbox};
use crate::kv_handoff::{ReleaseOnDrop, Reservation, SnapshotJob};
use crate::{EngineConfig, EngineError, EngineStats, GenerateRequest, Logprobs, StreamEvent};
use kvc_text_front::chat_template::ChatTemplate;
use kvc_text_front::tokenizer::TextTokenizer;

/// Static facts about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Name served by `/v1/models`.
    pub id: String,
    /// Longest prompt + completion accepted.
    pub max_model_len: usize,
    /// Size of the model's embedding table (valid token ids are below it).
    pub vocab_size: usize,
    /// Token ids that end generation unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// Unix seconds when the engine started.
    pub created: u64,
    /// `system_fingerprint`: this build, model and device (crate::fingerprint).
    pub fingerprint: String,
    /// What computes the KV: the weights' identity, not the build's or
    /// device's (crate::fingerprint::weights_identity); P/D peers compare it.
    pub weights: String,
    pub block_size: usize,
    pub num_kv_blocks: usize,
    pub max_num_seqs: usize,
    /// The KV pool's layout and memory (one region, host or GPU), for
    /// registration with a KV transport. The region lives as long as the
    /// engine.
    pub kv_layout: KvLayout,
    pub kv_region: Option<MemoryRegion>,
}

struct Inner {
    info: ModelInfo,
    tokenizer: Arc<TextTokenizer>,
    template: Option<ChatTemplate>,
    commands: std_mpsc::Sender<Command>,
    stats: Arc<ArcSwap<EngineStats>>,
    next_id: AtomicU64,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    snapshot_jobs: std::sync::Mutex<Option<mpsc::UnboundedReceiver<SnapshotJob>>>,
    /// Submitted prompt tokens the published snapshot does not count yet.
    inbox: Arc<Inbox>,
    /// Structured outputs' grammar compiler (its token trie is built on a
    /// background thread at start, or by the first request that needs it).
    grammar: std::sync::OnceLock<Result<crate::GrammarCompiler, String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// Cheap to clone; the engine stops when the last clone is dropped.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

/// Receiving end of a request. Dropping it cancels the request.
pub struct RequestStream {
    pub(crate) rx: mpsc::UnboundedReceiver<StreamEvent>,
    pub(crate) cancel: CancelGuard,
}

impl RequestStream {
    /// Next event, or `None` after the final event.
    pub async fn recv(&mut self) -> Option<StreamEvent> {
        self.rx.recv().await
    }

    /// Blocking variant for tests and non-async callers.
    pub fn blocking_recv(&mut self) -> Option<StreamEvent> {
        self.rx.blocking_recv()
    }

    /// The next event if one has arrived; never waits.
    pub fn try_recv(&mut self) -> Option<StreamEvent> {
        self.rx.try_recv().ok()
    }

    /// The engine's id of this request.
    pub fn id(&self) -> u64 {
        self.cancel.seq_id
    }
}

/// Sends a cancel for its request when dropped (a no-op for finished ones).
pub struct CancelGuard {
    pub(crate) seq_id: u64,
    commands: std_mpsc::Sender<Command>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel(self.seq_id));
    }
}

impl EngineHandle {
    /// Loads model and tokenizer, allocates the KV pool, starts the loop.
    pub fn start(config: EngineConfig) -> Result<Self, EngineError> {
        let loaded = crate::loaded::load(&config)?;
        let stats = Arc::new(ArcSwap::from_pointee(EngineStats::default()));
        let (tx, rx) = std_mpsc::channel();
        let tokenizer = Arc::new(loaded.tokenizer);
        let template = loaded.template;
        let kv_layout = *loaded.pool.layout();
        let kv_region = crate::device::kv_region(&loaded.pool.storage);
        let (jobs_tx, jobs_rx) = if config.snapshot_min_tokens > 0 {
            let (t, r) = mpsc::unbounded_channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        let inbox = Arc::new(Inbox::default());
        let engine_loop = EngineLoop::new(
            loaded.model,
            loaded.pool,
            &config,
            tokenizer.clone(),
            loaded.eos_token_ids.clone(),
            stats.clone(),
            tx.clone(),
            jobs_tx,
            inbox.clone(),
        )?;
        let info = ModelInfo {
            id: loaded.served_name,
            max_model_len: engine_loop.max_model_len(),
            vocab_size: loaded.vocab_size,
            eos_token_ids: loaded.eos_token_ids,
            created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            fingerprint: loaded.identity.fingerprint,
            weights: loaded.identity.weights,
            block_size: engine_loop.block_size(),
            num_kv_blocks: engine_loop.num_blocks(),
            max_num_seqs: config.max_num_seqs,
            kv_layout,
            kv_region,
        };
        let thread = std::thread::Builder::new()
            .name("kvc-engine".into())
            .spawn(move || engine_loop.run(rx))
            .map_err(|e| EngineError::Load(format!("cannot start engine thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                info,
                tokenizer,
                template,
                commands: tx,
                stats,
                next_id: AtomicU64::new(1),
                thread: std::sync::Mutex::new(Some(thread)),
                snapshot_jobs: std::sync::Mutex::new(jobs_rx),
                grammar: std::sync::OnceLock::new(),
                inbox,
            }),
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.inner.tokenizer
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// False once the step loop has exited (shutdown or a panic).
    pub fn is_alive(&self) -> bool {
        self.inner.thread.lock().map(|t| t.as_ref().is_some_and(|t| !t.is_finished())).unwrap_or(false)
    }

    pub fn stats(&self) -> EngineStats {
        (*self.snapshot()).clone()
    }

    /// The latest published snapshot (a pointer load; never blocks the loop).
    pub fn snapshot(&self) -> Arc<EngineStats> {
        self.inner.stats.load_full()
    }

    /// Prompt tokens submitted and not yet computed: the latest snapshot's
    /// backlog plus what was submitted since (see [`crate::inbox`]). What
    /// placement decisions (the P/D cost model, `/internal/state`) use.
    pub fn pending_prefill_tokens(&self) -> usize {
        // The inbox first: the loop publishes before it takes tokens off.
        let queued = self.inner.inbox.get();
        queued + self.snapshot().pending_prefill_tokens
    }

    /// The admission probe, answered from the latest snapshot.
    pub fn admission(&self, q: &crate::AdmissionQuery) -> crate::AdmissionDecision {
        let i = &self.inner.info;
        crate::decide_admission(&self.snapshot(), q, i.block_size, i.max_model_len, i.max_num_seqs)
    }

    /// Deletes a session and frees its KV; false if it did not exist.
    pub async fn delete_session(&self, id: &str) -> Result<bool, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.commands.send(Command::DeleteSession(id.to_string(), tx)).map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)
    }

    /// Drops the prefix index; says what that freed.
    pub async fn reset_prefix_cache(&self) -> Result<PrefixCacheReset, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.commands.send(Command::ResetPrefixCache(tx)).map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)
    }

    /// Checks the request against the model (token range, context length)
    /// and hands it to the step loop.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.submit_kv(req, SubmitKv::Compute)
    }

    /// Submits several requests that enter the scheduler together (the `n`
    /// choices of a prompt), so that which steps they share does not depend
    /// on thread timing and a seeded request reproduces. Nothing is
    /// submitted when any of them is invalid.
    pub fn submit_group(&self, reqs: Vec<GenerateRequest>) -> Result<Vec<RequestStream>, EngineError> {
        let mut reqs = reqs;
        for req in &mut reqs {
            self.check_request(req)?;
        }
        let mut group = Vec::with_capacity(reqs.len());
        let mut streams = Vec::with_capacity(reqs.len());
        let tokens = reqs.iter().map(|r| tokens_to_compute(r, &SubmitKv::Compute)).sum();
        for req in reqs {
            let (seq_id, tx, stream) = self.open_stream();
            group.push((seq_id, req, tx));
            streams.push(stream);
        }
        self.send_submission(Command::SubmitGroup(group), tokens)?;
        Ok(streams)
    }

    /// Prefill worker: runs the request (normally `max_tokens: 1`), reusing
    /// the snapshot of `req.session_id` when it covers a prefix, and hands
    /// the prompt's blocks back in `Finished.export` for transfer.
    pub fn submit_export(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.submit_kv(req, SubmitKv::Export)
    }

    /// Decode worker: runs the request from a reservation whose first
    /// `computed` prompt tokens have KV (`held_tokens` when computing here,
    /// the whole prompt after a remote prefill, which also gives the first
    /// token and its logprobs).
    pub fn submit_reserved(
        &self,
        req: GenerateRequest,
        mut reservation: Reservation,
        computed: usize,
        first: Option<(u32, Option<Logprobs>)>,
    ) -> Result<RequestStream, EngineError> {
        if req.sampling.prompt_logprobs.is_some() {
            // Reserved KV (held here or computed elsewhere) has no logits.
            return Err(EngineError::InvalidParam {
                param: "prompt_logprobs".into(),
                message: "prompt logprobs need the whole prompt computed by this engine, not a reservation".into(),
            });
        }
        let kv = SubmitKv::Reserved { id: reservation.id, computed, first };
        let stream = self.submit_kv(req, kv)?;
        // The loop owns the reservation now.
        reservation.release.disarm();
        Ok(stream)
    }

    /// Reserves blocks for `prompt` (decode worker): the ones the caches
    /// hold for it and fresh ones for the rest (evicting cached KV if
    /// needed). Dropping the reservation unsubmitted gives them back.
    /// `cache_salt` as the request's ([`GenerateRequest::cache_salt`]).
    pub async fn reserve(&self, session_id: Option<&str>, cache_salt: Option<&str>, prompt: &[u32]) -> Result<Reservation, EngineError> {
        self.check_prompt(prompt, 1)?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::Reserve {
            id,
            session: session_id.map(str::to_string),
            cache_salt: cache_salt.map(str::to_string),
            prompt: prompt.to_vec(),
            reply: tx,
        };
        self.inner.commands.send(cmd).map_err(|_| EngineError::ShuttingDown)?;
        // Armed before the answer: a reservation the caller never sees
        // (dropped future) is released too.
        let release = ReleaseOnDrop::new(self.inner.commands.clone(), Command::ReleaseReservation(id));
        let r = rx.await.map_err(|_| EngineError::ShuttingDown)??;
        Ok(Reservation {
            id,
            held_tokens: r.held_tokens,
            reuse_reason: r.reuse_reason,
            restored_blocks: r.restored_blocks,
            blocks: r.blocks,
            release,
        })
    }

    /// Decode worker: the receiver of snapshot jobs (once; None after, or
    /// when `snapshot_min_tokens` is 0).
    pub fn take_snapshot_jobs(&self) -> Option<mpsc::UnboundedReceiver<SnapshotJob>> {
        self.inner.snapshot_jobs.lock().ok()?.take()
    }

    /// Decode worker: a snapshot push of `session` ended.
    pub fn snapshot_pushed(&self, session: &str, ok: bool) {
        let _ = self.inner.commands.send(Command::SnapshotPushed { session: session.to_string(), ok });
    }

    /// Prefill worker: sets snapshot-store blocks aside for a push of
    /// `tokens` (whole blocks) of `session`.
    pub async fn snapshot_reserve(&self, session: &str, tokens: Vec<u32>) -> Result<SnapshotSlot, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::SnapshotReserve { session: session.to_string(), tokens, reply: tx };
        self.inner.commands.send(cmd).map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Prefill worker: the push into `reservation` was written; returns the
    /// tokens the session's snapshot covers now.
    pub async fn snapshot_commit(&self, reservation: u64) -> Result<usize, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.commands.send(Command::SnapshotCommit { reservation, reply: tx }).map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Prefill worker: gives a push's blocks back.
    pub fn snapshot_abort(&self, reservation: u64) {
        let _ = self.inner.commands.send(Command::SnapshotAbort(reservation));
    }

    fn check_prompt(&self, prompt: &[u32], max_tokens: usize) -> Result<(), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.inner.info.vocab_size;
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { token: t, vocab_size: vocab });
        }
        let max = self.inner.info.max_model_len;
        let requested = prompt.len().saturating_add(max_tokens);
        if prompt.len() >= max || requested > max {
            return Err(EngineError::PromptTooLong { prompt_tokens: prompt.len(), max_tokens, requested, max_model_len: max });
        }
        Ok(())
    }

    /// The grammar compiler (built on first use).
    pub fn grammar_compiler(&self) -> Result<&crate::GrammarCompiler, EngineError> {
        let inner = &self.inner;
        let built = inner
            .grammar
            .get_or_init(|| crate::GrammarCompiler::new(inner.tokenizer.clone(), &inner.info.eos_token_ids).map_err(|e| e.to_string()));
        built.as_ref().map_err(|e| EngineError::Load(e.clone()))
    }

    /// Compiles a structured-output constraint (a client error when the
    /// grammar compiler rejects it). Milliseconds for a typical schema: call
    /// it off the async runtime; submission compiles what is not compiled.
    pub fn compile_grammar(&self, c: &crate::Constraint) -> Result<crate::CompiledGrammar, EngineError> {
        Ok(self.grammar_compiler()?.compile(c)?)
    }

    /// Builds the grammar compiler on a thread of its own (the first
    /// structured request then finds it ready).
    pub fn warm_grammar_compiler(&self) {
        let weak = Arc::downgrade(&self.inner);
        let _ = std::thread::Builder::new().name("kvc-grammar-init".into()).spawn(move || {
            if let Some(inner) = weak.upgrade() {
                let handle = EngineHandle { inner };
                if let Err(e) = handle.grammar_compiler() {
                    tracing::warn!(error = %e, "grammar compiler unavailable: structured outputs will be refused");
                }
            }
        });
    }

    fn submit_kv(&self, mut req: GenerateRequest, kv: SubmitKv) -> Result<RequestStream, EngineError> {
        self.check_request(&mut req)?;
        let (seq_id, tx, stream) = self.open_stream();
        let tokens = tokens_to_compute(&req, &kv);
        self.send_submission(Command::Submit { seq_id, req, tx, kv }, tokens)?;
        Ok(stream)
    }

    /// Sends a submission, its prompt tokens counted in the inbox first.
    fn send_submission(&self, cmd: Command, tokens: usize) -> Result<(), EngineError> {
        self.inner.inbox.add(tokens);
        self.inner.commands.send(cmd).map_err(|_| {
            self.inner.inbox.remove(tokens);
            EngineError::ShuttingDown
        })
    }

    /// What every submission checks before anything reaches the loop.
    /// Compiles the request's grammar when the caller did not.
    fn check_request(&self, req: &mut GenerateRequest) -> Result<(), EngineError> {
        req.sampling.validate()?;
        self.check_prompt(&req.prompt_tokens, req.sampling.max_tokens)?;
        if let (Some(c), None) = (&req.sampling.constraint, &req.grammar) {
            req.grammar = Some(self.compile_grammar(c)?);
        }
        Ok(())
    }

    /// A fresh sequence id, the sender the loop streams its events to, and
    /// the caller's end (which cancels the sequence when dropped).
    fn open_stream(&self) -> (u64, mpsc::UnboundedSender<StreamEvent>, RequestStream) {
        let seq_id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        (seq_id, tx, RequestStream { rx, cancel: CancelGuard { seq_id, commands: self.inner.commands.clone() } })
    }
}
