// Framework-free arguments shared by gated-mlp's compiled kernels (gated_mlp_sm80.cu,
// gated_mlp_sm90.cu):
//
//   out[m, n] = T( act(sum_k x[m, k] w_gate[n, k] + b_g[n]) * (sum_k x[m, k] w_up[n, k] + b_u[n]) )
//
// T = float16 or bfloat16 (x, w_gate, w_up and out); products summed in fp32, bias, activation
// and product in fp32, one rounding to T. act = silu, or gelu_tanh (tanh approximation:
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), computed as g * sigmoid(2 z)).
#pragma once

#include <cstdint>

namespace fused_llm {
namespace gated_mlp {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };
enum class Activation : int32_t { kSilu = 0, kGeluTanh = 1 };

struct GatedMlpParams {
  int64_t m = 0;  // rows of x and out, >= 0 (0 launches nothing)
  int64_t d = 0;  // reduction size (each kernel states its own multiple)
  int64_t u = 0;  // output columns, >= 1
  DType dtype = DType::kBFloat16;
  Activation activation = Activation::kSilu;

  // Inputs, row-major with unit-stride rows. Strides are in elements; bases 16-byte aligned and
  // row strides multiples of 8 elements (16-byte vectors / TMA rows). w_gate and w_up may be
  // views into one tensor ("concat" halves, "interleaved" rows: row stride 2D).
  const void* x = nullptr;  // [m, d]
  int64_t x_row_stride = 0;
  const void* w_gate = nullptr;  // [u, d]
  int64_t w_gate_row_stride = 0;
  const void* w_up = nullptr;  // [u, d]
  int64_t w_up_row_stride = 0;
  const float* bias_gate = nullptr;  // [u] fp32, contiguous, or nullptr (no bias)
  const float* bias_up = nullptr;    // [u] fp32, contiguous, or nullptr

  // Output [m, u], row stride >= u, any alignment of T; must not overlap the inputs.
  void* out = nullptr;
  int64_t out_row_stride = 0;
};

}  // namespace gated_mlp
}  // namespace fused_llm
