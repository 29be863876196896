//! `kvc-bench engine --shape qwen3-30b-a3b`: the model's forward pass at
//! Qwen3-30B-A3B's exact shape with dummy bf16 weights, on the device the
//! engine would pick: prefill tok/s at several prompt lengths and decode
//! tok/s at several (batch, context) pairs, each against the
//! hardware limit (bytes read per step over HBM bandwidth; FLOPs over peak
//! dense bf16). Engine scheduling and sampling are left out: greedy
//! argmax runs on the device and only token ids come back.
//!
//! With `--dtype fp8` the projections and experts hold block-FP8 weights
//! (the dummy weights quantized to e4m3 with 128x128 block scales on the
//! device) and run on the FP8 GEMMs; `--dtype bf16,fp8` measures both in
//! turn, one model at a time, and prints FP8 against bf16 at the end.
//! `--kv-cache-dtype fp8` holds the KV pool in e4m3 (the attention kernels
//! read it widened; `auto,fp8` runs each weight dtype over both pools).
//!
//! With `--cuda-graph`, each batch size's last decode step is also
//! captured as a CUDA graph and replayed `steps` times (same inputs, same
//! greedy read-back): the difference is what graphs save in launch
//! overhead (kvc_model_qwen3::cuda::CapturedStep says what serving with
//! them would need besides).

use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use kvc_engine::KvCacheDtype;
use kvc_kv_pool::{BlockId, KvPool};
use kvc_model_qwen3::{BatchInput, Qwen3Config, Qwen3Model, SeqChunk, QWEN3_30B_A3B};

use super::model_mixed::{mixed_step, prefill_mix_capacity};
use super::roofs::{hbm_bytes_per_s, PEAK_BF16_FLOPS};

pub struct Opts {
    pub device: String,
    pub prefill: Vec<usize>,
    /// Decode runs: (batch, context).
    pub decode: Vec<(usize, usize)>,
    pub steps: usize,
    pub block_size: usize,
    /// Also replay each decode step as a CUDA graph (cuda builds).
    pub cuda_graph: bool,
    /// A workload's prefills, "cached new" per line (`kvc-replay inspect
    /// --prefill-mix`): its prefill capacity is measured too.
    pub prefill_mix: Option<String>,
    /// Chunk length of that measurement (the server's
    /// `--max-num-batched-tokens`).
    pub chunk: usize,
    /// A mixed step: a prefill chunk of `.0` tokens after `.1` of context,
    /// beside `.2` decodes at context `.3`: each alone and together.
    pub mixed: Option<(usize, usize, usize, usize)>,
    /// The weights of each run, in order.
    pub dtypes: Vec<Weights>,
    /// The KV pool of each run: every weight dtype runs over each.
    pub kv_dtypes: Vec<KvCacheDtype>,
}

/// The weights a run holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// The compute dtype (bf16 on a GPU, f32 on a CPU).
    Bf16,
    /// Block FP8 (e4m3, 128x128 scales) for the decoder layers' projections
    /// and experts; embeddings, router and LM head stay bf16.
    Fp8,
}

impl Weights {
    fn label(self) -> &'static str {
        match self {
            Weights::Bf16 => "bf16",
            Weights::Fp8 => "fp8",
        }
    }
}

/// What one run holds: its weights and its KV pool.
#[derive(Debug, Clone, Copy)]
struct Run {
    weights: Weights,
    kv: KvCacheDtype,
}

impl Run {
    fn label(self) -> String {
        match self.kv {
            KvCacheDtype::Fp8E4m3 => format!("{}/kv-fp8", self.weights.label()),
            _ => self.weights.label().to_string(),
        }
    }
}

/// A run's headline numbers, for the comparison at the end.
#[derive(Default)]
struct Summary {
    /// (tokens, tok/s)
    prefill: Vec<(usize, f64)>,
    /// (batch, context, eager tok/s, graph tok/s)
    decode: Vec<(usize, usize, f64, Option<f64>)>,
}

