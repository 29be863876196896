//! `kvc-bench attention`: kvc's attention alone at Qwen3-30B-A3B's head
//! layout (32 query heads, 4 KV heads, head_dim 128, bf16, 16-token
//! blocks), on every route it has: kvc's own kernels, cuDNN over gathered
//! K/V, cuDNN reading the paged pool in place. Then, in the same run,
//! PyTorch's `scaled_dot_product_attention` with its flash and cuDNN
//! backends at the same shapes (scripts/attention_peer.py, python3 with
//! torch), and the ratio of kvc's best route to the best peer.
//!
//! Cases: causal prefills of 8K and 32K, 4 x 2K in one varlen batch, an
//! 8K chunk after 56K tokens of context (the agentic append), and decode
//! steps (batch x context). Block tables are shuffled, as in a pool that
//! has been in use. Prefill is reported in TFLOP/s (4 * head_dim * heads
//! per (query, key) pair under the causal mask), decode in TB/s of K/V read.

use std::process::Command;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use kvc_kv_pool::{BlockId, KvLayout, KvStorage};
use kvc_model_qwen3::{BatchInput, SeqChunk};

const NH: usize = 32;
const NKV: usize = 4;
const HD: usize = 128;
const BS: usize = 16;

/// One shape: sequences of (new tokens, context).
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub seqs: Vec<(usize, usize)>,
}

impl Case {
    fn prefill(&self) -> bool {
        self.seqs.iter().any(|&(len, _)| len > 1)
    }
    /// (query, key) pairs under the bottom-right causal mask.
    fn pairs(&self) -> f64 {
        self.seqs.iter().map(|&(l, c)| (l * c) as f64 - (l * (l - 1)) as f64 / 2.0).sum()
    }
    fn flops(&self) -> f64 {
        4.0 * (HD * NH) as f64 * self.pairs()
    }
    fn kv_bytes(&self) -> f64 {
        self.seqs.iter().map(|&(_, c)| (c * NKV * HD * 2 * 2) as f64).sum()
    }
    /// The peer script's spelling: name:len/ctx,len/ctx...
    fn spec(&self) -> String {
        let s: Vec<String> = self.seqs.iter().map(|(l, c)| format!("{l}/{c}")).collect();
        format!("{}:{}", self.name, s.join(","))
    }
}

pub fn default_cases() -> Vec<Case> {
    let c = |name: &str, seqs: Vec<(usize, usize)>| Case { name: name.into(), seqs };
    vec![
        c("prefill-8k", vec![(8192, 8192)]),
        c("prefill-32k", vec![(32768, 32768)]),
        c("varlen-4x2k", vec![(2048, 2048); 4]),
        c("chunk-8k-after-56k", vec![(8192, 65536)]),
        c("decode-b1-2k", vec![(1, 2048)]),
        c("decode-b1-32k", vec![(1, 32768)]),
        c("decode-b16-32k", vec![(1, 32768); 16]),
        c("decode-b64-8k", vec![(1, 8192); 64]),
    ]
}

pub struct Opts {
    pub device: String,
    pub cases: Vec<Case>,
    /// The peer script; None: no peer.
    pub peer: Option<String>,
}

