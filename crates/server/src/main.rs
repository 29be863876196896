//! `kvc-server`: parse flags, then run the role: a worker (`both`,
//! `prefill`, `decode`: load the engine, serve HTTP) or the router.

use std::io::IsTerminal;

use clap::{CommandFactory, Parser};
use kvc_server::args::{Args, Role};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Err(msg) = args.check_role() {
        Args::command().error(clap::error::ErrorKind::InvalidValue, msg).exit();
    }
    if matches!(args.role, Role::Prefill | Role::Decode) {
        // Mooncake reads its environment when loaded: a missing setting
        // needs a fresh start of the process (an exec, before any thread).
        kvc_server::pd::exposure::ensure_mooncake_env(args.disagg.kv_transport_host.as_deref(), &args.host)
            .map_err(|e| anyhow::anyhow!("cannot restart with Mooncake's IPv6 setting: {e}"))?;
    }
    if args.role == Role::Router {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        return runtime.block_on(kvc_server::router::serve(&args));
    }
    let mut config = args.engine_config();
    config.kernels = kvc_engine::kernel_plan::request_from_env()?;
    tracing::info!(?config, role = %args.role_name(), "starting engine");
    // The engine loads on a thread of its own while the port answers probes.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = runtime.block_on(kvc_server::routes::serve_worker(config, &args));
    // Tokenizations still running in the blocking pool must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}
