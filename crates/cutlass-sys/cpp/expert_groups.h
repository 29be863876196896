// What the two grouped GEMMs over the MoE experts (moe_gemm.cu over bf16,
// fp8_gemm.cu over block-FP8) share: which rows, weight and output expert
// e's group covers, the GEMM it runs in either tiling, and the per-expert
// arrays (problem sizes, operand pointers, strides) that the device writes
// at the start of the workspace for CUTLASS's ptr-array kernels to read,
// so that no call waits on the host.
#pragma once
#include "cutlass_call.h"

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

namespace kvc_cutlass {

using GroupShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using GroupProblem = GroupShape::UnderlyingProblemShape;

// Expert e's group over rows in expert order (offsets[e] .. offsets[e + 1])
// and weights [experts, n, k]. Rows on M: d = rows . weight^T. kSwap:
// d^T = weight . rows^T, the weight rows on M and the expert's rows on N
// (d written column-major, which is d row-major).
template <bool kSwap>
struct ExpertGroup {
    int64_t row0;  // its first row
    int rows;      // its row count
    int gm, gn;    // (M, N) of the GEMM it runs
    __device__ ExpertGroup(int e, int n, const uint32_t* offsets)
        : row0(offsets[e]), rows(static_cast<int>(offsets[e + 1] - offsets[e])) {
        gm = kSwap ? n : rows;
        gn = kSwap ? rows : n;
    }
    // The GEMM's A and B of a (rows, weight) pair of anything.
    template <class T>
    __device__ T a(T of_rows, T of_weight) const {
        return kSwap ? of_weight : of_rows;
    }
    template <class T>
    __device__ T b(T of_rows, T of_weight) const {
        return kSwap ? of_rows : of_weight;
    }
};

// The arrays a grouped kernel G reads, one entry per expert, each 256-byte
// aligned from the workspace's start: problems, A/B/D pointers, A/B/D
// strides; with kScaled also the block scales' pointers and layouts (the
// FP8 kernels' SFA, SFB). CUTLASS's own workspace starts at `cutlass`.
template <class G, bool kScaled>
struct GroupArrays {
    uint64_t problems, pa, pb, pd, sa, sb, sd, psa = 0, psb = 0, lsa = 0, lsb = 0, cutlass;

    explicit GroupArrays(int experts) {
        uint64_t end = 0;
        auto next = [&](uint64_t each) {
            uint64_t start = end;
            end = up(end + static_cast<uint64_t>(experts) * each);
            return start;
        };
        problems = next(sizeof(GroupProblem));
        pa = next(sizeof(void*));
        pb = next(sizeof(void*));
        pd = next(sizeof(void*));
        sa = next(sizeof(typename G::StrideA));
        sb = next(sizeof(typename G::StrideB));
        sd = next(sizeof(typename G::StrideD));
        if constexpr (kScaled) {
            psa = next(sizeof(void*));
            psb = next(sizeof(void*));
            lsa = next(sizeof(typename G::LayoutSFA));
            lsb = next(sizeof(typename G::LayoutSFB));
        }
        cutlass = end;
    }

    // The array at `offset` of the workspace at `base`.
    template <class T>
    __host__ __device__ static T* in(char* base, uint64_t offset) {
        return reinterpret_cast<T*>(base + offset);
    }

    // Expert e's problem, operand pointers and packed strides.
    template <bool kSwap, class In, class Out>
    __device__ void write(char* base, int e, const ExpertGroup<kSwap>& g, int k, const In* a, const In* b,
                          Out* d) const {
        in<GroupProblem>(base, problems)[e] = GroupProblem{g.gm, g.gn, k};
        in<const In*>(base, pa)[e] = a;
        in<const In*>(base, pb)[e] = b;
        in<Out*>(base, pd)[e] = d;
        in<typename G::StrideA>(base, sa)[e] =
            cutlass::make_cute_packed_stride(typename G::StrideA{}, cute::make_shape(g.gm, k, 1));
        in<typename G::StrideB>(base, sb)[e] =
            cutlass::make_cute_packed_stride(typename G::StrideB{}, cute::make_shape(g.gn, k, 1));
        in<typename G::StrideD>(base, sd)[e] =
            cutlass::make_cute_packed_stride(typename G::StrideD{}, cute::make_shape(g.gm, g.gn, 1));
    }
};

// The arguments of grouped kernel G over the arrays `l` at `base`: its
// problems, `mainloop` (the operands as G's mainloop reads them) and a
// plain bf16 product into the D pointers.
template <class G, bool kScaled>
typename G::Gemm::Arguments group_arguments(int experts, char* base, const GroupArrays<G, kScaled>& l,
                                            const typename G::Mainloop::Arguments& mainloop) {
    using A = GroupArrays<G, kScaled>;
    typename G::Gemm::Arguments args;
    decltype(args.epilogue.thread) fusion;
    plain_product(fusion);
    args = typename G::Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {experts, A::template in<GroupProblem>(base, l.problems), nullptr},
        mainloop,
        {fusion, nullptr, nullptr, A::template in<cutlass::bfloat16_t*>(base, l.pd),
         A::template in<typename G::StrideD>(base, l.sd)},
        hardware()};
    return args;
}

}  // namespace kvc_cutlass
