// FP8 GEMMs with block scales on CUTLASS 3's sm90 blockwise-scaled
// collectives (TMA + wgmma, warp-specialized cooperative persistent
// kernels, the scales promoted into the f32 accumulators once per 128-wide
// K block), plus the activation quantization and a self-test. See
// fp8_gemm.h for the operand layouts.
//
// Scale layout: both operands' scales are K-major (Sm90BlockwiseScaleConfig
// <1, 128, 128, K, K>): sa[m * Kb + kb] per token, sw[nb * Kb + kb] per
// 128x128 weight block, which is the checkpoint's own weight_scale_inv
// layout, so weights need no conversion at load. The sm90 collective
// loads K-major scales with cp.async (M-major SFA would go through TMA but
// needs 16-byte aligned per-group bases, which the grouped call cannot
// promise for arbitrary expert offsets); with one scale row per token the
// scale traffic is 1/128 of A's.
//
// Tiles: 128x128x128 (K must be a whole 128-block per k-tile for the
// per-block promotion; N 128 = the weight scale granularity), 1x1 cluster;
// the grouped GEMM's swapped tiling (GroupedSwap below) 128x64x128 with
// the weights on M; the dense decode tiling (DenseSwap64 below) 64x64x128
// with the weights on M and their scales repeated to 64-row granularity.
#include "fp8_gemm.h"
#include "moe_gemm.h"
#include "cutlass_call.h"
#include "expert_groups.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace kvc_fp8 {

using kvc_cutlass::fail;
using kvc_cutlass::hardware;
using kvc_cutlass::up;

using E4m3 = cutlass::float_e4m3_t;
using Bf16 = cutlass::bfloat16_t;
constexpr int kBlock = 128;  // scale granularity along K (and N for weights)
constexpr float kE4m3Max = 448.0f;

using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kBlock, kBlock, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Tile = Shape<_128, _128, _128>;
using Cluster = Shape<_1, _1, _1>;
using LayoutA = cutlass::layout::RowMajor;     // activations [M, K]
using LayoutB = cutlass::layout::ColumnMajor;  // weights [N, K] row-major = K x N column-major
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 16;  // 16 bytes of e4m3
constexpr int kAlignD = 8;    // 16 bytes of bf16

// A dense GEMM of one tile shape, scale layout and schedule.
template <class TileT, class ScaleConfigT, class LayoutAT, class LayoutBT, class LayoutDT, class EpilogueSchedule,
          class KernelSchedule>
struct DenseT {
    using Tile = TileT;
    using Scales = ScaleConfigT;
    using LayoutSFA = decltype(ScaleConfigT::deduce_layoutSFA());
    using LayoutSFB = decltype(ScaleConfigT::deduce_layoutSFB());
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutDT, kAlignD, Bf16, LayoutDT, kAlignD,
        EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4m3, cute::tuple<LayoutAT, LayoutSFA>, kAlignAB, E4m3,
        cute::tuple<LayoutBT, LayoutSFB>, kAlignAB, float, Tile, Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        KernelSchedule>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
};

// Rows (KVC_FP8_DENSE_ROWS): the tokens on M, 128x128x128 cooperative.
using Dense = DenseT<Tile, ScaleConfig, LayoutA, LayoutB, LayoutD, cutlass::epilogue::TmaWarpSpecializedCooperative,
                     cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum>;
// Swap64 (KVC_FP8_DENSE_SWAP64): d^T = w_q . a_q^T, 64 weight rows on M
// and up to 64 tokens on N a tile (64x64x128, ping-pong: each consumer
// warpgroup a whole tile). A decode step's 64 tokens against a 128-row
// tile give o_proj (n = 2048) 16 CTAs of 132; 64-row tiles give it 32,
// each streaming half the weight bytes. The weights' scales are then SFA
// at granularity 64 on M: the checkpoint's [n/128, k/128] with every row
// repeated (repeat_scale_rows below; the model's Fp8Weight keeps such a
// copy of each dense projection's), since CUTLASS wants the
// granularity to divide the tile.
using Swap64ScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<64, 1, kBlock, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using DenseSwap64 = DenseT<Shape<_64, _64, _128>, Swap64ScaleConfig, cutlass::layout::RowMajor,
                           cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor,
                           cutlass::epilogue::TmaWarpSpecialized,
                           cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8BlockScaledAccum>;

using ProblemShape = kvc_cutlass::GroupShape;
using Problem = kvc_cutlass::GroupProblem;

// The grouped GEMM in one of two tilings, as moe_gemm.cu's bf16 one:
// ROWS puts each expert's routed rows on the tile's M (128x128x128,
// prefill); SWAP computes d^T = w_q . a_q^T, the expert's weight rows on M
// and its few routed rows on N (128x64x128), writing d transposed (a
// column-major d^T is the row-major d): a decode step streams each touched
// expert's weights once at full tile width instead of padding its 2-8 rows
// to 128. The swap's scales trade places: the weights' 128x128 blocks are
// SFA (granularity 128 on M), the tokens' groups SFB (granularity 1 on N),
// both still K-major, so the same arrays serve both tilings.
template <class TileT, class ScaleConfigT, class LayoutAT, class LayoutBT, class LayoutDT>
struct GroupedT {
    using Tile = TileT;
    using Scales = ScaleConfigT;
    using LayoutSFA = decltype(ScaleConfigT::deduce_layoutSFA());
    using LayoutSFB = decltype(ScaleConfigT::deduce_layoutSFB());
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutDT*, kAlignD, Bf16, LayoutDT*,
        kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
        cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4m3, cute::tuple<LayoutAT*, LayoutSFA*>, kAlignAB, E4m3,
        cute::tuple<LayoutBT*, LayoutSFB*>, kAlignAB, float, Tile, Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideD = typename Kernel::InternalStrideD;
};

using SwapScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<kBlock, 1, kBlock, cute::GMMA::Major::K, cute::GMMA::Major::K>;
// Rows: a = the expert's rows [m, k], b = its weights [n, k], d = [m, n].
using GroupedRows = GroupedT<Tile, ScaleConfig, LayoutA, LayoutB, LayoutD>;
// Swap: a = the weights [n, k] (row-major M x K), b = the rows [m, k]
// (column-major K x N), d^T = [n, m] column-major.
using GroupedSwap = GroupedT<Shape<_128, _64, _128>, SwapScaleConfig, cutlass::layout::RowMajor,
                             cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor>;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------
// Activation quantization: one warp per (row, 128-group); lane i holds
// elements i, i + 32, i + 64, i + 96 of the group (coalesced loads).

__global__ void quant_rows_kernel(const __nv_bfloat16* __restrict__ x, __nv_fp8_storage_t* __restrict__ q,
                                  float* __restrict__ s, int m, int k) {
    int groups = (k + kBlock - 1) / kBlock;
    int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= static_cast<int64_t>(m) * groups) return;
    int row = static_cast<int>(warp / groups), g = static_cast<int>(warp % groups);
    const __nv_bfloat16* xr = x + static_cast<int64_t>(row) * k;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int c = g * kBlock + lane + 32 * i;
        v[i] = c < k ? __bfloat162float(xr[c]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    __nv_fp8_storage_t* qr = q + static_cast<int64_t>(row) * k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int c = g * kBlock + lane + 32 * i;
        if (c < k) qr[c] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) s[static_cast<int64_t>(row) * groups + g] = scale;
}

// The same quantization with 16-byte loads and 8-byte stores, for k a
// multiple of 128 and aligned rows: each thread takes 8 consecutive
// elements, so a 128-group is one half-warp (its amax a 16-lane shuffle).
// Every lane of a launched warp takes part in the shuffles (a thread past
// the end carries zeros and stores nothing). Same scale and rounding as
// quant_rows_kernel (x / scale, saturated RNE).
__global__ void quant_rows_vec_kernel(const uint4* __restrict__ x, uint2* __restrict__ q, float* __restrict__ s,
                                      int64_t vectors) {
    int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    bool live = t < vectors;
    uint4 raw = live ? x[t] : make_uint4(0, 0, 0, 0);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float2 v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = __bfloat1622float2(h[i]);
        amax = fmaxf(amax, fmaxf(fabsf(v[i].x), fabsf(v[i].y)));
    }
#pragma unroll
    for (int o = 8; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (!live) return;
    float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    __nv_fp8x2_storage_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        out[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[i].x / scale, v[i].y / scale), __NV_SATFINITE, __NV_E4M3);
    q[t] = *reinterpret_cast<const uint2*>(out);
    // Thread t holds elements 8t..8t+7 of the flat [m, k]; its group is
    // 8t / 128 of the flat [m, k / 128] scales (k % 128 == 0).
    if ((t & 15) == 0) s[t / 16] = scale;
}

int quant_rows(const void* x, void* q, void* s, int m, int k, cudaStream_t stream) {
    int per = 256;
    bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
    if (k % kBlock == 0 && aligned) {
        int64_t vectors = static_cast<int64_t>(m) * (k / 8);
        quant_rows_vec_kernel<<<static_cast<unsigned>((vectors + per - 1) / per), per, 0, stream>>>(
            static_cast<const uint4*>(x), static_cast<uint2*>(q), static_cast<float*>(s), vectors);
        return 0;
    }
    int groups = ceil_div(k, kBlock);
    int64_t threads = static_cast<int64_t>(m) * groups * 32;
    quant_rows_kernel<<<static_cast<unsigned>((threads + per - 1) / per), per, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<__nv_fp8_storage_t*>(q), static_cast<float*>(s), m, k);
    return 0;
}

// ---------------------------------------------------------------------------
// Dense GEMM.

