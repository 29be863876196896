//! Block-FP8 weights served in FP8 on an sm90 GPU (issue 35): the tiny
//! checkpoint of tests/common/fp8_checkpoint.rs loaded twice on the GPU,
//! once with its projections kept in FP8 (CUTLASS's block-scaled FP8
//! GEMMs, activations quantized per token and 128-wide group) and once
//! dequantized at load (`KVC_FP8_GEMM=dequantize`'s path, bf16 GEMMs over
//! the very same weight values). Ignored by default (CI has no GPU):
//! `scripts/gpu_run.sh tests` runs them on the lent H200.
//!
//! Tolerance. The two loads hold the same weights (q x scale is exact in
//! f32; the dequantized load rounds it to bf16, relative 2^-9), so what
//! differs is the FP8 path's activation quantization: each input element
//! of a projection is rounded to e4m3 (3 mantissa bits) within its
//! group's scale, a relative error of at most 2^-4 and about 2.5 % RMS for
//! values spread over a binade. A projection's output inherits about that
//! RMS relative error (independent roundings under random weights), a
//! layer chains two quantized projections per branch (q/k/v then o; gate|up
//! then down), and the branches add to a residual stream that carries the
//! unquantized embedding. So the logits' relative RMS error should be of
//! order 2-4 %; 2^-3 (12.5 %) per position and 2^-4 (6.25 %) over all
//! positions leave room for the bf16 rounding of both passes, while a
//! wrong scale, layout or expert offset gives errors of order 100 %.
//! Greedy tokens (teacher-forced on the dequantized load's choices) must
//! agree at >= 95 % of positions, the bar.
#![cfg(feature = "cuda")]

mod common;

use std::sync::Mutex;

use candle_core::{DType, Device};
use common::fp8_checkpoint::{tiny_fp8_checkpoint, tiny_prompts};
use common::{argmax, gpu, rel_err};
use kvc_kv_pool::{BlockId, KvStorage};
use kvc_model_qwen3::cuda::{
    e4m3_io_plans, fp8_gemm_runs, set_fp8_attention_bounds, set_fp8_dense_swap_rows, set_fp8_weights, Fp8AttentionBounds,
    DEFAULT_FP8_BOUNDS,
};
use kvc_model_qwen3::fp8::AT_LOAD;
use kvc_model_qwen3::{BatchInput, Qwen3Model, SeqChunk};

/// The FP8 choice is process-wide (the kernel plan's): one test at a time.
static CHOICE: Mutex<()> = Mutex::new(());

const BLOCK: usize = 16;
const PROMPTS: usize = 8;
const DECODE_STEPS: usize = 12;
const POSITION_TOL: f64 = 0.125;
const OVERALL_TOL: f64 = 0.0625;
const GREEDY_AGREEMENT: f64 = 0.95;

fn load(dir: &std::path::Path, fp8: bool, dev: &Device) -> Qwen3Model {
    set_fp8_weights(fp8);
    let m = Qwen3Model::load(dir, Some(DType::BF16), dev).unwrap_or_else(|e| panic!("{} (fp8 {fp8}): {e}", dir.display()));
    set_fp8_weights(true);
    m
}

/// Every position's logits of the prompts (one batched prefill, logits of
/// every row), then `DECODE_STEPS` decode steps of all prompts as one
/// batch, each fed `forced[i][step]` (else its own greedy token): (logits
/// per position in a fixed order, the tokens each decode step was fed).
fn run(model: &Qwen3Model, prompts: &[Vec<u32>], forced: Option<&[Vec<u32>]>, dev: &Device) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    run_over(model, model.kv_layout(BLOCK).dtype, prompts, forced, dev)
}

