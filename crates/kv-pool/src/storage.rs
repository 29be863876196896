//! Per-layer K/V storage, read and written through block tables: in host
//! memory, or on a GPU (one device tensor with the same layout, which the
//! CUDA model reads and writes with its own kernels).

use candle_core::{DType, Device, Tensor, WithDType};
use float8::F8E4M3;
use half::{bf16, f16};

use crate::{BlockId, KvLayout, KvPoolError};

/// A raw memory range of the storage, for registration with a transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    pub addr: usize,
    pub len: usize,
    pub location: MemoryLocation,
}

/// Where a [`MemoryRegion`] lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLocation {
    #[default]
    Host,
    /// Device memory of the CUDA device with this ordinal.
    Cuda(usize),
}

impl MemoryRegion {
    pub fn host(addr: usize, len: usize) -> Self {
        Self { addr, len, location: MemoryLocation::Host }
    }
}

enum Data {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    /// The FP8 KV cache (`--kv-cache-dtype fp8`): e4m3 of K / k_scale and
    /// V / v_scale, saturated at +-448 (vLLM's convention).
    F8E4M3(Vec<F8E4M3>),
}

pub struct KvStorage {
    layout: KvLayout,
    num_blocks: usize,
    data: Data,
    /// Per layer, the (K, V) scales of an FP8 cache: stored = x / scale,
    /// read back = stored * scale (1.0 unless set; unused otherwise).
    scales: Vec<(f32, f32)>,
    /// Device storage (1-D, same layout); `data` is then empty.
    device: Option<Tensor>,
}

fn zeroed<T: Clone + Default>(n: usize, bytes_per_block: usize, blocks: usize) -> Result<Vec<T>, KvPoolError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| KvPoolError::TooLarge { blocks, bytes_per_block })?;
    v.resize(n, T::default());
    Ok(v)
}

/// Runs `$body` with `$v` bound to the typed vector.
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => $body,
            Data::BF16($v) => $body,
            Data::F16($v) => $body,
            Data::F8E4M3($v) => $body,
        }
    };
}

impl KvStorage {
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<Self, KvPoolError> {
        let n = layout
            .num_layers
            .checked_mul(num_blocks)
            .and_then(|x| x.checked_mul(layout.block_elems()))
            .ok_or(KvPoolError::TooLarge { blocks: num_blocks, bytes_per_block: layout.bytes_per_block() })?;
        let bpb = layout.bytes_per_block();
        let data = match layout.dtype {
            DType::F32 => Data::F32(zeroed(n, bpb, num_blocks)?),
            DType::BF16 => Data::BF16(zeroed(n, bpb, num_blocks)?),
            DType::F16 => Data::F16(zeroed(n, bpb, num_blocks)?),
            DType::F8E4M3 => Data::F8E4M3(zeroed(n, bpb, num_blocks)?),
            other => return Err(KvPoolError::UnsupportedDType(other)),
        };
        Ok(Self { layout, num_blocks, data, scales: vec![(1.0, 1.0); layout.num_layers], device: None })
    }

    /// Storage on `device`: host memory for a CPU, one zeroed device
    /// allocation otherwise.
    pub fn new_on(layout: KvLayout, num_blocks: usize, device: &Device) -> Result<Self, KvPoolError> {
        if device.is_cpu() {
            return Self::new(layout, num_blocks);
        }
        let n = layout
            .num_layers
            .checked_mul(num_blocks)
            .and_then(|x| x.checked_mul(layout.block_elems()))
            .ok_or(KvPoolError::TooLarge { blocks: num_blocks, bytes_per_block: layout.bytes_per_block() })?;
        let t = Tensor::zeros(n, layout.dtype, device)?;
        let data = Data::F32(Vec::new());
        Ok(Self { layout, num_blocks, data, scales: vec![(1.0, 1.0); layout.num_layers], device: Some(t) })
    }

    /// Storage over a caller-made device tensor (1-D, zeroed, `dtype` of
    /// the layout, `num_layers * num_blocks * block_elems` elements): the
    /// CUDA engine allocates it so that a KV transport can map it into a
    /// peer process (see `kvc_model_qwen3::cuda::zeros_shareable`).
    pub fn from_device_tensor(layout: KvLayout, num_blocks: usize, t: Tensor) -> Result<Self, KvPoolError> {
        let n = layout.num_layers * num_blocks * layout.block_elems();
        if t.device().is_cpu() || t.dims() != [n] || t.dtype() != layout.dtype {
            return Err(KvPoolError::Shape(format!(
                "device KV storage must be a 1-D {:?} tensor of {n} elements on a GPU, got {:?} {:?} on {:?}",
                layout.dtype,
                t.dims(),
                t.dtype(),
                t.device()
            )));
        }
        Ok(Self { layout, num_blocks, data: Data::F32(Vec::new()), scales: vec![(1.0, 1.0); layout.num_layers], device: Some(t) })
    }