// The dense call's arguments in tiling G. Rows: problem (m, n, k), A = the
// tokens [m, k], B = the weights [n, k] (column-major k x n), D = [m, n]
// row-major. The swap (kSwap): problem (n, m, k), A = the weights [n, k]
// row-major with their 64-row scales, B = the tokens [m, k] (column-major
// k x m) with theirs, D^T = [n, m] column-major, i.e. d [m, n] row-major.
template <class G, bool kSwap>
typename G::Gemm::Arguments dense_arguments(const kvc_fp8_gemm_args& a) {
    int rows = kSwap ? a.n : a.m, cols = kSwap ? a.m : a.n, k = a.k;
    const E4m3* ta = reinterpret_cast<const E4m3*>(a.op.a);
    const E4m3* tw = reinterpret_cast<const E4m3*>(a.op.w);
    const float* sa = reinterpret_cast<const float*>(a.op.sa);
    const float* sw = reinterpret_cast<const float*>(a.op.sw);
    auto stride_a = cutlass::make_cute_packed_stride(typename G::StrideA{}, make_shape(rows, k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(typename G::StrideB{}, make_shape(cols, k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(typename G::StrideD{}, make_shape(rows, cols, 1));
    auto shape = make_shape(rows, cols, k, 1);
    typename G::Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {rows, cols, k, 1},
        {kSwap ? tw : ta, stride_a, kSwap ? ta : tw, stride_b, kSwap ? sw : sa, G::Scales::tile_atom_to_shape_SFA(shape),
         kSwap ? sa : sw, G::Scales::tile_atom_to_shape_SFB(shape)},
        {{}, nullptr, stride_d, reinterpret_cast<Bf16*>(a.op.d), stride_d},
        hardware()};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
}

int dense_shape_ok(int m, int n, int k, int variant, char* err, size_t errlen) {
    if (m <= 0 || n <= 0 || k <= 0) return fail(err, errlen, "kvc_fp8_gemm", "empty problem");
    if (n % 16) return fail(err, errlen, "kvc_fp8_gemm", "n must be a multiple of 16");
    if (k % kBlock) return fail(err, errlen, "kvc_fp8_gemm", "k must be a multiple of 128");
    if (variant != KVC_FP8_DENSE_ROWS && variant != KVC_FP8_DENSE_SWAP64)
        return fail(err, errlen, "kvc_fp8_gemm", "unknown variant");
    return 0;
}

uint64_t dense_workspace_bytes(const kvc_fp8_gemm_args& a) {
    if (a.variant == KVC_FP8_DENSE_SWAP64)
        return up(DenseSwap64::Gemm::get_workspace_size(dense_arguments<DenseSwap64, true>(a)));
    return up(Dense::Gemm::get_workspace_size(dense_arguments<Dense, false>(a)));
}

int dense_run(const kvc_fp8_gemm_args* a, cudaStream_t stream, char* err, size_t errlen) {
    if (dense_shape_ok(a->m, a->n, a->k, a->variant, err, errlen)) return 1;
    if ((a->op.a | a->op.w | a->op.d) % 16 || (a->op.sa | a->op.sw) % 4)
        return fail(err, errlen, "kvc_fp8_gemm_run", "a, w, d must be 16-byte aligned, the scales 4-byte");
    if (a->op.workspace_bytes < dense_workspace_bytes(*a))
        return fail(err, errlen, "kvc_fp8_gemm_run", "workspace too small");
    void* ws = reinterpret_cast<void*>(a->op.workspace);
    if (a->variant == KVC_FP8_DENSE_SWAP64)
        return kvc_cutlass::run_gemm<DenseSwap64::Gemm>(dense_arguments<DenseSwap64, true>(*a), ws, stream, err, errlen);
    return kvc_cutlass::run_gemm<Dense::Gemm>(dense_arguments<Dense, false>(*a), ws, stream, err, errlen);
}

// sw64[r, kb] = sw[r / 2, kb] for r < ceil(n / 64): the checkpoint's
// 128-row block scales as the swap's 64-row ones.
__global__ void repeat_scale_rows_kernel(const float* __restrict__ sw, float* __restrict__ sw64, int rows64, int kb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows64 * kb) return;
    sw64[i] = sw[(i / kb) / 2 * kb + i % kb];
}

void repeat_scale_rows(const float* sw, float* sw64, int n, int k, cudaStream_t stream) {
    int rows64 = ceil_div(n, 64), kb = ceil_div(k, kBlock);
    repeat_scale_rows_kernel<<<ceil_div(rows64 * kb, 256), 256, 0, stream>>>(sw, sw64, rows64, kb);
}

// ---------------------------------------------------------------------------
// Grouped GEMM: the per-expert arrays (expert_groups.h, with the scales)
// at the start of the workspace, then CUTLASS's own.

template <class G>
using Arrays = kvc_cutlass::GroupArrays<G, true>;

// One thread per expert: its problem, pointers, strides and scale layouts.
// kSwap: the weights are the GEMM's A (M = n) and the rows its B (N = m),
// and so are their scales.
template <class G, bool kSwap>
__global__ void fill_groups(int experts, int n, int k, const uint32_t* offsets, const E4m3* a, const float* sa,
                            const E4m3* w, const float* sw, Bf16* d, char* base, Arrays<G> l) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= experts) return;
    kvc_cutlass::ExpertGroup<kSwap> g(e, n, offsets);
    int kb = (k + kBlock - 1) / kBlock, nb = (n + kBlock - 1) / kBlock;
    const E4m3* rows = a + g.row0 * k;
    const float* row_scales = sa + g.row0 * kb;
    const E4m3* weight = w + static_cast<int64_t>(e) * n * k;
    const float* weight_scales = sw + static_cast<int64_t>(e) * nb * kb;
    l.write(base, e, g, k, g.a(rows, weight), g.b(rows, weight), d + g.row0 * n);
    Arrays<G>::template in<const float*>(base, l.psa)[e] = g.a(row_scales, weight_scales);
    Arrays<G>::template in<const float*>(base, l.psb)[e] = g.b(row_scales, weight_scales);
    auto shape = make_shape(g.gm, g.gn, k, 1);
    Arrays<G>::template in<typename G::LayoutSFA>(base, l.lsa)[e] = G::Scales::tile_atom_to_shape_SFA(shape);
    Arrays<G>::template in<typename G::LayoutSFB>(base, l.lsb)[e] = G::Scales::tile_atom_to_shape_SFB(shape);
}

template <class G>
typename G::Gemm::Arguments grouped_arguments(int experts, char* base) {
    Arrays<G> l(experts);
    using A = Arrays<G>;
    return kvc_cutlass::group_arguments(
        experts, base, l,
        {A::template in<const E4m3*>(base, l.pa), A::template in<typename G::StrideA>(base, l.sa),
         A::template in<const E4m3*>(base, l.pb), A::template in<typename G::StrideB>(base, l.sb),
         A::template in<const float*>(base, l.psa), A::template in<typename G::LayoutSFA>(base, l.lsa),
         A::template in<const float*>(base, l.psb), A::template in<typename G::LayoutSFB>(base, l.lsb)});
}

template <class G>
uint64_t grouped_workspace_bytes(int experts) {
    Arrays<G> l(experts);
    auto args = grouped_arguments<G>(experts, nullptr);
    return l.cutlass + up(G::Gemm::get_workspace_size(args));
}

// Bytes for `variant`, 0 for a variant that does not exist.
uint64_t grouped_workspace_bytes(int experts, int variant) {
    switch (variant) {
        case KVC_MOE_GEMM_ROWS: return grouped_workspace_bytes<GroupedRows>(experts);
        case KVC_MOE_GEMM_SWAP: return grouped_workspace_bytes<GroupedSwap>(experts);
        default: return 0;
    }
}

