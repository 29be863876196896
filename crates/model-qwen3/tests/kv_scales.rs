//! A checkpoint's FP8 KV cache scales (src/kv_scales.rs; issue 35, item 3).
//! The dense fixture is rewritten with its keys and values 4096x larger
//! (k_norm and v_proj x 4096, q_norm and o_proj / 4096: a power of two, so
//! the model computes the same numbers bit for bit) and calibrated scales
//! of 4096 saved beside them under each name form vLLM reads. Over an FP8
//! cache that applies them, e4m3(K' / 4096) is e4m3(K): the rewritten
//! checkpoint must answer exactly as the original over an FP8 cache of
//! scale 1, and so within FP8's tolerance of transformers' logits
//! (reference.json). Without them its keys (several hundred to thousands)
//! saturate e4m3 at 448 and the answer moves far: the scales are what keeps
//! it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::{cases, fixture_dir, max_abs_diff, rel_err, BLOCK_SIZE};
use kvc_kv_pool::{KvLayout, KvStorage};
use kvc_model_qwen3::Qwen3Model;

const FIXTURE: &str = "dense";
const S: f32 = 4096.0;

/// How one layer's scales are written (the forms vLLM reads), and the shape
/// of each tensor.
#[derive(Clone, Copy)]
enum Form {
    /// `self_attn.k_scale` / `v_scale`, shape [1] (llm-compressor).
    Plain,
    /// `self_attn.k_proj.k_scale` / `v_proj.v_scale`, shape [] (ModelOpt).
    ModelOpt,
    /// `self_attn.kv_scale`, one for both (deprecated).
    Shared,
}

fn scale_tensors(layer: usize, form: Form, k: f32, v: f32) -> Vec<(String, Tensor)> {
    let p = format!("model.layers.{layer}.self_attn");
    let one = |x: f32| Tensor::new(&[x], &Device::Cpu).unwrap();
    let scalar = |x: f32| Tensor::new(x, &Device::Cpu).unwrap();
    match form {
        Form::Plain => vec![(format!("{p}.k_scale"), one(k)), (format!("{p}.v_scale"), one(v))],
        Form::ModelOpt => vec![(format!("{p}.k_proj.k_scale"), scalar(k)), (format!("{p}.v_proj.v_scale"), scalar(v))],
        Form::Shared => vec![(format!("{p}.kv_scale"), one(k))],
    }
}

/// The fixture with K and V x 4096 and `extra` tensors, in a scratch directory.
fn rewritten(tag: &str, extra: impl Fn(usize) -> Vec<(String, Tensor)>) -> PathBuf {
    let src = fixture_dir(FIXTURE);
    let dir = std::env::temp_dir().join(format!("kvc-kv-scales-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors: HashMap<String, Tensor> = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let layers = Qwen3Model::load(&src, Some(DType::F32), &Device::Cpu).unwrap().config().num_hidden_layers;
    for l in 0..layers {
        for (part, factor) in [("k_norm", S), ("v_proj", S), ("q_norm", 1.0 / S), ("o_proj", 1.0 / S)] {
            let name = format!("model.layers.{l}.self_attn.{part}.weight");
            let t = tensors.remove(&name).unwrap_or_else(|| panic!("{name} in the fixture"));
            tensors.insert(name, t.affine(f64::from(factor), 0.0).unwrap());
        }
        tensors.extend(extra(l));
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    dir
}

fn load(dir: &Path) -> Result<Qwen3Model, String> {
    Qwen3Model::load(dir, Some(DType::F32), &Device::Cpu).map_err(|e| e.to_string())
}

/// Teacher-forced logits of every case over a cache of `layout` whose
/// layers have `scales` (prefill, then each reference token).
fn logits(model: &Qwen3Model, layout: KvLayout, scales: Option<&[(f32, f32)]>) -> Vec<Vec<f32>> {
    common::teacher_forced(model, FIXTURE, |nb| {
        let mut kv = KvStorage::new(layout, nb).unwrap();
        if let Some(s) = scales {
            kv.set_kv_scales(s.to_vec()).unwrap();
        }
        kv
    })
}

fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).map(|(x, y)| max_abs_diff(x, y)).fold(0f32, f32::max)
}

fn worst_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter().zip(b).map(|(x, y)| rel_err(x, y)).fold(0f64, f64::max)
}

