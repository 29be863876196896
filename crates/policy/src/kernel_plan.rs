//! Which GPU kernels serve a worker's forward passes, by
//! [`decide_kernel_plan`]: decided once when the model loads, logged once,
//! and kept in the engine's configuration instead of being read from the
//! environment by each kernel.
//!
//! The request ([`KernelRequest`]) is what the operator asked for: each
//! choice unset (the measured default) or forced, for A/B runs and for
//! working around a kernel on a machine where it misbehaves. The five
//! environment variables that set it are read once, at start, by
//! [`KernelRequest::from_vars`]; a value kvc does not know is an error
//! naming the variable, never a silent default. The facts
//! ([`KernelFacts`]) are what the device can run. The plan is the request
//! resolved against the facts: CUTLASS's Hopper expert GEMMs where they
//! run, cuBLAS's grouped GEMM where they do not, and a forced CUTLASS
//! route on a device without them refused; a block-FP8 checkpoint's
//! weights kept in FP8 for CUTLASS's FP8 GEMMs where they run, else (or
//! when `KVC_FP8_GEMM=dequantize` asks) dequantized at load; cuDNN's FP8
//! attention over an FP8 KV cache from a measured prompt-token count
//! (`KVC_FP8_ATTENTION=0|1`, `KVC_FP8_ATTENTION_MIN_TOKENS`; each step's
//! route is then [`crate::fp8_attention`]'s decision).

use crate::fp8_attention::Fp8AttentionBounds;

/// The route for prefill-shaped attention (`KVC_ATTENTION_BACKEND`, as
/// vLLM's `VLLM_ATTENTION_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefillAttention {
    /// cuDNN over K/V gathered from the pool into contiguous buffers (the default).
    Cudnn,
    /// cuDNN reading K/V in place through page tables.
    CudnnPaged,
    /// kvc's own kernels for everything.
    Kvc,
}

/// The decode attention kernel (`KVC_DECODE_KERNEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeKernel {
    /// `paged_decode2` (the default).
    V2,
    /// The previous kernel, `paged_decode` + `attn_combine`.
    V1,
}

/// The grouped GEMM of a mixture of experts (`KVC_MOE_GEMM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MoeGemm {
    /// CUTLASS's sm90 grouped GEMM, its tiling chosen per call.
    Cutlass,
    /// CUTLASS, always the rows tiling.
    CutlassRows,
    /// CUTLASS, always the swapped (small-batch) tiling.
    CutlassSwap,
    /// cuBLAS's grouped GEMM.
    Cublas,
    /// kvc's own kernel.
    Kvc,
}

/// How a block-FP8 checkpoint's weights are served (`KVC_FP8_GEMM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Gemm {
    /// FP8 in GPU memory with FP8 GEMMs where the device runs them, else
    /// dequantized at load (the default).
    Auto,
    /// Always dequantized at load into the compute dtype (for comparison).
    Dequantize,
}

impl Fp8Gemm {
    pub const ALL: [Fp8Gemm; 2] = [Fp8Gemm::Auto, Fp8Gemm::Dequantize];

    pub fn as_str(self) -> &'static str {
        match self {
            Fp8Gemm::Auto => "auto",
            Fp8Gemm::Dequantize => "dequantize",
        }
    }
}

/// What a block-FP8 checkpoint's quantized weights become at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Weights {
    /// e4m3 bytes plus their block scales in GPU memory, run by the FP8
    /// GEMMs (a layer whose shape they cannot take is still dequantized,
    /// and the load says which).
    Fp8,
    /// Dequantized into the compute dtype.
    Dequantized,
}

/// Why [`Fp8Weights`] is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8WeightsReason {
    /// Nothing was asked, and the device runs the FP8 GEMMs.
    Default,
    /// `KVC_FP8_GEMM=dequantize`.
    Requested,
    /// Nothing was asked, and the FP8 GEMMs do not run here.
    Unavailable,
}

impl Fp8Weights {
    pub fn as_str(self) -> &'static str {
        match self {
            Fp8Weights::Fp8 => "fp8",
            Fp8Weights::Dequantized => "dequantized",
        }
    }
}

impl Fp8WeightsReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Fp8WeightsReason::Default => "default",
            Fp8WeightsReason::Requested => "requested",
            Fp8WeightsReason::Unavailable => "fp8_gemm_unavailable",
        }
    }
}

