//! One step of the loop: the scheduler's plan, one forward pass over its
//! chunks, the sampled tokens handed on, and the step-time model fed.

use std::time::{Duration, Instant};

use kvc_model_qwen3::{BatchInput, SeqChunk};
use std::collections::HashMap;

use kvc_scheduler::{ScheduledChunk, SeqId, StepBudget, Wait};
use rayon::prelude::*;

use super::prompt_logprobs::{reduce_rows, RowUse, StepLogits};
use super::{CacheHooks, EngineLoop};
use crate::sampler::Sampler;
use crate::step_model::StepShape;
use crate::{EngineError, FinishReason, Logprobs, StreamEvent};
use kvc_text_front::constrained::ConstraintState;
use llguidance::toktrie::SimpleVob;

/// Most blocks one write-back batch copies (at 16 tokens of Qwen3-30B-A3B,
/// 1.6 GB: ~30 ms of PCIe); the next batch waits for it.
const WRITE_BACK_BATCH: usize = 1024;

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stepped {
    /// Ran a forward pass (or failed one), or waited for restores.
    Ran,
    /// Requests wait and nothing could be scheduled ([`super::watchdog`]).
    Stalled,
}

impl EngineLoop {
    pub(super) fn step(&mut self) -> Stepped {
        let mut kv = CacheHooks {
            alloc: &mut self.allocator,
            cache: &mut self.cache,
            storage: &mut self.storage,
            active: &mut self.active,
            parts: &mut self.parts,
        };
        let (decodes_next, decode_context) = self.scheduler.decode_load();
        // The step's budget, built once from the step-budget decision: the
        // token cap and, when the decision gives one, the time budget.
        let decided = self.step_model.budget(decodes_next, decode_context);
        let reason = decided.err().unwrap_or(kvc_policy::step_budget::StepBudgetReason::Budgeted);
        kvc_policy::log_decision(&reason.decision());
        let step_budget = StepBudget::new(self.scheduler.config().max_num_batched_tokens, decided.ok());
        let budget = step_budget.time_budget();
        self.scheduler.set_step_budget(step_budget);
        // Prefill's rate beside these decodes; without a budget, the
        // measured rate of steps with a sizeable prefill.
        let rate = self.step_model.prefill_tokens_per_s(decodes_next, decode_context);
        let kind = self.step_kinds.decide(&self.scheduler, &self.step_model, rate);
        self.scheduler.set_decode_only(kind.kind == kvc_policy::step_kind::StepKind::DecodeOnly);
        self.local.step_kinds = self.step_kinds.counts();
        let mut plan = self.scheduler.schedule(&mut kv);
        self.local.preemptions += plan.preempted.len() as u64;
        self.local.step_budget = budget.map(|b| (b.alone_s, b.mixed_s));
        for id in std::mem::take(&mut plan.unfittable) {
            // Only reachable when generation outgrows the pool: the prompt
            // was checked against max_model_len, which is <= pool capacity.
            self.finish(id, FinishReason::Length, None);
        }
        self.local.passed_head = self.scheduler.stats().passed_head;
        if plan.chunks.is_empty() {
            // Nothing to compute but sequences waiting for their restores:
            // wait for the oldest batch here rather than spin.
            let ticket = plan.copying.iter().filter_map(|id| self.active.get(id)?.restore_ticket).min();
            if let Some(t) = ticket {
                self.cache.wait_copies(t);
                return Stepped::Ran;
            }
            if self.scheduler.num_waiting() == 0 && self.scheduler.num_running() == 0 {
                // Everything that was left finished (unfittable) in this step.
                return Stepped::Ran;
            }
            let pool = self.watchdog.warn_due().then(|| self.pool_state());
            self.watchdog.stalled(plan.admission_blocked, pool, &mut self.local);
            return Stepped::Stalled;
        }
        self.watchdog.progressed(&mut self.local);
        // A block freed while restores beside compute may still write it is
        // not handed to this step before they are done.
        self.cache.order_copies();
        // Copies of idle sessions' KV ahead of pressure, on the host tier's
        // copy stream beside this step's forward pass.
        self.cache.write_back(self.write_back_watermark, WRITE_BACK_BATCH, &self.allocator, &self.storage);
        let started = Instant::now();
        let shape = StepShape {
            decodes: plan.decode_chunks().count(),
            decode_context: plan.decode_context(),
            prefill: plan.prefill_chunks().map(|c| (c.start, c.len)).collect(),
        };
        // Grammar masks are computed while the model runs (vLLM and SGLang
        // overlap them with the forward pass the same way): they depend only
        // on the tokens accepted so far.
        let mut constrained = self.take_constraints(&plan.chunks);
        let (logits, masks) = std::thread::scope(|s| {
            let masks = (!constrained.is_empty()).then(|| s.spawn(|| compute_masks(&mut constrained)));
            let logits = self.forward(&plan.chunks);
            let waited = Instant::now();
            let masks = masks.map(|h| h.join().unwrap_or_else(|_| (HashMap::new(), Duration::ZERO)));
            (logits, masks.map(|m| (m, waited.elapsed())))
        });
        let masks = match masks {
            Some(((masks, compute), waited)) => {
                self.local.grammar_masks += masks.len() as u64;
                self.local.grammar_mask_seconds += compute.as_secs_f64();
                self.local.grammar_wait_seconds += waited.as_secs_f64();
                masks
            }
            None => HashMap::new(),
        };
        for (id, c) in constrained {
            if let Some(a) = self.active.get_mut(&id) {
                a.constraint = Some(c);
            }
        }
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing the batch");
                for c in &plan.chunks {
                    if let Some(a) = self.active.get(&c.seq_id) {
                        let _ = a.tx.send(StreamEvent::Error(format!("model error: {e}")));
                    }
                    self.drop_seq(c.seq_id);
                }
                return Stepped::Ran;
            }
        };
        self.local.steps += 1;
        let took = started.elapsed();
        tracing::debug!(
            event = "step",
            decodes = shape.decodes,
            prefill_chunks = shape.prefill.len(),
            prefill_tokens = shape.prefill.iter().map(|c| c.1).sum::<usize>(),
            decode_context = shape.decode_context,
            prefill_starts = shape.prefill.iter().map(|c| c.0).sum::<usize>(),
            predicted_ms = self.step_model.predict(&shape) * 1e3,
            took_ms = took.as_secs_f64() * 1e3,
            budget_ms = budget.map_or(0.0, |b| if shape.decodes > 0 { b.mixed_s } else { b.alone_s } * 1e3),
            budget = reason.as_str(),
        );
        self.step_model.observe(&shape, took);
        self.local.prefill_tokens_per_s = self.step_model.measured_tokens_per_s();
        self.step_kinds.observe(!shape.prefill.is_empty(), shape.decodes > 0, took.as_secs_f64());
        self.local.mixed_prefill_tokens_per_s = self.step_model.mixed_prefill_tokens_per_s(shape.decodes, shape.decode_context);
        for &(id, wait) in &plan.stalled {
            if let Some(a) = self.active.get_mut(&id) {
                match wait {
                    Wait::Admission => a.admission_wait += took,
                    Wait::Prefill => a.prefill_wait += took,
                }
            }
        }
        let st = self.scheduler.stats();
        self.local.preempted_tokens_recomputed = st.recomputed_tokens;
        self.local.admission_decisions = st.admissions.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        let StepLogits { sampled: logits, prompt } = logits;
        // Row i of `logits` is sampled[i]'s: both lists before anything ends.
        let sampled: Vec<SeqId> = plan.chunks.iter().filter(|c| self.samples(c)).map(|c| c.seq_id).collect();
        let scored_only: Vec<SeqId> = plan.chunks.iter().filter(|c| c.sample && !self.samples(c)).map(|c| c.seq_id).collect();
        let mut failed = Vec::new();
        let masks: HashMap<SeqId, SimpleVob> = masks
            .into_iter()
            .filter_map(|(id, m)| match m {
                Ok(m) => m.map(|m| (id, m)),
                Err(e) => {
                    failed.push((id, e));
                    None
                }
            })
            .collect();
        // Draw before the bookkeeping (a draw reads only its own
        // sequence's tokens), leaving out those whose grammar failed.
        let skip: Vec<SeqId> = failed.iter().map(|f| f.0).collect();
        let drawn = self.sample_all(&sampled, &logits, &masks, &skip);
        let tokens: Vec<(SeqId, u32)> = drawn.iter().map(|d| (d.0, d.1)).collect();
        let at_limit = self.scheduler.update(&plan, &tokens);
        for c in &plan.chunks {
            self.register_full_blocks(c.seq_id);
            let seq_prompt = self.scheduler.get(c.seq_id).map(|s| s.prompt_len).unwrap_or(0);
            self.local.prompt_tokens_computed += c.len.min(seq_prompt.saturating_sub(c.start)) as u64;
        }
        for (id, logprobs) in prompt {
            self.send_prompt_logprobs(id, logprobs);
        }
        // Prompts scored without generating (max_tokens 0) end here.
        for id in scored_only {
            self.finish(id, FinishReason::Length, None);
        }
        for (id, e) in failed {
            tracing::warn!(event = "grammar_error", seq_id = id, error = %e);
            self.local.grammar_errors += 1;
            if let Some(a) = self.active.get(&id) {
                let _ = a.tx.send(StreamEvent::InvalidGrammar(format!("structured output: {}", kvc_text_front::grammar::short_error(&e))));
            }
            self.drop_seq(id);
        }
        for (id, token, logprobs) in drawn {
            self.on_token(id, token, logprobs, at_limit.contains(&id));
        }
        Stepped::Ran
    }

    /// Sends a scoring sequence's new prompt logprobs (the next ones in
    /// prompt order) before any of its tokens.
    fn send_prompt_logprobs(&mut self, id: SeqId, logprobs: Vec<Logprobs>) {
        let Some(a) = self.active.get_mut(&id) else { return };
        if let Some(s) = a.scoring.as_mut() {
            s.next += logprobs.len();
        }
        let _ = a.tx.send(StreamEvent::PromptLogprobs(logprobs));
    }

    /// The pool as a stall warning reports it.
    fn pool_state(&self) -> super::watchdog::PoolState {
        let reserved: usize = self.handoff.reservations.values().map(|r| r.blocks.len()).sum();
        super::watchdog::PoolState {
            free: self.allocator.num_free(),
            evictable: self.cache.evictable_blocks(&self.allocator),
            total: self.allocator.num_blocks(),
            waiting: self.scheduler.num_waiting(),
            running: self.scheduler.num_running(),
            held_outside: reserved + self.handoff.leases.held_blocks() + self.parts.held_blocks(),
            oldest_wait: self.scheduler.waiting().filter_map(|s| Some(self.active.get(&s.id)?.submitted.elapsed())).max(),
        }
    }

    /// The grammar states of the sequences this step samples, taken out of
    /// their requests for the mask thread (put back after).
    fn take_constraints(&mut self, chunks: &[ScheduledChunk]) -> Vec<(SeqId, ConstraintState)> {
        chunks.iter().filter(|c| c.sample).filter_map(|c| Some((c.seq_id, self.active.get_mut(&c.seq_id)?.constraint.take()?))).collect()
    }

    /// Draws the next token of each of `ids` (logits row i for ids[i]) in
    /// parallel: a draw over a 152K vocabulary is ~0.5 ms, dozens of them
    /// a step. Returned in the order of `ids`.
    /// Those in `skip` draw nothing.
    fn sample_all(
        &mut self,
        ids: &[SeqId],
        logits: &[Vec<f32>],
        masks: &HashMap<SeqId, SimpleVob>,
        skip: &[SeqId],
    ) -> Vec<(SeqId, u32, Option<Logprobs>)> {
        let row: HashMap<SeqId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let scheduler = &self.scheduler;
        let mut jobs: Vec<(usize, SeqId, &mut Sampler, &[u32])> = self
            .active
            .iter_mut()
            .filter(|(id, _)| !skip.contains(id))
            .filter_map(|(&id, a)| Some((*row.get(&id)?, id, &mut a.sampler, scheduler.get(id)?.tokens.as_slice())))
            .collect();
        jobs.sort_by_key(|j| j.0);
        jobs.par_iter_mut()
            .map(|(i, id, sampler, context)| {
                let (token, logprobs) = sampler.sample_masked(&logits[*i], context, masks.get(&*id));
                (*id, token, logprobs)
            })
            .collect()
    }

    /// Whether chunk `c` draws a token: it ends its sequence's tokens, and
    /// the request generates (`max_tokens: 0` only scores its prompt).
    pub(super) fn samples(&self, c: &ScheduledChunk) -> bool {
        c.sample && self.active.get(&c.seq_id).is_none_or(|a| a.sampler.params().max_tokens > 0)
    }

    fn forward(&mut self, chunks: &[ScheduledChunk]) -> Result<StepLogits, EngineError> {
        let mut batch = BatchInput::default();
        let mut uses = Vec::new();
        for c in chunks {
            let seq = self.scheduler.get(c.seq_id).expect("scheduled sequence exists");
            let start = batch.tokens.len();
            batch.tokens.extend_from_slice(&seq.tokens[c.start..c.start + c.len]);
            batch.seqs.push(SeqChunk { start, len: c.len, context_len: c.start + c.len, block_table: &seq.block_table });
            if let Some(s) = self.active.get(&c.seq_id).and_then(|a| a.scoring.as_ref()) {
                for p in s.positions(c.start, c.len, seq.prompt_len) {
                    batch.logits_rows.push(start + p - c.start);
                    uses.push(RowUse::Score { seq: c.seq_id, target: seq.tokens[p + 1], top: s.top });
                }
            }
            if self.samples(c) {
                batch.logits_rows.push(start + c.len - 1);
                uses.push(RowUse::Sample);
            }
        }
        if uses.iter().any(|u| matches!(u, RowUse::Score { .. })) {
            // Prompt rows: the LM head a slice at a time (prompt_logprobs.rs).
            let hidden = self.model.forward_hidden(&batch, &mut self.storage).map_err(|e| EngineError::Model(e.to_string()))?;
            return reduce_rows(&self.model, &hidden, &uses);
        }
        let mid_prompt_only = batch.logits_rows.is_empty();
        if mid_prompt_only {
            // Run for the KV; the model still wants one row.
            batch.logits_rows.push(batch.tokens.len() - 1);
        }
        let logits = self.model.forward(&batch, &mut self.storage).map_err(|e| EngineError::Model(e.to_string()))?;
        if mid_prompt_only {
            // On a GPU the launch returns before the work is done. Wait for
            // it, so that the step's time (the measured prefill rate the
            // disaggregation cost model uses) is the work's: without this a
            // mid-prompt chunk of 8K tokens "took" a millisecond, and the
            // next step paid for it.
            logits.device().synchronize()?;
            return Ok(StepLogits::default());
        }
        Ok(StepLogits { sampled: logits.to_vec2::<f32>()?, prompt: Vec::new() })
    }
}

/// The next-token masks of the constrained sequences (in parallel), and
/// the wall time that took.
#[allow(clippy::type_complexity)]
fn compute_masks(states: &mut [(SeqId, ConstraintState)]) -> (HashMap<SeqId, Result<Option<SimpleVob>, String>>, Duration) {
    let started = Instant::now();
    let masks = states.par_iter_mut().map(|(id, c)| (*id, c.mask())).collect();
    (masks, started.elapsed())
}
