// Torch-facing entry point of gated-mlp's compiled op (schema in torch_binding.cpp). Defined and
// registered only in CUDA builds: the CuTe sm80 kernel is CUDA-only, and every other path of the
// package (Triton on CUDA / ROCm, plain torch on CPU) is a Python custom op.
#pragma once

#include <optional>
#include <string_view>

#include <ATen/ATen.h>

// out [M, U] = act(x w_gate^T + bias_gate) * (x w_up^T + bias_up), x [M, D], w_* [U, D].
void gated_mlp_sm80(at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                    const std::optional<at::Tensor>& bias_gate, const std::optional<at::Tensor>& bias_up,
                    std::string_view activation);