impl PrefillAttention {
    pub const ALL: [PrefillAttention; 3] = [PrefillAttention::Cudnn, PrefillAttention::CudnnPaged, PrefillAttention::Kvc];

    pub fn as_str(self) -> &'static str {
        match self {
            PrefillAttention::Cudnn => "cudnn",
            PrefillAttention::CudnnPaged => "cudnn-paged",
            PrefillAttention::Kvc => "kvc",
        }
    }
}

impl DecodeKernel {
    pub const ALL: [DecodeKernel; 2] = [DecodeKernel::V2, DecodeKernel::V1];

    pub fn as_str(self) -> &'static str {
        match self {
            DecodeKernel::V2 => "v2",
            DecodeKernel::V1 => "v1",
        }
    }
}

impl MoeGemm {
    pub const ALL: [MoeGemm; 5] = [MoeGemm::Cutlass, MoeGemm::CutlassRows, MoeGemm::CutlassSwap, MoeGemm::Cublas, MoeGemm::Kvc];

    pub fn as_str(self) -> &'static str {
        match self {
            MoeGemm::Cutlass => "cutlass",
            MoeGemm::CutlassRows => "cutlass-rows",
            MoeGemm::CutlassSwap => "cutlass-swap",
            MoeGemm::Cublas => "cublas",
            MoeGemm::Kvc => "kvc",
        }
    }

    pub fn is_cutlass(self) -> bool {
        matches!(self, MoeGemm::Cutlass | MoeGemm::CutlassRows | MoeGemm::CutlassSwap)
    }
}

/// What the operator asked for; `None`: the measured default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelRequest {
    pub prefill_attention: Option<PrefillAttention>,
    pub decode_kernel: Option<DecodeKernel>,
    pub moe_gemm: Option<MoeGemm>,
    /// Most (token, expert) pairs the CUDA-core expert kernel takes before
    /// the grouped GEMM does (0: always the grouped GEMM).
    pub moe_small_pairs: Option<usize>,
    pub fp8_gemm: Option<Fp8Gemm>,
    /// Whether cuDNN's FP8 attention may run over an FP8 KV cache (`0|1`).
    pub fp8_attention: Option<bool>,
    /// From how many prompt tokens in a step it runs.
    pub fp8_attention_min_tokens: Option<usize>,
    /// Most tokens a dense FP8 projection takes on the swapped 64-row
    /// tiling before the 128-row one (0: never).
    pub fp8_dense_swap_rows: Option<usize>,
}

/// The environment variables [`KernelRequest::from_vars`] reads.
pub const KERNEL_ENV_VARS: [&str; 8] = [
    "KVC_ATTENTION_BACKEND",
    "KVC_DECODE_KERNEL",
    "KVC_MOE_GEMM",
    "KVC_MOE_SMALL_PAIRS",
    "KVC_FP8_GEMM",
    "KVC_FP8_ATTENTION",
    "KVC_FP8_ATTENTION_MIN_TOKENS",
    "KVC_FP8_DENSE_SWAP_ROWS",
];

/// `value` as one of `all` (by [`as_str`](PrefillAttention::as_str)), or
/// an error naming the variable and what it takes.
fn parse_choice<T: Copy>(var: &str, value: &str, all: &[T], name: impl Fn(T) -> &'static str) -> Result<T, String> {
    let v = value.trim();
    all.iter().copied().find(|c| name(*c) == v).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|c| name(*c)).collect();
        format!("{var}={value:?}: expected one of {}", names.join(", "))
    })
}

/// `value` as a count of `what`, or an error naming the variable.
fn parse_count(var: &str, value: &str, what: &str) -> Result<usize, String> {
    value.trim().parse::<usize>().map_err(|_| format!("{var}={value:?}: expected a number of {what}"))
}

