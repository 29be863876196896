//! The step loop: commands in, scheduler plan, one forward pass, sampling,
//! detokenization, stop checks, events out. Runs on its own thread.

use std::collections::HashMap;
use std::sync::{mpsc as std_mpsc, Arc, RwLock};

use kvc_kv_pool::{BlockAllocator, KvPool, KvStorage};
use kvc_model_qwen3::{BatchInput, Qwen3Model, SeqChunk};
use kvc_scheduler::{ScheduledChunk, Scheduler, SchedulerConfig, SeqId};
use tokio::sync::mpsc;

use crate::detokenizer::IncrementalDecoder;
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use crate::tokenizer::TextTokenizer;
use crate::{
    EngineConfig, EngineError, EngineStats, FinishReason, GenerateRequest, MatchedStop, StreamEvent, Usage,
};

pub(crate) enum Command {
    Submit { seq_id: u64, req: GenerateRequest, tx: mpsc::UnboundedSender<StreamEvent> },
    Cancel(u64),
    Shutdown,
}

/// Per-request state the scheduler does not know about.
struct Active {
    tx: mpsc::UnboundedSender<StreamEvent>,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    stop_token_ids: Vec<u32>,
    prompt_len: usize,
    cached_tokens: usize,
}

pub(crate) struct EngineLoop {
    model: Qwen3Model,
    storage: KvStorage,
    allocator: BlockAllocator,
    scheduler: Scheduler,
    tokenizer: Arc<TextTokenizer>,
    eos_token_ids: Vec<u32>,
    active: HashMap<SeqId, Active>,
    stats: Arc<RwLock<EngineStats>>,
    local: EngineStats,
    max_model_len: usize,
}

