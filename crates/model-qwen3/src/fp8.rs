//! Block-FP8 checkpoints (`quant_method: fp8`, as the official Qwen3-*-FP8
//! and DeepSeek-V3 checkpoints ship them and transformers'
//! `FineGrainedFP8Config` writes them): a linear layer's weight `[N, K]`
//! stored as `float8_e4m3fn`, with `weight_scale_inv` `[ceil(N / bn),
//! ceil(K / bk)]` beside it, one f32 (or bf16) scale per `bn x bk` block,
//! and `W = q * scale` (the "inverse" of the scale the quantizer divided
//! by). Layers the checkpoint keeps unquantized (embeddings, norms, the
//! router, the LM head) are stored plainly and load as before.
//!
//! On the CPU path (and on GPUs without sm90 CUTLASS, or with
//! `KVC_FP8_GEMM=dequantize`) kvc dequantizes such weights at load into the
//! compute dtype: the answers are the checkpoint's, but the weights take
//! the compute dtype's memory. On the CUDA path with the FP8 GEMMs
//! (cuda/fp8_linear.rs) they stay e4m3 in GPU memory with their scales,
//! where their shape fits the kernels ([`BlockFp8::gemm_fit`]). Anything
//! else in `quantization_config` that would change the answer (static
//! activation scales, another format, a KV cache scheme) is refused by
//! name; the FP8 KV cache scales a checkpoint stores as tensors are
//! kv_scales.rs's.

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::ModelError;

/// A block-FP8 `quantization_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFp8 {
    /// Rows (output features) and columns (input features) a scale covers.
    pub block: (usize, usize),
}

/// e4m3's largest finite value.
pub const E4M3_MAX: f32 = 448.0;

/// The block the FP8 GEMMs take (cutlass-sys's fp8.rs: 128x128 weight
/// blocks, activations in 128-wide groups).
pub const GEMM_BLOCK: usize = 128;

/// The blocks `--quantization fp8` quantizes a plain checkpoint's weights
/// in at load ([`stored_in_fp8`]'s tensors): the official checkpoints'
/// 128x128, the FP8 GEMMs' own.
pub const AT_LOAD: BlockFp8 = BlockFp8 { block: (GEMM_BLOCK, GEMM_BLOCK) };

