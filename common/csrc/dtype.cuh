// Element types of the GPU kernels (CUDA; hipified for ROCm gfx942): fp32, fp16 and bf16 values
// as packed 32-bit words. A word holds one fp32 or two 16-bit elements (element 2k in the low
// half); arithmetic is in fp32, and pack() rounds to the element type with RNE, like torch's
// `.to(dtype)`. On CUDA a pair goes through one cvt / hadd2 / hmul2; ROCm uses numerics.h.
#pragma once

#include <cuda_runtime.h>
#ifndef USE_ROCM
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>

#include "kernel_types.h"
#include "numerics.h"

namespace fused_llm {

struct Fp32Tag {};
struct Fp16Tag {};
struct Bf16Tag {};

// Register-level reinterpretation of a 32-bit word as a packed pair type and back.
template <class P>
__device__ __forceinline__ P bit_cast_u32(uint32_t w) {
  P p;
  memcpy(&p, &w, sizeof(p));
  return p;
}
template <class P>
__device__ __forceinline__ uint32_t bit_cast_to_u32(const P& p) {
  uint32_t w;
  memcpy(&w, &p, sizeof(w));
  return w;
}

// Elem<Tag>: kBytes per element, kPerWord elements per 32-bit word;
//   unpack(w, f) / pack(f): word <-> kPerWord floats;  round(f): float(T(f));
//   add2(a, b) / mul2(a, b): elementwise on two words, rounded once to T;
//   load(base, i) / store(base, i, f): scalar element i (for the unaligned paths).
template <class T>
struct Elem;

// add2 / mul2 through fp32 (the ROCm path): unpack, operate, round once. The product of two
// 16-bit values is exact in fp32 (at most 2 x 11 significant bits of 24), and so is their sum
// unless one term is below half an ulp of the other (then both roundings give the larger term):
// the result equals torch's fp32 op + cast.
enum class PairOp { kAdd, kMul };

template <class E, PairOp kOp>
__device__ __forceinline__ uint32_t pair_op_via_fp32(uint32_t a, uint32_t b) {
  float fa[2], fb[2];
  E::unpack(a, fa);
  E::unpack(b, fb);
  fa[0] = kOp == PairOp::kMul ? fa[0] * fb[0] : fa[0] + fb[0];
  fa[1] = kOp == PairOp::kMul ? fa[1] * fb[1] : fa[1] + fb[1];
  return E::pack(fa);
}

template <>
struct Elem<Fp32Tag> {
  static constexpr int kBytes = 4;
  static constexpr int kPerWord = 1;
  __device__ __forceinline__ static void unpack(uint32_t w, float* f) { f[0] = __uint_as_float(w); }
  __device__ __forceinline__ static uint32_t pack(const float* f) { return __float_as_uint(f[0]); }
  __device__ __forceinline__ static float round(float f) { return f; }
  __device__ __forceinline__ static uint32_t add2(uint32_t a, uint32_t b) {
    return __float_as_uint(__uint_as_float(a) + __uint_as_float(b));
  }
  __device__ __forceinline__ static uint32_t mul2(uint32_t a, uint32_t b) {
    return __float_as_uint(__uint_as_float(a) * __uint_as_float(b));
  }
  __device__ __forceinline__ static float load(const void* base, int64_t i) {
    return static_cast<const float*>(base)[i];
  }
  __device__ __forceinline__ static void store(void* base, int64_t i, float f) {
    static_cast<float*>(base)[i] = f;
  }
};

template <>
struct Elem<Bf16Tag> {
  static constexpr int kBytes = 2;
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static void unpack(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ __forceinline__ static uint32_t pack(const float* f) {
#ifndef USE_ROCM
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[0], f[1]);  // one cvt.rn.bf16x2.f32 on sm_80+
    return static_cast<uint32_t>(__bfloat16_as_ushort(h.x)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
#else
    return static_cast<uint32_t>(float_to_bf16(f[0])) |
           (static_cast<uint32_t>(float_to_bf16(f[1])) << 16);
#endif
  }
  __device__ __forceinline__ static uint16_t to_bits(float f) {
#ifndef USE_ROCM
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    return float_to_bf16(f);
#endif
  }
  __device__ __forceinline__ static float round(float f) { return bf16_to_float(to_bits(f)); }
  // Packed add / multiply of two bf16 pairs, rounded once: equal to torch's fp32 op + cast
  // (see pair_op_via_fp32).
  __device__ __forceinline__ static uint32_t add2(uint32_t a, uint32_t b) {
#ifndef USE_ROCM
    const __nv_bfloat162 r = __hadd2(bit_cast_u32<__nv_bfloat162>(a), bit_cast_u32<__nv_bfloat162>(b));
    return bit_cast_to_u32(r);
#else
    return pair_op_via_fp32<Elem<Bf16Tag>, PairOp::kAdd>(a, b);
#endif
  }
  __device__ __forceinline__ static uint32_t mul2(uint32_t a, uint32_t b) {
#ifndef USE_ROCM
    const __nv_bfloat162 r = __hmul2(bit_cast_u32<__nv_bfloat162>(a), bit_cast_u32<__nv_bfloat162>(b));
    return bit_cast_to_u32(r);
#else
    return pair_op_via_fp32<Elem<Bf16Tag>, PairOp::kMul>(a, b);
#endif
  }
  __device__ __forceinline__ static float load(const void* base, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  __device__ __forceinline__ static void store(void* base, int64_t i, float f) {
    static_cast<uint16_t*>(base)[i] = to_bits(f);
  }
};

template <>
struct Elem<Fp16Tag> {
  static constexpr int kBytes = 2;
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static float from_bits(uint32_t h) {
#ifndef USE_ROCM
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
    return half_to_float(static_cast<uint16_t>(h));
#endif
  }
  __device__ __forceinline__ static uint16_t to_bits(float f) {
#ifndef USE_ROCM
    return __half_as_ushort(__float2half_rn(f));
#else
    return float_to_half(f);
#endif
  }
  __device__ __forceinline__ static void unpack(uint32_t w, float* f) {
    f[0] = from_bits(w & 0xffffu);
    f[1] = from_bits(w >> 16);
  }
  __device__ __forceinline__ static uint32_t pack(const float* f) {
#ifndef USE_ROCM
    const __half2 h = __floats2half2_rn(f[0], f[1]);  // one cvt.rn.f16x2.f32 on sm_80+
    return static_cast<uint32_t>(__half_as_ushort(h.x)) |
           (static_cast<uint32_t>(__half_as_ushort(h.y)) << 16);
#else
    return static_cast<uint32_t>(float_to_half(f[0])) |
           (static_cast<uint32_t>(float_to_half(f[1])) << 16);
#endif
  }
  __device__ __forceinline__ static float round(float f) { return from_bits(to_bits(f)); }
  // Packed add / multiply of two fp16 pairs, rounded once (see pair_op_via_fp32).
  __device__ __forceinline__ static uint32_t add2(uint32_t a, uint32_t b) {
#ifndef USE_ROCM
    return bit_cast_to_u32(__hadd2(bit_cast_u32<__half2>(a), bit_cast_u32<__half2>(b)));
#else
    return pair_op_via_fp32<Elem<Fp16Tag>, PairOp::kAdd>(a, b);
#endif
  }
  __device__ __forceinline__ static uint32_t mul2(uint32_t a, uint32_t b) {
#ifndef USE_ROCM
    return bit_cast_to_u32(__hmul2(bit_cast_u32<__half2>(a), bit_cast_u32<__half2>(b)));
#else
    return pair_op_via_fp32<Elem<Fp16Tag>, PairOp::kMul>(a, b);
#endif
  }
  __device__ __forceinline__ static float load(const void* base, int64_t i) {
    return from_bits(static_cast<const uint16_t*>(base)[i]);
  }
  __device__ __forceinline__ static void store(void* base, int64_t i, float f) {
    static_cast<uint16_t*>(base)[i] = to_bits(f);
  }
};

// Calls f(Tag{}) with the tag of a runtime DType (the launchers' one switch over element types).
template <class F>
cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(Fp32Tag{});
    case DType::kFloat16:
      return f(Fp16Tag{});
    case DType::kBFloat16:
      return f(Bf16Tag{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace fused_llm
