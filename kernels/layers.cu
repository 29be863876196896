// Per-token layers: RMSNorm (plain and fused with the residual add),
// q/k RMSNorm + rotary embedding + paged K/V store, SiLU-and-multiply
// (scalar for any shape, vectorised where the shape allows),
// a row gather (embedding lookup, logits rows, MoE pairs in expert order),
// and a K/V gather from the paged pool (cuDNN's ragged prefill attention).
#include "common.cuh"

// out = w * bf16(x * rsqrt(mean(x^2) + eps)) per row (HF's Qwen3RMSNorm).
// grid: rows, block: 256.
__device__ void rmsnorm_row(const bf16* x, const bf16* w, bf16* out, int H, float eps) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = to_f(x[i]);
        ss += v * v;
    }
    float r = rsqrtf(block_sum(ss) / H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        out[i] = to_bf(round_bf(to_f(x[i]) * r) * to_f(w[i]));
}

extern "C" __global__ void rmsnorm(const bf16* x, const bf16* w, bf16* out, int H, float eps) {
    size_t row = blockIdx.x;
    rmsnorm_row(x + row * H, w, out + row * H, H, eps);
}

// x += h (rounded to bf16, as a bf16 add), then out = rmsnorm(x). One pass
// with 16-byte accesses when H % 8 == 0 and H <= 8 * blockDim.x.
extern "C" __global__ void add_rmsnorm(bf16* x, const bf16* h, const bf16* w, bf16* out, int H, float eps) {
    size_t row = blockIdx.x;
    bf16* xr = x + row * H;
    const bf16* hr = h + row * H;
    if (H % 8 == 0 && H <= 8 * (int)blockDim.x) {
        int c = threadIdx.x * 8;
        float v[8];
        float ss = 0.f;
        if (c < H) {
            uint4 a = *(const uint4*)(xr + c), b = *(const uint4*)(hr + c);
            const bf16* ab = (const bf16*)&a;
            const bf16* bb = (const bf16*)&b;
            uint4 o;
            bf16* ob = (bf16*)&o;
            for (int i = 0; i < 8; i++) {
                ob[i] = to_bf(to_f(ab[i]) + to_f(bb[i]));
                v[i] = to_f(ob[i]);
                ss += v[i] * v[i];
            }
            *(uint4*)(xr + c) = o;
        }
        float r = rsqrtf(block_sum(ss) / H + eps);
        if (c < H) {
            uint4 wv = *(const uint4*)(w + c);
            const bf16* wb = (const bf16*)&wv;
            uint4 o;
            bf16* ob = (bf16*)&o;
            for (int i = 0; i < 8; i++) ob[i] = to_bf(round_bf(v[i] * r) * to_f(wb[i]));
            *(uint4*)(out + row * H + c) = o;
        }
        return;
    }
    for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = to_bf(to_f(xr[i]) + to_f(hr[i]));
    __syncthreads();
    rmsnorm_row(xr, w, out + row * H, H, eps);
}

