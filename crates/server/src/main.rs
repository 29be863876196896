//! `kvc-server`: parse flags, then run the role: a worker (`both`,
//! `prefill`, `decode`: load the engine, serve HTTP) or the router.

use std::io::IsTerminal;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use kvc_engine::EngineHandle;
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
    if args.role == Role::Router {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        return runtime.block_on(kvc_server::router::serve(&args));
    }
    let config = args.engine_config();
    tracing::info!(?config, role = %args.role_name(), "starting engine");
    // The engine loads the model and runs its own thread; start it before
    // the async runtime so the load does not block a worker.
    let engine = EngineHandle::start(config).context("cannot start the engine")?;
    engine.warm_grammar_compiler();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = runtime.block_on(kvc_server::app::serve_worker(engine, &args));
    // Tokenizations still running in the blocking pool must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}
