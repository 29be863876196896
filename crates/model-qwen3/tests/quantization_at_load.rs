//! `--quantization fp8` (src/weights.rs's quantization at load): a plain
//! checkpoint's decoder projections become block FP8 as they are read.
//! The independent reference is the fixture moe-norm-fp8, which
//! scripts/make_fp8_fixture.py made from moe-norm's weights with its own
//! quantizer (torch, per 16x16 block: scale = amax / 448, e4m3 of w /
//! scale) and whose logits are transformers' loading that checkpoint: the
//! plain moe-norm quantized by kvc at load in the same blocks must answer
//! as transformers answers the checkpoint the script wrote.

mod common;

use std::path::Path;

use candle_core::{DType, Device};
use common::{fixture_dir, max_abs_diff, BLOCK_SIZE};
use kvc_kv_pool::KvStorage;
use kvc_model_qwen3::fp8::{BlockFp8, AT_LOAD};
use kvc_model_qwen3::Qwen3Model;

fn load(dir: &Path, quantize: Option<BlockFp8>) -> Qwen3Model {
    Qwen3Model::load_observed(dir, DType::F32, &Device::Cpu, quantize, Box::new(|_| {}))
        .unwrap_or_else(|e| panic!("{} ({quantize:?}): {e}", dir.display()))
}

/// Teacher-forced logits of every case of `fixture` (its prompts and
/// reference tokens).
fn logits(model: &Qwen3Model, fixture: &str) -> Vec<Vec<f32>> {
    common::teacher_forced(model, fixture, |nb| KvStorage::new(model.kv_layout(BLOCK_SIZE), nb).unwrap())
}

/// The block size the fixture's checkpoint was quantized in.
fn fixture_blocks(name: &str) -> BlockFp8 {
    let text = std::fs::read_to_string(fixture_dir(name).join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    BlockFp8::from_config(&config["quantization_config"]).unwrap()
}

fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| max_abs_diff(x, y)).fold(0f32, f32::max)
}

#[test]
fn a_plain_checkpoint_quantized_at_load_answers_as_transformers_answers_the_same_fp8_checkpoint() {
    let blocks = fixture_blocks("moe-norm-fp8");
    assert_eq!(blocks.block, (16, 16), "the fixture's blocks (scripts/make_fp8_fixture.py)");
    let model = load(&fixture_dir("moe-norm"), Some(blocks));
    let got = logits(&model, "moe-norm-fp8");
    let max_diff = common::against_transformers(&got, "moe-norm-fp8");
    // The plain fixtures' tolerance against transformers (reference.rs).
    assert!(max_diff < 1e-4, "moe-norm quantized at load vs transformers on moe-norm-fp8: max |logit diff| {max_diff:.2e}");
    // The quantization is real: unquantized, moe-norm answers elsewhere.
    let plain = logits(&load(&fixture_dir("moe-norm"), None), "moe-norm-fp8");
    let moved = worst(&got, &plain);
    assert!(moved > 1e-3, "quantized at load, moe-norm answers as unquantized ({moved:.2e}): nothing was quantized");
    println!(
        "moe-norm quantized at load against transformers on moe-norm-fp8: max |logit diff| {max_diff:.2e}; {moved:.2e} from unquantized"
    );
}

#[test]
fn a_checkpoint_in_block_fp8_already_keeps_its_own_scales_under_the_flag() {
    let dir = fixture_dir("moe-norm-fp8");
    let with = logits(&load(&dir, Some(AT_LOAD)), "moe-norm-fp8");
    let without = logits(&load(&dir, None), "moe-norm-fp8");
    assert_eq!(worst(&with, &without), 0.0, "--quantization fp8 changed a block-FP8 checkpoint's answer");
}

#[test]
fn a_bf16_checkpoint_quantizes_in_the_official_blocks_and_every_tensor_is_read() {
    // bf16 weights, in AT_LOAD's 128x128 blocks (the tiny model's matrices
    // are one partial block each). Loading checks every tensor was read.
    let dir = fixture_dir("dense-bf16");
    let got = logits(&load(&dir, Some(AT_LOAD)), "dense-bf16");
    let plain = logits(&load(&dir, None), "dense-bf16");
    let moved = worst(&got, &plain);
    assert!(moved > 0.0, "quantized at load, dense-bf16 answers exactly as unquantized: nothing was quantized");
    // One e4m3 rounding of each weight (<= 1/16 of its block's amax) moves
    // the tiny model's logits by far less than they span.
    let span = plain.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    assert!(moved < span / 4.0, "quantized at load, dense-bf16's logits moved {moved:.3} of a span of {span:.3}");
}