    /// The device tensor (1-D, `[layer][block][k|v][slot][head][dim]`) when
    /// the storage lives on a GPU.
    pub fn device_tensor(&self) -> Option<&Tensor> {
        self.device.as_ref()
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The (K, V) scale of each layer of an FP8 cache: a checkpoint's
    /// `k_scale` / `v_scale`, 1.0 where it has none. Err unless one pair per
    /// layer, each finite and > 0.
    pub fn set_kv_scales(&mut self, scales: Vec<(f32, f32)>) -> Result<(), KvPoolError> {
        if scales.len() != self.layout.num_layers || scales.iter().any(|&(k, v)| !(k.is_finite() && k > 0.0 && v.is_finite() && v > 0.0)) {
            return Err(KvPoolError::Shape(format!(
                "{} KV scale pairs (finite, > 0) for {} layers: {scales:?}",
                scales.len(),
                self.layout.num_layers
            )));
        }
        self.scales = scales;
        Ok(())
    }

    /// Layer `layer`'s (K, V) scales (meaningful for an FP8 cache).
    pub fn kv_scales(&self, layer: usize) -> (f32, f32) {
        self.scales[layer]
    }

    /// The raw memory of the storage: one region, in host memory or (CUDA
    /// builds) on the GPU; none for device storage in a build without CUDA.
    pub fn regions(&self) -> Vec<MemoryRegion> {
        if self.device.is_some() {
            return self.device_region().into_iter().collect();
        }
        with_data!(&self.data, v => vec![MemoryRegion::host(v.as_ptr() as usize, std::mem::size_of_val(v.as_slice()))])
    }

    /// The device memory of a GPU storage (CUDA builds; None otherwise).
    pub fn device_region(&self) -> Option<MemoryRegion> {
        #[cfg(feature = "cuda")]
        if let Some(t) = &self.device {
            return crate::device_memory::region(t);
        }
        None
    }

    /// Byte offset of (layer, block) from the start of the storage region.
    pub fn byte_offset(&self, layer: usize, block: BlockId) -> usize {
        self.layout.block_offset(self.num_blocks, layer, block as usize) * self.layout.dtype.size_in_bytes()
    }

    /// Writes K and V (`[tokens, kv_heads, head_dim]`) of `tokens` tokens at
    /// the given slots (`block * block_size + offset`).
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &Tensor, v: &Tensor) -> Result<(), KvPoolError> {
        let te = self.layout.token_elems();
        let expect = slots.len() * te;
        if k.elem_count() != expect || v.elem_count() != expect {
            return Err(KvPoolError::Shape(format!("k {:?} / v {:?} for {} slots of {} elements", k.shape(), v.shape(), slots.len(), te)));
        }
        let (layout, nb) = (self.layout, self.num_blocks);
        let (k, v) = if layout.dtype == DType::F8E4M3 {
            let (ks, vs) = self.scales[layer];
            (quantize_e4m3(k, ks)?, quantize_e4m3(v, vs)?)
        } else {
            (k.clone(), v.clone())
        };
        if let Some(t) = &self.device {
            return write_device(t, LayerView { layout: &layout, num_blocks: nb, layer }, slots, &k, &v);
        }
        with_data!(&mut self.data, dst => write_typed(dst, LayerView { layout: &layout, num_blocks: nb, layer }, slots, &k, &v))
    }

    /// K and V of the first `len` tokens of a sequence, gathered through its
    /// block table: two tensors `[len, kv_heads, head_dim]` on `device`.
    pub fn gather(&self, layer: usize, table: &[BlockId], len: usize, device: &Device) -> Result<(Tensor, Tensor), KvPoolError> {
        let bs = self.layout.block_size;
        if len > table.len() * bs {
            return Err(KvPoolError::SlotOutOfRange { slot: len, blocks: table.len(), block_size: bs });
        }
        let (layout, nb) = (self.layout, self.num_blocks);
        let (k, v) = match &self.device {
            Some(t) => gather_device(t, LayerView { layout: &layout, num_blocks: nb, layer }, table, len, device)?,
            None => {
                with_data!(&self.data, src => gather_typed(src, LayerView { layout: &layout, num_blocks: nb, layer }, table, len, device))?
            }
        };
        if layout.dtype != DType::F8E4M3 {
            return Ok((k, v));
        }
        let (ks, vs) = self.scales[layer];
        Ok(((k.to_dtype(DType::F32)? * ks as f64)?, (v.to_dtype(DType::F32)? * vs as f64)?))
    }

