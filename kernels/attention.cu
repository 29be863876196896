// Paged attention over the KV cache for a flattened variable-length batch
// (prefill chunks and decodes together), flash-attention style: online
// softmax over key tiles, Q K^T and P V on the tensor cores (wmma, bf16 in,
// f32 accumulate). One CTA = one work item x one KV head; its 64 rows are
// (token, query head of the KV head's group) pairs, so the K/V tile read
// from the cache serves every query head that shares it (GQA).
//
// Work items (7 ints each, planned on the host):
//   seq, tok_off, ntok, kv_begin, kv_end, part, unused
// part < 0: write the normalised output straight to `out`;
// part >= 0: write f32 partial output and log-sum-exp to the split
// workspace (split over the KV length for long decodes), merged later by
// `attn_combine`.
// Sequences (4 ints each): q_start (row in the batch), q_len, ctx_len,
// offset of the sequence's block table in `tables`.
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

#define BR 64
#define BC 64
#define NWARPS 4
// Padded shared-memory row strides (elements): rows of the same tile fall
// in different banks, for wmma loads and for the per-row softmax.
#define LDQ (HD + 8)
#define LDS (BC + 4)
#define LDP (BC + 8)

struct Smem {
    // byte offsets into dynamic shared memory
    int q, kv, s, p, m, l, alpha, total;
};

