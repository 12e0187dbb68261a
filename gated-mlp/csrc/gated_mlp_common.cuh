// Helpers shared by gated-mlp's compiled kernels (sm80 and sm90): on the device the activation
// and the packing of two outputs into one 32-bit store; on the host the dynamic shared-memory
// opt-in and the alignment test of the launchers. Header-only; CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/launch.h"  // opt_in_dynamic_smem: a kernel's shared-memory limit, once per device
#include "gated_mlp_params.h"

namespace fused_llm {
namespace gated_mlp {
namespace detail {

// act(g) in fp32. silu(g) = g * sigmoid(g); gelu_tanh(g) = 0.5 g (1 + tanh(z)) = g * sigmoid(2 z),
// z = sqrt(2 / pi) (g + 0.044715 g^3): one exponential either way. Large |g| saturate cleanly
// (exp -> inf gives g / inf = -0, exp -> 0 gives g).
template <int kAct>
__device__ __forceinline__ float gate_act(float g) {
  if constexpr (kAct == static_cast<int>(Activation::kSilu)) {
    return g / (1.0f + __expf(-g));
  } else {
    const float z2 = 1.5957691216057308f * (g + 0.044715f * g * g * g);
    return g / (1.0f + __expf(-z2));
  }
}

// Two values of T (cute::half_t / cute::bfloat16_t) in one word, a at the lower address.
template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const T lo(a), hi(b);  // cutlass's float -> half_t / bfloat16_t conversions round to nearest even
  return static_cast<uint32_t>(lo.raw()) | (static_cast<uint32_t>(hi.raw()) << 16);
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace detail
}  // namespace gated_mlp
}  // namespace fused_llm
