// A/B harness helpers: deterministic inputs, output hashing, timing (framework-free CUDA).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)
inline uint32_t mix(uint64_t x) { x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33; return (uint32_t)x; }
inline float rnd(uint64_t seed, uint64_t i) { return ((mix(seed * 0x9e3779b97f4a7c15ULL + i) >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f; }
inline uint16_t to_bf16(float f) { uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }
inline uint16_t to_half(float f) {  // host conversion, round to nearest even
  __half h = __float2half_rn(f); uint16_t b; std::memcpy(&b, &h, 2); return b; }
// Fill `bytes` of device memory with elements of dtype code (0 fp32, 1 fp16, 2 bf16).
inline void* make_input(int dtype, size_t n, uint64_t seed, float scale, float offset) {
  std::vector<uint8_t> h(n * (dtype == 0 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    const float v = rnd(seed, i) * scale + offset;
    if (dtype == 0) std::memcpy(&h[4 * i], &v, 4);
    else { const uint16_t b = dtype == 1 ? to_half(v) : to_bf16(v); std::memcpy(&h[2 * i], &b, 2); }
  }
  void* d; CK(cudaMalloc(&d, h.size())); CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice)); return d;
}
inline uint64_t fnv(const void* d, size_t bytes) {
  std::vector<uint8_t> h(bytes); CK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
  uint64_t x = 1469598103934665603ULL; for (uint8_t b : h) { x ^= b; x *= 1099511628211ULL; } return x;
}
// Median over 7 repetitions of the mean time of `iters` back-to-back launches, in microseconds.
template <class F> double time_us(F launch, int iters = 200) {
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 20; ++i) launch();
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a)); for (int i = 0; i < iters; ++i) launch(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(1000.0 * ms / iters);
  }
  std::sort(t.begin(), t.end()); return t[3];
}
