//! The backend a worker's role asks for, chosen once at start.

use std::sync::Arc;

use kvc_engine::EngineHandle;

use super::decode_worker::DecodeWorker;
use super::local::Local;
use super::Backend;
use crate::args::{Args, Role};
use crate::pd::PdState;

/// The backend `args` ask for; a prefill or decode worker starts its KV
/// link (and a decode worker its peer pollers and snapshot pusher), its
/// metrics joining `registry`. Call inside the runtime.
pub fn choose(engine: &EngineHandle, args: &Args, registry: &prometheus::Registry) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(match args.role {
        Role::Decode => Arc::new(DecodeWorker::new(PdState::start(engine, args, registry)?)),
        Role::Prefill => Arc::new(Local::with_disagg(Role::Prefill, PdState::start(engine, args, registry)?)),
        // A router runs no worker (main.rs); `both` otherwise.
        Role::Both | Role::Router => Arc::new(Local::colocated()),
    })
}