struct Shape {
    layers: f64,
    hidden: f64,
    heads: f64,
    kv_heads: f64,
    head_dim: f64,
    experts: f64,
    top_k: f64,
    inter: f64,
    vocab: f64,
    /// Bytes per weight of the projections and experts (2 in bf16, ~1 in FP8).
    weight_bytes: f64,
}

impl Shape {
    fn of(c: &Qwen3Config) -> Self {
        let moe = c.moe.as_ref().expect("MoE shape");
        Self {
            layers: c.num_hidden_layers as f64,
            hidden: c.hidden_size as f64,
            heads: c.num_attention_heads as f64,
            kv_heads: c.num_key_value_heads as f64,
            head_dim: c.head_dim as f64,
            experts: moe.num_experts as f64,
            top_k: moe.num_experts_per_tok as f64,
            inter: moe.moe_intermediate_size as f64,
            vocab: c.vocab_size as f64,
            // e4m3 plus an f32 scale per 128x128 block.
            weight_bytes: if c.fp8.is_some() { 1.0 + 4.0 / (128.0 * 128.0) } else { 2.0 },
        }
    }
    fn attn_params(&self) -> f64 {
        self.hidden * (self.heads + 2.0 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
    }
    fn expert_params(&self) -> f64 {
        3.0 * self.hidden * self.inter
    }
    /// Parameters a token multiplies by (attention, router, top-k experts, lm_head).
    fn active_params(&self) -> f64 {
        self.layers * (self.attn_params() + self.experts * self.hidden + self.top_k * self.expert_params()) + self.vocab * self.hidden
    }
    /// Expected distinct experts per layer for `tokens` uniformly routed tokens.
    fn experts_touched(&self, tokens: f64) -> f64 {
        self.experts * (1.0 - (1.0 - self.top_k / self.experts).powf(tokens))
    }
    /// Bytes a decode step must read: weights touched once (projections
    /// and experts at `weight_bytes`, router and LM head in bf16), the
    /// whole KV context (bf16).
    fn decode_bytes(&self, batch: f64, ctx: f64) -> f64 {
        let projections = self.layers * (self.attn_params() + self.experts_touched(batch) * self.expert_params());
        let plain = self.layers * self.experts * self.hidden + self.vocab * self.hidden;
        let kv = batch * ctx * self.layers * 2.0 * self.kv_heads * self.head_dim;
        self.weight_bytes * projections + 2.0 * (plain + kv)
    }
    /// FLOPs of a forward over `tokens` new tokens at mean context `ctx`
    /// (causal attention: q.k and p.v per query per key).
    fn flops(&self, tokens: f64, mean_ctx: f64) -> f64 {
        2.0 * tokens * self.active_params() + 4.0 * tokens * mean_ctx * self.heads * self.head_dim * self.layers
    }
}

pub(crate) fn sync(device: &Device) {
    device.synchronize().expect("synchronize");
}

/// Runs `f` inside the profiler's range when `KVC_BENCH_PROFILE` names
/// `tag` (`ncu --profile-from-start off` then sees only its kernels), else
/// plainly. Tags: `mixed-chunk`, `mixed-decodes`, `mixed-both`,
/// `prefill-LEN`, `decode-B`, `graph-B`.
pub(crate) fn profiled<T>(device: &Device, tag: &str, f: impl FnOnce() -> T) -> T {
    let on = std::env::var("KVC_BENCH_PROFILE").is_ok_and(|v| v.split(',').any(|t| t == tag));
    if !on {
        return f();
    }
    sync(device);
    // Marks where this range's kernels start in ncu's progress lines.
    eprintln!("KVC_PROFILE_RANGE {tag}");
    #[cfg(feature = "cuda")]
    kvc_model_qwen3::cuda::profiler(device, true).expect("profiler start");
    let r = f();
    sync(device);
    #[cfg(feature = "cuda")]
    kvc_model_qwen3::cuda::profiler(device, false).expect("profiler stop");
    r
}

/// Fills the pool with random values (timing on zeros flatters kernels).
/// An e4m3 pool repeats one chunk made on the host (candle's CUDA casts
/// have no e4m3).
fn randomize_pool(pool: &KvPool) -> candle_core::Result<()> {
    let Some(t) = pool.storage.device_tensor() else {
        return Ok(());
    };
    let n = t.elem_count();
    let chunk = 1 << 28;
    let fp8 = (t.dtype() == DType::F8E4M3)
        .then(|| Tensor::rand(-1f32, 1f32, chunk.min(n), &Device::Cpu)?.to_dtype(DType::F8E4M3)?.to_device(t.device()))
        .transpose()?;
    let mut off = 0;
    while off < n {
        let len = chunk.min(n - off);
        let r = match &fp8 {
            Some(c) => c.narrow(0, 0, len)?,
            None => Tensor::rand(-1f32, 1f32, len, t.device())?.to_dtype(t.dtype())?,
        };
        t.slice_set(&r, 0, off)?;
        off += len;
    }
    Ok(())
}

/// One decode step: token i of sequence i, each at `ctx` tokens of context.
fn decode_batch<'a>(tokens: Vec<u32>, tables: &'a [Vec<BlockId>], ctx: usize) -> BatchInput<'a> {
    let seqs = tables.iter().enumerate().map(|(i, t)| SeqChunk { start: i, len: 1, context_len: ctx, block_table: t }).collect();
    BatchInput { logits_rows: (0..tokens.len()).collect(), tokens, seqs }
}