impl KernelRequest {
    /// The request the environment makes, through `get` (a variable's value,
    /// None when unset; an empty value counts as unset).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let [attention, decode, gemm, small, fp8, fp8_attention, fp8_min, swap_rows] = KERNEL_ENV_VARS;
        Ok(Self {
            prefill_attention: var(attention)
                .map(|v| parse_choice(attention, &v, &PrefillAttention::ALL, PrefillAttention::as_str))
                .transpose()?,
            decode_kernel: var(decode).map(|v| parse_choice(decode, &v, &DecodeKernel::ALL, DecodeKernel::as_str)).transpose()?,
            moe_gemm: var(gemm).map(|v| parse_choice(gemm, &v, &MoeGemm::ALL, MoeGemm::as_str)).transpose()?,
            moe_small_pairs: var(small).map(|v| parse_count(small, &v, "(token, expert) pairs")).transpose()?,
            fp8_gemm: var(fp8).map(|v| parse_choice(fp8, &v, &Fp8Gemm::ALL, Fp8Gemm::as_str)).transpose()?,
            fp8_attention: var(fp8_attention)
                .map(|v| parse_choice(fp8_attention, &v, &[false, true], |on| if on { "1" } else { "0" }))
                .transpose()?,
            fp8_attention_min_tokens: var(fp8_min).map(|v| parse_count(fp8_min, &v, "prompt tokens")).transpose()?,
            fp8_dense_swap_rows: var(swap_rows).map(|v| parse_count(swap_rows, &v, "tokens")).transpose()?,
        })
    }
}

/// What the device can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFacts {
    /// Whether CUTLASS's sm90 kernels run here (Err: why not).
    pub cutlass: Result<(), String>,
    /// Whether CUTLASS's sm90 block-scaled FP8 GEMMs run here (Err: why not).
    pub fp8_gemm: Result<(), String>,
}

/// The kernels a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPlan {
    pub prefill_attention: PrefillAttention,
    pub decode_kernel: DecodeKernel,
    pub moe_gemm: MoeGemm,
    /// None: the measured default of `moe_gemm`'s route.
    pub moe_small_pairs: Option<usize>,
    /// A block-FP8 checkpoint's weights, and why.
    pub fp8_weights: Fp8Weights,
    pub fp8_weights_reason: Fp8WeightsReason,
    /// From how many prompt tokens a step's attention over an FP8 KV cache
    /// may take cuDNN's FP8 route, per kind of step; None: never.
    pub fp8_attention: Option<Fp8AttentionBounds>,
    /// Most tokens a dense FP8 projection takes on the swapped 64-row
    /// tiling; None: the measured default.
    pub fp8_dense_swap_rows: Option<usize>,
}

crate::decision::reasons! {
    /// Why the plan is what it is.
    pub enum KernelPlanReason in "kernel_plan" {
        // The outcome is the expert GEMM's route (the one choice the device decides).
        /// Nothing was requested: every measured default runs here.
        Defaults("defaults") => "cutlass",
        /// At least one choice was requested, and the device runs it.
        Requested("requested") => "cutlass" | "cutlass_rows" | "cutlass_swap" | "cublas" | "kvc",
        /// Nothing forced the expert GEMM and CUTLASS does not run here: cuBLAS.
        CutlassUnavailable("cutlass_unavailable") => "cublas",
    }
}

