//! `kvc-bench layers`: the per-token kernels and the few-row products at
//! Qwen3-30B-A3B's shapes, each timed alone as a CUDA graph of repeated
//! calls (what a decode graph pays; no launch overhead), on the GPU:
//!
//! - SiLU-and-multiply, the MoE weighted sum, q/k RMSNorm + RoPE + K/V
//!   store, for an 8K-token prefill (64K routed rows): the vector kernel and
//!   the scalar one it replaced (`Form::Scalar`), in GB/s moved;
//! - the few-row products (`small_m_linear`) against cuBLAS (candle's
//!   matmul) for a decode's q/k/v, o and router projections at 1, 4 and 8
//!   rows, in GB/s of weights.

pub struct Opts {
    pub device: String,
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda::cudarc::driver::sys;
    use candle_core::cuda::WrapErr;
    use candle_core::{DType, Device, Tensor};
    use kvc_model_qwen3::cuda::{moe_sum, ptr, silu_mul, small_m_linear, CacheFormat, Form, Kernels, RopeStore};
    use kvc_model_qwen3::{Rope, RopeScaling};
    use std::time::Instant;

    /// Seconds per call of `f`, from a CUDA graph of `reps` calls replayed
    /// (median of 5 replays after one).
    fn time_graph(device: &Device, reps: usize, mut f: impl FnMut()) -> f64 {
        f();
        device.synchronize().unwrap();
        let stream = device.as_cuda_device().unwrap().cuda_stream();
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).w().unwrap();
        for _ in 0..reps {
            f();
        }
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .w()
            .unwrap()
            .expect("captured work");
        graph.launch().w().unwrap();
        device.synchronize().unwrap();
        let mut t = Vec::new();
        for _ in 0..5 {
            let s = Instant::now();
            graph.launch().w().unwrap();
            device.synchronize().unwrap();
            t.push(s.elapsed().as_secs_f64() / reps as f64);
        }
        t.sort_by(f64::total_cmp);
        t[2]
    }

    fn randn(device: &Device, shape: &[usize], s: f64) -> Tensor {
        (Tensor::randn(0f32, 1.0, shape, device).unwrap() * s).unwrap().to_dtype(DType::BF16).unwrap()
    }

    fn row(name: &str, form: &str, secs: f64, bytes: f64) {
        println!("{name:<34} {form:<10} {:>9.2} {:>9.0}", secs * 1e6, bytes / secs / 1e9);
    }

    pub fn run(device: &Device) {
        let k = Kernels::load(device.as_cuda_device().unwrap()).unwrap();
        let (t, top_k, h, i) = (8192usize, 8usize, 2048usize, 768usize);
        let pairs = t * top_k;
        println!("per-token kernels of an 8K-token prefill (Qwen3-30B-A3B: {pairs} routed rows), one CUDA graph of 20 calls each");
        println!("{:<34} {:<10} {:>9} {:>9}", "kernel", "form", "us", "GB/s");
        let gu = randn(device, &[pairs, 2 * i], 1.0);
        for form in [Form::Auto, Form::Scalar] {
            let s = time_graph(device, 20, || {
                silu_mul(&k, &gu, form).unwrap();
            });
            row("silu_mul [65536, 2x768]", &format!("{form:?}"), s, (pairs * 3 * i * 2) as f64);
        }
        let rows = randn(device, &[pairs, h], 1.0);
        let w = Tensor::rand(0f32, 1.0, pairs, device).unwrap();
        let perm: Vec<u32> = (0..pairs as u32).map(|p| (p * 7919) % pairs as u32).collect();
        let inv = Tensor::from_slice(&perm, pairs, device).unwrap();
        let y = Tensor::zeros((t, h), DType::BF16, device).unwrap();
        for form in [Form::Auto, Form::Scalar] {
            let s = time_graph(device, 20, || moe_sum(&k, &rows, &w, Some(&inv), &y, top_k, form).unwrap());
            row("moe_sum 8 x [8192, 2048], permuted", &format!("{form:?}"), s, ((pairs + t) * h * 2) as f64);
        }
        let (nh, nkv, hd, bs) = (32usize, 4usize, 128usize, 16usize);
        let qkv = randn(device, &[t, (nh + 2 * nkv) * hd], 1.0);
        let qw = randn(device, &[hd], 1.0);
        let kw = randn(device, &[hd], 1.0);
        let pos = Tensor::from_slice(&(0..t as u32).collect::<Vec<_>>(), t, device).unwrap();
        let slots = pos.clone();
        let q = Tensor::zeros((t, nh * hd), DType::BF16, device).unwrap();
        let cache = Tensor::zeros(t.div_ceil(bs) * 2 * bs * nkv * hd, DType::BF16, device).unwrap();
        let rope = Rope::new(hd, 1e6, &RopeScaling::None);
        let inv_freq = Tensor::from_slice(rope.inv_freq(), hd / 2, device).unwrap();
        for form in [Form::Auto, Form::Scalar] {
            let s = time_graph(device, 20, || {
                RopeStore {
                    qkv: &qkv,
                    q_norm: &qw,
                    k_norm: &kw,
                    pos: &pos,
                    slots: &slots,
                    q_out: &q,
                    layer_ptr: ptr(&cache).unwrap(),
                    cache: CacheFormat::Bf16,
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: bs,
                    eps: 1e-6,
                    inv_freq: &inv_freq,
                    attn_scale: 1.0,
                    q_e4m3: None,
                }
                .launch(&k, form)
                .unwrap()
            });
            row("qk_norm_rope_store [8192, 40x128]", &format!("{form:?}"), s, (2 * t * (nh + 2 * nkv) * hd * 2) as f64);
        }

        println!("\nfew-row products x [M, K] @ W [N, K]^T (decode), one CUDA graph of 50 calls each; GB/s of W");
        println!("{:<34} {:<10} {:>9} {:>9}", "product", "route", "us", "GB/s");
        for (name, n, kd) in
            [("q/k/v [5120, 2048]", 5120usize, 2048usize), ("o [2048, 4096]", 2048, 4096), ("router [128, 2048]", 128, 2048)]
        {
            let wt = randn(device, &[n, kd], 0.02);
            for m in [1usize, 4, 8] {
                let x = randn(device, &[m, kd], 1.0);
                let ours = small_m_linear(&k, &x, &wt).unwrap();
                let theirs = x.matmul(&wt.t().unwrap()).unwrap();
                let diff = (ours.to_dtype(DType::F32).unwrap() - theirs.to_dtype(DType::F32).unwrap())
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let label = format!("{name} M={m}");
                let s = time_graph(device, 50, || {
                    small_m_linear(&k, &x, &wt).unwrap();
                });
                row(&label, "small-m", s, (n * kd * 2) as f64);
                let wt_t = wt.t().unwrap();
                let s = time_graph(device, 50, || {
                    x.matmul(&wt_t).unwrap();
                });
                row(&label, "cublas", s, (n * kd * 2) as f64);
                println!("{:<34} max |small-m - cublas| = {diff:.2e}", "");
            }
        }
    }
}

pub fn run(o: &Opts) {
    let device = kvc_engine::device::select(&o.device).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        return gpu::run(&device);
    }
    let _ = device;
    eprintln!("kvc-bench layers needs a CUDA build (scripts/cuda_setup.sh) and a GPU");
    std::process::exit(1)
}