pub(crate) fn greedy(logits: &Tensor) -> Vec<u32> {
    let ids = logits.argmax(D::Minus1).expect("argmax");
    let v = ids.to_vec1::<u32>().expect("ids");
    assert!(
        logits
            .max_keepdim(D::Minus1)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite()),
        "non-finite logits"
    );
    v
}

/// Median time of a decode step replayed as a CUDA graph, greedy read-back
/// included as in the eager loop; and whether the replay picks the same
/// tokens as an eager pass over the same inputs.
#[cfg(feature = "cuda")]
fn graph_step_time(model: &Qwen3Model, batch: &BatchInput, pool: &mut KvPool, steps: usize) -> Result<(f64, bool), String> {
    let step = model.capture_step(batch, &pool.storage).map_err(|e| e.to_string())?;
    let eager = greedy(&model.forward(batch, &mut pool.storage).map_err(|e| e.to_string())?);
    let device = step.logits().device().clone();
    profiled(&device, &format!("graph-{}", batch.seqs.len()), || step.replay()).map_err(|e| e.to_string())?;
    let same = greedy(step.logits()) == eager;
    let mut times = Vec::new();
    for _ in 0..steps.max(1) {
        let t = Instant::now();
        step.replay().map_err(|e| e.to_string())?;
        greedy(step.logits());
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((times[times.len() / 2], same))
}

#[cfg(not(feature = "cuda"))]
fn graph_step_time(_: &Qwen3Model, _: &BatchInput, _: &mut KvPool, _: usize) -> Result<(f64, bool), String> {
    Err("this kvc-bench was built without --features cuda".into())
}

pub fn run(o: &Opts) {
    let mix: Vec<(usize, usize)> = match &o.prefill_mix {
        Some(path) => {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
                eprintln!("--prefill-mix {path}: {e}");
                std::process::exit(2)
            });
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let mut f = l.split_whitespace().map(str::parse::<usize>);
                    match (f.next(), f.next()) {
                        (Some(Ok(c)), Some(Ok(n))) => (c, n),
                        _ => {
                            eprintln!("--prefill-mix {path}: expected 'cached new' per line, got {l:?}");
                            std::process::exit(2)
                        }
                    }
                })
                .collect()
        }
        None => Vec::new(),
    };
    let device = kvc_engine::device::select(&o.device).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    // The kernels a served model would run, with the environment's
    // requests (KVC_MOE_GEMM, KVC_FP8_ATTENTION, ...) as the engine takes them.
    let kernels = kvc_engine::kernel_plan::request_from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    kvc_engine::kernel_plan::apply(&kernels, &device).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let runs: Vec<(Run, Summary)> = o
        .dtypes
        .iter()
        .flat_map(|&weights| o.kv_dtypes.iter().map(move |&kv| Run { weights, kv }))
        .map(|run| (run, run_weights(o, &mix, &device, run)))
        .collect();
    if runs.len() < 2 {
        return;
    }
    let (base, first) = (&runs[0].1, runs[0].0.label());
    println!("\nweights compared (tok/s; ratio against {first}, same binary, same device, one model at a time)");
    println!("{:>22} {}", "", runs.iter().map(|(w, _)| format!("{:>12} {:>7}", w.label(), "ratio")).collect::<Vec<_>>().join(" "));
    for (i, &(len, _)) in base.prefill.iter().enumerate() {
        let cells: Vec<String> =
            runs.iter().map(|(_, s)| s.prefill.get(i).map(|p| p.1)).map(|v| ratio_cell(v, base.prefill[i].1)).collect();
        println!("{:>22} {}", format!("prefill {len}"), cells.join(" "));
    }
    for (i, &(b, ctx, eager, graph)) in base.decode.iter().enumerate() {
        let cells: Vec<String> = runs.iter().map(|(_, s)| ratio_cell(s.decode.get(i).map(|d| d.2), eager)).collect();
        println!("{:>22} {}", format!("decode {b}x{ctx}"), cells.join(" "));
        if let Some(g) = graph {
            let cells: Vec<String> = runs.iter().map(|(_, s)| ratio_cell(s.decode.get(i).and_then(|d| d.3), g)).collect();
            println!("{:>22} {}", format!("decode {b}x{ctx} graph"), cells.join(" "));
        }
    }
}

