// Mixture-of-experts dispatch: top-k softmax routing, grouping the
// (token, expert) pairs by expert, a grouped small-M GEMM on the CUDA cores
// for decode-sized batches (weights streamed once with 16-byte loads),
// a tensor-core grouped GEMM for prefill-sized batches, and the weighted
// sum back to tokens. Both GEMMs write rows in pair order (token-major).
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

// logits: [T, E] (bf16, the router's output). Softmax in f32, top-k with
// ties to the lower expert id, optional renormalisation, weights rounded
// to bf16 as transformers does. One warp per token. E <= 1024, K <= 32.
extern "C" __global__ void moe_topk(const bf16* logits, int* ids, float* weights, int T, int E, int K, int renorm) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T) return;
    const bf16* row = logits + (size_t)warp * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_f(row[e]));
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += __expf(to_f(row[e]) - mx);
    sum = warp_sum(sum);
    float chosen_sum = 0.f;
    float w_k[32];
    int id_k[32];
    unsigned taken[32];  // bitmap of chosen experts, per lane's slice (E <= 1024)
    for (int i = 0; i < 32; i++) taken[i] = 0;
    for (int k = 0; k < K; k++) {
        float best = -INFINITY;
        int best_e = 0x7fffffff;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            if (taken[i >> 5] >> (i & 31) & 1) continue;
            float v = to_f(row[e]);
            if (v > best || (v == best && e < best_e)) { best = v; best_e = e; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (ov > best || (ov == best && oe < best_e)) { best = ov; best_e = oe; }
        }
        if ((best_e & 31) == lane) {
            int i = best_e >> 5;
            taken[i >> 5] |= 1u << (i & 31);
        }
        float p = __expf(best - mx) / sum;
        w_k[k] = p;
        id_k[k] = best_e;
        chosen_sum += p;
    }
    if (lane == 0) {
        for (int k = 0; k < K; k++) {
            ids[warp * K + k] = id_k[k];
            weights[warp * K + k] = round_bf(renorm ? w_k[k] / chosen_sum : w_k[k]);
        }
    }
}

#define GM 64
// Groups the T*K pairs by expert: offsets [E + 1], sorted [TK] (pair ids,
// expert-major), inv [TK] (pair -> position in sorted), and for the GEMMs'
// block lookups meta [2E + 1]: the active experts in order (-1 padded),
// then the prefix sum of each expert's 64-row tiles. One block of 1024.
extern "C" __global__ void moe_align(const int* ids, int TK, int E, int* offsets, int* sorted, int* inv, int* meta) {
    __shared__ int count[1025];
    __shared__ int cursor[1025];
    for (int e = threadIdx.x; e <= E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < TK; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0, na = 0, tiles = 0;
        for (int e = 0; e < E; e++) {
            cursor[e] = acc;
            offsets[e] = acc;
            meta[E + e] = tiles;
            if (count[e] > 0) meta[na++] = e;
            tiles += (count[e] + GM - 1) / GM;
            acc += count[e];
        }
        offsets[E] = acc;
        meta[2 * E] = tiles;
        for (int i = na; i < E; i++) meta[i] = -1;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < TK; p += blockDim.x) {
        int at = atomicAdd(&cursor[ids[p]], 1);
        sorted[at] = p;
        inv[p] = at;
    }
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

// xs[i, :] = x[sorted[i] / row_div, :]: the pairs' input rows grouped by
// expert, for cuBLAS's grouped GEMM. One block per row. K % 8 == 0.
extern "C" __global__ void moe_gather(const bf16* __restrict__ x, const int* __restrict__ sorted, int row_div,
                                      bf16* __restrict__ xs, int TK, int K) {
    const int i = blockIdx.x;
    if (i >= TK) return;
    const uint4* src = (const uint4*)(x + (size_t)(sorted[i] / row_div) * K);
    uint4* dst = (uint4*)(xs + (size_t)i * K);
    for (int c = threadIdx.x; c < K / 8; c += blockDim.x) dst[c] = src[c];
}

// y[t] = sum_k w[t, k] * rows[pos(t * K + k)], pos = inv (or identity when
// inv is null). Products rounded to bf16 like the reference's bf16 multiply.
extern "C" __global__ void moe_sum(const bf16* rows, const float* w, const int* inv, bf16* y, int T, int K, int H) {
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