/// Whether a block-FP8 checkpoint stores tensor `name` in FP8, as Qwen's
/// official checkpoints and transformers' `FineGrainedFP8Config` do: the
/// decoder layers' linear projections (attention, dense MLP, each expert's
/// or the fused experts'); never the embeddings, norms, router or LM head.
pub fn stored_in_fp8(name: &str) -> bool {
    name.starts_with("model.layers.")
        && (name.ends_with("_proj.weight") || name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj"))
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

    /// `q * scale` per block, for `q: [.., N, K]` (FP8, any device) and
    /// `scale: [.., ceil(N / bn), ceil(K / bk)]`: f32 `[.., N, K]` on the
    /// CPU (a leading dim: fused experts, each its own blocks).
    pub fn dequantize(&self, name: &str, q: &Tensor, scale: &Tensor) -> Result<Tensor, ModelError> {
        let err = |m: String| ModelError::Weights(format!("{name}: {m}"));
        let dims = q.dims();
        if dims.len() < 2 {
            return Err(err(format!("an FP8 weight of shape {:?}: it takes [.., N, K]", q.shape())));
        }
        let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let batch = dims[..dims.len() - 2].iter().product::<usize>();
        let (br, bc) = self.block;
        let (sr, sc) = (rows.div_ceil(br), cols.div_ceil(bc));
        let mut want = dims[..dims.len() - 2].to_vec();
        want.extend([sr, sc]);
        if scale.dims() != want.as_slice() {
            return Err(err(format!(
                "{} has shape {:?}, but {:?} in {br}x{bc} blocks needs {want:?}",
                Self::scale_name(name),
                scale.shape(),
                q.shape()
            )));
        }
        let c = |e: candle_core::Error| err(e.to_string());
        let q = q.to_device(&Device::Cpu).map_err(c)?.to_dtype(DType::F32).map_err(c)?;
        let s = scale.to_device(&Device::Cpu).map_err(c)?.to_dtype(DType::F32).map_err(c)?;
        // Each scale over its block: [b, sr, sc] -> [b, sr, br, sc, bc] -> [b, sr br, sc bc], cut to [b, N, K].
        let full = s
            .reshape((batch, sr, 1, sc, 1))
            .and_then(|t| t.broadcast_as((batch, sr, br, sc, bc)))
            .and_then(|t| t.reshape((batch, sr * br, sc * bc)))
            .and_then(|t| t.narrow(1, 0, rows))
            .and_then(|t| t.narrow(2, 0, cols))
            .and_then(|t| t.reshape(dims))
            .map_err(c)?;
        (q * full).map_err(c)
    }

    /// Whether the FP8 GEMMs take a weight of `k` columns made of row
    /// blocks `parts` (one for a plain projection; q|k|v or gate|up fused):
    /// 128x128 blocks, `k` a multiple of 128, the rows a multiple of 16,
    /// and every part but the last whole 128-row blocks (else the fused
    /// weight's scale rows would not line up with its rows). Err: why not.
    pub fn gemm_fit(&self, parts: &[usize], k: usize) -> Result<(), String> {
        let b = GEMM_BLOCK;
        if self.block != (b, b) {
            return Err(format!("block size {}x{} (the FP8 GEMMs take {b}x{b})", self.block.0, self.block.1));
        }
        if k % b != 0 {
            return Err(format!("k = {k} is not a multiple of {b}"));
        }
        let n: usize = parts.iter().sum();
        if n == 0 || n % 16 != 0 {
            return Err(format!("n = {n} is not a multiple of 16"));
        }
        if let Some((i, p)) = parts.iter().enumerate().take(parts.len().saturating_sub(1)).find(|(_, p)| *p % b != 0) {
            return Err(format!("fused part {i} has {p} rows, not whole {b}-row blocks"));
        }
        Ok(())
    }

    /// Quantizes `w: [.., N, K]` (f32 or bf16, any device) as block-FP8
    /// checkpoints are made (per block: scale = amax / 448, q = e4m3(w /
    /// scale); an all-zero block gets a tiny scale and zeros): the e4m3
    /// weight `[.., N, K]` and its f32 `weight_scale_inv` `[.., ceil(N /
    /// bn), ceil(K / bk)]`. Dummy weights for the FP8 path (weights.rs);
    /// candle has no e4m3 cast on CUDA, so there weights.rs quantizes with
    /// kvc's kernel (cuda::quantize_blocks) instead.
    pub fn quantize(&self, w: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let dims = w.dims().to_vec();
        if dims.len() < 2 {
            candle_core::bail!("block-FP8 quantization of a {}-D tensor: it takes [.., N, K]", dims.len());
        }
        let (n, k) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let batch = dims[..dims.len() - 2].iter().product::<usize>();
        let (br, bc) = self.block;
        let (sr, sc) = (n.div_ceil(br), k.div_ceil(bc));
        let w = w.to_dtype(DType::F32)?.reshape((batch, n, k))?;
        let w = if sr * br > n { w.pad_with_zeros(1, 0, sr * br - n)? } else { w };
        let w = if sc * bc > k { w.pad_with_zeros(2, 0, sc * bc - k)? } else { w };
        let blocks = w.reshape((batch, sr, br, sc, bc))?;
        let amax = blocks.abs()?.max_keepdim(4)?.max_keepdim(2)?; // [b, sr, 1, sc, 1]
        let scale = (amax.clamp(1e-12f32, f32::MAX)? / E4M3_MAX as f64)?;
        let q = blocks.broadcast_div(&scale)?.to_dtype(DType::F8E4M3)?.reshape((batch, sr * br, sc * bc))?;
        let q = q.narrow(1, 0, n)?.narrow(2, 0, k)?.contiguous()?.reshape(dims.as_slice())?;
        let mut sdims = dims[..dims.len() - 2].to_vec();
        sdims.extend([sr, sc]);
        Ok((q, scale.reshape(sdims)?))
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
    fn the_gemms_take_whole_blocks_and_say_why_not() {
        let fp8 = BlockFp8 { block: (128, 128) };
        // Qwen3-30B-A3B: q|k|v, o, gate|up of an expert, down.
        assert_eq!(fp8.gemm_fit(&[4096, 512, 512], 2048), Ok(()));
        assert_eq!(fp8.gemm_fit(&[2048], 4096), Ok(()));
        assert_eq!(fp8.gemm_fit(&[768, 768], 2048), Ok(()));
        assert_eq!(fp8.gemm_fit(&[2048], 768), Ok(()));
        // A last part need not be whole blocks; n a multiple of 16 is enough.
        assert_eq!(fp8.gemm_fit(&[256, 48], 128), Ok(()));
        for (parts, k, word) in
            [(&[256][..], 200, "k = 200"), (&[8][..], 128, "n = 8"), (&[200, 200][..], 128, "fused part 0 has 200 rows")]
        {
            let e = fp8.gemm_fit(parts, k).unwrap_err();
            assert!(e.contains(word), "{parts:?} x {k}: {e}");
        }
        let e = BlockFp8 { block: (64, 128) }.gemm_fit(&[256], 256).unwrap_err();
        assert!(e.contains("64x128"), "{e}");
    }

    #[test]
    fn quantizing_then_dequantizing_is_within_e4m3_rounding_of_each_block() {
        let fp8 = BlockFp8 { block: (4, 8) };
        // Two "experts" of 6 x 10: partial blocks on both axes, one all-zero block.
        let mut v: Vec<f32> = (0..120).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 * (1 + i % 7) as f32).collect();
        for r in 4..6 {
            for c in 8..10 {
                v[r * 10 + c] = 0.0;
            }
        }
        let w = Tensor::from_vec(v.clone(), (2, 6, 10), &Device::Cpu).unwrap();
        let v = &v;
        let (q, s) = fp8.quantize(&w).unwrap();
        assert_eq!((q.dtype(), q.dims(), s.dims()), (DType::F8E4M3, &[2, 6, 10][..], &[2, 2, 2][..]));
        // Both experts at once equal each one alone.
        let all = fp8.dequantize("w", &q, &s).unwrap();
        for e in 0..2 {
            let back = fp8.dequantize("w", &q.get(e).unwrap(), &s.get(e).unwrap()).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(all.get(e).unwrap().to_vec2::<f32>().unwrap(), back, "expert {e}");
            for r in 0..6 {
                for c in 0..10 {
                    let x = v[e * 60 + r * 10 + c];
                    // The block's amax, from the host.
                    let amax = (r / 4 * 4..(r / 4 * 4 + 4).min(6))
                        .flat_map(|i| (c / 8 * 8..(c / 8 * 8 + 8).min(10)).map(move |j| v[e * 60 + i * 10 + j].abs()))
                        .fold(0f32, f32::max);
                    // e4m3 rounds to 3 mantissa bits: within 2^-4 of |x| <= amax.
                    assert!((back[r][c] - x).abs() <= amax / 16.0 + 1e-6, "[{e}, {r}, {c}]: {x} -> {}", back[r][c]);
                }
            }
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
        assert!(e.contains("w_scale_inv") && e.contains("[2, 2]"), "{e}");
    }
}
