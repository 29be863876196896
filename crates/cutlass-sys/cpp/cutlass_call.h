// What moe_gemm.cu and fp8_gemm.cu share around their CUTLASS kernels:
// the error convention of the C interface (0, or 1 with a message in err),
// the device checks, the workspace alignment, and one call of a CUTLASS
// device GEMM (can_implement, initialize, run, launch check).
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"

namespace kvc_cutlass {

// Writes "what: detail" into err (when there is room) and returns 1.
inline int fail(char* err, size_t n, const char* what, const char* detail) {
    if (err && n) snprintf(err, n, "%s: %s", what, detail);
    return 1;
}

// 0 when the current device is sm90 (the kernels are built for sm90a
// only), else 1 with a message naming `kernels`.
inline int check_sm90(const char* kernels, char* err, size_t n) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) return fail(err, n, "CUDA device query", cudaGetErrorString(e));
    if (major != 9 || minor != 0) {
        char what[64], why[160];
        snprintf(what, sizeof what, "compute capability %d.%d", major, minor);
        snprintf(why, sizeof why, "%s built for sm90a (Hopper) only", kernels);
        return fail(err, n, what, why);
    }
    return 0;
}

// The current device's SM count, read once per device.
inline int sm_count() {
    static int count[64] = {0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (count[dev] == 0) cudaDeviceGetAttribute(&count[dev], cudaDevAttrMultiProcessorCount, dev);
    return count[dev];
}

inline cutlass::KernelHardwareInfo hardware() {
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = sm_count();
    return hw;
}

// Workspace offsets are 256-byte aligned.
constexpr uint64_t kAlignBytes = 256;
inline uint64_t up(uint64_t x) { return (x + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// D = alpha A B with alpha 1, beta 0 and no per-group alpha or beta: the
// linear-combination epilogue as both grouped GEMMs use it.
template <class Fusion>
inline void plain_product(Fusion& fusion) {
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
}

// One call of a CUTLASS device GEMM over `workspace` on `stream`.
template <class Gemm>
int run_gemm(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream, char* err, size_t n) {
    Gemm gemm;
    cutlass::Status s = gemm.can_implement(args);
    if (s != cutlass::Status::kSuccess) return fail(err, n, "CUTLASS can_implement", cutlassGetStatusString(s));
    s = gemm.initialize(args, workspace, stream);
    if (s != cutlass::Status::kSuccess) return fail(err, n, "CUTLASS initialize", cutlassGetStatusString(s));
    s = gemm.run(stream);
    if (s != cutlass::Status::kSuccess) return fail(err, n, "CUTLASS run", cutlassGetStatusString(s));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail(err, n, "CUTLASS launch", cudaGetErrorString(e));
    return 0;
}

}  // namespace kvc_cutlass
