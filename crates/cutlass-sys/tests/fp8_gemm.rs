//! The block-scaled FP8 GEMMs over Qwen3-30B-A3B-FP8's shapes, on an sm90
//! GPU: correctness against a plain CUDA reference over the same quantized
//! operands, and timing against CUTLASS's bf16 GEMM of the same shape.
//!
//! Run on the GPU machine (CUDA build, see build.rs):
//! `cargo test --release -p kvc-cutlass-sys --test fp8_gemm -- --ignored --nocapture`
//! `KVC_FP8_TEST_ONLY=qkv,down` runs only the named GEMMs (qkv, o_proj,
//! lm_head, gate_up, down); `KVC_FP8_TEST_LM_HEAD=0` skips the lm_head.
//!
//! Tolerance: the reference reads the very same e4m3 values and f32 scales
//! the GEMM reads and accumulates each 128-wide K block in f32 before
//! applying `sa * sw`, as the kernel does; what differs is the order of
//! the f32 sums, the tensor cores' own accumulator inside a block (wgmma's
//! FP8 accumulation keeps fewer mantissa bits than f32, which is why the
//! kernel promotes into f32 every 128 of K), and the final rounding of d
//! to bf16 (relative 2^-9 of |d| <= max|ref|, i.e. <= 0.2% of max|ref|).
//! All of that is well under 1e-2 of max|ref|; a wrong scale, layout or
//! block index shows up as errors of order 1 (100%), so 1e-2 separates the
//! two without flaking.

use cutlass_sys::fp8;

const MAX_REL_ERR: f64 = 1e-2;
/// e4m3 has 3 mantissa bits: round-to-nearest is off by at most 2^-4 of
/// the value, hence of the group's amax (plus a hair for subnormals).
const MAX_QUANT_ERR: f64 = 1.0 / 16.0 + 1e-3;

fn iters(flops: f64) -> usize {
    // About 50 ms of FP8 work at ~1 PFLOP/s, between 10 and 200 calls.
    ((5e13 / flops) as usize).clamp(10, 200)
}

fn row(name: &str, shape: &str, flops: f64, r: &fp8::SelfTest) {
    println!(
        "{name:<10} {shape:<34} {:>10.1} {:>10.1} {:>8.2}x {:>9.1} {:>9.1} {:>8.1} {:>10.2e} {:>8.4}",
        r.fp8_us,
        r.bf16_us,
        r.bf16_us / r.fp8_us,
        flops / r.fp8_us / 1e6,
        flops / r.bf16_us / 1e6,
        r.quant_us,
        r.max_rel_err,
        r.quant_err
    );
}

/// Whether `KVC_FP8_TEST_ONLY` (comma-separated names) lets `name` run.
fn wanted(name: &str) -> bool {
    match std::env::var("KVC_FP8_TEST_ONLY") {
        Ok(v) if !v.trim().is_empty() => v.split(',').any(|s| s.trim() == name),
        _ => true,
    }
}

fn header() {
    println!(
        "{:<10} {:<34} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>10} {:>8}",
        "gemm", "shape", "fp8 us", "bf16 us", "speedup", "fp8 TF/s", "bf16 TF/s", "quant us", "max rel", "q err"
    );
}

#[test]
#[ignore = "needs an sm90 GPU"]
fn fp8_block_scaled_gemms_match_the_reference_and_are_timed() {
    fp8::check().expect("FP8 GEMMs unavailable");
    let lm_head = std::env::var("KVC_FP8_TEST_LM_HEAD").map(|v| v != "0").unwrap_or(true);
    let mut dense: Vec<(&str, usize, usize)> = vec![("qkv", 4096 + 2 * 512, 2048), ("o_proj", 2048, 4096)];
    if lm_head {
        dense.push(("lm_head", 151936, 2048));
    }
    let mut failures = Vec::new();
    header();
    for &(name, n, k) in dense.iter().filter(|d| wanted(d.0)) {
        // Both tilings up to 128 rows (the swap is a decode step's), rows beyond.
        let sizes = [1usize, 8, 16, 32, 64, 128, 2048, 8192];
        let runs = sizes.into_iter().flat_map(|m| {
            let swap = (m <= 128).then_some((m, fp8::DenseTiling::Swap64));
            [Some((m, fp8::DenseTiling::Rows)), swap].into_iter().flatten()
        });
        for (m, tiling) in runs {
            let flops = 2.0 * (m * n * k) as f64;
            let shape = format!("m={m} n={n} k={k} {}", if tiling == fp8::DenseTiling::Swap64 { "swap64" } else { "rows" });
            match fp8::selftest_dense(m, n, k, tiling, iters(flops)) {
                Ok(r) => {
                    row(name, &shape, flops, &r);
                    if !(r.max_rel_err < MAX_REL_ERR) || !(r.quant_err <= MAX_QUANT_ERR) {
                        failures.push(format!("{name} {shape}: max_rel_err {:.3e}, quant_err {:.4}", r.max_rel_err, r.quant_err));
                    }
                }
                Err(e) => failures.push(format!("{name} {shape}: {e}")),
            }
        }
    }
    // The experts: 128 experts, top-8; gate_up [1536, 2048] and down
    // [2048, 768] (K = 768: six 128-blocks).
    let (experts, topk) = (128usize, 8usize);
    for &(name, n, k) in [("gate_up", 1536usize, 2048usize), ("down", 2048, 768)].iter().filter(|d| wanted(d.0)) {
        // Both tilings at every size: the swap is the one decode steps and
        // mixed steps take (a few rows per expert), the rows one prefill's.
        for (tokens, variant) in
            [1usize, 16, 64, 128, 2048, 8192].into_iter().flat_map(|t| [(t, fp8::Variant::Swap), (t, fp8::Variant::Rows)])
        {
            let flops = 2.0 * (tokens * topk * n * k) as f64;
            let shape = format!("t={tokens}x{topk} n={n} k={k} {}", if variant == fp8::Variant::Swap { "swap" } else { "rows" });
            match fp8::selftest_grouped(experts, tokens, topk, n, k, variant, iters(flops)) {
                Ok(r) => {
                    row(name, &shape, flops, &r);
                    if !(r.max_rel_err < MAX_REL_ERR) || !(r.quant_err <= MAX_QUANT_ERR) {
                        failures.push(format!("{name} {shape}: max_rel_err {:.3e}, quant_err {:.4}", r.max_rel_err, r.quant_err));
                    }
                }
                Err(e) => failures.push(format!("{name} {shape}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "FP8 GEMM self-test failures:\n{}", failures.join("\n"));
}

/// Off the GPU build the wrappers say Unavailable instead of pretending.
#[test]
fn without_a_usable_build_or_device_the_fp8_path_says_why() {
    if let Err(e) = fp8::check() {
        assert!(matches!(e, fp8::Error::Unavailable(_)), "{e}");
        assert!(fp8::selftest_dense(1, 2048, 2048, fp8::DenseTiling::Rows, 1).is_err());
    }
}
