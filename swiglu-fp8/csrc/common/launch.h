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

// Multiprocessor count of the current device, queried once per device ordinal < 64 instead of
// on every launch (the launchers run on the host's critical path at decode sizes).
inline cudaError_t sm_count(int* n) {
  static std::atomic<int> cache[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int v = (dev >= 0 && dev < 64) ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    e = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    v = v < 1 ? 1 : v;
    if (dev >= 0 && dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  }
  *n = v;
  return cudaSuccess;
}

// Compute capability of the current device as 10 * major + minor (90 on an H100), queried once per
// device ordinal < 64: launchers that only run on some GPUs check it on every call.
inline cudaError_t compute_capability(int* cc) {
  static std::atomic<int> cache[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int v = (dev >= 0 && dev < 64) ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    int major = 0, minor = 0;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) return e;
    v = 10 * major + minor;
    if (dev >= 0 && dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  }
  *cc = v;
  return cudaSuccess;
}

inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

}  // namespace
}  // namespace fused_llm