impl EngineLoop {
    pub fn new(
        model: Qwen3Model,
        pool: KvPool,
        config: &EngineConfig,
        tokenizer: Arc<TextTokenizer>,
        eos_token_ids: Vec<u32>,
        stats: Arc<RwLock<EngineStats>>,
    ) -> Result<Self, EngineError> {
        let block_size = pool.block_size();
        let capacity = pool.num_blocks() * block_size;
        let mut max_model_len = model.config().max_position_embeddings.min(capacity);
        if let Some(m) = config.max_model_len {
            if m > model.config().max_position_embeddings {
                return Err(EngineError::Load(format!(
                    "--max-model-len {m} exceeds the model's max_position_embeddings {}",
                    model.config().max_position_embeddings
                )));
            }
            max_model_len = max_model_len.min(m);
        }
        if config.max_num_seqs == 0 || config.max_num_batched_tokens == 0 {
            return Err(EngineError::Load("--max-num-seqs and --max-num-batched-tokens must be at least 1".into()));
        }
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            block_size,
        });
        let KvPool { allocator, storage } = pool;
        let local = EngineStats { free_blocks: allocator.num_free(), total_blocks: allocator.num_blocks(), ..Default::default() };
        *stats.write().expect("stats lock") = local.clone();
        Ok(Self {
            model,
            storage,
            allocator,
            scheduler,
            tokenizer,
            eos_token_ids,
            active: HashMap::new(),
            stats,
            local,
            max_model_len,
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
            // Block while idle; otherwise take what has arrived and step.
            if self.scheduler.is_idle() {
                match rx.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            break;
                        }
                    }
                    Err(_) => break,
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
            self.cancel_disconnected();
            if !self.scheduler.is_idle() {
                self.step();
            }
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
            Command::Submit { seq_id, req, tx } => {
                let mut stop_token_ids = req.sampling.stop_token_ids.clone();
                if !req.sampling.ignore_eos {
                    stop_token_ids.extend(self.eos_token_ids.iter().copied());
                }
                let active = Active {
                    tx,
                    decoder: IncrementalDecoder::new(req.sampling.skip_special_tokens),
                    stop: StopMatcher::new(req.sampling.stop.clone()),
                    sampler: Sampler::new(req.sampling, seq_id),
                    stop_token_ids,
                    prompt_len: req.prompt_tokens.len(),
                    cached_tokens: 0,
                };
                tracing::debug!(request_id = %req.request_id, seq_id, prompt_tokens = active.prompt_len, "admitted");
                self.active.insert(seq_id, active);
                self.scheduler.add(seq_id, req.prompt_tokens);
                true
            }
            Command::Cancel(seq_id) => {
                if self.active.contains_key(&seq_id) {
                    self.finish(seq_id, FinishReason::Abort, None);
                }
                true
            }
            Command::Shutdown => false,
        }
    }

    fn cancel_disconnected(&mut self) {
        let gone: Vec<SeqId> = self.active.iter().filter(|(_, a)| a.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            self.finish(id, FinishReason::Abort, None);
        }
    }

    fn step(&mut self) {
        let plan = self.scheduler.schedule(&mut self.allocator);
        self.local.preemptions += plan.preempted.len() as u64;
        for id in plan.unfittable {
            // Only reachable when generation outgrows the pool: the prompt
            // was checked against max_model_len, which is <= pool capacity.
            self.finish(id, FinishReason::Length, None);
        }
        if plan.chunks.is_empty() {
            return;
        }
        let logits = match self.forward(&plan.chunks) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing the batch");
                for c in &plan.chunks {
                    if let Some(a) = self.active.get(&c.seq_id) {
                        let _ = a.tx.send(StreamEvent::Error(format!("model error: {e}")));
                    }
                    self.drop_seq(c.seq_id);
                }
                return;
            }
        };
        self.local.steps += 1;
        let mut row = 0;
        for c in &plan.chunks {
            self.scheduler.mark_computed(c.seq_id, c.len);
            let seq_prompt = self.scheduler.get(c.seq_id).map(|s| s.prompt_len).unwrap_or(0);
            self.local.prompt_tokens_computed += c.len.min(seq_prompt.saturating_sub(c.start)) as u64;
            if c.sample {
                self.on_token(c.seq_id, &logits[row]);
                row += 1;
            }
        }
    }

    fn forward(&mut self, chunks: &[ScheduledChunk]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut batch = BatchInput::default();
        for c in chunks {
            let seq = self.scheduler.get(c.seq_id).expect("scheduled sequence exists");
            let start = batch.tokens.len();
            batch.tokens.extend_from_slice(&seq.tokens[c.start..c.start + c.len]);
            batch.seqs.push(SeqChunk {
                start,
                len: c.len,
                context_len: c.start + c.len,
                block_table: &seq.block_table,
            });
            if c.sample {
                batch.logits_rows.push(start + c.len - 1);
            }
        }
        if batch.logits_rows.is_empty() {
            // Only mid-prompt chunks: run for the KV, ask for one row anyway.
            batch.logits_rows.push(batch.tokens.len() - 1);
            self.model.forward(&batch, &mut self.storage).map_err(|e| EngineError::Model(e.to_string()))?;
            return Ok(Vec::new());
        }
        let logits = self.model.forward(&batch, &mut self.storage).map_err(|e| EngineError::Model(e.to_string()))?;
        Ok(logits.to_vec2::<f32>()?)
    }

    /// Samples, streams and checks stop conditions for one sequence.
    fn on_token(&mut self, id: SeqId, logits: &[f32]) {
        let Some(seq) = self.scheduler.get(id) else { return };
        let Some(a) = self.active.get_mut(&id) else { return };
        let (token, logprobs) = a.sampler.sample(logits, &seq.tokens);
        self.scheduler.append_token(id, token);
        self.local.generated_tokens += 1;
        let seq = self.scheduler.get(id).expect("sequence exists");
        let generated = seq.generated();
        let total_len = seq.tokens.len();

        if a.stop_token_ids.contains(&token) {
            // The stop token itself produces no text.
            let _ = a.tx.send(StreamEvent::Token { token_id: token, text: String::new(), logprobs });
            self.finish(id, FinishReason::Stop, Some(MatchedStop::TokenId(token)));
            return;
        }
        let delta = a.decoder.step(&self.tokenizer, generated);
        let outcome = a.stop.push(&delta);
        let _ = a.tx.send(StreamEvent::Token { token_id: token, text: outcome.emit, logprobs });
        if let Some(s) = outcome.matched {
            self.finish(id, FinishReason::Stop, Some(MatchedStop::Text(s)));
        } else if generated.len() >= a.sampler.params().max_tokens || total_len >= self.max_model_len {
            self.finish(id, FinishReason::Length, None);
        }
    }

    /// Sends the final event and frees the sequence's blocks.
    fn finish(&mut self, id: SeqId, reason: FinishReason, matched_stop: Option<MatchedStop>) {
        let completion_tokens = self.scheduler.get(id).map(|s| s.num_generated()).unwrap_or(0);
        if let Some(mut a) = self.active.remove(&id) {
            let text = match (&matched_stop, self.scheduler.get(id)) {
                (None, Some(seq)) => {
                    // Release a trailing partial character and held-back text.
                    let tail = a.decoder.flush(&self.tokenizer, seq.generated());
                    let o = a.stop.push(&tail);
                    if o.matched.is_some() { o.emit } else { o.emit + &a.stop.flush() }
                }
                _ => String::new(),
            };
            let usage = Usage { prompt_tokens: a.prompt_len, completion_tokens, cached_tokens: a.cached_tokens };
            let _ = a.tx.send(StreamEvent::Finished { reason, text, matched_stop, usage });
        }
        self.scheduler.remove(id, &mut self.allocator);
    }

    fn drop_seq(&mut self, id: SeqId) {
        self.active.remove(&id);
        self.scheduler.remove(id, &mut self.allocator);
    }

    fn publish(&mut self) {
        self.local.free_blocks = self.allocator.num_free();
        self.local.running = self.scheduler.num_running();
        self.local.waiting = self.scheduler.num_waiting();
        if let Ok(mut s) = self.stats.write() {
            *s = self.local.clone();
        }
    }
}
