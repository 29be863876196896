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

// One 16-byte chunk of the cache into shared bf16 (zeros when !ok): 8
// bf16 copied as they are (cp.async), or 16 e4m3 widened to bf16 (exact)
// with a plain load.
__device__ __forceinline__ void stage_chunk(bf16* dst, const bf16* src, bool ok) {
    if (ok)
        cp_async16(dst, src);
    else
        *(uint4*)dst = make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ void stage_chunk(bf16* dst, const fp8* src, bool ok) {
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (ok) e4m3x16_widen<false>(*(const uint4*)src, lo, hi);
    *(uint4*)dst = lo;
    *(uint4*)(dst + 8) = hi;
}

// Issues the copies of keys [kb, kb + BC) of the tile (zeros past kv_hi
// and past hd) into stage buffers sK / sV. An e4m3 cache needs hd % 16 == 0.
template <int HD, typename C>
__device__ __forceinline__ void load_kv(bf16* sK, bf16* sV, const C* cache, const int* table, int kb, int kv_hi,
                                        int hd, int nkv, int kvh, int block_size, size_t kv_tok) {
    constexpr int EPC = 16 / sizeof(C);  // elements of one chunk
#pragma unroll 4
    for (int e = threadIdx.x; e < BC * (HD / EPC); e += 128) {
        int c = e / (HD / EPC), d = e % (HD / EPC) * EPC;
        int j = kb + c;
        bool ok = j < kv_hi && d < hd;
        const C* kp = cache;
        if (ok) {
            int b = table[j / block_size], off = j % block_size;
            kp = cache + (size_t)b * 2 * kv_tok + ((size_t)off * nkv + kvh) * hd + d;
        }
        stage_chunk(sK + c * LDQ + d, kp, ok);
        stage_chunk(sV + c * LDQ + d, kp + kv_tok, ok);
    }
}

// One work item as both tile kernels read it: its sequence's rows, the
// keys it covers (causal: up to its last token's position) and the number
// of BC-key tiles over them.
struct Item {
    int tok_off, ntok, kv_begin, kv_hi, part, q_start, first_pos, ntiles;
    const int* table;
};

__device__ __forceinline__ Item read_item(const int* items, const int* seqs, const int* tables) {
    const int* it = items + blockIdx.x * 7;
    const int* sq = seqs + it[0] * 4;
    Item w;
    w.tok_off = it[1];
    w.ntok = it[2];
    w.kv_begin = it[3];
    w.part = it[5];
    w.q_start = sq[0];
    w.table = tables + sq[3];
    w.first_pos = sq[2] - sq[1] + w.tok_off;             // position of the tile's first token
    w.kv_hi = min(it[4], w.first_pos + w.ntok);          // causal: keys <= last position
    w.ntiles = w.kv_hi > w.kv_begin ? (w.kv_hi - w.kv_begin + BC - 1) / BC : 0;
    return w;
}

// Stages the item's Q rows into sQ ([ROWS][LDQ]): row r = (token r / G,
// head kvh * G + r % G); zeros past the item's tokens and past hd.
template <int HD, int ROWS>
__device__ __forceinline__ void load_q(bf16* sQ, const bf16* q, const Item& w, int nh, int hd, int kvh, int G, int tid) {
    for (int e = tid; e < ROWS * (HD / 8); e += 128) {
        int r = e / (HD / 8), c = e % (HD / 8);
        int tok = r / G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (tok < w.ntok && c < hd / 8) {
            int head = kvh * G + r % G;
            v = *(const uint4*)(q + ((size_t)(w.q_start + w.tok_off + tok) * nh + head) * hd + c * 8);
        }
        *(uint4*)(sQ + r * LDQ + c * 8) = v;
    }
}

// Reads the CTA's work item (KV head blockIdx.y), puts its first K/V tile
// in flight into stage 0 of sKV and stages its Q rows while it lands.
template <int HD, int ROWS, typename C>
__device__ __forceinline__ Item start_item(bf16* sQ, bf16* sKV, const bf16* q, const C* cache, const int* items,
                                           const int* seqs, const int* tables, int nh, int nkv, int hd,
                                           int block_size) {
    const Item w = read_item(items, seqs, tables);
    const int kvh = blockIdx.y;
    if (w.ntiles > 0)
        load_kv<HD>(sKV, sKV + BC * LDQ, cache, w.table, w.kv_begin, w.kv_hi, hd, nkv, kvh, block_size,
                    (size_t)block_size * nkv * hd);
    cp_async_commit();
    load_q<HD, ROWS>(sQ, q, w, nh, hd, kvh, nh / nkv, threadIdx.x);
    return w;
}

// Which row of a warp's 16 each accumulator element holds, read off a
// fragment loaded from a matrix of row numbers written into `scratch`
// (16 rows of stride ld; no layout assumption). Ends with __syncthreads.
__device__ __forceinline__ void accumulator_rows(float* scratch, int ld, int lane, int row_of[8]) {
    for (int e = lane; e < 256; e += 32) scratch[(e / 16) * ld + e % 16] = (float)(e / 16);
    __syncthreads();
    Acc f;
    wmma::load_matrix_sync(f, scratch, ld, wmma::mem_row_major);
    for (int i = 0; i < f.num_elements && i < 8; i++) row_of[i] = (int)f.x[i];
}

// Waits for key tile t's copies and issues tile t + 1's into the other
// stage; returns tile t's stage ([k|v][BC][LDQ]).
template <int HD, typename C>
__device__ __forceinline__ const bf16* next_kv_tile(bf16* sKV, int t, const Item& w, const C* cache, int hd, int nkv,
                                                    int kvh, int block_size, size_t kv_tok) {
    const int kb = w.kv_begin + t * BC;
    if (t + 1 < w.ntiles) {
        bf16* nk = sKV + ((t + 1) & 1) * 2 * BC * LDQ;
        load_kv<HD>(nk, nk + BC * LDQ, cache, w.table, kb + BC, w.kv_hi, hd, nkv, kvh, block_size, kv_tok);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
    return sKV + (t & 1) * 2 * BC * LDQ;
}

// Row r's normalised output element d: straight into `out`, or as an f32
// partial with its log-sum-exp (m + log l) for attn_combine.
__device__ __forceinline__ void write_out(bf16* out, float* part_o, float* part_lse, const Item& w, int nh, int nkv,
                                          int hd, int kvh, int G, int r, int d, float o, float m, float l) {
    int tok = r / G, head = kvh * G + r % G;
    if (w.part < 0) {
        out[((size_t)(w.q_start + w.tok_off + tok) * nh + head) * hd + d] = to_bf(o);
    } else {
        size_t pr = ((size_t)w.part * nkv + kvh) * BR + r;
        part_o[pr * hd + d] = o;
        if (d == 0) part_lse[pr] = l > 0.f ? m + logf(l) : -INFINITY;
    }
}

// The parameters of both tile kernels over a cache of C: q, the layer's
// pool, the plan (block tables, sequences, work items), the output and the
// split partials, the shape, the softmax scale (times k_scale) and v_scale.
#define TILE_PARAMS(C)                                                                                          \
    const bf16 *__restrict__ q, const C *__restrict__ cache, const int *__restrict__ tables,                    \
        const int *__restrict__ seqs, const int *__restrict__ items, bf16 *__restrict__ out,                    \
        float *__restrict__ part_o, float *__restrict__ part_lse, int nh, int nkv, int hd, int block_size,      \
        float scale, float v_scale

template <int HD, typename C>
__device__ void attn_tile(TILE_PARAMS(C)) {
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

    const Item w = start_item<HD, BR>(sQ, sKV, q, cache, items, seqs, tables, nh, nkv, hd, block_size);
    const int kvh = blockIdx.y, G = nh / nkv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t kv_tok = (size_t)block_size * nkv * hd;
    const int ntok = w.ntok, kv_hi = w.kv_hi, first_pos = w.first_pos;
    for (int r = tid; r < BR; r += 128) {
        sM[r] = -INFINITY;
        sL[r] = 0.f;
    }
    int row_of[8];
    accumulator_rows(sS + warp * 256, 16, lane, row_of);
    Acc oacc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(oacc[n], 0.f);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[HD / 16];
    for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(qf[k], sQ + warp * 16 * LDQ + k * 16, LDQ);
    __syncthreads();  // every warp has read its row map before sS is reused

    for (int t = 0; t < w.ntiles; t++) {
        const int kb = w.kv_begin + t * BC;
        const bf16* sK = next_kv_tile<HD>(sKV, t, w, cache, hd, nkv, kvh, block_size, kv_tok);
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
        if (r / G >= ntok) continue;
        float l = sL[r];
        write_out(out, part_o, part_lse, w, nh, nkv, hd, kvh, G, r, d, l > 0.f ? sO[r * HD + d] / l * v_scale : 0.f, sM[r],
                  l);
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
template <int HD, typename C>
__device__ void attn_decode(TILE_PARAMS(C)) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* sQ = (bf16*)smem;                                   // [DR][LDQ]
    bf16* sKV = sQ + DR * LDQ;                                // [2][k|v][BC][LDQ]
    float* sS = (float*)(sKV + 2 * 2 * BC * LDQ);             // [4][DR][LDS16]
    bf16* sP = (bf16*)(sS + NWARPS * DR * LDS16);             // [4][DR][LDP16]
    float* sM = (float*)(sP + NWARPS * DR * LDP16);           // [4][DR]
    float* sL = sM + NWARPS * DR;                             // [4][DR]
    float* sA = sL + NWARPS * DR;                             // [4][DR]
    float* sO = (float*)sKV;                                  // after the loop: [4][DR][HD]

    const Item w = start_item<HD, DR>(sQ, sKV, q, cache, items, seqs, tables, nh, nkv, hd, block_size);
    const int kvh = blockIdx.y, G = nh / nkv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t kv_tok = (size_t)block_size * nkv * hd;
    const int ntok = w.ntok, kv_hi = w.kv_hi, first_pos = w.first_pos;
    float* mw = sM + warp * DR;
    float* lw = sL + warp * DR;
    float* aw = sA + warp * DR;
    if (lane < DR) {
        mw[lane] = -INFINITY;
        lw[lane] = 0.f;
    }
    float* sw = sS + warp * DR * LDS16;
    bf16* pw = sP + warp * DR * LDP16;
    int row_of[8];
    accumulator_rows(sw, LDS16, lane, row_of);
    Acc oacc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(oacc[n], 0.f);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[HD / 16];
    for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(qf[k], sQ + k * 16, LDQ);
    __syncwarp();

    for (int t = 0; t < w.ntiles; t++) {
        const bf16* sK = next_kv_tile<HD>(sKV, t, w, cache, hd, nkv, kvh, block_size, kv_tok) + warp * 16 * LDQ;  // this warp's 16 keys
        const bf16* sV = sK + BC * LDQ;
        const int kw = w.kv_begin + t * BC + warp * 16;
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
        for (int v = 0; v < NWARPS; v++) M = fmaxf(M, sM[v * DR + r]);
        float l = 0.f, o = 0.f;
        if (M != -INFINITY) {
            for (int v = 0; v < NWARPS; v++) {
                float f = sM[v * DR + r] == -INFINITY ? 0.f : __expf(sM[v * DR + r] - M);
                l += f * sL[v * DR + r];
                o += f * sO[(v * DR + r) * HD + d];
            }
        }
        write_out(out, part_o, part_lse, w, nh, nkv, hd, kvh, G, r, d, l > 0.f ? o / l * v_scale : 0.f, M, l);
    }
}

// Entry points by head dim, over a bf16 cache and (`_fp8`) an e4m3 one,
// whose layer scales multiply the scores (k_scale) and the output (v_scale).
#define TILE_KERNEL(NAME, BODY, HD)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) NAME##_hd##HD(                                                  \
        const bf16* q, const bf16* cache, const int* tables, const int* seqs, const int* items, bf16* out,             \
        float* part_o, float* part_lse, int nh, int nkv, int hd, int block_size, float scale) {                       \
        BODY<HD>(q, cache, tables, seqs, items, out, part_o, part_lse, nh, nkv, hd, block_size, scale, 1.f);          \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) NAME##_fp8_hd##HD(                                              \
        const bf16* q, const fp8* cache, const int* tables, const int* seqs, const int* items, bf16* out,              \
        float* part_o, float* part_lse, int nh, int nkv, int hd, int block_size, float scale, float k_scale,          \
        float v_scale) {                                                                                              \
        BODY<HD>(q, cache, tables, seqs, items, out, part_o, part_lse, nh, nkv, hd, block_size, scale * k_scale,      \
                 v_scale);                                                                                            \
    }
#define TILE_KERNELS(HD) TILE_KERNEL(paged_attention, attn_tile, HD) TILE_KERNEL(paged_decode, attn_decode, HD)
TILE_KERNELS(16)
TILE_KERNELS(32)
TILE_KERNELS(64)
TILE_KERNELS(128)
TILE_KERNELS(256)

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

// ---------------------------------------------------------------------------
// Decode attention v2 (the default for decode-shaped work items; the
// environment variable KVC_DECODE_KERNEL=v1 keeps attn_decode above).
//
// Same rows as attn_decode (at most 16: tokens x query heads of one KV
// head's group, padded to 16), but every warp runs its own pipeline over
// its own 16-key tiles (tiles w, w + NW, w + 2 NW, ... of the CTA's key
// range): a ring of STAGES K/V tiles per warp filled with 16-byte cp.async
// (zero-filled past the range and past hd), so the only synchronisation in
// the loop is __syncwarp and each warp keeps STAGES - 1 tiles in flight
// while it computes one. S = Q K^T and O += P V use
// mma.m16n8k16 (bf16 in, f32 accumulate) with S, P and O in registers
// (FlashAttention-2 layout: the S accumulator is P's A fragment), Q's A
// fragments are loaded once, K and V fragments come from shared memory
// with ldmatrix (.trans for V). The block table is read once per key row
// per tile, two tiles ahead of the copies that need it.
//
// At the end the warps' (max, sum, O) states merge in shared memory. A
// CTA that covers the whole range writes bf16 output. Split ranges (part
// >= 0) write the normalised f32 partial and its log2-sum-exp, then count
// themselves on their group's counter; the last CTA of a (group, KV head)
// resets the counter to 0 (so the next launch, or a CUDA graph replay,
// starts clean), merges every split of the group and writes bf16 output:
// no second launch.
//
// Items (8 ints): seq, tok_off, ntok, kv_begin, kv_end, part, first_part,
// nparts; grid.x = items x nkv (KV head fastest), block = Cfg::NT. Partials: part_o [parts][nkv][16][hd] f32, part_lse
// [parts][nkv][16] f32 (log2 domain); counters [parts][nkv] u32, zero
// before the first launch, indexed by the group's first part.
namespace dec2 {
constexpr int TK = 16;          // keys per warp tile
constexpr int ROWS = 16;        // query rows per CTA (mma M)
constexpr int MERGE_PARTS = 128;  // splits one group may have (the merge's weight table)

template <int HD, bool FP8 = false>
struct Cfg {
    static constexpr int NW = HD == 256 ? 4 : 8;  // warps per CTA
    static constexpr int NT = NW * 32;
    // An e4m3 ring slot is half a bf16 one: more stages keep as many bytes in flight.
    static constexpr int STAGES = FP8 ? 4 : HD >= 64 ? 3 : 4;
    static constexpr int LD = HD + 8;   // 2-byte row stride of Q/K/V tiles: ldmatrix rows in distinct banks
    static constexpr int LDO = HD + 8;  // f32 row stride of the warps' O tiles (float2 stores conflict-free)
    static constexpr int STAGE = 2 * TK * LD;  // elements of one 2-byte K tile, then V tile
    static constexpr int LD8 = HD + 16;        // byte row stride of an e4m3 tile (16-byte aligned rows for ldmatrix)
    // Bytes of one ring slot: K then V as the cache holds them (the MMAs
    // read an e4m3 slot through ldmatrix and widen in registers).
    static constexpr int SLOT = FP8 ? 2 * TK * LD8 : 2 * STAGE;
    static constexpr int WARP_BYTES = STAGES * SLOT;
    static constexpr int KV_BYTES = NW * WARP_BYTES;
    static constexpr int Q_OFF = KV_BYTES;
    static constexpr int M_OFF = Q_OFF + ROWS * LD * 2;  // [NW][16] each warp's row maxima
    static constexpr int L_OFF = M_OFF + NW * ROWS * 4;  // [NW][16] row sums
    static constexpr int F_OFF = L_OFF + NW * ROWS * 4;  // [NW][16] warp weights
    static constexpr int ROW_OFF = F_OFF + NW * ROWS * 4;  // [16] max, [16] sum of the CTA
    static constexpr int FLAG_OFF = ROW_OFF + 2 * ROWS * 4;
    // Mirrored by decode2_smem_bytes in crates/model-qwen3/src/cuda/attention.rs.
    static constexpr int SMEM = FLAG_OFF + 16;
    // After the loop the ring holds the warps' f32 O tiles, and in the
    // merging CTA the weight table plus at least one staged partial.
    static_assert(KV_BYTES >= NW * ROWS * LDO * 4, "O tiles fit in the K/V ring");
    static_assert(KV_BYTES >= MERGE_PARTS * ROWS * 4 + ROWS * HD * 4, "merge staging fits in the K/V ring");
    static_assert(SMEM <= 227 * 1024, "fits an SM's shared memory");
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16-byte async copy; copies nothing and writes zeros when !full.
__device__ __forceinline__ void cp16(void* dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(full ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm4t(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

// d += a (16x16, row) * b (16x8, col), f32 accumulate; bf16 in, or f16
// (H: over an e4m3 cache, whose values f16 holds exactly).
template <bool H = false>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (H)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm2(unsigned (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm2t(unsigned (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p))
                 : "memory");
}

// An e4m3 tile read in place (no widened copy). ldmatrix treats a byte
// pair as one b16 element, so a 16-byte row chunk is one 8x8 matrix row:
// - K (no .trans): lane (g, t) gets bytes 4t..4t+3 of key g's 16-column
//   chunk. Within each 16-column chunk the MMA's k order is permuted:
//   logical columns (2t, 2t+1) are bytes 4t, 4t+1 and (2t+8, 2t+9) are
//   4t+2, 4t+3; Q is staged in the same order (q_col_perm), and a dot
//   product does not depend on the order of its terms.
// - V (.trans): lane (g, t) gets keys 2t and 2t+1 at columns 2g and 2g+1;
//   the even columns make one n-tile's B fragment and the odd ones a
//   second, so O's n-tiles 2c and 2c+1 hold chunk c's even and odd columns.
// Logical column of physical column p of a 16-column chunk (Q staging).
__device__ __forceinline__ int q_col_perm(int p) { return 2 * (p >> 2) + (p & 1) + ((p & 2) ? 8 : 0); }

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// Two values as the MMA's 2-byte pair: f16 (H) or bf16.
template <bool H>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    if constexpr (H) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&v);
    } else {
        return pack_bf16(lo, hi);
    }
}

// 2^x (ex2.approx: 0 at -inf).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ long long shfl64(long long v, int src) {
    int lo = __shfl_sync(0xffffffffu, (int)(v & 0xffffffffll), src);
    int hi = __shfl_sync(0xffffffffu, (int)(v >> 32), src);
    return ((long long)hi << 32) | (unsigned)lo;
}

__device__ __forceinline__ void store_bf16x4(bf16* dst, float4 v) {
    uint2 u = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    *reinterpret_cast<uint2*>(dst) = u;
}

// The last split of a group: merges the group's `nparts` partials (rows
// [0, R)) into bf16 output. Weights first (all log-sum-exps in one pass of
// parallel loads), then the partial outputs in rounds that fill the K/V
// ring with cp.async, so a round costs about one L2 round trip.
template <int HD, bool FP8>
__device__ void merge_parts(unsigned char* smem, const float* __restrict__ part_o, const float* __restrict__ part_lse,
                            bf16* __restrict__ out, int first, int nparts, int R, int out_row, int nh, int nkv, int kvh,
                            int G, int hd) {
    using C = Cfg<HD, FP8>;
    float* sW = (float*)smem;                  // [nparts][16]: log2-sum-exps, then weights
    float* sStage = sW + MERGE_PARTS * ROWS;     // staged partials
    float* sDen = (float*)(smem + C::ROW_OFF) + ROWS;
    const int tid = threadIdx.x;
    for (int i = tid; i < nparts * ROWS; i += C::NT) {
        int p = i / ROWS, r = i % ROWS;
        sW[i] = r < R ? __ldcg(part_lse + ((size_t)(first + p) * nkv + kvh) * ROWS + r) : -INFINITY;
    }
    __syncthreads();
    {
        constexpr int TPR = C::NT / ROWS;  // threads per row, a power of two dividing 32
        const int r = tid / TPR, sub = tid % TPR;
        float M = -INFINITY;
        for (int p = sub; p < nparts; p += TPR) M = fmaxf(M, sW[p * ROWS + r]);
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float den = 0.f;
        for (int p = sub; p < nparts; p += TPR) {
            float x = sW[p * ROWS + r];
            float w = x == -INFINITY ? 0.f : ex2(x - M);
            sW[p * ROWS + r] = w;
            den += w;
        }
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
        if (sub == 0) sDen[r] = den;
    }
    __syncthreads();

    constexpr int MAXE = (ROWS * HD / 4 + C::NT - 1) / C::NT;
    const int n4 = R * hd / 4;  // float4s of one partial's valid rows (contiguous)
    const int cap = (C::KV_BYTES - MERGE_PARTS * ROWS * 4) / (n4 * 16);  // partials per round
    float4 acc[MAXE];
#pragma unroll
    for (int k = 0; k < MAXE; k++) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p0 = 0; p0 < nparts; p0 += cap) {
        const int np = min(cap, nparts - p0);
        for (int i = tid; i < np * n4; i += C::NT) {
            int pp = i / n4, e = i - pp * n4;
            int r = e * 4 / hd;
            // Weight-0 partials (empty splits) are not read.
            if (sW[(p0 + pp) * ROWS + r] != 0.f)
                cp16(sStage + (size_t)i * 4, part_o + ((size_t)(first + p0 + pp) * nkv + kvh) * ROWS * hd + e * 4, true);
        }
        commit();
        wait<0>();
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MAXE; k++) {
            int e = tid + k * C::NT;
            if (e < n4) {
                int r = e * 4 / hd;
                for (int pp = 0; pp < np; pp++) {
                    float w = sW[(p0 + pp) * ROWS + r];
                    if (w != 0.f) {
                        float4 v = *(const float4*)(sStage + ((size_t)pp * n4 + e) * 4);
                        acc[k].x += w * v.x;
                        acc[k].y += w * v.y;
                        acc[k].z += w * v.z;
                        acc[k].w += w * v.w;
                    }
                }
            }
        }
        __syncthreads();  // the staging area is refilled by the next round
    }
#pragma unroll
    for (int k = 0; k < MAXE; k++) {
        int e = tid + k * C::NT;
        if (e < n4) {
            int r = e * 4 / hd, c = e * 4 - r * hd;
            float den = sDen[r];
            float inv = den > 0.f ? 1.f / den : 0.f;
            float4 v = make_float4(acc[k].x * inv, acc[k].y * inv, acc[k].z * inv, acc[k].w * inv);
            store_bf16x4(out + ((size_t)(out_row + r / G) * nh + kvh * G + r % G) * hd + c, v);
        }
    }
}
}  // namespace dec2

