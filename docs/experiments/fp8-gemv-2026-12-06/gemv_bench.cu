// Few-row products at the Qwen3-30B-A3B shape, one token (decode batch 1):
// kernels/gemv.cu's small_m_gemm{,_fp8} (as kvc launches them: a grid of
// the resident blocks, warps striding over the tasks) against candidate
// variants, each in a CUDA graph over 8 layers' weights (456 MB touched a
// pass, so no layer's weights are in the 50 MB L2 when it runs).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I../../../kernels gemv_bench.cu -o gemv_bench && ./gemv_bench
#include "gemv.cu"
#include "gemv_variants.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

constexpr int LAYERS = 8;
constexpr int E = 128, TOPK = 8;

struct Shape {
    const char* name;
    int N, K;
    bool experts;  // 128 experts, 8 active, one pair each
    int row_div;   // gate_up: every pair reads x row 0 (row_div = 8)
};

struct Buffers {
    Shape s;
    std::vector<void*> w;      // per layer: weights (E or 1 copies)
    std::vector<float*> sc;    // per layer: block scales (FP8)
    std::vector<int*> meta;    // per layer: active experts
    int *offsets = nullptr, *sorted = nullptr;  // per layer below
    std::vector<int*> off;
    bf16* x = nullptr;
    bf16* out = nullptr;
    size_t active_bytes(bool fp8) const { return (size_t)(s.experts ? TOPK : 1) * s.N * s.K * (fp8 ? 1 : 2); }
};

// Weights: one 16 MB random tile per dtype, copied over the allocation
// (contents repeat; addresses do not, so L2 cannot serve a later layer).
static const std::vector<unsigned char>& tile(bool e4m3) {
    static std::vector<unsigned char> t[2];
    auto& h = t[e4m3];
    if (h.empty()) {
        h.resize(16 << 20);
        std::mt19937 rng(e4m3 ? 11 : 12);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (size_t i = 0; i < h.size(); i += 2) {
            unsigned v = rng();
            if (e4m3) {
                // no NaN (exponent and mantissa all ones), magnitudes below 2
                h[i] = (unsigned char)((v & 0x80) | ((v >> 8) % 0x40));
                h[i + 1] = (unsigned char)(((v >> 16) & 0x80) | ((v >> 20) % 0x40));
            } else {
                bf16 b = __float2bfloat16(u(rng));
                memcpy(&h[i], &b, 2);
            }
        }
    }
    return h;
}

static void fill_random(void* d, size_t bytes, bool e4m3) {
    const auto& h = tile(e4m3);
    for (size_t o = 0; o < bytes; o += h.size())
        CK(cudaMemcpy((char*)d + o, h.data(), std::min(h.size(), bytes - o), cudaMemcpyHostToDevice));
}

static void fill_bf16(bf16* d, size_t n, unsigned seed) {
    std::vector<bf16> h(n);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : h) v = __float2bfloat16(u(rng));
    CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

