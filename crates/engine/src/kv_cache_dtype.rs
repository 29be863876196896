//! What the KV pool stores (`--kv-cache-dtype`, vLLM's flag): the compute
//! dtype, bf16, or FP8 (e4m3 with a scale per layer, 1.0 as vLLM takes it
//! when the checkpoint has none). An FP8 cache holds a block in half of
//! bf16's bytes (a quarter of f32's), so the same memory keeps twice the
//! sessions resident, and the host tier, the snapshot store and the P/D
//! transfers move half the bytes: they all copy blocks as bytes of the
//! pool's layout, whose dtype the P/D handshake compares.

use candle_core::{DType, Device};

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

    /// The pool's dtype for a model computing in `compute` on `device`.
    /// kvc's CUDA kernels read and write the cache in the compute dtype
    /// (bf16), so a GPU pool of another dtype is refused by name.
    pub fn resolve(self, compute: DType, device: &Device) -> Result<DType, EngineError> {
        let dtype = match self {
            Self::Auto => compute,
            Self::Bf16 => DType::BF16,
            Self::Fp8E4m3 => DType::F8E4M3,
        };
        if !device.is_cpu() && dtype != compute {
            return Err(EngineError::Load(format!(
                "--kv-cache-dtype {self:?} ({dtype:?}) on {device:?}: kvc's CUDA attention and KV kernels read and write the cache \
                 in the compute dtype {compute:?} only (an FP8 cache on the GPU is not implemented yet); use --kv-cache-dtype auto"
            )));
        }
        Ok(dtype)
    }
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
    fn the_cpu_stores_any_of_them_and_auto_is_the_compute_dtype() {
        let cpu = Device::Cpu;
        assert_eq!(KvCacheDtype::Auto.resolve(DType::F32, &cpu).unwrap(), DType::F32);
        assert_eq!(KvCacheDtype::Bf16.resolve(DType::F32, &cpu).unwrap(), DType::BF16);
        assert_eq!(KvCacheDtype::Fp8E4m3.resolve(DType::BF16, &cpu).unwrap(), DType::F8E4M3);
    }
}
