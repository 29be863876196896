// What graph memory nodes cost in a replay: N tiny kernels in one CUDA graph
// (a chain, as kvc's decode step), with A stream-ordered allocations and A
// frees around each kernel (cudaMallocAsync / cudaFreeAsync captured as
// MEM_ALLOC / MEM_FREE nodes, as candle's allocations inside kvc's capture
// are), against the same kernels alone. Build: nvcc -O3 -arch=sm_90a
// memnodes.cu -o memnodes
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

__global__ void touch(float* out, const float* in) {
    if (threadIdx.x == 0) out[0] = (in ? in[0] : 0.f) + 1.f;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

int run(int kernels, int allocs, int blocks, float* ms) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* fixed;
    CK(cudaMalloc(&fixed, 1 << 20));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    std::vector<float*> prev;
    const float* in = nullptr;
    for (int i = 0; i < kernels; i++) {
        std::vector<float*> cur(allocs);
        for (int a = 0; a < allocs; a++) CK(cudaMallocAsync(&cur[a], 4096, s));
        float* out = allocs ? cur[0] : fixed + (i % 1024) * 64;
        touch<<<blocks, 128, 0, s>>>(out, in);
        for (float* p : prev) CK(cudaFreeAsync(p, s));
        prev = cur;
        in = out;
    }
    for (float* p : prev) CK(cudaFreeAsync(p, s));
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiateWithFlags(&ge, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int reps = 200;
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, s));
    cudaEventRecord(b, s);
    CK(cudaEventSynchronize(b));
    cudaEventElapsedTime(ms, a, b);
    *ms /= reps;
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(fixed);
    cudaStreamDestroy(s);
    return 0;
}

int main() {
    const int kernels = 533;
    printf("%d kernels in a chain, one graph replay (mean of 200 after 20), us\n", kernels);
    printf("%8s %8s %12s %14s\n", "allocs", "blocks", "replay us", "us per kernel");
    for (int blocks : {1, 64}) {
        for (int allocs : {0, 1, 2, 0, 1, 2}) {
            float ms;
            if (run(kernels, allocs, blocks, &ms)) return 1;
            printf("%8d %8d %12.1f %14.2f\n", allocs, blocks, ms * 1000, ms * 1000 / kernels);
        }
    }
    return 0;
}
