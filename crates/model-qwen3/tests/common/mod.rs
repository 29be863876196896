//! Helpers shared by this crate's test files: transformers' fixtures
//! (reference.rs on the CPU, gpu.rs on a GPU) and, with the `cuda`
//! feature, the GPU device (gpu.rs, gpu_attention.rs).
#![allow(dead_code)] // each test file uses its own part

use std::path::PathBuf;

use kvc_kv_pool::{BlockId, KvStorage};
use kvc_model_qwen3::{BatchInput, Qwen3Model, SeqChunk};

pub mod fp8_checkpoint;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
pub use gpu::gpu;

/// Every fixture recorded by scripts/make_reference_fixtures.py
/// (fixtures/README.md says what each covers).
pub const FIXTURES: &[&str] =
    &["dense", "dense-tied-hub", "dense-bf16", "moe-norm", "moe-nonorm-hub", "moe-mlp-only-sharded", "moe-sparse-step"];
/// Fixtures with scaled RoPE (yarn, linear, dynamic; an original window of
/// 12 positions, the cases running to 43, or exactly to 48 for dynamic).
#[allow(dead_code)]
pub const ROPE_FIXTURES: &[&str] = &["dense-yarn", "moe-yarn-hub", "dense-linear", "dense-dynamic"];
/// The block size the fixture tests page KV with.
pub const BLOCK_SIZE: usize = 4;

/// A fixture's directory: under `KVC_FIXTURES` when set (the GPU machine
/// gets them carried there), else this crate's tests/fixtures.
pub fn fixture_dir(name: &str) -> PathBuf {
    std::env::var_os("KVC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        .join(name)
}

/// One recorded prompt: its greedy continuation and the logits of each
/// position transformers computed.
pub struct Case {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn cases(name: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect::<Vec<_>>();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_tokens"]),
            logits: c["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
                .collect(),
        })
        .collect()
}

pub fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The largest |logit difference| of `got` (teacher-forced logits of
/// `fixture`'s cases, as [`teacher_forced`] makes them) from transformers'
/// logits in the fixture, after asserting that every position's greedy
/// token is transformers'.
pub fn against_transformers(got: &[Vec<f32>], fixture: &str) -> f32 {
    let want: Vec<(Vec<f32>, u32)> =
        cases(fixture).into_iter().flat_map(|c| c.logits.into_iter().zip(c.greedy).collect::<Vec<_>>()).collect();
    assert_eq!(got.len(), want.len(), "{fixture}: positions");
    let mut worst = 0f32;
    for (i, (g, (w, tok))) in got.iter().zip(&want).enumerate() {
        worst = worst.max(max_abs_diff(g, w));
        assert_eq!(argmax(g), *tok, "{fixture}, position {i}: greedy token differs from transformers'");
    }
    worst
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// A block table that is deliberately not in allocation order.
pub fn scattered_table(tokens: usize, num_blocks: usize) -> Vec<BlockId> {
    (0..tokens.div_ceil(BLOCK_SIZE)).map(|i| (num_blocks - 1 - 2 * i) as BlockId).collect()
}

/// The last position's logits of prompts `a` and `b`, each run alone and
/// then both in one batch, each time in a fresh pool of 64 blocks from
/// `new_kv`: `([alone a, alone b], [batched a, batched b])`.
pub fn alone_and_batched(model: &Qwen3Model, a: &[u32], b: &[u32], new_kv: impl Fn() -> KvStorage) -> ([Vec<f32>; 2], Vec<Vec<f32>>) {
    let ta: Vec<BlockId> = (0..a.len().div_ceil(BLOCK_SIZE) as u32).collect();
    let tb: Vec<BlockId> = (32..32 + b.len().div_ceil(BLOCK_SIZE) as u32).collect();
    let mut kv = new_kv();
    let alone_a = run_chunk(model, &mut kv, &ta, a, 0, a.len()).pop().unwrap();
    let alone_b = run_chunk(model, &mut kv, &tb, b, 0, b.len()).pop().unwrap();
    let mut kv = new_kv();
    let batch = BatchInput {
        tokens: a.iter().chain(b.iter()).copied().collect(),
        seqs: vec![
            SeqChunk { start: 0, len: a.len(), context_len: a.len(), block_table: &ta },
            SeqChunk { start: a.len(), len: b.len(), context_len: b.len(), block_table: &tb },
        ],
        logits_rows: vec![a.len() - 1, a.len() + b.len() - 1],
    };
    ([alone_a, alone_b], model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap())
}

/// Runs `tokens[from..to]` of a sequence as one chunk; returns the logits
/// of every token of the chunk.
pub fn run_chunk(model: &Qwen3Model, kv: &mut KvStorage, table: &[BlockId], tokens: &[u32], from: usize, to: usize) -> Vec<Vec<f32>> {
    let batch = BatchInput {
        tokens: tokens[from..to].to_vec(),
        seqs: vec![SeqChunk { start: 0, len: to - from, context_len: to, block_table: table }],
        logits_rows: (0..to - from).collect(),
    };
    model.forward(&batch, kv).unwrap().to_vec2::<f32>().unwrap()
}

/// Teacher-forced logits of every case of `fixture` (its prefill, then each
/// reference token in turn), over a fresh cache from `new_kv(blocks)` per
/// case.
pub fn teacher_forced(model: &Qwen3Model, fixture: &str, new_kv: impl Fn(usize) -> KvStorage) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for case in cases(fixture) {
        let n = case.prompt.len() + case.greedy.len();
        let nb = 2 * n.div_ceil(BLOCK_SIZE) + 1;
        let mut kv = new_kv(nb);
        let table = scattered_table(n, nb);
        let mut seq = case.prompt.clone();
        out.push(run_chunk(model, &mut kv, &table, &seq, 0, seq.len()).pop().unwrap());
        for &tok in &case.greedy[..case.greedy.len() - 1] {
            seq.push(tok);
            out.push(run_chunk(model, &mut kv, &table, &seq, seq.len() - 1, seq.len()).pop().unwrap());
        }
    }
    out
}
