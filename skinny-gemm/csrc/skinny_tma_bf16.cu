// skinny-gemm's compiled Hopper kernel for bfloat16 inputs: its shapes instantiated in a unit of
// their own (skinny_tma_kernel.cuh), so the input dtypes compile in parallel.
#include "skinny_tma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {

cudaError_t launch_bf16(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  return launch_dtype<DType::kBFloat16>(p, a, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