    /// Copies every layer of block `src` into block `dst` (copy-on-write of a
    /// shared partial block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let (layout, nb) = (self.layout, self.num_blocks);
        let be = layout.block_elems();
        if let Some(t) = &self.device {
            for layer in 0..layout.num_layers {
                let s = layout.block_offset(nb, layer, src as usize);
                let d = layout.block_offset(nb, layer, dst as usize);
                let copy = t.narrow(0, s, be).and_then(|b| b.copy()).and_then(|b| t.slice_set(&b, 0, d));
                copy.expect("device block copy");
            }
            return;
        }
        with_data!(&mut self.data, v => {
            for layer in 0..layout.num_layers {
                let s = layout.block_offset(nb, layer, src as usize);
                let d = layout.block_offset(nb, layer, dst as usize);
                v.copy_within(s..s + be, d);
            }
        })
    }

    /// The bytes of one block of one layer (K then V). Host storage only:
    /// panics for device storage.
    pub fn block_bytes(&self, layer: usize, block: BlockId) -> &[u8] {
        assert!(self.device.is_none(), "block_bytes: the KV storage is on a GPU");
        let off = self.layout.block_offset(self.num_blocks, layer, block as usize);
        let be = self.layout.block_elems();
        with_data!(&self.data, v => as_bytes(&v[off..off + be]))
    }

    /// Overwrites one block of one layer from bytes produced by [`Self::block_bytes`].
    pub fn set_block_bytes(&mut self, layer: usize, block: BlockId, bytes: &[u8]) -> Result<(), KvPoolError> {
        let off = self.layout.block_offset(self.num_blocks, layer, block as usize);
        let be = self.layout.block_elems();
        assert!(self.device.is_none(), "set_block_bytes: the KV storage is on a GPU");
        if bytes.len() != self.layout.layer_block_bytes() {
            return Err(KvPoolError::Shape(format!("{} bytes for a block of {}", bytes.len(), self.layout.layer_block_bytes())));
        }
        with_data!(&mut self.data, v => {
            let dst = as_bytes_mut(&mut v[off..off + be]);
            dst.copy_from_slice(bytes);
        });
        Ok(())
    }
}

/// `x / scale` in e4m3, saturated at +-448 (e4m3 has no infinity: an
/// out-of-range value would become NaN), rounded to nearest.
fn quantize_e4m3(x: &Tensor, scale: f32) -> Result<Tensor, KvPoolError> {
    const E4M3_MAX: f64 = 448.0;
    Ok((x.to_dtype(DType::F32)? / scale as f64)?.clamp(-E4M3_MAX, E4M3_MAX)?.to_dtype(DType::F8E4M3)?)
}

fn as_bytes<T: WithDType>(v: &[T]) -> &[u8] {
    // SAFETY: f32/bf16/f16/e4m3 are plain old data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T: WithDType>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid value of these types.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// One layer of a pool of `num_blocks` blocks: where its tokens' K and V
/// stand (a block holds its K half, then its V half).
#[derive(Clone, Copy)]
struct LayerView<'a> {
    layout: &'a KvLayout,
    num_blocks: usize,
    layer: usize,
}

impl LayerView<'_> {
    /// The element offsets of token slot `slot`'s K and V.
    fn slot_offsets(&self, slot: usize) -> Result<(usize, usize), KvPoolError> {
        let (bs, te) = (self.layout.block_size, self.layout.token_elems());
        let (block, off) = (slot / bs, slot % bs);
        if block >= self.num_blocks {
            return Err(KvPoolError::BlockOutOfRange { block: block as u32, num_blocks: self.num_blocks });
        }
        let base = self.layout.block_offset(self.num_blocks, self.layer, block);
        Ok((base + off * te, base + (bs + off) * te))
    }

    /// The first `len` tokens of a sequence, block by block: the element
    /// offsets of each block's K and V halves and the tokens used from it.
    fn block_runs(&self, table: &[BlockId], len: usize) -> Result<Vec<(usize, usize, usize)>, KvPoolError> {
        let (bs, te) = (self.layout.block_size, self.layout.token_elems());
        let mut runs = Vec::with_capacity(len.div_ceil(bs));
        let mut remaining = len;
        for &block in table {
            if remaining == 0 {
                break;
            }
            if block as usize >= self.num_blocks {
                return Err(KvPoolError::BlockOutOfRange { block, num_blocks: self.num_blocks });
            }
            let n = remaining.min(bs);
            let base = self.layout.block_offset(self.num_blocks, self.layer, block as usize);
            runs.push((base, base + bs * te, n));
            remaining -= n;
        }
        Ok(runs)
    }

    fn shape(&self, len: usize) -> (usize, usize, usize) {
        (len, self.layout.num_kv_heads, self.layout.head_dim)
    }
}

