// kvc's C API over the cuDNN frontend's SDPA graph (see sdpa.h). The
// frontend is header-only and loads libcudnn at run time
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so nothing here links cuDNN:
// a binary without it still starts, and kvc falls back to its own kernels.
#include "sdpa.h"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace fe = cudnn_frontend;

// The frontend's dynamic loading resolves every cuDNN call through this handle.
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

enum Uid : int64_t {
    Q = 1, K, V, O, SEQ_Q, SEQ_KV, Q_OFF, K_OFF, V_OFF, O_OFF, TABLE_K, TABLE_V,
    // FP8: the scales in kvc_sdpa_args::scales' order.
    DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O, AMAX_S, AMAX_O,
};
constexpr int64_t FP8_SCALES = 8;

struct Ctx {
    cudnnHandle_t handle = nullptr;
    int64_t version = 0;
    std::mutex lock;  // a cuDNN handle is used by one thread at a time
};

struct Graph {
    std::shared_ptr<fe::graph::Graph> g;
    bool paged, fp8;
};

void set_err(char *err, size_t n, const std::string &msg) {
    if (err && n) {
        std::snprintf(err, n, "%s", msg.c_str());
    }
}

std::shared_ptr<fe::graph::Tensor_attributes> offsets(fe::graph::Graph &g, int64_t uid, int64_t b, const char *name) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({b + 1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT64));
}

std::shared_ptr<fe::graph::Tensor_attributes> lengths(fe::graph::Graph &g, int64_t uid, int64_t b, const char *name) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({b, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

// One f32 scalar on the device (an FP8 scale or amax).
std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph &g, int64_t uid, const char *name) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

// The graph of one bucket: Q/O ragged rows of [h_q][d] (token stride
// h_q * d, as the model lays them out), K/V ragged or paged; bf16, or e4m3
// with per-tensor scales (ragged only, top-left causal: see sdpa.h).
std::shared_ptr<fe::graph::Graph> make_graph(const kvc_sdpa_desc &d) {
    if (d.fp8 && d.paged) throw std::invalid_argument("kvc's FP8 attention graph reads gathered K/V, not a paged pool");
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(d.fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t tq = d.h_q * d.d, tkv = d.h_kv * d.d;
    auto q = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("Q")
                           .set_uid(Q)
                           .set_dim({d.b, d.h_q, d.s_q, d.d})
                           .set_stride({d.s_q * tq, d.d, tq, 1})
                           .set_ragged_offset(offsets(*g, Q_OFF, d.b, "q_offsets")));
    std::shared_ptr<fe::graph::Tensor_attributes> k, v;
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("kvc_prefill")
                    .set_generate_stats(false)
                    .set_attn_scale(d.scale)
                    .set_padding_mask(true)
                    .set_seq_len_q(lengths(*g, SEQ_Q, d.b, "seq_len_q"))
                    .set_seq_len_kv(lengths(*g, SEQ_KV, d.b, "seq_len_kv"))
                    .set_diagonal_alignment(d.fp8 ? fe::DiagonalAlignment_t::TOP_LEFT
                                                  : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
                    .set_diagonal_band_right_bound(0);
    if (d.paged) {
        // kvc's pool: block = [K | V], each [block_size][h_kv][d].
        auto container = [&](int64_t uid, const char *name) {
            return g->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({d.num_blocks, d.h_kv, d.block_size, d.d})
                                 .set_stride({d.block_stride, d.d, tkv, 1}));
        };
        auto table = [&](int64_t uid, const char *name) {
            return g->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({d.b, 1, d.table_len, 1})
                                 .set_stride({d.table_len, d.table_len, 1, 1})
                                 .set_data_type(fe::DataType_t::INT32));
        };
        k = container(K, "K_pool");
        v = container(V, "V_pool");
        opts.set_paged_attention_k_table(table(TABLE_K, "table_k"))
            .set_paged_attention_v_table(table(TABLE_V, "table_v"))
            .set_paged_attention_max_seq_len_kv(static_cast<int>(d.s_kv));
    } else {
        auto ragged = [&](int64_t uid, int64_t off_uid, const char *name, const char *off_name) {
            return g->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({d.b, d.h_kv, d.s_kv, d.d})
                                 .set_stride({d.s_kv * tkv, d.d, tkv, 1})
                                 .set_ragged_offset(offsets(*g, off_uid, d.b, off_name)));
        };
        k = ragged(K, K_OFF, "K", "k_offsets");
        v = ragged(V, V_OFF, "V", "v_offsets");
    }
    std::shared_ptr<fe::graph::Tensor_attributes> o;
    if (d.fp8) {
        auto outs = g->sdpa_fp8(q, k, v, scalar(*g, DESCALE_Q, "descale_q"), scalar(*g, DESCALE_K, "descale_k"),
                                scalar(*g, DESCALE_V, "descale_v"), scalar(*g, DESCALE_S, "descale_s"),
                                scalar(*g, SCALE_S, "scale_s"), scalar(*g, SCALE_O, "scale_o"), opts);
        o = outs[0];
        for (auto [t, uid] : {std::pair{outs[2], AMAX_S}, std::pair{outs[3], AMAX_O}}) {
            t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
                fe::DataType_t::FLOAT);
        }
    } else {
        o = g->sdpa(q, k, v, opts)[0];
    }
    o->set_output(true)
        .set_uid(O)
        .set_dim({d.b, d.h_q, d.s_q, d.d})
        .set_stride({d.s_q * tq, d.d, tq, 1})
        .set_ragged_offset(offsets(*g, O_OFF, d.b, "o_offsets"));
    return g;
}

}  // namespace

