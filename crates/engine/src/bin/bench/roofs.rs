//! The roofs kvc-bench's percentages are read against: HBM bandwidth from
//! the GPU's own memory clock and bus width (an H100 SXM reads against
//! ~3.35 TB/s, an H200 against ~4.8), the H200's datasheet figure where the
//! device reports none (the CPU).

use candle_core::Device;

/// H200 SXM: HBM3e bandwidth and dense bf16 tensor-core peak (datasheet).
const H200_HBM_BYTES_PER_S: f64 = 4.8e12;
pub const PEAK_BF16_FLOPS: f64 = 989e12;

/// Peak HBM bytes/s of `device`: double data rate x memory clock x bus
/// width, as the CUDA driver reports them.
pub fn hbm_bytes_per_s(device: &Device) -> f64 {
    #[cfg(feature = "cuda")]
    if let Ok(dev) = device.as_cuda_device() {
        use candle_core::cuda::cudarc::driver::sys::CUdevice_attribute as A;
        let ctx = dev.cuda_stream().context().clone();
        let clock_khz = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
        let bus_bits = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
        if let (Ok(k), Ok(b)) = (clock_khz, bus_bits) {
            if k > 0 && b > 0 {
                return 2.0 * k as f64 * 1e3 * b as f64 / 8.0;
            }
        }
    }
    let _ = device;
    H200_HBM_BYTES_PER_S
}