template <class G, bool kSwap>
int grouped_launch(const kvc_fp8_grouped_args* a, cudaStream_t stream, char* err, size_t errlen) {
    const kvc_expert_groups& g = a->groups;
    Arrays<G> l(g.experts);
    char* base = reinterpret_cast<char*>(a->op.workspace);
    int threads = 128;
    fill_groups<G, kSwap><<<(g.experts + threads - 1) / threads, threads, 0, stream>>>(
        g.experts, g.n, g.k, reinterpret_cast<const uint32_t*>(g.offsets), reinterpret_cast<const E4m3*>(a->op.a),
        reinterpret_cast<const float*>(a->op.sa), reinterpret_cast<const E4m3*>(a->op.w),
        reinterpret_cast<const float*>(a->op.sw), reinterpret_cast<Bf16*>(a->op.d), base, l);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, errlen, "fill_groups launch", cudaGetErrorString(e));
    return kvc_cutlass::run_gemm<typename G::Gemm>(grouped_arguments<G>(g.experts, base), base + l.cutlass, stream,
                                                   err, errlen);
}

int grouped_run(const kvc_fp8_grouped_args* a, cudaStream_t stream, char* err, size_t errlen) {
    const kvc_expert_groups& g = a->groups;
    if (g.experts <= 0 || g.n <= 0 || g.k <= 0) return fail(err, errlen, "kvc_fp8_grouped_run", "empty problem");
    if (g.n % 16) return fail(err, errlen, "kvc_fp8_grouped_run", "n must be a multiple of 16");
    if (g.k % kBlock) return fail(err, errlen, "kvc_fp8_grouped_run", "k must be a multiple of 128");
    if ((a->op.a | a->op.w | a->op.d | a->op.workspace) % 16 || (a->op.sa | a->op.sw) % 4)
        return fail(err, errlen, "kvc_fp8_grouped_run", "a, w, d, workspace must be 16-byte aligned, the scales 4-byte");
    uint64_t need = grouped_workspace_bytes(g.experts, g.variant);
    if (need == 0) return fail(err, errlen, "kvc_fp8_grouped_run", "unknown variant");
    if (a->op.workspace_bytes < need) return fail(err, errlen, "kvc_fp8_grouped_run", "workspace too small");
    if (g.variant == KVC_MOE_GEMM_SWAP) return grouped_launch<GroupedSwap, true>(a, stream, err, errlen);
    return grouped_launch<GroupedRows, false>(a, stream, err, errlen);
}

// ---------------------------------------------------------------------------
// Self-test helpers.

__host__ __device__ inline uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return static_cast<uint32_t>(x);
}

__device__ inline float uniform(uint64_t seed, uint64_t i) {
    return (mix(seed * 0x9e3779b97f4a7c15ULL + i) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// Activations: per-row magnitudes over 2^-3 .. 2^3 and per-group factors,
// so the per-token, per-group scales differ everywhere.
__global__ void fill_activations(__nv_bfloat16* x, int64_t m, int k, uint64_t seed) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= m * k) return;
    int64_t row = i / k;
    int col = static_cast<int>(i % k);
    float v = uniform(seed, i) * exp2f(static_cast<float>(row % 7) - 3.0f) * (1.0f + (col / kBlock) % 3);
    x[i] = __float2bfloat16(v);
}

// Weights: a per-128x128-block magnitude, as real checkpoints have.
__global__ void fill_weights(__nv_bfloat16* w, int64_t rows, int k, uint64_t seed) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    int64_t row = i / k;
    int col = static_cast<int>(i % k);
    float v = 0.05f * uniform(seed, i) * exp2f(static_cast<float>((row / kBlock + col / kBlock) % 5) - 2.0f);
    w[i] = __float2bfloat16(v);
}

// Checkpoint-style weight quantization: one CTA per 128x128 block of
// expert blockIdx.z's [n, k] weight; sw[e][nb][kb] = amax / 448.
__global__ void quant_weight_blocks(const __nv_bfloat16* __restrict__ w, __nv_fp8_storage_t* __restrict__ q,
                                    float* __restrict__ sw, int n, int k) {
    int nb = blockIdx.x, kb = blockIdx.y, e = blockIdx.z;
    int nbs = gridDim.x, kbs = gridDim.y;
    const __nv_bfloat16* we = w + static_cast<int64_t>(e) * n * k;
    __nv_fp8_storage_t* qe = q + static_cast<int64_t>(e) * n * k;
    __shared__ float red[32];
    float amax = 0.0f;
    for (int i = threadIdx.x; i < kBlock * kBlock; i += blockDim.x) {
        int r = nb * kBlock + i / kBlock, c = kb * kBlock + i % kBlock;
        if (r < n && c < k) amax = fmaxf(amax, fabsf(__bfloat162float(we[static_cast<int64_t>(r) * k + c])));
    }
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
        amax = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (threadIdx.x == 0) red[0] = amax;
    }
    __syncthreads();
    amax = red[0];
    float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    for (int i = threadIdx.x; i < kBlock * kBlock; i += blockDim.x) {
        int r = nb * kBlock + i / kBlock, c = kb * kBlock + i % kBlock;
        if (r < n && c < k) {
            int64_t j = static_cast<int64_t>(r) * k + c;
            qe[j] = __nv_cvt_float_to_fp8(__bfloat162float(we[j]) / scale, __NV_SATFINITE, __NV_E4M3);
        }
    }
    if (threadIdx.x == 0) sw[(static_cast<int64_t>(e) * nbs + nb) * kbs + kb] = scale;
}

__device__ inline float fp8_to_float(__nv_fp8_storage_t v) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
    return __half2float(__half(h));
}

__device__ inline void atomic_max_nonneg(float* p, float v) {
    atomicMax(reinterpret_cast<unsigned int*>(p), __float_as_uint(v));
}

// How far dequant(q) is from x, relative to the amax of x's group (one
// atomic per warp).
__global__ void quant_error(const __nv_bfloat16* x, const __nv_fp8_storage_t* q, const float* s, int64_t m, int k,
                            float* out) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    float r = 0.0f;
    if (i < m * k) {
        int64_t row = i / k;
        int g = static_cast<int>(i % k) / kBlock;
        int groups = (k + kBlock - 1) / kBlock;
        float scale = s[row * groups + g];
        float amax = scale * kE4m3Max;
        float d = fabsf(fp8_to_float(q[i]) * scale - __bfloat162float(x[i]));
        r = amax > 0.0f ? d / amax : d;
        if (!(r == r)) r = 3.0e38f;
    }
    for (int o = 16; o > 0; o /= 2) r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
    if (threadIdx.x % 32 == 0) atomic_max_nonneg(out, r);
}

