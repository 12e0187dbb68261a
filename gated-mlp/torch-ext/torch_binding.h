// Torch-facing entry points of gated-mlp's compiled ops (schemas in torch_binding.cpp). Defined
// and registered only in CUDA builds: the CuTe kernels are CUDA-only, and every other path of
// the package (Triton on CUDA / ROCm, plain torch on CPU) is a Python custom op.
#pragma once

#include <optional>
#include <string_view>

#include <ATen/ATen.h>

// out [M, U] = act(x w_gate^T + bias_gate) * (x w_up^T + bias_up), x [M, D], w_* [U, D].
// sm80: mma.sync + cp.async (capability >= 8.0); sm90: TMA + wgmma (capability 9.0 only).
void gated_mlp_sm80(at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                    const std::optional<at::Tensor>& bias_gate, const std::optional<at::Tensor>& bias_up,
                    std::string_view activation);
void gated_mlp_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                    const std::optional<at::Tensor>& bias_gate, const std::optional<at::Tensor>& bias_up,
                    std::string_view activation);
