// skinny-gemm's tensor-core GEMV for bfloat16 inputs: its configurations instantiated in a unit of
// their own (skinny_mma_kernel.cuh), so the input dtypes compile in parallel.
#include "skinny_mma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {

cudaError_t launch_mma_bf16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
  return launch_mma_dtype<DType::kBFloat16>(c, a, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
