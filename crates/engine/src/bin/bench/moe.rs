//! `kvc-bench moe`: the MoE experts alone at Qwen3-30B-A3B's shape (128
//! experts, top-8, hidden 2048, moe_intermediate 768, bf16), uniform
//! routing, for T tokens (8T routed rows):
//!
//! - the two grouped projections (gate/up, then down) on rows already in
//!   expert order, on every library route kvc has (CUTLASS's Hopper grouped
//!   GEMM with each tiling, cuBLAS's grouped GEMM with its host read of the
//!   offsets): TFLOP/s (6 T top_k hidden inter) and GB/s of the touched
//!   experts' weights;
//! - the whole MoE block (`GpuMoe::forward`: router, top-k, grouping,
//!   gathers, both projections, SiLU, weighted sum) on each expert GEMM;
//! - in the same run, PyTorch's `torch._grouped_mm` (CUTLASS's sm90
//!   grouped GEMM) on the same projections (scripts/moe_peer.py), and the
//!   ratio of kvc's best route to it.

const E: usize = 128;
const TOP_K: usize = 8;
const H: usize = 2048;
const I: usize = 768;

pub struct Opts {
    pub device: String,
    pub tokens: Vec<usize>,
    /// The peer script; None: no peer.
    pub peer: Option<String>,
}

/// Rows per expert for `pairs` rows spread evenly (the first experts take
/// the remainder), as offsets `[E + 1]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn uniform_offsets(pairs: usize) -> Vec<u32> {
    let mut off = vec![0u32];
    for e in 0..E {
        let n = pairs / E + usize::from(e < pairs % E);
        off.push(off[e] + n as u32);
    }
    off
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn flops(tokens: usize) -> f64 {
    6.0 * (tokens * TOP_K * H * I) as f64
}

/// Bytes of the experts' weights a call touches (every expert with a row).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn weight_bytes(tokens: usize) -> f64 {
    (E.min(tokens * TOP_K) * 3 * H * I * 2) as f64
}

/// Runs the peer script: (tokens, backend, seconds or the error).
fn peer(script: &str, tokens: &[usize]) -> Result<Vec<(usize, String, Result<f64, String>)>, String> {
    let mut args: Vec<String> =
        ["--experts", &E.to_string(), "--top-k", &TOP_K.to_string(), "--hidden", &H.to_string(), "--inter", &I.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(tokens.iter().map(|t| t.to_string()));
    let rows = super::attention_bench::run_peer(script, &args)?;
    Ok(rows.into_iter().filter_map(|(t, b, r)| Some((t.parse().ok()?, b, r))).collect())
}

/// One line of the table: route, seconds, and the rates for `tokens`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn print_row(tokens: usize, route: &str, secs: f64, diff: &str) {
    println!(
        "{tokens:>6} {route:<22} {:>9.3} {:>9.1} {:>9.0} {diff:>10}",
        secs * 1e3,
        flops(tokens) / secs / 1e12,
        weight_bytes(tokens) / secs / 1e9
    );
}

