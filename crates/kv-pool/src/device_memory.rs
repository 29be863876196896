//! Where a GPU storage's memory is (CUDA builds): the device address of its
//! tensor's first element, for the pinned host tier's copies and for a
//! transport's registration.

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::DevicePtr;
use candle_core::cuda::CudaStorage;
use candle_core::{DType, DeviceLocation, Storage, Tensor};
use half::{bf16, f16};

use crate::{MemoryLocation, MemoryRegion};

/// The region of `t`, a contiguous tensor on a CUDA device (None
/// otherwise, or for a dtype a pool does not hold).
pub(crate) fn region(t: &Tensor) -> Option<MemoryRegion> {
    let DeviceLocation::Cuda { gpu_id } = t.device().location() else { return None };
    let (st, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else { return None };
    if !layout.is_contiguous() {
        return None;
    }
    let base = match t.dtype() {
        DType::BF16 => address::<bf16>(cs)?,
        DType::F16 => address::<f16>(cs)?,
        DType::F32 => address::<f32>(cs)?,
        DType::U8 => address::<u8>(cs)?,
        DType::F8E4M3 => address::<float8::F8E4M3>(cs)?,
        _ => return None,
    };
    let bytes = t.dtype().size_in_bytes();
    Some(MemoryRegion {
        addr: base as usize + layout.start_offset() * bytes,
        len: t.elem_count() * bytes,
        location: MemoryLocation::Cuda(gpu_id),
    })
}

fn address<T: candle_core::cuda::CudaDType>(cs: &CudaStorage) -> Option<u64> {
    let stream = cs.device().cuda_stream();
    let (p, _sync) = cs.as_cuda_slice::<T>().ok()?.device_ptr(&stream);
    Some(p)
}
