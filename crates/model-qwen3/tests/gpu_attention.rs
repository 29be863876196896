//! The attention kernels alone on a real GPU, against an f64 reference on
//! the host: kvc's prefill and decode kernels, the cuDNN prefill route
//! (gathered and paged), decode at serving sizes; over a bf16 pool and an
//! FP8 (e4m3) one, whose reference is the quantize-dequantize result the
//! pool reads back. Ignored by default (CI
//! has no GPU): `scripts/gpu_run.sh tests` runs them on the lent H200.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{gpu, rel_err};
use kvc_kv_pool::{BlockId, KvLayout, KvStorage};
use kvc_model_qwen3::cuda::{
    ptr, quantize_q, set_decode_kernel_v1, AttentionPlan, CacheFormat, CudnnAttention, Fp8AttentionBounds, Kernels, PagedAttention,
    PrefillBackend, PrefillContext,
};
use kvc_model_qwen3::{BatchInput, SeqChunk};
use rand::{Rng, SeedableRng};

/// Straightforward attention in f64 on the host: each query token of a
/// chunk attends causally over its sequence's gathered K/V.
#[allow(clippy::too_many_arguments)]
fn reference_attention(q: &[f32], k: &[f32], v: &[f32], q_len: usize, ctx: usize, nh: usize, nkv: usize, hd: usize) -> Vec<f32> {
    let g = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; q_len * nh * hd];
    // One token's rows: every head, causal over positions 0..=pos.
    let token = |t: usize, rows: &mut [f32]| {
        let pos = ctx - q_len + t;
        for h in 0..nh {
            let kh = h / g;
            let qv = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let s: Vec<f64> =
                (0..=pos).map(|j| (0..hd).map(|d| qv[d] as f64 * k[(j * nkv + kh) * hd + d] as f64).sum::<f64>() * scale).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            let mut o = vec![0f64; hd];
            for (j, wj) in w.iter().enumerate() {
                let vr = &v[(j * nkv + kh) * hd..(j * nkv + kh + 1) * hd];
                for d in 0..hd {
                    o[d] += wj * vr[d] as f64;
                }
            }
            for d in 0..hd {
                rows[h * hd + d] = (o[d] / z) as f32;
            }
        }
    };
    // Tokens spread over the host's cores (the long cases dominate a GPU run).
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(q_len.max(1));
    let per = q_len.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (ci, chunk) in out.chunks_mut(per * nh * hd).enumerate() {
            let token = &token;
            sc.spawn(move || {
                for (i, rows) in chunk.chunks_mut(nh * hd).enumerate() {
                    token(ci * per + i, rows);
                }
            });
        }
    });
    out
}

/// `x` through e4m3 over `scale` and back (saturated, round to nearest
/// even): what cuDNN's FP8 attention reads of Q.
fn e4m3_round_trip(x: &[f32], scale: f32) -> Vec<f32> {
    let t = Tensor::from_slice(x, x.len(), &Device::Cpu).unwrap();
    let q = (t / scale as f64).unwrap().clamp(-448f32, 448f32).unwrap().to_dtype(DType::F8E4M3).unwrap();
    (q.to_dtype(DType::F32).unwrap() * scale as f64).unwrap().to_vec1::<f32>().unwrap()
}

/// Block tables for sequences of `ctxs` tokens, drawn in a shuffled order
/// from a pool of `num_blocks` (a pool that has been in use).
fn shuffled_tables(ctxs: &[usize], bs: usize, num_blocks: usize, rng: &mut rand::rngs::StdRng) -> Vec<Vec<BlockId>> {
    let mut free: Vec<BlockId> = (0..num_blocks as BlockId).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.random_range(0..=i));
    }
    ctxs.iter().map(|c| (0..c.div_ceil(bs)).map(|_| free.pop().unwrap()).collect()).collect()
}

/// (heads, kv heads, head dim, block size, [(new tokens, context)])
type AttentionShape<'a> = (usize, usize, usize, usize, &'a [(usize, usize)]);

/// The pools the attention tests read: bf16, and FP8 with layer scales
/// other than 1 (K / 0.5 and V / 2 stored in e4m3).
const POOLS: [(DType, (f32, f32)); 2] = [(DType::BF16, (1.0, 1.0)), (DType::F8E4M3, (0.5, 2.0))];

