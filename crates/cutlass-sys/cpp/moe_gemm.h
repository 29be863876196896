// kvc's C interface to CUTLASS's Hopper grouped GEMM for the MoE experts
// (moe_gemm.cu). Every expert's problem size is read from device memory,
// so a call never reads anything back to the host and can be captured in
// a CUDA graph.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// How the rows meet the tile.
//   0 (rows): the routed rows are the GEMM's M (128x256 tiles): prefill.
//   1 (swap): the expert's weight rows are M and the routed rows N
//             (128x64 tiles, D written transposed): a few rows per expert,
//             where the point is to stream each touched expert's weights.
enum { KVC_MOE_GEMM_ROWS = 0, KVC_MOE_GEMM_SWAP = 1, KVC_MOE_GEMM_VARIANTS = 2 };

// The experts of a grouped call (this one and fp8_gemm.h's): expert e's
// rows are offsets[e] .. offsets[e + 1] (experts + 1 u32 on the device,
// offsets[0] = 0), its weights [n, k]; variant: the tiling above.
typedef struct {
    int32_t experts;
    int32_t n;
    int32_t k;
    int32_t variant;
    uint64_t offsets;
} kvc_expert_groups;

// For every expert e with rows r in offsets[e] .. offsets[e + 1]:
//   d[r, :] = a[r, :] . w[e]^T
// a: [rows, k], w: [experts, n, k], d: [rows, n], all bf16 row-major.
typedef struct {
    kvc_expert_groups groups;
    uint64_t a;
    uint64_t w;
    uint64_t d;
    // Device scratch of kvc_moe_gemm_workspace() bytes, 256-aligned.
    uint64_t workspace;
    uint64_t workspace_bytes;
} kvc_moe_gemm_args;

// 0 when the grouped GEMM can run on the current device (sm90), else a
// message in err.
int kvc_moe_gemm_check(char* err, size_t n);
// Scratch bytes one call with this many experts needs.
int kvc_moe_gemm_workspace(int32_t experts, int32_t variant, uint64_t* bytes, char* err, size_t n);
// Queues the grouped GEMM on `stream` (a cudaStream_t / CUstream).
int kvc_moe_gemm_run(const kvc_moe_gemm_args* args, void* stream, char* err, size_t n);

#ifdef __cplusplus
}
#endif
