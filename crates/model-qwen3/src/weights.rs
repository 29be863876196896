//! Where weights come from: safetensors files (single or sharded, any of
//! f32 / bf16 / f16, converted to the compute dtype on load; block-FP8
//! weights dequantized, or handed over as they are stored when asked for
//! in `DType::F8E4M3`; a plain checkpoint's projections quantized to
//! block FP8 as they are read, with `--quantization fp8`) or dummy random
//! weights for any config (quantized to block FP8 when the config says so
//! and the GPU path asks for FP8).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use rand::{Rng, SeedableRng};

use crate::fp8::{stored_in_fp8, BlockFp8};
use crate::ModelError;

/// The safetensors files of a checkpoint directory: the shards listed in
/// `model.safetensors.index.json`, or `model.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::Weights(format!("{}: {e}", index.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Weights(format!("{}: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::Weights(format!("{}: no weight_map", index.display())))?;
        let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
        files.sort();
        files.dedup();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.exists()) {
            return Err(ModelError::Weights(format!("shard {} listed in the index is missing", missing.display())));
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ModelError::Weights(format!("no model.safetensors or model.safetensors.index.json in {}", dir.display())))
}

/// Called with the bytes each tensor occupies in its file, as it is read
/// (load progress).
pub type OnTensor = Box<dyn Fn(u64) + Send + Sync>;

/// A checkpoint's safetensors, memory-mapped, behind a [`VarBuilder`]
/// (tensors are converted to the compute dtype as they are read), with
/// the names of the tensors read so far: once the model is built,
/// [`Self::check_all_read`] refuses a checkpoint that holds tensors kvc
/// did not read (a quantized checkpoint's scales, say), which would
/// otherwise be silently ignored.
pub struct Checkpoint {
    pub vb: VarBuilder<'static>,
    names: Vec<String>,
    read: Arc<Mutex<HashSet<String>>>,
}

/// Tensor dtypes kvc converts to the compute dtype as they are: anything
/// else (FP8, packed integers) needs scales or unpacking kvc does not do.
const PLAIN_DTYPES: [safetensors::Dtype; 3] = [safetensors::Dtype::F32, safetensors::Dtype::BF16, safetensors::Dtype::F16];

impl Checkpoint {
    /// Opens `dir`'s safetensors, reporting every tensor read to
    /// `on_tensor`. Refuses, before reading any, a checkpoint with a
    /// tensor in a dtype kvc does not load as it is.
    /// With `fp8` (a block-FP8 `quantization_config`), FP8 weights are
    /// taken too, each dequantized at load with its `weight_scale_inv`.
    /// With `at_load` (`--quantization fp8` over a plain checkpoint), the
    /// tensors a block-FP8 checkpoint would store in FP8 are quantized in
    /// those blocks as they are read ([`Observed::quantized_at_load`]).
    pub fn open(
        dir: &Path,
        dtype: DType,
        device: &Device,
        fp8: Option<BlockFp8>,
        at_load: Option<BlockFp8>,
        on_tensor: OnTensor,
    ) -> Result<Self, ModelError> {
        let files = safetensors_files(dir)?;
        // SAFETY: the files are memory-mapped read-only; modifying them while
        // the server runs is undefined, as with every mmap-based loader.
        let inner =
            unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(|e| ModelError::Weights(e.to_string()))?;
        let mut names = Vec::new();
        let mut odd: Vec<String> = Vec::new();
        for (name, view) in inner.tensors() {
            let fp8_weight = fp8.is_some() && view.dtype() == safetensors::Dtype::F8_E4M3;
            if !PLAIN_DTYPES.contains(&view.dtype()) && !fp8_weight {
                odd.push(format!("{name} ({:?})", view.dtype()));
            }
            names.push(name);
        }
        if !odd.is_empty() {
            odd.sort();
            return Err(ModelError::Weights(format!(
                "the checkpoint holds {} tensor(s) in dtypes kvc does not load (it loads f32 / bf16 / f16 weights, and \
                 F8_E4M3 ones where config.json's quantization_config says block fp8): {}",
                odd.len(),
                sample(&odd)
            )));
        }
        let read = Arc::new(Mutex::new(HashSet::new()));
        let at_load = at_load.map(BlockQuantizer::new);
        let backend: Box<dyn SimpleBackend> = Box::new(Observed { inner, on_tensor, read: read.clone(), fp8, at_load });
        Ok(Self { vb: VarBuilder::from_backend(backend, dtype, device.clone()), names, read })
    }

