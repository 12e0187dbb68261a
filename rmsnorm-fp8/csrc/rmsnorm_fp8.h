// Framework-free interface of the rmsnorm-fp8 kernels (no torch, no CUDA headers).
//
// One parameter block describes every variant the package exposes:
//   v   = x + residual            (rounded to the input dtype, written to residual_out)   [fused add]
//   v   = x                                                                              [plain]
//   n   = T(v * rsqrt(mean(v^2) + eps))          statistics in fp32, T = input dtype
//   y   = T(float(n) * float(weight))            transformers' LlamaRMSNorm rounding order
//   out = y                                      (Quant::kNone)
//   out = e4m3(clamp(float(y) * inv_scale))      (static / dynamic FP8)
// Rounding to T twice is deliberate: it is what LlamaRMSNorm does in eager mode, so a
// kernelized model matches eager, and the FP8 input equals the unfused rmsnorm->quant input.
#pragma once

#include <cstdint>

#include "common/kernel_types.h"

namespace fused_llm {
namespace rmsnorm_fp8 {

// DType, Fp8Format, Quant, kMinScaleFactor and fp8_max_value are fused_llm's, shared with
// swiglu-fp8: common/kernel_types.h.

struct RmsNormParams {
  int64_t rows = 0;    // flattened leading dims, >= 0
  int64_t hidden = 0;  // H, >= 1
  DType dtype = DType::kBFloat16;  // of x, residual, weight, residual_out, and out when kNone

  // Inputs. Strides are in elements; the last dimension is always contiguous.
  const void* x = nullptr;  // [rows, H]
  int64_t x_row_stride = 0;
  const void* residual = nullptr;  // [rows, H] or nullptr for plain RMSNorm
  int64_t residual_row_stride = 0;
  const void* weight = nullptr;  // [H], contiguous
  float eps = 1e-6f;

  // Outputs. residual_out is required iff residual != nullptr; it may alias residual and
  // out may alias x (each element is read before it is written, by the same thread).
  void* residual_out = nullptr;  // [rows, H] dtype T
  int64_t residual_out_row_stride = 0;
  void* out = nullptr;  // [rows, H], dtype T (kNone) or one fp8 byte per element
  int64_t out_row_stride = 0;

  // Quantization.
  Quant quant = Quant::kNone;
  Fp8Format fp8_format = Fp8Format::kE4M3FN;
  const float* static_scale = nullptr;  // [1], kStatic; q = y * (1 / static_scale[0])
  float* scales = nullptr;              // kDynamicToken: [rows]; kDynamicGroup: [rows, H / group_size]
  int64_t scales_row_stride = 0;        // in floats
  int64_t scales_group_stride = 0;      // in floats (1 = row-major, rows = column-major)
  int32_t group_size = 0;               // 64 or 128 for kDynamicGroup
  float scale_ub = 0.0f;                // > 0: bounds |y|max of a row/group before it becomes a scale
};

// GPU (CUDA or HIP): enqueues the kernel on `stream` (a cudaStream_t / hipStream_t).
// Returns 0 on success, else the cudaError_t / hipError_t value; gpu_error_string() names it.
// rows == 0 launches nothing.
int rms_norm_launch_gpu(const RmsNormParams& p, void* stream);
const char* gpu_error_string(int code);

// CPU: processes rows [row_begin, row_end); the caller parallelizes over row ranges.
void rms_norm_cpu(const RmsNormParams& p, int64_t row_begin, int64_t row_end);

}  // namespace rmsnorm_fp8
}  // namespace fused_llm
