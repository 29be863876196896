//! Block-FP8 checkpoints (issue 35, item 1; src/fp8.rs): a tiny Qwen3-MoE
//! (the moe-norm fixture) quantized here as transformers'
//! `FineGrainedFP8Config` does (per block: scale = amax / 448, FP8 e4m3 of
//! w / scale, the scale stored as `weight_scale_inv`), in blocks of 8 x 12 so
//! the fixture's small matrices hold several blocks and partial ones. kvc
//! loads it; the reference is the same quantized weights dequantized here on
//! the host (f32 loops, q x scale) and saved as a plain f32 checkpoint: the
//! two must answer alike.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::{fixture_dir, max_abs_diff, run_chunk, scattered_table, BLOCK_SIZE};
use kvc_kv_pool::KvStorage;
use kvc_model_qwen3::Qwen3Model;

const BLOCK: (usize, usize) = (8, 12);
const E4M3_MAX: f32 = 448.0;

/// The linear layers' weights an FP8 checkpoint quantizes (not the
/// embeddings, norms, router or LM head, which Qwen's FP8 checkpoints keep
/// in bf16).
fn quantized(name: &str) -> bool {
    name.starts_with("model.layers.") && name.ends_with("_proj.weight")
}

/// (FP8 weight, its scales [ceil(n / 8), ceil(k / 12)], the host's
/// dequantized f32 weight).
fn quantize(w: &Tensor) -> (Tensor, Tensor, Tensor) {
    let (n, k) = w.dims2().unwrap();
    let v = w.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
    let (sr, sc) = (n.div_ceil(BLOCK.0), k.div_ceil(BLOCK.1));
    let mut scale = vec![vec![1f32; sc]; sr];
    for (bi, row) in scale.iter_mut().enumerate() {
        for (bj, s) in row.iter_mut().enumerate() {
            let amax = (bi * BLOCK.0..((bi + 1) * BLOCK.0).min(n))
                .flat_map(|i| (bj * BLOCK.1..((bj + 1) * BLOCK.1).min(k)).map(move |j| (i, j)))
                .map(|(i, j)| v[i][j].abs())
                .fold(0f32, f32::max);
            if amax > 0.0 {
                *s = amax / E4M3_MAX;
            }
        }
    }
    let scaled: Vec<f32> = (0..n * k).map(|x| v[x / k][x % k] / scale[x / k / BLOCK.0][x % k / BLOCK.1]).collect();
    let q = Tensor::from_vec(scaled, (n, k), &Device::Cpu).unwrap().to_dtype(DType::F8E4M3).unwrap();
    let qf = q.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
    let deq: Vec<f32> = (0..n * k).map(|x| qf[x / k][x % k] * scale[x / k / BLOCK.0][x % k / BLOCK.1]).collect();
    let scale = Tensor::new(scale, &Device::Cpu).unwrap();
    (q, scale, Tensor::from_vec(deq, (n, k), &Device::Cpu).unwrap())
}

/// moe-norm as a block-FP8 checkpoint and as its host-dequantized f32
/// twin, in scratch directories.
fn fixtures(tag: &str) -> (PathBuf, PathBuf) {
    let src = fixture_dir("moe-norm");
    let base = std::env::temp_dir().join(format!("kvc-fp8-{tag}-{}", std::process::id()));
    let (fp8_dir, deq_dir) = (base.join("fp8"), base.join("dequantized"));
    let tensors = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let (mut fp8, mut deq) = (HashMap::new(), HashMap::new());
    for (name, t) in tensors {
        if quantized(&name) {
            let (q, s, d) = quantize(&t);
            fp8.insert(format!("{name}_scale_inv"), s);
            fp8.insert(name.clone(), q);
            deq.insert(name, d);
        } else {
            fp8.insert(name.clone(), t.clone());
            deq.insert(name, t);
        }
    }
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let mut fp8_config = config.clone();
    fp8_config["quantization_config"] = serde_json::json!({
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK.0, BLOCK.1]
    });
    for (dir, t, c) in [(&fp8_dir, &fp8, &fp8_config), (&deq_dir, &deq, &config)] {
        std::fs::create_dir_all(dir).unwrap();
        candle_core::safetensors::save(t, dir.join("model.safetensors")).unwrap();
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    }
    (fp8_dir, deq_dir)
}

/// Teacher-forced logits of every case (prefill, then each reference token).
fn logits(model: &Qwen3Model) -> Vec<Vec<f32>> {
    common::teacher_forced(model, "moe-norm", |nb| KvStorage::new(model.kv_layout(BLOCK_SIZE), nb).unwrap())
}