    /// After the model is built: every tensor of the checkpoint was read,
    /// but for those known to carry nothing the model needs (`ignorable`).
    pub fn check_all_read(&self, ignorable: impl Fn(&str) -> bool) -> Result<(), ModelError> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let mut unread: Vec<String> = self.names.iter().filter(|n| !read.contains(*n) && !ignorable(n)).cloned().collect();
        if unread.is_empty() {
            return Ok(());
        }
        unread.sort();
        Err(ModelError::Weights(format!(
            "the checkpoint holds {} tensor(s) kvc does not read (quantization scales, or parts of a model it does not \
             implement), which it would silently ignore: {}",
            unread.len(),
            sample(&unread)
        )))
    }
}

/// Up to five of `names`, and how many more.
fn sample(names: &[String]) -> String {
    let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        s += &format!(", ... ({} more)", names.len() - 5);
    }
    s
}

/// Bytes of a checkpoint's safetensors files (the load's total).
pub fn checkpoint_bytes(dir: &Path) -> Result<u64, ModelError> {
    Ok(safetensors_files(dir)?.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum())
}

struct Observed {
    inner: candle_core::safetensors::MmapedSafetensors,
    on_tensor: OnTensor,
    read: Arc<Mutex<HashSet<String>>>,
    fp8: Option<BlockFp8>,
    /// `--quantization fp8`.
    at_load: Option<BlockQuantizer>,
}

/// Weights quantized to block FP8 as they are asked for (`--quantization
/// fp8`, and dummy FP8 weights), each one's scales kept until the
/// `{weight}_scale_inv` request that follows takes them.
struct BlockQuantizer {
    blocks: BlockFp8,
    scales: Mutex<HashMap<String, Tensor>>,
}

impl BlockQuantizer {
    fn new(blocks: BlockFp8) -> Self {
        Self { blocks, scales: Mutex::new(HashMap::new()) }
    }

    /// `w: [.., N, K]` as block-FP8 checkpoints are made (per block: scale
    /// = amax / 448, e4m3 of w / scale), on `w`'s device: on a GPU by kvc's
    /// kernel in 128x128 blocks (candle has no e4m3 cast there), else on
    /// the host.
    fn quantize(&self, w: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        #[cfg(feature = "cuda")]
        if w.device().is_cuda() && self.blocks.block == (crate::fp8::GEMM_BLOCK, crate::fp8::GEMM_BLOCK) {
            return crate::cuda::quantize_blocks(w);
        }
        let (q, scale) = self.blocks.quantize(&w.to_device(&Device::Cpu)?)?;
        Ok((q.to_device(w.device())?, scale.to_device(w.device())?))
    }

    /// Keeps `weight`'s scales for its `_scale_inv` request.
    fn keep(&self, weight: &str, scale: Tensor) {
        self.scales.lock().unwrap_or_else(|e| e.into_inner()).insert(BlockFp8::scale_name(weight), scale);
    }

    /// The scales kept under `name` (`{weight}_scale_inv`), if any, checked
    /// against the shape asked for.
    fn take(&self, name: &str, s: Option<&Shape>) -> candle_core::Result<Option<Tensor>> {
        let Some(t) = self.scales.lock().unwrap_or_else(|e| e.into_inner()).remove(name) else { return Ok(None) };
        if let Some(s) = s.filter(|s| t.shape() != *s) {
            candle_core::bail!("shape mismatch for {name}, expected {s:?}, got {:?}", t.shape());
        }
        Ok(Some(t))
    }
}

impl Observed {
    fn report(&self, name: &str) {
        if let Ok(view) = self.inner.get(name) {
            (self.on_tensor)(view.data().len() as u64);
        }
        self.read.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
    }
}