// add_rmsnorm whose h is the MoE block's weighted sum (moe.cu's moe_sum),
// computed here instead of read: h[t] = bf16(sum_k bf16(w[t, k] *
// rows[pos(t K + k)])), pos = inv[.] (or the identity when inv is null);
// x[t] = bf16(x[t] + h[t]), out[t] = rmsnorm(x[t]). The same sums in the
// same order as moe_sum then add_rmsnorm: bit for bit their result when H
// <= 8 * blockDim.x (add_rmsnorm's one-pass form; a larger H sums the
// squares in another order). One launch, no [T, H] h in memory.
// grid: rows, block: 256. H % 8 == 0.
#define MS_LOADS 8
extern "C" __global__ void moe_sum_add_rmsnorm(bf16* x, const bf16* __restrict__ rows, const float* __restrict__ w,
                                               const int* __restrict__ inv, const bf16* __restrict__ nw, bf16* out,
                                               int K, int H, float eps) {
    const size_t t = blockIdx.x;
    bf16* xr = x + t * H;
    float ss = 0.f;
    for (int c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
        const uint4 a = *(const uint4*)(xr + c);
        // MS_LOADS pairs' rows in flight before any math (a decode step's
        // whole top-8: one round trip, not one a pair), summed in order.
        for (int k0 = 0; k0 < K; k0 += MS_LOADS) {
            uint4 v[MS_LOADS];
            float wp[MS_LOADS];
#pragma unroll
            for (int u = 0; u < MS_LOADS; u++) {
                const size_t p = t * K + k0 + u;
                const bool in = k0 + u < K;
                const int r = !in ? 0 : inv ? inv[p] : (int)p;
                wp[u] = in ? w[p] : 0.f;
                v[u] = in ? *(const uint4*)(rows + (size_t)r * H + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < MS_LOADS; u++) {
                if (k0 + u < K) {
                    const bf16* vb = (const bf16*)&v[u];
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[i] += round_bf(to_f(vb[i]) * wp[u]);
                }
            }
        }
        const bf16* ab = (const bf16*)&a;
        uint4 o;
        bf16* ob = (bf16*)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ob[i] = to_bf(to_f(ab[i]) + round_bf(acc[i]));
            const float v = to_f(ob[i]);
            ss += v * v;
        }
        *(uint4*)(xr + c) = o;
    }
    const float r = rsqrtf(block_sum(ss) / H + eps);
    // Each thread reads back only the chunks it wrote.
    for (int c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
        const uint4 a = *(const uint4*)(xr + c), wv = *(const uint4*)(nw + c);
        const bf16* ab = (const bf16*)&a;
        const bf16* wb = (const bf16*)&wv;
        uint4 o;
        bf16* ob = (bf16*)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i] = to_bf(round_bf(to_f(ab[i]) * r) * to_f(wb[i]));
        *(uint4*)(out + t * H + c) = o;
    }
}

// qkv: [T, (nh + 2 nkv) * hd] (q heads, k heads, v heads). One block per
// token, one warp per head in turn: q and k heads get RMSNorm over head_dim
// and rotate-half RoPE at the token's position; q goes to q_out
// [T, nh * hd], k and v to the layer's paged cache
// [block][k|v][slot][kv_head][hd] at the token's slot (block * block_size +
// offset; negative = skip). RoPE's frequencies come from the host
// (inv_freq [hd / 2], f32: default, linear or YaRN, as transformers
// computes them), cos and sin times attn_scale (YaRN's attention factor, 1
// otherwise). The token's cos/sin are computed once per block and shared by
// its heads (sincosf at large positions is a real cost).
// grid: (T, head groups), block: 256 (8 warps). A few tokens (decode) spread
// their heads over several blocks; many take one block each. hd <= 256, even.
//
// The cache holds bf16, or (the `_fp8` kernels) e4m3 of the bf16 value
// divided by the layer's k_scale / v_scale: what the host pool stores for
// the same K and V (kv-pool's quantize_e4m3).

// cos/sin of token t's position into shared memory (then a barrier).
__device__ __forceinline__ void rope_table(const int* pos, int t, const float* inv_freq, float attn_scale, int half,
                                           float* cos_t, float* sin_t) {
    float p = (float)pos[t];
    for (int f = threadIdx.x; f < half; f += blockDim.x) {
        float s, c;
        sincosf(p * inv_freq[f], &s, &c);
        cos_t[f] = c * attn_scale;
        sin_t[f] = s * attn_scale;
    }
    __syncthreads();
}

// The cache row of head j (a K or V head: j >= nh) of the token at `slot`.
template <typename C>
__device__ __forceinline__ C* kv_row(C* cache, int slot, int j, int nh, int nkv, int hd, int block_size) {
    size_t kv_tok = (size_t)block_size * nkv * hd;  // one of K or V of a block
    int b = slot / block_size, off = slot % block_size;
    int kvh = j >= nh + nkv ? j - nh - nkv : j - nh;
    return cache + (size_t)b * 2 * kv_tok + (j >= nh + nkv ? kv_tok : 0) + ((size_t)off * nkv + kvh) * hd;
}

