//! Forward passes captured as CUDA graphs and replayed: decode steps in
//! serving, and what graphs save in launch overhead (measured by
//! `kvc-bench engine --cuda-graph`).
//!
//! The capture covers [`GpuModel::run`] only. Its inputs are copied to the
//! device first ([`GpuModel::prepare`]): a copy from pageable host memory
//! cannot be captured. Every allocation inside `run` is stream-ordered
//! (cudarc uses `cuMemAllocAsync` where the device supports it), so the
//! graph holds them as memory nodes. A replay recomputes the same step on
//! the same inputs. Nothing in `run` may copy from the host: candle's
//! `index_select` uploads its layout on every call, which a capture records
//! as a copy from freed host memory (the first attempt replayed into
//! CUDA_ERROR_ILLEGAL_ADDRESS), so rows are gathered by kvc's own kernel.
//!
//! Serving ([`DecodeGraphs`]) keeps one captured step per bucket of decode
//! batch sizes (vLLM's capture sizes: 1, 2, 4, then multiples of 8), a
//! batch padded up to its bucket, with input buffers rewritten before each
//! replay and launch shapes that depend only on the bucket.

use candle_core::cuda::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda::WrapErr;
use std::collections::HashMap;

use candle_core::{Result, Tensor};
use candle_nn::Embedding;
use kvc_kv_pool::KvStorage;

use super::attention::{fixed_plan_fits, fixed_splits};
use super::cuda_dev;
use super::model::{GpuModel, GraphInputsHost, StepInputs};
use super::ptr;
use crate::batch::BatchInput;
use crate::graph_bucket::graph_bucket;

/// A captured forward pass. Fields drop in order: the output allocation
/// first (live from the last replay), then the graph, then the inputs it
/// reads.
pub struct CapturedStep {
    logits: Tensor,
    graph: CudaGraph,
    inputs: StepInputs,
}

impl CapturedStep {
    /// Launches the graph (asynchronous, like the eager pass). The logits
    /// of the previous replay are freed and made again.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().w()
    }

    /// The logits of the latest replay, `[rows, vocab]` f32.
    pub fn logits(&self) -> &Tensor {
        &self.logits
    }
}

impl GpuModel {
    /// `prepare` + `run`, the `run` captured as a CUDA graph.
    pub fn capture(&self, embed: &Embedding, lm_head: &Tensor, batch: &BatchInput, kv: &KvStorage) -> Result<CapturedStep> {
        let inputs = self.prepare(embed, batch, kv)?;
        capture(self, embed, lm_head, inputs, kv)
    }
}

fn capture(model: &GpuModel, embed: &Embedding, lm_head: &Tensor, inputs: StepInputs, kv: &KvStorage) -> Result<CapturedStep> {
    let dev = cuda_dev(embed.embeddings().device())?;
    let stream = dev.cuda_stream();
    stream.synchronize().w()?;
    // `run` launches kvc's kernels, cuBLAS and candle ops that take their
    // shapes as kernel arguments. A candle op that uploads its layout from
    // the host (index_select, strided binary ops) would be captured as a
    // copy from a host buffer that is gone at replay; with candle's
    // parameter cache on, such an op fails the capture with a message
    // instead.
    let _htod_guard = dev.enable_cuda_graph_htod_cache();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).w()?;
    let logits = model.run(embed, lm_head, &inputs, kv, true);
    // End the capture also after an error, so that the stream works again.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let logits = logits?;
    let Some(graph) = ended.w()? else { candle_core::bail!("the capture recorded no work") };
    if let Some(dir) = std::env::var_os("KVC_GRAPH_DOT") {
        dump_dot(&graph, std::path::Path::new(&dir))?;
    }
    // One replay now, so that the output's memory exists before anything
    // reads or frees it.
    graph.launch().w()?;
    stream.synchronize().w()?;
    Ok(CapturedStep { logits, graph, inputs })
}

/// Writes `graph` as Graphviz (the driver's verbose dump: every node's
/// type, kernel and arguments) to `dir/graph-N.dot`, N counting the
/// captures of this process: `KVC_GRAPH_DOT=dir`, a diagnostic for what a
/// replay runs besides the kernels a profiler lists.
fn dump_dot(graph: &CudaGraph, dir: &std::path::Path) -> Result<()> {
    static CAPTURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CAPTURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("graph-{n}.dot"));
    let Some(c) = path.to_str().and_then(|p| std::ffi::CString::new(p).ok()) else {
        candle_core::bail!("KVC_GRAPH_DOT: {} is not a usable path", path.display())
    };
    let flags = sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32;
    // SAFETY: a live graph and a NUL-terminated path.
    unsafe { sys::cuGraphDebugDotPrint(graph.cu_graph(), c.as_ptr(), flags) }.result().w()?;
    Ok(())
}