impl Observed {
    /// `name`'s e4m3 bytes as stored (the GPU path's FP8 weights; the
    /// caller reads `{name}_scale_inv` itself).
    fn fp8_stored(&self, s: &Shape, name: &str, dev: &Device) -> candle_core::Result<Tensor> {
        let stored = self.inner.get(name)?.dtype();
        if self.fp8.is_none() || stored != safetensors::Dtype::F8_E4M3 {
            candle_core::bail!("{name} was asked for in FP8, but it is stored as {stored:?} (not under a block-FP8 config)");
        }
        let t = self.inner.load(name, &Device::Cpu)?;
        if t.shape() != s {
            candle_core::bail!("shape mismatch for {name}, expected {s:?}, got {:?}", t.shape());
        }
        self.report(name);
        t.to_device(dev)
    }

    /// `name` dequantized (fp8.rs) if it is stored in FP8 under a block-FP8
    /// config: its scales are read (and reported) with it.
    fn fp8_weight(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Option<Tensor>> {
        let Some(fp8) = self.fp8 else { return Ok(None) };
        if self.inner.get(name)?.dtype() != safetensors::Dtype::F8_E4M3 {
            return Ok(None);
        }
        let scale_name = BlockFp8::scale_name(name);
        if !SimpleBackend::contains_tensor(&self.inner, &scale_name) {
            candle_core::bail!("{name} is stored in FP8 without {scale_name}: its scales are missing from the checkpoint");
        }
        let q = self.inner.load(name, &Device::Cpu)?;
        let scale = self.inner.load(&scale_name, &Device::Cpu)?;
        let w = fp8.dequantize(name, &q, &scale).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        self.report(name);
        self.report(&scale_name);
        Ok(Some(w.to_dtype(dtype)?.to_device(dev)?))
    }

    /// Whether `name` is quantized at load: `--quantization fp8`, and a
    /// tensor a block-FP8 checkpoint stores in FP8 that this one stores
    /// plainly.
    fn quantizes(&self, name: &str) -> bool {
        self.at_load.is_some() && stored_in_fp8(name) && self.inner.get(name).is_ok_and(|v| PLAIN_DTYPES.contains(&v.dtype()))
    }

    /// `name` read and quantized as block-FP8 checkpoints are made (per
    /// block: scale = amax / 448, e4m3 of w / scale): asked for in
    /// `DType::F8E4M3` (the GPU path's FP8 GEMMs), the e4m3 weight, its
    /// scales kept for the `_scale_inv` request that follows; asked for in
    /// another dtype (the CPU path, or a projection the GEMMs do not
    /// take), the quantized weight's values, as a checkpoint stored in FP8
    /// would be dequantized.
    fn quantized_at_load(&self, s: Shape, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let Some(at_load) = &self.at_load else { candle_core::bail!("{name}: no quantization at load") };
        let w = SimpleBackend::get(&self.inner, s, name, Init::Const(0.), DType::F32, dev)?;
        self.report(name);
        let (q, scale) = at_load.quantize(&w)?;
        if dtype == DType::F8E4M3 {
            at_load.keep(name, scale);
            return Ok(q);
        }
        let w = at_load.blocks.dequantize(name, &q, &scale).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        w.to_dtype(dtype)?.to_device(dev)
    }

    /// The scales [`Self::quantized_at_load`] kept for `name`
    /// (`{weight}_scale_inv`), if it made them.
    fn scales_made_at_load(&self, name: &str, s: Option<&Shape>) -> candle_core::Result<Option<Tensor>> {
        self.at_load.as_ref().map_or(Ok(None), |q| q.take(name, s))
    }
}

impl SimpleBackend for Observed {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        if let Some(t) = self.scales_made_at_load(name, Some(&s))? {
            return t.to_dtype(dtype)?.to_device(dev);
        }
        if self.quantizes(name) {
            return self.quantized_at_load(s, name, dtype, dev);
        }
        if dtype == DType::F8E4M3 {
            return self.fp8_stored(&s, name, dev);
        }
        if let Some(t) = self.fp8_weight(name, dtype, dev)? {
            if t.shape() != &s {
                candle_core::bail!("shape mismatch for {name}, expected {s:?}, got {:?}", t.shape());
            }
            return Ok(t);
        }
        let t = SimpleBackend::get(&self.inner, s, name, h, dtype, dev)?;
        self.report(name);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        if let Some(t) = self.scales_made_at_load(name, None)? {
            return t.to_dtype(dtype)?.to_device(dev);
        }
        if self.quantizes(name) {
            let s = Shape::from(self.inner.get(name)?.shape().to_vec());
            return self.quantized_at_load(s, name, dtype, dev);
        }
        if let Some(t) = self.fp8_weight(name, dtype, dev)? {
            return Ok(t);
        }
        let t = SimpleBackend::get_unchecked(&self.inner, name, dtype, dev)?;
        self.report(name);
        Ok(t)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        if let Some(base) = name.strip_suffix("_scale_inv") {
            if self.quantizes(base) {
                return true;
            }
        }
        SimpleBackend::contains_tensor(&self.inner, name)
    }
}