extern "C" int kvc_cudnn_open(void **out, char *err, size_t err_len) {
    try {
        // The frontend also opens the CUDA runtime; where both CUDA 12 and
        // 13 runtimes are on the search path (Mooncake's CUDA 12 wheel
        // libraries), it must take the one kvc runs on.
        setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", "libcudart.so.13", 0);
        if (!fe::cudnn_dlhandle) {
            const char *lib = std::getenv("KVC_CUDNN_LIB");
            if (!lib || !*lib) lib = "libcudnn.so.9";
            fe::cudnn_dlhandle = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
            if (!fe::cudnn_dlhandle) {
                const char *e = dlerror();
                set_err(err, err_len, std::string("cannot load ") + lib + ": " + (e ? e : "unknown error") +
                                          " (put cuDNN 9's lib directory on LD_LIBRARY_PATH or set KVC_CUDNN_LIB)");
                return 2;
            }
        }
        auto ctx = std::make_unique<Ctx>();
        ctx->version = static_cast<int64_t>(fe::detail::get_backend_version());
        auto st = fe::detail::create_handle(&ctx->handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            set_err(err, err_len, std::string("cudnnCreate: ") + fe::detail::get_error_string(st));
            return 2;
        }
        *out = ctx.release();
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("cuDNN: ") + e.what());
        return 2;
    }
}

extern "C" int64_t kvc_cudnn_version(void *ctx) { return ctx ? static_cast<Ctx *>(ctx)->version : 0; }

extern "C" int kvc_cudnn_sdpa_build(void *ctx_, const kvc_sdpa_desc *desc, void **out, int64_t *workspace, char *err,
                                    size_t err_len) {
    auto *ctx = static_cast<Ctx *>(ctx_);
    try {
        std::lock_guard<std::mutex> guard(ctx->lock);
        auto g = make_graph(*desc);
        auto step = [&](fe::error_t r, const char *what) {
            if (r.is_good()) return 0;
            set_err(err, err_len, std::string(what) + ": " + r.get_message());
            return r.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED ? 1 : 2;
        };
        if (int e = step(g->validate(), "validate")) return e;
        if (int e = step(g->build_operation_graph(ctx->handle), "operation graph")) return e;
        if (int e = step(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans")) return e;
        if (int e = step(g->check_support(ctx->handle), "support")) return e;
        if (int e = step(g->build_plans(ctx->handle), "build plans")) return e;
        int64_t ws = 0;
        if (int e = step(g->get_workspace_size(ws), "workspace size")) return e;
        *workspace = ws;
        *out = new Graph{g, desc->paged != 0, desc->fp8 != 0};
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("cuDNN graph: ") + e.what());
        return 2;
    }
}

extern "C" int kvc_cudnn_sdpa_run(void *ctx_, void *graph, void *stream, const kvc_sdpa_args *a, char *err,
                                  size_t err_len) {
    auto *ctx = static_cast<Ctx *>(ctx_);
    auto *g = static_cast<Graph *>(graph);
    try {
        std::lock_guard<std::mutex> guard(ctx->lock);
        auto st = fe::detail::set_stream(ctx->handle, static_cast<cudaStream_t>(stream));
        if (st != CUDNN_STATUS_SUCCESS) {
            set_err(err, err_len, std::string("cudnnSetStream: ") + fe::detail::get_error_string(st));
            return 2;
        }
        std::unordered_map<int64_t, void *> pack = {
            {Q, a->q}, {K, a->k}, {V, a->v}, {O, a->o}, {SEQ_Q, a->seq_len_q}, {SEQ_KV, a->seq_len_kv},
            {Q_OFF, a->q_offsets}, {O_OFF, a->q_offsets},
        };
        if (g->paged) {
            pack[TABLE_K] = a->page_table;
            pack[TABLE_V] = a->page_table;
        } else {
            pack[K_OFF] = a->kv_offsets;
            pack[V_OFF] = a->kv_offsets;
        }
        if (g->fp8) {
            for (int64_t i = 0; i < FP8_SCALES; i++) pack[DESCALE_Q + i] = static_cast<float *>(a->scales) + i;
        }
        auto r = g->g->execute(ctx->handle, pack, a->workspace);
        if (r.is_bad()) {
            set_err(err, err_len, std::string("execute: ") + r.get_message());
            return 2;
        }
        return 0;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("cuDNN execute: ") + e.what());
        return 2;
    }
}

extern "C" void kvc_cudnn_sdpa_free(void *graph) { delete static_cast<Graph *>(graph); }

extern "C" void kvc_cudnn_close(void *ctx_) {
    auto *ctx = static_cast<Ctx *>(ctx_);
    if (!ctx) return;
    if (ctx->handle) fe::detail::destroy_handle(ctx->handle);
    delete ctx;
}
