// generated from common/csrc/launch.h by `fused-llm sync`, do not edit
// Host-side helpers of the GPU launchers (CUDA; hipified for ROCm): power-of-two arithmetic
// for launch shapes, the multiprocessor count, pointer alignment.
//
// Internal linkage (unnamed namespace): each package's .so keeps its own copy. Two packages
// built from different versions of this file can be loaded in one process, and an inline
// function's static cache would otherwise be one process-wide (STB_GNU_UNIQUE) object.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace fused_llm {
namespace {

// Smallest power of two >= n (1 for n <= 1).
inline int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// log2 of a power of two n >= 1 (of the next power of two otherwise).
inline int log2_exact(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

// `query(device, &value)`'s value for the current device, queried once per device ordinal < 64
// (kept in `cache`, 0 meaning not yet: values must be >= 1) instead of on every launch: the
// launchers run on the host's critical path at decode sizes.
template <typename Query>
inline cudaError_t per_device(std::atomic<int> (&cache)[64], int* out, Query query) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const bool cached = dev >= 0 && dev < 64;
  int v = cached ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    if ((e = query(dev, &v)) != cudaSuccess) return e;
    if (cached) cache[dev].store(v, std::memory_order_relaxed);
  }
  *out = v;
  return cudaSuccess;
}

// Multiprocessor count of the current device (at least 1).
inline cudaError_t sm_count(int* n) {
  static std::atomic<int> cache[64];
  return per_device(cache, n, [](int dev, int* v) {
    const cudaError_t e = cudaDeviceGetAttribute(v, cudaDevAttrMultiProcessorCount, dev);
    *v = *v < 1 ? 1 : *v;
    return e;
  });
}

// Compute capability of the current device as 10 * major + minor (90 on an H100): launchers that
// only run on some GPUs check it on every call.
inline cudaError_t compute_capability(int* cc) {
  static std::atomic<int> cache[64];
  return per_device(cache, cc, [](int dev, int* v) {
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    *v = 10 * major + minor;
    return e;
  });
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` (past the 48 KiB default) on the current
// device, once per device: the limit is a per-device attribute of each kernel, and `cache` is the
// caller's, one per kernel instantiation. A failure is returned and cleared from the runtime's
// last error (the caller reports it).
template <typename Kernel>
inline cudaError_t opt_in_dynamic_smem(std::atomic<int> (&cache)[64], Kernel kernel, int bytes) {
  int done = 0;
  const cudaError_t e = per_device(cache, &done, [&](int, int* v) {
    *v = 1;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

}  // namespace
}  // namespace fused_llm