// Reference: out[m, n] = sum_kb (sum_{k in kb} a_q * w_q) * sa[m, kb] *
// sw[n / 128, kb] in f32, one 32x32 output tile per CTA, K in 128-blocks
// through shared memory (the same quantized values the GEMM reads).
constexpr int kRefTile = 32;
__global__ void __launch_bounds__(256) reference_gemm(const __nv_fp8_storage_t* __restrict__ a,
                                                      const float* __restrict__ sa,
                                                      const __nv_fp8_storage_t* __restrict__ w,
                                                      const float* __restrict__ sw, float* __restrict__ out, int m,
                                                      int n, int k) {
    __shared__ float ta[kRefTile][kBlock + 1];
    __shared__ float tw[kRefTile][kBlock + 1];
    int m0 = blockIdx.y * kRefTile, n0 = blockIdx.x * kRefTile;
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // ty in 0..7
    int kbs = k / kBlock;
    float acc[4] = {0, 0, 0, 0};
    for (int kb = 0; kb < kbs; ++kb) {
        for (int i = threadIdx.x; i < kRefTile * kBlock; i += blockDim.x) {
            int r = i / kBlock, c = i % kBlock;
            int64_t col = static_cast<int64_t>(kb) * kBlock + c;
            ta[r][c] = m0 + r < m ? fp8_to_float(a[static_cast<int64_t>(m0 + r) * k + col]) : 0.0f;
            tw[r][c] = n0 + r < n ? fp8_to_float(w[static_cast<int64_t>(n0 + r) * k + col]) : 0.0f;
        }
        __syncthreads();
        float part[4] = {0, 0, 0, 0};
        for (int c = 0; c < kBlock; ++c) {
            float wv = tw[tx][c];
#pragma unroll
            for (int j = 0; j < 4; ++j) part[j] += ta[ty + 8 * j][c] * wv;
        }
        int col = n0 + tx;
        float swv = col < n ? sw[static_cast<int64_t>(col / kBlock) * kbs + kb] : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int row = m0 + ty + 8 * j;
            if (row < m) acc[j] += part[j] * sa[static_cast<int64_t>(row) * kbs + kb] * swv;
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        int row = m0 + ty + 8 * j, col = n0 + tx;
        if (row < m && col < n) out[static_cast<int64_t>(row) * n + col] = acc[j];
    }
}

// stats[0] = max |ref|, stats[1] = max |d - ref|.
__global__ void compare(const __nv_bfloat16* d, const float* ref, int64_t count, float* stats) {
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    float r = 0.0f, e = 0.0f;
    if (i < count) {
        r = fabsf(ref[i]);
        e = fabsf(__bfloat162float(d[i]) - ref[i]);
        if (!(e == e)) e = 3.0e38f;  // NaN: as bad as it gets
    }
    for (int o = 16; o > 0; o /= 2) {
        r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
        e = fmaxf(e, __shfl_xor_sync(0xffffffffu, e, o));
    }
    if (threadIdx.x % 32 == 0) {
        atomic_max_nonneg(stats, r);
        atomic_max_nonneg(stats + 1, e);
    }
}

unsigned blocks(int64_t count, int per) { return static_cast<unsigned>((count + per - 1) / per); }

// Device allocations freed on every return path.
struct Arena {
    std::vector<void*> ptrs;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Arena() {
        if (stream) cudaStreamSynchronize(stream);
        for (void* p : ptrs) cudaFree(p);
        if (start) cudaEventDestroy(start);
        if (stop) cudaEventDestroy(stop);
        if (stream) cudaStreamDestroy(stream);
    }
    template <class T>
    cudaError_t alloc(T** p, size_t bytes) {
        void* v = nullptr;
        cudaError_t e = cudaMalloc(&v, bytes < 256 ? 256 : bytes);
        if (e == cudaSuccess) ptrs.push_back(v);
        *p = static_cast<T*>(v);
        return e;
    }
};

