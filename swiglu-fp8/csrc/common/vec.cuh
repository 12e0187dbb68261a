// generated from common/csrc/vec.cuh by `fused-llm sync`, do not edit
// Vectors of the GPU kernels: NW 32-bit words (16, 8 or 4 bytes) moved with one load or store
// instruction, and their conversion to and from floats through Elem<T> (dtype.cuh). Vector
// index vi addresses bytes [vi * 4 * NW, (vi + 1) * 4 * NW) of `base`, which the caller has
// checked to be aligned to the vector size.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"

namespace fused_llm {

template <int NW>
struct Vec {
  uint32_t w[NW];
};

// Plain (coherent) load: right for data the kernel may also write (in-place operands).
template <int NW>
__device__ __forceinline__ Vec<NW> load_vec(const void* base, int vi) {
  Vec<NW> v;
  if constexpr (NW == 4) {
    const uint4 r = static_cast<const uint4*>(base)[vi];
    v.w[0] = r.x; v.w[1] = r.y; v.w[2] = r.z; v.w[3] = r.w;
  } else if constexpr (NW == 2) {
    const uint2 r = static_cast<const uint2*>(base)[vi];
    v.w[0] = r.x; v.w[1] = r.y;
  } else {
    static_assert(NW == 1, "16-, 8- or 4-byte vectors");
    v.w[0] = static_cast<const uint32_t*>(base)[vi];
  }
  return v;
}

// Load through the read-only data path (__ldg): only for data no thread of the launch writes.
template <int NW>
__device__ __forceinline__ Vec<NW> load_vec_readonly(const void* base, int vi) {
  Vec<NW> v;
  if constexpr (NW == 4) {
    const uint4 r = __ldg(static_cast<const uint4*>(base) + vi);
    v.w[0] = r.x; v.w[1] = r.y; v.w[2] = r.z; v.w[3] = r.w;
  } else if constexpr (NW == 2) {
    const uint2 r = __ldg(static_cast<const uint2*>(base) + vi);
    v.w[0] = r.x; v.w[1] = r.y;
  } else {
    static_assert(NW == 1, "16-, 8- or 4-byte vectors");
    v.w[0] = __ldg(static_cast<const unsigned int*>(base) + vi);
  }
  return v;
}

template <int NW>
__device__ __forceinline__ void store_vec(void* base, int vi, const Vec<NW>& v) {
  if constexpr (NW == 4) {
    static_cast<uint4*>(base)[vi] = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
  } else if constexpr (NW == 2) {
    static_cast<uint2*>(base)[vi] = make_uint2(v.w[0], v.w[1]);
  } else {
    static_assert(NW == 1, "16-, 8- or 4-byte vectors");
    static_cast<uint32_t*>(base)[vi] = v.w[0];
  }
}

template <int NW>
__device__ __forceinline__ Vec<NW> zero_vec() {
  Vec<NW> v;
#pragma unroll
  for (int i = 0; i < NW; ++i) v.w[i] = 0u;
  return v;
}

// Vector <-> floats (NW * kPerWord of them).
template <class T, int NW>
__device__ __forceinline__ void unpack_vec(const Vec<NW>& v, float* f) {
#pragma unroll
  for (int i = 0; i < NW; ++i) Elem<T>::unpack(v.w[i], f + i * Elem<T>::kPerWord);
}

template <class T, int NW>
__device__ __forceinline__ Vec<NW> pack_vec(const float* f) {
  Vec<NW> v;
#pragma unroll
  for (int i = 0; i < NW; ++i) v.w[i] = Elem<T>::pack(f + i * Elem<T>::kPerWord);
  return v;
}

// Elementwise a + b / a * b in T, each element rounded once (Elem<T>::add2 / mul2).
template <class T, int NW>
__device__ __forceinline__ Vec<NW> add_vec(const Vec<NW>& a, const Vec<NW>& b) {
  Vec<NW> r;
#pragma unroll
  for (int i = 0; i < NW; ++i) r.w[i] = Elem<T>::add2(a.w[i], b.w[i]);
  return r;
}

template <class T, int NW>
__device__ __forceinline__ Vec<NW> mul_vec(const Vec<NW>& a, const Vec<NW>& b) {
  Vec<NW> r;
#pragma unroll
  for (int i = 0; i < NW; ++i) r.w[i] = Elem<T>::mul2(a.w[i], b.w[i]);
  return r;
}

}  // namespace fused_llm
