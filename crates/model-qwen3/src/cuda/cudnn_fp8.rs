//! The FP8 pieces of cuDNN's prefill attention (cudnn_attention.rs) over
//! an e4m3 pool: from how many prompt tokens a step takes the route (its
//! bounds and kvc-policy's `fp8_attention` decision), Q's static scale
//! ([`q_absmax`]) and its quantization, and O in e4m3 ([`E4m3Output`]):
//! widened to bf16 or handed to an FP8 o_proj as it is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use candle_core::{bail, DType, Result, Tensor};
use kvc_policy::fp8_attention::{decide_fp8_attention, Fp8Attention, Fp8AttentionBounds, Fp8AttentionInputs};
use kvc_policy::log_decision;

use super::{cuda_dev, empty, grid1, launch, ptr, Kernels};
use crate::batch::SeqChunk;

/// Prompt tokens a step needs in its fresh chunks before cuDNN's FP8
/// attention pays for its passes, per kind of step (kvc-policy's measured
/// defaults).
pub const DEFAULT_FP8_BOUNDS: Fp8AttentionBounds = Fp8AttentionBounds::DEFAULT;

/// FP8 attention bounds that can change under readers (None: the route off).
pub(super) struct Fp8Bounds(Mutex<Option<Fp8AttentionBounds>>);

impl Fp8Bounds {
    pub(super) const fn new(b: Option<Fp8AttentionBounds>) -> Self {
        Self(Mutex::new(b))
    }

    pub(super) fn get(&self) -> Option<Fp8AttentionBounds> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set(&self, b: Option<Fp8AttentionBounds>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = b;
    }
}

/// The bounds of the handles opened from now on.
static FP8_BOUNDS: Fp8Bounds = Fp8Bounds::new(Some(DEFAULT_FP8_BOUNDS));

/// From how many prompt tokens in a step plans over an FP8 pool take
/// cuDNN's FP8 attention; None: never. The engine's kernel plan sets it
/// (`KVC_FP8_ATTENTION`, `KVC_FP8_ATTENTION_MIN_TOKENS`); unset,
/// [`DEFAULT_FP8_BOUNDS`].
pub fn fp8_attention_bounds() -> Option<Fp8AttentionBounds> {
    FP8_BOUNDS.get()
}

/// Sets [`fp8_attention_bounds`] for the cuDNN handles opened from now
/// on (a model's at load; the kernel plan, tests and benchmarks).
pub fn set_fp8_attention_bounds(b: Option<Fp8AttentionBounds>) {
    FP8_BOUNDS.set(b);
}

static E4M3_IO_PLANS: AtomicU64 = AtomicU64::new(0);

/// Plans so far whose every row was on the FP8 route (e4m3 Q from RoPE, e4m3
/// O into o_proj: [`CudnnPlan::fp8_row_count`] covering the batch).
pub fn e4m3_io_plans() -> u64 {
    E4M3_IO_PLANS.load(Ordering::Relaxed)
}

pub(super) fn count_e4m3_io_plan() {
    E4M3_IO_PLANS.fetch_add(1, Ordering::Relaxed);
}

/// Whether a step's cuDNN sequences over an FP8 pool take the FP8 route
/// (kvc-policy's `fp8_attention` decision, logged and counted), before
/// cuDNN is asked for the graph; `whole_step`: they are every row of the step.
pub(super) fn fp8_route(seqs: &[&SeqChunk], whole_step: bool, head_dim: usize, bounds: Option<Fp8AttentionBounds>) -> bool {
    let d = decide_fp8_attention(&Fp8AttentionInputs {
        bounds,
        head_dim,
        fresh: seqs.iter().all(|s| s.context_len == s.len),
        whole_step,
        tokens: seqs.iter().map(|s| s.len).sum(),
    });
    log_decision(&d);
    d.reason.route() == Fp8Attention::Fp8
}

/// A bound on every element of a layer's queries, for their static e4m3
/// scale: q_norm's output is at most sqrt(head_dim) x max |weight| in each
/// element (a normalised vector's element is at most sqrt(n) times its
/// RMS), RoPE rotates pairs of elements (a pair's length is at most that
/// bound too) and scales by `rope_scale` (YaRN's attention factor).
pub fn q_absmax(head_dim: usize, q_norm_absmax: f32, rope_scale: f32) -> f32 {
    (head_dim as f32).sqrt() * q_norm_absmax * rope_scale.abs().max(1.0)
}

