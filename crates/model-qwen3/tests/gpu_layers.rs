//! The per-token kernels on a real GPU at production shapes: each vector
//! kernel against its scalar form and a host reference (SiLU-and-multiply,
//! the MoE weighted sum, q/k RMSNorm + RoPE + paged K/V store with default
//! and YaRN frequencies far past the original window). Ignored by default
//! (CI has no GPU): `scripts/gpu_run.sh tests` runs them on the lent H200.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::gpu;
use half::bf16;
use kvc_model_qwen3::cuda::{moe_sum, ptr, quantize_rows, silu_mul, silu_mul_quantized, CacheFormat, Form, Kernels, RopeStore};
use kvc_model_qwen3::{Rope, RopeScaling};
use rand::{Rng, SeedableRng};

fn bf(v: f32) -> f32 {
    bf16::from_f32(v).to_f32()
}

fn randn(rng: &mut rand::rngs::StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| bf((rng.random::<f32>() * 2.0 - 1.0) * scale)).collect()
}

fn upload_bf16(v: &[f32], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, dev).unwrap().to_dtype(DType::BF16).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    // (Converted on the host: candle's CUDA casts lack e4m3 -> f32.)
    t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// A test's GPU, its kernels and a random source seeded with `seed`.
fn setup(seed: u64) -> (Device, Kernels, rand::rngs::StdRng) {
    let dev = gpu();
    let k = Kernels::load(dev.as_cuda_device().unwrap()).unwrap();
    (dev, k, rand::rngs::StdRng::seed_from_u64(seed))
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn silu_mul_quantized_in_one_pass_equals_silu_mul_then_the_fp8_quantizer_bit_for_bit() {
    let (dev, k, mut rng) = setup(11);
    // The expert width, a row count no block divides, one group, and a
    // width the fused kernel does not take (the two steps then).
    for (rows, inter) in [(4099usize, 768usize), (3, 128), (1, 256), (77, 8)] {
        let gu = randn(&mut rng, rows * 2 * inter, 6.0);
        let t = upload_bf16(&gu, &[rows, 2 * inter], &dev);
        let (q, s) = silu_mul_quantized(&k, &t).unwrap();
        let (q2, s2) = quantize_rows(&silu_mul(&k, &t, Form::Auto).unwrap()).unwrap();
        let bytes = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<u8>().unwrap();
        let floats = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!((q.dims(), s.dims()), (q2.dims(), s2.dims()), "{rows}x{inter}: shapes");
        let (qa, qb) = (bytes(&q), bytes(&q2));
        let differ = qa.iter().zip(&qb).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{rows}x{inter}: {differ} of {} e4m3 values differ", qa.len());
        assert!(floats(&s).iter().zip(&floats(&s2)).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows}x{inter}: scales differ");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn silu_mul_vector_kernel_equals_the_scalar_one_and_the_host() {
    let (dev, k, mut rng) = setup(7);
    // Qwen3-30B-A3B's expert width, and a row count no block size divides.
    for (rows, inter) in [(4099usize, 768usize), (3, 6144), (77, 8)] {
        let gu = randn(&mut rng, rows * 2 * inter, 6.0);
        let t = upload_bf16(&gu, &[rows, 2 * inter], &dev);
        let v = host(&silu_mul(&k, &t, Form::Auto).unwrap());
        let s = host(&silu_mul(&k, &t, Form::Scalar).unwrap());
        assert!(v.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows}x{inter}: vector and scalar differ");
        // The host with its own exp: within one bf16 step of the kernel's
        // (the kernel's __expf is an approximation).
        let mut off = 0;
        for r in 0..rows {
            for c in 0..inter {
                let (g, u) = (gu[r * 2 * inter + c], gu[r * 2 * inter + inter + c]);
                let want = bf(bf(g / (1.0 + (-g).exp())) * u);
                let got = v[r * inter + c];
                if (got - want).abs() > want.abs() * 2f32.powi(-7) + 1e-30 {
                    off += 1;
                }
            }
        }
        assert_eq!(off, 0, "{rows}x{inter}: {off} values more than one bf16 step from the host");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn moe_sum_vector_kernel_equals_the_scalar_one_and_the_host_bit_for_bit() {
    let (dev, k, mut rng) = setup(11);
    for (t, top_k, h, permuted) in [(1037usize, 8usize, 2048usize, true), (5, 8, 4096, false), (9, 2, 24, true)] {
        let pairs = t * top_k;
        let rows = randn(&mut rng, pairs * h, 4.0);
        let w: Vec<f32> = (0..pairs).map(|_| bf(rng.random::<f32>())).collect();
        // inv: pair -> its row, a permutation (rows in expert order).
        let mut inv: Vec<u32> = (0..pairs as u32).collect();
        if permuted {
            for i in (1..pairs).rev() {
                inv.swap(i, rng.random_range(0..=i));
            }
        }
        let rows_t = upload_bf16(&rows, &[pairs, h], &dev);
        let w_t = Tensor::from_slice(&w, pairs, &dev).unwrap();
        let inv_t = Tensor::from_slice(&inv, pairs, &dev).unwrap();
        let inv_arg = permuted.then_some(&inv_t);
        let mut outs = Vec::new();
        for form in [Form::Auto, Form::Scalar] {
            let y = Tensor::zeros((t, h), DType::BF16, &dev).unwrap();
            moe_sum(&k, &rows_t, &w_t, inv_arg, &y, top_k, form).unwrap();
            outs.push(host(&y));
        }
        let want: Vec<f32> = (0..t * h)
            .map(|i| {
                let (tok, c) = (i / h, i % h);
                let mut acc = 0f32;
                for kk in 0..top_k {
                    let p = tok * top_k + kk;
                    let r = if permuted { inv[p] as usize } else { p };
                    acc += bf(rows[r * h + c] * w[p]);
                }
                bf(acc)
            })
            .collect();
        for (name, got) in ["vector", "scalar"].iter().zip(&outs) {
            let bad = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(bad, 0, "{name} moe_sum {t}x{h} top-{top_k}: {bad} values differ from the host");
        }
    }
}

/// The host's q/k norm + rotation of one head (`x`: hd values), cos/sin in
/// f64 of the f32 angle.
fn host_norm_rope(x: &[f32], w: &[f32], pos: u32, inv_freq: &[f32], scale: f64, eps: f32) -> Vec<f32> {
    let hd = x.len();
    let half = hd / 2;
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / hd as f64;
    let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
    let n: Vec<f32> = x.iter().zip(w).map(|(v, w)| bf(bf(v * r) * w)).collect();
    (0..hd)
        .map(|i| {
            let f = i % half;
            // The angle in f32 as transformers (and the kernel) forms it.
            let a = (pos as f32 * inv_freq[f]) as f64;
            let (c, s) = (a.cos() * scale, a.sin() * scale);
            let y = if i < half { n[i] as f64 * c - n[i + half] as f64 * s } else { n[i] as f64 * c + n[i - half] as f64 * s };
            bf(y as f32)
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn rope_store_vector_kernels_match_the_scalar_one_and_the_host_with_default_and_yarn_frequencies() {
    let (dev, k, mut rng) = setup(13);
    let yarn = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 32768,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 0.1 * 4f64.ln() + 1.0,
        truncate: true,
    };
    let (nh, nkv, bs, eps) = (32usize, 4usize, 16usize, 1e-6f32);
    for hd in [64usize, 128, 256, 16] {
        // A decode-sized batch spreads each token's heads over 5 blocks; a
        // prefill-sized one keeps one block per token.
        let tokens = if hd == 128 { 1500 } else { 41 };
        for scaling in [RopeScaling::None, yarn.clone()] {
            let rope = Rope::new(hd, 1e6, &scaling);
            let heads = nh + 2 * nkv;
            let qkv = randn(&mut rng, tokens * heads * hd, 3.0);
            let qw = randn(&mut rng, hd, 2.0);
            let kw = randn(&mut rng, hd, 2.0);
            // Positions up to YaRN's whole window (4 x 32K); every fifth
            // token not stored (slot -1); the others in shuffled slots.
            let pos: Vec<u32> = (0..tokens).map(|i| if i == 0 { 131071 } else { rng.random_range(0..131072) }).collect();
            let blocks = tokens.div_ceil(bs) + 1;
            let mut free: Vec<u32> = (0..(blocks * bs) as u32).collect();
            for i in (1..free.len()).rev() {
                free.swap(i, rng.random_range(0..=i));
            }
            let slots: Vec<u32> = (0..tokens).map(|i| if i % 5 == 4 { u32::MAX } else { free[i] }).collect();
            let block_elems = 2 * bs * nkv * hd;
            let (k_scale, v_scale) = (0.5f32, 2.0f32);
            let mut outs = Vec::new();
            for form in [Form::Auto, Form::Scalar] {
                let qkv_t = upload_bf16(&qkv, &[tokens, heads * hd], &dev);
                let (qw_t, kw_t) = (upload_bf16(&qw, &[hd], &dev), upload_bf16(&kw, &[hd], &dev));
                let pos_t = Tensor::from_slice(&pos, tokens, &dev).unwrap();
                let slots_t = Tensor::from_slice(&slots, tokens, &dev).unwrap();
                let inv_freq = Tensor::from_slice(rope.inv_freq(), hd / 2, &dev).unwrap();
                // The same step into a bf16 cache and into an FP8 one.
                // `q_e4m3`: Q written as e4m3 bytes over that inverse scale.
                let run_q = |dtype: DType, format: CacheFormat, q_e4m3: Option<f32>| {
                    let cache = Tensor::zeros(blocks * block_elems, dtype, &dev).unwrap();
                    let q_dtype = if q_e4m3.is_some() { DType::U8 } else { DType::BF16 };
                    let q = Tensor::zeros((tokens, nh * hd), q_dtype, &dev).unwrap();
                    RopeStore {
                        qkv: &qkv_t,
                        q_norm: &qw_t,
                        k_norm: &kw_t,
                        pos: &pos_t,
                        slots: &slots_t,
                        q_out: &q,
                        layer_ptr: ptr(&cache).unwrap(),
                        cache: format,
                        num_heads: nh,
                        num_kv_heads: nkv,
                        head_dim: hd,
                        block_size: bs,
                        eps,
                        inv_freq: &inv_freq,
                        attn_scale: rope.scale(),
                        q_e4m3,
                    }
                    .launch(&k, form)
                    .unwrap();
                    (q, host(&cache))
                };
                let run = |dtype: DType, format: CacheFormat| {
                    let (q, cache) = run_q(dtype, format, None);
                    (host(&q), cache)
                };
                let (q, cache) = run(DType::BF16, CacheFormat::Bf16);
                let (q8, cache8) = run(DType::F8E4M3, CacheFormat::Fp8 { k_scale, v_scale });
                // Q in e4m3 (an FP8 attention step): the bf16 q's
                // e4m3(q x inv), saturated, round to nearest even; the cache
                // as before.
                let inv = 448.0 / 20.0;
                let (qe, cache_e) = run_q(DType::F8E4M3, CacheFormat::Fp8 { k_scale, v_scale }, Some(inv));
                let qe = qe.flatten_all().unwrap().to_vec1::<u8>().unwrap();
                let want_qe = Tensor::from_slice(&q, q.len(), &Device::Cpu).unwrap();
                let want_qe = (want_qe * inv as f64).unwrap().clamp(-448f32, 448f32).unwrap().to_dtype(DType::F8E4M3).unwrap();
                let want_qe = want_qe.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                let got_qe = Tensor::from_raw_buffer(&qe, DType::F8E4M3, &[qe.len()], &Device::Cpu).unwrap();
                let got_qe = got_qe.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                let mismatched = got_qe.iter().zip(&want_qe).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(mismatched, 0, "hd {hd} {form:?}: e4m3 Q elements that are not e4m3(bf16 q x {inv})");
                assert!(cache_e.iter().zip(&cache8).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {hd} {form:?}: cache with an e4m3 Q");
                // The FP8 cache holds e4m3 of the bf16 cache's values over
                // the layer's scales (kv-pool's rounding and saturation), bit
                // for bit; q is the same.
                let halves = Tensor::from_vec(cache.clone(), (blocks, 2, bs * nkv * hd), &Device::Cpu).unwrap();
                let scales = Tensor::from_slice(&[k_scale, v_scale], (1, 2, 1), &Device::Cpu).unwrap();
                let want8 = halves.broadcast_div(&scales).unwrap().clamp(-448f32, 448f32).unwrap().to_dtype(DType::F8E4M3).unwrap();
                assert_eq!(q8, q, "hd {hd} {form:?}: q with an FP8 cache");
                let mismatched = cache8.iter().zip(host(&want8)).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(mismatched, 0, "hd {hd} {form:?}: FP8 cache elements that are not e4m3(bf16 value / scale)");
                outs.push((q, cache));
            }
            let what = format!("hd {hd}, {}", scaling.name());
            // Host reference: q rows, and the cache rows of stored tokens
            // (the rest of the cache untouched: zero).
            let mut want_q = vec![0f32; tokens * nh * hd];
            let mut want_cache = vec![0f32; blocks * block_elems];
            for t in 0..tokens {
                for j in 0..heads {
                    let x = &qkv[(t * heads + j) * hd..(t * heads + j + 1) * hd];
                    let y = match j {
                        j if j < nh => host_norm_rope(x, &qw, pos[t], rope.inv_freq(), rope.scale() as f64, eps),
                        j if j < nh + nkv => host_norm_rope(x, &kw, pos[t], rope.inv_freq(), rope.scale() as f64, eps),
                        _ => x.to_vec(),
                    };
                    if j < nh {
                        want_q[(t * nh + j) * hd..(t * nh + j + 1) * hd].copy_from_slice(&y);
                    } else if slots[t] != u32::MAX {
                        let (b, off) = (slots[t] as usize / bs, slots[t] as usize % bs);
                        let (is_v, kvh) = if j >= nh + nkv { (1, j - nh - nkv) } else { (0, j - nh) };
                        let at = b * block_elems + is_v * bs * nkv * hd + (off * nkv + kvh) * hd;
                        want_cache[at..at + hd].copy_from_slice(&y);
                    }
                }
            }
            // The forms may differ where the RMS sum's order flips a bf16
            // rounding: by a step of the normed values, |y| <= 2 |x|.
            let close = |a: &[f32], b: &[f32], name: &str| {
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                assert!(worst <= 0.08, "{what}: {name} off by {worst}");
            };
            let (vq, vc) = &outs[0];
            let (sq, sc) = &outs[1];
            close(vq, sq, "vector q vs scalar q");
            close(vc, sc, "vector cache vs scalar cache");
            close(vq, &want_q, "q vs host");
            close(vc, &want_cache, "cache vs host");
            // V heads are copied, unstored tokens left alone: exactly.
            assert!(
                vc.iter().zip(&want_cache).filter(|(_, w)| **w == 0.0).all(|(v, _)| *v == 0.0),
                "{what}: cache written outside stored slots"
            );
            if let RopeScaling::Yarn { .. } = scaling {
                // The check can tell the tables apart: default frequencies
                // miss YaRN's answer by far at these positions.
                let plain = Rope::new(hd, 1e6, &RopeScaling::None);
                let t0 = &qkv[0..hd];
                let other = host_norm_rope(t0, &qw, pos[0], plain.inv_freq(), 1.0, eps);
                let worst = other.iter().zip(&want_q[0..hd]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst > 0.5, "{what}: default and YaRN frequencies agree ({worst}); the test would not see a wrong table");
            }
        }
    }
}

/// The worst error of `got = x [M, K] @ w [N, K]^T` against the f64 product,
/// in units of what f32 sums in another order and one bf16 rounding allow
/// (<= 1 passes).
fn worst_product_error(got: &[f32], x: &[f32], w: &[f32], (m, n, kd): (usize, usize, usize)) -> f64 {
    let mut worst = 0f64;
    for r in 0..m {
        for c in 0..n {
            let terms = (0..kd).map(|i| x[r * kd + i] as f64 * w[c * kd + i] as f64);
            let (exact, mag): (f64, f64) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            let err = (got[r * n + c] as f64 - exact).abs() / (exact.abs() * 2f64.powi(-8) + mag * 2e-5 + 1e-30);
            worst = worst.max(err);
        }
    }
    worst
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn few_row_products_match_an_f64_host_reference() {
    use kvc_model_qwen3::cuda::small_m_linear;
    let (dev, k, mut rng) = setup(17);
    // Decode shapes (q/k/v, o, router) and odd ones: K not a multiple of
    // 256 (a partial stretch), more rows than one pass takes (9, 17).
    // One row takes the one-row kernel: K over several of its stretches (4104).
    for (m, n, kd) in [
        (1usize, 5120usize, 2048usize),
        (8, 2048, 4096),
        (3, 128, 2048),
        (9, 64, 24),
        (17, 6, 1032),
        (1, 2, 8),
        (1, 6, 1032),
        (1, 64, 4104),
    ] {
        let x = randn(&mut rng, m * kd, 2.0);
        let w = randn(&mut rng, n * kd, 0.5);
        let got = host(&small_m_linear(&k, &upload_bf16(&x, &[m, kd], &dev), &upload_bf16(&w, &[n, kd], &dev)).unwrap());
        let worst = worst_product_error(&got, &x, &w, (m, n, kd));
        assert!(worst <= 1.0, "{m}x{n}x{kd}: off by {worst:.2} of the allowed error");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn few_row_fp8_products_match_an_f64_host_reference_over_the_dequantized_weights() {
    use kvc_model_qwen3::cuda::small_m_linear_fp8;
    use kvc_model_qwen3::fp8::BlockFp8;
    let (dev, k, mut rng) = setup(23);
    let fp8 = BlockFp8 { block: (128, 128) };
    // Decode shapes (q|k|v, o, an expert's gate|up and down) at 1-4 rows,
    // a partial last weight-scale block (N 130) and more rows than one pass.
    // One row (the one-row kernel): K of one stretch or two (8192), N with a partial scale block.
    for (m, n, kd) in [
        (1usize, 5120usize, 2048usize),
        (4, 2048, 4096),
        (2, 1536, 2048),
        (3, 130, 256),
        (9, 2048, 768),
        (1, 2048, 768),
        (1, 130, 256),
        (1, 258, 8192),
    ] {
        let x = randn(&mut rng, m * kd, 2.0);
        let w = randn(&mut rng, n * kd, 0.05);
        // The CPU path's block quantization (checked against transformers
        // elsewhere) makes the e4m3 weight and scales; the reference uses
        // their dequantized values.
        let wt = Tensor::from_vec(w, (n, kd), &Device::Cpu).unwrap();
        let (q, scale) = fp8.quantize(&wt).unwrap();
        let deq = fp8.dequantize("w", &q, &scale).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let xb: Vec<f32> = x.iter().map(|&v| bf(v)).collect();
        let got = host(
            &small_m_linear_fp8(&k, &upload_bf16(&x, &[m, kd], &dev), &q.to_device(&dev).unwrap(), &scale.to_device(&dev).unwrap())
                .unwrap(),
        );
        let worst = worst_product_error(&got, &xb, &deq, (m, n, kd));
        assert!(worst <= 1.0, "{m}x{n}x{kd}: off by {worst:.2} of the allowed error");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn one_row_swiglu_equals_the_product_then_silu_mul_bit_for_bit_bf16_and_fp8() {
    use kvc_model_qwen3::cuda::{small_m_linear, small_m_linear_fp8, swiglu_linear, swiglu_linear_fp8};
    use kvc_model_qwen3::fp8::BlockFp8;
    let (dev, k, mut rng) = setup(29);
    let fp8 = BlockFp8 { block: (128, 128) };
    // (I, K): Qwen3-30B-A3B's experts; an I whose up rows start inside a
    // weight-scale block (65: gate and up rows take different scales); K
    // over several of the one-row kernel's stretches; the smallest shapes.
    for (i, kd) in [(768usize, 2048usize), (65, 256), (96, 8192), (4, 128)] {
        let n = 2 * i;
        let x = randn(&mut rng, kd, 2.0);
        let w = randn(&mut rng, n * kd, 0.05);
        let xt = upload_bf16(&x, &[1, kd], &dev);
        let wt = upload_bf16(&w, &[n, kd], &dev);
        let fused = host(&swiglu_linear(&k, &xt, &wt).unwrap());
        let apart = host(&silu_mul(&k, &small_m_linear(&k, &xt, &wt).unwrap(), Form::Auto).unwrap());
        let differ = fused.iter().zip(&apart).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!((fused.len(), differ), (i, 0), "bf16 {i}x{kd}: {differ} of {i} values differ");

        let (q, scale) = fp8.quantize(&Tensor::from_vec(w, (n, kd), &Device::Cpu).unwrap()).unwrap();
        let (q, scale) = (q.to_device(&dev).unwrap(), scale.to_device(&dev).unwrap());
        let fused = host(&swiglu_linear_fp8(&k, &xt, &q, &scale).unwrap());
        let apart = host(&silu_mul(&k, &small_m_linear_fp8(&k, &xt, &q, &scale).unwrap(), Form::Auto).unwrap());
        let differ = fused.iter().zip(&apart).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!((fused.len(), differ), (i, 0), "fp8 {i}x{kd}: {differ} of {i} values differ");
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn moe_sum_add_rmsnorm_equals_moe_sum_then_add_rmsnorm_and_the_host() {
    use kvc_model_qwen3::cuda::{add_rmsnorm, moe_sum_add_rmsnorm, MoeRows};
    let (dev, k, mut rng) = setup(31);
    let eps = 1e-6f32;
    // (T, top-k, H, permuted): a decode step and a prefill chunk at the 30B
    // shape, H over one pass of the block (4096, 24 + 8 * 256 = 2072), and
    // a tiny one. Up to H = 2048 the fused kernel is bit for bit the two
    // launches; beyond, its sum of squares runs in another order.
    for (t, top_k, h, permuted) in
        [(1usize, 8usize, 2048usize, false), (517, 8, 2048, true), (3, 4, 4096, true), (2, 2, 2072, false), (5, 1, 8, true)]
    {
        let pairs = t * top_k;
        let rows = randn(&mut rng, pairs * h, 4.0);
        let w: Vec<f32> = (0..pairs).map(|_| bf(rng.random::<f32>())).collect();
        let x = randn(&mut rng, t * h, 3.0);
        let norm = randn(&mut rng, h, 1.5);
        let mut inv: Vec<u32> = (0..pairs as u32).collect();
        if permuted {
            for i in (1..pairs).rev() {
                inv.swap(i, rng.random_range(0..=i));
            }
        }
        let moe = MoeRows {
            rows: upload_bf16(&rows, &[pairs, h], &dev),
            w: Tensor::from_slice(&w, pairs, &dev).unwrap(),
            inv: permuted.then(|| Tensor::from_slice(&inv, pairs, &dev).unwrap()),
            top_k,
            tokens: t,
        };
        let norm_t = upload_bf16(&norm, &[h], &dev);
        let (x1, x2) = (upload_bf16(&x, &[t, h], &dev), upload_bf16(&x, &[t, h], &dev));
        let fused = host(&moe_sum_add_rmsnorm(&k, &x1, &moe, &norm_t, eps).unwrap());
        let apart = host(&add_rmsnorm(&k, &x2, &moe.sum(&k).unwrap(), &norm_t, eps).unwrap());
        let (r1, r2) = (host(&x1), host(&x2));
        // The residual (updated in place) is the same bits either way: sums
        // and adds in the same order.
        assert!(r1.iter().zip(&r2).all(|(a, b)| a.to_bits() == b.to_bits()), "{t}x{h}: residuals differ");
        if h <= 2048 {
            let differ = fused.iter().zip(&apart).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{t}x{h} top-{top_k}: {differ} normalised values differ from the two launches");
        }
        // The host: residual + weighted sum in f32 with the kernels'
        // bf16 roundings (the same bits), the norm in f64: within two bf16
        // steps (rsqrtf's error can move the normalised value's rounding,
        // then the weight's).
        let mut off = 0;
        for tok in 0..t {
            let res: Vec<f32> = (0..h)
                .map(|c| {
                    let mut acc = 0f32;
                    for kk in 0..top_k {
                        let p = tok * top_k + kk;
                        let r = if permuted { inv[p] as usize } else { p };
                        acc += bf(rows[r * h + c] * w[p]);
                    }
                    bf(x[tok * h + c] + bf(acc))
                })
                .collect();
            assert!(res.iter().zip(&r1[tok * h..(tok + 1) * h]).all(|(a, b)| a.to_bits() == b.to_bits()), "{t}x{h}: residual off the host");
            let ms = res.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            for c in 0..h {
                let want = bf(bf((res[c] as f64 * r) as f32) * norm[c]);
                let got = fused[tok * h + c];
                if (got - want).abs() > want.abs() * 2f32.powi(-6) + 1e-30 {
                    off += 1;
                }
            }
        }
        assert_eq!(off, 0, "{t}x{h}: {off} normalised values more than two bf16 steps from the host");
    }
}
