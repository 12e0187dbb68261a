// CPU-side helpers of the FP8-writing packages (framework-free C++): element access by DType
// and the FP8 quantization of one value, with the GPU kernels' rounding order (see
// kernel_types.h for the types, numerics.h for the conversions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_types.h"
#include "numerics.h"

namespace fused_llm {
namespace cpu {

// Element access by dtype: load to fp32, store with RNE rounding to the storage type.
template <DType D>
struct Elem;
template <>
struct Elem<DType::kFloat32> {
  using Storage = float;
  static float load(Storage v) { return v; }
  static Storage store(float f) { return f; }
};
template <>
struct Elem<DType::kFloat16> {
  using Storage = uint16_t;
  static float load(Storage v) { return half_to_float(v); }
  static Storage store(float f) { return float_to_half(f); }
};
template <>
struct Elem<DType::kBFloat16> {
  using Storage = uint16_t;
  static float load(Storage v) { return bf16_to_float(v); }
  static Storage store(float f) { return float_to_bf16(f); }
};

// Round-trip through the storage type: the value T(f) as fp32.
template <DType D>
float round_to(float f) {
  return Elem<D>::load(Elem<D>::store(f));
}

inline uint8_t to_fp8(float f, Fp8Format fmt) {
  return fmt == Fp8Format::kE4M3FN ? float_to_e4m3fn(f) : float_to_e4m3fnuz(f);
}

// e4m3(clamp(v * inv_scale, +-fp8_max)): torch's reference order (multiply by the reciprocal
// scale, clamp, convert). NaN passes the clamp (std::max/min keep their first argument when the
// comparison is false) and converts to NaN, as torch.clamp + .to() do.
inline uint8_t quantize_fp8(float v, float inv_scale, float fp8_max, Fp8Format fmt) {
  return to_fp8(std::min(std::max(v * inv_scale, -fp8_max), fp8_max), fmt);
}

// The dynamic scale of the n values y[0..n): max(min(max |y|, ub) / fp8_max, floor), the ub
// applying when > 0 (kMinScaleFactor: the floor that keeps an all-zero row finite).
inline float dynamic_fp8_scale(const float* y, int64_t n, float scale_ub, float fp8_max) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(y[i]));
  if (scale_ub > 0.f) amax = std::min(amax, scale_ub);
  return std::max(amax / fp8_max, kMinScaleFactor / fp8_max);
}

// Calls f(std::integral_constant<DType, D>{}) with the runtime dtype as a constant (the CPU entry
// points' one switch over element types).
template <class F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(std::integral_constant<DType, DType::kFloat32>{});
    case DType::kFloat16:
      return f(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16:
      return f(std::integral_constant<DType, DType::kBFloat16>{});
  }
}

}  // namespace cpu
}  // namespace fused_llm
