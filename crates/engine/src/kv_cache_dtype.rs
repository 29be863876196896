//! What the KV pool stores (`--kv-cache-dtype`, vLLM's flag): the compute
//! dtype, bf16, or FP8 (e4m3 with a scale per layer, 1.0 as vLLM takes it
//! when the checkpoint has none). An FP8 cache holds a block in half of
//! bf16's bytes (a quarter of f32's), so the same memory keeps twice the
//! sessions resident, and the host tier, the snapshot store and the P/D
//! transfers move half the bytes: they all copy blocks as bytes of the
//! pool's layout, whose dtype the P/D handshake compares.

use candle_core::{DType, Device};
use kvc_kv_pool::KvStorage;

use crate::EngineError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The model's compute dtype.
    #[default]
    Auto,
    Bf16,
    /// e4m3 (`fp8`, `fp8_e4m3`).
    Fp8E4m3,
}

impl KvCacheDtype {
    /// vLLM's spellings; the ones kvc does not implement are refused by name.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "fp8" | "fp8_e4m3" => Ok(Self::Fp8E4m3),
            "fp8_e5m2" | "fp8_inc" | "fp8_ds_mla" => {
                Err(format!("--kv-cache-dtype {s} is not implemented; kvc stores fp8 as e4m3 (fp8, fp8_e4m3), or auto / bf16"))
            }
            other => Err(format!("--kv-cache-dtype {other:?}: expected auto, bf16 (bfloat16) or fp8 (fp8_e4m3)")),
        }
    }

    /// The pool's dtype for a model computing in `compute` on `device`
    /// with heads of `head_dim`. kvc's CUDA kernels read and write a bf16
    /// cache or an e4m3 one (in 16-byte rows: head_dim % 16 == 0); any
    /// other GPU pool is refused by name.
    pub fn resolve(self, compute: DType, head_dim: usize, device: &Device) -> Result<DType, EngineError> {
        let dtype = match self {
            Self::Auto => compute,
            Self::Bf16 => DType::BF16,
            Self::Fp8E4m3 => DType::F8E4M3,
        };
        if device.is_cpu() {
            return Ok(dtype);
        }
        let refuse = |why: String| EngineError::Load(format!("--kv-cache-dtype {self:?} ({dtype:?}) on {device:?}: {why}"));
        match dtype {
            DType::F8E4M3 if head_dim % 16 != 0 => Err(refuse(format!(
                "kvc's CUDA kernels read an FP8 cache in rows of 16 elements; head_dim {head_dim} is not a multiple of 16"
            ))),
            DType::F8E4M3 => Ok(dtype),
            _ if dtype != compute => Err(refuse(format!(
                "kvc's CUDA attention and KV kernels read and write the cache in the compute dtype {compute:?} or in fp8 (e4m3)"
            ))),
            _ => Ok(dtype),
        }
    }
}

/// Where an FP8 cache's per-layer scales came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvScales {
    /// The checkpoint's `k_scale` / `v_scale` (model-qwen3's kv_scales.rs).
    Checkpoint,
    /// 1.0: the checkpoint has none (vLLM's default).
    One,
    /// The cache is not FP8: scales are not used (vLLM ignores a
    /// checkpoint's then too).
    Unused,
}

/// Gives `storage` the checkpoint's KV scales (`checkpoint`, per layer)
/// when it is an FP8 cache, and says where its scales came from.
pub fn apply_kv_scales(checkpoint: Option<&[(f32, f32)]>, storage: &mut KvStorage) -> Result<KvScales, EngineError> {
    if storage.layout().dtype != DType::F8E4M3 {
        return Ok(KvScales::Unused);
    }
    let Some(scales) = checkpoint else { return Ok(KvScales::One) };
    storage.set_kv_scales(scales.to_vec()).map_err(|e| EngineError::Load(format!("the checkpoint's KV cache scales: {e}")))?;
    Ok(KvScales::Checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_spellings_parse_and_the_others_are_refused_by_name() {
        assert_eq!(KvCacheDtype::parse("auto"), Ok(KvCacheDtype::Auto));
        assert_eq!(KvCacheDtype::parse("bfloat16"), Ok(KvCacheDtype::Bf16));
        assert_eq!(KvCacheDtype::parse("fp8"), Ok(KvCacheDtype::Fp8E4m3));
        assert_eq!(KvCacheDtype::parse("fp8_e4m3"), Ok(KvCacheDtype::Fp8E4m3));
        assert!(KvCacheDtype::parse("fp8_e5m2").unwrap_err().contains("fp8_e5m2"));
        assert!(KvCacheDtype::parse("int4").unwrap_err().contains("int4"));
    }

    #[test]
    fn a_checkpoints_scales_go_to_an_fp8_cache_only() {
        let layout = |dtype| kvc_kv_pool::KvLayout { num_layers: 2, num_kv_heads: 1, head_dim: 8, block_size: 4, dtype };
        let scales = [(0.5, 2.0), (4.0, 0.25)];
        let mut fp8 = KvStorage::new(layout(DType::F8E4M3), 2).unwrap();
        assert_eq!(apply_kv_scales(Some(&scales), &mut fp8).unwrap(), KvScales::Checkpoint);
        assert_eq!((fp8.kv_scales(0), fp8.kv_scales(1)), (scales[0], scales[1]));
        let mut plain = KvStorage::new(layout(DType::F8E4M3), 2).unwrap();
        assert_eq!(apply_kv_scales(None, &mut plain).unwrap(), KvScales::One);
        assert_eq!((plain.kv_scales(0), plain.kv_scales(1)), ((1.0, 1.0), (1.0, 1.0)));
        let mut bf16 = KvStorage::new(layout(DType::BF16), 2).unwrap();
        assert_eq!(apply_kv_scales(Some(&scales), &mut bf16).unwrap(), KvScales::Unused);
        let e = apply_kv_scales(Some(&scales[..1]), &mut fp8).unwrap_err().to_string();
        assert!(e.contains("KV cache scales") && e.contains("2 layers"), "{e}");
    }

    #[test]
    fn the_cpu_stores_any_of_them_and_auto_is_the_compute_dtype() {
        let cpu = Device::Cpu;
        assert_eq!(KvCacheDtype::Auto.resolve(DType::F32, 8, &cpu).unwrap(), DType::F32);
        assert_eq!(KvCacheDtype::Bf16.resolve(DType::F32, 8, &cpu).unwrap(), DType::BF16);
        assert_eq!(KvCacheDtype::Fp8E4m3.resolve(DType::BF16, 8, &cpu).unwrap(), DType::F8E4M3);
    }
}
