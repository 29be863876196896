// GEMMs of a few rows (decode steps): out = x W^T with W [N, K] row-major
// (a linear layer's weight as checkpoints store it), for up to a few rows
// of x per group of rows. Such a product is a stream over W: every weight
// is read once and used for each of the few rows, so the goal is HBM speed
// on W. cuBLAS picks split-K and tiles built for larger M there; this is a
// plain warp-per-output-column stream with many loads in flight.
//
// Groups: a dense layer is one group (rows 0..dense_rows of x and out);
// the MoE experts are one group per active expert (meta: active experts
// in order, -1 padded; offsets [E + 1]: each expert's pairs in `sorted`;
// a pair p reads x row p / row_div and writes out row p).
//
// Work: the flat list of tasks (group, two output columns); each warp takes
// tasks grid-strided, loads the two columns' weights for a stretch of K
// (UNROLL 16-byte loads each per lane) before any math, then multiplies
// them with each row of the group (x through L1: a group's rows are few
// and shared by its columns), f32 sums reduced over the warp, bf16 out.
// No shared memory, no barriers. K % 8 == 0, N % 2 == 0.
#include "common.cuh"
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define UNROLL 8
#define MAX_ROWS 8

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
    const bf16* ab = (const bf16*)&a;
    const bf16* bb = (const bf16*)&b;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) s += to_f(ab[i]) * to_f(bb[i]);
    return s;
}

// A 16-byte chunk of 16 e4m3 weights against 16 bf16 of x (x0: the first
// 8, x1: the next), f32 sums.
__device__ __forceinline__ float dot16_e4m3(const uint4& w, const uint4& x0, const uint4& x1) {
    const __nv_fp8x2_storage_t* wp = (const __nv_fp8x2_storage_t*)&w;
    const __nv_bfloat162* xa = (const __nv_bfloat162*)&x0;
    const __nv_bfloat162* xb = (const __nv_bfloat162*)&x1;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float2 wf = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(wp[i], __NV_E4M3)));
        const float2 xf = __bfloat1622float2(i < 4 ? xa[i] : xb[i - 4]);
        s += wf.x * xf.x + wf.y * xf.y;
    }
    return s;
}