// K and V tiles are double-buffered (cp.async); after the loop their space
// holds the f32 output tile (BR * HD * 4 == 2 * 2 * BC * HD * 2 bytes).
__device__ __host__ inline Smem smem_layout(int HD) {
    Smem s;
    int off = 0;
    s.q = off; off += BR * LDQ * 2;
    s.kv = off; off += 2 * 2 * BC * LDQ * 2;  // [stage][k|v][BC][LDQ]
    s.s = off; off += BR * LDS * 4;
    s.p = off; off += BR * LDP * 2;
    s.m = off; off += BR * 4;
    s.l = off; off += BR * 4;
    s.alpha = off; off += BR * 4;
    s.total = off;
    return s;
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

// Issues the copies of keys [kb, kb + BC) of the tile (zeros past kv_hi
// and past hd) into stage buffers sK / sV.
template <int HD>
__device__ __forceinline__ void load_kv(bf16* sK, bf16* sV, const bf16* cache, const int* table, int kb, int kv_hi,
                                        int hd, int nkv, int kvh, int block_size, size_t kv_tok) {
    const int chunks = hd / 8;
#pragma unroll 4
    for (int e = threadIdx.x; e < BC * (HD / 8); e += 128) {
        int c = e / (HD / 8), d8 = e % (HD / 8);
        int j = kb + c;
        if (j < kv_hi && d8 < chunks) {
            int b = table[j / block_size], off = j % block_size;
            const bf16* kp = cache + (size_t)b * 2 * kv_tok + ((size_t)off * nkv + kvh) * hd + d8 * 8;
            cp_async16(sK + c * LDQ + d8 * 8, kp);
            cp_async16(sV + c * LDQ + d8 * 8, kp + kv_tok);
        } else {
            *(uint4*)(sK + c * LDQ + d8 * 8) = make_uint4(0, 0, 0, 0);
            *(uint4*)(sV + c * LDQ + d8 * 8) = make_uint4(0, 0, 0, 0);
        }
    }
}

template <int HD>
__device__ void attn_tile(const bf16* __restrict__ q, const bf16* __restrict__ cache, const int* __restrict__ tables,
                          const int* __restrict__ seqs, const int* __restrict__ items, bf16* __restrict__ out,
                          float* __restrict__ part_o, float* __restrict__ part_lse, int nh, int nkv, int hd,
                          int block_size, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Smem L = smem_layout(HD);
    bf16* sQ = (bf16*)(smem + L.q);
    bf16* sKV = (bf16*)(smem + L.kv);
    float* sS = (float*)(smem + L.s);
    bf16* sP = (bf16*)(smem + L.p);
    float* sO = (float*)(smem + L.kv);
    float* sM = (float*)(smem + L.m);
    float* sL = (float*)(smem + L.l);
    float* sA = (float*)(smem + L.alpha);

    const int* it = items + blockIdx.x * 7;
    const int seq = it[0], tok_off = it[1], ntok = it[2], kv_begin = it[3], kv_end_item = it[4], part = it[5];
    const int* sq = seqs + seq * 4;
    const int q_start = sq[0], q_len = sq[1], ctx = sq[2];
    const int* table = tables + sq[3];
    const int kvh = blockIdx.y;
    const int G = nh / nkv;
    const int first_pos = ctx - q_len + tok_off;  // position of the tile's first token
    const int kv_hi = min(kv_end_item, first_pos + ntok);  // causal: keys <= last position
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t kv_tok = (size_t)block_size * nkv * hd;
    const int ntiles = kv_hi > kv_begin ? (kv_hi - kv_begin + BC - 1) / BC : 0;

    // First K/V tile in flight while Q is staged.
    if (ntiles > 0) load_kv<HD>(sKV, sKV + BC * LDQ, cache, table, kv_begin, kv_hi, hd, nkv, kvh, block_size, kv_tok);
    cp_async_commit();

    // Q tile: row r = (token r / G, head kvh * G + r % G); zero padding.
    for (int e = tid; e < BR * (HD / 8); e += 128) {
        int r = e / (HD / 8), c = e % (HD / 8);
        int tok = r / G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (tok < ntok && c < hd / 8) {
            int head = kvh * G + r % G;
            v = *(const uint4*)(q + ((size_t)(q_start + tok_off + tok) * nh + head) * hd + c * 8);
        }
        *(uint4*)(sQ + r * LDQ + c * 8) = v;
    }
    for (int r = tid; r < BR; r += 128) {
        sM[r] = -INFINITY;
        sL[r] = 0.f;
    }
    // Which row of the warp's 16 each accumulator element holds: read off a
    // fragment loaded from a matrix of row numbers (no layout assumption).
    float* rows16 = sS + warp * 256;
    for (int e = lane; e < 256; e += 32) rows16[e] = (float)(e / 16);
    __syncthreads();
    int row_of[8];
    {
        Acc f;
        wmma::load_matrix_sync(f, rows16, 16, wmma::mem_row_major);
        for (int i = 0; i < f.num_elements && i < 8; i++) row_of[i] = (int)f.x[i];
    }
    Acc oacc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(oacc[n], 0.f);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[HD / 16];
    for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(qf[k], sQ + warp * 16 * LDQ + k * 16, LDQ);
    __syncthreads();  // every warp has read its row map before sS is reused

    for (int t = 0; t < ntiles; t++) {
        const int kb = kv_begin + t * BC;
        if (t + 1 < ntiles) {
            bf16* nk = sKV + ((t + 1) & 1) * 2 * BC * LDQ;
            load_kv<HD>(nk, nk + BC * LDQ, cache, table, kb + BC, kv_hi, hd, nkv, kvh, block_size, kv_tok);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* sK = sKV + (t & 1) * 2 * BC * LDQ;
        const bf16* sV = sK + BC * LDQ;

        // S = Q K^T for this warp's 16 rows.
        {
            Acc acc[BC / 16];
            for (int n = 0; n < BC / 16; n++) wmma::fill_fragment(acc[n], 0.f);
            for (int k = 0; k < HD / 16; k++) {
                for (int n = 0; n < BC / 16; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                    wmma::load_matrix_sync(b, sK + n * 16 * LDQ + k * 16, LDQ);
                    wmma::mma_sync(acc[n], qf[k], b, acc[n]);
                }
            }
            for (int n = 0; n < BC / 16; n++)
                wmma::store_matrix_sync(sS + warp * 16 * LDS + n * 16, acc[n], LDS, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax: two lanes per row, interleaved columns.
        {
            int r = warp * 16 + (lane >> 1);
            int c0 = lane & 1;
            int row_pos = first_pos + r / G;
            bool valid_row = r / G < ntok;
            float* srow = sS + r * LDS;
            bf16* prow = sP + r * LDP;
            float mx = -INFINITY;
            for (int i = 0; i < BC / 2; i++) {
                int c = c0 + 2 * i;
                int j = kb + c;
                float v = srow[c] * scale;
                if (!valid_row || j >= kv_hi || j > row_pos) v = -INFINITY;
                srow[c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = sM[r];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int i = 0; i < BC / 2; i++) {
                int c = c0 + 2 * i;
                float p = m_new == -INFINITY ? 0.f : __expf(srow[c] - m_new);
                sum += p;
                prow[c] = to_bf(p);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
            __syncwarp();
            if ((lane & 1) == 0) {
                sM[r] = m_new;
                sL[r] = sL[r] * alpha + sum;
                sA[r] = alpha;
            }
        }
        __syncwarp();

        // O = alpha * O + P V, O in registers.
        {
            float al[8];
            for (int i = 0; i < 8; i++) al[i] = sA[warp * 16 + row_of[i]];
            for (int n = 0; n < HD / 16; n++)
                for (int i = 0; i < oacc[n].num_elements; i++) oacc[n].x[i] *= al[i];
            for (int k = 0; k < BC / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::load_matrix_sync(a, sP + warp * 16 * LDP + k * 16, LDP);
                for (int n = 0; n < HD / 16; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                    wmma::load_matrix_sync(b, sV + k * 16 * LDQ + n * 16, LDQ);
                    wmma::mma_sync(oacc[n], a, b, oacc[n]);
                }
            }
        }
        __syncthreads();  // this stage's buffers are free for the load after next
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int n = 0; n < HD / 16; n++)
        wmma::store_matrix_sync(sO + warp * 16 * HD + n * 16, oacc[n], HD, wmma::mem_row_major);
    __syncthreads();

    // Normalise and write.
    for (int e = tid; e < BR * hd; e += 128) {
        int r = e / hd, d = e % hd;
        int tok = r / G;
        if (tok >= ntok) continue;
        int head = kvh * G + r % G;
        float l = sL[r];
        float o = l > 0.f ? sO[r * HD + d] / l : 0.f;
        if (part < 0) {
            out[((size_t)(q_start + tok_off + tok) * nh + head) * hd + d] = to_bf(o);
        } else {
            size_t pr = ((size_t)part * nkv + kvh) * BR + r;
            part_o[pr * hd + d] = o;
            if (d == 0) part_lse[pr] = l > 0.f ? sM[r] + logf(l) : -INFINITY;
        }
    }
}

// Decode-shaped work (at most 16 rows: tokens x group heads, e.g. one
// token of 8 query heads): the 4 warps split each 64-key tile (16 keys
// each) instead of the rows, each keeps its own online softmax state, and
// the warps' states are merged at the end. Same items and outputs as
// attn_tile.
#define DR 16
#define LDS16 20
#define LDP16 24
template <int HD>
__device__ void attn_decode(const bf16* __restrict__ q, const bf16* __restrict__ cache, const int* __restrict__ tables,
                            const int* __restrict__ seqs, const int* __restrict__ items, bf16* __restrict__ out,
                            float* __restrict__ part_o, float* __restrict__ part_lse, int nh, int nkv, int hd,
                            int block_size, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sQ = (bf16*)smem;                                   // [DR][LDQ]
    bf16* sKV = sQ + DR * LDQ;                                // [2][k|v][BC][LDQ]
    float* sS = (float*)(sKV + 2 * 2 * BC * LDQ);             // [4][DR][LDS16]
    bf16* sP = (bf16*)(sS + NWARPS * DR * LDS16);             // [4][DR][LDP16]
    float* sM = (float*)(sP + NWARPS * DR * LDP16);           // [4][DR]
    float* sL = sM + NWARPS * DR;                             // [4][DR]
    float* sA = sL + NWARPS * DR;                             // [4][DR]
    float* sO = (float*)sKV;                                  // after the loop: [4][DR][HD]

    const int* it = items + blockIdx.x * 7;
    const int seq = it[0], tok_off = it[1], ntok = it[2], kv_begin = it[3], kv_end_item = it[4], part = it[5];
    const int* sq = seqs + seq * 4;
    const int q_start = sq[0], q_len = sq[1], ctx = sq[2];
    const int* table = tables + sq[3];
    const int kvh = blockIdx.y;
    const int G = nh / nkv;
    const int first_pos = ctx - q_len + tok_off;
    const int kv_hi = min(kv_end_item, first_pos + ntok);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t kv_tok = (size_t)block_size * nkv * hd;
    const int ntiles = kv_hi > kv_begin ? (kv_hi - kv_begin + BC - 1) / BC : 0;

    if (ntiles > 0) load_kv<HD>(sKV, sKV + BC * LDQ, cache, table, kv_begin, kv_hi, hd, nkv, kvh, block_size, kv_tok);
    cp_async_commit();
    for (int e = tid; e < DR * (HD / 8); e += 128) {
        int r = e / (HD / 8), c = e % (HD / 8);
        int tok = r / G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (tok < ntok && c < hd / 8) {
            int head = kvh * G + r % G;
            v = *(const uint4*)(q + ((size_t)(q_start + tok_off + tok) * nh + head) * hd + c * 8);
        }
        *(uint4*)(sQ + r * LDQ + c * 8) = v;
    }
    float* mw = sM + warp * DR;
    float* lw = sL + warp * DR;
    float* aw = sA + warp * DR;
    if (lane < DR) {
        mw[lane] = -INFINITY;
        lw[lane] = 0.f;
    }
    float* sw = sS + warp * DR * LDS16;
    bf16* pw = sP + warp * DR * LDP16;
    for (int e = lane; e < 256; e += 32) sw[(e / 16) * LDS16 + e % 16] = (float)(e / 16);
    __syncthreads();
    int row_of[8];
    {
        Acc f;
        wmma::load_matrix_sync(f, sw, LDS16, wmma::mem_row_major);
        for (int i = 0; i < f.num_elements && i < 8; i++) row_of[i] = (int)f.x[i];
    }
    Acc oacc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(oacc[n], 0.f);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[HD / 16];
    for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(qf[k], sQ + k * 16, LDQ);
    __syncwarp();

    for (int t = 0; t < ntiles; t++) {
        const int kb = kv_begin + t * BC;
        if (t + 1 < ntiles) {
            bf16* nk = sKV + ((t + 1) & 1) * 2 * BC * LDQ;
            load_kv<HD>(nk, nk + BC * LDQ, cache, table, kb + BC, kv_hi, hd, nkv, kvh, block_size, kv_tok);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* sK = sKV + (t & 1) * 2 * BC * LDQ + warp * 16 * LDQ;  // this warp's 16 keys
        const bf16* sV = sK + BC * LDQ;
        const int kw = kb + warp * 16;
        {
            Acc acc;
            wmma::fill_fragment(acc, 0.f);
            for (int k = 0; k < HD / 16; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                wmma::load_matrix_sync(b, sK + k * 16, LDQ);
                wmma::mma_sync(acc, qf[k], b, acc);
            }
            wmma::store_matrix_sync(sw, acc, LDS16, wmma::mem_row_major);
        }
        __syncwarp();
        {
            int r = lane >> 1, c0 = lane & 1;
            int row_pos = first_pos + r / G;
            bool valid_row = r / G < ntok;
            float mx = -INFINITY;
            for (int i = 0; i < 8; i++) {
                int c = c0 + 2 * i;
                int j = kw + c;
                float v = sw[r * LDS16 + c] * scale;
                if (!valid_row || j >= kv_hi || j > row_pos) v = -INFINITY;
                sw[r * LDS16 + c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = mw[r];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int i = 0; i < 8; i++) {
                int c = c0 + 2 * i;
                float p = m_new == -INFINITY ? 0.f : __expf(sw[r * LDS16 + c] - m_new);
                sum += p;
                pw[r * LDP16 + c] = to_bf(p);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
            __syncwarp();
            if (c0 == 0) {
                mw[r] = m_new;
                lw[r] = lw[r] * alpha + sum;
                aw[r] = alpha;
            }
        }
        __syncwarp();
        {
            float al[8];
            for (int i = 0; i < 8; i++) al[i] = aw[row_of[i]];
            for (int n = 0; n < HD / 16; n++)
                for (int i = 0; i < oacc[n].num_elements; i++) oacc[n].x[i] *= al[i];
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
            wmma::load_matrix_sync(a, pw, LDP16);
            for (int n = 0; n < HD / 16; n++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(b, sV + n * 16, LDQ);
                wmma::mma_sync(oacc[n], a, b, oacc[n]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int n = 0; n < HD / 16; n++)
        wmma::store_matrix_sync(sO + warp * DR * HD + n * 16, oacc[n], HD, wmma::mem_row_major);
    __syncthreads();

    // Merge the 4 warps' (m, l, O) per row, normalise, write.
    for (int e = tid; e < DR * hd; e += 128) {
        int r = e / hd, d = e % hd;
        int tok = r / G;
        if (tok >= ntok) continue;
        float M = -INFINITY;
        for (int w = 0; w < NWARPS; w++) M = fmaxf(M, sM[w * DR + r]);
        float l = 0.f, o = 0.f;
        if (M != -INFINITY) {
            for (int w = 0; w < NWARPS; w++) {
                float f = sM[w * DR + r] == -INFINITY ? 0.f : __expf(sM[w * DR + r] - M);
                l += f * sL[w * DR + r];
                o += f * sO[(w * DR + r) * HD + d];
            }
        }
        float v = l > 0.f ? o / l : 0.f;
        int head = kvh * G + r % G;
        if (part < 0) {
            out[((size_t)(q_start + tok_off + tok) * nh + head) * hd + d] = to_bf(v);
        } else {
            size_t pr = ((size_t)part * nkv + kvh) * BR + r;
            part_o[pr * hd + d] = v;
            if (d == 0) part_lse[pr] = l > 0.f ? M + logf(l) : -INFINITY;
        }
    }
}

#define ATTN(HD)                                                                                                \
    extern "C" __global__ void __launch_bounds__(128) paged_attention_hd##HD(                                 \
        const bf16* q, const bf16* cache, const int* tables, const int* seqs, const int* items, bf16* out,     \
        float* part_o, float* part_lse, int nh, int nkv, int hd, int block_size, float scale) {               \
        attn_tile<HD>(q, cache, tables, seqs, items, out, part_o, part_lse, nh, nkv, hd, block_size, scale);  \
    }
ATTN(16)
ATTN(32)
ATTN(64)
ATTN(128)
ATTN(256)

#define DECODE(HD)                                                                                               \
    extern "C" __global__ void __launch_bounds__(128) paged_decode_hd##HD(                                      \
        const bf16* q, const bf16* cache, const int* tables, const int* seqs, const int* items, bf16* out,       \
        float* part_o, float* part_lse, int nh, int nkv, int hd, int block_size, float scale) {                 \
        attn_decode<HD>(q, cache, tables, seqs, items, out, part_o, part_lse, nh, nkv, hd, block_size, scale);  \
    }
DECODE(16)
DECODE(32)
DECODE(64)
DECODE(128)
DECODE(256)

// Merges the splits of one work group: combine item = (seq, first_part,
// num_parts, ntok); rows as in the attention kernel. grid: (items, nkv,
// BR rows), block: 128. num_parts <= MAX_PARTS.
#define MAX_PARTS 512
extern "C" __global__ void attn_combine(const float* part_o, const float* part_lse, const int* seqs,
                                        const int* combine, bf16* out, int nh, int nkv, int hd) {
    __shared__ float w[MAX_PARTS];
    __shared__ float den;
    const int* c = combine + blockIdx.x * 4;
    const int seq = c[0], first = c[1], nparts = c[2], ntok = c[3];
    const int kvh = blockIdx.y, r = blockIdx.z;
    const int G = nh / nkv;
    if (r >= ntok * G) return;
    for (int p = threadIdx.x; p < nparts; p += blockDim.x) w[p] = part_lse[((size_t)(first + p) * nkv + kvh) * BR + r];
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int p = 0; p < nparts; p++) mx = fmaxf(mx, w[p]);
        float s = 0.f;
        for (int p = 0; p < nparts; p++) {
            w[p] = mx == -INFINITY ? 0.f : __expf(w[p] - mx);
            s += w[p];
        }
        den = s;
    }
    __syncthreads();
    const int q_start = seqs[seq * 4];
    const int tok = r / G, head = kvh * G + r % G;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.f;
        for (int p = 0; p < nparts; p++)
            if (w[p] != 0.f) num += w[p] * part_o[(((size_t)(first + p) * nkv + kvh) * BR + r) * hd + d];
        out[((size_t)(q_start + tok) * nh + head) * hd + d] = to_bf(den > 0.f ? num / den : 0.f);
    }
}