/// f32 values of a host tensor.
/// Microseconds per call of `f`, over 20 calls between device syncs.
fn time_us(dev: &Device, f: impl Fn() -> candle_core::Result<()>) -> f64 {
    let iters = 20;
    dev.synchronize().unwrap();
    let t0 = std::time::Instant::now();
    for _ in 0..iters {
        f().unwrap();
    }
    dev.synchronize().unwrap();
    t0.elapsed().as_secs_f64() * 1e6 / iters as f64
}

fn host_f32(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Runs one batch per shape through the attention route of `backend`
/// (None: kvc's kernels only) on random data in a pool of `pool_dtype`
/// with shuffled block tables, and compares every sequence with an f64
/// reference over the K/V the pool reads back (for FP8: e4m3 x scale).
/// With a cuDNN backend, `cudnn_head_dims` lists the head dims cuDNN must
/// take (a missing cuDNN is a failure, not a skip). An FP8 pool skips the
/// head dims it refuses (not a multiple of 16).
fn check_attention(backend: Option<PrefillBackend>, shapes: &[AttentionShape], cudnn_head_dims: &[usize]) {
    for (dtype, scales) in POOLS {
        check_attention_over(backend, shapes, cudnn_head_dims, dtype, scales);
    }
}

fn check_attention_over(
    backend: Option<PrefillBackend>,
    shapes: &[AttentionShape],
    cudnn_head_dims: &[usize],
    pool_dtype: DType,
    scales: (f32, f32),
) {
    let dev = gpu();
    let kernels = Kernels::load(dev.as_cuda_device().unwrap()).unwrap();
    let cudnn = backend.map(|b| {
        CudnnAttention::open(b, &dev)
            .expect("cuDNN must load for this test: put cuDNN 9's lib directory on LD_LIBRARY_PATH (scripts/gpu_run.sh does)")
    });
    // The FP8 route at any prompt size (the default waits for a few thousand tokens).
    if let Some(c) = &cudnn {
        c.set_fp8_bounds(Some(Fp8AttentionBounds::all(0)));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let fp8 = pool_dtype == DType::F8E4M3;
    for &(nh, nkv, hd, bs, seqs) in shapes.iter().filter(|s| !fp8 || s.2 % 16 == 0) {
        let blocks_needed: usize = seqs.iter().map(|&(_, c)| c.div_ceil(bs)).sum();
        let nb = blocks_needed * 2 + 3;
        let layout = KvLayout { num_layers: 2, num_kv_heads: nkv, head_dim: hd, block_size: bs, dtype: pool_dtype };
        let mut kv = KvStorage::new_on(layout, nb, &dev).unwrap();
        kv.set_kv_scales(vec![(1.0, 1.0), scales]).unwrap();
        // Shuffled, non-contiguous block tables.
        let ctxs: Vec<usize> = seqs.iter().map(|&(_, c)| c).collect();
        let tables = shuffled_tables(&ctxs, bs, nb, &mut rng);
        let layer = 1;
        let mut host_kv = Vec::new();
        for (i, &(_, c)) in seqs.iter().enumerate() {
            let k = Tensor::randn(0f32, 1.0, (c, nkv, hd), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let v = Tensor::randn(0f32, 1.0, (c, nkv, hd), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let slots: Vec<usize> = (0..c).map(|p| tables[i][p / bs] as usize * bs + p % bs).collect();
            // (Host tensors: an FP8 pool quantizes them on the host.)
            kv.write(layer, &slots, &k, &v).unwrap();
            let (k, v) = kv.gather(layer, &tables[i], c, &Device::Cpu).unwrap();
            host_kv.push((host_f32(&k), host_f32(&v)));
        }
        let total: usize = seqs.iter().map(|s| s.0).sum();
        let q = Tensor::randn(0f32, 1.0, (total, nh * hd), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        let qh = host_f32(&q);
        let q_absmax = qh.iter().fold(0f32, |m, x| m.max(x.abs()));
        // cuDNN's FP8 route reads Q in e4m3 over q_absmax / 448.
        let qh_e4m3 = e4m3_round_trip(&qh, q_absmax / 448.0);
        let mut start = 0;
        let chunks: Vec<SeqChunk> = seqs
            .iter()
            .enumerate()
            .map(|(i, &(len, c))| {
                let s = SeqChunk { start, len, context_len: c, block_table: &tables[i] };
                start += len;
                s
            })
            .collect();
        let batch = BatchInput { tokens: vec![0; total], seqs: chunks, logits_rows: vec![0] };
        let prefill =
            cudnn.as_ref().map(|attention| PrefillContext { attention, fp8_cache: fp8, head_dim: hd, block_size: bs, num_blocks: nb });
        let cache = kv.device_tensor().unwrap();
        let attn = PagedAttention {
            layer_ptr: ptr(cache).unwrap() + (layer * nb * layout.layer_block_bytes()) as u64,
            cache: CacheFormat::of(&kv, layer).unwrap(),
            block_size: bs,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            q_absmax: Some(q_absmax),
        };
        let refs_over = |qh: &[f32]| -> Vec<Vec<f32>> {
            let mut start = 0;
            seqs.iter()
                .enumerate()
                .map(|(i, &(len, c))| {
                    let qs = &qh[start * nh * hd..(start + len) * nh * hd];
                    start += len;
                    reference_attention(qs, &host_kv[i].0, &host_kv[i].1, len, c, nh, nkv, hd)
                })
                .collect()
        };
        let refs = refs_over(&qh);
        let on_cudnn = |l: usize| l * (nh / nkv) >= 17;
        // FP8 where cuDNN takes every prefill chunk and none has cached context.
        let wants_fp8 = cudnn.is_some() && fp8 && hd == 128 && seqs.iter().filter(|&&(l, _)| on_cudnn(l)).all(|&(l, c)| l == c);
        let mut refs_fp8 = None;
        // Both decode kernels (v2, the default, merges its splits itself).
        for v1 in [false, true] {
            set_decode_kernel_v1(v1);
            let name = if v1 { "decode v1" } else { "decode v2" };
            let plan = AttentionPlan::with_prefill(&batch, nh, nkv, prefill, &dev).unwrap();
            let wants_cudnn = cudnn.is_some() && cudnn_head_dims.contains(&hd) && seqs.iter().any(|&(l, _)| on_cudnn(l));
            assert!(!wants_cudnn || plan.uses_cudnn(), "cuDNN took no sequence of nh={nh} nkv={nkv} hd={hd} bs={bs} {seqs:?}");
            assert!(
                !wants_cudnn || plan.uses_cudnn_fp8() == wants_fp8,
                "cuDNN's FP8 attention {} nh={nh} nkv={nkv} hd={hd} bs={bs} {seqs:?} (a refused FP8 graph is logged as a warning)",
                if wants_fp8 { "did not take" } else { "took" }
            );
            // An FP8 plan is held to the reference over its e4m3 Q, within
            // one e4m3 rounding of O (2^-4 relative) beside the bf16 route's 1e-2.
            let (refs, tol) =
                if plan.uses_cudnn_fp8() { (&*refs_fp8.get_or_insert_with(|| refs_over(&qh_e4m3)), 1e-2 + 0.0625) } else { (&refs, 1e-2) };
            // Twice: the second launch finds the split counters the first
            // one left (they must be back at zero).
            for round in 0..2 {
                let out = attn.forward(&kernels, &q.to_device(&dev).unwrap(), &plan).unwrap();
                let out = out.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                if round == 0 && plan.e4m3_io() {
                    check_e4m3_io(&kernels, &attn, &plan, &q.to_device(&dev).unwrap(), q_absmax, &out);
                }
                let mut start = 0;
                for (i, &(len, c)) in seqs.iter().enumerate() {
                    let o = &out[start * nh * hd..(start + len) * nh * hd];
                    assert!(o.iter().all(|x| x.is_finite()));
                    let e = rel_err(o, &refs[i]);
                    if round == 0 {
                        println!(
                            "attention {backend:?} {pool_dtype:?} pool (cuDNN: {}, FP8: {}, {name}) nh={nh} nkv={nkv} hd={hd} bs={bs} len={len} ctx={c}: relative error {e:.2e}",
                            plan.uses_cudnn(),
                            plan.uses_cudnn_fp8()
                        );
                    }
                    assert!(
                        e < tol,
                        "{backend:?} {pool_dtype:?} {name} nh={nh} nkv={nkv} hd={hd} bs={bs} seq {i} (len {len}, ctx {c}), launch {round}: relative error {e}"
                    );
                    start += len;
                }
            }
        }
        set_decode_kernel_v1(false);
    }
}

/// A plan wholly on cuDNN's FP8 route, fed Q in e4m3 (what RoPE's e4m3
/// form writes): its e4m3 O widened is the bf16 route's `want` bit for
/// bit, and the per-group scales it hands an FP8 o_proj are O's scale,
/// the factor that widening applied.
fn check_e4m3_io(kernels: &Kernels, attn: &PagedAttention, plan: &AttentionPlan, q: &Tensor, q_absmax: f32, want: &[f32]) {
    let q8 = Tensor::zeros(q.dims(), DType::U8, q.device()).unwrap();
    quantize_q(kernels, q, &q8, 448.0 / q_absmax).unwrap();
    let o = attn.forward_fp8(kernels, &q8, plan).unwrap();
    let widened = host_f32(&o.to_bf16(kernels).unwrap());
    let differ = widened.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "e4m3 Q in, widened e4m3 O out: {differ} of {} elements differ from the bf16-in/out call", want.len());
    let scales = host_f32(&o.group_scales(kernels, 128).unwrap());
    let scale = scales[0];
    assert!(scale > 0.0 && scales.iter().all(|&s| s == scale), "group scales: not all O's scale {scale}");
    let bytes = o.o.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    let e4m3 = Tensor::from_raw_buffer(&bytes, DType::F8E4M3, &[bytes.len()], &Device::Cpu).unwrap();
    // A product, not `* f64` (candle's affine adds 0.0, turning the -0.0
    // of e4m3's negative zero into +0.0, which the widening keeps).
    let by_scale = e4m3.to_dtype(DType::F32).unwrap().broadcast_mul(&Tensor::new(scale, &Device::Cpu).unwrap()).unwrap();
    let by_scale = by_scale.to_dtype(DType::BF16).unwrap();
    let by_scale = by_scale.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    let differ = by_scale.iter().zip(&widened).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differ, 0, "{differ} elements of the widened O are not bf16(e4m3 O x the group scale {scale})");
}

/// Decode attention at the Qwen3-30B-A3B shape (32 query heads over 4 KV
/// heads of 128, blocks of 16) and serving sizes, both decode kernels:
/// a few sequences against the f64 reference, and the time per launch
/// (cache filled on the device, shuffled block tables, contexts that are
/// no multiple of a tile).
#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn decode_attention_at_serving_sizes_matches_reference_and_is_timed() {
    let dev = gpu();
    let kernels = Kernels::load(dev.as_cuda_device().unwrap()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (nh, nkv, hd, bs) = (32, 4, 128, 16);
    let sizes = [(64usize, 8192usize), (1, 32768), (1, 2048), (16, 8192), (64, 2048)];
    for ((batch, ctx), (dtype, scales)) in sizes.into_iter().flat_map(|s| POOLS.map(|p| (s, p))) {
        let ctxs: Vec<usize> = (0..batch).map(|i| ctx - (i * 7) % 13).collect();
        let nb: usize = ctxs.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 1;
        let layout = KvLayout { num_layers: 1, num_kv_heads: nkv, head_dim: hd, block_size: bs, dtype };
        let n = nb * layout.block_elems();
        // Random bytes of the pool's dtype (an e4m3 pool: values of N(0, 1) / k_scale, made on the host).
        let values = Tensor::randn(0f32, 1.0, n, &Device::Cpu).unwrap();
        let cache = (values / scales.0 as f64).unwrap().to_dtype(dtype).unwrap().to_device(&dev).unwrap();
        let mut kv = KvStorage::from_device_tensor(layout, nb, cache).unwrap();
        kv.set_kv_scales(vec![scales]).unwrap();
        let tables = shuffled_tables(&ctxs, bs, nb, &mut rng);
        let chunks: Vec<SeqChunk> =
            ctxs.iter().enumerate().map(|(i, &c)| SeqChunk { start: i, len: 1, context_len: c, block_table: &tables[i] }).collect();
        let b = BatchInput { tokens: vec![0; batch], seqs: chunks, logits_rows: vec![0] };
        let q = Tensor::randn(0f32, 1.0, (batch, nh * hd), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let qh = host_f32(&q);
        let attn = PagedAttention {
            layer_ptr: ptr(kv.device_tensor().unwrap()).unwrap(),
            cache: CacheFormat::of(&kv, 0).unwrap(),
            block_size: bs,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            q_absmax: None,
        };
        let bytes: usize = ctxs.iter().sum::<usize>() * nkv * hd * 2 * dtype.size_in_bytes();
        let checked = [0, batch / 2, batch - 1];
        let refs: Vec<Vec<f32>> = checked
            .iter()
            .map(|&i| {
                let (k, v) = kv.gather(0, &tables[i], ctxs[i], &Device::Cpu).unwrap();
                reference_attention(&qh[i * nh * hd..(i + 1) * nh * hd], &host_f32(&k), &host_f32(&v), 1, ctxs[i], nh, nkv, hd)
            })
            .collect();
        for v1 in [false, true] {
            set_decode_kernel_v1(v1);
            let name = if v1 { "v1" } else { "v2" };
            let plan = AttentionPlan::new(&b, nh, nkv, &dev).unwrap();
            let out = attn.forward(&kernels, &q, &plan).unwrap();
            let out = out.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (r, &i) in refs.iter().zip(&checked) {
                let e = rel_err(&out[i * nh * hd..(i + 1) * nh * hd], r);
                assert!(e < 1e-2, "{name} {dtype:?} pool, batch {batch} x {ctx}: sequence {i} relative error {e}");
            }
            let us = time_us(&dev, || attn.forward(&kernels, &q, &plan).map(drop));
            println!(
                "decode attention ({name}, {dtype:?} pool) batch {batch} x {ctx}: {us:.1} us per layer (launches included), {:.2} TB/s of K/V",
                bytes as f64 / us / 1e6
            );
        }
        set_decode_kernel_v1(false);
    }
}

#[test]
#[ignore = "needs a CUDA device: run with scripts/gpu_run.sh"]
fn paged_attention_kernels_match_reference_on_random_data() {
    check_attention(
        None,
        &[
            (32, 4, 128, 16, &[(1, 2049), (1, 37), (7, 7), (100, 301), (1, 5000)]),
            (32, 4, 128, 16, &[(1, 3001)]), // one long decode: split over the KV length
            (4, 2, 16, 4, &[(13, 13), (1, 22), (5, 50)]),
            (8, 1, 64, 8, &[(33, 90), (1, 1), (2, 9)]),
            (4, 2, 8, 4, &[(3, 10), (1, 6)]),
            // Decode-shaped items split over the KV length at every head dim:
            // 2 to 16 rows, several tokens (causal inside a split), group 3.
            (4, 2, 16, 4, &[(1, 3000), (3, 2000), (8, 900)]),
            (8, 1, 64, 8, &[(2, 4000), (1, 17)]),
            (4, 2, 8, 4, &[(1, 1000)]),
            (16, 2, 256, 32, &[(1, 3000), (2, 300), (1, 1)]),
            (32, 4, 128, 12, &[(1, 1000), (1, 77)]), // a block size that is no power of two
            (12, 4, 32, 16, &[(5, 4000)]),
        ],
        &[],
    );
}

/// The prefill route on cuDNN, gathered and paged: varlen batches with
/// decodes between the prefill chunks (kvc's kernels write those rows),
/// chunks after cached context, lengths off the block size, GQA 2 to 8,
/// block sizes 8 to 32; over an FP8 pool, batches whose chunks all start
/// their prompts on cuDNN's FP8 attention (head dim 128). Head dims 8 and 16 (the fixtures') may fall back
/// to kvc's kernels but must stay right.
#[test]
#[ignore = "needs a CUDA device and cuDNN 9: run with scripts/gpu_run.sh"]
fn cudnn_prefill_attention_matches_reference_gathered_and_paged() {
    let shapes: &[AttentionShape] = &[
        (32, 4, 128, 16, &[(300, 2500), (1, 700), (129, 129), (1, 33), (1000, 1000)]),
        (16, 8, 64, 8, &[(77, 77), (1, 40), (200, 333)]),
        (24, 4, 128, 32, &[(45, 1000), (513, 513)]),
        (8, 2, 128, 16, &[(3, 3), (64, 64), (17, 4000)]),
        (32, 4, 128, 16, &[(512, 3000)]),
        // Prompts' first chunks only (beside decodes): cuDNN's FP8 route over an FP8 pool.
        (32, 4, 128, 16, &[(1000, 1000), (1, 700), (129, 129), (2048, 2048), (1, 33)]),
        (8, 2, 128, 16, &[(3, 3), (64, 64), (17, 17)]),
        // Every row on the FP8 route: e4m3 Q in, e4m3 O out (check_e4m3_io).
        (32, 4, 128, 16, &[(700, 700), (129, 129), (2048, 2048)]),
        (8, 2, 128, 16, &[(64, 64), (17, 17)]),
        (4, 2, 16, 4, &[(13, 13), (1, 22), (5, 50)]),
        (4, 2, 8, 4, &[(30, 40), (1, 6)]),
    ];
    for backend in [PrefillBackend::Cudnn, PrefillBackend::CudnnPaged] {
        check_attention(Some(backend), shapes, &[64, 128]);
    }
}

/// cuDNN's FP8 attention at a prompt's first 8K chunk, the Qwen3-30B-A3B
/// shape (32 query heads over 4 KV heads of 128, blocks of 16): its output
/// against the bf16 route over the same e4m3 pool (within one e4m3 rounding
/// of O), and the time per layer of the three routes a prefill can take:
/// bf16 pool, FP8 pool widened to bf16, FP8 pool in e4m3.
#[test]
#[ignore = "needs a CUDA device and cuDNN 9: run with scripts/gpu_run.sh"]
fn cudnn_fp8_prefill_attention_is_timed_against_the_bf16_routes() {
    let dev = gpu();
    let kernels = Kernels::load(dev.as_cuda_device().unwrap()).unwrap();
    let attention = CudnnAttention::open(PrefillBackend::Cudnn, &dev).expect("cuDNN must load for this test (scripts/gpu_run.sh)");
    let (nh, nkv, hd, bs) = (32, 4, 128, 16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for len in [2048usize, 8192] {
        let nb = len.div_ceil(bs) + 1;
        let tables = shuffled_tables(&[len], bs, nb, &mut rng);
        let b = BatchInput {
            tokens: vec![0; len],
            seqs: vec![SeqChunk { start: 0, len, context_len: len, block_table: &tables[0] }],
            logits_rows: vec![0],
        };
        let q = Tensor::randn(0f32, 1.0, (len, nh * hd), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let q_absmax = q.abs().unwrap().max_all().unwrap().to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap();
        let pool = |dtype: DType| {
            let layout = KvLayout { num_layers: 1, num_kv_heads: nkv, head_dim: hd, block_size: bs, dtype };
            let values = Tensor::randn(0f32, 1.0, nb * layout.block_elems(), &Device::Cpu).unwrap();
            KvStorage::from_device_tensor(layout, nb, values.to_dtype(dtype).unwrap().to_device(&dev).unwrap()).unwrap()
        };
        let (bf16_pool, fp8_pool) = (pool(DType::BF16), pool(DType::F8E4M3));
        let mut outs = Vec::new();
        for (kv, fp8_route) in [(&bf16_pool, false), (&fp8_pool, false), (&fp8_pool, true)] {
            let dtype = kv.layout().dtype;
            attention.set_fp8_bounds(fp8_route.then_some(Fp8AttentionBounds::all(0)));
            let ctx =
                PrefillContext { attention: &attention, fp8_cache: dtype == DType::F8E4M3, head_dim: hd, block_size: bs, num_blocks: nb };
            let plan = AttentionPlan::with_prefill(&b, nh, nkv, Some(ctx), &dev).unwrap();
            assert_eq!(plan.uses_cudnn_fp8(), fp8_route, "cuDNN's FP8 attention graph at {len} tokens (a refusal is logged as a warning)");
            let attn = PagedAttention {
                layer_ptr: ptr(kv.device_tensor().unwrap()).unwrap(),
                cache: CacheFormat::of(&kv, 0).unwrap(),
                block_size: bs,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                q_absmax: Some(q_absmax),
            };
            let out = attn.forward(&kernels, &q, &plan).unwrap();
            let us = time_us(&dev, || attn.forward(&kernels, &q, &plan).map(drop));
            let flops = 4.0 * (len * len / 2) as f64 * (nh * hd) as f64;
            println!(
                "prefill attention {len} tokens, {dtype:?} pool, {} route: {us:.0} us per layer ({:.0} TFLOP/s causal)",
                if fp8_route { "e4m3" } else { "bf16" },
                flops / us / 1e6
            );
            if fp8_route {
                // As a step wholly on the route runs it: Q already e4m3
                // (RoPE writes it), O left e4m3 for an FP8 o_proj.
                let q8 = Tensor::zeros(q.dims(), DType::U8, &dev).unwrap();
                quantize_q(&kernels, &q, &q8, 448.0 / q_absmax).unwrap();
                let us = time_us(&dev, || attn.forward_fp8(&kernels, &q8, &plan).map(drop));
                println!(
                    "prefill attention {len} tokens, {dtype:?} pool, e4m3 route, e4m3 Q in and O out: {us:.0} us per layer ({:.0} TFLOP/s causal)",
                    flops / us / 1e6
                );
            }
            outs.push(host_f32(&out));
        }
        let e = rel_err(&outs[2], &outs[1]);
        println!("prefill attention {len} tokens: FP8 route against the bf16 route over the same e4m3 pool, relative error {e:.2e}");
        assert!(e.is_finite() && e < 1e-2 + 0.0625, "FP8 route at {len} tokens: relative error {e} against the bf16 route");
    }
}
