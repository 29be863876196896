//! The FP8 KV cache's per-layer scales a checkpoint may carry: an FP8
//! cache stores e4m3 of K / k_scale and V / v_scale, and a checkpoint
//! calibrated for one (llm-compressor, ModelOpt, AutoFP8) saves each
//! attention layer's scales beside its projections. kvc reads them under
//! the names vLLM does (`maybe_remap_kv_scale_name`), below
//! `model.layers.N.self_attn.`:
//!
//! - `k_scale` and `v_scale` (llm-compressor / compressed-tensors);
//! - `k_proj.k_scale` and `v_proj.v_scale` (ModelOpt);
//! - `attn.k_scale` and `attn.v_scale` (vLLM's own parameter names);
//! - `kv_scale`, one scale for both (the deprecated form).
//!
//! Each is one positive, finite number. A checkpoint gives them for every
//! layer or for none; half a pair, a layer given twice, or a value that is
//! not one positive number is refused by name, never silently replaced by
//! 1.0. Whether they are used is the KV cache dtype's business: only an
//! FP8 cache needs them (vLLM ignores them otherwise too).

use crate::ModelError;

/// The (K, V) name pairs, under a layer's `self_attn.`.
const PAIRS: [(&str, &str); 3] = [("k_scale", "v_scale"), ("k_proj.k_scale", "v_proj.v_scale"), ("attn.k_scale", "attn.v_scale")];
/// One scale for K and V.
const SHARED: &str = "kv_scale";

/// Where the scales are read from: whether a tensor is there, and its one
/// value (an error if it is not one number).
pub trait ScaleSource {
    fn has(&self, name: &str) -> bool;
    fn value(&self, name: &str) -> Result<f32, ModelError>;
}

/// Every layer's (K, V) scales, or None when the checkpoint has none.
pub fn read(source: &dyn ScaleSource, num_layers: usize) -> Result<Option<Vec<(f32, f32)>>, ModelError> {
    let per_layer = (0..num_layers).map(|l| layer(source, l)).collect::<Result<Vec<_>, _>>()?;
    let given: Vec<usize> = (0..num_layers).filter(|&l| per_layer[l].is_some()).collect();
    if given.is_empty() {
        return Ok(None);
    }
    if let Some(missing) = (0..num_layers).find(|l| per_layer[*l].is_none()) {
        return Err(ModelError::Weights(format!(
            "the checkpoint gives FP8 KV cache scales for {} of {num_layers} layers (layer {} has them) but none for layer \
             {missing} (model.layers.{missing}.self_attn.k_scale / v_scale): a partly calibrated checkpoint kvc will not guess for",
            given.len(),
            given[0]
        )));
    }
    Ok(Some(per_layer.into_iter().flatten().collect()))
}

/// Layer `l`'s scales, if the checkpoint names them in one of the forms.
fn layer(source: &dyn ScaleSource, l: usize) -> Result<Option<(f32, f32)>, ModelError> {
    let name = |suffix: &str| format!("model.layers.{l}.self_attn.{suffix}");
    let mut found: Vec<(String, (f32, f32))> = Vec::new();
    for (k, v) in PAIRS {
        let (kn, vn) = (name(k), name(v));
        match (source.has(&kn), source.has(&vn)) {
            (true, true) => found.push((kn.clone(), (scale(source, &kn)?, scale(source, &vn)?))),
            (false, false) => {}
            (true, false) => return Err(half_pair(&kn, &vn)),
            (false, true) => return Err(half_pair(&vn, &kn)),
        }
    }
    let shared = name(SHARED);
    if source.has(&shared) {
        let s = scale(source, &shared)?;
        found.push((shared, (s, s)));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop().map(|(_, pair)| pair)),
        _ => Err(ModelError::Weights(format!(
            "layer {l} gives its FP8 KV cache scales more than once ({}): kvc will not pick one",
            found.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn half_pair(has: &str, lacks: &str) -> ModelError {
    ModelError::Weights(format!("the checkpoint holds {has} without {lacks}: an FP8 KV cache scale needs both"))
}

/// `name`'s value: one finite number > 0.
fn scale(source: &dyn ScaleSource, name: &str) -> Result<f32, ModelError> {
    let s = source.value(name)?;
    if !(s.is_finite() && s > 0.0) {
        return Err(ModelError::Weights(format!("{name} is {s}: an FP8 KV cache scale must be a finite number > 0")));
    }
    Ok(s)
}

impl ScaleSource for candle_nn::VarBuilder<'_> {
    fn has(&self, name: &str) -> bool {
        self.contains_tensor(name)
    }

    fn value(&self, name: &str) -> Result<f32, ModelError> {
        let t = self.get_unchecked_dtype(name, candle_core::DType::F32)?;
        if t.elem_count() != 1 {
            return Err(ModelError::Weights(format!("{name} has shape {:?}: an FP8 KV cache scale is one number", t.dims())));
        }
        Ok(t.flatten_all()?.to_vec1::<f32>()?[0])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Names(HashMap<String, f32>);

    impl ScaleSource for Names {
        fn has(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }

        fn value(&self, name: &str) -> Result<f32, ModelError> {
            Ok(self.0[name])
        }
    }

    fn names(entries: &[(&str, f32)]) -> Names {
        Names(entries.iter().map(|(n, v)| (n.to_string(), *v)).collect())
    }

    fn err(source: &Names, layers: usize) -> String {
        read(source, layers).unwrap_err().to_string()
    }

    #[test]
    fn every_form_vllm_reads_is_read_and_none_at_all_is_none() {
        let src = names(&[
            ("model.layers.0.self_attn.k_scale", 0.5),
            ("model.layers.0.self_attn.v_scale", 2.0),
            ("model.layers.1.self_attn.k_proj.k_scale", 0.25),
            ("model.layers.1.self_attn.v_proj.v_scale", 4.0),
            ("model.layers.2.self_attn.attn.k_scale", 3.0),
            ("model.layers.2.self_attn.attn.v_scale", 5.0),
            ("model.layers.3.self_attn.kv_scale", 0.125),
        ]);
        assert_eq!(read(&src, 4).unwrap(), Some(vec![(0.5, 2.0), (0.25, 4.0), (3.0, 5.0), (0.125, 0.125)]));
        assert_eq!(read(&names(&[("model.layers.0.self_attn.q_proj.weight", 1.0)]), 2).unwrap(), None);
    }

    #[test]
    fn what_would_be_guessed_is_refused_by_name() {
        let half = names(&[("model.layers.0.self_attn.k_scale", 0.5)]);
        assert!(err(&half, 1).contains("k_scale without model.layers.0.self_attn.v_scale"), "{}", err(&half, 1));
        let partial = names(&[("model.layers.0.self_attn.k_scale", 0.5), ("model.layers.0.self_attn.v_scale", 0.5)]);
        assert!(err(&partial, 2).contains("none for layer 1"), "{}", err(&partial, 2));
        let twice = names(&[
            ("model.layers.0.self_attn.k_scale", 0.5),
            ("model.layers.0.self_attn.v_scale", 0.5),
            ("model.layers.0.self_attn.kv_scale", 0.5),
        ]);
        assert!(err(&twice, 1).contains("more than once") && err(&twice, 1).contains("kv_scale"), "{}", err(&twice, 1));
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let src = names(&[("model.layers.0.self_attn.kv_scale", bad)]);
            assert!(err(&src, 1).contains("model.layers.0.self_attn.kv_scale is"), "{}", err(&src, 1));
        }
    }
}