// One cache element from its computed value.
__device__ __forceinline__ void put_kv(bf16* p, float y, float) { *p = to_bf(y); }
__device__ __forceinline__ void put_kv(fp8* p, float y, float scale) { *p = to_e4m3(round_bf(y) / scale); }

// Any even hd <= 256: each lane takes elements lane, lane + 32, ...
template <typename C>
__device__ __forceinline__ void qk_norm_rope_store_any(
    const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots,
    bf16* q_out, C* cache, int nh, int nkv, int hd, int block_size, float eps, const float* inv_freq, float attn_scale,
    float k_scale, float v_scale) {
    __shared__ float buf[8][256];
    __shared__ float cos_t[128], sin_t[128];
    const int nwarps = blockDim.x >> 5;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x;
    int heads = nh + 2 * nkv;
    int half = hd / 2;
    rope_table(pos, t, inv_freq, attn_scale, half, cos_t, sin_t);
    int slot = slots[t];
    for (int j = blockIdx.y * nwarps + warp; j < heads; j += nwarps * gridDim.y) {
        const bf16* src = qkv + ((size_t)t * heads + j) * hd;
        C* kdst = 0;
        if (j >= nh) {
            if (slot < 0) continue;
            kdst = kv_row(cache, slot, j, nh, nkv, hd, block_size);
        }
        if (j >= nh + nkv) {
            for (int i = lane; i < hd; i += 32) put_kv(kdst + i, to_f(src[i]), v_scale);
            continue;
        }
        const bf16* w = j < nh ? q_w : k_w;
        float ss = 0.f;
        for (int i = lane; i < hd; i += 32) {
            float v = to_f(src[i]);
            ss += v * v;
        }
        float r = rsqrtf(warp_sum(ss) / hd + eps);
        for (int i = lane; i < hd; i += 32) buf[warp][i] = round_bf(round_bf(to_f(src[i]) * r) * to_f(w[i]));
        __syncwarp();
        for (int i = lane; i < hd; i += 32) {
            int f = i < half ? i : i - half;
            float x = buf[warp][i];
            float y = i < half ? x * cos_t[f] - buf[warp][i + half] * sin_t[f] : x * cos_t[f] + buf[warp][i - half] * sin_t[f];
            if (j < nh)
                q_out[((size_t)t * nh + j) * hd + i] = to_bf(y);
            else
                put_kv(kdst + i, y, k_scale);
        }
        __syncwarp();  // buf[warp] is rewritten by this warp's next head
    }
}

extern "C" __global__ void qk_norm_rope_store(
    const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots,
    bf16* q_out, bf16* cache, int nh, int nkv, int hd, int block_size, float eps, const float* inv_freq, float attn_scale) {
    qk_norm_rope_store_any(qkv, q_w, k_w, pos, slots, q_out, cache, nh, nkv, hd, block_size, eps, inv_freq, attn_scale,
                           1.f, 1.f);
}

extern "C" __global__ void qk_norm_rope_store_fp8(
    const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots, bf16* q_out, fp8* cache,
    int nh, int nkv, int hd, int block_size, float eps, const float* inv_freq, float attn_scale, float k_scale,
    float v_scale) {
    qk_norm_rope_store_any(qkv, q_w, k_w, pos, slots, q_out, cache, nh, nkv, hd, block_size, eps, inv_freq, attn_scale,
                           k_scale, v_scale);
}

// A word of 2 to 16 bytes: V consecutive bf16 (2 V bytes) or e4m3 (V
// bytes) in one access.
template <int Bytes> struct Word;
template <> struct Word<2> { typedef unsigned short T; };
template <> struct Word<4> { typedef unsigned T; };
template <> struct Word<8> { typedef uint2 T; };
template <> struct Word<16> { typedef uint4 T; };

// V cache elements of one lane from their computed values, in one store.
template <int V>
__device__ __forceinline__ void put_kv_row(bf16* dst, const float* y, float) {
    typename Word<2 * V>::T out;
    bf16* ob = (bf16*)&out;
#pragma unroll
    for (int i = 0; i < V; i++) ob[i] = to_bf(y[i]);
    *(typename Word<2 * V>::T*)dst = out;
}
template <int V>
__device__ __forceinline__ void put_kv_row(fp8* dst, const float* y, float scale) {
    typename Word<V>::T out;
    fp8* ob = (fp8*)&out;
#pragma unroll
    for (int i = 0; i < V; i++) ob[i] = to_e4m3(round_bf(y[i]) / scale);
    *(typename Word<V>::T*)dst = out;
}

