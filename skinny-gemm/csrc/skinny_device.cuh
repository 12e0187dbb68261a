// Device helpers both compiled kernels of skinny-gemm share (skinny_tma_kernel.cuh, skinny_mma.cu):
// one tensor-core step on fragments in registers, and the epilogue's element access by DType.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "skinny_tma.h"  // DType

namespace fused_llm {
namespace skinny_gemm {

// One 32-byte K step: c += A (16 rows) x B (8 columns), fp32 accumulators: mma.sync m16n8k16 for
// 16-bit inputs (sm_80+), m16n8k32 for e4m3 (its sm_90 code unpacks to f16 pairs).
template <DType kIn>
__device__ __forceinline__ void mma_step(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kIn == DType::kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else if constexpr (kIn == DType::kFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(kIn == DType::kFloat8E4M3, "an input dtype of the kernels");
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Element i of a bias of dtype t (float16, bfloat16 or float32), in fp32.
__device__ __forceinline__ float load_bias(const void* p, DType t, int64_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  if (t == DType::kBFloat16) return __uint_as_float(uint32_t(bits) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(bits));
  return f;
}

// Stores v, rounded once, as element i of out (float16, bfloat16 or float32).
__device__ __forceinline__ void store_out(void* p, DType t, int64_t i, float v) {
  if (t == DType::kFloat32) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint16_t bits;
  if (t == DType::kBFloat16) {
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
  }
  static_cast<uint16_t*>(p)[i] = bits;
}

}  // namespace skinny_gemm
}  // namespace fused_llm
