// skinny-gemm's compiled Hopper kernel, host side: argument rules, the compiled configurations
// and the dispatch to the launcher of each input dtype (skinny_tma_{bf16,f16,e4m3}.cu, which
// instantiate skinny_tma_kernel.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.h"
#include "skinny_tma.h"
#include "skinny_tma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {
namespace {

bool is_16bit(DType t) { return t == DType::kBFloat16 || t == DType::kFloat16; }

// The dtypes of one call: 16-bit x writes its own dtype and takes a bias of it or fp32; FP8
// writes and takes any of the three, and needs both scales.
bool dtypes_supported(const SkinnyTmaParams& p) {
  const bool bias_ok = p.bias == nullptr || is_16bit(p.bias_dtype) || p.bias_dtype == DType::kFloat32;
  if (is_16bit(p.dtype)) {
    return p.out_dtype == p.dtype && (p.bias == nullptr || p.bias_dtype == p.dtype || p.bias_dtype == DType::kFloat32);
  }
  return p.dtype == DType::kFloat8E4M3 && (is_16bit(p.out_dtype) || p.out_dtype == DType::kFloat32) && bias_ok &&
         p.x_scale != nullptr && p.w_scale != nullptr;
}

}  // namespace

bool skinny_tma_config_supported(const SkinnyTmaConfig& c) {
  const SkinnyTmaConfig* configs = nullptr;
  const int n = skinny_tma_compiled_configs(&configs);
  for (int i = 0; i < n; ++i) {
    if (c.tile_n == configs[i].tile_n && c.boxes_k == configs[i].boxes_k && c.stages == configs[i].stages) {
      return c.split >= 1 && c.split <= kMaxSplit;
    }
  }
  return false;
}

int skinny_tma_compiled_configs(const SkinnyTmaConfig** configs) {
#define SKINNY_TMA_ENTRY(TN, BK, ST) SkinnyTmaConfig{TN, BK, ST, kMaxSplit},
  static const SkinnyTmaConfig kCompiled[] = {SKINNY_TMA_CONFIGS(SKINNY_TMA_ENTRY)};
#undef SKINNY_TMA_ENTRY
  *configs = kCompiled;
  return int(sizeof(kCompiled) / sizeof(kCompiled[0]));
}

cudaError_t skinny_tma_launch(const SkinnyTmaParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  // 16 bytes of K: 8 16-bit or 16 FP8 columns (the copy engine's row-stride unit).
  const int64_t k_unit = p.dtype == DType::kFloat8E4M3 ? 16 : 8;
  if (!dtypes_supported(p) || p.m < 0 || p.m > kMaxM || p.n < 0 || p.k < k_unit || p.k % k_unit != 0 ||
      !skinny_tma_config_supported(p.config) || !aligned(p.x, 16) || !aligned(p.w, 16) ||
      p.w_row_stride % k_unit != 0 || (p.m > 1 && p.x_row_stride % k_unit != 0) ||
      cdiv(p.n, p.config.tile_n) * p.config.split > int64_t(INT32_MAX)) {
    return cudaErrorNotSupported;
  }
  int cc = 0;
  if (const cudaError_t err = compute_capability(&cc); err != cudaSuccess) return err;
  if (cc != 90) return cudaErrorNotSupported;  // the kernel's only code is sm_90
  KernelArgs a;
  a.m = p.m;
  a.n = p.n;
  a.k = p.k;
  a.k_stages = cdiv(p.k * (p.dtype == DType::kFloat8E4M3 ? 1 : 2), int64_t(128) * p.config.boxes_k);
  a.split = p.config.split;
  a.out_dtype = p.out_dtype;
  a.bias_dtype = p.bias_dtype;
  a.bias = p.bias;
  a.x_scale = p.x_scale;
  a.w_scale = p.w_scale;
  a.x_scale_step = p.x_scale_per_token ? 1 : 0;
  a.w_scale_step = p.w_scale_per_row ? 1 : 0;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  switch (p.dtype) {
    case DType::kBFloat16:
      return launch_bf16(p, a, stream);
    case DType::kFloat16:
      return launch_f16(p, a, stream);
    default:
      return launch_e4m3(p, a, stream);
  }
}

}  // namespace skinny_gemm
}  // namespace fused_llm