fn write_typed<T: WithDType>(dst: &mut [T], at: LayerView, slots: &[usize], k: &Tensor, v: &Tensor) -> Result<(), KvPoolError> {
    let te = at.layout.token_elems();
    let kv = k.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
    let vv = v.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
    for (i, &slot) in slots.iter().enumerate() {
        let (k_at, v_at) = at.slot_offsets(slot)?;
        dst[k_at..k_at + te].copy_from_slice(&kv[i * te..(i + 1) * te]);
        dst[v_at..v_at + te].copy_from_slice(&vv[i * te..(i + 1) * te]);
    }
    Ok(())
}

fn gather_typed<T: WithDType>(
    src: &[T],
    at: LayerView,
    table: &[BlockId],
    len: usize,
    device: &Device,
) -> Result<(Tensor, Tensor), KvPoolError> {
    let te = at.layout.token_elems();
    let mut k = Vec::with_capacity(len * te);
    let mut v = Vec::with_capacity(len * te);
    for (k_at, v_at, n) in at.block_runs(table, len)? {
        k.extend_from_slice(&src[k_at..k_at + n * te]);
        v.extend_from_slice(&src[v_at..v_at + n * te]);
    }
    Ok((Tensor::from_vec(k, at.shape(len), device)?, Tensor::from_vec(v, at.shape(len), device)?))
}

/// `write` for device storage through candle copies (tests and tools; the
/// CUDA model writes with its own kernel).
fn write_device(t: &Tensor, at: LayerView, slots: &[usize], k: &Tensor, v: &Tensor) -> Result<(), KvPoolError> {
    let te = at.layout.token_elems();
    let k = k.to_dtype(at.layout.dtype)?.to_device(t.device())?.flatten_all()?;
    let v = v.to_dtype(at.layout.dtype)?.to_device(t.device())?.flatten_all()?;
    for (i, &slot) in slots.iter().enumerate() {
        let (k_at, v_at) = at.slot_offsets(slot)?;
        t.slice_set(&k.narrow(0, i * te, te)?, 0, k_at)?;
        t.slice_set(&v.narrow(0, i * te, te)?, 0, v_at)?;
    }
    Ok(())
}

