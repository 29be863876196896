//! `kvc-bench engine`'s steps beside the plain prefill and decode tables
//! (bench/model.rs): prefill capacity on a workload's own prompts
//! (`--prefill-mix`) and a prefill chunk sharing a step with decodes.

use std::time::Instant;

use candle_core::Device;
use kvc_kv_pool::{BlockId, KvPool};
use kvc_model_qwen3::{BatchInput, Qwen3Model, SeqChunk};

use super::model_bench::{greedy, profiled, sync};
use super::roofs::hbm_bytes_per_s;

/// Prefill capacity on a workload's own prompts: one prompt as long as its
/// longest is prefilled in `chunk`-token chunks (as the server's
/// `--max-num-batched-tokens` cuts it), timing each; a prompt of `new`
/// tokens after `cached` ones costs the time from depth `cached` to
/// `cached + new` on that curve (interpolated within a chunk), so the
/// quadratic attention of long prompts is priced as it is paid. Prints the
/// curve's tok/s by depth and the workload's tokens over their summed time.
pub(crate) fn prefill_mix_capacity(
    model: &Qwen3Model,
    pool: &mut KvPool,
    device: &Device,
    mix: &[(usize, usize)],
    chunk: usize,
    bs: usize,
) {
    let len = mix.iter().map(|&(c, n)| c + n).max().unwrap_or(0);
    let table: Vec<BlockId> = (0..len.div_ceil(bs) as BlockId).collect();
    let tokens: Vec<u32> = (0..len).map(|i| ((i * 7919) % 150000) as u32 + 10).collect();
    // Cumulative seconds at each chunk's end: a warm-up pass (plans for
    // each shape), then the timed one.
    let mut ends = vec![(0usize, 0.0f64)];
    for pass in 0..2 {
        ends.truncate(1);
        let mut total = 0.0;
        let mut start = 0;
        while start < len {
            let n = chunk.min(len - start);
            let batch = BatchInput {
                tokens: tokens[start..start + n].to_vec(),
                seqs: vec![SeqChunk { start: 0, len: n, context_len: start + n, block_table: &table }],
                logits_rows: vec![n - 1],
            };
            sync(device);
            let t = Instant::now();
            greedy(&model.forward(&batch, &mut pool.storage).expect("prefill chunk"));
            total += t.elapsed().as_secs_f64();
            start += n;
            ends.push((start, total));
        }
        if pass == 0 {
            eprintln!("prefill mix: warm-up pass {:.1} s", total);
        }
    }
    // Seconds to reach depth x on the curve.
    let at = |x: usize| -> f64 {
        let i = ends.partition_point(|&(e, _)| e < x).min(ends.len() - 1);
        if i == 0 {
            return 0.0;
        }
        let ((e0, t0), (e1, t1)) = (ends[i - 1], ends[i]);
        t0 + (t1 - t0) * (x - e0) as f64 / (e1 - e0).max(1) as f64
    };
    println!("\nprefill capacity on the workload's prompts ({} prompts, {chunk}-token chunks; curve to {len} tokens):", mix.len());
    println!("{:>10} {:>12}", "depth", "chunk tok/s");
    for w in ends.windows(2).step_by((ends.len() / 12).max(1)) {
        println!("{:>10} {:>12.0}", w[1].0, (w[1].0 - w[0].0) as f64 / (w[1].1 - w[0].1));
    }
    let new: usize = mix.iter().map(|m| m.1).sum();
    let secs: f64 = mix.iter().map(|&(c, n)| at(c + n) - at(c)).sum();
    println!(
        "workload prefill capacity: {:.0} tok/s ({new} tokens to compute in {secs:.1} s; {} of {} prompt tokens cached)",
        new as f64 / secs,
        mix.iter().map(|m| m.0).sum::<usize>(),
        mix.iter().map(|m| m.0 + m.1).sum::<usize>()
    );
}