// A lane's V query elements: bf16, or (an FP8 attention step's e4m3 Q)
// e4m3(bf16(y) x inv) in one store, as bf16_to_e4m3 quantizes the bf16 Q.
template <int V>
__device__ __forceinline__ void put_q_row(bf16* dst, const float* y, float) { put_kv_row<V>(dst, y, 1.f); }
template <int V>
__device__ __forceinline__ void put_q_row(fp8* dst, const float* y, float inv) {
    typename Word<V>::T out;
    fp8* ob = (fp8*)&out;
#pragma unroll
    for (int i = 0; i < V; i++) ob[i] = to_e4m3(round_bf(y[i]) * inv);
    *(typename Word<V>::T*)dst = out;
}

// hd = 32 V: lane l holds elements [l V, l V + V) of a head in registers,
// its rotate-half partners in lane l ^ 16; vector loads and stores, no
// shared staging. Same arithmetic per element as the kernel above (the
// RMS sum adds in another order).
template <int V, typename C, typename Q = bf16>
__device__ __forceinline__ void qk_norm_rope_store_vec(
    const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots,
    Q* q_out, C* cache, int nh, int nkv, int block_size, float eps, const float* inv_freq, float attn_scale,
    float k_scale, float v_scale, float q_inv = 1.f) {
    typedef typename Word<2 * V>::T VT;
    constexpr int hd = 32 * V, half = hd / 2;
    __shared__ float cos_t[half], sin_t[half];
    const int nwarps = blockDim.x >> 5;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x;
    int heads = nh + 2 * nkv;
    rope_table(pos, t, inv_freq, attn_scale, half, cos_t, sin_t);
    int slot = slots[t];
    const int e0 = lane * V;            // this lane's first element
    const int f0 = (lane & 15) * V;     // its first frequency
    const bool first_half = lane < 16;
    for (int j = blockIdx.y * nwarps + warp; j < heads; j += nwarps * gridDim.y) {
        if (j >= nh && slot < 0) continue;
        const bf16* src = qkv + ((size_t)t * heads + j) * hd;
        VT raw = *(const VT*)(src + e0);
        const bf16* xb = (const bf16*)&raw;
        float x[V];
        if (j >= nh + nkv) {
#pragma unroll
            for (int i = 0; i < V; i++) x[i] = to_f(xb[i]);
            put_kv_row<V>(kv_row(cache, slot, j, nh, nkv, hd, block_size) + e0, x, v_scale);
            continue;
        }
        VT wraw = *(const VT*)((j < nh ? q_w : k_w) + e0);
        const bf16* wb = (const bf16*)&wraw;
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < V; i++) {
            x[i] = to_f(xb[i]);
            ss += x[i] * x[i];
        }
        float r = rsqrtf(warp_sum(ss) / hd + eps);
#pragma unroll
        for (int i = 0; i < V; i++) x[i] = round_bf(round_bf(x[i] * r) * to_f(wb[i]));
        float y[V];
#pragma unroll
        for (int i = 0; i < V; i++) {
            float partner = __shfl_xor_sync(0xffffffffu, x[i], 16);
            float c = cos_t[f0 + i], s = sin_t[f0 + i];
            y[i] = first_half ? x[i] * c - partner * s : x[i] * c + partner * s;
        }
        if (j < nh)
            put_q_row<V>(q_out + ((size_t)t * nh + j) * hd + e0, y, q_inv);
        else
            put_kv_row<V>(kv_row(cache, slot, j, nh, nkv, hd, block_size) + e0, y, k_scale);
    }
}