/// [`run`] over a KV pool of `kv_dtype`.
fn run_over(
    model: &Qwen3Model,
    kv_dtype: DType,
    prompts: &[Vec<u32>],
    forced: Option<&[Vec<u32>]>,
    dev: &Device,
) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let per_seq = (prompts.iter().map(Vec::len).max().unwrap() + DECODE_STEPS + 1).div_ceil(BLOCK);
    let nb = per_seq * prompts.len() + 1;
    let layout = kvc_kv_pool::KvLayout { dtype: kv_dtype, ..model.kv_layout(BLOCK) };
    let mut kv = KvStorage::new_on(layout, nb, dev).unwrap();
    // Tables in reverse block order: not the allocation order.
    let tables: Vec<Vec<BlockId>> =
        (0..prompts.len()).map(|i| (0..per_seq).map(|b| (nb - 1 - i * per_seq - b) as BlockId).collect()).collect();
    let mut starts = Vec::new();
    let mut tokens = Vec::new();
    for p in prompts {
        starts.push(tokens.len());
        tokens.extend_from_slice(p);
    }
    let seqs = prompts
        .iter()
        .zip(&starts)
        .zip(&tables)
        .map(|((p, &start), t)| SeqChunk { start, len: p.len(), context_len: p.len(), block_table: t })
        .collect();
    let total = tokens.len();
    let batch = BatchInput { tokens, seqs, logits_rows: (0..total).collect() };
    let mut logits = model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap();
    let mut next: Vec<u32> = prompts.iter().zip(&starts).map(|(p, &s)| argmax(&logits[s + p.len() - 1])).collect();
    let mut fed: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut ctx: Vec<usize> = prompts.iter().map(Vec::len).collect();
    for step in 0..DECODE_STEPS {
        let toks: Vec<u32> = (0..prompts.len()).map(|i| forced.map_or(next[i], |f| f[i][step])).collect();
        for (i, &t) in toks.iter().enumerate() {
            fed[i].push(t);
            ctx[i] += 1;
        }
        let seqs = (0..prompts.len()).map(|i| SeqChunk { start: i, len: 1, context_len: ctx[i], block_table: &tables[i] }).collect();
        let batch = BatchInput { tokens: toks, seqs, logits_rows: (0..prompts.len()).collect() };
        let out = model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap();
        next = out.iter().map(|l| argmax(l)).collect();
        logits.extend(out);
    }
    (logits, fed)
}

/// (sum of squared differences, sum of squares of `want`) over every
/// position's logits: their ratio's root is the relative RMS error.
fn squares(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f64, f64) {
    got.iter().zip(want).fold((0f64, 0f64), |(n, d), (a, b)| {
        (n + a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>(), d + b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>())
    })
}

/// The GPU, held for one FP8 test at a time (the FP8 choice is
/// process-wide), where the FP8 GEMMs run.
fn fp8_gpu() -> (std::sync::MutexGuard<'static, ()>, Device) {
    let one = CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = fp8_gemm_runs() {
        panic!("the FP8 GEMMs do not run here: {e}");
    }
    (one, gpu())
}

/// Positions whose greedy tokens agree.
fn greedy_agreement(got: &[Vec<f32>], want: &[Vec<f32>]) -> usize {
    got.iter().zip(want).filter(|(a, b)| argmax(a) == argmax(b)).count()
}

#[test]
#[ignore = "needs an sm90 GPU: run with scripts/gpu_run.sh"]
fn fp8_weights_answer_as_the_dequantized_load_within_activation_rounding() {
    fp8_answers_as_the_dequantized_load(PROMPTS, "gpu-answers");
}

/// The same on the 128-row tiles of the dense FP8 GEMMs alone
/// (`KVC_FP8_DENSE_SWAP_ROWS=0`): the default sends the eight sequences'
/// decode steps (8 rows) and the prompts' prefill rows up to 64 to the
/// swapped 64-row tiling, which the test above covers.
#[test]
#[ignore = "needs an sm90 GPU: run with scripts/gpu_run.sh"]
fn fp8_weights_on_the_128_row_dense_tiling_answer_as_the_dequantized_load() {
    set_fp8_dense_swap_rows(Some(0));
    let run = std::panic::catch_unwind(|| fp8_answers_as_the_dequantized_load(PROMPTS, "gpu-answers-rows"));
    set_fp8_dense_swap_rows(None);
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
}