// FP8: the cache holds e4m3 (cache_t = fp8): a warp's ring slots hold its
// bytes, which ldmatrix reads in place and the MMAs' fragments widen to
// f16 in registers (exact), so the MMAs run in f16 (Q staged as f16 in the
// permuted column order above, P packed as f16); its k_scale is in
// `scale` (the entry point's product), its v_scale multiplies the output.
// hd % 16 == 0.
template <int HD, bool FP8, typename cache_t>
__device__ void attn_decode2(const bf16* __restrict__ q, const cache_t* __restrict__ cache, const int* __restrict__ tables,
                             const int* __restrict__ seqs, const int* __restrict__ items, bf16* __restrict__ out,
                             float* __restrict__ part_o, float* __restrict__ part_lse, unsigned* __restrict__ counters,
                             int nh, int nkv, int hd, int block_size, float scale, float v_scale) {
    using namespace dec2;
    using C = Cfg<HD, FP8>;
    constexpr int NW = C::NW, NT = C::NT, S = C::STAGES, LD = C::LD;
    constexpr int EPC = 16 / sizeof(cache_t);  // cache elements per 16-byte chunk
    constexpr int CPR = HD / EPC;    // 16-byte chunks per K/V row
    constexpr int RPI = 32 / CPR;    // rows one warp-wide copy instruction covers
    constexpr int NI = (TK + RPI - 1) / RPI;  // copy instructions per tile (K, and as many for V)
    constexpr int LDC = FP8 ? C::LD8 : LD;    // cache-element row stride of a ring slot
    constexpr bool QREG = HD <= 128;  // Q fragments stay in registers (at 256: reloaded per tile)
    extern __shared__ __align__(128) unsigned char smem[];
    {
        // A size that disagrees with the host's would corrupt memory silently.
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
        if (dyn < (unsigned)C::SMEM) __trap();
    }
    bf16* sQ = (bf16*)(smem + C::Q_OFF);
    float* sM = (float*)(smem + C::M_OFF);
    float* sL = (float*)(smem + C::L_OFF);
    float* sF = (float*)(smem + C::F_OFF);
    float* sRowM = (float*)(smem + C::ROW_OFF);
    float* sRowL = sRowM + ROWS;
    int* sFlag = (int*)(smem + C::FLAG_OFF);

    // grid.x = items x KV heads, KV head fastest: the CTAs that run side by
    // side read neighbouring slices of the same cache blocks.
    const int kvh = blockIdx.x % nkv;
    const int* it = items + (blockIdx.x / nkv) * 8;
    const int seq = it[0], tok_off = it[1], ntok = it[2], kv_begin = it[3], kv_end_item = it[4];
    const int part = it[5], first = it[6], nparts = it[7];
    const int* sq = seqs + seq * 4;
    const int q_start = sq[0], q_len = sq[1], ctx = sq[2];
    const int* table = tables + sq[3];
    const int G = nh / nkv;
    const int R = ntok * G;  // valid rows
    const int first_pos = ctx - q_len + tok_off;
    const int kv_hi = min(kv_end_item, first_pos + ntok);  // causal: keys <= last position
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;  // mma fragment row group and column pair
    const size_t kv_tok = (size_t)block_size * nkv * hd;
    const int ntiles = kv_hi > kv_begin ? (kv_hi - kv_begin + TK - 1) / TK : 0;
    const int my_tiles = ntiles > warp ? (ntiles - warp + NW - 1) / NW : 0;
    cache_t* ring = (cache_t*)(smem + warp * C::WARP_BYTES);

    // Lane l (and l + 16) looks up key row l % 16 of this warp's tile i:
    // the block id (raw table entry, -1 past the range) and the row's
    // element offset inside its block.
    auto lookup = [&](int i, int& blk, int& in_blk) {
        int j = kv_begin + (warp + i * NW) * TK + (lane & 15);
        blk = -1;
        in_blk = 0;
        if (j < kv_hi) {
            int b = j / block_size;
            blk = table[b];
            in_blk = ((j - b * block_size) * nkv + kvh) * hd;
        }
    };
    // Copies tile i (K and V) into ring slot i % S; lane l's chunks are
    // column l % CPR of rows l / CPR + RPI * c, so a warp's instruction
    // reads whole rows (coalesced). Row offsets come from their lookup lane.
    auto issue = [&](int i, int blk, int in_blk) {
        cache_t* dK = ring + (i % S) * (C::SLOT / sizeof(cache_t));
        long long src = blk < 0 ? -1 : (long long)blk * 2 * (long long)kv_tok + in_blk;
        const int ch = lane % CPR;
        const bool col_ok = ch * EPC < hd;
#pragma unroll
        for (int c = 0; c < NI; c++) {
            const int row = c * RPI + lane / CPR;
            long long rs = shfl64(src, row % TK);
            if (row >= TK) continue;  // (an e4m3 row of 16 elements is one chunk: half the lanes)
            bool ok = rs >= 0 && col_ok;
            const cache_t* gk = cache + (ok ? rs + ch * EPC : 0);
            cp16(dK + row * LDC + ch * EPC, gk, ok);
            cp16(dK + TK * LDC + row * LDC + ch * EPC, ok ? gk + kv_tok : cache, ok);
        }
    };

    // Block-table entries of the first S + 1 tiles, then the first S - 1
    // tiles in flight while Q is staged.
    int pb[S + 1], po[S + 1];
#pragma unroll
    for (int s = 0; s <= S; s++) lookup(s, pb[s], po[s]);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < my_tiles) issue(s, pb[s], po[s]);
        commit();
    }
    int nb0 = pb[S - 1], no0 = po[S - 1], nb1 = pb[S], no1 = po[S];

    // Q rows: row r = (token r / G, head kvh * G + r % G); zeros past R and hd.
    for (int e = tid; e < ROWS * (HD / 8); e += NT) {
        int r = e / (HD / 8), c = e % (HD / 8);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < R && c * 8 < hd) {
            int head = kvh * G + r % G;
            v = *(const uint4*)(q + ((size_t)(q_start + tok_off + r / G) * nh + head) * hd + c * 8);
            if constexpr (FP8) {  // the f16 MMAs' Q (RMS-normed: well inside f16's range)
                unsigned* w = (unsigned*)&v;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
                    w[k] = pack2<true>(f.x, f.y);
                }
            }
        }
        if constexpr (FP8) {
            // Column pairs (p, p + 1), p even, stay pairs in the permuted order.
            const unsigned* w = (const unsigned*)&v;
            const int base = (c >> 1) * 16, p0 = (c & 1) * 8;
#pragma unroll
            for (int k = 0; k < 4; k++) *(unsigned*)(sQ + r * LD + base + q_col_perm(p0 + 2 * k)) = w[k];
        } else {
            *(uint4*)(sQ + r * LD + c * 8) = v;
        }
    }
    __syncthreads();

    // ldmatrix addresses (see the PTX ISA fragment layouts of m16n8k16):
    // Q (A, row-major): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15);
    // K (B = K^T, "col"): matrices (keys 0-7, d 0-7 | 8-15), (keys 8-15, ...);
    // V (B, via .trans): matrices (keys 0-7 | 8-15) x (d 0-7 | 8-15).
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
    unsigned qf[QREG ? HD / 16 : 1][4];
    if constexpr (QREG) {
#pragma unroll
        for (int k = 0; k < HD / 16; k++) ldsm4(qf[k], sQ + a_row * LD + k * 16 + a_col);
    }

    const float sl2 = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = 2^(x log2 e)
    // Key limits of this thread's rows g and g + 8 (causal within the
    // item's tokens, and the range end); the smallest bounds every row.
    const int lim0 = min(kv_hi, first_pos + g / G + 1), lim1 = min(kv_hi, first_pos + (g + 8) / G + 1);
    const int lim_min = min(kv_hi, first_pos + 1);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int i = 0; i < my_tiles; i++) {
        if (i + S - 1 < my_tiles) issue(i + S - 1, nb0, no0);
        commit();
        nb0 = nb1;
        no0 = no1;
        lookup(i + S + 1, nb1, no1);
        wait<S - 1>();  // this lane's copies of tile i have landed
        __syncwarp();   // ... and every lane's
        const cache_t* slot = ring + (i % S) * (C::SLOT / sizeof(cache_t));
        const bf16* sK = (const bf16*)slot;
        const bf16* sV = sK + TK * LD;
        const fp8* sK8 = (const fp8*)slot;  // FP8: e4m3 rows of LDC bytes
        const fp8* sV8 = sK8 + TK * LDC;
        const int kb = kv_begin + (warp + i * NW) * TK;

        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            unsigned a[4], b[4];
            if constexpr (QREG) {
                a[0] = qf[k][0];
                a[1] = qf[k][1];
                a[2] = qf[k][2];
                a[3] = qf[k][3];
            } else {
                ldsm4(a, sQ + a_row * LD + k * 16 + a_col);
            }
            if constexpr (FP8) {
                // Keys 0-7 and 8-15 of chunk k: lanes 0-7 and 8-15 give the rows.
                unsigned r[2];
                ldsm2(r, sK8 + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDC + k * 16);
                b[0] = e4m3x2_to_h2(r[0] & 0xffffu);
                b[1] = e4m3x2_to_h2(r[0] >> 16);
                b[2] = e4m3x2_to_h2(r[1] & 0xffffu);
                b[3] = e4m3x2_to_h2(r[1] >> 16);
            } else {
                ldsm4(b, sK + k_row * LD + k * 16 + k_col);
            }
            mma<FP8>(s[0], a, b[0], b[1]);
            mma<FP8>(s[1], a, b[2], b[3]);
        }
        // s[n][e]: row g (e < 2) or g + 8, key kb + 8 n + 2 t + (e & 1).
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] *= sl2;
        if (kb + TK > lim_min) {
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (kb + n * 8 + 2 * t + (e & 1) >= (e < 2 ? lim0 : lim1)) s[n][e] = -INFINITY;
        }
        float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        // A row with no key yet keeps max -inf: subtract 0 instead (p = 0).
        const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
        const float al0 = ex2(m0 - mu0), al1 = ex2(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        float p[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            p[n][0] = ex2(s[n][0] - mu0);
            p[n][1] = ex2(s[n][1] - mu0);
            p[n][2] = ex2(s[n][2] - mu1);
            p[n][3] = ex2(s[n][3] - mu1);
        }
        // Per-thread partial sums; the quad's are added after the loop.
        l0 = l0 * al0 + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
        l1 = l1 * al1 + (p[0][2] + p[0][3]) + (p[1][2] + p[1][3]);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= al0;
            o[n][1] *= al0;
            o[n][2] *= al1;
            o[n][3] *= al1;
        }
        // The S accumulators of keys 0-7 and 8-15 are P's A fragment.
        const unsigned pa[4] = {pack2<FP8>(p[0][0], p[0][1]), pack2<FP8>(p[0][2], p[0][3]), pack2<FP8>(p[1][0], p[1][1]),
                                pack2<FP8>(p[1][2], p[1][3])};
