//! kvc-transfer-bench: two processes on 127.0.0.1 move N MiB of KV blocks
//! through kvc's Mooncake transport; prints GB/s and latency percentiles,
//! side by side with "Mooncake alone" (a C++ driver over the same engine.so
//! moving the same byte ranges, timed the same way).
//!
//!   kvc-transfer-bench run [--mib 64 --mib 1024] [--pattern both] [--iters 15]
//!   kvc-transfer-bench peer --control <addr> <pool flags>   (spawned by `run` and the tests)

mod alone;
mod stats;
mod workload;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use kvc_disagg::loopback::{self, PoolSpec};
use kvc_disagg::MooncakeConfig;

use crate::workload::Pattern;

#[derive(Parser)]
#[command(name = "kvc-transfer-bench", about = "KV transfer benchmark over the Mooncake Transfer Engine (loopback, two processes)")]
enum Cli {
    /// Run the benchmark.
    Run(RunArgs),
    /// Serve as the peer process (spawned by `run` and by the tests).
    Peer {
        #[arg(long)]
        control: SocketAddr,
        #[command(flatten)]
        pool: PoolSpec,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PatternArg {
    Contiguous,
    Scattered,
    Both,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Transfer sizes in MiB (rounded up to whole blocks across all layers).
    #[arg(long = "mib", default_values_t = [64u64, 1024])]
    mib: Vec<u64>,
    /// Which block lists to move: one run of consecutive blocks (one range
    /// per layer), random blocks on both sides (one range per block and
    /// layer), or both.
    #[arg(long, value_enum, default_value = "both")]
    pattern: PatternArg,
    /// Measured iterations per case and round (after one warm-up).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Rounds per case (fresh processes and pools each round); within a
    /// round kvc and the baseline alternate iteration by iteration.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Longest sleep between completion polls, microseconds (both sides).
    #[arg(long, default_value_t = 2000)]
    max_backoff_us: u64,
    /// Per-transfer timeout, seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Skip the Mooncake-alone baseline.
    #[arg(long)]
    no_baseline: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Pool shape (default: Qwen3-30B-A3B's KV, bf16); --num-blocks is ignored.
    #[command(flatten)]
    pool: PoolSpec,
}

fn main() -> Result<()> {
    match Cli::parse() {
        Cli::Peer { control, pool } => loopback::run_peer(control, &pool).context("peer"),
        Cli::Run(args) => run(args),
    }
}

fn run(args: RunArgs) -> Result<()> {
    let patterns = match args.pattern {
        PatternArg::Contiguous => vec![Pattern::Contiguous],
        PatternArg::Scattered => vec![Pattern::Scattered],
        PatternArg::Both => vec![Pattern::Contiguous, Pattern::Scattered],
    };
    let layout = args.pool.layout()?;
    println!(
        "kvc-transfer-bench: {} layers x {} kv heads x {} head dim, block {} tokens, {} -> {} KiB per block and layer; {} rounds x {} iterations (+1 warm-up each), loopback TCP",
        layout.num_layers,
        layout.num_kv_heads,
        layout.head_dim,
        layout.block_size,
        args.pool.dtype,
        layout.layer_block_bytes() / 1024,
        args.rounds,
        args.iters
    );
    let alone = alone::driver();
    if args.no_baseline {
        println!("baseline: skipped (--no-baseline)");
    } else if alone.is_none() {
        println!("baseline: unavailable (mooncake-sys built without the wheel's driver)");
    }
    println!("{}", stats::HEADER);
    let exe = std::env::current_exe()?;
    let backoff_max = Duration::from_micros(args.max_backoff_us);
    let timeout = Duration::from_secs(args.timeout_s);
    let window = MooncakeConfig::default().max_tasks_in_flight;
    for &mib in &args.mib {
        for &pattern in &patterns {
            let w = workload::Workload::new(&args.pool, mib << 20, pattern, args.seed)?;
            let baseline = alone.as_ref().filter(|_| !args.no_baseline);
            let (mut kvc, mut base, mut ranges, mut plan_time) = (Vec::new(), Vec::new(), 0, Duration::ZERO);
            for _ in 0..args.rounds.max(1) {
                // Both setups stay up for the round and take turns, one
                // iteration each, so load from the rest of the machine hits
                // them alike; each gets one warm-up iteration first.
                let mut k = workload::KvcSession::start(&exe, &w, backoff_max, timeout)?;
                let mut b = match baseline {
                    Some(driver) => Some(alone::AloneSession::start(driver, &w, &k.plan, args.max_backoff_us, window)?),
                    None => None,
                };
                k.iteration()?;
                if let Some(b) = b.as_mut() {
                    b.iteration()?;
                }
                for i in 0..args.iters {
                    if i % 2 == 1 {
                        if let Some(b) = b.as_mut() {
                            base.push(b.iteration()?);
                        }
                    }
                    kvc.push(k.iteration()?);
                    if i % 2 == 0 {
                        if let Some(b) = b.as_mut() {
                            base.push(b.iteration()?);
                        }
                    }
                }
                drop(b);
                ranges = k.plan.len();
                plan_time = plan_time.max(k.plan_time);
                if !k.finish()? {
                    bail!("{}: the peer's blocks differ from the sent ones", w.label());
                }
            }
            println!("{}", stats::row(&w, "kvc", ranges, &kvc));
            if !base.is_empty() {
                println!("{}", stats::row(&w, "mooncake-alone", ranges, &base));
                println!("{}", stats::ratio_row(&kvc, &base));
            }
            println!(
                "{:<9} {:<11} {:>6}  kvc planning (checks + coalescing) per transfer: {:.3} ms",
                "",
                "",
                "",
                plan_time.as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}
