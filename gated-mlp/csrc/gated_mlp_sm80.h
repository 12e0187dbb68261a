// Framework-free interface of gated-mlp's sm80 kernel (CuTe: mma.sync + cp.async + ldmatrix).
//
//   out[m, n] = T( act(sum_k x[m, k] w_gate[n, k] + b_g[n]) * (sum_k x[m, k] w_up[n, k] + b_u[n]) )
//
// T = float16 or bfloat16 (x, w_gate, w_up and out); products summed in fp32, bias, activation
// and product in fp32, one rounding to T. act = silu, or gelu_tanh (tanh approximation:
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), computed as g * sigmoid(2 z)).
//
// CUDA only: the binding includes this header only when compiled for CUDA (CUDA_KERNEL), and
// the .cu is listed in the cuda [kernel.*] section alone, so nothing here is hipified; ROCm and
// the CPU use the package's Triton / plain-torch paths.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fused_llm {
namespace gated_mlp {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };
enum class Activation : int32_t { kSilu = 0, kGeluTanh = 1 };

struct GatedMlpSm80Params {
  int64_t m = 0;  // rows of x and out, >= 0 (0 launches nothing)
  int64_t d = 0;  // reduction size, >= 8 and a multiple of 8 (16-byte cp.async vectors)
  int64_t u = 0;  // output columns, >= 1
  DType dtype = DType::kBFloat16;
  Activation activation = Activation::kSilu;

  // Inputs, row-major with unit-stride rows. Strides are in elements; bases 16-byte aligned and
  // row strides multiples of 8 elements (every 16-byte vector of a row is aligned). w_gate and
  // w_up may be views into one tensor ("concat" halves, "interleaved" rows: row stride 2D).
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

// Tile shape of the kernel (documented in the .cu): 128 rows x 128 columns of each of the two
// accumulators, K steps of 32, 4-stage cp.async pipeline, 256 threads (8 warps).
constexpr int kSm80BlockM = 128;
constexpr int kSm80BlockN = 128;
constexpr int kSm80BlockK = 32;
constexpr int kSm80Stages = 4;
constexpr int kSm80Threads = 256;

// nullptr when the kernel can run `p`, else a message naming the violated precondition (a
// static string: no numbers, the caller formats those). The launcher checks it too and
// returns cudaErrorInvalidValue instead of launching.
const char* gated_mlp_sm80_check(const GatedMlpSm80Params& p);

// Dynamic shared memory one CTA needs (bytes): more than the 48 KiB default, so the launcher
// opts in per kernel; GPUs of capability 8.x allow >= 99 KiB.
int gated_mlp_sm80_smem_bytes();

// Enqueues the kernel on `stream`; m == 0 launches nothing. Returns cudaGetLastError() after
// the launch (cudaSuccess when nothing was launched), or cudaErrorInvalidValue when
// gated_mlp_sm80_check(p) fails. Needs a GPU of capability >= 8.0 (sm_80 code, or its PTX
// JIT-compiled on newer GPUs).
cudaError_t gated_mlp_sm80_launch(const GatedMlpSm80Params& p, cudaStream_t stream);

}  // namespace gated_mlp
}  // namespace fused_llm