/// `q_absmax` where it can scale Q.
pub(super) fn checked_q_absmax(q_absmax: Option<f32>) -> Result<f32> {
    match q_absmax.filter(|m| m.is_finite() && *m > 0.0) {
        Some(m) => Ok(m),
        None => bail!("cuDNN's FP8 attention needs a bound on |q| (PagedAttention::q_absmax), got {q_absmax:?}"),
    }
}

/// `q8 = e4m3(q x inv)` for bf16 `q` (elements a multiple of 8) into u8
/// `q8` of as many elements: cuDNN's FP8 attention's Q.
pub fn quantize_q(k: &Kernels, q: &Tensor, q8: &Tensor, inv: f32) -> Result<()> {
    let n = q.elem_count();
    if q.dtype() != DType::BF16 || q8.dtype() != DType::U8 || q8.elem_count() != n || n % 8 != 0 {
        bail!("e4m3 Q: bf16 {:?} into u8 {:?} (elements a multiple of 8)", q.shape(), q8.shape());
    }
    launch!(k.bf16_to_e4m3, grid1(n / 8, 256); &[], ptr(q)?, ptr(q8)?, (n / 8) as u64, inv)
}

/// cuDNN's FP8 attention output: O of the plan's rows in e4m3, worth
/// `scales[9]` (a device float: O's scale comes from V's amax) a unit.
pub struct E4m3Output {
    /// u8 `[tokens, nh * hd]`: the plan's rows written.
    pub o: Tensor,
    /// cuDNN's eight floats (`Fp8Scales`), V's largest e4m3 byte
    /// (`e4m3_amax`) and the factor that widens O (`fp8_o_scale`).
    pub(super) scales: Tensor,
    /// The token rows cuDNN writes.
    pub(super) rows: Tensor,
    pub(super) row_count: usize,
}

impl E4m3Output {
    /// The device address of O's widening factor.
    fn widen_ptr(&self) -> Result<u64> {
        Ok(ptr(&self.scales)? + 9 * 4)
    }

    /// O's rows widened into those rows of bf16 `out` (same shape as `o`).
    pub fn widen_into(&self, k: &Kernels, out: &Tensor) -> Result<()> {
        let row = out.dim(1)?;
        if self.row_count == 0 {
            return Ok(());
        }
        launch!(
            k.e4m3_rows_to_bf16,
            grid1(self.row_count * row / 16, 256); &[],
            ptr(&self.o)?,
            ptr(&self.rows)?,
            self.row_count as i32,
            row as i32,
            self.widen_ptr()?,
            ptr(out)?
        )
    }

    /// O widened to bf16 `[tokens, nh * hd]` (a plan covering every row).
    pub fn to_bf16(&self, k: &Kernels) -> Result<Tensor> {
        let out = empty(cuda_dev(self.o.device())?, self.o.dims(), DType::BF16)?;
        self.widen_into(k, &out)?;
        Ok(out)
    }

    /// O's scale spread over `[tokens, nh * hd / group]` f32: the per-token,
    /// per-group activation scales an FP8 GEMM takes, all equal here.
    pub fn group_scales(&self, k: &Kernels, group: usize) -> Result<Tensor> {
        let (t, row) = self.o.dims2()?;
        let s = empty(cuda_dev(self.o.device())?, (t, row.div_ceil(group)), DType::F32)?;
        let n = s.elem_count();
        if n > 0 {
            launch!(k.fill_from, grid1(n, 256); &[], self.widen_ptr()?, ptr(&s)?, n as u64)?;
        }
        Ok(s)
    }
}

/// What an FP8 run adds: O with its scales, and V's layer scale.
pub(super) struct Fp8Operands<'a> {
    pub(super) out: &'a E4m3Output,
    pub(super) v_scale: f32,
}

impl Fp8Operands<'_> {
    /// Scale O from the largest of V's `n` gathered e4m3 bytes `v`.
    pub(super) fn scale_o_from(&self, k: &Kernels, v: &Tensor, n: usize) -> Result<()> {
        let amax = ptr(&self.out.scales)? + 8 * 4;
        if n > 0 {
            launch!(k.e4m3_amax, grid1(n / 16, 256); &[], ptr(v)?, (n / 16) as u64, amax)?;
        }
        launch!(k.fp8_o_scale, grid1(1, 32); &[], ptr(&self.out.scales)?, self.v_scale)
    }
}