#pragma unroll
        for (int dt = 0; dt < HD / 16; dt++) {
            if constexpr (FP8) {
                // Keys 0-7 and 8-15 of column chunk dt; bytes (0, 2) of a
                // register are the even column's key pair, (1, 3) the odd one's.
                unsigned r[2];
                ldsm2t(r, sV8 + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDC + dt * 16);
                const unsigned p0 = __byte_perm(r[0], 0u, 0x3120), p1 = __byte_perm(r[1], 0u, 0x3120);
                mma<FP8>(o[2 * dt], pa, e4m3x2_to_h2(p0 & 0xffffu), e4m3x2_to_h2(p1 & 0xffffu));
                mma<FP8>(o[2 * dt + 1], pa, e4m3x2_to_h2(p0 >> 16), e4m3x2_to_h2(p1 >> 16));
            } else {
                unsigned b[4];
                ldsm4t(b, sV + a_row * LD + dt * 16 + a_col);
                mma<FP8>(o[2 * dt], pa, b[0], b[1]);
                mma<FP8>(o[2 * dt + 1], pa, b[2], b[3]);
            }
        }
        __syncwarp();  // every lane has read slot i % S before it is refilled
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    // Merge the warps: their O tiles go where the K/V ring was.
    wait<0>();
    __syncthreads();
    float* sO = (float*)smem;  // [NW][16][LDO]
    if (t == 0) {
        sM[warp * ROWS + g] = m0;
        sM[warp * ROWS + g + 8] = m1;
        sL[warp * ROWS + g] = l0;
        sL[warp * ROWS + g + 8] = l1;
    }
    if constexpr (FP8) {
        // n-tiles 2c and 2c + 1 are chunk c's even and odd columns: lane
        // (g, t) holds columns 16c + 4t .. 16c + 4t + 3 of rows g and g + 8.
#pragma unroll
        for (int c = 0; c < HD / 16; c++) {
            const float* e = o[2 * c];
            const float* d = o[2 * c + 1];
            *(float4*)(sO + (warp * ROWS + g) * C::LDO + c * 16 + 4 * t) = make_float4(e[0], d[0], e[1], d[1]);
            *(float4*)(sO + (warp * ROWS + g + 8) * C::LDO + c * 16 + 4 * t) = make_float4(e[2], d[2], e[3], d[3]);
        }
    } else {
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            *(float2*)(sO + (warp * ROWS + g) * C::LDO + n * 8 + 2 * t) = make_float2(o[n][0], o[n][1]);
            *(float2*)(sO + (warp * ROWS + g + 8) * C::LDO + n * 8 + 2 * t) = make_float2(o[n][2], o[n][3]);
        }
    }
    __syncthreads();
    if (tid < ROWS) {
        float M = -INFINITY;
        for (int w = 0; w < NW; w++) M = fmaxf(M, sM[w * ROWS + tid]);
        float l = 0.f;
        for (int w = 0; w < NW; w++) {
            float f = M == -INFINITY ? 0.f : ex2(sM[w * ROWS + tid] - M);
            sF[w * ROWS + tid] = f;
            l += f * sL[w * ROWS + tid];
        }
        sRowM[tid] = M;
        sRowL[tid] = l;
    }
    __syncthreads();
    const int hd4 = hd / 4;
    for (int e = tid; e < R * hd4; e += NT) {
        int r = e / hd4, c = (e - r * hd4) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = 0; w < NW; w++) {
            float f = sF[w * ROWS + r];
            float4 v = *(const float4*)(sO + (w * ROWS + r) * C::LDO + c);
            acc.x += f * v.x;
            acc.y += f * v.y;
            acc.z += f * v.z;
            acc.w += f * v.w;
        }
        float l = sRowL[r];
        float inv = l > 0.f ? v_scale / l : 0.f;
        acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        if (part < 0) {
            store_bf16x4(out + ((size_t)(q_start + tok_off + r / G) * nh + kvh * G + r % G) * hd + c, acc);
        } else {
            *(float4*)(part_o + (((size_t)part * nkv + kvh) * ROWS + r) * hd + c) = acc;
        }
    }
    if (part < 0) return;
    if (tid < R) {
        float l = sRowL[tid];
        part_lse[((size_t)part * nkv + kvh) * ROWS + tid] = l > 0.f ? sRowM[tid] + log2f(l) : -INFINITY;
    }

    // Count this split; the group's last one merges (threadFenceReduction
    // pattern: each thread's partial stores are fenced before the count).
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned* ctr = counters + (size_t)first * nkv + kvh;
        int last = atomicAdd(ctr, 1u) == (unsigned)(nparts - 1);
        if (last) atomicExch(ctr, 0u);  // every split has counted: clean for the next launch
        *sFlag = last;
    }
    __syncthreads();
    if (!*sFlag) return;
    __threadfence();
    if (nparts > MERGE_PARTS) __trap();
    merge_parts<HD, FP8>(smem, part_o, part_lse, out, first, nparts, R, q_start + tok_off, nh, nkv, kvh, G, hd);
}

#define DECODE2(HD)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(dec2::Cfg<HD>::NT, 1) paged_decode2_hd##HD(                        \
        const bf16* q, const bf16* cache, const int* tables, const int* seqs, const int* items, bf16* out,           \
        float* part_o, float* part_lse, unsigned* counters, int nh, int nkv, int hd, int block_size, float scale) {  \
        attn_decode2<HD, false>(q, cache, tables, seqs, items, out, part_o, part_lse, counters, nh, nkv, hd,         \
                                block_size, scale, 1.f);                                                             \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(dec2::Cfg<HD>::NT, 1) paged_decode2_fp8_hd##HD(                    \
        const bf16* q, const fp8* cache, const int* tables, const int* seqs, const int* items, bf16* out,            \
        float* part_o, float* part_lse, unsigned* counters, int nh, int nkv, int hd, int block_size, float scale,    \
        float k_scale, float v_scale) {                                                                              \
        attn_decode2<HD, true>(q, cache, tables, seqs, items, out, part_o, part_lse, counters, nh, nkv, hd,          \
                               block_size, scale * k_scale, v_scale);                                                \
    }
DECODE2(16)
DECODE2(32)
DECODE2(64)
DECODE2(128)
DECODE2(256)
