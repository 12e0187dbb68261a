// generated from common/csrc/fp8.cuh by `fused-llm sync`, do not edit
// FP8 (e4m3) quantization on the GPU (CUDA; hipified for ROCm gfx942): the scale arithmetic,
// the clamp and the conversion, with torch's reference order
//   q = e4m3(clamp(y * (1 / scale), +-fp8_max)),  scale = max(min(amax, ub) / fp8_max, floor).
#pragma once

#include <cuda_runtime.h>
#ifndef USE_ROCM
#include <cuda_fp8.h>
#endif

#include <cstdint>

#include "kernel_types.h"
#include "numerics.h"
#include "reduce.cuh"
#include "vec.cuh"

namespace fused_llm {

// Quantization modes and formats as ints, for template arguments.
constexpr int kQNone = static_cast<int>(Quant::kNone);
constexpr int kQStatic = static_cast<int>(Quant::kStatic);
constexpr int kQToken = static_cast<int>(Quant::kDynamicToken);
constexpr int kQGroup = static_cast<int>(Quant::kDynamicGroup);
constexpr int kFmtFn = static_cast<int>(Fp8Format::kE4M3FN);
constexpr int kFmtFnuz = static_cast<int>(Fp8Format::kE4M3FNUZ);

// IEEE division even under --use_fast_math, so scales match torch's `amax / fp8_max` and `1 / s`.
__device__ __forceinline__ float div_rn(float a, float b) {
#ifndef USE_ROCM
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Clamp that keeps NaN (torch.clamp propagates it; fminf/fmaxf would drop it).
__device__ __forceinline__ float clamp_fp8(float v, float fp8_max) {
  return v < -fp8_max ? -fp8_max : (v > fp8_max ? fp8_max : v);
}

// The clamp before an e4m3 conversion. The hardware e4m3fn conversion saturates by itself
// (.satfinite: out-of-range and inf go to +-448, NaN stays NaN, exactly what the clamp does),
// so it is skipped there: 4 instructions per element on kernels that are close to issue-bound
// at decode sizes.
template <int FMT>
__device__ __forceinline__ float fp8_clamp_input(float v, float fp8_max) {
#ifndef USE_ROCM
  if constexpr (FMT == kFmtFn) return v;
#endif
  return clamp_fp8(v, fp8_max);
}

// Two clamped values -> two e4m3 bytes (a in the low byte).
template <int FMT>
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
#ifndef USE_ROCM
  if constexpr (FMT == kFmtFn) {
    // cvt.rn.satfinite.e4m3x2.f32 on sm_89+, emulated by cuda_fp8.hpp below that.
    return static_cast<uint32_t>(
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
  }
#endif
  if constexpr (FMT == kFmtFn) {
    return static_cast<uint32_t>(float_to_e4m3fn(a)) |
           (static_cast<uint32_t>(float_to_e4m3fn(b)) << 8);
  } else {
    return static_cast<uint32_t>(float_to_e4m3fnuz(a)) |
           (static_cast<uint32_t>(float_to_e4m3fnuz(b)) << 8);
  }
}

// One clamped value -> one e4m3 byte, the format chosen at run time (the scalar paths).
__device__ __forceinline__ uint8_t fp8_one(float a, int fmt) {
  return static_cast<uint8_t>(fmt == kFmtFn ? fp8x2<kFmtFn>(a, 0.0f) : fp8x2<kFmtFnuz>(a, 0.0f));
}

// kVec values (4 or 8) times inv, clamped and converted: kVec e4m3 bytes packed into kVec / 4
// words, element k at byte k (little-endian), ready for store_vec.
template <int kVec, int FMT>
__device__ __forceinline__ Vec<kVec / 4> fp8_pack_vec(const float* f, float inv, float fp8_max) {
  static_assert(kVec == 4 || kVec == 8, "vectors of 4 or 8 elements");
  Vec<kVec / 4> q;
#pragma unroll
  for (int k = 0; k < kVec / 4; ++k) {
    const uint32_t lo = fp8x2<FMT>(fp8_clamp_input<FMT>(f[4 * k] * inv, fp8_max),
                                   fp8_clamp_input<FMT>(f[4 * k + 1] * inv, fp8_max));
    const uint32_t hi = fp8x2<FMT>(fp8_clamp_input<FMT>(f[4 * k + 2] * inv, fp8_max),
                                   fp8_clamp_input<FMT>(f[4 * k + 3] * inv, fp8_max));
    q.w[k] = lo | (hi << 16);
  }
  return q;
}

// The dynamic scale of a row or group from its max |y|: max(min(amax, ub) / fp8_max, min_scale),
// the bound applying when ub > 0; min_scale = kMinScaleFactor / fp8_max. The caller multiplies
// by div_rn(1, scale), as torch's reference does.
__device__ __forceinline__ float fp8_scale(float amax, float scale_ub, float fp8_max, float min_scale) {
  if (scale_ub > 0.0f) amax = fminf(amax, scale_ub);
  return fmaxf(div_rn(amax, fp8_max), min_scale);
}

// Vectors of `vec` elements per quantization group in the vector kernels, or 0 when a group is
// not a power-of-two number of whole vectors within one warp (the kernels take the group max with
// xor shuffles over the group's adjacent lanes).
inline int group_vectors(int group_size, int vec) {
  if (group_size % vec != 0) return 0;
  const int n = group_size / vec;
  return n <= kWarpSize && (n & (n - 1)) == 0 ? n : 0;
}

}  // namespace fused_llm