/// What decodes cost inside a step that also prefills: the chunk alone,
/// the decodes alone, and both as one batch (median of 5 after 2 warm-ups
/// each), with the K/V the decodes read.
pub(crate) fn mixed_step(
    model: &Qwen3Model,
    pool: &mut KvPool,
    device: &Device,
    (n, depth, b, ctx): (usize, usize, usize, usize),
    bs: usize,
) {
    let chunk_table: Vec<BlockId> = (0..(depth + n).div_ceil(bs) as BlockId).collect();
    let per = (ctx + 1).div_ceil(bs);
    let base = chunk_table.len();
    let tables: Vec<Vec<BlockId>> = (0..b).map(|i| ((base + i * per) as BlockId..(base + (i + 1) * per) as BlockId).collect()).collect();
    let chunk_tokens: Vec<u32> = (0..n).map(|i| ((i * 7919) % 150000) as u32 + 10).collect();
    let decode_tokens: Vec<u32> = (0..b).map(|i| (i * 31 % 1000) as u32 + 10).collect();
    let chunk_seq = SeqChunk { start: 0, len: n, context_len: depth + n, block_table: &chunk_table };
    let decodes = |offset: usize| -> Vec<SeqChunk<'_>> {
        tables.iter().enumerate().map(|(i, t)| SeqChunk { start: offset + i, len: 1, context_len: ctx + 1, block_table: t }).collect()
    };
    let cases: Vec<(&str, BatchInput)> = vec![
        ("chunk alone", BatchInput { tokens: chunk_tokens.clone(), seqs: vec![chunk_seq.clone()], logits_rows: vec![n - 1] }),
        ("decodes alone", BatchInput { tokens: decode_tokens.clone(), seqs: decodes(0), logits_rows: (0..b).collect() }),
        (
            "both, one step",
            BatchInput {
                tokens: chunk_tokens.iter().chain(&decode_tokens).copied().collect(),
                seqs: std::iter::once(chunk_seq.clone()).chain(decodes(n)).collect(),
                logits_rows: std::iter::once(n - 1).chain(n..n + b).collect(),
            },
        ),
    ];
    println!("\nmixed step: a {n}-token chunk after {depth} tokens of context beside {b} decodes at context {ctx} (median of 5)");
    let mut ms = Vec::new();
    let tags = ["mixed-chunk", "mixed-decodes", "mixed-both"];
    for ((name, batch), tag) in cases.iter().zip(tags) {
        let (mut times, mut enqueue) = (Vec::new(), Vec::new());
        for i in 0..7 {
            sync(device);
            let t = Instant::now();
            let logits = if i == 6 {
                profiled(device, tag, || model.forward(batch, &mut pool.storage))
            } else {
                model.forward(batch, &mut pool.storage)
            };
            let queued = t.elapsed().as_secs_f64();
            greedy(&logits.expect("mixed step"));
            if i >= 2 {
                times.push(t.elapsed().as_secs_f64());
                enqueue.push(queued);
            }
        }
        times.sort_by(|a, b| a.total_cmp(b));
        enqueue.sort_by(|a, b| a.total_cmp(b));
        ms.push(times[2] * 1e3);
        // The host's time to launch the step, against the step: near 1, the
        // GPU waits for the host (launch-bound); well under, for its kernels.
        println!("{name:>16} {:>9.2} ms (host launches in {:.2} ms)", times[2] * 1e3, enqueue[2] * 1e3);
    }
    let hbm = hbm_bytes_per_s(device);
    let kv = (b * (ctx + 1)) as f64 * model.kv_layout(bs).bytes_per_block() as f64 / bs as f64;
    println!(
        "decodes inside the step: {:+.2} ms ({:.2} ms each; their K/V, {:.1} GB, is {:.2} ms at {:.1} TB/s)",
        ms[2] - ms[0],
        (ms[2] - ms[0]) / b as f64,
        kv / 1e9,
        kv / hbm * 1e3,
        hbm / 1e12
    );
}