#define QK_VEC(V)                                                                                                        \
    extern "C" __global__ void qk_norm_rope_store_v##V(                                                                  \
        const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots, bf16* q_out, bf16* cache,   \
        int nh, int nkv, int block_size, float eps, const float* inv_freq, float attn_scale) {                           \
        qk_norm_rope_store_vec<V>(qkv, q_w, k_w, pos, slots, q_out, cache, nh, nkv, block_size, eps, inv_freq,           \
                                  attn_scale, 1.f, 1.f);                                                                 \
    }                                                                                                                    \
    extern "C" __global__ void qk_norm_rope_store_fp8_v##V(                                                              \
        const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots, bf16* q_out, fp8* cache,    \
        int nh, int nkv, int block_size, float eps, const float* inv_freq, float attn_scale, float k_scale,              \
        float v_scale) {                                                                                                 \
        qk_norm_rope_store_vec<V>(qkv, q_w, k_w, pos, slots, q_out, cache, nh, nkv, block_size, eps, inv_freq,           \
                                  attn_scale, k_scale, v_scale);                                                         \
    }                                                                                                                    \
    /* Q in e4m3 over 1 / q_inv: a step whose attention is all cuDNN's FP8 route. */                                    \
    extern "C" __global__ void qk_norm_rope_store_fp8_e4m3q_v##V(                                                        \
        const bf16* qkv, const bf16* q_w, const bf16* k_w, const int* pos, const int* slots, fp8* q_out, fp8* cache,     \
        int nh, int nkv, int block_size, float eps, const float* inv_freq, float attn_scale, float k_scale,              \
        float v_scale, float q_inv) {                                                                                    \
        qk_norm_rope_store_vec<V>(qkv, q_w, k_w, pos, slots, q_out, cache, nh, nkv, block_size, eps, inv_freq,           \
                                  attn_scale, k_scale, v_scale, q_inv);                                                  \
    }
QK_VEC(2)
QK_VEC(4)
QK_VEC(8)

// gu: [R, 2I] (gate | up) -> out [R, I] = bf16(silu(gate)) * up. Any I.
extern "C" __global__ void silu_mul_scalar(const bf16* gu, bf16* out, int R, int I) {
    size_t n = (size_t)R * I;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t r = idx / I, c = idx % I;
        out[idx] = to_bf(silu_times(to_f(gu[r * 2 * I + c]), to_f(gu[r * 2 * I + I + c])));
    }
}

// The same for I % 8 == 0 and R * I < 2^35: eight outputs a thread, 16-byte
// accesses, 32-bit index arithmetic.
extern "C" __global__ void silu_mul(const bf16* __restrict__ gu, bf16* __restrict__ out, int R, int I) {
    const unsigned vecs = I / 8, n = (unsigned)R * vecs;
    for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < n; v += gridDim.x * blockDim.x) {
        unsigned r = v / vecs, c = (v - r * vecs) * 8;
        const bf16* row = gu + (size_t)r * 2 * I;
        uint4 g = *(const uint4*)(row + c), u = *(const uint4*)(row + I + c);
        const bf16* gb = (const bf16*)&g;
        const bf16* ub = (const bf16*)&u;
        uint4 o;
        bf16* ob = (bf16*)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i] = to_bf(silu_times(to_f(gb[i]), to_f(ub[i])));
        *(uint4*)(out + (size_t)r * I + c) = o;
    }
}

