//! `kvc-bench engine`: tokens/s of the engine at several batch sizes.
//!
//! ```text
//! kvc-bench engine [--batch 1,16] [--prompt-len 128] [--gen-len 64] [--model DIR] [--load-format dummy]
//!                  [--device auto|cpu|cuda] [--enforce-eager] [--json-schema default|FILE]
//! kvc-bench admission [--prompt-len 4096]
//! kvc-bench attention [--device cuda] [--case NAME|NAME:LEN/CTX,LEN/CTX...]... [--peer SCRIPT|none]
//! kvc-bench moe [--device cuda] [--tokens 64,512,2048,8192,32768] [--peer SCRIPT|none]
//! kvc-bench layers [--device cuda]
//! kvc-bench engine --shape qwen3-30b-a3b [--device auto|cpu|cuda] [--prefill 1024,8192,32768]
//!                  [--batch 1,16,64,256] [--context 2048] [--decode 1x2048,1x32768,...] [--steps 64] [--cuda-graph]
//!                  [--dtype bf16|fp8|bf16,fp8] [--kv-cache-dtype auto|fp8|auto,fp8]
//! ```
//! With `--shape qwen3-30b-a3b` the model's forward pass is measured at
//! Qwen3-30B-A3B's shape against the hardware limit (bench/model.rs);
//! `--cuda-graph` adds each decode step replayed as a CUDA graph;
//! `--dtype fp8` runs it with block-FP8 weights (the dummy weights
//! quantized on the device, FP8 GEMMs), `bf16,fp8` both in turn, compared;
//! `--kv-cache-dtype fp8` holds the KV pool in e4m3 (`auto,fp8`: each
//! weight dtype over both pools, compared).
//! `attention` times the attention kernels alone against PyTorch's SDPA
//! (bench/attention.rs). `moe` times the MoE experts alone on every route
//! against PyTorch's `torch._grouped_mm` (bench/moe.rs). `layers` times
//! the per-token kernels and the few-row products (bench/layers.rs).
//! `admission` measures the admission probe's latency while the engine
//! runs a long prefill plus decodes, and the engine's decode throughput
//! with and without 100 probes per second.
//! Each batch size runs B concurrent greedy requests of `prompt-len`
//! tokens generating `gen-len` tokens each (EOS ignored), after one warm-up
//! request. Prints prefill time (submission to the last request's first
//! token), decode tokens/s (tokens after the first, over the time after the
//! last first token), and overall output tokens/s.
//! With `--json-schema` each batch runs twice, without and with the schema
//! as a structured-output constraint (`default`: an unbounded array of
//! small objects, so the grammar stays active for the whole run), and
//! prints the grammar's per-token cost: mask computation (beside the
//! forward pass) and the wait for masks after the forward pass (on the
//! step's critical path).

use std::time::Instant;

#[path = "bench/attention.rs"]
mod attention_bench;
#[path = "bench/layers.rs"]
mod layers_bench;
#[path = "bench/model.rs"]
mod model_bench;
#[path = "bench/model_mixed.rs"]
mod model_mixed;
#[path = "bench/moe.rs"]
mod moe_bench;
#[path = "bench/roofs.rs"]
mod roofs;

use kvc_engine::{EngineConfig, EngineHandle, GenerateRequest, KvCacheDtype, LoadFormat, ModelSource, SamplingParams, StreamEvent};

struct Args {
    batches: Vec<usize>,
    prompt_len: usize,
    gen_len: usize,
    model: Option<String>,
    dummy: bool,
    shape: Option<String>,
    cuda_graph: bool,
    enforce_eager: bool,
    device: String,
    prefill: Vec<usize>,
    context: usize,
    decode: Vec<(usize, usize)>,
    steps: usize,
    json_schema: Option<String>,
    prefill_mix: Option<String>,
    chunk: usize,
    mixed: Option<(usize, usize, usize, usize)>,
    /// `--dtype` of the `--shape` benchmark.
    dtypes: Vec<model_bench::Weights>,
    /// Its `--kv-cache-dtype`s.
    kv_dtypes: Vec<KvCacheDtype>,
}

