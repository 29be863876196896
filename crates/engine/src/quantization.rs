//! Weights quantized at load (`--quantization`, vLLM's flag): `fp8`
//! quantizes a plain (bf16 / f16 / f32) checkpoint's decoder projections
//! to block FP8 as they are read, in 128x128 blocks with a scale each, as
//! Qwen's official FP8 checkpoints are made, so a GPU serves them on the
//! FP8 GEMMs with half the weight bytes and the CPU serves the same
//! quantized values. A checkpoint already in block FP8 needs no flag and
//! keeps its own scales under it. vLLM's other methods are refused by name.

use kvc_model_qwen3::fp8::{BlockFp8, AT_LOAD};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantization {
    /// The checkpoint's weights as they are stored (block-FP8 ones included).
    #[default]
    None,
    /// Block FP8 at load ([`AT_LOAD`]'s blocks).
    Fp8,
}

impl Quantization {
    /// vLLM's spellings: `fp8`; every other method vLLM knows is refused
    /// by name, anything else as unknown.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "fp8" => Ok(Self::Fp8),
            "none" => Ok(Self::None),
            "awq" | "awq_marlin" | "gptq" | "gptq_marlin" | "gptq_marlin_24" | "bitsandbytes" | "gguf" | "compressed-tensors"
            | "modelopt" | "modelopt_fp4" | "fbgemm_fp8" | "ptpc_fp8" | "fp_quant" | "experts_int8" | "marlin" | "deepspeedfp"
            | "tpu_int8" | "ipex" | "quark" | "moe_wna16" | "torchao" | "inc" | "mxfp4" | "petit_nvfp4" | "hqq" => Err(format!(
                "--quantization {s} is not implemented; kvc quantizes at load to block FP8 (--quantization fp8), and serves \
                 block-FP8 checkpoints (quant_method fp8) as they are"
            )),
            other => Err(format!("--quantization {other:?}: expected fp8 (or none)")),
        }
    }

    /// The blocks the model loader quantizes in, if any.
    pub fn at_load(self) -> Option<BlockFp8> {
        match self {
            Self::None => None,
            Self::Fp8 => Some(AT_LOAD),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_is_taken_and_the_methods_kvc_lacks_are_refused_by_name() {
        let blocks = |s: &str| Quantization::parse(s).map(|q| q.at_load().map(|b| b.block));
        assert_eq!((blocks("fp8"), blocks("none")), (Ok(Some((128, 128))), Ok(None)));
        assert_eq!(Quantization::default(), Quantization::None);
        for m in ["awq", "gptq", "bitsandbytes", "compressed-tensors", "modelopt"] {
            let e = Quantization::parse(m).unwrap_err();
            assert!(e.contains(&format!("--quantization {m} is not implemented")) && e.contains("fp8"), "{m}: {e}");
        }
        let e = Quantization::parse("int3").unwrap_err();
        assert!(e.contains("\"int3\"") && e.contains("expected fp8"), "{e}");
    }
}