/// The serving path's CUDA graphs: one decode step per bucket of batch
/// sizes up to `max_batch` ([`graph_bucket`]), captured at its first use
/// and replayed after with the step's inputs (padded to the bucket)
/// copied into the graph's input buffers. Launch shapes must not depend on
/// the batch's contents, so the attention plan is the fixed one
/// ([`super::attention::FixedPlanHost`]); the MoE block never reads back
/// to the host there (CUTLASS, or kvc's kernels in place of cuBLAS). A
/// capture that fails turns graphs off for the model, with the reason kept.
pub(crate) struct DecodeGraphs {
    max_batch: usize,
    steps: HashMap<usize, GraphStep>,
    disabled: Option<String>,
}

struct GraphStep {
    step: CapturedStep,
    /// The KV pool the graph was captured on.
    cache_base: u64,
    /// Room in its block-table buffer (entries).
    table_capacity: usize,
}

// SAFETY: a graph and its buffers are only used by the thread that runs
// the model (the engine loop); CUDA graph and memory handles are valid on
// any thread of the process.
unsafe impl Send for DecodeGraphs {}

/// The block padding decodes read their one (unstored) token's context
/// from: any block of the pool will do, its contents only reach their
/// dropped rows.
const PAD_TABLE: [kvc_kv_pool::BlockId; 1] = [0];

impl DecodeGraphs {
    pub fn new(max_batch: usize) -> Self {
        Self { max_batch, steps: HashMap::new(), disabled: None }
    }

    /// Decodes only (one token per sequence, sequence i at row i, logits
    /// for every row), at most `max_batch` of them.
    pub fn takes(&self, model: &GpuModel, batch: &BatchInput) -> bool {
        let n = batch.seqs.len();
        let (nh, nkv) = model.heads();
        self.disabled.is_none()
            && graph_bucket(n, self.max_batch).is_some()
            && fixed_plan_fits(nh, nkv)
            && batch.tokens.len() == n
            && batch.logits_rows.iter().copied().eq(0..n)
            && batch.seqs.iter().enumerate().all(|(i, s)| s.len == 1 && s.start == i)
    }

    pub fn disable(&mut self, why: String) {
        self.steps.clear();
        self.disabled = Some(why);
    }

    pub fn disabled(&self) -> Option<&str> {
        self.disabled.as_deref()
    }

    /// Runs `batch` (see [`Self::takes`]) through its bucket's graph; f32
    /// logits `[n, vocab]`, a copy that outlives the next replay.
    pub fn forward(&mut self, model: &GpuModel, embed: &Embedding, lm_head: &Tensor, batch: &BatchInput, kv: &KvStorage) -> Result<Tensor> {
        let n = batch.seqs.len();
        let Some(rows) = graph_bucket(n, self.max_batch) else { candle_core::bail!("{n} decodes: no CUDA graph bucket") };
        let (nh, nkv) = model.heads();
        let Some(cache) = kv.device_tensor() else { candle_core::bail!("CUDA graphs need a KV pool on the device") };
        let cache_base = ptr(cache)?;
        let host = GraphInputsHost::padded(batch, kv.layout().block_size, fixed_splits(rows, nkv), rows, &PAD_TABLE)?;
        let step = match self.steps.get(&rows) {
            Some(g) if g.cache_base == cache_base && g.table_capacity >= host.table_len() => {
                g.step.inputs.write(&host)?;
                g.step.replay()?;
                &g.step
            }
            _ => {
                // Room for twice these tables: contexts grow by a block at a
                // time, so a recapture for a longer table is rare.
                let table_capacity = (2 * host.table_len()).next_power_of_two().max(64usize);
                let inputs = StepInputs::from_graph_host(&host, nh, nkv, table_capacity, embed.embeddings().device())?;
                // The capture's one launch is this step's pass.
                let step = capture(model, embed, lm_head, inputs, kv)?;
                let again = self.steps.insert(rows, GraphStep { step, cache_base, table_capacity }).is_some();
                tracing::info!(
                    batch = rows,
                    decodes = n,
                    graphs = self.steps.len(),
                    table_capacity,
                    recapture = again,
                    "captured a decode step as a CUDA graph"
                );
                &self.steps[&rows].step
            }
        };
        if rows == n {
            step.logits().copy()
        } else {
            step.logits().narrow(0, 0, n)?.copy()
        }
    }
}