fn list(v: &str, flag: &str) -> Result<Vec<usize>, String> {
    v.split(',').map(|b| b.trim().parse().map_err(|e| format!("{flag}: {e}"))).collect()
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        batches: vec![1, 16],
        prompt_len: 128,
        gen_len: 64,
        model: None,
        dummy: false,
        shape: None,
        cuda_graph: false,
        enforce_eager: false,
        device: "auto".into(),
        prefill: vec![1024, 8192, 32768],
        context: 2048,
        decode: Vec::new(),
        steps: 64,
        json_schema: None,
        prefill_mix: None,
        chunk: 8192,
        mixed: None,
        dtypes: vec![model_bench::Weights::Bf16],
        kv_dtypes: vec![KvCacheDtype::Auto],
    };
    let mut it = std::env::args().skip(1);
    match it.next().as_deref() {
        Some("engine") => {}
        Some("admission") => {
            a.prompt_len = 4096;
            a.batches = vec![0];
        }
        other => return Err(format!("usage: kvc-bench engine|admission|attention|moe [options]; got {other:?}")),
    }
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--batch" => {
                a.batches = val()?.split(',').map(|b| b.trim().parse().map_err(|e| format!("--batch: {e}"))).collect::<Result<_, _>>()?
            }
            "--prompt-len" => a.prompt_len = val()?.parse().map_err(|e| format!("--prompt-len: {e}"))?,
            "--gen-len" => a.gen_len = val()?.parse().map_err(|e| format!("--gen-len: {e}"))?,
            "--model" => a.model = Some(val()?),
            "--load-format" => a.dummy = val()? == "dummy",
            "--shape" => a.shape = Some(val()?),
            "--device" => a.device = val()?,
            "--prefill" => a.prefill = list(&val()?, "--prefill")?,
            "--context" => a.context = val()?.parse().map_err(|e| format!("--context: {e}"))?,
            "--decode" => {
                a.decode = val()?
                    .split(',')
                    .map(|p| {
                        let (b, c) = p.trim().split_once('x').ok_or(format!("--decode {p}: BATCHxCONTEXT expected"))?;
                        Ok((b.parse().map_err(|e| format!("--decode {p}: {e}"))?, c.parse().map_err(|e| format!("--decode {p}: {e}"))?))
                    })
                    .collect::<Result<_, String>>()?
            }
            "--steps" => a.steps = val()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--cuda-graph" => a.cuda_graph = true,
            "--enforce-eager" => a.enforce_eager = true,
            "--json-schema" => a.json_schema = Some(val()?),
            "--prefill-mix" => a.prefill_mix = Some(val()?),
            "--dtype" => {
                a.dtypes = val()?
                    .split(',')
                    .map(|d| match d.trim() {
                        "bf16" => Ok(model_bench::Weights::Bf16),
                        "fp8" => Ok(model_bench::Weights::Fp8),
                        other => Err(format!("--dtype {other:?}: bf16, fp8 or both (bf16,fp8); with --shape")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--kv-cache-dtype" => a.kv_dtypes = val()?.split(',').map(|d| KvCacheDtype::parse(d.trim())).collect::<Result<_, _>>()?,
            "--chunk" => a.chunk = val()?.parse().map_err(|e| format!("--chunk: {e}"))?,
            "--mixed" => {
                // LEN@DEPTH,BATCHxCONTEXT
                let v = val()?;
                let bad = || format!("--mixed {v}: LEN@DEPTH,BATCHxCONTEXT expected (e.g. 1536@20000,25x20000)");
                let (chunk, dec) = v.split_once(',').ok_or_else(bad)?;
                let (len, depth) = chunk.split_once('@').ok_or_else(bad)?;
                let (b, c) = dec.split_once('x').ok_or_else(bad)?;
                let n = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
                a.mixed = Some((n(len)?, n(depth)?, n(b)?, n(c)?));
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// `kvc-bench attention [--device D] [--case C]... [--peer SCRIPT|none]`.
fn attention_args(mut it: impl Iterator<Item = String>) -> Result<attention_bench::Opts, String> {
    let mut o = attention_bench::Opts { device: "cuda".into(), cases: Vec::new(), peer: Some("scripts/attention_peer.py".into()) };
    let defaults = attention_bench::default_cases();
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => o.device = val()?,
            "--peer" => o.peer = Some(val()?).filter(|p| p != "none"),
            "--case" => {
                let v = val()?;
                let case = match v.split_once(':') {
                    Some((name, seqs)) => attention_bench::Case {
                        name: name.into(),
                        seqs: seqs
                            .split(',')
                            .map(|p| {
                                let (l, c) = p.split_once('/').ok_or(format!("--case {v}: LEN/CTX expected"))?;
                                let l: usize = l.parse().map_err(|e| format!("--case {v}: {e}"))?;
                                let c: usize = c.parse().map_err(|e| format!("--case {v}: {e}"))?;
                                if l == 0 || l > c {
                                    return Err(format!("--case {v}: need 0 < LEN <= CTX"));
                                }
                                Ok((l, c))
                            })
                            .collect::<Result<_, String>>()?,
                    },
                    None => defaults.iter().find(|c| c.name == v).cloned().ok_or_else(|| {
                        format!("--case {v}: unknown (one of {})", defaults.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "))
                    })?,
                };
                o.cases.push(case);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if o.cases.is_empty() {
        o.cases = defaults;
    }
    Ok(o)
}

/// `kvc-bench moe [--device D] [--tokens T,T...] [--peer SCRIPT|none]`.
fn moe_args(mut it: impl Iterator<Item = String>) -> Result<moe_bench::Opts, String> {
    let mut o =
        moe_bench::Opts { device: "cuda".into(), tokens: vec![64, 512, 2048, 8192, 32768], peer: Some("scripts/moe_peer.py".into()) };
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => o.device = val()?,
            "--peer" => o.peer = Some(val()?).filter(|p| p != "none"),
            "--tokens" => {
                o.tokens = list(&val()?, "--tokens")?;
                if o.tokens.contains(&0) {
                    return Err("--tokens: each count must be at least 1".into());
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(o)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("layers") {
        let mut o = layers_bench::Opts { device: "cuda".into() };
        let mut it = std::env::args().skip(2);
        while let Some(flag) = it.next() {
            match (flag.as_str(), it.next()) {
                ("--device", Some(d)) => o.device = d,
                _ => {
                    eprintln!("kvc-bench layers [--device cuda]: unexpected {flag}");
                    std::process::exit(2);
                }
            }
        }
        return layers_bench::run(&o);
    }
    if std::env::args().nth(1).as_deref() == Some("moe") {
        match moe_args(std::env::args().skip(2)) {
            Ok(o) => return moe_bench::run(&o),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
    }
    if std::env::args().nth(1).as_deref() == Some("attention") {
        match attention_args(std::env::args().skip(2)) {
            Ok(o) => return attention_bench::run(&o),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
    }
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if args.batches == [0] {
        return admission_bench(args.prompt_len);
    }
    match args.shape.as_deref() {
        None => {}
        Some("qwen3-30b-a3b") => {
            return model_bench::run(&model_bench::Opts {
                device: args.device,
                prefill: args.prefill,
                decode: if args.decode.is_empty() {
                    args.batches.iter().map(|&b| (b, args.context)).collect()
                } else {
                    args.decode.clone()
                },
                steps: args.steps,
                block_size: 16,
                cuda_graph: args.cuda_graph,
                prefill_mix: args.prefill_mix.clone(),
                chunk: args.chunk.max(1),
                mixed: args.mixed,
                dtypes: args.dtypes.clone(),
                kv_dtypes: args.kv_dtypes.clone(),
            })
        }
        Some(other) => {
            eprintln!("unknown --shape {other:?} (qwen3-30b-a3b)");
            std::process::exit(2);
        }
    }
    let max_batch = *args.batches.iter().max().unwrap_or(&1);
    let config = EngineConfig {
        device: args.device.clone(),
        model: ModelSource::parse(args.model.as_deref()),
        load_format: if args.dummy { LoadFormat::Dummy } else { LoadFormat::Auto },
        max_num_seqs: max_batch.max(1),
        max_num_batched_tokens: (args.prompt_len * max_batch).clamp(512, 8192),
        enforce_eager: args.enforce_eager,
        kernels: kvc_engine::kernel_plan::request_from_env().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        }),
        ..Default::default()
    };
    let engine = EngineHandle::start(config).unwrap_or_else(|e| {
        eprintln!("engine failed to start: {e}");
        std::process::exit(1)
    });
    let info = engine.info().clone();
    println!(
        "model {} | prompt {} | gen {} | threads {}",
        info.id,
        args.prompt_len,
        args.gen_len,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let constraint = args.json_schema.as_deref().map(|s| {
        let schema = if s == "default" {
            DEFAULT_SCHEMA.to_string()
        } else {
            std::fs::read_to_string(s).unwrap_or_else(|e| {
                eprintln!("--json-schema {s}: {e}");
                std::process::exit(2)
            })
        };
        kvc_engine::Constraint {
            grammar: kvc_engine::Grammar::JsonSchema { schema, strict: false },
            reasoning: kvc_engine::ReasoningGate::Off,
        }
    });
    if constraint.is_some() {
        // The token trie is built once per engine; not part of any run.
        engine.grammar_compiler().expect("grammar compiler");
    }
    println!(
        "{:>6} {:>8} {:>12} {:>16} {:>16} {:>14} {:>14}",
        "batch", "schema", "prefill_s", "decode_tok/s", "output_tok/s", "mask_us/tok", "wait_us/tok"
    );
    run(&engine, 1, args.prompt_len, 4, None); // warm-up
    for &b in &args.batches {
        for c in std::iter::once(None).chain(constraint.as_ref().map(Some)) {
            let before = engine.stats();
            let (prefill, decode, overall) = run(&engine, b, args.prompt_len, args.gen_len, c);
            let after = wait_published(&engine, &before);
            let masks = (after.grammar_masks - before.grammar_masks).max(1) as f64;
            let mask_us = (after.grammar_mask_seconds - before.grammar_mask_seconds) * 1e6 / masks;
            let wait_us = (after.grammar_wait_seconds - before.grammar_wait_seconds) * 1e6 / masks;
            let label = if c.is_some() { "json" } else { "none" };
            println!("{b:>6} {label:>8} {prefill:>12.3} {decode:>16.1} {overall:>16.1} {mask_us:>14.1} {wait_us:>14.1}");
        }
    }
}

/// An agent-style answer that never has to end: a list of small records.
const DEFAULT_SCHEMA: &str = r#"{"type": "array", "items": {"type": "object", "properties": {
    "tool": {"enum": ["search", "read", "write"]}, "path": {"type": "string", "maxLength": 24},
    "line": {"type": "integer", "minimum": 0, "maximum": 9999}, "ok": {"type": "boolean"}},
    "required": ["tool", "path", "line", "ok"], "additionalProperties": false}}"#;

/// The engine's stats once the step loop has published the last run's
/// steps (the snapshot is published after each step).
fn wait_published(engine: &EngineHandle, before: &kvc_engine::EngineStats) -> kvc_engine::EngineStats {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 && (s.steps > before.steps || Instant::now() > deadline) {
            return s;
        }
        std::thread::yield_now();
    }
}

/// Returns (prefill seconds, decode tok/s, overall output tok/s).
fn run(
    engine: &EngineHandle,
    batch: usize,
    prompt_len: usize,
    gen_len: usize,
    constraint: Option<&kvc_engine::Constraint>,
) -> (f64, f64, f64) {
    let t0 = Instant::now();
    let mut streams: Vec<_> = (0..batch)
        .map(|i| {
            let prompt = (0..prompt_len).map(|j| ((i * 7919 + j * 104729) % 150000) as u32 + 10).collect();
            engine
                .submit(GenerateRequest {
                    request_id: format!("bench-{i}"),
                    prompt_tokens: prompt,
                    sampling: SamplingParams {
                        temperature: 0.0,
                        max_tokens: gen_len,
                        ignore_eos: true,
                        constraint: constraint.cloned(),
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .expect("submit")
        })
        .collect();
    let mut first = vec![None; batch];
    let mut done = 0;
    let mut tokens = 0usize;
    // Round-robin over streams; each blocking_recv returns as soon as that
    // request has an event, so time stamps are per-event accurate enough.
    while done < batch {
        for (i, s) in streams.iter_mut().enumerate() {
            if first[i].is_some() && matches!(first[i], Some((_, true))) {
                continue;
            }
            match s.blocking_recv() {
                Some(StreamEvent::Token { .. }) => {
                    tokens += 1;
                    if first[i].is_none() {
                        first[i] = Some((t0.elapsed().as_secs_f64(), false));
                    }
                }
                Some(StreamEvent::Finished { .. }) | None => {
                    let t = first[i].map(|f| f.0).unwrap_or(0.0);
                    first[i] = Some((t, true));
                    done += 1;
                }
                Some(StreamEvent::Error(e) | StreamEvent::InvalidGrammar(e)) => panic!("{e}"),
                Some(StreamEvent::PromptLogprobs(_)) => {}
            }
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let prefill = first.iter().map(|f| f.unwrap().0).fold(0.0, f64::max);
    let decode_tokens = tokens.saturating_sub(batch) as f64;
    (prefill, decode_tokens / (total - prefill).max(1e-9), tokens as f64 / total)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Probe latency during a long prefill, and throughput with/without probes.
fn admission_bench(prompt_len: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let engine = EngineHandle::start(EngineConfig { max_num_batched_tokens: 512, ..Default::default() }).expect("engine");
    run(&engine, 1, 16, 4, None); // warm-up
                                  // Latency while a long prompt is prefilled in 512-token chunks next to 8 decodes.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let d = engine.admission(&kvc_engine::AdmissionQuery { session_id: Some("probe"), prompt_tokens: 2048 });
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(d);
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            lat
        })
    };
    let long = engine
        .submit(GenerateRequest {
            request_id: "long".into(),
            prompt_tokens: (0..prompt_len).map(|j| (j * 7919 % 150000) as u32 + 10).collect(),
            sampling: SamplingParams { temperature: 0.0, max_tokens: 4, ignore_eos: true, ..Default::default() },
            ..Default::default()
        })
        .expect("submit");
    let t0 = Instant::now();
    let (_, decode_tps, _) = run(&engine, 8, 32, 64, None);
    drop_until_done(long);
    stop.store(true, Ordering::Relaxed);
    let mut lat = prober.join().unwrap();
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "admission probe during a {prompt_len}-token prefill + 8 decodes ({:.1} s, {} probes):",
        t0.elapsed().as_secs_f64(),
        lat.len()
    );
    println!(
        "  p50 {:.4} ms  p99 {:.4} ms  max {:.4} ms  (decode {decode_tps:.1} tok/s)",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );
    // Throughput with and without 100 probes/s, alternating runs.
    let mut with = Vec::new();
    let mut without = Vec::new();
    for round in 0..6 {
        let probing = round % 2 == 1;
        let stop = Arc::new(AtomicBool::new(false));
        let h = probing.then(|| {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(engine.admission(&kvc_engine::AdmissionQuery { session_id: None, prompt_tokens: 512 }));
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })
        });
        let (_, tps, _) = run(&engine, 16, 64, 48, None);
        stop.store(true, Ordering::Relaxed);
        if let Some(h) = h {
            h.join().unwrap();
        }
        if probing {
            with.push(tps)
        } else {
            without.push(tps)
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "decode tok/s at batch 16, 3 runs each: without probes {:.1} {:?}; with 100 probes/s {:.1} {:?}",
        mean(&without),
        without.iter().map(|x| x.round()).collect::<Vec<_>>(),
        mean(&with),
        with.iter().map(|x| x.round()).collect::<Vec<_>>()
    );
}

fn drop_until_done(mut s: kvc_engine::RequestStream) {
    while let Some(ev) = s.blocking_recv() {
        if matches!(ev, StreamEvent::Finished { .. } | StreamEvent::Error(_) | StreamEvent::InvalidGrammar(_)) {
            break;
        }
    }
}
