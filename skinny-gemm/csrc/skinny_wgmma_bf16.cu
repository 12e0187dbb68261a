// skinny-gemm's wgmma loop for bfloat16 inputs: its configurations instantiated in a unit of their own
// (skinny_wgmma_kernel.cuh), built for 9.0a only, so the input dtypes compile in parallel.
#include "skinny_wgmma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {

cudaError_t launch_wgmma_bf16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
  return launch_wgmma_dtype<DType::kBFloat16>(c, a, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