static Buffers make(Shape s, bool fp8) {
    Buffers b;
    b.s = s;
    const int copies = s.experts ? E : 1;
    const size_t wbytes = (size_t)copies * s.N * s.K * (fp8 ? 1 : 2);
    const int nb = (s.N + 127) / 128, kb = s.K / 128;
    std::mt19937 rng(7);
    for (int l = 0; l < LAYERS; l++) {
        void* w;
        CK(cudaMalloc(&w, wbytes));
        fill_random(w, wbytes, fp8);
        b.w.push_back(w);
        float* sc = nullptr;
        if (fp8) {
            std::vector<float> h((size_t)copies * nb * kb);
            for (auto& v : h) v = 0.001f * (1 + rng() % 100);
            CK(cudaMalloc(&sc, h.size() * 4));
            CK(cudaMemcpy(sc, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        }
        b.sc.push_back(sc);
        int* meta = nullptr;
        int* off = nullptr;
        if (s.experts) {
            // 8 distinct experts, in order (moe_align's meta), one pair each.
            std::vector<int> pick(E);
            for (int i = 0; i < E; i++) pick[i] = i;
            std::shuffle(pick.begin(), pick.end(), rng);
            std::vector<int> act(pick.begin(), pick.begin() + TOPK);
            std::sort(act.begin(), act.end());
            std::vector<int> hm(E, -1), ho(E + 1, 0);
            for (int i = 0; i < TOPK; i++) hm[i] = act[i];
            int p = 0;
            for (int e = 0; e < E; e++) {
                ho[e] = p;
                if (std::find(act.begin(), act.end(), e) != act.end()) p++;
            }
            ho[E] = p;
            CK(cudaMalloc(&meta, E * 4));
            CK(cudaMemcpy(meta, hm.data(), E * 4, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&off, (E + 1) * 4));
            CK(cudaMemcpy(off, ho.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
        }
        b.meta.push_back(meta);
        b.off.push_back(off);
    }
    if (s.experts) {
        std::vector<int> hs(TOPK);
        for (int i = 0; i < TOPK; i++) hs[i] = i;
        CK(cudaMalloc(&b.sorted, TOPK * 4));
        CK(cudaMemcpy(b.sorted, hs.data(), TOPK * 4, cudaMemcpyHostToDevice));
    }
    const int xrows = s.experts ? TOPK : 1;
    CK(cudaMalloc(&b.x, (size_t)xrows * s.K * 2));
    fill_bf16(b.x, (size_t)xrows * s.K, 3);
    CK(cudaMalloc(&b.out, (size_t)(s.experts ? TOPK : 1) * s.N * 2));
    return b;
}

// One launch of a variant on layer l's weights.
typedef void (*Launch)(const Buffers&, int l, bool fp8, cudaStream_t);

static int resident_blocks(const void* f, int threads) {
    int dev, sms, per;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, f, threads, 0));
    return sms * (per > 0 ? per : 1);
}

// kvc today: grid = min(tasks / 8 warps, the resident blocks of small_m_gemm).
static void launch_v0(const Buffers& b, int l, bool fp8, cudaStream_t st) {
    const Shape& s = b.s;
    const int groups = s.experts ? TOPK : 1;
    const long tasks = (long)groups * s.N / 2;
    static int cap = resident_blocks((const void*)small_m_gemm, 256);
    const int blocks = (int)std::min<long>((tasks + 7) / 8, cap);
    const int* off = s.experts ? b.off[l] : nullptr;
    const int* so = s.experts ? b.sorted : nullptr;
    const int* me = s.experts ? b.meta[l] : nullptr;
    const int rd = s.experts ? s.row_div : 1;
    if (fp8)
        small_m_gemm_fp8<<<blocks, 256, 0, st>>>(b.x, (const unsigned char*)b.w[l], b.sc[l], b.out, off, so, me, rd, 1,
                                                  groups, s.N, s.K);
    else
        small_m_gemm<<<blocks, 256, 0, st>>>(b.x, (const bf16*)b.w[l], b.out, off, so, me, rd, 1, groups, s.N, s.K);
}

template <int WPB, bool HINT>
static void launch_v1(const Buffers& b, int l, bool fp8, cudaStream_t st) {
    const Shape& s = b.s;
    const int groups = s.experts ? TOPK : 1;
    const long tasks = (long)groups * s.N / 2;
    const int blocks = (int)((tasks + WPB - 1) / WPB);
    const int* off = s.experts ? b.off[l] : nullptr;
    const int* so = s.experts ? b.sorted : nullptr;
    const int* me = s.experts ? b.meta[l] : nullptr;
    const int rd = s.experts ? s.row_div : 1;
    const int per = fp8 ? 16 : 8;
    const int chunks_per_lane = (s.K / per + 31) / 32;
    auto pick = [&](auto kc) {
        constexpr int KC = decltype(kc)::value;
        if (fp8)
            few_rows_v1<true, KC, 1, HINT><<<blocks, WPB * 32, 0, st>>>(b.x, b.w[l], b.sc[l], b.out, off, so, me, rd,
                                                                         1, groups, s.N, s.K);
        else
            few_rows_v1<false, KC, 1, HINT><<<blocks, WPB * 32, 0, st>>>(b.x, b.w[l], nullptr, b.out, off, so, me, rd,
                                                                          1, groups, s.N, s.K);
    };
    if (chunks_per_lane <= 2)
        pick(std::integral_constant<int, 2>{});
    else if (chunks_per_lane <= 4)
        pick(std::integral_constant<int, 4>{});
    else
        pick(std::integral_constant<int, 8>{});
}

// v2 with blocks of up to KB kilobytes of weights (a power-of-two count of
// columns, at most 128 so that FP8 columns share one scale row).
template <int KB>
static void launch_v2(const Buffers& b, int l, bool fp8, cudaStream_t st) {
    const Shape& s = b.s;
    const int groups = s.experts ? TOPK : 1;
    const int row_bytes = s.K * (fp8 ? 1 : 2);
    int cols = 1;
    while (cols < 128 && 2 * cols * row_bytes <= KB * 1024) cols *= 2;
    const int blocks = groups * ((s.N + cols - 1) / cols);
    const int* off = s.experts ? b.off[l] : nullptr;
    const int* so = s.experts ? b.sorted : nullptr;
    const int* me = s.experts ? b.meta[l] : nullptr;
    const int rd = s.experts ? s.row_div : 1;
    const size_t smem = (size_t)cols * row_bytes;
    if (fp8)
        few_rows_v2<true><<<blocks, 128, smem, st>>>(b.x, b.w[l], b.sc[l], b.out, off, so, me, rd, 1, groups, s.N, s.K,
                                                      cols);
    else
        few_rows_v2<false><<<blocks, 128, smem, st>>>(b.x, b.w[l], nullptr, b.out, off, so, me, rd, 1, groups, s.N,
                                                       s.K, cols);
}

// v3: v2 at 32 KB launched with programmatic dependent launch.
static void launch_v3(const Buffers& b, int l, bool fp8, cudaStream_t st) {
    const Shape& s = b.s;
    const int groups = s.experts ? TOPK : 1;
    const int row_bytes = s.K * (fp8 ? 1 : 2);
    int cols = 1;
    while (cols < 128 && 2 * cols * row_bytes <= 32 * 1024) cols *= 2;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(groups * ((s.N + cols - 1) / cols));
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = (size_t)cols * row_bytes;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    const int* off = s.experts ? b.off[l] : nullptr;
    const int* so = s.experts ? b.sorted : nullptr;
    const int* me = s.experts ? b.meta[l] : nullptr;
    const int rd = s.experts ? s.row_div : 1;
    const float* sc = fp8 ? b.sc[l] : nullptr;
    if (fp8)
        CK(cudaLaunchKernelEx(&cfg, few_rows_v2<true, true>, (const bf16*)b.x, (const void*)b.w[l], sc, b.out, off, so,
                              me, rd, 1, groups, s.N, s.K, cols));
    else
        CK(cudaLaunchKernelEx(&cfg, few_rows_v2<false, true>, (const bf16*)b.x, (const void*)b.w[l], sc, b.out, off,
                              so, me, rd, 1, groups, s.N, s.K, cols));
}

struct Variant {
    const char* name;
    Launch f;
};

static float time_graph(std::vector<Buffers*>& bs, Launch f, bool fp8, int reps) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < LAYERS; l++)
        for (auto* b : bs) f(*b, l, fp8, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 5; i++) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t a, z;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&z));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(z, st));
    CK(cudaEventSynchronize(z));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, z));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return ms * 1e3f / reps / LAYERS;  // us per layer (all shapes in bs)
}

