//! Block-FP8 checkpoints (`quant_method: fp8`, as the official Qwen3-*-FP8
//! and DeepSeek-V3 checkpoints ship them and transformers'
//! `FineGrainedFP8Config` writes them): a linear layer's weight `[N, K]`
//! stored as `float8_e4m3fn`, with `weight_scale_inv` `[ceil(N / bn),
//! ceil(K / bk)]` beside it, one f32 (or bf16) scale per `bn x bk` block,
//! and `W = q * scale` (the "inverse" of the scale the quantizer divided
//! by). Layers the checkpoint keeps unquantized (embeddings, norms, the
//! router, the LM head) are stored plainly and load as before.
//!
//! kvc dequantizes such weights at load into the compute dtype, on the CPU
//! and CUDA paths alike: the answers are the checkpoint's, but the weights
//! take the compute dtype's memory (FP8 tensor-core GEMMs are not
//! implemented yet). Anything else in `quantization_config` that would
//! change the answer (static activation scales, another format, FP8 KV
//! scales) is refused by name.

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::ModelError;

/// A block-FP8 `quantization_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFp8 {
    /// Rows (output features) and columns (input features) a scale covers.
    pub block: (usize, usize),
}

/// The keys kvc reads or may ignore (the modules left unquantized are
/// stored plainly, so their lists change nothing here).
const KNOWN_KEYS: [&str; 6] = ["quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert", "ignored_layers"];

impl BlockFp8 {
    /// Reads a `quantization_config` whose `quant_method` is `fp8`.
    pub fn from_config(q: &Value) -> Result<Self, ModelError> {
        let err = |m: String| ModelError::Config(format!("quantization_config (fp8): {m}"));
        let obj = q.as_object().ok_or_else(|| err("not an object".into()))?;
        if let Some(k) = obj.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(err(format!("unsupported key {k:?} (kvc reads {})", KNOWN_KEYS.join(", "))));
        }
        match obj.get("fmt").and_then(Value::as_str) {
            None | Some("e4m3") => {}
            Some(other) => return Err(err(format!("fmt {other:?}: only e4m3 weights are implemented"))),
        }
        match obj.get("activation_scheme").and_then(Value::as_str) {
            None | Some("dynamic") => {}
            Some(other) => {
                return Err(err(format!(
                    "activation_scheme {other:?}: only \"dynamic\" (no activation scales in the checkpoint) is implemented"
                )))
            }
        }
        let block = obj
            .get("weight_block_size")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
            .filter(|&(r, c)| r > 0 && c > 0)
            .ok_or_else(|| {
                err(format!(
                    "weight_block_size must be two positive integers (per-tensor and per-channel FP8 are not implemented), got {}",
                    obj.get("weight_block_size").map_or("nothing".to_string(), Value::to_string)
                ))
            })?;
        Ok(Self { block })
    }

    /// The name of `weight`'s scales.
    pub fn scale_name(weight: &str) -> String {
        format!("{weight}_scale_inv")
    }

    /// `q * scale` per block, for `q: [N, K]` (FP8, any device) and
    /// `scale: [ceil(N / bn), ceil(K / bk)]`: f32 `[N, K]` on the CPU.
    pub fn dequantize(&self, name: &str, q: &Tensor, scale: &Tensor) -> Result<Tensor, ModelError> {
        let err = |m: String| ModelError::Weights(format!("{name}: {m}"));
        let (rows, cols) =
            q.dims2().map_err(|_| err(format!("an FP8 weight of shape {:?}: only 2-D weights are implemented", q.shape())))?;
        let (br, bc) = self.block;
        let want = (rows.div_ceil(br), cols.div_ceil(bc));
        if scale.dims2().ok() != Some(want) {
            return Err(err(format!(
                "{} has shape {:?}, but {rows}x{cols} in {br}x{bc} blocks needs {want:?}",
                Self::scale_name(name),
                scale.shape()
            )));
        }
        let c = |e: candle_core::Error| err(e.to_string());
        let q = q.to_device(&Device::Cpu).map_err(c)?.to_dtype(DType::F32).map_err(c)?;
        let s = scale.to_device(&Device::Cpu).map_err(c)?.to_dtype(DType::F32).map_err(c)?;
        // Each scale over its block: [sr, sc] -> [sr, br, sc, bc] -> [sr br, sc bc], cut to [N, K].
        let full = s
            .reshape((want.0, 1, want.1, 1))
            .and_then(|t| t.broadcast_as((want.0, br, want.1, bc)))
            .and_then(|t| t.reshape((want.0 * br, want.1 * bc)))
            .and_then(|t| t.narrow(0, 0, rows))
            .and_then(|t| t.narrow(1, 0, cols))
            .map_err(c)?;
        (q * full).map_err(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_official_config_reads_and_what_would_change_the_answer_is_refused_by_name() {
        let ok = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
        assert_eq!(BlockFp8::from_config(&ok).unwrap().block, (128, 128));
        let minimal = json!({"quant_method": "fp8", "weight_block_size": [8, 12], "modules_to_not_convert": ["lm_head"]});
        assert_eq!(BlockFp8::from_config(&minimal).unwrap().block, (8, 12));
        for (bad, word) in [
            (json!({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}), "e5m2"),
            (json!({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}), "static"),
            (json!({"quant_method": "fp8"}), "weight_block_size"),
            (json!({"quant_method": "fp8", "weight_block_size": [128]}), "weight_block_size"),
            (json!({"quant_method": "fp8", "weight_block_size": [0, 128]}), "weight_block_size"),
            (json!({"quant_method": "fp8", "weight_block_size": [128, 128], "kv_cache_scheme": {}}), "kv_cache_scheme"),
        ] {
            let e = BlockFp8::from_config(&bad).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
    }

    #[test]
    fn each_scale_covers_its_block_including_partial_ones() {
        let fp8 = BlockFp8 { block: (2, 3) };
        // 3 x 4 ones in FP8: blocks [0..2, 0..3], [0..2, 3..4], [2..3, 0..3], [2..3, 3..4].
        let q = Tensor::ones((3, 4), DType::F32, &Device::Cpu).unwrap().to_dtype(DType::F8E4M3).unwrap();
        let s = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
        let w = fp8.dequantize("w", &q, &s).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(w, vec![vec![1., 1., 1., 2.], vec![1., 1., 1., 2.], vec![3., 3., 3., 4.]]);
        let bad = Tensor::ones((1, 2), DType::F32, &Device::Cpu).unwrap();
        let e = fp8.dequantize("w", &q, &bad).unwrap_err().to_string();
        assert!(e.contains("w_scale_inv") && e.contains("(2, 2)"), "{e}");
    }
}