impl MoeGemm {
    /// The `outcome` label of the kernel plan's decision.
    pub fn label(self) -> &'static str {
        match self {
            MoeGemm::Cutlass => "cutlass",
            MoeGemm::CutlassRows => "cutlass_rows",
            MoeGemm::CutlassSwap => "cutlass_swap",
            MoeGemm::Cublas => "cublas",
            MoeGemm::Kvc => "kvc",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPlanDecision {
    pub plan: KernelPlan,
    pub reason: KernelPlanReason,
}

impl KernelPlanDecision {
    /// The decision to log and count (its terms are in [`Self::terms`]);
    /// term `fp8_weights` is 1 where block-FP8 weights stay FP8.
    pub fn decision(&self) -> crate::decision::Decision<KernelPlanReason> {
        crate::decision::Decision::new(self.plan.moe_gemm.label(), self.reason)
            .term("fp8_weights", f64::from(u8::from(self.plan.fp8_weights == Fp8Weights::Fp8)))
    }

    /// The plan as named fields, for the one log line at start.
    pub fn terms(&self) -> [(&'static str, String); 8] {
        let p = &self.plan;
        let small = p.moe_small_pairs.map_or_else(|| "default".to_string(), |n| n.to_string());
        let fp8_attention = p
            .fp8_attention
            .map_or_else(|| "off".to_string(), |b| format!("from {} tokens ({} in steps of fresh prompts alone)", b.mixed, b.whole_step));
        [
            ("prefill_attention", p.prefill_attention.as_str().to_string()),
            ("decode_kernel", p.decode_kernel.as_str().to_string()),
            ("moe_gemm", p.moe_gemm.as_str().to_string()),
            ("moe_small_pairs", small),
            ("fp8_weights", p.fp8_weights.as_str().to_string()),
            ("fp8_weights_reason", p.fp8_weights_reason.as_str().to_string()),
            ("fp8_attention", fp8_attention),
            ("fp8_dense_swap_rows", p.fp8_dense_swap_rows.map_or_else(|| "default".to_string(), |n| n.to_string())),
        ]
    }
}

/// The request resolved against the device (module doc). Err: a CUTLASS
/// route was forced on a device that cannot run it. The FP8 weights do
/// not change the reason (they have their own, `fp8_weights_reason`).
pub fn decide_kernel_plan(request: &KernelRequest, facts: &KernelFacts) -> Result<KernelPlanDecision, String> {
    let (moe_gemm, cutlass_missing) = match (request.moe_gemm, &facts.cutlass) {
        (Some(g), Err(why)) if g.is_cutlass() => return Err(format!("KVC_MOE_GEMM={}: {why}", g.as_str())),
        (Some(g), _) => (g, false),
        (None, Ok(())) => (MoeGemm::Cutlass, false),
        (None, Err(_)) => (MoeGemm::Cublas, true),
    };
    let (fp8_weights, fp8_weights_reason) = match (request.fp8_gemm, &facts.fp8_gemm) {
        (Some(Fp8Gemm::Dequantize), _) => (Fp8Weights::Dequantized, Fp8WeightsReason::Requested),
        (_, Err(_)) => (Fp8Weights::Dequantized, Fp8WeightsReason::Unavailable),
        (_, Ok(())) => (Fp8Weights::Fp8, Fp8WeightsReason::Default),
    };
    let requested = *request != KernelRequest::default();
    let reason = match (cutlass_missing, requested) {
        (true, _) => KernelPlanReason::CutlassUnavailable,
        (false, true) => KernelPlanReason::Requested,
        (false, false) => KernelPlanReason::Defaults,
    };
    let plan = KernelPlan {
        prefill_attention: request.prefill_attention.unwrap_or(PrefillAttention::Cudnn),
        decode_kernel: request.decode_kernel.unwrap_or(DecodeKernel::V2),
        moe_gemm,
        moe_small_pairs: request.moe_small_pairs,
        fp8_weights,
        fp8_weights_reason,
        fp8_attention: match request.fp8_attention {
            Some(false) => None,
            _ => Some(request.fp8_attention_min_tokens.map_or(Fp8AttentionBounds::DEFAULT, Fp8AttentionBounds::all)),
        },
        fp8_dense_swap_rows: request.fp8_dense_swap_rows,
    };
    Ok(KernelPlanDecision { plan, reason })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Result<KernelRequest, String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KernelRequest::from_vars(|k| m.get(k).cloned())
    }

    const CUTLASS: KernelFacts = KernelFacts { cutlass: Ok(()), fp8_gemm: Ok(()) };

    fn no_cutlass() -> KernelFacts {
        KernelFacts { cutlass: Err("not an sm90 device".into()), fp8_gemm: Err("not an sm90 device".into()) }
    }

    #[test]
    fn every_value_each_variable_names_parses_and_unset_or_empty_is_the_default() {
        assert_eq!(vars(&[]).unwrap(), KernelRequest::default());
        assert_eq!(vars(&[("KVC_MOE_GEMM", ""), ("KVC_ATTENTION_BACKEND", " ")]).unwrap(), KernelRequest::default());
        for a in PrefillAttention::ALL {
            assert_eq!(vars(&[("KVC_ATTENTION_BACKEND", a.as_str())]).unwrap().prefill_attention, Some(a));
        }
        for d in DecodeKernel::ALL {
            assert_eq!(vars(&[("KVC_DECODE_KERNEL", d.as_str())]).unwrap().decode_kernel, Some(d));
        }
        for g in MoeGemm::ALL {
            assert_eq!(vars(&[("KVC_MOE_GEMM", g.as_str())]).unwrap().moe_gemm, Some(g));
        }
        assert_eq!(vars(&[("KVC_MOE_SMALL_PAIRS", "0")]).unwrap().moe_small_pairs, Some(0));
        for f in Fp8Gemm::ALL {
            assert_eq!(vars(&[("KVC_FP8_GEMM", f.as_str())]).unwrap().fp8_gemm, Some(f));
        }
        assert_eq!(vars(&[("KVC_FP8_ATTENTION", "0")]).unwrap().fp8_attention, Some(false));
        assert_eq!(vars(&[("KVC_FP8_ATTENTION", "1")]).unwrap().fp8_attention, Some(true));
        assert_eq!(vars(&[("KVC_FP8_ATTENTION_MIN_TOKENS", "2048")]).unwrap().fp8_attention_min_tokens, Some(2048));
        assert_eq!(vars(&[("KVC_FP8_DENSE_SWAP_ROWS", "0")]).unwrap().fp8_dense_swap_rows, Some(0));
    }

    #[test]
    fn an_unknown_value_is_an_error_naming_the_variable_and_the_choices() {
        for (var, value, choice) in [
            ("KVC_ATTENTION_BACKEND", "flash", "cudnn-paged"),
            ("KVC_DECODE_KERNEL", "v3", "v1"),
            ("KVC_MOE_GEMM", "triton", "cutlass-swap"),
            ("KVC_MOE_SMALL_PAIRS", "many", "pairs"),
            ("KVC_FP8_GEMM", "fp16", "dequantize"),
            ("KVC_FP8_ATTENTION", "yes", "0, 1"),
            ("KVC_FP8_ATTENTION_MIN_TOKENS", "4k", "prompt tokens"),
            ("KVC_FP8_DENSE_SWAP_ROWS", "-1", "tokens"),
        ] {
            let e = vars(&[(var, value)]).unwrap_err();
            assert!(e.contains(var) && e.contains(value) && e.contains(choice), "{e}");
        }
    }

    #[test]
    fn every_reason_is_reachable() {
        let d = decide_kernel_plan(&KernelRequest::default(), &CUTLASS).unwrap();
        assert_eq!(d.reason, KernelPlanReason::Defaults);
        assert_eq!(
            d.plan,
            KernelPlan {
                prefill_attention: PrefillAttention::Cudnn,
                decode_kernel: DecodeKernel::V2,
                moe_gemm: MoeGemm::Cutlass,
                moe_small_pairs: None,
                fp8_weights: Fp8Weights::Fp8,
                fp8_weights_reason: Fp8WeightsReason::Default,
                fp8_attention: Some(Fp8AttentionBounds::DEFAULT),
                fp8_dense_swap_rows: None,
            }
        );
        let v1 = KernelRequest { decode_kernel: Some(DecodeKernel::V1), ..Default::default() };
        let d = decide_kernel_plan(&v1, &CUTLASS).unwrap();
        assert_eq!((d.reason, d.plan.decode_kernel, d.plan.moe_gemm), (KernelPlanReason::Requested, DecodeKernel::V1, MoeGemm::Cutlass));
        let d = decide_kernel_plan(&v1, &no_cutlass()).unwrap();
        assert_eq!((d.reason, d.plan.moe_gemm), (KernelPlanReason::CutlassUnavailable, MoeGemm::Cublas));
        let seen: Vec<_> = [KernelPlanReason::Defaults, KernelPlanReason::Requested, KernelPlanReason::CutlassUnavailable].into();
        assert_eq!(seen, KernelPlanReason::ALL);
    }

    #[test]
    fn a_forced_route_is_kept_and_a_forced_cutlass_route_the_device_lacks_is_refused() {
        for g in MoeGemm::ALL {
            let r = KernelRequest { moe_gemm: Some(g), ..Default::default() };
            assert_eq!(decide_kernel_plan(&r, &CUTLASS).unwrap().plan.moe_gemm, g);
            match decide_kernel_plan(&r, &no_cutlass()) {
                Ok(d) => assert!(!g.is_cutlass() && d.plan.moe_gemm == g && d.reason == KernelPlanReason::Requested),
                Err(e) => assert!(g.is_cutlass() && e.contains("KVC_MOE_GEMM") && e.contains("sm90"), "{e}"),
            }
        }
    }

    #[test]
    fn every_decided_plan_counts_under_a_closed_label_set() {
        let sets = crate::decision::label_sets_of::<KernelPlanReason>();
        let requests = MoeGemm::ALL.map(|g| KernelRequest { moe_gemm: Some(g), ..Default::default() });
        for r in requests.iter().chain([&KernelRequest::default()]) {
            for facts in [CUTLASS, no_cutlass()] {
                let Ok(d) = decide_kernel_plan(r, &facts) else { continue };
                let dec = d.decision();
                assert!(sets.iter().any(|s| s.outcome == dec.outcome && s.reason == d.reason.as_str()), "{d:?}");
            }
        }
    }

    #[test]
    fn the_terms_name_every_choice() {
        let r = KernelRequest {
            moe_small_pairs: Some(4),
            prefill_attention: Some(PrefillAttention::Kvc),
            fp8_dense_swap_rows: Some(32),
            ..Default::default()
        };
        let d = decide_kernel_plan(&r, &CUTLASS).unwrap();
        let t: HashMap<_, _> = d.terms().into_iter().collect();
        assert_eq!(t["fp8_dense_swap_rows"], "32");
        assert_eq!(t["prefill_attention"], "kvc");
        assert_eq!(t["decode_kernel"], "v2");
        assert_eq!(t["moe_gemm"], "cutlass");
        assert_eq!(t["moe_small_pairs"], "4");
        assert_eq!(t["fp8_weights"], "fp8");
        assert_eq!(t["fp8_weights_reason"], "default");
        let b = Fp8AttentionBounds::DEFAULT;
        assert_eq!(t["fp8_attention"], format!("from {} tokens ({} in steps of fresh prompts alone)", b.mixed, b.whole_step));
    }

    #[test]
    fn fp8_attention_runs_from_the_default_count_unless_turned_off_or_given_another() {
        let plan = |r: KernelRequest| decide_kernel_plan(&r, &CUTLASS).unwrap().plan.fp8_attention;
        let default = Fp8AttentionBounds::DEFAULT;
        assert_eq!(plan(KernelRequest::default()), Some(default));
        assert_eq!(plan(KernelRequest { fp8_attention: Some(true), ..Default::default() }), Some(default));
        // An operator's count is the bound for every kind of step.
        let zero = Some(Fp8AttentionBounds { mixed: 0, whole_step: 0 });
        assert_eq!(plan(KernelRequest { fp8_attention_min_tokens: Some(0), ..Default::default() }), zero);
        let off = KernelRequest { fp8_attention: Some(false), fp8_attention_min_tokens: Some(0), ..Default::default() };
        assert_eq!(plan(off), None);
        let d = decide_kernel_plan(&off, &CUTLASS).unwrap();
        assert_eq!(d.terms().into_iter().find(|t| t.0 == "fp8_attention").unwrap().1, "off");
    }

    #[test]
    fn fp8_weights_stay_fp8_where_the_gemms_run_unless_dequantize_is_asked() {
        let dequantize = KernelRequest { fp8_gemm: Some(Fp8Gemm::Dequantize), ..Default::default() };
        let auto = KernelRequest { fp8_gemm: Some(Fp8Gemm::Auto), ..Default::default() };
        let fp8_only = KernelFacts { cutlass: Err("no grouped GEMM".into()), fp8_gemm: Ok(()) };
        let cases = [
            (&KernelRequest::default(), &CUTLASS, Fp8Weights::Fp8, Fp8WeightsReason::Default),
            (&auto, &CUTLASS, Fp8Weights::Fp8, Fp8WeightsReason::Default),
            (&auto, &fp8_only, Fp8Weights::Fp8, Fp8WeightsReason::Default),
            (&dequantize, &CUTLASS, Fp8Weights::Dequantized, Fp8WeightsReason::Requested),
            (&dequantize, &no_cutlass(), Fp8Weights::Dequantized, Fp8WeightsReason::Requested),
            (&KernelRequest::default(), &no_cutlass(), Fp8Weights::Dequantized, Fp8WeightsReason::Unavailable),
        ];
        for (r, f, weights, reason) in cases {
            let d = decide_kernel_plan(r, f).unwrap();
            assert_eq!((d.plan.fp8_weights, d.plan.fp8_weights_reason), (weights, reason), "{r:?} {f:?}");
            let fp8 = d.decision().terms().iter().find(|(k, _)| *k == "fp8_weights").map(|t| t.1);
            assert_eq!(fp8, Some(if weights == Fp8Weights::Fp8 { 1.0 } else { 0.0 }));
        }
        // The expert GEMM's reason is its own: asking for dequantized
        // weights is a request, but changes no route.
        let d = decide_kernel_plan(&dequantize, &CUTLASS).unwrap();
        assert_eq!((d.reason, d.plan.moe_gemm), (KernelPlanReason::Requested, MoeGemm::Cutlass));
    }
}
