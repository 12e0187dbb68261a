// Torch-facing entry points of rmsnorm-fp8 (schemas in torch_binding.cpp). Each checks its
// arguments, fills a framework-free RmsNormParams and dispatches to the CPU or GPU launcher.
#pragma once

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

void fused_add_rms_norm(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& x,
                        const at::Tensor& residual, const at::Tensor& weight, double eps);

// Allocating forms (the Python API's fast path; see torch_binding.cpp).
at::Tensor rms_norm_alloc(const at::Tensor& x, const at::Tensor& weight, double eps);

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_alloc(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const at::Tensor& weight, double eps);

void rms_norm_static_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& scale, double eps);

void fused_add_rms_norm_static_fp8(at::Tensor& out, at::Tensor& residual_out,
                                   const at::Tensor& x, const at::Tensor& residual,
                                   const at::Tensor& weight, const at::Tensor& scale,
                                   double eps);

void rms_norm_dynamic_fp8(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                          const at::Tensor& weight, double eps, int64_t group_size,
                          std::optional<double> scale_ub);

void fused_add_rms_norm_dynamic_fp8(at::Tensor& out, at::Tensor& scales,
                                    at::Tensor& residual_out, const at::Tensor& x,
                                    const at::Tensor& residual, const at::Tensor& weight,
                                    double eps, int64_t group_size,
                                    std::optional<double> scale_ub);
