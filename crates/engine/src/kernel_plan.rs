//! The GPU kernels a worker runs: `kvc_policy::kernel_plan` decides them
//! once, when the model loads, from the configuration's request (the
//! environment read once at start, [`request_from_env`]) and what the
//! device can run; the plan is logged once and handed to the model's
//! kernels before the model is built.

use candle_core::Device;
use kvc_policy::kernel_plan::{KernelRequest, KERNEL_ENV_VARS};

use crate::error::EngineError;

/// The request the environment makes (`KVC_ATTENTION_BACKEND`,
/// `KVC_DECODE_KERNEL`, `KVC_MOE_GEMM`, `KVC_MOE_SMALL_PAIRS`,
/// `KVC_FP8_GEMM`, `KVC_FP8_ATTENTION`, `KVC_FP8_ATTENTION_MIN_TOKENS`,
/// `KVC_FP8_DENSE_SWAP_ROWS`); a
/// value kvc does not know is an error naming the variable.
pub fn request_from_env() -> Result<KernelRequest, EngineError> {
    KernelRequest::from_vars(|k| std::env::var(k).ok()).map_err(EngineError::Load)
}

/// Decides the plan for `device` and sets it for the models built from now
/// on. A CPU runs candle's kernels: nothing to decide, but a request is
/// still checked (it names GPU kernels a CPU worker would ignore).
pub fn apply(request: &KernelRequest, device: &Device) -> Result<(), EngineError> {
    if device.is_cpu() {
        if *request != KernelRequest::default() {
            tracing::warn!(vars = ?KERNEL_ENV_VARS, "GPU kernel choices are set but the model runs on the CPU: ignored");
        }
        return Ok(());
    }
    apply_gpu(request)
}

#[cfg(feature = "cuda")]
fn apply_gpu(request: &KernelRequest) -> Result<(), EngineError> {
    use kvc_model_qwen3::cuda as k;
    use kvc_policy::kernel_plan::{decide_kernel_plan, DecodeKernel, Fp8Weights, KernelFacts, MoeGemm, PrefillAttention};

    let facts = KernelFacts { cutlass: k::cutlass_runs(), fp8_gemm: k::fp8_gemm_runs() };
    let d = decide_kernel_plan(request, &facts).map_err(EngineError::Load)?;
    let p = d.plan;
    let [(_, attention), (_, decode), (_, gemm), (_, small), (_, fp8), (_, fp8_reason), (_, fp8_attention), (_, swap_rows)] = d.terms();
    kvc_policy::log_decision(&d.decision());
    tracing::info!(
        reason = d.reason.as_str(),
        prefill_attention = %attention,
        decode_kernel = %decode,
        moe_gemm = %gemm,
        moe_small_pairs = %small,
        fp8_weights = %fp8,
        fp8_weights_reason = %fp8_reason,
        fp8_attention = %fp8_attention,
        fp8_dense_swap_rows = %swap_rows,
        fp8_gemm_unavailable = facts.fp8_gemm.as_ref().err().map(String::as_str).unwrap_or(""),
        "kernel plan"
    );
    match p.prefill_attention {
        PrefillAttention::Cudnn => k::PrefillBackend::Cudnn,
        PrefillAttention::CudnnPaged => k::PrefillBackend::CudnnPaged,
        PrefillAttention::Kvc => k::PrefillBackend::Kvc,
    }
    .set_current();
    k::set_decode_kernel_v1(p.decode_kernel == DecodeKernel::V1);
    k::set_moe_gemm(match p.moe_gemm {
        MoeGemm::Cutlass => k::MoeGemm::Cutlass(None),
        MoeGemm::CutlassRows => k::MoeGemm::Cutlass(Some(k::CutlassTiling::Rows)),
        MoeGemm::CutlassSwap => k::MoeGemm::Cutlass(Some(k::CutlassTiling::Swap)),
        MoeGemm::Cublas => k::MoeGemm::Cublas,
        MoeGemm::Kvc => k::MoeGemm::Kvc,
    });
    k::set_moe_small_pairs(p.moe_small_pairs);
    k::set_fp8_weights(p.fp8_weights == Fp8Weights::Fp8);
    k::set_fp8_attention_bounds(p.fp8_attention);
    k::set_fp8_dense_swap_rows(p.fp8_dense_swap_rows);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn apply_gpu(_request: &KernelRequest) -> Result<(), EngineError> {
    Ok(())
}
