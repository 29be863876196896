//! `--kv-cache-dtype` on the embedded model (CPU). An FP8 cache holds a
//! block in a quarter of f32's bytes and half of bf16's, so the same memory
//! keeps that many more sessions' tokens. A prompt scored through the
//! engine over an FP8 cache (chunked prefill, K/V read back from e4m3)
//! equals the plain one-pass reference over the same quantize-dequantize
//! (`kvc_engine::reference_score`, log-softmax in f64), and stays within a
//! stated tolerance of the full-precision one. That the cache returns
//! exactly e4m3's quantize-dequantize of what was written (against a
//! hand-written e4m3) is kv-pool's test; that sessions under pressure
//! (host tier, recomputation) give the same tokens with an FP8 cache is
//! sessions.rs's.

mod common;

use candle_core::DType;
use common::{finished, greedy, tokens};
use kvc_engine::reference_score::{embedded_model, reference_scores_over};
use kvc_engine::{EngineConfig, EngineHandle, GenerateRequest, KvCacheDtype, SamplingParams};

fn engine(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    common::engine(|c| {
        c.block_size = 16;
        f(c)
    })
}

#[test]
fn an_fp8_cache_holds_four_times_f32s_blocks_and_twice_bf16s_in_the_same_memory() {
    let blocks = |kv| {
        let e = engine(|c| (c.num_kv_blocks, c.kv_cache_memory_bytes, c.kv_cache_dtype) = (None, 8 << 20, kv));
        let info = e.info();
        (info.num_kv_blocks, info.kv_layout.dtype, info.kv_layout.bytes_per_block())
    };
    let (auto, auto_dtype, auto_bytes) = blocks(KvCacheDtype::Auto);
    let (bf16, bf16_dtype, bf16_bytes) = blocks(KvCacheDtype::Bf16);
    let (fp8, fp8_dtype, fp8_bytes) = blocks(KvCacheDtype::Fp8E4m3);
    assert_eq!((auto_dtype, bf16_dtype, fp8_dtype), (DType::F32, DType::BF16, DType::F8E4M3));
    assert_eq!((auto_bytes, bf16_bytes), (4 * fp8_bytes, 2 * fp8_bytes));
    // Whole blocks of the same budget: within a block or so of the exact ratio.
    assert!(fp8 >= 4 * auto && fp8 <= 4 * auto + 3, "fp8 {fp8} blocks vs f32 {auto}");
    assert!(fp8 >= 2 * bf16 && fp8 <= 2 * bf16 + 1, "fp8 {fp8} blocks vs bf16 {bf16}");
}

/// The engine over a cache against the one-pass reference over the same
/// cache dtype (f32 arithmetic in both; prompt_logprobs.rs's 1e-3).
const SAME_CACHE_TOL: f64 = 1e-3;
/// The FP8 cache against full precision: e4m3 keeps 3 mantissa bits (up to
/// 1/16 relative per K/V element). Measured on the embedded model: worst
/// 0.26, mean 0.030 over 628 prompt tokens.
const FP8_TOL: f64 = 0.5;
const FP8_MEAN_TOL: f64 = 0.06;

#[test]
fn a_prompt_scored_over_an_fp8_cache_equals_the_reference_over_the_same_quantization() {
    let model = embedded_model(0).unwrap();
    let (mut worst_same, mut worst_full, mut sum_full, mut n) = (0f64, 0f64, 0f64, 0usize);
    for (kv, dtype, chunk) in
        [(KvCacheDtype::Fp8E4m3, DType::F8E4M3, 2048), (KvCacheDtype::Fp8E4m3, DType::F8E4M3, 16), (KvCacheDtype::Bf16, DType::BF16, 16)]
    {
        let e = engine(|c| (c.kv_cache_dtype, c.max_num_batched_tokens) = (kv, chunk));
        for seed in 0..4u32 {
            let prompt = tokens(40 + seed, 60 + 13 * seed as usize);
            let same = reference_scores_over(&model, &prompt, dtype).unwrap();
            let full = reference_scores_over(&model, &prompt, DType::F32).unwrap();
            let mut s = e
                .submit(GenerateRequest {
                    request_id: format!("{seed}"),
                    prompt_tokens: prompt.clone(),
                    sampling: SamplingParams { prompt_logprobs: Some(1), ..greedy(1) },
                    ..Default::default()
                })
                .unwrap();
            let d = finished(&mut s);
            assert_eq!(d.prompt_logprobs.len(), prompt.len() - 1);
            for (i, lp) in d.prompt_logprobs.iter().enumerate() {
                let got = f64::from(lp.chosen.logprob);
                let (to_same, to_full) = ((got - same[i].0).abs(), (got - full[i].0).abs());
                assert!(
                    to_same < SAME_CACHE_TOL,
                    "{kv:?}, chunks of {chunk}: prompt token {} differs from the reference by {to_same}",
                    i + 1
                );
                worst_same = worst_same.max(to_same);
                if kv == KvCacheDtype::Fp8E4m3 {
                    worst_full = worst_full.max(to_full);
                    sum_full += to_full;
                    n += 1;
                }
            }
        }
    }
    eprintln!(
        "over the same cache dtype: worst |dlogprob| {worst_same:.2e}; FP8 cache vs full precision over {n} prompt tokens: worst {worst_full:.4}, mean {:.5}",
        sum_full / n as f64
    );
    assert!(worst_full < FP8_TOL, "worst |logprob - full-precision reference| {worst_full} over an FP8 cache");
    assert!(sum_full / (n as f64) < FP8_MEAN_TOL, "mean |logprob - full-precision reference| {} over an FP8 cache", sum_full / n as f64);
}
