// Torch binding of swiglu-fp8: schemas, argument checks (the Python layer checks first and
// with friendlier messages; these keep direct torch.ops callers safe), dispatch.
#include "torch_binding.h"

#include <torch/library.h>

#include <vector>

#include "common/binding_utils.h"
#include "registration.h"
#include "swiglu_fp8.h"

namespace sg = fused_llm::swiglu_fp8;

namespace {

using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)

sg::Activation to_activation(int64_t activation) {
  TORCH_CHECK(activation >= 0 && activation <= 2,
              msg("activation: expected 0 (silu), 1 (gelu_tanh) or 2 (gelu), got ", activation));
  return static_cast<sg::Activation>(activation);
}

// x is [rows, 2d], out [rows, d]: both with a unit-stride last dimension, on x's device.
sg::SwigluParams common_params(const at::Tensor& out, const at::Tensor& x, int64_t activation) {
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [rows, 2 * d] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(
      x.size(1) >= 2 && x.size(1) % 2 == 0,
      msg("x: expected an even last dimension 2 * d >= 2 (gate, up), got shape ", shape_str(x)));
  check_last_dim_contiguous(x, "x");
  const int64_t d = x.size(1) / 2;
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == d,
              msg("out: expected shape [", x.size(0), ", ", d, "], got ", shape_str(out)));
  check_same_device(out, "out", x);
  check_last_dim_contiguous(out, "out");
  sg::SwigluParams p;
  p.rows = x.size(0);
  p.d = d;
  p.dtype = float_dtype_of<fused_llm::DType>(x, "x");
  p.act = to_activation(activation);
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  return p;
}

// The bare activation: x and out both [rows, d], unit-stride last dimension, same dtype/device.
sg::SwigluParams activation_params(const at::Tensor& out, const at::Tensor& x, int64_t activation) {
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [rows, d] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.size(1) >= 1, msg("x: expected a last dimension d >= 1, got shape ", shape_str(x)));
  check_last_dim_contiguous(x, "x");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == x.size(1),
              msg("out: expected shape ", shape_str(x), " (x's), got ", shape_str(out)));
  check_same_device(out, "out", x);
  check_last_dim_contiguous(out, "out");
  sg::SwigluParams p;
  p.rows = x.size(0);
  p.d = x.size(1);
  p.dtype = float_dtype_of<fused_llm::DType>(x, "x");
  p.act = to_activation(activation);
  p.gated = false;
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  return p;
}

void launch(const sg::SwigluParams& p, const at::Tensor& x) {
  launch_rows(
      x, p.rows, p.d, "swiglu-fp8", [&](void* stream) { return sg::swiglu_launch_gpu(p, stream); },
      sg::gpu_error_string, [&](int64_t begin, int64_t end) { sg::swiglu_cpu(p, begin, end); });
}

}  // namespace

void silu_and_mul(at::Tensor& out, const at::Tensor& x, int64_t activation) {
  auto p = common_params(out, x, activation);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(),
              msg("out: expected dtype ", x.scalar_type(), ", got ", out.scalar_type()));
  launch(p, x);
}

void activation_only(at::Tensor& out, const at::Tensor& x, int64_t activation) {
  auto p = activation_params(out, x, activation);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(),
              msg("out: expected dtype ", x.scalar_type(), ", got ", out.scalar_type()));
  launch(p, x);
}

void silu_and_mul_static_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
                             int64_t activation) {
  auto p = common_params(out, x, activation);
  set_static_fp8(p, out, scale, x);
  launch(p, x);
}

void silu_and_mul_dynamic_fp8(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                              int64_t group_size, std::optional<double> scale_ub,
                              int64_t activation) {
  auto p = common_params(out, x, activation);
  set_dynamic_fp8(p, out, scales, group_size, scale_ub, x, p.d, "output width d =");
  launch(p, x);
}

// The allocating form for the Python API's common case (a contiguous x, no given output): one
// C++ call that checks, allocates [..., d] and launches, with no views (each a dispatcher call).
// The Python API calls it first and falls back to its own checks, which name the problem, when
// it refuses; so it checks everything the launch relies on but words nothing for users. On the
// H100 host the Python path cost 27 us a call at decode shapes (one torch.add: 9 us).
at::Tensor silu_and_mul_alloc(const at::Tensor& x, int64_t activation) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous(), msg("x: expected a contiguous [..., 2 * d] tensor"));
  const int64_t width = x.size(-1);
  TORCH_CHECK(width >= 2 && width % 2 == 0, msg("x: expected an even last dimension 2 * d >= 2"));
  const int64_t d = width / 2;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = d;
  at::Tensor out = at::empty(shape, x.options());
  sg::SwigluParams p;
  p.rows = x.numel() / width;
  p.d = d;
  p.dtype = float_dtype_of<fused_llm::DType>(x, "x");
  p.act = to_activation(activation);
  p.x = x.data_ptr();
  p.x_row_stride = width;
  p.out = out.data_ptr();
  p.out_row_stride = d;
  launch(p, x);
  return out;
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("activation(Tensor! out, Tensor x, int activation) -> ()");
  ops.def("silu_and_mul(Tensor! out, Tensor x, int activation) -> ()");
  ops.def("silu_and_mul_alloc(Tensor x, int activation) -> Tensor");
  ops.def("silu_and_mul_static_fp8(Tensor! out, Tensor x, Tensor scale, int activation) -> ()");
  ops.def(
      "silu_and_mul_dynamic_fp8(Tensor! out, Tensor! scales, Tensor x, int group_size, "
      "float? scale_ub, int activation) -> ()");
  const auto device = fused_llm::binding::kKernelDevice;
  ops.impl("activation", device, &activation_only);
  ops.impl("silu_and_mul", device, &silu_and_mul);
  ops.impl("silu_and_mul_alloc", device, &silu_and_mul_alloc);
  ops.impl("silu_and_mul_static_fp8", device, &silu_and_mul_static_fp8);
  ops.impl("silu_and_mul_dynamic_fp8", device, &silu_and_mul_dynamic_fp8);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