/// One sequence: its decode steps take the one-row kernels (gemv.cu's
/// `one_row_gemm_fp8`) for the dense layers and the experts alike.
#[test]
#[ignore = "needs an sm90 GPU: run with scripts/gpu_run.sh"]
fn fp8_weights_at_batch_one_answer_as_the_dequantized_load() {
    fp8_answers_as_the_dequantized_load(1, "gpu-answers-one");
}

fn fp8_answers_as_the_dequantized_load(sequences: usize, name: &str) {
    let (_one, dev) = fp8_gpu();
    let tiny = tiny_fp8_checkpoint(name);
    let prompts = tiny_prompts(sequences);
    let reference = load(&tiny.fp8, false, &dev);
    let fp8 = load(&tiny.fp8, true, &dev);
    // The FP8 model's decode steps through CUDA graphs (captured at the
    // first step of the batch's bucket, replayed after), the reference
    // eagerly: the FP8 calls must be capturable.
    fp8.set_cuda_graphs(sequences);
    let (want, greedy) = run(&reference, &prompts, None, &dev);
    let (got, _) = run(&fp8, &prompts, Some(&greedy), &dev);
    assert_eq!(fp8.cuda_graphs_disabled(), None, "the FP8 model's decode graphs were turned off");
    assert_eq!(got.len(), want.len());

    let prefill_rows: usize = prompts.iter().map(Vec::len).sum();
    let errs: Vec<f64> = got.iter().zip(&want).map(|(a, b)| rel_err(a, b)).collect();
    let (num, den) = squares(&got, &want);
    let overall = (num / den).sqrt();
    let (worst_at, worst) = errs.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let agree = greedy_agreement(&got, &want);
    let agree_decode = greedy_agreement(&got[prefill_rows..], &want[prefill_rows..]);
    let max_abs = got.iter().zip(&want).map(|(a, b)| common::max_abs_diff(a, b)).fold(0f32, f32::max);
    let logit_rms = (den / (want.len() * want[0].len()) as f64).sqrt();
    // The noise floor: the dequantized load against itself, run again.
    let (again, _) = run(&reference, &prompts, Some(&greedy), &dev);
    let floor = again.iter().zip(&want).map(|(a, b)| rel_err(a, b)).fold(0f64, f64::max);
    println!(
        "tiny block-FP8 model, FP8 GEMMs vs dequantized bf16 load over {} positions ({prefill_rows} prefill, {} decode): \
         relative RMS error {overall:.4} overall, worst position {worst:.4} (#{worst_at}), max |logit diff| {max_abs:.4} \
         (logit RMS {logit_rms:.3}); greedy agreement {agree}/{} ({:.1} %), decode {agree_decode}/{}; \
         rerun of the dequantized load: worst {floor:.2e}",
        got.len(),
        got.len() - prefill_rows,
        got.len(),
        100.0 * agree as f64 / got.len() as f64,
        got.len() - prefill_rows,
    );
    for (i, p) in prompts.iter().enumerate() {
        println!("  prompt {i}: {} tokens, greedy {:?}", p.len(), greedy[i]);
    }
    assert!(overall <= OVERALL_TOL, "relative RMS logit error {overall:.4} over all positions > {OVERALL_TOL}");
    assert!(worst <= POSITION_TOL, "relative RMS logit error {worst:.4} at position {worst_at} > {POSITION_TOL}");
    // The activations really were quantized (else the two would agree to
    // the rerun's noise floor); one short prompt's rows mostly take the
    // few-row kernels, whose input stays bf16.
    if sequences > 1 {
        assert!(overall > 10.0 * floor.max(1e-6), "FP8 path indistinguishable from the dequantized one ({overall:.2e}): not running FP8?");
    }
    let share = agree as f64 / got.len() as f64;
    assert!(share >= GREEDY_AGREEMENT, "greedy tokens agree at {:.1} % of positions (< {} %)", 100.0 * share, 100.0 * GREEDY_AGREEMENT);
}

