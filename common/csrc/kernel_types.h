// Framework-free types of the packages whose kernels write FP8 (rmsnorm-fp8, swiglu-fp8): the
// element types, the e4m3 formats and the quantization modes of their parameter blocks, in
// namespace fused_llm (the packages' own namespaces nest in it, so their code names them
// unqualified). The integer values are part of the interface: the GPU kernels take them as
// template arguments (fp8.cuh).
#pragma once

#include <cstdint>

namespace fused_llm {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// kE4M3FN: OCP e4m3 used by NVIDIA (max 448, NaN = 0x7f/0xff, has -0).
// kE4M3FNUZ: gfx942's e4m3 (exponent bias 8, max 240, NaN = 0x80, no -0).
enum class Fp8Format : int32_t { kE4M3FN = 0, kE4M3FNUZ = 1 };

enum class Quant : int32_t {
  kNone = 0,          // out has dtype T
  kStatic = 1,        // out fp8, one float32 scale read from static_scale[0]
  kDynamicToken = 2,  // out fp8, one scale per row written to scales[row * scales_row_stride]
  kDynamicGroup = 3,  // out fp8, one scale per (row, group of group_size output columns)
};

// Smallest dynamic scale, as a fraction of 1/fp8_max: keeps an all-zero row or group from
// dividing by zero (the same floor vLLM uses: 1 / (fp8_max * 512)).
constexpr float kMinScaleFactor = 1.0f / 512.0f;

inline float fp8_max_value(Fp8Format f) { return f == Fp8Format::kE4M3FN ? 448.0f : 240.0f; }

// Whether the quantization fields of a package's parameter block (quant, static_scale, scales,
// group_size) are complete for rows of `cols` output columns: the launchers' first check.
template <class Params>
bool quant_params_valid(const Params& p, int64_t cols) {
  switch (p.quant) {
    case Quant::kNone:
      return true;
    case Quant::kStatic:
      return p.static_scale != nullptr;
    case Quant::kDynamicToken:
      return p.scales != nullptr;
    case Quant::kDynamicGroup:
      return p.scales != nullptr && p.group_size > 0 && cols % p.group_size == 0;
  }
  return false;
}

// Copies the quantization fields of a parameter block into a kernel's argument struct (the
// same names), with the derived fp8_max and min_scale = kMinScaleFactor / fp8_max.
template <class Args, class Params>
void set_quant_args(Args& a, const Params& p) {
  a.static_scale = p.static_scale;
  a.scales = p.scales;
  a.scales_row_stride = p.scales_row_stride;
  a.scales_group_stride = p.scales_group_stride;
  a.scale_ub = p.scale_ub;
  a.fp8_max = fp8_max_value(p.fp8_format);
  a.min_scale = kMinScaleFactor / a.fp8_max;
  a.group_size = p.group_size;
}

}  // namespace fused_llm