// The stream over W for bf16 weights (FP8 false: 8 per 16-byte chunk) or
// block-FP8 ones (FP8 true: 16 e4m3 per chunk, each chunk inside one
// 128-wide K block, times that block's scale sw[e][n / 128][k / 128];
// both columns n, n + 1 share it). See the file's comment.
template <bool FP8>
__device__ __forceinline__ void small_m_stream(const bf16* __restrict__ x, const void* __restrict__ Wv,
                                               const float* __restrict__ sw, bf16* __restrict__ out,
                                               const int* __restrict__ offsets, const int* __restrict__ sorted,
                                               const int* __restrict__ meta, int row_div, int dense_rows, int groups,
                                               int N, int K) {
    constexpr int PER = FP8 ? 16 : 8;  // weights per 16-byte chunk
    // Loads in flight per lane: 8 chunks of bf16; 6 of e4m3 (more weights
    // each, and the conversion's registers) keeps 2 blocks per SM unspilled.
    constexpr int U = FP8 ? 6 : UNROLL;
    const unsigned char* W = (const unsigned char*)Wv;
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int half_n = N / 2;
    const long tasks = (long)groups * half_n;
    const int chunks = K / PER;  // 16-byte chunks of a row
    const int kb = (K + 127) / 128, nb = (N + 127) / 128;
    for (long task = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); task < tasks; task += warps) {
        const int g = (int)(task / half_n);
        const int n = (int)(task - (long)g * half_n) * 2;
        const int e = meta ? meta[g] : 0;
        if (e < 0) continue;
        const int begin = offsets ? offsets[e] : 0;
        const int end = offsets ? offsets[e + 1] : dense_rows;
        const size_t row_bytes = (size_t)K * (FP8 ? 1 : 2);
        const unsigned char* w0 = W + ((size_t)e * N + n) * row_bytes;
        const unsigned char* w1 = w0 + row_bytes;
        const float* srow = FP8 ? sw + ((size_t)e * nb + n / 128) * kb : nullptr;
        for (int m0 = begin; m0 < end; m0 += MAX_ROWS) {
            const int mt = min(MAX_ROWS, end - m0);
            int xrow[MAX_ROWS];
#pragma unroll
            for (int m = 0; m < MAX_ROWS; m++) {
                const int p = m < mt ? (sorted ? sorted[m0 + m] : m0 + m) : 0;
                xrow[m] = p;
            }
            float acc0[MAX_ROWS], acc1[MAX_ROWS];
#pragma unroll
            for (int m = 0; m < MAX_ROWS; m++) acc0[m] = acc1[m] = 0.f;
            for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
                uint4 a[U], b[U];
                float sc[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int c = c0 + u * 32;
                    const bool in = c < chunks;
                    a[u] = in ? __ldg((const uint4*)(w0 + (size_t)c * 16)) : make_uint4(0, 0, 0, 0);
                    b[u] = in ? __ldg((const uint4*)(w1 + (size_t)c * 16)) : make_uint4(0, 0, 0, 0);
                    sc[u] = FP8 && in ? __ldg(srow + c * PER / 128) : 1.f;
                }
#pragma unroll
                for (int m = 0; m < MAX_ROWS; m++) {
                    if (m >= mt) break;
                    const bf16* xr = x + (size_t)(xrow[m] / row_div) * K;
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int c = c0 + u * 32;
                        if (c < chunks) {
                            const uint4 xv = __ldg((const uint4*)(xr + (size_t)c * PER));
                            if constexpr (FP8) {
                                const uint4 xv1 = __ldg((const uint4*)(xr + (size_t)c * PER + 8));
                                acc0[m] += sc[u] * dot16_e4m3(a[u], xv, xv1);
                                acc1[m] += sc[u] * dot16_e4m3(b[u], xv, xv1);
                            } else {
                                acc0[m] += dot8(a[u], xv);
                                acc1[m] += dot8(b[u], xv);
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MAX_ROWS; m++) {
                if (m >= mt) break;
                const float s0 = warp_sum(acc0[m]), s1 = warp_sum(acc1[m]);
                if (lane == 0) {
                    // Both columns of the row in one 4-byte store.
                    __nv_bfloat162 v;
                    v.x = to_bf(s0);
                    v.y = to_bf(s1);
                    *(__nv_bfloat162*)(out + (size_t)xrow[m] * N + n) = v;
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) small_m_gemm(
    const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ out, const int* __restrict__ offsets,
    const int* __restrict__ sorted, const int* __restrict__ meta, int row_div, int dense_rows, int groups, int N, int K) {
    small_m_stream<false>(x, W, nullptr, out, offsets, sorted, meta, row_div, dense_rows, groups, N, K);
}

// The same over block-FP8 weights: W e4m3 [groups' E][N, K], sw f32
// [E][ceil(N / 128)][K / 128] (the checkpoint's weight_scale_inv). K % 128
// == 0. No activation quantization: x stays bf16.
extern "C" __global__ void __launch_bounds__(256, 2) small_m_gemm_fp8(
    const bf16* __restrict__ x, const unsigned char* __restrict__ W, const float* __restrict__ sw,
    bf16* __restrict__ out, const int* __restrict__ offsets, const int* __restrict__ sorted,
    const int* __restrict__ meta, int row_div, int dense_rows, int groups, int N, int K) {
    small_m_stream<true>(x, W, sw, out, offsets, sorted, meta, row_div, dense_rows, groups, N, K);
}

// One row a group (a one-token decode: a dense layer's single row, or each
// active expert's single pair): every (group, two columns) task its own
// warp, the grid all of them (blocks of 4 warps; the hardware's block
// scheduler, not a stride, spreads them over the SMs), and each warp's
// weights for a stretch of K (KC 16-byte chunks a lane and column: the
// whole row when K fits 32 * KC chunks) requested, with L2's 256-byte
// prefetch, before the routing's dependent loads and any math. Measured
// at the 30B shape on one H100 (docs/experiments/fp8-gemv-2026-12-06):
// per layer's four products 36.0 us against small_m_stream's 44.5 (FP8),
// 55.6 against 67.9 (bf16). More rows in a group are still right (each
// re-streams the weights), only slower: the host sends those to
// small_m_gemm.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// SWIGLU: the weight is an MoE block's gate|up [2I, K] (N = 2I), a task's
// two columns are gate row j and up row j + I, and it writes
// bf16(silu(gate) * up) of their bf16 products to out [rows, I] at column j:
// layers.cu's silu_mul in the products' epilogue, the same roundings, one
// launch and no [rows, 2I] in memory. The two rows' scale blocks differ.
template <bool FP8, int KC, bool SWIGLU>
__device__ __forceinline__ void one_row_stream(const bf16* __restrict__ x, const void* __restrict__ Wv,
                                               const float* __restrict__ sw, bf16* __restrict__ out,
                                               const int* __restrict__ offsets, const int* __restrict__ sorted,
                                               const int* __restrict__ meta, int row_div, int dense_rows, int groups,
                                               int N, int K) {
    constexpr int PER = FP8 ? 16 : 8;
    const int lane = threadIdx.x & 31;
    const int half_n = N / 2;
    const long task = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (task >= (long)groups * half_n) return;
    const int g = (int)(task / half_n);
    const int j = (int)(task - (long)g * half_n);
    const int n0 = SWIGLU ? j : 2 * j, n1 = SWIGLU ? j + half_n : 2 * j + 1;
    const int e = meta ? __ldg(meta + g) : 0;
    if (e < 0) return;
    const size_t row_bytes = (size_t)K * (FP8 ? 1 : 2);
    const unsigned char* w0 = (const unsigned char*)Wv + ((size_t)e * N + n0) * row_bytes;
    const unsigned char* w1 = (const unsigned char*)Wv + ((size_t)e * N + n1) * row_bytes;
    const int chunks = K / PER;
    const int kb = (K + 127) / 128, nb = (N + 127) / 128;
    // n0 even and n1 = n0 + 1 share a scale block; gate and up rows may not.
    const float* srow0 = FP8 ? sw + ((size_t)e * nb + n0 / 128) * kb : nullptr;
    const float* srow1 = FP8 ? sw + ((size_t)e * nb + n1 / 128) * kb : nullptr;
    uint4 a[KC], b[KC];
    float sc0[KC], sc1[KC];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < KC; u++) {
            const int c = c0 + u * 32 + lane;
            const bool in = c < chunks;
            a[u] = in ? ld_stream(w0 + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
            b[u] = in ? ld_stream(w1 + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
            sc0[u] = FP8 && in ? __ldg(srow0 + c * PER / 128) : 0.f;
            sc1[u] = SWIGLU && FP8 && in ? __ldg(srow1 + c * PER / 128) : sc0[u];
        }
    };
    load(0);
    const int begin = offsets ? __ldg(offsets + e) : 0;
    const int end = offsets ? __ldg(offsets + e + 1) : dense_rows;
    for (int p = begin; p < end; p++) {
        const int row = sorted ? __ldg(sorted + p) : p;
        const bf16* xr = x + (size_t)(row / row_div) * K;
        float acc0 = 0.f, acc1 = 0.f;
        for (int c0 = 0; c0 < chunks; c0 += 32 * KC) {
            if (p != begin || c0 != 0) load(c0);
#pragma unroll
            for (int u = 0; u < KC; u++) {
                const int c = c0 + u * 32 + lane;
                if (c < chunks) {
                    const uint4 xv = __ldg((const uint4*)(xr + (size_t)c * PER));
                    if constexpr (FP8) {
                        const uint4 xv1 = __ldg((const uint4*)(xr + (size_t)c * PER + 8));
                        acc0 += sc0[u] * dot16_e4m3(a[u], xv, xv1);
                        acc1 += sc1[u] * dot16_e4m3(b[u], xv, xv1);
                    } else {
                        acc0 += dot8(a[u], xv);
                        acc1 += dot8(b[u], xv);
                    }
                }
            }
        }
        acc0 = warp_sum(acc0);
        acc1 = warp_sum(acc1);
        if (lane == 0) {
            if constexpr (SWIGLU) {
                out[(size_t)row * half_n + j] = to_bf(silu_times(round_bf(acc0), round_bf(acc1)));
            } else {
                __nv_bfloat162 v;
                v.x = to_bf(acc0);
                v.y = to_bf(acc1);
                *(__nv_bfloat162*)(out + (size_t)row * N + n0) = v;
            }
        }
    }
}

// one_row_gemm_kc{2,4,8} (bf16 weights) and one_row_gemm_fp8_kc{2,4,8}
// (block-FP8, as small_m_gemm_fp8): small_m_gemm_fp8's arguments (the bf16
// ones ignore `sw`); blocks of 128 threads, one per 4 tasks.
// one_row_swiglu{,_fp8}_kc{2,4,8}: the same over a gate|up weight, SiLU *
// up out (SWIGLU above). Registers capped for ONE_ROW_BLOCKS blocks an SM
// (none spills): a grid of every task runs in fewer waves.
#define ONE_ROW_BLOCKS(KC) ((KC) <= 2 ? 8 : (KC) <= 4 ? 5 : 1)
#define ONE_ROW_KERNEL(NAME, FP8, WT, KC, SWIGLU)                                                                     \
    extern "C" __global__ void __launch_bounds__(128, ONE_ROW_BLOCKS(KC)) NAME##_kc##KC(                              \
        const bf16* __restrict__ x, const WT* __restrict__ W, const float* __restrict__ sw, bf16* __restrict__ out,  \
        const int* __restrict__ offsets, const int* __restrict__ sorted, const int* __restrict__ meta, int row_div,    \
        int dense_rows, int groups, int N, int K) {                                                                   \
        one_row_stream<FP8, KC, SWIGLU>(x, W, sw, out, offsets, sorted, meta, row_div, dense_rows, groups, N, K);    \
    }
#define ONE_ROW(KC)                                                  \
    ONE_ROW_KERNEL(one_row_gemm, false, bf16, KC, false)             \
    ONE_ROW_KERNEL(one_row_gemm_fp8, true, unsigned char, KC, false) \
    ONE_ROW_KERNEL(one_row_swiglu, false, bf16, KC, true)            \
    ONE_ROW_KERNEL(one_row_swiglu_fp8, true, unsigned char, KC, true)
ONE_ROW(2)
ONE_ROW(4)
ONE_ROW(8)