#[test]
#[ignore = "needs an sm90 GPU: run with scripts/gpu_run.sh"]
fn fp8_weights_take_half_the_device_bytes_of_the_dequantized_load() {
    let (_one, dev) = fp8_gpu();
    let tiny = tiny_fp8_checkpoint("gpu-bytes");
    let deq = load(&tiny.fp8, false, &dev).gpu_weight_bytes().expect("a GPU model");
    let fp8 = load(&tiny.fp8, true, &dev).gpu_weight_bytes().expect("a GPU model");
    println!("dequantized load: {deq:?}\nFP8 load:         {fp8:?}");
    // Per layer: q|k|v and o; layer 0's gate|up and down, layer 1's two expert stacks.
    assert_eq!((fp8.fp8_weights, fp8.bf16_weights), (8, 0), "every projection in FP8");
    assert_eq!((deq.fp8_weights, deq.bf16_weights), (0, 8), "every projection dequantized");
    // One byte per weight instead of two, plus an f32 scale per 128x128 block.
    let ratio = fp8.projections as f64 / deq.projections as f64;
    let scales = 4.0 / (128.0 * 128.0 * 2.0);
    assert!((ratio - (0.5 + scales)).abs() < 1e-3, "FP8 projections take {ratio:.4} of the bf16 bytes (want {:.4})", 0.5 + scales);
    // The rest (embeddings, LM head, norms, router) is the same in both.
    assert_eq!(fp8.total - fp8.projections, deq.total - deq.projections);
}

#[test]
#[ignore = "needs an sm90 GPU: run with scripts/gpu_run.sh"]
fn a_plain_checkpoint_quantized_at_load_runs_on_the_fp8_gemms_as_the_fp8_checkpoint_it_equals() {
    let (_one, dev) = fp8_gpu();
    let tiny = tiny_fp8_checkpoint("gpu-at-load");
    let prompts = tiny_prompts(PROMPTS);
    // The plain twin holds q x scale: quantized again in the same 128x128
    // blocks (--quantization fp8), each block's largest value gives back its
    // scale and every weight its e4m3 value.
    let fp8 = load(&tiny.fp8, true, &dev);
    let at_load = Qwen3Model::load_observed(&tiny.dequantized, DType::BF16, &dev, Some(AT_LOAD), Box::new(|_| {}))
        .unwrap_or_else(|e| panic!("{}: {e}", tiny.dequantized.display()));
    let bytes = at_load.gpu_weight_bytes().expect("a GPU model");
    assert_eq!((bytes.fp8_weights, bytes.bf16_weights), (8, 0), "every projection quantized at load runs in FP8: {bytes:?}");
    let (want, greedy) = run(&fp8, &prompts, None, &dev);
    let (got, _) = run(&at_load, &prompts, Some(&greedy), &dev);
    let (num, den) = squares(&got, &want);
    let overall = (num / den).sqrt();
    let agree = greedy_agreement(&got, &want);
    println!("quantized at load vs the block-FP8 checkpoint: relative RMS logit error {overall:.2e}, greedy {agree}/{}", got.len());
    assert!(overall <= 1e-3, "quantized at load, the model answers {overall:.2e} away from the FP8 checkpoint it equals");
    assert!(agree as f64 >= GREEDY_AGREEMENT * got.len() as f64, "greedy agreement {agree}/{}", got.len());
}

