//! One forward pass captured as a CUDA graph and replayed: what graphs
//! would save in launch overhead (issue 8, build item 4), measured by
//! `kvc-bench engine --cuda-graph`.
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
//! Serving with graphs needs more than this: persistent
//! input buffers per batch-size bucket, rewritten before each replay, and
//! launch shapes that do not depend on the batch's contents.

use candle_core::cuda::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda::WrapErr;
use candle_core::{Result, Tensor};
use candle_nn::Embedding;
use kvc_kv_pool::KvStorage;

use super::cuda_dev;
use super::model::{GpuModel, StepInputs};

/// A captured forward pass. Fields drop in order: the output allocation
/// first (live from the last replay), then the graph, then the inputs it
/// reads.
pub struct CapturedStep {
    logits: Tensor,
    graph: CudaGraph,
    _inputs: StepInputs,
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

pub(crate) fn capture(model: &GpuModel, embed: &Embedding, lm_head: &Tensor, inputs: StepInputs, kv: &KvStorage) -> Result<CapturedStep> {
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
    // One replay now, so that the output's memory exists before anything
    // reads or frees it.
    graph.launch().w()?;
    stream.synchronize().w()?;
    Ok(CapturedStep { logits, graph, _inputs: inputs })
}