static std::vector<float> read_out(const Buffers& b) {
    const size_t n = (size_t)(b.s.experts ? TOPK : 1) * b.s.N;
    std::vector<bf16> h(n);
    CK(cudaMemcpy(h.data(), b.out, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}

int main() {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    const Shape shapes[] = {
        {"qkv 5120x2048", 5120, 2048, false, 1},
        {"o_proj 2048x4096", 2048, 4096, false, 1},
        {"experts gate_up 8x1536x2048", 1536, 2048, true, TOPK},
        {"experts down 8x2048x768", 2048, 768, true, 1},
    };
    const Variant variants[] = {
        {"v0 kvc today (256 thr, resident grid, striding)", launch_v0},
        {"v1 one task a warp, 4 warps/block", launch_v1<4, false>},
        {"v1 one task a warp, 8 warps/block", launch_v1<8, false>},
        {"v1 + L2::256B prefetch, 4 warps/block", launch_v1<4, true>},
        {"v1 + L2::256B prefetch, 2 warps/block", launch_v1<2, true>},
        {"v2 bulk copy to smem, 8 KB blocks", launch_v2<8>},
        {"v2 bulk copy to smem, 16 KB blocks", launch_v2<16>},
        {"v2 bulk copy to smem, 32 KB blocks", launch_v2<32>},
        {"v3 = v2 32 KB + programmatic dependent launch", launch_v3},
    };
    const int reps = 200;
    for (bool fp8 : {true, false}) {
        printf("\n== weights %s ==\n", fp8 ? "block-FP8 (e4m3, 128x128 scales)" : "bf16");
        std::vector<Buffers> bufs;
        for (auto& s : shapes) bufs.push_back(make(s, fp8));
        printf("%-46s", "variant (us a launch, graph of 8 layers)");
        for (auto& b : bufs) printf(" %28s", b.s.name);
        printf(" %14s\n", "layer (4 in a row)");
        std::vector<std::vector<float>> ref(bufs.size());
        for (auto& v : variants) {
            printf("%-46s", v.name);
            for (size_t i = 0; i < bufs.size(); i++) {
                std::vector<Buffers*> one{&bufs[i]};
                float us = time_graph(one, v.f, fp8, reps);
                // Correctness against v0 on layer 0.
                v.f(bufs[i], 0, fp8, 0);
                CK(cudaDeviceSynchronize());
                auto o = read_out(bufs[i]);
                float worst = 0.f, mag = 0.f;
                if (ref[i].empty()) ref[i] = o;
                for (size_t j = 0; j < o.size(); j++) {
                    worst = std::max(worst, std::fabs(o[j] - ref[i][j]));
                    mag = std::max(mag, std::fabs(ref[i][j]));
                }
                const double gbs = bufs[i].active_bytes(fp8) / (us * 1e3);
                printf(" %7.2f us %5.0f GB/s %s", us, gbs, worst <= 0.02f * mag ? "ok  " : "DIFF");
            }
            std::vector<Buffers*> all;
            for (auto& b : bufs) all.push_back(&b);
            printf(" %10.2f us\n", time_graph(all, v.f, fp8, reps));
        }
        CK(cudaDeviceSynchronize());
        for (auto& b : bufs) {
            for (auto w : b.w) cudaFree(w);
            for (auto s : b.sc) cudaFree(s);
        }
    }
    return 0;
}
