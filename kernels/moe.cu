// Mixture-of-experts dispatch: top-k softmax routing, grouping the
// (token, expert) pairs by expert, a grouped small-M GEMM on the CUDA cores
// for decode-sized batches (weights streamed once with 16-byte loads; a
// single token's experts take gemv.cu's small_m_gemm instead), a
// tensor-core grouped GEMM for prefill-sized batches, and the weighted
// sum back to tokens. Both GEMMs write rows in pair order (token-major).
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

// Top-k keys: a bf16 logit's bits made order-preserving as an unsigned
// (negatives' bits flipped, -0 taken as +0, NaN below every number) in the
// high half and 0xffff - expert in the low, so the largest key is the
// largest logit with ties to the lower expert id, and a warp's largest is
// one __reduce_max_sync (redux.sync). Every expert's key is distinct and
// above 0, the key of an empty or an already chosen slot.
__device__ __forceinline__ unsigned topk_key(bf16 x, int e) {
    unsigned b = __bfloat16_as_ushort(x);
    if (b == 0x8000u) b = 0;
    const unsigned o = (b & 0x7fffu) > 0x7f80u ? 0u : (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
    return (o << 16) | (0xffffu - (unsigned)e);
}

// The logit a key was made from (NaN for NaN).
__device__ __forceinline__ float topk_key_logit(unsigned key) {
    const unsigned o = key >> 16;
    return to_f(__ushort_as_bfloat16((unsigned short)((o & 0x8000u) ? (o & 0x7fffu) : (~o & 0xffffu))));
}

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

// Routing of one token (warp `t`): softmax over logits [T, E] (bf16, the
// router's output) in f32, top-k with ties to the lower expert id, optional
// renormalisation, weights rounded to bf16 as transformers does. Each lane
// keeps its slice of the row (experts lane, lane + 32, ...; NV * 32 >= E)
// in registers as keys; each of the K rounds takes the warp's largest key
// and clears it where it lies.
template <int NV>
__device__ __forceinline__ void topk_token_n(const bf16* logits, int* ids, float* weights, int t, int E, int K, int renorm) {
    const int lane = threadIdx.x & 31;
    const bf16* row = logits + (size_t)t * E;
    float v[NV];
    unsigned key[NV];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int e = lane + 32 * i;
        const bf16 x = e < E ? row[e] : to_bf(0.f);
        v[i] = e < E ? to_f(x) : -INFINITY;
        key[i] = e < E ? topk_key(x, e) : 0u;
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++)
        if (lane + 32 * i < E) sum += __expf(v[i] - mx);
    sum = warp_sum(sum);
    float chosen_sum = 0.f, mine = 0.f;
    for (int k = 0; k < K; k++) {
        unsigned best = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) best = max(best, key[i]);
        best = warp_max_u32(best);
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (key[i] == best) key[i] = 0;
        const float p = __expf(topk_key_logit(best) - mx) / sum;
        chosen_sum += p;
        if (lane == k) mine = p;
        if (lane == 0) ids[t * K + k] = (int)(0xffffu - (best & 0xffffu));
    }
    if (lane < K) weights[t * K + lane] = round_bf(renorm ? mine / chosen_sum : mine);
}

// E <= 1024, K <= 32; the slice's registers sized to E.
__device__ __forceinline__ void topk_token(const bf16* logits, int* ids, float* weights, int t, int E, int K, int renorm) {
    if (E <= 128) topk_token_n<4>(logits, ids, weights, t, E, K, renorm);
    else if (E <= 256) topk_token_n<8>(logits, ids, weights, t, E, K, renorm);
    else topk_token_n<32>(logits, ids, weights, t, E, K, renorm);
}

// One warp per token.
extern "C" __global__ void moe_topk(const bf16* logits, int* ids, float* weights, int T, int E, int K, int renorm) {
    int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t < T) topk_token(logits, ids, weights, t, E, K, renorm);
}

