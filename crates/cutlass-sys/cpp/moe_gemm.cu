// The MoE expert GEMMs on CUTLASS 3's Hopper grouped GEMM (ptr-array,
// TMA + wgmma, warp-specialized persistent kernels). Each expert is one
// group; its problem size, operand pointers and strides are written on
// the device by `fill_groups` from the expert offsets, and CUTLASS reads
// the problem sizes from device memory (no host problem shapes), so a
// call never waits on the device and can be captured in a CUDA graph.
//
// Two instantiations (moe_gemm.h): ROWS puts the routed rows on the
// tile's M (128x256x64, prefill: hundreds of rows per expert); SWAP
// computes d^T = w . a^T, so the expert's weight rows are M and the few
// routed rows N (128x64x128), writing d transposed (column-major d^T is
// row-major d): a decode or mixed step touches each expert's weights once
// at full tile width instead of padding one or two rows to 128.
#include "moe_gemm.h"
#include "cutlass_call.h"
#include "expert_groups.h"

#include <cstdio>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace kvc_moe {

using kvc_cutlass::fail;
using kvc_cutlass::up;

using Bf16 = cutlass::bfloat16_t;
using ProblemShape = kvc_cutlass::GroupShape;
using Problem = kvc_cutlass::GroupProblem;

template <class Tile, class LayoutD>
struct Grouped {
    using LayoutA = cutlass::layout::RowMajor;
    using LayoutB = cutlass::layout::ColumnMajor;
    using Cluster = Shape<_1, _1, _1>;
    static constexpr int kAlign = 8;  // 16 bytes of bf16
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Bf16, LayoutD*, kAlign,
        cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
        cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, kAlign, Bf16, LayoutB*, kAlign, float, Tile,
        Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideD = typename Kernel::InternalStrideD;
};

using Rows = Grouped<Shape<_128, _256, _64>, cutlass::layout::RowMajor>;
using Swap = Grouped<Shape<_128, _64, _128>, cutlass::layout::ColumnMajor>;

template <class G>
using Arrays = kvc_cutlass::GroupArrays<G, false>;

// One thread per expert: its group's problem, pointers and strides.
template <class G, bool kSwap>
__global__ void fill_groups(int experts, int n, int k, const uint32_t* offsets, const Bf16* a, const Bf16* w, Bf16* d,
                            char* base, Arrays<G> l) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= experts) return;
    kvc_cutlass::ExpertGroup<kSwap> g(e, n, offsets);
    const Bf16* rows = a + g.row0 * k;
    const Bf16* weight = w + static_cast<int64_t>(e) * n * k;
    l.write(base, e, g, k, g.a(rows, weight), g.b(rows, weight), d + g.row0 * n);
}

template <class G>
typename G::Gemm::Arguments arguments(int experts, char* base) {
    Arrays<G> l(experts);
    using A = Arrays<G>;
    return kvc_cutlass::group_arguments(
        experts, base, l,
        {A::template in<const Bf16*>(base, l.pa), A::template in<typename G::StrideA>(base, l.sa),
         A::template in<const Bf16*>(base, l.pb), A::template in<typename G::StrideB>(base, l.sb)});
}

template <class G>
uint64_t workspace_bytes(int experts) {
    Arrays<G> l(experts);
    auto args = arguments<G>(experts, nullptr);
    return l.cutlass + up(G::Gemm::get_workspace_size(args));
}

template <class G, bool kSwap>
int run(const kvc_moe_gemm_args* a, cudaStream_t stream, char* err, size_t n) {
    const kvc_expert_groups& g = a->groups;
    Arrays<G> l(g.experts);
    if (a->workspace_bytes < workspace_bytes<G>(g.experts)) return fail(err, n, "kvc_moe_gemm_run", "workspace too small");
    char* base = reinterpret_cast<char*>(a->workspace);
    int threads = 128;
    fill_groups<G, kSwap><<<(g.experts + threads - 1) / threads, threads, 0, stream>>>(
        g.experts, g.n, g.k, reinterpret_cast<const uint32_t*>(g.offsets), reinterpret_cast<const Bf16*>(a->a),
        reinterpret_cast<const Bf16*>(a->w), reinterpret_cast<Bf16*>(a->d), base, l);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, n, "fill_groups launch", cudaGetErrorString(e));
    return kvc_cutlass::run_gemm<typename G::Gemm>(arguments<G>(g.experts, base), base + l.cutlass, stream, err, n);
}

}  // namespace kvc_moe

using namespace kvc_moe;

extern "C" int kvc_moe_gemm_check(char* err, size_t n) {
    return kvc_cutlass::check_sm90("the CUTLASS grouped GEMM is", err, n);
}

extern "C" int kvc_moe_gemm_workspace(int32_t experts, int32_t variant, uint64_t* bytes, char* err, size_t n) {
    if (experts <= 0) return fail(err, n, "kvc_moe_gemm_workspace", "no experts");
    switch (variant) {
        case KVC_MOE_GEMM_ROWS: *bytes = workspace_bytes<Rows>(experts); return 0;
        case KVC_MOE_GEMM_SWAP: *bytes = workspace_bytes<Swap>(experts); return 0;
        default: return fail(err, n, "kvc_moe_gemm_workspace", "unknown variant");
    }
}

extern "C" int kvc_moe_gemm_run(const kvc_moe_gemm_args* a, void* stream, char* err, size_t n) {
    const kvc_expert_groups& g = a->groups;
    if (g.experts <= 0 || g.n <= 0 || g.k <= 0) return fail(err, n, "kvc_moe_gemm_run", "empty problem");
    if (g.n % 8 || g.k % 8) return fail(err, n, "kvc_moe_gemm_run", "n and k must be multiples of 8");
    if ((a->a | a->w | a->d | a->workspace) % 16) return fail(err, n, "kvc_moe_gemm_run", "pointers must be 16-byte aligned");
    auto s = static_cast<cudaStream_t>(stream);
    switch (g.variant) {
        case KVC_MOE_GEMM_ROWS: return run<Rows, false>(a, s, err, n);
        case KVC_MOE_GEMM_SWAP: return run<Swap, true>(a, s, err, n);
        default: return fail(err, n, "kvc_moe_gemm_run", "unknown variant");
    }
}