#define KVC_CK(call)                                                                   \
    do {                                                                               \
        cudaError_t kvc_e = (call);                                                    \
        if (kvc_e != cudaSuccess) return fail(err, errlen, #call, cudaGetErrorString(kvc_e)); \
    } while (0)

// Mean microseconds of device time per call of `f` over `iters` calls,
// after 3 warm-up calls: the calls are captured into a CUDA graph and the
// graph's launch is timed, so the host's per-call work (CUTLASS's
// initialize encodes the TMA descriptors) does not hide the kernels of
// small problems, as in a decode step run from a graph. If the capture
// fails, the calls are timed as launched. f returns nonzero (with err
// filled) on failure.
template <class F>
int time_us(Arena& ar, int iters, double* us, char* err, size_t errlen, F f) {
    if (iters < 1) iters = 1;
    for (int i = 0; i < 3; ++i)
        if (f()) return 1;
    KVC_CK(cudaStreamSynchronize(ar.stream));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool captured = cudaStreamBeginCapture(ar.stream, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (captured) {
        int rc = 0;
        for (int i = 0; i < iters && rc == 0; ++i) rc = f();
        captured = cudaStreamEndCapture(ar.stream, &graph) == cudaSuccess && rc == 0 &&
                   cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
        if (graph) cudaGraphDestroy(graph);
        if (!captured) {
            if (exec) cudaGraphExecDestroy(exec);
            exec = nullptr;
            cudaGetLastError();  // clear the failed capture's error
        }
    }
    if (captured) {
        cudaError_t e = cudaGraphLaunch(exec, ar.stream);  // warm
        if (e == cudaSuccess) e = cudaEventRecord(ar.start, ar.stream);
        if (e == cudaSuccess) e = cudaGraphLaunch(exec, ar.stream);
        if (e == cudaSuccess) e = cudaEventRecord(ar.stop, ar.stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(ar.stop);
        cudaGraphExecDestroy(exec);
        if (e != cudaSuccess) return fail(err, errlen, "timing graph", cudaGetErrorString(e));
    } else {
        KVC_CK(cudaEventRecord(ar.start, ar.stream));
        for (int i = 0; i < iters; ++i)
            if (f()) return 1;
        KVC_CK(cudaEventRecord(ar.stop, ar.stream));
        KVC_CK(cudaEventSynchronize(ar.stop));
    }
    float ms = 0.0f;
    KVC_CK(cudaEventElapsedTime(&ms, ar.start, ar.stop));
    *us = 1000.0 * ms / iters;
    return 0;
}

int setup(Arena& ar, char* err, size_t errlen) {
    if (kvc_fp8_gemm_check(err, errlen)) return 1;
    KVC_CK(cudaStreamCreateWithFlags(&ar.stream, cudaStreamNonBlocking));
    KVC_CK(cudaEventCreate(&ar.start));
    KVC_CK(cudaEventCreate(&ar.stop));
    return 0;
}

// Quantizes x ([rows, k] bf16) into q and s, checks the quantization, and
// times it.
int quantize_and_check(Arena& ar, const __nv_bfloat16* x, __nv_fp8_storage_t* q, float* s, int rows, int k,
                       int iters, kvc_fp8_selftest_result* out, char* err, size_t errlen) {
    float* qerr;
    KVC_CK(ar.alloc(&qerr, sizeof(float)));
    KVC_CK(cudaMemsetAsync(qerr, 0, sizeof(float), ar.stream));
    quant_rows(x, q, s, rows, k, ar.stream);
    KVC_CK(cudaGetLastError());
    int64_t count = static_cast<int64_t>(rows) * k;
    quant_error<<<blocks(count, 256), 256, 0, ar.stream>>>(x, q, s, rows, k, qerr);
    KVC_CK(cudaGetLastError());
    float h = 0.0f;
    KVC_CK(cudaMemcpyAsync(&h, qerr, sizeof(float), cudaMemcpyDeviceToHost, ar.stream));
    KVC_CK(cudaStreamSynchronize(ar.stream));
    out->quant_err = h;
    return time_us(ar, iters, &out->quant_us, err, errlen, [&]() {
        quant_rows(x, q, s, rows, k, ar.stream);
        return 0;
    });
}

int finish_compare(Arena& ar, const __nv_bfloat16* d, const float* ref, int64_t count, kvc_fp8_selftest_result* out,
                   char* err, size_t errlen) {
    float* stats;
    KVC_CK(ar.alloc(&stats, 2 * sizeof(float)));
    KVC_CK(cudaMemsetAsync(stats, 0, 2 * sizeof(float), ar.stream));
    compare<<<blocks(count, 256), 256, 0, ar.stream>>>(d, ref, count, stats);
    KVC_CK(cudaGetLastError());
    float h[2] = {0, 0};
    KVC_CK(cudaMemcpyAsync(h, stats, sizeof h, cudaMemcpyDeviceToHost, ar.stream));
    KVC_CK(cudaStreamSynchronize(ar.stream));
    out->max_rel_err = h[0] > 0.0f ? static_cast<double>(h[1]) / h[0] : static_cast<double>(h[1]);
    return 0;
}

// The bf16 baseline: moe_gemm.cu's grouped GEMM over the same offsets,
// both tilings, the faster one reported.
int time_bf16(Arena& ar, int experts, int n, int k, const uint32_t* offsets, const __nv_bfloat16* x,
              const __nv_bfloat16* w, __nv_bfloat16* d, int iters, double* us, char* err, size_t errlen) {
    uint64_t ws_rows = 0, ws_swap = 0;
    if (kvc_moe_gemm_workspace(experts, KVC_MOE_GEMM_ROWS, &ws_rows, err, errlen)) return 1;
    if (kvc_moe_gemm_workspace(experts, KVC_MOE_GEMM_SWAP, &ws_swap, err, errlen)) return 1;
    uint64_t ws_bytes = ws_rows > ws_swap ? ws_rows : ws_swap;
    char* ws;
    KVC_CK(ar.alloc(&ws, ws_bytes));
    double best = -1.0;
    for (int variant = 0; variant < KVC_MOE_GEMM_VARIANTS; ++variant) {
        kvc_moe_gemm_args a{};
        a.groups = kvc_expert_groups{experts, n, k, variant, reinterpret_cast<uint64_t>(offsets)};
        a.a = reinterpret_cast<uint64_t>(x);
        a.w = reinterpret_cast<uint64_t>(w);
        a.d = reinterpret_cast<uint64_t>(d);
        a.workspace = reinterpret_cast<uint64_t>(ws);
        a.workspace_bytes = ws_bytes;
        double t = 0.0;
        if (time_us(ar, iters, &t, err, errlen, [&]() { return kvc_moe_gemm_run(&a, ar.stream, err, errlen); }))
            return 1;
        if (best < 0.0 || t < best) best = t;
    }
    *us = best;
    return 0;
}

// The self-tests' operands: `rows` activation rows of k and `experts`
// weights of [n, k], filled with pseudo-random values (seeds `seed` and
// `seed + 1`), the weights quantized as checkpoints are, plus the outputs,
// the reference and `experts + 1` offsets.
struct Operands {
    __nv_bfloat16 *x, *w, *d, *d16;
    __nv_fp8_storage_t *q, *wq;
    float *s, *sw, *ref;
    uint32_t* offsets;
};

int prepare(Arena& ar, int rows, int experts, int n, int k, uint64_t seed, Operands* o, char* err, size_t errlen) {
    int kb = k / kBlock, nb = ceil_div(n, kBlock);
    int64_t mk = static_cast<int64_t>(rows) * k, enk = static_cast<int64_t>(experts) * n * k,
            mn = static_cast<int64_t>(rows) * n;
    KVC_CK(ar.alloc(&o->x, mk * 2));
    KVC_CK(ar.alloc(&o->w, enk * 2));
    KVC_CK(ar.alloc(&o->d, mn * 2));
    KVC_CK(ar.alloc(&o->d16, mn * 2));
    KVC_CK(ar.alloc(&o->q, mk));
    KVC_CK(ar.alloc(&o->wq, enk));
    KVC_CK(ar.alloc(&o->s, static_cast<size_t>(rows) * kb * 4));
    KVC_CK(ar.alloc(&o->sw, static_cast<size_t>(experts) * nb * kb * 4));
    KVC_CK(ar.alloc(&o->ref, mn * 4));
    KVC_CK(ar.alloc(&o->offsets, (experts + 1) * sizeof(uint32_t)));
    fill_activations<<<blocks(mk, 256), 256, 0, ar.stream>>>(o->x, rows, k, seed);
    fill_weights<<<blocks(enk, 256), 256, 0, ar.stream>>>(o->w, static_cast<int64_t>(experts) * n, k, seed + 1);
    quant_weight_blocks<<<dim3(nb, kb, experts), 256, 0, ar.stream>>>(o->w, o->wq, o->sw, n, k);
    KVC_CK(cudaGetLastError());
    return 0;
}

// The GEMM operands of a self-test's buffers: its quantized rows and
// weights, its output, the scratch `ws` of `bytes`.
kvc_fp8_operands operands(const Operands& o, char* ws, uint64_t bytes) {
    auto addr = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
    return kvc_fp8_operands{addr(o.q), addr(o.s), addr(o.wq), addr(o.sw), addr(o.d), addr(ws), bytes};
}

int dense_selftest(int m, int n, int k, int variant, int iters, kvc_fp8_selftest_result* out, char* err,
                   size_t errlen) {
    memset(out, 0, sizeof *out);
    if (dense_shape_ok(m, n, k, variant, err, errlen)) return 1;
    Arena ar;
    if (setup(ar, err, errlen)) return 1;
    int64_t mn = static_cast<int64_t>(m) * n;
    Operands o;
    if (prepare(ar, m, 1, n, k, 1, &o, err, errlen)) return 1;
    auto [x, w, d, d16, q, wq, s, sw, ref, offsets] = o;
    char* ws;
    uint32_t h_off[2] = {0, static_cast<uint32_t>(m)};
    KVC_CK(cudaMemcpyAsync(offsets, h_off, sizeof h_off, cudaMemcpyHostToDevice, ar.stream));
    if (quantize_and_check(ar, x, q, s, m, k, iters, out, err, errlen)) return 1;

    kvc_fp8_gemm_args a{};
    a.m = m;
    a.n = n;
    a.k = k;
    a.variant = variant;
    uint64_t ws_bytes = dense_workspace_bytes(a);
    KVC_CK(ar.alloc(&ws, ws_bytes));
    a.op = operands(o, ws, ws_bytes);
    if (variant == KVC_FP8_DENSE_SWAP64) {
        // The swap reads the 64-row copy of the scales; the reference the checkpoint's.
        float* sw64;
        KVC_CK(ar.alloc(&sw64, static_cast<size_t>(ceil_div(n, 64)) * (k / kBlock) * 4));
        repeat_scale_rows(sw, sw64, n, k, ar.stream);
        KVC_CK(cudaGetLastError());
        a.op.sw = reinterpret_cast<uint64_t>(sw64);
    }
    if (dense_run(&a, ar.stream, err, errlen)) return 1;
    reference_gemm<<<dim3(ceil_div(n, kRefTile), ceil_div(m, kRefTile)), 256, 0, ar.stream>>>(q, s, wq, sw, ref, m, n, k);
    KVC_CK(cudaGetLastError());
    if (finish_compare(ar, d, ref, mn, out, err, errlen)) return 1;
    if (time_us(ar, iters, &out->fp8_us, err, errlen, [&]() { return dense_run(&a, ar.stream, err, errlen); })) return 1;
    if (time_bf16(ar, 1, n, k, offsets, x, w, d16, iters, &out->bf16_us, err, errlen)) return 1;
    KVC_CK(cudaStreamSynchronize(ar.stream));
    return 0;
}

int grouped_selftest(int experts, int tokens, int topk, int n, int k, int variant, int iters,
                     kvc_fp8_selftest_result* out, char* err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (experts <= 0 || tokens <= 0 || topk <= 0 || topk > experts)
        return fail(err, errlen, "kvc_fp8_grouped_selftest", "need experts > 0, tokens > 0, 0 < topk <= experts");
    if (n <= 0 || n % 16 || k <= 0 || k % kBlock)
        return fail(err, errlen, "kvc_fp8_grouped_selftest", "n must be a multiple of 16 and k of 128");
    Arena ar;
    if (setup(ar, err, errlen)) return 1;
    // Deterministic routing: each token picks topk distinct experts.
    std::vector<uint32_t> counts(experts, 0), off(experts + 1, 0);
    std::vector<int> picked;
    for (int t = 0; t < tokens; ++t) {
        picked.clear();
        for (uint64_t j = 0; static_cast<int>(picked.size()) < topk; ++j) {
            int e = static_cast<int>(mix((static_cast<uint64_t>(t) << 20) + j + 7) % static_cast<uint32_t>(experts));
            bool dup = false;
            for (int p : picked) dup = dup || p == e;
            if (!dup) picked.push_back(e);
        }
        for (int e : picked) ++counts[e];
    }
    for (int e = 0; e < experts; ++e) off[e + 1] = off[e] + counts[e];
    int rows = static_cast<int>(off[experts]);
    int kb = k / kBlock, nb = ceil_div(n, kBlock);
    int64_t mn = static_cast<int64_t>(rows) * n;
    Operands o;
    if (prepare(ar, rows, experts, n, k, 3, &o, err, errlen)) return 1;
    auto [x, w, d, d16, q, wq, s, sw, ref, offsets] = o;
    char* ws;
    KVC_CK(cudaMemcpyAsync(offsets, off.data(), (experts + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice, ar.stream));
    if (quantize_and_check(ar, x, q, s, rows, k, iters, out, err, errlen)) return 1;

    kvc_fp8_grouped_args a{};
    a.groups = kvc_expert_groups{experts, n, k, variant, reinterpret_cast<uint64_t>(offsets)};
    uint64_t ws_bytes = grouped_workspace_bytes(experts, variant);
    if (ws_bytes == 0) return fail(err, errlen, "kvc_fp8_grouped_selftest", "unknown variant");
    KVC_CK(ar.alloc(&ws, ws_bytes));
    a.op = operands(o, ws, ws_bytes);
    if (grouped_run(&a, ar.stream, err, errlen)) return 1;
    for (int e = 0; e < experts; ++e) {
        int m = static_cast<int>(counts[e]);
        if (m == 0) continue;
        int64_t r0 = off[e];
        reference_gemm<<<dim3(ceil_div(n, kRefTile), ceil_div(m, kRefTile)), 256, 0, ar.stream>>>(
            q + r0 * k, s + r0 * kb, wq + static_cast<int64_t>(e) * n * k, sw + static_cast<int64_t>(e) * nb * kb,
            ref + r0 * n, m, n, k);
    }
    KVC_CK(cudaGetLastError());
    if (finish_compare(ar, d, ref, mn, out, err, errlen)) return 1;
    if (time_us(ar, iters, &out->fp8_us, err, errlen, [&]() { return grouped_run(&a, ar.stream, err, errlen); }))
        return 1;
    if (time_bf16(ar, experts, n, k, offsets, x, w, d16, iters, &out->bf16_us, err, errlen)) return 1;
    KVC_CK(cudaStreamSynchronize(ar.stream));
    return 0;
}

}  // namespace kvc_fp8

using namespace kvc_fp8;

extern "C" int kvc_fp8_gemm_check(char* err, size_t n) {
    return kvc_cutlass::check_sm90("the CUTLASS FP8 block-scaled GEMMs are", err, n);
}

extern "C" int kvc_fp8_quant_rows(uint64_t x, uint64_t q, uint64_t s, int32_t m, int32_t k, void* stream, char* err,
                                  size_t n) {
    if (m <= 0 || k <= 0) return fail(err, n, "kvc_fp8_quant_rows", "empty input");
    quant_rows(reinterpret_cast<const void*>(x), reinterpret_cast<void*>(q), reinterpret_cast<void*>(s), m, k,
               static_cast<cudaStream_t>(stream));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, n, "kvc_fp8_quant_rows launch", cudaGetErrorString(e));
    return 0;
}

extern "C" int kvc_fp8_quant_blocks(uint64_t w, uint64_t q, uint64_t sw, int32_t experts, int32_t n, int32_t k,
                                    void* stream, char* err, size_t errlen) {
    if (experts <= 0 || n <= 0 || k <= 0) return fail(err, errlen, "kvc_fp8_quant_blocks", "empty input");
    quant_weight_blocks<<<dim3(ceil_div(n, kBlock), ceil_div(k, kBlock), experts), 256, 0,
                          static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<const __nv_bfloat16*>(w),
                                                               reinterpret_cast<__nv_fp8_storage_t*>(q),
                                                               reinterpret_cast<float*>(sw), n, k);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, errlen, "kvc_fp8_quant_blocks launch", cudaGetErrorString(e));
    return 0;
}