#define GM 64
// Groups the T*K pairs by expert: offsets [E + 1], sorted [TK] (pair ids,
// expert-major), inv [TK] (pair -> position in sorted), and for the GEMMs'
// block lookups meta [2E + 1]: the active experts in order (-1 padded),
// then the prefix sum of each expert's 64-row tiles. One block of at least
// E threads (1024 for moe_align); the prefix sums are a block-wide scan over
// the experts.
__device__ __forceinline__ void align_block(const int* ids, int TK, int E, int* offsets, int* sorted, int* inv, int* meta) {
    __shared__ int count[1024];
    __shared__ int cursor[1024];
    __shared__ int warp_tot[3][32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < TK; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    // Thread e scans (pairs, 64-row tiles, active) of expert e.
    const int c = tid < E ? count[tid] : 0;
    int a[3] = {c, (c + GM - 1) / GM, c > 0 ? 1 : 0};
#pragma unroll
    for (int j = 0; j < 3; j++) {
        int x = a[j];
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_tot[j][warp] = x;
        a[j] = x - a[j];  // exclusive within the warp
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < 3; j++) {
            int x = lane < nw ? warp_tot[j][lane] : 0;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            warp_tot[j][lane] = x;  // inclusive over warps
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 3; j++) a[j] += warp > 0 ? warp_tot[j][warp - 1] : 0;
    if (tid < E) {
        cursor[tid] = a[0];
        offsets[tid] = a[0];
        meta[E + tid] = a[1];
        if (c > 0) meta[a[2]] = tid;
    }
    const int active = warp_tot[2][nw - 1];
    if (tid == 0) {
        offsets[E] = warp_tot[0][nw - 1];
        meta[2 * E] = warp_tot[1][nw - 1];
    }
    for (int i = active + tid; i < E; i += blockDim.x) meta[i] = -1;
    __syncthreads();
    for (int p = tid; p < TK; p += blockDim.x) {
        int at = atomicAdd(&cursor[ids[p]], 1);
        sorted[at] = p;
        inv[p] = at;
    }
}

extern "C" __global__ void __launch_bounds__(1024) moe_align(const int* ids, int TK, int E, int* offsets, int* sorted, int* inv, int* meta) {
    align_block(ids, TK, E, offsets, sorted, inv, meta);
}

// Routing and grouping in one launch for decode-sized batches: one block of
// 512 threads (so E <= 512); its warps route the tokens, then the block
// groups the pairs.
extern "C" __global__ void __launch_bounds__(512) moe_route(const bf16* logits, int* ids, float* weights, int T, int E, int K, int renorm,
                                     int* offsets, int* sorted, int* inv, int* meta) {
    for (int t = threadIdx.x >> 5; t < T; t += blockDim.x >> 5) topk_token(logits, ids, weights, t, E, K, renorm);
    __syncthreads();
    align_block(ids, T * K, E, offsets, sorted, inv, meta);
}

// One token's routing and grouping by a whole block (blockDim >= E, a
// multiple of 32; K <= 32): topk_token's softmax, top-k (ties to the lower
// expert id) and weights, and align_block's grouping, with every expert's
// rank found at once (against the E logits in shared memory) instead of K
// serial rounds of a warp. The K experts are distinct, so each has at most
// one pair and one 64-row tile.
__device__ __forceinline__ void route_one(const bf16* lg, int E, int K, int renorm, int* ids, float* weights,
                                          int* offsets, int* sorted, int* inv, int* meta) {
    __shared__ float red[32];
    __shared__ float pk[32];
    __shared__ int chosen_in[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const float v = tid < E ? to_f(lg[tid]) : -INFINITY;
    float mx = warp_max(v);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = warp_max(lane < nw ? red[lane] : -INFINITY);
    __syncthreads();
    const float ex = tid < E ? __expf(v - mx) : 0.f;
    float sum = warp_sum(ex);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = warp_sum(lane < nw ? red[lane] : 0.f);
    int rank = 0;
    if (tid < E) {
        for (int j = 0; j < E; j++) {
            const float o = to_f(lg[j]);
            rank += o > v || (o == v && j < tid);
        }
    }
    const bool chosen = tid < E && rank < K;
    const float p = ex / sum;
    if (chosen) pk[rank] = p;
    const unsigned ballot = __ballot_sync(0xffffffffu, chosen);
    if (lane == 0) chosen_in[warp] = __popc(ballot);
    __syncthreads();
    // The chosen probabilities summed in rank order, as topk_token does.
    float chosen_sum = 0.f;
    for (int r = 0; r < K; r++) chosen_sum += pk[r];
    int before = __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; w++) before += chosen_in[w];
    if (tid < E) {
        offsets[tid] = before;
        meta[E + tid] = before;
        if (chosen) {
            ids[rank] = tid;
            weights[rank] = round_bf(renorm ? p / chosen_sum : p);
            meta[before] = tid;
            sorted[before] = rank;
            inv[rank] = before;
        }
    }
    if (tid == 0) {
        offsets[E] = K;
        meta[2 * E] = K;
    }
    for (int i = K + tid; i < E; i += blockDim.x) meta[i] = -1;
}

// The router and the routing in one launch for a few tokens (a decode step
// of up to RT_MAX_T sequences), where the router's GEMM, on cuBLAS, was a
// launch of two CTAs of its own: every warp of the grid computes one
// expert's logits for all T tokens (x [T, H] against router [E, H], bf16,
// f32 sums rounded to bf16 as the GEMM's output), and the last block to
// finish (counted in `counter`, which that block sets back to 0 for the
// next launch) routes and groups as moe_route does, over the logits
// copied into its shared memory (one token: route_one). Blocks of at
// least E threads (E <= 512), H % 8 == 0, T <= RT_MAX_T.
#define RT_MAX_T 8
#define RT_LOADS 8
extern "C" __global__ void __launch_bounds__(512) moe_router_route(
    const bf16* __restrict__ x, const bf16* __restrict__ router, bf16* logits, unsigned* counter, int* ids,
    float* weights, int T, int E, int H, int K, int renorm, int* offsets, int* sorted, int* inv, int* meta) {
    __shared__ bf16 lg[RT_MAX_T * 512];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int chunks = H / 8;
    for (int e = blockIdx.x * warps + (threadIdx.x >> 5); e < E; e += gridDim.x * warps) {
        const bf16* w = router + (size_t)e * H;
        float acc[RT_MAX_T];
#pragma unroll
        for (int t = 0; t < RT_MAX_T; t++) acc[t] = 0.f;
        // RT_LOADS 16-byte loads of the expert's row in flight per lane
        // before any math (a one-token step's whole row at H = 2048: one
        // DRAM round trip instead of one per chunk, which ncu found
        // serialised), then each token's x chunks likewise; per token the
        // sums run over the chunks in the same order as one at a time.
        for (int c0 = lane; c0 < chunks; c0 += 32 * RT_LOADS) {
            uint4 wv[RT_LOADS];
#pragma unroll
            for (int u = 0; u < RT_LOADS; u++) {
                const int c = c0 + u * 32;
                wv[u] = c < chunks ? __ldg((const uint4*)(w + (size_t)c * 8)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int t = 0; t < RT_MAX_T; t++) {
                if (t < T) {
                    uint4 xv[RT_LOADS];
#pragma unroll
                    for (int u = 0; u < RT_LOADS; u++) {
                        const int c = c0 + u * 32;
                        xv[u] = c < chunks ? __ldg((const uint4*)(x + (size_t)t * H + (size_t)c * 8)) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int u = 0; u < RT_LOADS; u++) {
                        if (c0 + u * 32 < chunks) {
                            const bf16* wb = (const bf16*)&wv[u];
                            const bf16* xb = (const bf16*)&xv[u];
#pragma unroll
                            for (int i = 0; i < 8; i++) acc[t] += to_f(wb[i]) * to_f(xb[i]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RT_MAX_T; t++) {
            if (t < T) {
                const float v = warp_sum(acc[t]);
                if (lane == 0) logits[(size_t)t * E + e] = to_bf(v);
            }
        }
    }
    // Every block's logits out before it is counted.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) lg[i] = __ldcg(logits + i);
    if (threadIdx.x == 0) *counter = 0;
    __syncthreads();
    if (T == 1) {
        route_one(lg, E, K, renorm, ids, weights, offsets, sorted, inv, meta);
        return;
    }
    for (int t = threadIdx.x >> 5; t < T; t += warps) topk_token(lg, ids, weights, t, E, K, renorm);
    __syncthreads();
    align_block(ids, T * K, E, offsets, sorted, inv, meta);
}

// Grouped GEMM for few rows per expert: for expert e = blockIdx.y and each
// of its pairs p, out[p, n] = sum_k W[e, n, k] * x[p / row_div, k].
// One warp per output row n (8 per block); the pairs' x rows are staged in
// shared memory MT at a time, so each weight row is read once per MT pairs.
// blockIdx.y = the y-th active expert (meta). Kd % 8 == 0. Dynamic smem: MT * Kd * 2.
extern "C" __global__ void __launch_bounds__(256) moe_gemm_small(
    const bf16* __restrict__ x, const bf16* __restrict__ W, const int* __restrict__ offsets,
    const int* __restrict__ sorted, const int* __restrict__ meta, bf16* __restrict__ out, int N, int Kd, int row_div,
    int MT, int E) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sx = (bf16*)smem_raw;
    const int e = (int)blockIdx.y < E ? meta[blockIdx.y] : -1;
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + warp;
    const bf16* wrow = W + ((size_t)e * N + (n < N ? n : 0)) * Kd;
    for (int m0 = begin; m0 < end; m0 += MT) {
        const int mt = min(MT, end - m0);
        __syncthreads();
        for (int idx = threadIdx.x; idx < mt * (Kd / 8); idx += blockDim.x) {
            int m = idx / (Kd / 8), c = idx % (Kd / 8);
            int p = sorted[m0 + m];
            *(uint4*)(sx + m * Kd + c * 8) = *(const uint4*)(x + (size_t)(p / row_div) * Kd + c * 8);
        }
        __syncthreads();
        if (n >= N) continue;
        float acc[8];
        for (int m = 0; m < 8; m++) acc[m] = 0.f;
        // Four 16-byte weight loads in flight per lane before any math.
        for (int c0 = lane; c0 < Kd / 8; c0 += 128) {
            uint4 wv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = c0 + u * 32;
                wv[u] = c < Kd / 8 ? __ldg((const uint4*)(wrow + c * 8)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = c0 + u * 32;
                if (c >= Kd / 8) break;
                const bf16* wb = (const bf16*)&wv[u];
                float wf[8];
#pragma unroll
                for (int i = 0; i < 8; i++) wf[i] = to_f(wb[i]);
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    if (m < mt) {
                        uint4 xv = *(const uint4*)(sx + m * Kd + c * 8);
                        const bf16* xb = (const bf16*)&xv;
                        float s = 0.f;
#pragma unroll
                        for (int i = 0; i < 8; i++) s += wf[i] * to_f(xb[i]);
                        acc[m] += s;
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            float s = warp_sum(acc[m]);
            if (lane == 0 && m < mt) out[(size_t)sorted[m0 + m] * N + n] = to_bf(s);
        }
    }
}

// y[t] = sum_k w[t, k] * rows[pos(t * K + k)], pos = inv (or identity when
// inv is null). Products rounded to bf16 like the reference's bf16 multiply.
// Any H.
extern "C" __global__ void moe_sum_scalar(const bf16* rows, const float* w, const int* inv, bf16* y, int T, int K, int H) {
    size_t n = (size_t)T * H;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / H, h = idx % H;
        float acc = 0.f;
        for (int k = 0; k < K; k++) {
            int p = t * K + k;
            int r = inv ? inv[p] : p;
            acc += round_bf(to_f(rows[(size_t)r * H + h]) * w[p]);
        }
        y[idx] = to_bf(acc);
    }
}

// The same for H % 8 == 0 and T * H < 2^35: eight columns a thread, 16-byte
// loads of each chosen row, the same sums in the same order.
extern "C" __global__ void moe_sum(const bf16* __restrict__ rows, const float* __restrict__ w, const int* __restrict__ inv,
                                   bf16* __restrict__ y, int T, int K, int H) {
    const unsigned vecs = H / 8, n = (unsigned)T * vecs;
    for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < n; v += gridDim.x * blockDim.x) {
        unsigned t = v / vecs, c = (v - t * vecs) * 8;
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
        for (int k = 0; k < K; k++) {
            int p = t * K + k;
            int r = inv ? inv[p] : p;
            float wp = w[p];
            uint4 x = *(const uint4*)(rows + (size_t)r * H + c);
            const bf16* xb = (const bf16*)&x;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] += round_bf(to_f(xb[i]) * wp);
        }
        uint4 o;
        bf16* ob = (bf16*)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i] = to_bf(acc[i]);
        *(uint4*)(y + (size_t)t * H + c) = o;
    }
}

// Grouped GEMM on the tensor cores for many rows per expert (prefill):
// for every expert e, out[p, :] = x[p / row_div, :] W[e]^T over its pairs p
// (sorted[offsets[e] ..]). Tiles of 64 pairs x 64 outputs, K in steps of 64;
// blockIdx.y enumerates the experts' row tiles (grid.y >= sum of
// ceil(count / 64); extra blocks exit). 4 warps, each 32 x 32. K % 8 == 0.
#define GN 64
#define GK 64
#define GKP (GK + 8)  // padded row stride of the shared tiles
extern "C" __global__ void __launch_bounds__(128) moe_gemm_tc(
    const bf16* __restrict__ x, const bf16* __restrict__ W, const int* __restrict__ offsets,
    const int* __restrict__ sorted, const int* __restrict__ meta, bf16* __restrict__ out, int N, int Kd, int row_div,
    int E) {
    __shared__ __align__(128) unsigned char smem[2 * (GM * GKP * 2 + GN * GKP * 2)];
    __shared__ int s_rows[GM];
    __shared__ int s_e, s_m0, s_cnt;
    if (threadIdx.x == 0) {
        // Binary search of the tile prefix: the expert whose tiles hold blockIdx.y.
        const int* ts = meta + E;
        int t = blockIdx.y, found = -1, m0 = 0, cnt = 0;
        if (t < ts[E]) {
            int lo = 0, hi = E - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (ts[mid] <= t) lo = mid; else hi = mid - 1;
            }
            found = lo;
            m0 = offsets[lo] + (t - ts[lo]) * GM;
            cnt = min(GM, offsets[lo + 1] - m0);
        }
        s_e = found; s_m0 = m0; s_cnt = cnt;
    }
    __syncthreads();
    const int e = s_e;
    if (e < 0) return;
    const int m0 = s_m0, cnt = s_cnt;
    for (int m = threadIdx.x; m < GM; m += blockDim.x) s_rows[m] = m < cnt ? sorted[m0 + m] : -1;
    __syncthreads();
    const int n0 = blockIdx.x * GN;
    const int warp = threadIdx.x >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
    const bf16* We = W + (size_t)e * N * Kd;
    auto stage_a = [&](int st) { return (bf16*)(smem + st * (GM * GKP * 2 + GN * GKP * 2)); };
    auto stage_b = [&](int st) { return (bf16*)(smem + st * (GM * GKP * 2 + GN * GKP * 2) + GM * GKP * 2); };
    auto load = [&](int st, int k0) {
        bf16* sA = stage_a(st);
        bf16* sB = stage_b(st);
        for (int idx = threadIdx.x; idx < GM * (GK / 8); idx += 128) {
            int m = idx / (GK / 8), c = idx % (GK / 8);
            int k = k0 + c * 8;
            int r = s_rows[m];
            if (r >= 0 && k < Kd) cp_async16(sA + m * GKP + c * 8, x + (size_t)(r / row_div) * Kd + k);
            else *(uint4*)(sA + m * GKP + c * 8) = make_uint4(0, 0, 0, 0);
            if (n0 + m < N && k < Kd) cp_async16(sB + m * GKP + c * 8, We + (size_t)(n0 + m) * Kd + k);
            else *(uint4*)(sB + m * GKP + c * 8) = make_uint4(0, 0, 0, 0);
        }
    };
    const int nk = (Kd + GK - 1) / GK;
    load(0, 0);
    cp_async_commit();
    for (int t = 0; t < nk; t++) {
        if (t + 1 < nk) {
            load((t + 1) & 1, (t + 1) * GK);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* sA = stage_a(t & 1);
        const bf16* sB = stage_b(t & 1);
        for (int kk = 0; kk < GK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], sA + (wm + i * 16) * GKP + kk, GKP);
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], sB + (wn + j * 16) * GKP + kk, GKP);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    float* sC = (float*)smem;  // GM x GN floats = 16 KB, in the tiles' space
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(sC + (wm + i * 16) * GN + wn + j * 16, acc[i][j], GN, wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < GM * GN; idx += blockDim.x) {
        int m = idx / GN, c = idx % GN;
        int r = s_rows[m];
        if (r >= 0 && n0 + c < N) out[(size_t)r * N + n0 + c] = to_bf(sC[idx]);
    }
}
