// kvc's C API over cuDNN's fused attention (the cuDNN frontend's SDPA
// graph), for prefill over a varlen batch: Q and O ragged over the batch's
// token rows, K and V either ragged (gathered contiguously) or read in
// place from a paged KV pool through per-sequence page tables. Causal with
// bottom-right alignment, so a chunk attends to its cached context; or, in
// FP8 (e4m3 Q/K/V/O, per-tensor scales), causal over chunks without context.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvc_sdpa_desc {
    int64_t b;             // sequences
    int64_t h_q, h_kv, d;  // heads, KV heads, head dim
    int64_t s_q, s_kv;     // longest query chunk / context the graph admits
    int32_t paged;         // 0: K/V ragged [tokens][h_kv][d]; 1: paged pool
    int64_t num_blocks;    // paged: blocks in the container
    int64_t block_size;    // paged: tokens per block
    int64_t block_stride;  // paged: elements from one block's K to the next's
    int64_t table_len;     // paged: page-table entries per sequence
    float scale;           // softmax scale
    int32_t fp8;           // 0: bf16 Q/K/V/O; 1: e4m3 Q/K/V/O with per-tensor scales (ragged K/V only).
                           // cuDNN's FP8 forward on Hopper has top-left causal alignment only: the
                           // caller sends sequences with as many keys as queries (no cached context)
} kvc_sdpa_desc;

typedef struct kvc_sdpa_args {
    void *q, *o;              // bf16 [tokens][h_q][d]
    void *k, *v;              // ragged: bf16 [tokens][h_kv][d]; paged: the K / V of block 0
    void *seq_len_q;          // int32 [b]
    void *seq_len_kv;         // int32 [b]
    void *q_offsets;          // int64 [b + 1]: element offset of each sequence's first Q/O row
    void *kv_offsets;         // ragged: int64 [b + 1]
    void *page_table;         // paged: int32 [b][table_len]
    void *workspace;          // get from kvc_cudnn_sdpa_build
    void *scales;             // fp8: float[8] on the device: descale Q, K, V (what one e4m3 unit is
                              // worth), descale S, scale S (the softmax probabilities' e4m3 scaling),
                              // scale O (O is written as e4m3(O x scale O)); then amax S, amax O (written)
} kvc_sdpa_args;

// Loads libcudnn (KVC_CUDNN_LIB, else "libcudnn.so.9" through the loader's
// search path) and creates a handle on the current device. 0 on success;
// otherwise an error message in err.
int kvc_cudnn_open(void **ctx, char *err, size_t err_len);
// cuDNN's version (e.g. 91900), 0 before open.
int64_t kvc_cudnn_version(void *ctx);
// Builds an execution plan for desc. 0 on success, 1 when cuDNN does not
// support the graph, 2 on other errors; err says why.
int kvc_cudnn_sdpa_build(void *ctx, const kvc_sdpa_desc *desc, void **graph, int64_t *workspace_bytes, char *err,
                         size_t err_len);
// Enqueues the attention on stream (a CUstream). 0 on success.
int kvc_cudnn_sdpa_run(void *ctx, void *graph, void *stream, const kvc_sdpa_args *args, char *err, size_t err_len);
void kvc_cudnn_sdpa_free(void *graph);
void kvc_cudnn_close(void *ctx);

#ifdef __cplusplus
}
#endif