extern "C" int kvc_fp8_gemm_workspace(int32_t m, int32_t n, int32_t k, int32_t variant, uint64_t* bytes, char* err,
                                      size_t errlen) {
    if (dense_shape_ok(m, n, k, variant, err, errlen)) return 1;
    kvc_fp8_gemm_args a{};
    a.m = m;
    a.n = n;
    a.k = k;
    a.variant = variant;
    *bytes = dense_workspace_bytes(a);
    return 0;
}

extern "C" int kvc_fp8_gemm_run(const kvc_fp8_gemm_args* args, void* stream, char* err, size_t errlen) {
    return dense_run(args, static_cast<cudaStream_t>(stream), err, errlen);
}

extern "C" int kvc_fp8_grouped_workspace(int32_t experts, int32_t variant, uint64_t* bytes, char* err,
                                         size_t errlen) {
    if (experts <= 0) return fail(err, errlen, "kvc_fp8_grouped_workspace", "no experts");
    *bytes = grouped_workspace_bytes(experts, variant);
    if (*bytes == 0) return fail(err, errlen, "kvc_fp8_grouped_workspace", "unknown variant");
    return 0;
}

extern "C" int kvc_fp8_grouped_run(const kvc_fp8_grouped_args* args, void* stream, char* err, size_t errlen) {
    return grouped_run(args, static_cast<cudaStream_t>(stream), err, errlen);
}

extern "C" int kvc_fp8_gemm_selftest_ex(int m, int n, int k, int variant, int iters, kvc_fp8_selftest_result* out,
                                        char* err, size_t errlen) {
    return dense_selftest(m, n, k, variant, iters, out, err, errlen);
}

extern "C" int kvc_fp8_gemm_selftest(int m, int n, int k, int iters, double* max_rel_err, double* fp8_us,
                                     double* bf16_us, char* err, size_t errlen) {
    kvc_fp8_selftest_result r;
    int rc = dense_selftest(m, n, k, KVC_FP8_DENSE_ROWS, iters, &r, err, errlen);
    if (max_rel_err) *max_rel_err = r.max_rel_err;
    if (fp8_us) *fp8_us = r.fp8_us;
    if (bf16_us) *bf16_us = r.bf16_us;
    return rc;
}

extern "C" int kvc_fp8_grouped_selftest(int experts, int tokens, int topk, int n, int k, int variant, int iters,
                                        kvc_fp8_selftest_result* out, char* err, size_t errlen) {
    return grouped_selftest(experts, tokens, topk, n, k, variant, iters, out, err, errlen);
}
