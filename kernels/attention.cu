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

struct Smem {
    // byte offsets into dynamic shared memory
    int q, k, v, s, p, o, m, l, alpha, total;
};

__device__ __host__ inline Smem smem_layout(int HD) {
    Smem s;
    int off = 0;
    s.q = off; off += BR * HD * 2;
    s.k = off; off += BC * HD * 2;
    s.v = off; off += BC * HD * 2;
    s.s = off; off += BR * BC * 4;
    s.p = off; off += BR * BC * 2;
    s.o = off; off += BR * HD * 4;
    s.m = off; off += BR * 4;
    s.l = off; off += BR * 4;
    s.alpha = off; off += BR * 4;
    s.total = off;
    return s;
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

template <int HD>
__device__ void attn_tile(const bf16* __restrict__ q, const bf16* __restrict__ cache, const int* __restrict__ tables,
                          const int* __restrict__ seqs, const int* __restrict__ items, bf16* __restrict__ out,
                          float* __restrict__ part_o, float* __restrict__ part_lse, int nh, int nkv, int hd,
                          int block_size, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    const Smem L = smem_layout(HD);
    bf16* sQ = (bf16*)(smem + L.q);
    bf16* sK = (bf16*)(smem + L.k);
    bf16* sV = (bf16*)(smem + L.v);
    float* sS = (float*)(smem + L.s);
    bf16* sP = (bf16*)(smem + L.p);
    float* sO = (float*)(smem + L.o);
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

    // Q tile: row r = (token r / G, head kvh * G + r % G); zero padding.
    for (int e = tid; e < BR * HD; e += blockDim.x) {
        int r = e / HD, d = e % HD;
        int tok = r / G;
        float v = 0.f;
        if (tok < ntok && d < hd) {
            int head = kvh * G + r % G;
            v = to_f(q[((size_t)(q_start + tok_off + tok) * nh + head) * hd + d]);
        }
        sQ[e] = to_bf(v);
    }
    for (int r = tid; r < BR; r += blockDim.x) {
        sM[r] = -INFINITY;
        sL[r] = 0.f;
    }
    // Which row of the warp's 16 each accumulator element holds: read off a
    // fragment loaded from a matrix of row numbers (no layout assumption).
    float* rows16 = sO + warp * 256;
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
    for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(qf[k], sQ + warp * 16 * HD + k * 16, HD);
    __syncthreads();  // every warp has read its row map before sO is reused

    for (int kb = kv_begin; kb < kv_hi; kb += BC) {
        __syncthreads();  // previous tile's K/V fully consumed
        // K and V tiles from the paged cache (16-byte loads when hd % 8 == 0).
        if ((hd & 7) == 0) {
            const int chunks = hd / 8;
            for (int e = tid; e < BC * (HD / 8); e += blockDim.x) {
                int c = e / (HD / 8), d8 = e % (HD / 8);
                int j = kb + c;
                uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
                if (j < kv_hi && d8 < chunks) {
                    int b = table[j / block_size], off = j % block_size;
                    const bf16* kp = cache + (size_t)b * 2 * kv_tok + ((size_t)off * nkv + kvh) * hd + d8 * 8;
                    kv = *(const uint4*)kp;
                    vv = *(const uint4*)(kp + kv_tok);
                }
                *(uint4*)(sK + c * HD + d8 * 8) = kv;
                *(uint4*)(sV + c * HD + d8 * 8) = vv;
            }
        } else {
            for (int e = tid; e < BC * HD; e += blockDim.x) {
                int c = e / HD, d = e % HD;
                int j = kb + c;
                bf16 kv = to_bf(0.f), vv = to_bf(0.f);
                if (j < kv_hi && d < hd) {
                    int b = table[j / block_size], off = j % block_size;
                    const bf16* kp = cache + (size_t)b * 2 * kv_tok + ((size_t)off * nkv + kvh) * hd + d;
                    kv = kp[0];
                    vv = kp[kv_tok];
                }
                sK[e] = kv;
                sV[e] = vv;
            }
        }
        __syncthreads();

        // S = Q K^T for this warp's 16 rows.
        {
            Acc acc[BC / 16];
            for (int n = 0; n < BC / 16; n++) wmma::fill_fragment(acc[n], 0.f);
            for (int k = 0; k < HD / 16; k++) {
                for (int n = 0; n < BC / 16; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                    wmma::load_matrix_sync(b, sK + n * 16 * HD + k * 16, HD);
                    wmma::mma_sync(acc[n], qf[k], b, acc[n]);
                }
            }
            for (int n = 0; n < BC / 16; n++)
                wmma::store_matrix_sync(sS + warp * 16 * BC + n * 16, acc[n], BC, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax: two lanes per row, BC/2 columns each.
        {
            int r = warp * 16 + (lane >> 1);
            int c0 = (lane & 1) * (BC / 2);
            int row_pos = first_pos + r / G;
            bool valid_row = r / G < ntok;
            float mx = -INFINITY;
            for (int c = 0; c < BC / 2; c++) {
                int j = kb + c0 + c;
                float v = sS[r * BC + c0 + c] * scale;
                if (!valid_row || j >= kv_hi || j > row_pos) v = -INFINITY;
                sS[r * BC + c0 + c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = sM[r];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int c = 0; c < BC / 2; c++) {
                float p = m_new == -INFINITY ? 0.f : __expf(sS[r * BC + c0 + c] - m_new);
                sum += p;
                sP[r * BC + c0 + c] = to_bf(p);
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
                wmma::load_matrix_sync(a, sP + warp * 16 * BC + k * 16, BC);
                for (int n = 0; n < HD / 16; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                    wmma::load_matrix_sync(b, sV + k * 16 * HD + n * 16, HD);
                    wmma::mma_sync(oacc[n], a, b, oacc[n]);
                }
            }
        }
    }
    for (int n = 0; n < HD / 16; n++)
        wmma::store_matrix_sync(sO + warp * 16 * HD + n * 16, oacc[n], HD, wmma::mem_row_major);
    __syncthreads();

    // Normalise and write.
    for (int e = tid; e < BR * hd; e += blockDim.x) {
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

// Merges the splits of one work group: combine item = (seq, first_part,
// num_parts, ntok); rows as in the attention kernel. grid: (items, nkv),
// block: 128.
extern "C" __global__ void attn_combine(const float* part_o, const float* part_lse, const int* seqs,
                                        const int* combine, bf16* out, int nh, int nkv, int hd) {
    const int* c = combine + blockIdx.x * 4;
    const int seq = c[0], first = c[1], nparts = c[2], ntok = c[3];
    const int q_start = seqs[seq * 4];
    const int kvh = blockIdx.y;
    const int G = nh / nkv;
    for (int e = threadIdx.x; e < ntok * G * hd; e += blockDim.x) {
        int r = e / hd, d = e % hd;
        float mx = -INFINITY;
        for (int p = 0; p < nparts; p++) mx = fmaxf(mx, part_lse[((size_t)(first + p) * nkv + kvh) * BR + r]);
        float num = 0.f, den = 0.f;
        if (mx != -INFINITY) {
            for (int p = 0; p < nparts; p++) {
                size_t pr = ((size_t)(first + p) * nkv + kvh) * BR + r;
                float w = __expf(part_lse[pr] - mx);
                num += w * part_o[pr * hd + d];
                den += w;
            }
        }
        int tok = r / G, head = kvh * G + r % G;
        out[((size_t)(q_start + tok) * nh + head) * hd + d] = to_bf(den > 0.f ? num / den : 0.f);
    }
}