// silu_mul's bf16 outputs quantized as the FP8 GEMMs take their input
// (cutlass-sys fp8_gemm.cu's quant_rows over silu_mul's result, in one
// pass): e4m3 q [R, I] and f32 scales s [R, I / 128], scale = amax / 448
// per 128-wide group, x / scale rounded to nearest even and saturated.
// For I % 128 == 0: eight outputs a thread (one 8-byte store), a group per
// half-warp, no grid stride, so every lane of a launched warp reaches the
// shuffle (a thread past the end carries zeros and stores nothing).
extern "C" __global__ void silu_mul_quant(const bf16* __restrict__ gu, uint2* __restrict__ q, float* __restrict__ s, int R,
                                          int I) {
    const size_t vecs = (size_t)(I / 8), n = (size_t)R * vecs;
    const size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = v < n;
    float y[8];
    float amax = 0.f;
    if (live) {
        const size_t r = v / vecs, c = (v - r * vecs) * 8;
        const bf16* row = gu + r * 2 * I;
        uint4 g = *(const uint4*)(row + c), u = *(const uint4*)(row + I + c);
        const bf16* gb = (const bf16*)&g;
        const bf16* ub = (const bf16*)&u;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = to_f(to_bf(silu_times(to_f(gb[i]), to_f(ub[i]))));
            amax = fmaxf(amax, fabsf(y[i]));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = 0.f;
    }
#pragma unroll
    for (int o = 8; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (!live) return;
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
    __nv_fp8x2_storage_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        out[i] = __nv_cvt_float2_to_fp8x2(make_float2(y[2 * i] / scale, y[2 * i + 1] / scale), __NV_SATFINITE, __NV_E4M3);
    q[v] = *(const uint2*)out;
    if ((v & 15) == 0) s[v / 16] = scale;
}

// out[i, :] = x[idx[i] / row_div, :] for i < R: the embedding lookup, the
// rows that need logits, and the MoE pairs' input rows in expert order
// (row_div = top-k). Indices are checked on the host. One block per row;
// 16-byte copies when K % 8 == 0.
extern "C" __global__ void gather_rows(const bf16* __restrict__ x, const unsigned* __restrict__ idx, int row_div,
                                       bf16* __restrict__ out, int R, int K) {
    const int i = blockIdx.x;
    if (i >= R) return;
    const size_t src_row = (size_t)(idx[i] / (unsigned)row_div);
    if (K % 8 == 0) {
        const uint4* src = (const uint4*)(x + src_row * K);
        uint4* dst = (uint4*)(out + (size_t)i * K);
        for (int c = threadIdx.x; c < K / 8; c += blockDim.x) dst[c] = src[c];
    } else {
        for (int c = threadIdx.x; c < K; c += blockDim.x) out[(size_t)i * K + c] = x[src_row * K + c];
    }
}

// Copies the K and V rows of n tokens out of one layer of the paged pool
// (block b = [K | V], each [block_size][row]; token t at slot
// slots[t] = block * block_size + offset) into contiguous bf16 [n][row]
// buffers. row = KV heads x head_dim, a multiple of 8 (bf16) or 16 (an
// e4m3 cache, read back as e4m3 x k_scale / v_scale). grid-stride over
// 16-byte vectors of the cache.
__device__ __forceinline__ void widen_row(const bf16* src, bf16* dst, float) { *(uint4*)dst = *(const uint4*)src; }
__device__ __forceinline__ void widen_row(const fp8* src, bf16* dst, float scale) {
    uint4 lo, hi;
    e4m3x16_widen<false>(*(const uint4*)src, lo, hi);
    if (scale != 1.f) {
        bf16* e = (bf16*)&lo;
        bf16* f = (bf16*)&hi;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            e[i] = to_bf(to_f(e[i]) * scale);
            f[i] = to_bf(to_f(f[i]) * scale);
        }
    }
    *(uint4*)dst = lo;
    *(uint4*)(dst + 8) = hi;
}

template <typename C>
__device__ __forceinline__ void kv_gather_any(const C* __restrict__ layer, const unsigned* __restrict__ slots, int n,
                                              bf16* __restrict__ k_out, bf16* __restrict__ v_out, int row, int block_size,
                                              float k_scale, float v_scale) {
    constexpr int W = 16 / sizeof(C);  // elements of one 16-byte vector
    const int vecs = row / W;
    const size_t total = (size_t)n * vecs;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / vecs, c = e % vecs;
        const unsigned s = slots[t];
        const C* src = layer + ((size_t)(s / block_size) * 2 * block_size + s % block_size) * row + c * W;
        widen_row(src, k_out + t * row + c * W, k_scale);
        widen_row(src + (size_t)block_size * row, v_out + t * row + c * W, v_scale);
    }
}

extern "C" __global__ void kv_gather(const bf16* __restrict__ layer, const unsigned* __restrict__ slots, int n,
                                     bf16* __restrict__ k_out, bf16* __restrict__ v_out, int row, int block_size) {
    kv_gather_any(layer, slots, n, k_out, v_out, row, block_size, 1.f, 1.f);
}

extern "C" __global__ void kv_gather_fp8(const fp8* __restrict__ layer, const unsigned* __restrict__ slots, int n,
                                         bf16* __restrict__ k_out, bf16* __restrict__ v_out, int row, int block_size,
                                         float k_scale, float v_scale) {
    kv_gather_any(layer, slots, n, k_out, v_out, row, block_size, k_scale, v_scale);
}

// FP8 prefill attention (cuDNN's e4m3 SDPA, cudnn_attention.rs): its
// per-tensor-scaled operands in and out.
//
// y = e4m3(x * inv_scale) (RNE, saturated) for n8 vectors of 8 elements:
// one 16-byte load of bf16, one 8-byte store of e4m3. Grid-stride.
extern "C" __global__ void bf16_to_e4m3(const uint4* __restrict__ x, uint2* __restrict__ y, size_t n8, float inv_scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        const bf16* e = (const bf16*)&v;
        unsigned w[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) w[j / 4] |= (unsigned)to_e4m3(to_f(e[j]) * inv_scale) << (8 * (j % 4));
        y[i] = make_uint2(w[0], w[1]);
    }
}

// *m = max(*m, the largest magnitude byte (b & 0x7f) of n16 16-byte
// vectors of e4m3): e4m3's magnitude bits order as its values, and RNE
// with saturation never writes 0x7f (NaN). Grid-stride; one atomic a warp.
extern "C" __global__ void e4m3_amax(const uint4* __restrict__ x, size_t n16, unsigned* __restrict__ m) {
    unsigned best = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        best = __vmaxu4(best, __vmaxu4(__vmaxu4(v.x & 0x7f7f7f7fu, v.y & 0x7f7f7f7fu), __vmaxu4(v.z & 0x7f7f7f7fu, v.w & 0x7f7f7f7fu)));
    }
    best = max(max(best & 0xffu, (best >> 8) & 0xffu), max((best >> 16) & 0xffu, best >> 24));
    best = __reduce_max_sync(0xffffffffu, best);
    if ((threadIdx.x & 31) == 0 && best) atomicMax(m, best);
}

// O's e4m3 scale from V's largest e4m3 byte (s[8], from e4m3_amax): |O| <=
// max |V| = e4m3(s[8]) x v_scale (O averages V's rows), so s[5] (cuDNN's
// scale O) = 384 / max |V| keeps every O finite in e4m3 with 1/8 headroom
// for the rounded softmax probabilities' sum, and s[9] = 1 / s[5] widens it
// back. One thread.
extern "C" __global__ void fp8_o_scale(float* s, float v_scale) {
    const unsigned b = *(const unsigned*)(s + 8);
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    const float vmax = __half2float(*reinterpret_cast<const __half*>(&h)) * v_scale;
    const float so = vmax > 0.f ? 384.f / vmax : 1.f;
    s[5] = so;
    s[9] = 1.f / so;
}

// dst[i] = *src for i < n: a per-tensor scale the device computed spread
// over a per-group scale array (cuDNN's e4m3 O handed to o_proj's FP8
// GEMM, which takes a scale per token and 128-wide group). Grid-stride.
extern "C" __global__ void fill_from(const float* __restrict__ src, float* __restrict__ dst, size_t n) {
    const float v = *src;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = v;
}

// out[r] = bf16(x[r] * *scale) for the rows r = rows[i], i < nrows, of
// `row` e4m3 elements (row % 16 == 0): the rows cuDNN's FP8 attention wrote,
// leaving the other rows of out (kvc's kernels') alone. Grid-stride over
// 16-element vectors.
extern "C" __global__ void e4m3_rows_to_bf16(const fp8* __restrict__ x, const unsigned* __restrict__ rows, int nrows,
                                             int row, const float* __restrict__ scale, bf16* __restrict__ out) {
    const int vecs = row / 16;
    const size_t total = (size_t)nrows * vecs;
    const float sc = *scale;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t off = (size_t)rows[e / vecs] * row + (e % vecs) * 16;
        widen_row(x + off, out + off, sc);
    }
}
