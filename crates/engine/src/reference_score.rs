//! A reference for prompt logprobs, independent of the engine loop: the
//! model's plain forward pass over a whole sequence in one batch on a
//! fresh KV pool (no scheduler, no chunks, no cache, no slicing), every
//! row's logits at once, and log-softmax in f64 with candle's tensor ops
//! (not the sampler's `logprobs_of`). Tests and `kvc-score` check the
//! engine's scoring (chunked, sliced, beside cached KV) against it.

use candle_core::{DType, Device, Tensor, D};
use kvc_kv_pool::KvStorage;
use kvc_model_qwen3::{BatchInput, Qwen3Config, Qwen3Model, SeqChunk};

use crate::EngineError;
use kvc_model_loading::model_source::EMBEDDED_CONFIG;

const BLOCK: usize = 16;

fn model_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Model(e.to_string())
}

/// The embedded model as `EngineHandle::start` builds it on a CPU with
/// `EngineConfig { seed, .. }` (dummy weights from `seed`, f32).
pub fn embedded_model(seed: u64) -> Result<Qwen3Model, EngineError> {
    let config = Qwen3Config::from_json(EMBEDDED_CONFIG).map_err(model_err)?;
    Qwen3Model::dummy(config, seed, DType::F32, &Device::Cpu).map_err(model_err)
}

/// `log p(tokens[i] | tokens[..i])` for i in 1..len (entry i - 1), in f64.
pub fn reference_logprobs(model: &Qwen3Model, tokens: &[u32]) -> Result<Vec<f64>, EngineError> {
    Ok(reference_scores(model, tokens)?.into_iter().map(|(lp, _)| lp).collect())
}

/// [`reference_logprobs`], each with whether `tokens[i]` is the most likely
/// token there (lm-eval's `is_greedy`, token by token).
pub fn reference_scores(model: &Qwen3Model, tokens: &[u32]) -> Result<Vec<(f64, bool)>, EngineError> {
    reference_scores_over(model, tokens, model.kv_layout(BLOCK).dtype)
}

/// [`reference_scores`] with the K/V stored in `kv_dtype` on the way
/// (the pass reads them back as an engine over that cache does): the
/// reference for `--kv-cache-dtype`.
pub fn reference_scores_over(model: &Qwen3Model, tokens: &[u32], kv_dtype: DType) -> Result<Vec<(f64, bool)>, EngineError> {
    let n = tokens.len();
    if n < 2 {
        return Ok(Vec::new());
    }
    let blocks = n.div_ceil(BLOCK);
    let layout = kvc_kv_pool::KvLayout { dtype: kv_dtype, ..model.kv_layout(BLOCK) };
    let mut kv = KvStorage::new(layout, blocks).map_err(model_err)?;
    let table: Vec<_> = (0..blocks as u32).collect();
    let batch = BatchInput {
        tokens: tokens.to_vec(),
        seqs: vec![SeqChunk { start: 0, len: n, context_len: n, block_table: &table }],
        logits_rows: (0..n - 1).collect(),
    };
    let logits = model.forward(&batch, &mut kv).map_err(model_err)?.to_dtype(DType::F64)?;
    let max = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logprobs = shifted.broadcast_sub(&lse)?;
    let targets = Tensor::from_vec(tokens[1..].to_vec(), (n - 1, 1), &Device::Cpu)?;
    let chosen = logprobs.gather(&targets, D::Minus1)?.squeeze(D::Minus1)?.to_vec1::<f64>()?;
    let best = logprobs.max_keepdim(D::Minus1)?.squeeze(D::Minus1)?.to_vec1::<f64>()?;
    Ok(chosen.into_iter().zip(best).map(|(c, b)| (c, c >= b)).collect())
}
