// Candidate few-row kernels for gemv_bench.cu (same arguments and results
// as kernels/gemv.cu's small_m_stream).
//
// v1: one task (group, two output columns) per warp and one warp per task
// (a grid of every task, the hardware's block scheduler balancing the
// SMs, no striding); the task's weights for a slab of K (KC 16-byte chunks
// per lane and column, the whole row when K is at most 32 * KC chunks)
// are all loaded before the routing's dependent loads and any math.
#pragma once

template <bool HINT>
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    if constexpr (HINT) {
        uint4 r;
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
            : "l"(p));
        return r;
    } else {
        return __ldg((const uint4*)p);
    }
}

template <bool FP8, int KC, int ROWS, bool HINT>
__global__ void __launch_bounds__(256) few_rows_v1(const bf16* __restrict__ x, const void* __restrict__ Wv,
                                                    const float* __restrict__ sw, bf16* __restrict__ out,
                                                    const int* __restrict__ offsets, const int* __restrict__ sorted,
                                                    const int* __restrict__ meta, int row_div, int dense_rows,
                                                    int groups, int N, int K) {
    constexpr int PER = FP8 ? 16 : 8;
    const int lane = threadIdx.x & 31;
    const int half_n = N / 2;
    const long task = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (task >= (long)groups * half_n) return;
    const int g = (int)(task / half_n);
    const int n = (int)(task - (long)g * half_n) * 2;
    const int e = meta ? __ldg(meta + g) : 0;
    if (e < 0) return;
    const size_t row_bytes = (size_t)K * (FP8 ? 1 : 2);
    const unsigned char* w0 = (const unsigned char*)Wv + ((size_t)e * N + n) * row_bytes;
    const unsigned char* w1 = w0 + row_bytes;
    const int chunks = K / PER;
    const int kb = K / 128, nb = (N + 127) / 128;
    const float* srow = FP8 ? sw + ((size_t)e * nb + n / 128) * kb : nullptr;
    uint4 a[KC], b[KC];
    float sc[KC];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < KC; u++) {
            const int c = c0 + u * 32 + lane;
            const bool in = c < chunks;
            a[u] = in ? ld_stream<HINT>(w0 + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
            b[u] = in ? ld_stream<HINT>(w1 + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
            sc[u] = FP8 && in ? __ldg(srow + c * PER / 128) : 0.f;
        }
    };
    // The first slab's weights are in flight before the routing's
    // dependent loads (offsets, then the pairs' rows).
    load(0);
    const int begin = offsets ? __ldg(offsets + e) : 0;
    const int end = offsets ? __ldg(offsets + e + 1) : dense_rows;
    for (int m0 = begin; m0 < end; m0 += ROWS) {
        const int mt = min(ROWS, end - m0);
        int xrow[ROWS];
        float acc0[ROWS], acc1[ROWS];
#pragma unroll
        for (int m = 0; m < ROWS; m++) {
            xrow[m] = m < mt ? (sorted ? __ldg(sorted + m0 + m) : m0 + m) : 0;
            acc0[m] = acc1[m] = 0.f;
        }
        for (int c0 = 0; c0 < chunks; c0 += 32 * KC) {
            if (m0 != begin || c0 != 0) load(c0);
#pragma unroll
            for (int m = 0; m < ROWS; m++) {
                if (m >= mt) break;
                const bf16* xr = x + (size_t)(xrow[m] / row_div) * K;
#pragma unroll
                for (int u = 0; u < KC; u++) {
                    const int c = c0 + u * 32 + lane;
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
        for (int m = 0; m < ROWS; m++) {
            if (m >= mt) break;
            const float s0 = warp_sum(acc0[m]), s1 = warp_sum(acc1[m]);
            if (lane == 0) {
                __nv_bfloat162 v;
                v.x = to_bf(s0);
                v.y = to_bf(s1);
                *(__nv_bfloat162*)(out + (size_t)xrow[m] * N + n) = v;
            }
        }
    }
}

// v2: a block per (group, `cols` consecutive output columns), whose
// weights (cols x K, contiguous) come into shared memory by one bulk copy
// (Hopper's TMA, cp.async.bulk) issued by one thread as the block starts:
// no registers hold loads in flight, so every resident block (up to 7 of
// 32 KB per SM) has its whole share of the matrix requested at once. Then
// each warp takes columns, its lanes the K chunks, x through L1.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

template <bool FP8, bool PDL = false>
__global__ void __launch_bounds__(128) few_rows_v2(const bf16* __restrict__ x, const void* __restrict__ Wv,
                                                    const float* __restrict__ sw, bf16* __restrict__ out,
                                                    const int* __restrict__ offsets, const int* __restrict__ sorted,
                                                    const int* __restrict__ meta, int row_div, int dense_rows,
                                                    int groups, int N, int K, int cols) {
    constexpr int PER = FP8 ? 16 : 8;
    extern __shared__ __align__(128) unsigned char wsm[];
    __shared__ __align__(8) unsigned long long bar;
    const int per_group = (N + cols - 1) / cols;
    const int g = blockIdx.x / per_group;
    const int n0 = (blockIdx.x - g * per_group) * cols;
    // v3 (PDL): the next kernel may start now; this one's inputs (the
    // routing, x) are read only after its predecessor has finished, but a
    // dense layer's weights are requested before that.
    if constexpr (PDL) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        if (meta) asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    const int e = meta ? __ldg(meta + g) : 0;
    if (e < 0) return;
    const int nc = min(cols, N - n0);
    const size_t row_bytes = (size_t)K * (FP8 ? 1 : 2);
    const unsigned bytes = (unsigned)(nc * row_bytes);
    const unsigned b = smem_addr(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
        const unsigned char* src = (const unsigned char*)Wv + ((size_t)e * N + n0) * row_bytes;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr(wsm)),
            "l"(src), "r"(bytes), "r"(b)
            : "memory");
    }
    __syncthreads();
    if constexpr (PDL) {
        if (!meta) asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    const int begin = offsets ? __ldg(offsets + e) : 0;
    const int end = offsets ? __ldg(offsets + e + 1) : dense_rows;
    const int kb = K / 128, nb = (N + 127) / 128;
    const float* srow = FP8 ? sw + ((size_t)e * nb + n0 / 128) * kb : nullptr;
    {
        unsigned done = 0;
        while (!done) {
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done)
                : "r"(b)
                : "memory");
        }
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int chunks = K / PER;
    for (int p = begin; p < end; p++) {
        const int row = sorted ? __ldg(sorted + p) : p;
        const bf16* xr = x + (size_t)(row / row_div) * K;
        for (int j = warp; j < nc; j += warps) {
            const unsigned char* wr = wsm + j * row_bytes;
            float acc = 0.f;
            for (int c = lane; c < chunks; c += 32) {
                const uint4 w = *(const uint4*)(wr + (size_t)c * 16);
                const uint4 xv = __ldg((const uint4*)(xr + (size_t)c * PER));
                if constexpr (FP8) {
                    const uint4 xv1 = __ldg((const uint4*)(xr + (size_t)c * PER + 8));
                    acc += __ldg(srow + c * PER / 128) * dot16_e4m3(w, xv, xv1);
                } else {
                    acc += dot8(w, xv);
                }
            }
            acc = warp_sum(acc);
            if (lane == 0) out[(size_t)row * N + n0 + j] = to_bf(acc);
        }
    }
}
