//! The step loop. (stub)
use std::sync::{mpsc as std_mpsc, Arc, RwLock};
use tokio::sync::mpsc;
use crate::{tokenizer::TextTokenizer, EngineConfig, EngineError, EngineStats, GenerateRequest, StreamEvent};

pub(crate) enum Command {
    Submit { seq_id: u64, req: GenerateRequest, tx: mpsc::UnboundedSender<StreamEvent> },
    Cancel(u64),
    Shutdown,
}

pub(crate) struct EngineLoop;

impl EngineLoop {
    pub fn new(_model: (), _pool: (), _config: &EngineConfig, _tok: Arc<TextTokenizer>, _eos: Vec<u32>, _stats: Arc<RwLock<EngineStats>>) -> Result<Self, EngineError> { todo!() }
    pub fn max_model_len(&self) -> usize { todo!() }
    pub fn block_size(&self) -> usize { todo!() }
    pub fn num_blocks(&self) -> usize { todo!() }
    pub fn run(self, _rx: std_mpsc::Receiver<Command>) {}
}
