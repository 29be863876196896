//! Which device the engine runs on (`--device auto|cpu|cuda|cuda:N`, as
//! vLLM's and mistral.rs's device flags) and how large the KV pool on a GPU
//! is (`--gpu-memory-utilization`, vLLM's meaning: the fraction of the
//! GPU's memory this engine may use in all, weights included).

use candle_core::Device;
use kvc_kv_pool::{KvLayout, KvPool, KvStorage, MemoryRegion};

use crate::EngineError;

/// Resolves the device flag. `auto` picks CUDA device 0 when the binary is
/// built with the `cuda` feature and a device opens, else the CPU.
pub fn select(flag: &str) -> Result<Device, EngineError> {
    let err = |e: String| EngineError::Load(e);
    match flag {
        "cpu" => Ok(Device::Cpu),
        "auto" => {
            if cfg!(feature = "cuda") {
                if let Ok(d) = open_cuda(0) {
                    return Ok(d);
                }
            }
            Ok(Device::Cpu)
        }
        "cuda" => open_cuda(0),
        f => match f.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => open_cuda(n),
            _ => Err(err(format!("unknown device {f:?} (auto, cpu, cuda, cuda:N)"))),
        },
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device, EngineError> {
    let d = Device::new_cuda(ordinal).map_err(|e| EngineError::Load(format!("CUDA device {ordinal}: {e}")))?;
    kvc_model_qwen3::cuda::prepare_device(&d).map_err(|e| EngineError::Load(format!("CUDA device {ordinal}: {e}")))?;
    Ok(d)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device, EngineError> {
    Err(EngineError::Load("this binary was built without CUDA (cargo build --features cuda; see scripts/cuda_setup.sh)".into()))
}

/// Bytes for the KV pool on a GPU after the weights are loaded: the
/// utilisation share of total memory, minus what is in use now, minus a
/// reserve for a step's activations (`max_num_batched_tokens` tokens).
pub fn gpu_kv_budget(device: &Device, utilization: f64, max_batched_tokens: usize) -> Result<usize, EngineError> {
    #[cfg(feature = "cuda")]
    {
        let (free, total) = kvc_model_qwen3::cuda::memory_info(device).map_err(|e| EngineError::Load(e.to_string()))?;
        let used = total - free;
        let reserve = (2usize << 30).max(max_batched_tokens * (256 << 10));
        let allowed = (total as f64 * utilization.clamp(0.05, 1.0)) as usize;
        let budget = allowed.saturating_sub(used).saturating_sub(reserve);
        if budget == 0 {
            return Err(EngineError::Load(format!(
                "no GPU memory left for the KV pool: {used} bytes in use of {total}, utilization {utilization}, \
                 activation reserve {reserve}; raise --gpu-memory-utilization or lower --max-num-batched-tokens"
            )));
        }
        Ok(budget)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, utilization, max_batched_tokens);
        Err(EngineError::Load("built without CUDA".into()))
    }
}

/// The KV pool: host memory on a CPU; on a GPU one zeroed allocation that
/// a peer process can map (CUDA IPC), so that Mooncake's intra-node NVLink
/// transport can write into it as well as its TCP transport.
pub fn kv_pool(layout: KvLayout, num_blocks: usize, device: &Device) -> Result<KvPool, EngineError> {
    let load = |e: String| EngineError::Load(e);
    if device.is_cpu() {
        return KvPool::new(layout, num_blocks).map_err(|e| load(e.to_string()));
    }
    #[cfg(feature = "cuda")]
    {
        let n = layout.num_layers * num_blocks * layout.block_elems();
        let t = kvc_model_qwen3::cuda::zeros_shareable(device, n, layout.dtype)
            .map_err(|e| load(format!("KV pool of {num_blocks} blocks on {device:?}: {e}")))?;
        let storage = KvStorage::from_device_tensor(layout, num_blocks, t).map_err(|e| load(e.to_string()))?;
        Ok(KvPool::with_storage(storage))
    }
    #[cfg(not(feature = "cuda"))]
    Err(load("built without CUDA".into()))
}

/// The host tier's memory for a GPU pool of `slots` blocks: pinned host
/// memory whose copies run on a copy stream (None for a host pool, whose
/// tier keeps plain vectors, or when `slots` is 0).
pub fn host_arena(storage: &KvStorage, slots: usize) -> Result<Option<Box<dyn kvc_kv_pool::HostArena>>, EngineError> {
    if storage.device_tensor().is_none() || slots == 0 {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    {
        let bytes = slots * storage.layout().bytes_per_block();
        let started = std::time::Instant::now();
        let arena = kvc_kv_pool::PinnedArena::new(storage, slots)
            .map_err(|e| EngineError::Load(format!("--swap-space: {bytes} bytes of pinned host memory: {e}")))?;
        tracing::info!(event = "host_tier", slots, bytes, secs = started.elapsed().as_secs_f64(), "pinned host tier allocated");
        Ok(Some(Box::new(arena)))
    }
    #[cfg(not(feature = "cuda"))]
    Err(EngineError::Load("a GPU KV pool in a build without CUDA".into()))
}

/// The KV pool's memory, for registration with a KV transport: its host
/// region, or on a GPU its device allocation (`MemoryLocation::Cuda`).
pub fn kv_region(storage: &KvStorage) -> Option<MemoryRegion> {
    storage.regions().first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_bad_flags() {
        assert!(select("cpu").unwrap().is_cpu());
        assert!(select("tpu").is_err());
        assert!(select("cuda:x").is_err());
        if !cfg!(feature = "cuda") {
            assert!(select("auto").unwrap().is_cpu());
            assert!(select("cuda").is_err());
        }
    }
}
