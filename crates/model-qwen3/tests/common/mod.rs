//! Helpers shared by the GPU test files (gpu.rs, gpu_attention.rs).

use candle_core::Device;

/// CUDA device 0, prepared as the engine prepares it.
pub fn gpu() -> Device {
    let d = Device::new_cuda(0).expect("CUDA device 0");
    kvc_model_qwen3::cuda::prepare_device(&d).unwrap();
    d
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}