fn gather_device(t: &Tensor, at: LayerView, table: &[BlockId], len: usize, device: &Device) -> Result<(Tensor, Tensor), KvPoolError> {
    let te = at.layout.token_elems();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (k_at, v_at, n) in at.block_runs(table, len)? {
        k.push(t.narrow(0, k_at, n * te)?);
        v.push(t.narrow(0, v_at, n * te)?);
    }
    let k = Tensor::cat(&k, 0)?.reshape(at.shape(len))?.to_device(device)?;
    let v = Tensor::cat(&v, 0)?.reshape(at.shape(len))?.to_device(device)?;
    Ok((k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dtype: DType) -> KvLayout {
        KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 4, block_size: 4, dtype }
    }

    #[test]
    fn gather_returns_what_was_written_through_a_scattered_table() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let mut s = KvStorage::new(layout(dtype), 8).unwrap();
            let table: Vec<BlockId> = vec![5, 1, 6];
            let len = 10; // not a multiple of the block size
            let slots: Vec<usize> = (0..len).map(|p| table[p / 4] as usize * 4 + p % 4).collect();
            let k = Tensor::arange(0f32, (len * 8) as f32, &Device::Cpu).unwrap().reshape((len, 2, 4)).unwrap();
            let v = (k.clone() * -1.0).unwrap();
            s.write(1, &slots, &k, &v).unwrap();
            let (gk, gv) = s.gather(1, &table, len, &Device::Cpu).unwrap();
            let gk = gk.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let gv = gv.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(gk, k.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            assert_eq!(gv, v.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            // layer 0 untouched
            let (z, _) = s.gather(0, &table, len, &Device::Cpu).unwrap();
            assert_eq!(z.to_dtype(DType::F32).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
        }
    }

    #[test]
    fn block_bytes_round_trip_and_regions_cover_storage() {
        let l = layout(DType::F32);
        let mut s = KvStorage::new(l, 3).unwrap();
        let k = Tensor::ones((1, 2, 4), DType::F32, &Device::Cpu).unwrap();
        s.write(0, &[4], &k, &k).unwrap(); // block 1, slot 0
        let bytes = s.block_bytes(0, 1).to_vec();
        s.set_block_bytes(1, 2, &bytes).unwrap();
        let (gk, _) = s.gather(1, &[2], 1, &Device::Cpu).unwrap();
        assert_eq!(gk.sum_all().unwrap().to_scalar::<f32>().unwrap(), 8.0);
        let r = s.regions();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].len, l.bytes_per_block() * 3);
        assert_eq!(s.byte_offset(1, 2), (3 + 2) * l.layer_block_bytes());
    }

    /// e4m3 (bias 7, 3 mantissa bits, no infinities, max 448) written out
    /// by hand: the nearest value of the grid, ties to even, saturated.
    fn e4m3_reference(x: f64) -> f64 {
        let a = x.abs().min(448.0);
        // Normal numbers from 2^-6 keep 3 mantissa bits; below, subnormal steps of 2^-9.
        let step = if a >= 2f64.powi(-6) { 2f64.powi(a.log2().floor() as i32 - 3) } else { 2f64.powi(-9) };
        let n = a / step;
        let mut r = n.floor();
        if n - r > 0.5 || (n - r == 0.5 && r % 2.0 == 1.0) {
            r += 1.0;
        }
        (r * step).min(448.0).copysign(x)
    }

    #[test]
    fn an_fp8_cache_reads_back_the_e4m3_quantize_dequantize_of_what_was_written() {
        let l = layout(DType::F8E4M3);
        let mut s = KvStorage::new(l, 8).unwrap();
        assert_eq!(l.layer_block_bytes() * 2, layout(DType::BF16).layer_block_bytes());
        s.set_kv_scales(vec![(1.0, 1.0), (0.5, 4.0)]).unwrap();
        let table: Vec<BlockId> = vec![3, 7, 0];
        let len = 11;
        let slots: Vec<usize> = (0..len).map(|p| table[p / 4] as usize * 4 + p % 4).collect();
        // Magnitudes over e4m3's whole range: subnormals, normals, ties, past 448 (saturates).
        let xs: Vec<f32> = (0..len * 8)
            .map(|i| ((i as f32 * 0.37).sin() * 2f32.powi(i as i32 % 21 - 11)) * if i % 5 == 0 { 600.0 } else { 1.0 })
            .collect();
        let k = Tensor::from_vec(xs.clone(), (len, 2, 4), &Device::Cpu).unwrap();
        let v = (k.clone() * -3.0).unwrap();
        for layer in 0..2 {
            s.write(layer, &slots, &k, &v).unwrap();
            let (ks, vs) = s.kv_scales(layer);
            let (gk, gv) = s.gather(layer, &table, len, &Device::Cpu).unwrap();
            let gk = gk.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let gv = gv.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (i, &x) in xs.iter().enumerate() {
                let want_k = e4m3_reference(x as f64 / ks as f64) * ks as f64;
                let want_v = e4m3_reference(-3.0 * x as f64 / vs as f64) * vs as f64;
                assert_eq!(gk[i] as f64, want_k, "layer {layer} k[{i}] = {x}");
                assert_eq!(gv[i] as f64, want_v, "layer {layer} v[{i}] = {}", -3.0 * x);
            }
        }
        // The host tier and transfers move blocks as bytes: they come back bit for bit.
        let bytes = s.block_bytes(1, 7).to_vec();
        assert_eq!(bytes.len(), l.layer_block_bytes());
        let mut other = KvStorage::new(l, 8).unwrap();
        other.set_kv_scales(vec![(1.0, 1.0), (0.5, 4.0)]).unwrap();
        other.set_block_bytes(1, 2, &bytes).unwrap();
        assert_eq!(other.block_bytes(1, 2), &bytes[..]);
        assert!(s.set_kv_scales(vec![(1.0, 0.0), (1.0, 1.0)]).is_err());
        assert!(s.set_kv_scales(vec![(1.0, 1.0)]).is_err());
    }

    #[test]
    fn write_rejects_mismatched_shapes() {
        let mut s = KvStorage::new(layout(DType::F32), 2).unwrap();
        let k = Tensor::ones((2, 2, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(s.write(0, &[0], &k, &k).is_err());
    }
}
