// kvc's C interface to CUTLASS's Hopper FP8 GEMMs with block scales
// (fp8_gemm.cu), the DeepSeek-V3 / Qwen3-FP8 recipe:
//   weights   e4m3 [N, K] row-major with f32 `weight_scale_inv` per 128x128
//             block, [ceil(N/128), ceil(K/128)] row-major, exactly as the
//             checkpoint stores it (no conversion at load);
//   activations quantized on the fly per token and per 128-wide K group:
//             e4m3 [M, K] row-major with f32 scales [M, ceil(K/128)]
//             row-major (kvc_fp8_quant_rows);
//   D[m, n] = sum over K-blocks kb of (A_q . W_q^T over kb) * sa[m, kb] *
//             sw[n / 128, kb], f32 accumulation (the scales applied per
//             K-block on promotion out of the tensor cores), bf16 out.
// Both scale tensors are K-major, the layout CUTLASS's sm90 blockwise
// collective loads with cp.async (1x128x128 granularity), so the grouped
// call can point each expert's scales at its rows in one [rows, K/128]
// array. Every call only queues kernels: nothing is read back to the
// host, so calls can be captured in a CUDA graph.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "moe_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

// 0 when the FP8 GEMMs can run on the current device (sm90), else a
// message in err.
int kvc_fp8_gemm_check(char* err, size_t n);

// q[m, k] = e4m3(x[m, k] / s[m, k / 128]) with saturation,
// s[m, g] = max |x[m, 128 g .. 128 g + 127]| / 448 (1 for an all-zero group).
// x: [m, k] bf16 row-major; q: [m, k] e4m3; s: [m, ceil(k / 128)] f32 (any k;
// the GEMMs below want k a multiple of 128).
int kvc_fp8_quant_rows(uint64_t x, uint64_t q, uint64_t s, int32_t m, int32_t k, void* stream, char* err, size_t n);

// Weights quantized as block-FP8 checkpoints are: for each of `experts`
// bf16 weights w[e]: [n, k] row-major, q[e] = e4m3(w[e] / sw[e][nb][kb])
// with saturation, sw[e][nb][kb] = max |w| over that 128x128 block / 448
// (1 for an all-zero block); sw: [experts, ceil(n/128), ceil(k/128)] f32.
int kvc_fp8_quant_blocks(uint64_t w, uint64_t q, uint64_t sw, int32_t experts, int32_t n, int32_t k, void* stream,
                         char* err, size_t errlen);

// The operands of both GEMMs below: quantized rows and their scales,
// block-FP8 weights and theirs, the bf16 output, device scratch. Shapes
// for the dense call ([experts, ...] weights and [rows, ...] rows for the
// grouped one).
typedef struct {
    uint64_t a;   // [m, k] e4m3
    uint64_t sa;  // [m, k / 128] f32
    uint64_t w;   // [n, k] e4m3
    uint64_t sw;  // [ceil(n / 128), k / 128] f32
    uint64_t d;   // [m, n] bf16
    // Device scratch of the call's *_workspace() bytes, 256-aligned.
    uint64_t workspace;
    uint64_t workspace_bytes;
} kvc_fp8_operands;

// Dense: d[m, n] = a_q . w_q^T with the block scales (see above).
// m >= 1; n a multiple of 16; k a multiple of 128. Tilings:
//   KVC_FP8_DENSE_ROWS:   the tokens on M, 128x128x128 tiles (prefill);
//   KVC_FP8_DENSE_SWAP64: d^T = w_q . a_q^T, 64 weight rows on M and up to
//                         64 tokens on N a tile (decode: twice the CTAs of
//                         ROWS over the same weights). `sw` is then the
//                         weights' scales at 64-row granularity,
//                         [ceil(n/64), k/128] (sw64[r] = sw[r / 2]).
enum { KVC_FP8_DENSE_ROWS = 0, KVC_FP8_DENSE_SWAP64 = 1 };
typedef struct {
    int32_t m;
    int32_t n;
    int32_t k;
    int32_t variant;
    kvc_fp8_operands op;
} kvc_fp8_gemm_args;

int kvc_fp8_gemm_workspace(int32_t m, int32_t n, int32_t k, int32_t variant, uint64_t* bytes, char* err,
                           size_t errlen);
int kvc_fp8_gemm_run(const kvc_fp8_gemm_args* args, void* stream, char* err, size_t errlen);

// Grouped (MoE experts), the calling convention of kvc_moe_gemm_run: for
// every expert e with rows r in offsets[e] .. offsets[e + 1],
//   d[r, :] = a_q[r, :] . w_q[e]^T with sa[r, :] and sw[e] applied per block.
// The groups as moe_gemm.h's kvc_expert_groups; the problem sizes,
// pointers and strides are written on the device. Tilings: ROWS (rows on
// M, 128x128x128) or SWAP (weights on M, rows on N, 128x64x128).
typedef struct {
    kvc_expert_groups groups;
    kvc_fp8_operands op;
} kvc_fp8_grouped_args;

int kvc_fp8_grouped_workspace(int32_t experts, int32_t variant, uint64_t* bytes, char* err, size_t errlen);
int kvc_fp8_grouped_run(const kvc_fp8_grouped_args* args, void* stream, char* err, size_t errlen);

// Self-tests (allocate, fill deterministic pseudo-random inputs, quantize
// with the kernels above, run the CUTLASS FP8 GEMM, compare against a
// plain CUDA reference over the SAME quantized values with f32
// accumulation, and time it against CUTLASS's bf16 GEMM of the same shape
// (moe_gemm.cu with one group, the faster of its two tilings)).
//   max_rel_err: max |d - ref| / max |ref|
//   quant_err:   max |dequant(q) - x| / amax of x's 128-group (<= 1/16 for e4m3)
//   fp8_us, bf16_us, quant_us: mean microseconds per call over `iters`
//                 after a warm-up (quant_us: kvc_fp8_quant_rows of a).
typedef struct {
    double max_rel_err;
    double quant_err;
    double fp8_us;
    double bf16_us;
    double quant_us;
} kvc_fp8_selftest_result;

// The brief's entry: dense m x n x k.
int kvc_fp8_gemm_selftest(int m, int n, int k, int iters, double* max_rel_err, double* fp8_us, double* bf16_us,
                          char* err, size_t errlen);
int kvc_fp8_gemm_selftest_ex(int m, int n, int k, int variant, int iters, kvc_fp8_selftest_result* out, char* err,
                             size_t errlen);
// Grouped: `tokens` tokens each routed to `topk` distinct experts of
// `experts` (deterministic pseudo-random routing), expert weights [n, k],
// in tiling `variant`.
int kvc_fp8_grouped_selftest(int experts, int tokens, int topk, int n, int k, int variant, int iters,
                             kvc_fp8_selftest_result* out, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif
