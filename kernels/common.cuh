// Shared helpers for kvc's CUDA kernels (bf16 storage, f32 arithmetic).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;
// One e4m3 byte of the FP8 KV cache (`--kv-cache-dtype fp8`).
typedef unsigned char fp8;

__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf(float x) { return __float2bfloat16(x); }
// Rounds through bf16, where the reference (transformers in bf16) rounds.
__device__ __forceinline__ float round_bf(float x) { return to_f(to_bf(x)); }
// SwiGLU's product before its bf16 rounding: bf16(silu(g)) * u, as
// transformers' bf16 act_fn(gate) * up (layers.cu's silu_mul, gemv.cu's
// fused gate|up epilogue).
__device__ __forceinline__ float silu_times(float g, float u) { return round_bf(g / (1.f + __expf(-g))) * u; }

// x in e4m3: rounded to nearest even, saturated at +-448 (vLLM's
// convention, as kv-pool's quantize_e4m3 on the host).
__device__ __forceinline__ fp8 to_e4m3(float x) { return (fp8)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }

// Two e4m3 (the low byte first) as an f16 pair: exact, every e4m3 value is
// an f16 (one cvt on sm_89+).
__device__ __forceinline__ unsigned e4m3x2_to_h2(unsigned short v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

// The same pair as bf16, also exact (bf16 holds every e4m3 value).
__device__ __forceinline__ unsigned e4m3x2_to_bf2(unsigned short v) {
    unsigned h = e4m3x2_to_h2(v);
    float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<unsigned*>(&b);
}

// 16 e4m3 (one 16-byte load) as 16 f16 (H) or bf16 (!H) in two 16-byte words.
template <bool H>
__device__ __forceinline__ void e4m3x16_widen(uint4 in, uint4& lo, uint4& hi) {
    const unsigned w[4] = {in.x, in.y, in.z, in.w};
    unsigned o[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = H ? e4m3x2_to_h2(w[i] & 0xffffu) : e4m3x2_to_bf2(w[i] & 0xffffu);
        o[2 * i + 1] = H ? e4m3x2_to_h2(w[i] >> 16) : e4m3x2_to_bf2(w[i] >> 16);
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? partial[lane] : 0.f;
    return warp_sum(v);
}

// Asynchronous 16-byte global -> shared copies (sm_80+), for double buffering.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
