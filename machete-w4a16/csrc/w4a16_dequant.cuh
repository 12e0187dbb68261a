// The device-side dequantization both compiled kernels share (w4a16_mma.cu, w4a16_wgmma.cu): the
// package's nibble order (slots hold columns 0, 2, 4, 6, 1, 3, 5, 7 of a word) makes the codes of
// columns (2i, 2i + 1) of a word one shift and one AND-OR away from a register of two 16-bit
// values 128 + q (bf16) or 1024 + q (fp16), exactly; subtracting base + z is exact and the
// multiply by the scale rounds once: dequantize()'s value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fused_llm {
namespace machete_w4a16 {

template <class T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // bf16 128.0 twice: 128 + q for q < 16
  static constexpr float kBase = 128.0f;
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  __device__ static __nv_bfloat16 from_bits(unsigned short b) { return __ushort_as_bfloat16(b); }
};
template <>
struct Elem<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // fp16 1024.0 twice: 1024 + q
  static constexpr float kBase = 1024.0f;
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
  __device__ static __half from_bits(unsigned short b) { return __ushort_as_half(b); }
};

template <class T2>
__device__ __forceinline__ uint32_t as_u32(T2 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// (a & mask) | magic as one LOP3. Written in C++, nvcc emits an AND and an OR with two immediates
// and ptxas keeps them two LOP3s (the instruction takes one 32-bit immediate); as one lop3 with
// both constants as operands ptxas holds one in a register, loaded once. The dequantization is
// most of the small-M kernel's instructions, and on the H200 that kernel is bound by its issue
// rate (Nsight Compute at 70B gate/up, M = 1: 0.71 issues a cycle per scheduler, DRAM at 67%):
// 410 -> 346 SASS instructions per window of a 32-row warp, and a copy of its loop (TMA ring,
// M = 1) 75.1 -> 65.4 us at 70B gate/up, 23.4 -> 21.0 at 8B gate/up, 8.1 -> 7.6 at 8B QKV
// (benchmarks/results/dequant_lop3_probe_*).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));  // 0xEA: (a & b) | c
  return r;
}

// Codes of columns (2i, 2i + 1) of a packed word (nibble slots i, i + 4) -> (q - z) * s, two
// 16-bit values in one register (the low half the even column); zz = base + z.
template <class T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, int i, typename Elem<T>::T2 zz,
                                                 typename Elem<T>::T2 s) {
  using T2 = typename Elem<T>::T2;
  const uint32_t bits = and_or(word >> (4 * i), 0x000F000Fu, Elem<T>::kMagic);
  const T2 h = *reinterpret_cast<const T2*>(&bits);
  return as_u32<T2>(__hmul2(__hsub2(h, zz), s));  // exact difference, one rounding
}

template <class T>
__device__ __forceinline__ typename Elem<T>::T2 splat(T v) {
  typename Elem<T>::T2 r;
  r.x = v;
  r.y = v;
  return r;
}

// base + z, twice: the subtrahend of dequant_pair for zero point z (8: the symmetric uint4b8).
template <class T>
__device__ __forceinline__ typename Elem<T>::T2 zero_pair(int z) {
  return splat<T>(Elem<T>::from_float(Elem<T>::kBase + static_cast<float>(z)));
}

}  // namespace machete_w4a16
}  // namespace fused_llm
