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

extern "C" __global__ void __launch_bounds__(256) small_m_gemm(
    const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ out, const int* __restrict__ offsets,
    const int* __restrict__ sorted, const int* __restrict__ meta, int row_div, int dense_rows, int groups, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int half_n = N / 2;
    const long tasks = (long)groups * half_n;
    const int chunks = K / 8;  // 16-byte chunks of a row
    for (long task = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); task < tasks; task += warps) {
        const int g = (int)(task / half_n);
        const int n = (int)(task - (long)g * half_n) * 2;
        const int e = meta ? meta[g] : 0;
        if (e < 0) continue;
        const int begin = offsets ? offsets[e] : 0;
        const int end = offsets ? offsets[e + 1] : dense_rows;
        const bf16* w0 = W + ((size_t)e * N + n) * K;
        const bf16* w1 = w0 + K;
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
            for (int c0 = lane; c0 < chunks; c0 += 32 * UNROLL) {
                uint4 a[UNROLL], b[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const int c = c0 + u * 32;
                    const bool in = c < chunks;
                    a[u] = in ? __ldg((const uint4*)(w0 + (size_t)c * 8)) : make_uint4(0, 0, 0, 0);
                    b[u] = in ? __ldg((const uint4*)(w1 + (size_t)c * 8)) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int m = 0; m < MAX_ROWS; m++) {
                    if (m >= mt) break;
                    const bf16* xr = x + (size_t)(xrow[m] / row_div) * K;
#pragma unroll
                    for (int u = 0; u < UNROLL; u++) {
                        const int c = c0 + u * 32;
                        if (c < chunks) {
                            const uint4 xv = __ldg((const uint4*)(xr + (size_t)c * 8));
                            acc0[m] += dot8(a[u], xv);
                            acc1[m] += dot8(b[u], xv);
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
