//! The GPU device for the CUDA test files.

use candle_core::Device;

/// CUDA device 0, prepared as the engine prepares it.
pub fn gpu() -> Device {
    let d = Device::new_cuda(0).expect("CUDA device 0");
    kvc_model_qwen3::cuda::prepare_device(&d).unwrap();
    d
}
