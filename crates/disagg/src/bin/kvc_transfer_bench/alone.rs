//! The "Mooncake alone" baseline: `mooncake_alone_bench` (C++, built by
//! mooncake-sys's build.rs against the same engine.so) as target and
//! initiator processes, sending the byte ranges kvc sent, one iteration per
//! request so that the runner can alternate them with kvc's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kvc_disagg::plan::ByteRange;

use crate::workload::Workload;

/// The driver, when mooncake-sys built it (wheel linkage).
pub fn driver() -> Option<PathBuf> {
    let path = env!("KVC_MOONCAKE_ALONE_BENCH");
    (!path.is_empty()).then(|| PathBuf::from(path)).filter(|p| p.is_file())
}

/// A target and an initiator process, connected and ready to move the plan.
pub struct AloneSession {
    target: Child,
    initiator: Child,
    to_initiator: Option<ChildStdin>,
    from_initiator: BufReader<ChildStdout>,
    plan_file: PathBuf,
}

impl AloneSession {
    /// `window`: most tasks in flight, as kvc's transport uses.
    pub fn start(driver: &Path, w: &Workload, plan: &[ByteRange], max_backoff_us: u64, window: usize) -> Result<Self> {
        let layout = w.spec.layout()?;
        let pool_bytes = (layout.bytes_per_block() * w.spec.num_blocks).to_string();
        let mut target = Command::new(driver)
            .args(["target", &pool_bytes])
            .env("GLOG_minloglevel", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {}", driver.display()))?;
        let ready = read_line(&mut BufReader::new(target.stdout.take().unwrap()))?;
        let fields: Vec<&str> = ready.split_whitespace().collect();
        let ["READY", segment, addr, _len] = fields.as_slice() else {
            let _ = target.kill();
            bail!("the baseline target said {ready:?}");
        };

        let plan_file = std::env::temp_dir().join(format!("kvc-transfer-bench-{}.plan", std::process::id()));
        let mut f = std::fs::File::create(&plan_file)?;
        for r in plan {
            writeln!(f, "{} {} {}", r.src_offset, r.dst_offset, r.len)?;
        }
        drop(f);
        let mut initiator = Command::new(driver)
            .args(["initiator", segment, addr, &pool_bytes])
            .arg(&plan_file)
            .args([max_backoff_us.to_string(), window.to_string()])
            .env("GLOG_minloglevel", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let to_initiator = initiator.stdin.take();
        let mut from_initiator = BufReader::new(initiator.stdout.take().unwrap());
        let line = read_line(&mut from_initiator)?;
        if line.trim() != "READY" {
            bail!("the baseline initiator said {line:?}");
        }
        Ok(Self { target, initiator, to_initiator, from_initiator, plan_file })
    }

    /// Moves the plan once; its duration as the driver measured it.
    pub fn iteration(&mut self) -> Result<Duration> {
        let to = self.to_initiator.as_mut().expect("open until drop");
        to.write_all(b"GO\n")?;
        to.flush()?;
        let line = read_line(&mut self.from_initiator)?;
        match line.trim().strip_prefix("ITER ").and_then(|n| n.parse::<u64>().ok()) {
            Some(ns) => Ok(Duration::from_nanos(ns)),
            None => bail!("the baseline initiator said {line:?}"),
        }
    }
}

impl Drop for AloneSession {
    fn drop(&mut self) {
        // Both clean up and exit when their stdin closes.
        drop(self.to_initiator.take());
        let _ = self.initiator.wait();
        drop(self.target.stdin.take());
        let _ = self.target.wait();
        let _ = std::fs::remove_file(&self.plan_file);
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        bail!("the baseline process exited");
    }
    Ok(line)
}
