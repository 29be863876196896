//! Shared by the end-to-end tests: a real `kvc-server` process, the
//! `kvc-replay` binary, scratch directories.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The trace slice the tests replay: the last 43 requests of
/// shared/traces/mooncake_synthetic_trace.jsonl (its busiest stretch for
/// prefix sharing), copied so the tests do not depend on shared/.
pub const MOONCAKE_SLICE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mooncake_tail43.jsonl");

/// `kvc-server` from this build's target directory (or `KVC_SERVER_BIN`).
/// Cargo cannot build another package's binary for these tests, so it
/// must be built first: `cargo build -p kvc-server`.
pub fn server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KVC_SERVER_BIN") {
        return PathBuf::from(p);
    }
    // This test executable lives in <target>/<profile>/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    profile_dir.join(format!("kvc-server{}", std::env::consts::EXE_SUFFIX))
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn http_get(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").ok()?;
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().nth(1)?.parse().ok()
}

/// `METHOD path` on 127.0.0.1:`port`: (status, body). Plain HTTP/1.1, no
/// request body.
pub fn http_call(port: u16, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// The samples of a Prometheus exposition: `name{labels}` -> value.
pub fn metric_samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// A kvc-server child process on 127.0.0.1, killed on drop.
pub struct KvcServer {
    child: Child,
    pub port: u16,
    pub url: String,
}

impl KvcServer {
    /// Starts the server (embedded tiny model) and waits for /health.
    pub fn start(extra: &[&str]) -> KvcServer {
        let bin = server_bin();
        assert!(
            bin.exists(),
            "kvc-server binary not found at {}.\nThese end-to-end tests run a real server process; build it first with \
             `cargo build -p kvc-server` (in CI: before `cargo test --workspace`), or set KVC_SERVER_BIN.",
            bin.display()
        );
        let port = free_port();
        let log = std::env::temp_dir().join(format!("kvc-replay-test-server-{port}.log"));
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map(Stdio::from).unwrap_or(Stdio::null()))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut server = KvcServer { child, port, url: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if http_get(port, "/health") == Some(200) {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("kvc-server exited with {status} before it was healthy:\n{log}");
            }
            assert!(Instant::now() < deadline, "kvc-server not healthy within 120 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for KvcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh scratch directory named for the test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvc-replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `kvc-replay` with `args`, asserting it succeeds; returns stdout.
pub fn replay(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvc-replay")).args(args).output().expect("run kvc-replay");
    assert!(out.status.success(), "kvc-replay {args:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

pub fn read_rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}
