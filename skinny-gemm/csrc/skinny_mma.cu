// skinny-gemm's plain-load tensor-core GEMV (skinny_mma.h says what it computes and why): its
// compiled configurations and the launcher's checks; the kernel is skinny_mma_kernel.cuh,
// instantiated per input dtype in skinny_mma_{bf16,f16,e4m3}.cu.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.h"
#include "skinny_mma.h"
#include "skinny_mma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {

bool skinny_mma_config_supported(const SkinnyMmaConfig& c) {
  const SkinnyMmaConfig* configs = nullptr;
  const int n = skinny_mma_compiled_configs(&configs);
  for (int i = 0; i < n; ++i) {
    const SkinnyMmaConfig& k = configs[i];
    if (c.row_groups == k.row_groups && c.unroll == k.unroll && c.warps == k.warps && c.stages == k.stages &&
        c.split == k.split && c.shared_x == k.shared_x && c.segments == k.segments && c.wgmma == k.wgmma) {
      return true;
    }
  }
  return false;
}

int skinny_mma_compiled_configs(const SkinnyMmaConfig** configs) {
#define SKINNY_MMA_ENTRY(RG, U, WARPS) SkinnyMmaConfig{RG, U, WARPS, 0, 1, 0, 0},
#define SKINNY_MMA_STAGED_ENTRY(RG, WARPS, STAGES, SPLIT) \
  SkinnyMmaConfig{RG, mma_detail::kStagedChunks, WARPS, STAGES, SPLIT, 0, 0},
#define SKINNY_MMA_XS_ENTRY(RG, WARPS, STAGES, SPLIT) \
  SkinnyMmaConfig{RG, mma_detail::kStagedChunks, WARPS, STAGES, SPLIT, 1, 0},
#define SKINNY_MMA_ROWS_ENTRY(S, RI, U, WARPS) SkinnyMmaConfig{RI, U, WARPS, 0, 1, 0, S},
// The wgmma loop's split is a launch argument: each compiled shape at split 1-4.
#define SKINNY_WGMMA_ENTRY(S, U, WARPS, STAGES)                                                 \
  SkinnyMmaConfig{1, U, WARPS, STAGES, 1, 0, S, 1}, SkinnyMmaConfig{1, U, WARPS, STAGES, 2, 0, S, 1}, \
      SkinnyMmaConfig{1, U, WARPS, STAGES, 3, 0, S, 1}, SkinnyMmaConfig{1, U, WARPS, STAGES, 4, 0, S, 1},
  static const SkinnyMmaConfig kCompiled[] = {SKINNY_MMA_CONFIGS(SKINNY_MMA_ENTRY)
                                                  SKINNY_MMA_STAGED_CONFIGS(SKINNY_MMA_STAGED_ENTRY)
                                                      SKINNY_MMA_SHARED_X_CONFIGS(SKINNY_MMA_XS_ENTRY)
                                                          SKINNY_MMA_ROW_RUN_CONFIGS(SKINNY_MMA_ROWS_ENTRY)
                                                              SKINNY_WGMMA_CONFIGS(SKINNY_WGMMA_ENTRY)};
#undef SKINNY_WGMMA_ENTRY
#undef SKINNY_MMA_ROWS_ENTRY
#undef SKINNY_MMA_XS_ENTRY
#undef SKINNY_MMA_STAGED_ENTRY
#undef SKINNY_MMA_ENTRY
  *configs = kCompiled;
  return int(sizeof(kCompiled) / sizeof(kCompiled[0]));
}

cudaError_t skinny_mma_launch(const SkinnyMmaParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const bool fp8 = p.dtype == DType::kFloat8E4M3;
  const bool sixteen = p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16;
  const bool out_ok = fp8 ? p.out_dtype != DType::kFloat8E4M3 : p.out_dtype == p.dtype;
  const bool bias_ok = p.bias == nullptr || p.bias_dtype == DType::kFloat32 ||
                       (fp8 ? p.bias_dtype != DType::kFloat8E4M3 : p.bias_dtype == p.dtype);
  const bool scales_ok = !fp8 || (p.x_scale != nullptr && p.w_scale != nullptr);
  const int64_t elem = dtype_bytes(p.dtype), step_bytes = mma_step_bytes(p.config);
  const int64_t k_bytes = p.k * elem;
  if (!(fp8 || sixteen) || !out_ok || !bias_ok || !scales_ok || p.m < 0 || p.m > mma_max_m(p.config) || p.n < 0 ||
      p.n > INT32_MAX || !skinny_mma_config_supported(p.config) || p.k <= 0 || k_bytes % step_bytes != 0 ||
      k_bytes > INT32_MAX || !aligned(p.x, 16) || !aligned(p.w, 16) || (p.w_row_stride * elem) % 16 != 0 ||
      (p.m > 1 && (p.x_row_stride * elem) % 16 != 0)) {
    return cudaErrorNotSupported;
  }
  // The row-run loop addresses rows with 32-bit byte strides.
  if (p.config.segments != 0 && p.config.wgmma == 0 &&
      (p.w_row_stride * elem > INT32_MAX || (p.m > 1 && p.x_row_stride * elem > INT32_MAX))) {
    return cudaErrorNotSupported;
  }
  int cc = 0;
  if (const cudaError_t err = compute_capability(&cc); err != cudaSuccess) return err;
  if (cc < (fp8 ? 89 : 80)) return cudaErrorNotSupported;  // mma.sync bf16 / e4m3
  if (p.config.split > 1 && cc < 90) return cudaErrorNotSupported;  // thread-block clusters
  if (p.config.wgmma != 0 && cc != 90) return cudaErrorNotSupported;  // wgmma: the 9.0a build
  MmaArgs a;
  a.x = static_cast<const uint8_t*>(p.x);
  a.x_row_bytes = p.x_row_stride * elem;
  a.w = static_cast<const uint8_t*>(p.w);
  a.w_row_bytes = p.w_row_stride * elem;
  a.bias = p.bias;
  a.bias_dtype = p.bias_dtype;
  a.x_scale = p.x_scale;
  a.w_scale = p.w_scale;
  a.x_scale_step = p.x_scale_per_token ? 1 : 0;
  a.w_scale_step = p.w_scale_per_row ? 1 : 0;
  a.out = p.out;
  a.out_dtype = p.out_dtype;
  a.out_row_stride = p.out_row_stride;
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.steps = static_cast<int>(k_bytes / step_bytes);
  const bool wgmma = p.config.wgmma != 0;  // the wgmma loop's units, or the mma.sync loops'
  switch (p.dtype) {
    case DType::kBFloat16:
      return (wgmma ? launch_wgmma_bf16 : launch_mma_bf16)(p.config, a, stream);
    case DType::kFloat16:
      return (wgmma ? launch_wgmma_f16 : launch_mma_f16)(p.config, a, stream);
    default:
      return (wgmma ? launch_wgmma_e4m3 : launch_mma_e4m3)(p.config, a, stream);
  }
}

}  // namespace skinny_gemm
}  // namespace fused_llm