/// Seconds per call of `f`: one untimed call, then enough calls for ~0.3 s
/// (at least 3), the median of 3 such runs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn time(device: &Device, mut f: impl FnMut()) -> f64 {
    f();
    device.synchronize().expect("sync");
    let t = Instant::now();
    f();
    device.synchronize().expect("sync");
    let once = t.elapsed().as_secs_f64();
    let n = ((0.1 / once.max(1e-6)) as usize).clamp(3, 2000);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        device.synchronize().expect("sync");
        runs.push(t.elapsed().as_secs_f64() / n as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    runs[1]
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Setup {
    kv: KvStorage,
    tables: Vec<Vec<BlockId>>,
    q: Tensor,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn setup(case: &Case, device: &Device) -> Setup {
    let blocks: usize = case.seqs.iter().map(|&(_, c)| c.div_ceil(BS)).sum::<usize>() + 8;
    let layout = KvLayout { num_layers: 1, num_kv_heads: NKV, head_dim: HD, block_size: BS, dtype: DType::BF16 };
    let kv = KvStorage::new_on(layout, blocks, device).expect("KV pool");
    let pool = kv.device_tensor().expect("device pool");
    let r = Tensor::randn(0f32, 1.0, pool.elem_count(), device).unwrap().to_dtype(DType::BF16).unwrap();
    pool.slice_set(&r, 0, 0).unwrap();
    // A pool in use is fragmented: hand out blocks in a scrambled order.
    let mut ids: Vec<BlockId> = (0..blocks as BlockId).collect();
    let mut x = 0x9e3779b97f4a7c15u64;
    for i in (1..ids.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut next = ids.into_iter();
    let tables = case.seqs.iter().map(|&(_, c)| (0..c.div_ceil(BS)).map(|_| next.next().unwrap()).collect()).collect();
    let tokens: usize = case.seqs.iter().map(|s| s.0).sum();
    let q = Tensor::randn(0f32, 1.0, (tokens, NH * HD), device).unwrap().to_dtype(DType::BF16).unwrap();
    Setup { kv, tables, q }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn batch<'a>(case: &Case, tables: &'a [Vec<BlockId>]) -> BatchInput<'a> {
    let mut start = 0;
    let seqs = case
        .seqs
        .iter()
        .zip(tables)
        .map(|(&(len, ctx), t)| {
            let s = SeqChunk { start, len, context_len: ctx, block_table: t };
            start += len;
            s
        })
        .collect();
    BatchInput { tokens: vec![0; start], seqs, logits_rows: vec![] }
}

#[cfg(feature = "cuda")]
fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let (a, b) = (f(a), f(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// kvc's routes for one case: (route, seconds per call, relative difference
/// from kvc's own kernels, first-call seconds including a graph build).
#[cfg(feature = "cuda")]
fn measure(case: &Case, device: &Device) -> Vec<(String, f64, Option<f64>, f64)> {
    use kvc_model_qwen3::cuda::{ptr, AttentionPlan, CacheFormat, CudnnAttention, Kernels, PagedAttention, PrefillBackend, PrefillContext};
    let kernels = Kernels::load(device.as_cuda_device().unwrap()).unwrap();
    let s = setup(case, device);
    let b = batch(case, &s.tables);
    let pool = s.kv.device_tensor().unwrap();
    let attn = PagedAttention {
        layer_ptr: ptr(pool).unwrap(),
        cache: CacheFormat::Bf16,
        block_size: BS,
        head_dim: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        q_absmax: None,
    };
    let mut out = Vec::new();
    let kvc_plan = AttentionPlan::new(&b, NH, NKV, device).unwrap();
    let reference = attn.forward(&kernels, &s.q, &kvc_plan).unwrap();
    let t = time(device, || drop(attn.forward(&kernels, &s.q, &kvc_plan).unwrap()));
    out.push(("kvc".to_string(), t, None, t));
    if !case.prefill() {
        return out;
    }
    for (name, backend) in [("cudnn", PrefillBackend::Cudnn), ("cudnn-paged", PrefillBackend::CudnnPaged)] {
        let Some(att) = CudnnAttention::open(backend, device) else {
            println!("  {name}: cuDNN unavailable (see the warning above)");
            continue;
        };
        let t0 = Instant::now();
        let ctx = PrefillContext { attention: &att, fp8_cache: false, head_dim: HD, block_size: BS, num_blocks: s.kv.num_blocks() };
        let plan = AttentionPlan::with_prefill(&b, NH, NKV, Some(ctx), device).unwrap();
        if !plan.uses_cudnn() {
            println!("  {name}: no cuDNN engine for this shape (see the warning above)");
            continue;
        }
        let got = attn.forward(&kernels, &s.q, &plan).unwrap();
        device.synchronize().unwrap();
        let first = t0.elapsed().as_secs_f64();
        let d = rel_diff(&got, &reference);
        let t = time(device, || drop(attn.forward(&kernels, &s.q, &plan).unwrap()));
        out.push((name.to_string(), t, Some(d), first));
    }
    out
}

#[cfg(not(feature = "cuda"))]
fn measure(_: &Case, _: &Device) -> Vec<(String, f64, Option<f64>, f64)> {
    eprintln!("kvc-bench attention needs a build with --features cuda");
    std::process::exit(2)
}

/// Seconds per call of the route serving uses (`KVC_ATTENTION_BACKEND`,
/// default cuDNN where it loads) for one layer of `case`.
pub fn serving_route_time(case: &Case, device: &Device) -> Option<(String, f64)> {
    let request = kvc_engine::kernel_plan::request_from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let want = request.prefill_attention.unwrap_or(kvc_policy::kernel_plan::PrefillAttention::Cudnn).as_str().to_string();
    let rows = measure(case, device);
    rows.iter().find(|r| r.0 == want).or_else(|| rows.iter().find(|r| r.0 == "kvc")).map(|r| (r.0.clone(), r.1))
}

/// Throughput of `secs` for the case: TFLOP/s for prefill, TB/s for decode.
fn rate(case: &Case, secs: f64) -> f64 {
    if case.prefill() {
        case.flops() / secs / 1e12
    } else {
        case.kv_bytes() / secs / 1e12
    }
}

/// Runs the peer script: lines `case backend ms` (or `case backend error ...`).
fn peer(script: &str, cases: &[Case]) -> Result<Vec<(String, String, Result<f64, String>)>, String> {
    let mut args: Vec<String> =
        ["--heads", &NH.to_string(), "--kv-heads", &NKV.to_string(), "--head-dim", &HD.to_string()].iter().map(|s| s.to_string()).collect();
    args.extend(cases.iter().map(Case::spec));
    run_peer(script, &args)
}

/// Runs a peer script (`python3 SCRIPT ARGS`) whose output lines read
/// `case backend ms` or `case backend error ...`: (case, backend, seconds
/// or the error's words).
pub(crate) fn run_peer(script: &str, args: &[String]) -> Result<Vec<(String, String, Result<f64, String>)>, String> {
    let out = Command::new("python3").arg(script).args(args).output().map_err(|e| format!("python3 {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!("python3 {script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (case, backend, v) = (w.next()?, w.next()?, w.next()?);
            let r = v.parse::<f64>().map_err(|_| std::iter::once(v).chain(w).collect::<Vec<_>>().join(" "));
            Some((case.to_string(), backend.to_string(), r.map(|ms| ms / 1e3)))
        })
        .collect())
}

pub fn run(o: &Opts) {
    let device = kvc_engine::device::select(&o.device).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    println!("attention alone: {NH} query heads, {NKV} KV heads, head_dim {HD}, bf16, {BS}-token blocks (shuffled tables) on {device:?}");
    println!("{:<20} {:<12} {:>10} {:>12} {:>14} {:>12}", "case", "route", "ms", "TFLOP/s|TB/s", "rel. diff", "first call ms");
    let mut best = Vec::new();
    for case in &o.cases {
        let rows = measure(case, &device);
        for (route, t, d, first) in &rows {
            let d = d.map(|d| format!("{d:.1e}")).unwrap_or_else(|| "-".into());
            println!("{:<20} {:<12} {:>10.3} {:>12.1} {:>14} {:>12.1}", case.name, route, t * 1e3, rate(case, *t), d, first * 1e3);
        }
        let (route, t) = rows.iter().map(|r| (r.0.clone(), r.1)).min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        best.push((case.clone(), route, t));
    }
    let Some(script) = &o.peer else { return };
    println!("\npeer: PyTorch scaled_dot_product_attention, same shapes ({script})");
    let peers = match peer(script, &o.cases) {
        Ok(p) => p,
        Err(e) => {
            println!("peer not measured: {e}");
            return;
        }
    };
    println!("{:<20} {:<16} {:>10} {:>12}", "case", "backend", "ms", "TFLOP/s|TB/s");
    for (case, backend, r) in &peers {
        let Some(c) = o.cases.iter().find(|c| &c.name == case) else { continue };
        match r {
            Ok(t) => println!("{:<20} {:<16} {:>10.3} {:>12.1}", case, backend, t * 1e3, rate(c, *t)),
            Err(e) => println!("{:<20} {:<16} {e}", case, backend),
        }
    }
    println!("\n{:<20} {:<12} {:>12} {:<16} {:>12} {:>8}", "case", "kvc best", "rate", "peer best", "rate", "ratio");
    for (case, route, t) in &best {
        let p = peers
            .iter()
            .filter(|p| p.0 == case.name)
            .filter_map(|p| p.2.as_ref().ok().map(|t| (p.1.clone(), *t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match p {
            Some((pb, pt)) => {
                println!("{:<20} {:<12} {:>12.1} {:<16} {:>12.1} {:>7.2}x", case.name, route, rate(case, *t), pb, rate(case, pt), pt / t)
            }
            None => println!("{:<20} {:<12} {:>12.1} {:<16}", case.name, route, rate(case, *t), "(none)"),
        }
    }
}