/// Over an FP8 KV cache, a prefill step whose every prompt is fresh runs
/// cuDNN's FP8 attention with Q written in e4m3 by RoPE and O handed to
/// o_proj's FP8 GEMM in e4m3 (no bf16 round trip). Held to the same FP8
/// model over the same kind of pool on the bf16 attention route: that
/// route differs by Q's and the softmax probabilities' e4m3 rounding (the
/// attention alone: ~4 % relative, gpu_attention), which the two layers'
/// residual streams dilute, so the weights test's bars apply: 2^-4 RMS over
/// all positions, 2^-3 at any, greedy >= 95 %.
#[test]
#[ignore = "needs an sm90 GPU and cuDNN 9: run with scripts/gpu_run.sh"]
fn an_fp8_kv_prefill_on_the_e4m3_attention_route_answers_as_the_bf16_route() {
    let (_one, dev) = fp8_gpu();
    let tiny = tiny_fp8_checkpoint("gpu-e4m3-attention");
    // Prompts cuDNN takes whole (at least 17 query rows of a KV head's 2):
    // the step has no row on kvc's kernels, so it is e4m3 end to end.
    let prompts: Vec<Vec<u32>> = tiny_prompts(PROMPTS).into_iter().filter(|p| p.len() >= 9).collect();
    assert!(prompts.len() >= PROMPTS - 1);
    let prefill_rows: usize = prompts.iter().map(Vec::len).sum();
    set_fp8_attention_bounds(None);
    let bf16_route = load(&tiny.fp8, true, &dev);
    // The route for steps of fresh prompts alone, never for mixed steps of
    // this size: the prefill step must count as a whole step to take it.
    set_fp8_attention_bounds(Some(Fp8AttentionBounds { mixed: prefill_rows + 1, whole_step: 0 }));
    let e4m3_route = load(&tiny.fp8, true, &dev);
    set_fp8_attention_bounds(Some(DEFAULT_FP8_BOUNDS));
    // kvc_decisions_total{decision="fp8_attention",outcome="fp8"}.
    let taken = || {
        kvc_policy::decisions_total::counts()
            .into_iter()
            .filter(|(s, _)| s.decision == "fp8_attention" && s.outcome == "fp8")
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    let (taken0, io0) = (taken(), e4m3_io_plans());
    let (want, greedy) = run_over(&bf16_route, DType::F8E4M3, &prompts, None, &dev);
    assert_eq!((taken(), e4m3_io_plans()), (taken0, io0), "the reference took the FP8 attention route");
    let (got, _) = run_over(&e4m3_route, DType::F8E4M3, &prompts, Some(&greedy), &dev);
    assert_eq!(taken() - taken0, 1, "the prefill step did not take cuDNN's FP8 attention (a refused graph is logged)");
    assert_eq!(e4m3_io_plans() - io0, 1, "the prefill step was not e4m3 end to end");
    let errs: Vec<f64> = got.iter().zip(&want).map(|(a, b)| rel_err(a, b)).collect();
    let (num, den) = squares(&got, &want);
    let overall = (num / den).sqrt();
    let (worst_at, worst) = errs.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let prefill_worst = errs[..prefill_rows].iter().copied().fold(0f64, f64::max);
    let agree = greedy_agreement(&got, &want);
    println!(
        "tiny block-FP8 model over an FP8 KV cache, e4m3 attention route vs bf16 route over {} positions ({prefill_rows} prefill): \
         relative RMS error {overall:.4} overall, worst position {worst:.4} (#{worst_at}), worst prefill position {prefill_worst:.4}; \
         greedy agreement {agree}/{}",
        got.len(),
        got.len(),
    );
    assert!(overall <= OVERALL_TOL, "relative RMS logit error {overall:.4} over all positions > {OVERALL_TOL}");
    assert!(worst <= POSITION_TOL, "relative RMS logit error {worst:.4} at position {worst_at} > {POSITION_TOL}");
    assert!(prefill_worst > 0.0, "the e4m3 route's prefill logits equal the bf16 route's: not running FP8 attention?");
    let share = agree as f64 / got.len() as f64;
    assert!(share >= GREEDY_AGREEMENT, "greedy tokens agree at {:.1} % of positions (< {} %)", 100.0 * share, 100.0 * GREEDY_AGREEMENT);
}