/// Random weights: each tensor is drawn from a generator seeded by its
/// name and `seed`, so the same config and seed give the same model.
/// Norm weights are ones. With `fp8` (a block-FP8 config), the decoder
/// layers' projections (and fused experts) have scales too: asked for in
/// `DType::F8E4M3`, a weight is drawn, quantized ([`BlockFp8::quantize`])
/// and its `_scale_inv` kept for the request that follows.
pub fn dummy_var_builder(seed: u64, dtype: DType, device: &Device, fp8: Option<BlockFp8>) -> VarBuilder<'static> {
    // On a GPU, weights are drawn there (curand) and experts come fused:
    // the 30B-shaped model would take minutes to draw on one host thread.
    let fp8 = fp8.map(BlockQuantizer::new);
    let backend: Box<dyn SimpleBackend> = Box::new(DummyBackend { seed, on_device: !device.is_cpu(), fp8 });
    VarBuilder::from_backend(backend, dtype, device.clone())
}

struct DummyBackend {
    seed: u64,
    on_device: bool,
    /// The block-FP8 config's quantizer.
    fp8: Option<BlockQuantizer>,
}

impl SimpleBackend for DummyBackend {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        if let (Some(base), Some(fp8)) = (name.strip_suffix("_scale_inv"), &self.fp8) {
            let Some(t) = fp8.take(name, Some(&s))? else { candle_core::bail!("dummy FP8 scales {name}: ask for {base} in FP8 first") };
            return t.to_dtype(dtype);
        }
        if dtype == DType::F8E4M3 {
            let Some(fp8) = &self.fp8 else { candle_core::bail!("dummy weight {name} asked for in FP8 without a block-FP8 config") };
            let (q, scale) = fp8.quantize(&self.get(s, name, h, DType::F32, dev)?)?;
            fp8.keep(name, scale);
            return Ok(q);
        }
        if name.ends_with("norm.weight") {
            return Tensor::ones(s, dtype, dev);
        }
        let mut hasher = DefaultHasher::new();
        name.hash(&mut hasher);
        self.seed.hash(&mut hasher);
        // Uniform with standard deviation 0.05: big enough that routing and
        // sampling are not degenerate, small enough to keep activations sane.
        let a = 0.05f32 * 3f32.sqrt();
        if self.on_device {
            dev.set_seed(hasher.finish())?;
            return Tensor::rand(-a, a, s, dev)?.to_dtype(dtype);
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(hasher.finish());
        let data: Vec<f32> = (0..s.elem_count()).map(|_| rng.random_range(-a..a)).collect();
        Tensor::from_vec(data, s, &Device::Cpu)?.to_dtype(dtype)?.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("dummy weights need a shape for {name}")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        if let Some(base) = name.strip_suffix("_scale_inv") {
            return self.fp8.is_some() && stored_in_fp8(base);
        }
        // Expert weights are requested in the per-expert layout on a CPU,
        // fused on a GPU.
        self.on_device || (!name.contains("experts.gate_up_proj") && !name.ends_with("experts.down_proj"))
    }
}