/// The FP8 cache against transformers' full-precision logits (the tiny
/// fixtures' head dim 16: measured 0.03-0.07 relative, as in gpu_layers).
const FP8_REL_TOL: f64 = 0.1;

#[test]
fn a_checkpoints_kv_scales_are_read_in_every_form_and_keep_an_fp8_cache_exact() {
    let original = load(&fixture_dir(FIXTURE)).unwrap();
    assert_eq!(original.kv_scales(), None, "the fixture has no KV scales");
    let fp8 = |m: &Qwen3Model| KvLayout { dtype: DType::F8E4M3, ..m.kv_layout(BLOCK_SIZE) };
    let want = logits(&original, fp8(&original), None);
    let reference: Vec<Vec<f32>> = cases(FIXTURE).into_iter().flat_map(|c| c.logits).collect();
    assert_eq!(reference.len(), want.len());
    let forms = [Form::Plain, Form::ModelOpt, Form::Shared];
    let dir = rewritten("forms", |l| scale_tensors(l, forms[l % forms.len()], S, S));
    let bare = rewritten("none", |_| Vec::new());
    let (scaled, unscaled) = (load(&dir), load(&bare));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&bare).ok();
    let scaled = scaled.unwrap();
    let unscaled = unscaled.unwrap();
    let scales = scaled.kv_scales().expect("the checkpoint's KV scales").to_vec();
    assert_eq!(scales, vec![(S, S); scales.len()]);
    assert_eq!(scales.len(), original.config().num_hidden_layers);

    // Full precision: the rewrite changes nothing (powers of two).
    let f32_layout = |m: &Qwen3Model| m.kv_layout(BLOCK_SIZE);
    let exact = worst(&logits(&scaled, f32_layout(&scaled), None), &logits(&original, f32_layout(&original), None));
    assert!(exact <= 1e-5, "K x 4096, V x 4096 in f32 moved the logits by {exact:.2e}");

    let got = logits(&scaled, fp8(&scaled), Some(&scales));
    let same = worst(&got, &want);
    assert!(same <= 1e-5, "over an FP8 cache with the checkpoint's scales: {same:.2e} from the original over scale 1");
    let to_reference = worst_rel(&got, &reference);
    assert!(to_reference < FP8_REL_TOL, "FP8 cache with the checkpoint's scales vs transformers: relative {to_reference:.3}");
    // Without them (scale 1.0), e4m3 saturates the 4096x keys and values.
    let saturated = worst_rel(&logits(&unscaled, fp8(&unscaled), None), &reference);
    assert!(saturated > 4.0 * to_reference, "scale 1.0 over the 4096x K/V: relative {saturated:.3} vs {to_reference:.3} with scales");
    println!("FP8 cache, checkpoint scales: {same:.2e} from the original at scale 1, {to_reference:.4} relative to transformers; without them {saturated:.4}");
}

#[test]
fn kv_scales_the_checkpoint_gives_for_some_layers_only_are_refused_by_name() {
    let dir = rewritten("partial", |l| if l == 0 { scale_tensors(l, Form::Plain, S, S) } else { Vec::new() });
    let e = load(&dir).err();
    std::fs::remove_dir_all(&dir).ok();
    let e = e.expect("refused");
    assert!(e.contains("none for layer 1") && e.contains("self_attn.k_scale"), "{e}");

    let dir = rewritten("bad", |l| scale_tensors(l, Form::Shared, if l == 1 { -2.0 } else { S }, S));
    let e = load(&dir).err();
    std::fs::remove_dir_all(&dir).ok();
    let e = e.expect("refused");
    assert!(e.contains("model.layers.1.self_attn.kv_scale is -2"), "{e}");

    let dir = rewritten("shape", |l| {
        let p = format!("model.layers.{l}.self_attn");
        vec![
            (format!("{p}.k_scale"), Tensor::new(&[S, S], &Device::Cpu).unwrap()),
            (format!("{p}.v_scale"), Tensor::new(S, &Device::Cpu).unwrap()),
        ]
    });
    let e = load(&dir).err();
    std::fs::remove_dir_all(&dir).ok();
    let e = e.expect("refused");
    assert!(e.contains("model.layers.0.self_attn.k_scale has shape [2]"), "{e}");
}
