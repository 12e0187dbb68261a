// skinny-gemm's compiled Hopper kernel for float8 e4m3fn inputs: its shapes instantiated in a unit of
// their own (skinny_tma_kernel.cuh), so the input dtypes compile in parallel.
#include "skinny_tma_kernel.cuh"

namespace fused_llm {
namespace skinny_gemm {

cudaError_t launch_e4m3(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  return launch_dtype<DType::kFloat8E4M3>(p, a, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