fn load(dir: &Path) -> Qwen3Model {
    Qwen3Model::load(dir, Some(DType::F32), &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn a_block_fp8_checkpoint_answers_as_its_dequantized_weights() {
    let (fp8_dir, deq_dir) = fixtures("answers");
    let got = logits(&load(&fp8_dir));
    let want = logits(&load(&deq_dir));
    let plain = logits(&load(&fixture_dir("moe-norm")));
    std::fs::remove_dir_all(fp8_dir.parent().unwrap()).ok();
    let worst = got.iter().zip(&want).map(|(a, b)| max_abs_diff(a, b)).fold(0f32, f32::max);
    assert!(worst <= 1e-5, "FP8 checkpoint vs its host-dequantized twin: max |logit diff| {worst:.2e}");
    // The quantization is real: FP8's 3-bit mantissa moves the answer.
    let moved = got.iter().zip(&plain).map(|(a, b)| max_abs_diff(a, b)).fold(0f32, f32::max);
    assert!(moved > 1e-3, "the FP8 weights answer exactly as the unquantized ones ({moved:.2e}): nothing was quantized");
    println!("block-FP8 moe-norm: max |logit diff| {worst:.2e} against its dequantized twin, {moved:.2e} against the unquantized model");
}

/// kvc against transformers on the same block-FP8 checkpoint
/// (fixtures/moe-norm-fp8, written by scripts/make_fp8_fixture.py: moe-norm
/// quantized in 16x16 blocks; its reference is transformers 5.17 loading the
/// directory on the CPU, which dequantizes the weights at load, after the
/// script checked that transformers' weights are exactly q x scale). Both
/// compute in f32 over the same dequantized weights: the tolerance is the
/// plain fixtures' (reference.rs), and every greedy token agrees (the
/// recorded top-2 gaps are >= 6e-3).
#[test]
fn a_block_fp8_checkpoint_answers_as_transformers_answers_it() {
    let name = "moe-norm-fp8";
    let model = load(&fixture_dir(name));
    let got = common::teacher_forced(&model, name, |nb| KvStorage::new(model.kv_layout(BLOCK_SIZE), nb).unwrap());
    let worst = common::against_transformers(&got, name);
    assert!(worst < 1e-4, "block-FP8 moe-norm vs transformers: max |logit diff| {worst:.2e}");
    // The checkpoint is really quantized: moe-norm's own answer is far from it.
    let plain = logits(&load(&fixture_dir("moe-norm")));
    let moved = got.iter().zip(&plain).map(|(a, b)| max_abs_diff(a, b)).fold(0f32, f32::max);
    assert!(moved > 1e-3, "the FP8 fixture answers as the unquantized moe-norm ({moved:.2e})");
    println!("block-FP8 moe-norm against transformers: max |logit diff| {worst:.2e} over {} positions", got.len());
}

#[test]
fn a_scale_of_the_wrong_shape_is_refused_by_name() {
    let (fp8_dir, _) = fixtures("bad-scale");
    let name = "model.layers.0.self_attn.q_proj.weight_scale_inv";
    let path = fp8_dir.join("model.safetensors");
    let mut t = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    t.insert(name.into(), Tensor::ones((1, 1), DType::F32, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&t, &path).unwrap();
    let e = Qwen3Model::load(&fp8_dir, Some(DType::F32), &Device::Cpu).err().map(|e| e.to_string());
    std::fs::remove_dir_all(fp8_dir.parent().unwrap()).ok();
    let e = e.expect("refused");
    assert!(e.contains(name) && e.contains("blocks"), "{e}");
}

/// The GPU FP8 test's checkpoint (tests/common/fp8_checkpoint.rs, 128x128
/// blocks, a dense and a MoE layer) on the CPU path, which dequantizes it
/// at load: it answers as its host-dequantized twin at every position of
/// the fixed prompts.
#[test]
fn the_gemm_shaped_fp8_checkpoint_answers_as_its_dequantized_twin_on_the_cpu() {
    let tiny = common::fp8_checkpoint::tiny_fp8_checkpoint("cpu");
    let (fp8, deq) = (load(&tiny.fp8), load(&tiny.dequantized));
    let mut worst = 0f32;
    for prompt in common::fp8_checkpoint::tiny_prompts(4) {
        let nb = prompt.len().div_ceil(BLOCK_SIZE) * 2 + 1;
        let table = scattered_table(prompt.len(), nb);
        let mut kv_a = KvStorage::new(fp8.kv_layout(BLOCK_SIZE), nb).unwrap();
        let mut kv_b = KvStorage::new(deq.kv_layout(BLOCK_SIZE), nb).unwrap();
        let a = run_chunk(&fp8, &mut kv_a, &table, &prompt, 0, prompt.len());
        let b = run_chunk(&deq, &mut kv_b, &table, &prompt, 0, prompt.len());
        worst = a.iter().zip(&b).map(|(x, y)| max_abs_diff(x, y)).fold(worst, f32::max);
    }
    assert!(worst <= 1e-4, "tiny 128-block FP8 checkpoint vs its dequantized twin: max |logit diff| {worst:.2e}");
}
