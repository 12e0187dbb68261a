// Torch-facing entry points of swiglu-fp8 (schemas in torch_binding.cpp). Each checks its
// arguments, fills a framework-free SwigluParams and dispatches to the CPU or GPU launcher.
// activation: 0 silu, 1 gelu_tanh, 2 gelu (fused_llm::swiglu_fp8::Activation).
#pragma once

#include <optional>

#include <ATen/ATen.h>

// The bare activation, out = act(x) in x's dtype (x, out: [rows, d]); op "activation".
void activation_only(at::Tensor& out, const at::Tensor& x, int64_t activation);

void silu_and_mul(at::Tensor& out, const at::Tensor& x, int64_t activation);

// silu_and_mul allocating its [..., d] output, for a contiguous x (see torch_binding.cpp).
at::Tensor silu_and_mul_alloc(const at::Tensor& x, int64_t activation);

void silu_and_mul_static_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
                             int64_t activation);

void silu_and_mul_dynamic_fp8(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                              int64_t group_size, std::optional<double> scale_ub,
                              int64_t activation);