/// `value` and its ratio to `base`, or dashes.
fn ratio_cell(value: Option<f64>, base: f64) -> String {
    match value {
        Some(v) => format!("{v:>12.0} {:>6.2}x", v / base),
        None => format!("{:>12} {:>7}", "-", "-"),
    }
}

/// Every measurement of `o` on one model holding `run`'s weights over its KV pool.
fn run_weights(o: &Opts, mix: &[(usize, usize)], device: &Device, run: Run) -> Summary {
    let weights = run.weights;
    let mut summary = Summary::default();
    let device = device.clone();
    let mut cfg = Qwen3Config::from_json(QWEN3_30B_A3B).expect("config");
    if weights == Weights::Fp8 {
        cfg.fp8 = Some(kvc_model_qwen3::fp8::BlockFp8 { block: (128, 128) });
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            if let Err(e) = kvc_model_qwen3::cuda::fp8_gemm_runs() {
                println!("\n--dtype fp8: the FP8 GEMMs do not run here ({e}); skipped");
                return summary;
            }
            kvc_model_qwen3::cuda::set_fp8_weights(true);
        }
    }
    // Positions as far as the workload's longest prompt (as a served
    // model's --max-model-len with a long-context config).
    let mix_len = mix.iter().map(|&(c, n)| c + n).max().unwrap_or(0);
    cfg.max_position_embeddings = cfg.max_position_embeddings.max(mix_len);
    let shape = Shape::of(&cfg);
    let hbm = hbm_bytes_per_s(&device);
    let dtype = if device.is_cpu() { DType::F32 } else { DType::BF16 };
    let t0 = Instant::now();
    let model = Qwen3Model::dummy(cfg.clone(), 0, dtype, &device).expect("model");
    sync(&device);
    println!(
        "\n=== weights {} ===\nQwen3-30B-A3B shape, dummy {dtype:?} weights{} on {device:?}: loaded in {:.1} s; {:.2} B active params/token",
        run.label(),
        if weights == Weights::Fp8 { " (projections and experts block-FP8)" } else { "" },
        t0.elapsed().as_secs_f64(),
        shape.active_params() / 1e9
    );
    #[cfg(feature = "cuda")]
    if let Some(w) = model.gpu_weight_bytes() {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        println!(
            "weights on the device: {:.2} GiB ({:.2} GiB projections and experts: {} weights in FP8, {} in bf16)",
            gib(w.total),
            gib(w.projections),
            w.fp8_weights,
            w.bf16_weights
        );
    }
    let bs = o.block_size;
    let layout = model.kv_layout(bs);
    let layout = kvc_kv_pool::KvLayout {
        dtype: run.kv.resolve(dtype, layout.head_dim, &device).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        }),
        ..layout
    };
    let mixed_tokens = o.mixed.map_or(0, |(n, d, b, c)| n + d + b * (c + 1) + (b + 1) * bs);
    let max_prefill = o.prefill.iter().copied().max().unwrap_or(0).max(mix_len).max(mixed_tokens);
    let per_seq = |ctx: usize| (ctx + o.steps + 8).div_ceil(bs);
    let blocks = o.decode.iter().map(|&(b, c)| b * per_seq(c)).max().unwrap_or(0).max(max_prefill.div_ceil(bs)).max(1);
    let mut pool = KvPool::new_on(layout, blocks, &device).expect("KV pool");
    randomize_pool(&pool).expect("randomize pool");
    sync(&device);
    println!(
        "KV pool: {blocks} blocks of {bs} tokens, {:?}, {:.1} GiB",
        layout.dtype,
        (blocks * layout.bytes_per_block()) as f64 / (1u64 << 30) as f64
    );

    // Warm-up: loads modules, creates cuBLAS handles, grows the memory pool.
    let table: Vec<BlockId> = (0..blocks.min(64) as BlockId).collect();
    for len in [64usize, 512] {
        let len = len.min(table.len() * bs);
        let b = BatchInput {
            tokens: (0..len as u32).map(|i| i % 1000 + 10).collect(),
            seqs: vec![SeqChunk { start: 0, len, context_len: len, block_table: &table }],
            logits_rows: vec![len - 1],
        };
        greedy(&model.forward(&b, &mut pool.storage).expect("warm-up"));
    }

    if !mix.is_empty() {
        prefill_mix_capacity(&model, &mut pool, &device, mix, o.chunk, bs);
    }
    if let Some(m) = o.mixed {
        mixed_step(&model, &mut pool, &device, m, bs);
    }

    println!(
        "\nprefill (one sequence, one forward pass; attention = one layer's alone x layers, rest = the other work; \
         host ms = until the forward pass returned, before the logits were read: near ms, the host paced the step)"
    );
    println!(
        "{:>8} {:>10} {:>12} {:>14} {:>14} {:>10} {:>14} {:>9}",
        "tokens", "ms", "tok/s", "% peak bf16", "attention ms", "rest ms", "rest TFLOP/s", "host ms"
    );
    for &len in &o.prefill {
        let table: Vec<BlockId> = (0..len.div_ceil(bs) as BlockId).collect();
        let tokens: Vec<u32> = (0..len).map(|i| ((i * 7919) % 150000) as u32 + 10).collect();
        let batch = BatchInput {
            tokens,
            seqs: vec![SeqChunk { start: 0, len, context_len: len, block_table: &table }],
            logits_rows: vec![len - 1],
        };
        let (mut times, mut host) = (Vec::new(), Vec::new());
        for i in 0..3 {
            sync(&device);
            let t = Instant::now();
            let tag = if i == 2 { format!("prefill-{len}") } else { String::new() };
            let logits = profiled(&device, &tag, || model.forward(&batch, &mut pool.storage)).expect("prefill");
            host.push(t.elapsed().as_secs_f64());
            greedy(&logits);
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.total_cmp(b));
        host.sort_by(|a, b| a.total_cmp(b));
        let s = times[1];
        let flops = shape.flops(len as f64, len as f64 / 2.0);
        let case = super::attention_bench::Case { name: format!("prefill-{len}"), seqs: vec![(len, len)] };
        let (attn, rest) = match (device.is_cuda(), shape.heads as usize == 32 && shape.head_dim as usize == 128) {
            (true, true) => match super::attention_bench::serving_route_time(&case, &device) {
                Some((route, a)) => {
                    let a = a * shape.layers;
                    let rest = s - a;
                    let rest_flops = 2.0 * len as f64 * shape.active_params();
                    (format!("{:.1} ({route})", a * 1e3), format!("{:>10.1} {:>14.0}", rest * 1e3, rest_flops / rest / 1e12))
                }
                None => ("-".into(), String::new()),
            },
            _ => ("-".into(), String::new()),
        };
        println!(
            "{len:>8} {:>10.1} {:>12.0} {:>13.1}% {attn:>14} {rest} {:>9.1}",
            s * 1e3,
            len as f64 / s,
            100.0 * flops / s / PEAK_BF16_FLOPS,
            host[1] * 1e3
        );
        summary.prefill.push((len, len as f64 / s));
    }

    println!("\ndecode ({} steps; greedy on device)", o.steps);
    println!(
        "{:>6} {:>8} {:>10} {:>12} {:>10} {:>12} {:>14}",
        "batch", "context", "ms/step", "tok/s", "GB/step", "% HBM roof", "% peak bf16"
    );
    for &(b, context) in &o.decode {
        let per_seq = per_seq(context);
        let tables: Vec<Vec<BlockId>> = (0..b).map(|i| ((i * per_seq) as BlockId..((i + 1) * per_seq) as BlockId).collect()).collect();
        let mut ctx = context;
        let mut step_times = Vec::new();
        let mut tokens: Vec<u32> = (0..b).map(|i| (i * 31 % 1000) as u32 + 10).collect();
        for step in 0..o.steps + 2 {
            ctx += 1;
            let batch = decode_batch(tokens.clone(), &tables, ctx);
            let t = Instant::now();
            let logits = if step == 2 {
                profiled(&device, &format!("decode-{b}"), || model.forward(&batch, &mut pool.storage))
            } else {
                model.forward(&batch, &mut pool.storage)
            };
            tokens = greedy(&logits.expect("decode"));
            if step >= 2 {
                step_times.push(t.elapsed().as_secs_f64());
            }
        }
        step_times.sort_by(|a, b| a.total_cmp(b));
        let s = step_times[step_times.len() / 2];
        let mean_ctx = (context + o.steps / 2) as f64;
        let bytes = shape.decode_bytes(b as f64, mean_ctx);
        let flops = shape.flops(b as f64, mean_ctx);
        println!(
            "{b:>6} {context:>8} {:>10.2} {:>12.0} {:>10.2} {:>11.1}% {:>13.2}%",
            s * 1e3,
            b as f64 / s,
            bytes / 1e9,
            100.0 * bytes / s / hbm,
            100.0 * flops / s / PEAK_BF16_FLOPS
        );
        summary.decode.push((b, context, b as f64 / s, None));
        if o.cuda_graph {
            let batch = decode_batch(tokens, &tables, ctx);
            match graph_step_time(&model, &batch, &mut pool, o.steps) {
                Ok((g, same)) => {
                    if let Some(d) = summary.decode.last_mut() {
                        d.3 = Some(b as f64 / g);
                    }
                    println!(
                        "{:>6} {context:>8} {:>10.2} {:>12.0}   CUDA graph replay: {:+.1} % step time vs eager; tokens {}",
                        "graph",
                        g * 1e3,
                        b as f64 / g,
                        100.0 * (g - s) / s,
                        if same { "equal to eager" } else { "DIFFER from eager" }
                    )
                }
                Err(e) => println!("{:>6} CUDA graph capture or replay failed: {e}", "graph"),
            }
        }
    }
    println!(
        "\n(median of 3 prefills / of the decode steps; HBM roof {:.1} TB/s, bf16 peak {:.0} TFLOP/s)",
        hbm / 1e12,
        PEAK_BF16_FLOPS / 1e12
    );
    summary
}
