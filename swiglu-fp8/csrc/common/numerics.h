// generated from common/csrc/numerics.h by `fused-llm sync`, do not edit
// Framework-free scalar conversions shared by the CPU kernels and the GPU kernels.
// Every conversion rounds to nearest, ties to even, exactly like torch's `.to(dtype)`, so the
// CPU backend is bit-identical to a torch reference that casts the same fp32 values. The CUDA
// kernels prefer a hardware conversion where one exists (dtype.cuh, fp8.cuh) and use these for
// the rest; the ROCm and CPU paths use them throughout.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FLLM_HD __host__ __device__ __forceinline__
#else
#define FLLM_HD inline
#endif

namespace fused_llm {

FLLM_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FLLM_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---- bfloat16 ----------------------------------------------------------------------------
FLLM_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

FLLM_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// ---- float16 (IEEE binary16) -------------------------------------------------------------
FLLM_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  // subnormal: value = mant * 2^-24, exact in fp32
  float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

FLLM_HD uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504 -> inf
  if (a < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    // value / 2^-24 rounded to nearest even; a float add does exactly that at this magnitude.
    const float scaled = bits_float(a) * 16777216.0f;  // * 2^24
    const uint32_t mant = static_cast<uint32_t>(scaled + 0.0f);
    const float frac = scaled - static_cast<float>(mant);
    uint32_t r = mant;
    if (frac > 0.5f || (frac == 0.5f && (mant & 1u))) r += 1;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// ---- float8 e4m3 -------------------------------------------------------------------------
// Saturating, round-to-nearest-even conversion of fp32 to e4m3 bits. `bias` is 7 for e4m3fn
// and 8 for e4m3fnuz; `max_bits` is the largest finite magnitude (0x7e = 448 for fn,
// 0x7f = 240 for fnuz). Callers clamp to +-max before converting, as torch's reference does.
FLLM_HD uint8_t float_to_e4m3_generic(float f, int bias, uint32_t max_bits, bool fnuz) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fnuz ? 0x80u : static_cast<uint8_t>(sign | 0x7fu);  // NaN
  const float af = bits_float(a);
  // Smallest normal exponent is 1 - bias; below it the grid is uniform with step 2^(-bias-2).
  const int min_normal_exp = 1 - bias;
  uint32_t out;
  const int e = static_cast<int>(a >> 23) - 127;
  if (a == 0) {
    out = 0;
  } else if (e < min_normal_exp) {
    // subnormal: round af / 2^(min_normal_exp - 3) to an integer mantissa (0..8, 8 = smallest normal)
    const float step_inv = bits_float(static_cast<uint32_t>(127 - (min_normal_exp - 3)) << 23);
    const float scaled = af * step_inv;  // exact: power-of-two scale
    uint32_t m = static_cast<uint32_t>(scaled);
    const float frac = scaled - static_cast<float>(m);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m += 1;
    out = m;  // m == 8 encodes exponent field 1, mantissa 0: still correct bits
  } else {
    // normal: keep 3 mantissa bits, round to nearest even on the dropped 20 bits
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    const int re = static_cast<int>(r >> 23) - 127;
    const uint32_t mant = (r >> 20) & 0x7u;
    const int ef = re + bias;
    if (ef > 15) {
      out = max_bits;
    } else {
      out = (static_cast<uint32_t>(ef) << 3) | mant;
      if (out > max_bits) out = max_bits;  // saturate (values past max round down to max)
    }
  }
  if (fnuz && out == 0) return 0;  // fnuz has no negative zero (0x80 is NaN)
  return static_cast<uint8_t>(sign | out);
}

FLLM_HD uint8_t float_to_e4m3fn(float f) { return float_to_e4m3_generic(f, 7, 0x7eu, false); }
FLLM_HD uint8_t float_to_e4m3fnuz(float f) { return float_to_e4m3_generic(f, 8, 0x7fu, true); }

}  // namespace fused_llm
