// Framework-free interface of the swiglu-fp8 kernels (no torch, no CUDA headers).
//
// x is [rows, 2d]: gate = x[:, :d], up = x[:, d:] (the vLLM / kernels-community layout).
//   h   = T(act(float(gate)))          act in fp32, rounded to the input dtype T
//   y   = T(float(h) * float(up))      transformers' `act(gate) * up` rounding order
//   out = y                                        (Quant::kNone)
//   out = e4m3(clamp(float(y) * inv_scale))        (static / dynamic FP8)
// act: silu(g) = g / (1 + exp(-g)); gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)));
// gelu(g) = 0.5 g (1 + erf(g / sqrt(2))).
// Ungated (gated = false, Quant::kNone only): x is [rows, d] and out = T(act(x)), the bare
// activation transformers' SiLU / GeluTanh / GeLU modules compute.
#pragma once

#include <cstdint>

#include "common/kernel_types.h"

namespace fused_llm {
namespace swiglu_fp8 {

// DType, Fp8Format, Quant, kMinScaleFactor and fp8_max_value are fused_llm's, shared with
// rmsnorm-fp8: common/kernel_types.h.

enum class Activation : int32_t { kSilu = 0, kGeluTanh = 1, kGelu = 2 };

struct SwigluParams {
  int64_t rows = 0;  // flattened leading dims, >= 0
  int64_t d = 0;     // output width; the input row holds 2 * d elements, d >= 1
  DType dtype = DType::kBFloat16;
  Activation act = Activation::kSilu;
  bool gated = true;  // false: no up half, out = T(act(x)); x is [rows, d]; Quant::kNone only

  const void* x = nullptr;  // [rows, 2d] ([rows, d] ungated), last dim contiguous
  int64_t x_row_stride = 0;  // elements
  void* out = nullptr;       // [rows, d]: dtype T (kNone) or one fp8 byte per element
  int64_t out_row_stride = 0;

  Quant quant = Quant::kNone;
  Fp8Format fp8_format = Fp8Format::kE4M3FN;
  const float* static_scale = nullptr;  // [1], kStatic; q = y * (1 / static_scale[0])
  float* scales = nullptr;              // kDynamicToken: [rows]; kDynamicGroup: [rows, d / group_size]
  int64_t scales_row_stride = 0;        // in floats
  int64_t scales_group_stride = 0;      // in floats
  int32_t group_size = 0;               // 64 or 128 (kDynamicGroup)
  float scale_ub = 0.0f;                // > 0: bounds |y|max of a row/group before it becomes a scale
};

// GPU (CUDA or HIP): enqueues on `stream`; 0 on success, else the cudaError_t / hipError_t value.
int swiglu_launch_gpu(const SwigluParams& p, void* stream);
const char* gpu_error_string(int code);

// CPU: rows [row_begin, row_end); the caller parallelizes over row ranges.
void swiglu_cpu(const SwigluParams& p, int64_t row_begin, int64_t row_end);

}  // namespace swiglu_fp8
}  // namespace fused_llm