#[cfg(feature = "cuda")]
fn measure(device: &candle_core::Device, tokens: usize) -> Vec<(String, f64)> {
    use candle_core::{DType, Tensor};
    use kvc_model_qwen3::cuda::{grouped_projection, set_moe_gemm, set_moe_small_pairs, CutlassTiling, GpuMoe, Kernels, MoeGemm};

    let pairs = tokens * TOP_K;
    let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    let randn = |shape: &[usize], s: f32| bf((Tensor::randn(0f32, 1.0, shape, device).unwrap() * s as f64).unwrap());
    let gate_up = randn(&[E, 2 * I, H], 0.02);
    let down = randn(&[E, H, I], 0.02);
    let offsets = Tensor::new(uniform_offsets(pairs).as_slice(), device).unwrap();
    let xs = randn(&[pairs, H], 1.0);
    let act = randn(&[pairs, I], 1.0);
    let gu = Tensor::zeros((pairs, 2 * I), DType::BF16, device).unwrap();
    let dn = Tensor::zeros((pairs, H), DType::BF16, device).unwrap();
    let mut rows = Vec::new();
    let mut first: Option<(Tensor, Tensor)> = None;
    let routes = [
        ("cutlass-rows", MoeGemm::Cutlass(Some(CutlassTiling::Rows))),
        ("cutlass-swap", MoeGemm::Cutlass(Some(CutlassTiling::Swap))),
        ("cublas", MoeGemm::Cublas),
    ];
    for (name, g) in routes {
        let call = || grouped_projection(g, &offsets, &xs, &gate_up, &gu).and_then(|_| grouped_projection(g, &offsets, &act, &down, &dn));
        if let Err(e) = call() {
            println!("{tokens:>6} {:<22} error: {e}", format!("gemms {name}"));
            continue;
        }
        let diff = match &first {
            None => {
                first = Some((gu.copy().unwrap(), dn.copy().unwrap()));
                "-".to_string()
            }
            Some((g0, d0)) => format!("{:.1e}", rel_diff(g0, &gu).max(rel_diff(d0, &dn))),
        };
        let t = super::attention_bench::time(device, || call().unwrap());
        print_row(tokens, &format!("gemms {name}"), t, &diff);
        rows.push((format!("gemms {name}"), t));
    }
    // The whole block on each expert GEMM.
    let dev = device.as_cuda_device().unwrap();
    let kernels = Kernels::load(dev).unwrap();
    let moe = GpuMoe { router: randn(&[E, H], 0.02), gate_up, down, num_experts: E, intermediate: I, top_k: TOP_K, norm_topk_prob: true };
    let x = randn(&[tokens, H], 1.0);
    // Every pair on the few-row kernel (small_m_gemm) where that can pay.
    let all_small = (tokens <= 512).then_some(("kvc few-row kernel", Some(usize::MAX), MoeGemm::Kvc));
    let blocks = all_small.into_iter().chain([
        ("kvc kernels", None, MoeGemm::Kvc),
        ("cublas", None, MoeGemm::Cublas),
        ("cutlass", None, MoeGemm::Cutlass(None)),
        ("cutlass, no CUDA-core", Some(0), MoeGemm::Cutlass(None)),
    ]);
    for (name, small, g) in blocks {
        set_moe_small_pairs(small);
        set_moe_gemm(g);
        if let Err(e) = moe.forward(&kernels, &x, true) {
            println!("{tokens:>6} {:<22} error: {e}", format!("block {name}"));
            continue;
        }
        let t = super::attention_bench::time(device, || {
            moe.forward(&kernels, &x, true).unwrap();
        });
        print_row(tokens, &format!("block {name}"), t, "-");
        rows.push((format!("block {name}"), t));
    }
    set_moe_small_pairs(None);
    set_moe_gemm(MoeGemm::Cutlass(None));
    rows
}

#[cfg(feature = "cuda")]
fn rel_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f64 {
    let f = |t: &candle_core::Tensor| t.to_dtype(candle_core::DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let (a, b) = (f(a), f(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[cfg(not(feature = "cuda"))]
fn measure(_: &candle_core::Device, _: usize) -> Vec<(String, f64)> {
    eprintln!("kvc-bench moe needs a CUDA build (scripts/cuda_setup.sh)");
    std::process::exit(1)
}

pub fn run(o: &Opts) {
    let device = kvc_engine::device::select(&o.device).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    println!("MoE experts alone: {E} experts, top-{TOP_K}, hidden {H}, moe_intermediate {I}, bf16, uniform routing, on {device:?}");
    println!("(gemms: gate/up + down on rows in expert order; block: GpuMoe::forward; rel. diff: against the first gemms route)");
    println!("{:>6} {:<22} {:>9} {:>9} {:>9} {:>10}", "tokens", "route", "ms", "TFLOP/s", "GB/s w", "rel. diff");
    let mut best = Vec::new();
    for &t in &o.tokens {
        let rows = measure(&device, t);
        let gemm = rows.iter().filter(|r| r.0.starts_with("gemms")).min_by(|a, b| a.1.total_cmp(&b.1)).cloned();
        best.push((t, gemm));
    }
    let Some(script) = &o.peer else { return };
    println!("\npeer: PyTorch torch._grouped_mm, same projections ({script})");
    let peers = match peer(script, &o.tokens) {
        Ok(p) => p,
        Err(e) => {
            println!("peer not measured: {e}");
            return;
        }
    };
    for (t, backend, r) in &peers {
        match r {
            Ok(s) => print_row(*t, backend, *s, ""),
            Err(e) => println!("{t:>6} {backend:<22} {e}"),
        }
    }
    println!("\n{:>6} {:<22} {:>9} {:>9} {:>9} {:>8}", "tokens", "kvc best gemms", "TFLOP/s", "peer", "TFLOP/s", "ratio");
    for (t, b) in &best {
        let Some((route, s)) = b else { continue };
        let p = peers
            .iter()
            .filter(|p| p.0 == *t)
            .filter_map(|p| p.2.as_ref().ok().map(|s| (p.1.clone(), *s)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((pb, ps)) = p {
            println!(
                "{t:>6} {:<22} {:>9.1} {:<9} {:>9.1} {:>8.2}",
                route.trim_start_matches("gemms "),
                flops(*t) / s / 1e12,
                pb,
                flops(*t) / ps / 1e12,
                ps / s
            );
        }
    }
}
