// Torch binding of rmsnorm-fp8: schemas, argument checks (the Python layer checks first and
// with friendlier messages; these keep direct torch.ops callers safe), dispatch.
#include "torch_binding.h"

#include <torch/library.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/binding_utils.h"
#include "registration.h"
#include "rmsnorm_fp8.h"

namespace rn = fused_llm::rmsnorm_fp8;

namespace {

using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)

// A [rows, H] operand with a unit-stride last dimension, on x's device.
void check_rows(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.dim() == 2,
              msg(name, ": expected a 2-D [rows, hidden] tensor, got ", t.dim(), "-D"));
  TORCH_CHECK(t.size(0) == x.size(0) && t.size(1) == x.size(1),
              msg(name, ": expected shape ", shape_str(x), ", got ", shape_str(t)));
  check_same_device(t, name, x);
  check_last_dim_contiguous(t, name);
}

// Memory relation of two [rows, H] operands (unit-stride last dimension): kNone, kExact (same
// address, shape, strides and element size) or kPartial. Exact when the byte ranges are apart;
// for equal row strides and element sizes, rows interleaved within one buffer (x = buf[:, :H],
// out = buf[:, H:]) are recognized as disjoint; anything else that shares bytes is refused.
enum class Overlap { kNone, kExact, kPartial };

Overlap overlap_of(const at::Tensor& a, const at::Tensor& b) {
  if (!ranges_overlap(a, b)) return Overlap::kNone;
  const auto pa = reinterpret_cast<intptr_t>(a.data_ptr()), pb = reinterpret_cast<intptr_t>(b.data_ptr());
  if (pa == pb && a.sizes() == b.sizes() && a.strides() == b.strides() && a.element_size() == b.element_size())
    return Overlap::kExact;
  if (a.dim() == 2 && b.dim() == 2 && a.element_size() == b.element_size() && a.stride(0) == b.stride(0) &&
      a.stride(1) == 1 && b.stride(1) == 1 && (pb - pa) % a.element_size() == 0) {
    // Element (i, j) of a and (k, l) of b coincide iff delta = (i - k) * s + (j - l).
    const int64_t s = a.stride(0), delta = (pb - pa) / static_cast<int64_t>(a.element_size());
    const int64_t rows = std::max(a.size(0), b.size(0));
    for (int64_t m = delta / s - 1; m <= delta / s + 1; ++m) {
      const int64_t rest = delta - m * s;  // = j - l for row offset m = i - k
      if (m > -rows && m < rows && rest > -b.size(1) && rest < a.size(1)) return Overlap::kPartial;
    }
    return Overlap::kNone;
  }
  return Overlap::kPartial;
}

// Outputs must not overlap themselves (an expanded view, or rows closer than a row apart, would
// race) nor any other argument, except exact aliasing of `may_alias` (out = x, residual_out =
// residual: each element is read before it is written, by the same thread).
void check_output(const at::Tensor& t, const char* name, std::initializer_list<const at::Tensor*> others,
                  const at::Tensor* may_alias = nullptr) {
  // No self-overlap if, with dims sorted by stride, each stride clears the extent of the dims
  // below it (covers row-major, column-major and row-strided views).
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) > 1) dims.emplace_back(std::abs(t.stride(i)), t.size(i));
  std::sort(dims.begin(), dims.end());
  bool self_overlap = false;
  int64_t extent = 0;  // largest offset reachable with the dims seen so far
  for (const auto& [stride, size] : dims) {
    self_overlap = self_overlap || stride <= extent;
    extent += (size - 1) * stride;
  }
  TORCH_CHECK(
      t.numel() == 0 || !self_overlap,
      msg(name,
          ": expected an output whose elements do not share memory, got an overlapping view"));
  for (const at::Tensor* other : others) {
    const Overlap o = overlap_of(t, *other);
    TORCH_CHECK(o == Overlap::kNone || (o == Overlap::kExact && other == may_alias),
                msg(name,
                    ": overlaps another argument in memory (only out=x and residual_out=residual, "
                    "exactly, may share memory)"));
  }
}

rn::RmsNormParams common_params(const at::Tensor& out, const at::Tensor& x,
                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [rows, hidden] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.size(1) >= 1, msg("x: hidden size must be >= 1"));
  check_rows(x, "x", x);
  check_rows(out, "out", x);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1),
              msg("weight: expected shape [", x.size(1), "], got ", shape_str(weight)));
  TORCH_CHECK(
      weight.scalar_type() == x.scalar_type(),
      msg("weight: expected dtype ", x.scalar_type(), " (x's), got ", weight.scalar_type()));
  check_same_device(weight, "weight", x);
  TORCH_CHECK(weight.is_contiguous(), msg("weight: must be contiguous"));
  rn::RmsNormParams p;
  p.rows = x.size(0);
  p.hidden = x.size(1);
  p.dtype = float_dtype_of<fused_llm::DType>(x, "x");
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.weight = weight.data_ptr();
  p.eps = static_cast<float>(eps);
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  return p;
}

void add_residual(rn::RmsNormParams& p, at::Tensor& residual_out, const at::Tensor& residual,
                  const at::Tensor& x) {
  check_rows(residual, "residual", x);
  check_rows(residual_out, "residual_out", x);
  TORCH_CHECK(residual.scalar_type() == x.scalar_type(),
              msg("residual: expected dtype ", x.scalar_type(), ", got ", residual.scalar_type()));
  TORCH_CHECK(
      residual_out.scalar_type() == x.scalar_type(),
      msg("residual_out: expected dtype ", x.scalar_type(), ", got ", residual_out.scalar_type()));
  p.residual = residual.data_ptr();
  p.residual_row_stride = residual.stride(0);
  p.residual_out = residual_out.data_ptr();
  p.residual_out_row_stride = residual_out.stride(0);
}

void launch(const rn::RmsNormParams& p, const at::Tensor& x) {
  launch_rows(
      x, p.rows, p.hidden, "rmsnorm-fp8", [&](void* stream) { return rn::rms_norm_launch_gpu(p, stream); },
      rn::gpu_error_string, [&](int64_t begin, int64_t end) { rn::rms_norm_cpu(p, begin, end); });
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto p = common_params(out, x, weight, eps);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(),
              msg("out: expected dtype ", x.scalar_type(), ", got ", out.scalar_type()));
  check_output(out, "out", {&x, &weight}, &x);
  launch(p, x);
}

void fused_add_rms_norm(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& x,
                        const at::Tensor& residual, const at::Tensor& weight, double eps) {
  auto p = common_params(out, x, weight, eps);
  TORCH_CHECK(out.scalar_type() == x.scalar_type(),
              msg("out: expected dtype ", x.scalar_type(), ", got ", out.scalar_type()));
  add_residual(p, residual_out, residual, x);
  check_output(out, "out", {&x, &residual, &residual_out, &weight}, &x);
  check_output(residual_out, "residual_out", {&x, &residual, &weight}, &residual);
  launch(p, x);
}

void rms_norm_static_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& scale, double eps) {
  auto p = common_params(out, x, weight, eps);
  set_static_fp8(p, out, scale, x);
  check_output(out, "out", {&x, &weight, &scale});
  launch(p, x);
}

void fused_add_rms_norm_static_fp8(at::Tensor& out, at::Tensor& residual_out,
                                   const at::Tensor& x, const at::Tensor& residual,
                                   const at::Tensor& weight, const at::Tensor& scale,
                                   double eps) {
  auto p = common_params(out, x, weight, eps);
  set_static_fp8(p, out, scale, x);
  add_residual(p, residual_out, residual, x);
  check_output(out, "out", {&x, &residual, &residual_out, &weight, &scale});
  check_output(residual_out, "residual_out", {&x, &residual, &weight, &scale}, &residual);
  launch(p, x);
}

void rms_norm_dynamic_fp8(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                          const at::Tensor& weight, double eps, int64_t group_size,
                          std::optional<double> scale_ub) {
  auto p = common_params(out, x, weight, eps);
  set_dynamic_fp8(p, out, scales, group_size, scale_ub, x, x.size(1), "hidden size");
  check_output(out, "out", {&x, &weight, &scales});
  check_output(scales, "scales", {&x, &weight});
  launch(p, x);
}

void fused_add_rms_norm_dynamic_fp8(at::Tensor& out, at::Tensor& scales,
                                    at::Tensor& residual_out, const at::Tensor& x,
                                    const at::Tensor& residual, const at::Tensor& weight,
                                    double eps, int64_t group_size,
                                    std::optional<double> scale_ub) {
  auto p = common_params(out, x, weight, eps);
  set_dynamic_fp8(p, out, scales, group_size, scale_ub, x, x.size(1), "hidden size");
  add_residual(p, residual_out, residual, x);
  check_output(out, "out", {&x, &residual, &residual_out, &weight, &scales});
  check_output(scales, "scales", {&x, &residual, &residual_out, &weight});
  check_output(residual_out, "residual_out", {&x, &residual, &weight}, &residual);
  launch(p, x);
}

// Allocating forms of rms_norm and fused_add_rms_norm for the Python API's common case (no
// given outputs): x [..., hidden] whose rows flatten to one row stride, outputs allocated
// here. The Python API calls these first and falls back to its own checks, which name the
// problem, when one of them refuses its inputs; so these check everything the launch relies
// on but word nothing for users. Why here: the allocation and the views made in Python cost
// 14 us of the 24 us a call cost on the H100 host (one torch.add: 7.3 us).
namespace {

at::Tensor rows_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) >= 1, msg(name, ": expected [..., hidden], hidden >= 1"));
  TORCH_CHECK(t.size(-1) == 1 || t.stride(-1) == 1, msg(name, ": the last dimension must be contiguous"));
  return t.view({-1, t.size(-1)});  // throws when the leading dimensions do not flatten
}

// The contiguous case without views or overlap checks (a fresh output overlaps nothing): each
// at::Tensor::view is a dispatcher call, and decode calls these once per layer per token.
bool flat_rows(const at::Tensor& t) { return t.dim() >= 1 && t.size(-1) >= 1 && t.is_contiguous(); }

rn::RmsNormParams flat_params(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                              double eps) {
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == hidden, msg("weight: expected shape [hidden]"));
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), msg("weight: expected x's dtype"));
  TORCH_CHECK(weight.device() == x.device(), msg("weight: expected x's device"));
  TORCH_CHECK(weight.is_contiguous(), msg("weight: must be contiguous"));
  rn::RmsNormParams p;
  p.rows = x.numel() / hidden;
  p.hidden = hidden;
  p.dtype = float_dtype_of<fused_llm::DType>(x, "x");
  p.x = x.data_ptr();
  p.x_row_stride = hidden;
  p.weight = weight.data_ptr();
  p.eps = static_cast<float>(eps);
  p.out = out.data_ptr();
  p.out_row_stride = hidden;
  return p;
}

}  // namespace

at::Tensor rms_norm_alloc(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(eps >= 0, msg("eps: expected a float >= 0"));
  if (flat_rows(x)) {
    at::Tensor out = at::empty(x.sizes(), x.options());
    launch(flat_params(out, x, weight, eps), x);
    return out;
  }
  const at::Tensor x2 = rows_view(x, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor o2 = out.view({-1, x.size(-1)});
  rms_norm(o2, x2, weight, eps);
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_alloc(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const at::Tensor& weight, double eps) {
  TORCH_CHECK(eps >= 0, msg("eps: expected a float >= 0"));
  TORCH_CHECK(residual.sizes() == x.sizes(), msg("residual: expected x's shape"));
  if (flat_rows(x) && residual.is_contiguous()) {
    TORCH_CHECK(residual.scalar_type() == x.scalar_type(), msg("residual: expected x's dtype"));
    TORCH_CHECK(residual.device() == x.device(), msg("residual: expected x's device"));
    at::Tensor out = at::empty(x.sizes(), x.options());
    at::Tensor residual_out = at::empty(x.sizes(), x.options());
    auto p = flat_params(out, x, weight, eps);
    const int64_t hidden = x.size(-1);
    p.residual = residual.data_ptr();
    p.residual_row_stride = hidden;
    p.residual_out = residual_out.data_ptr();
    p.residual_out_row_stride = hidden;
    launch(p, x);
    return {out, residual_out};
  }
  const at::Tensor x2 = rows_view(x, "x");
  const at::Tensor r2 = rows_view(residual, "residual");
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor residual_out = at::empty(x.sizes(), x.options());
  at::Tensor o2 = out.view({-1, x.size(-1)});
  at::Tensor ro2 = residual_out.view({-1, x.size(-1)});
  fused_add_rms_norm(o2, ro2, x2, r2, weight, eps);
  return {out, residual_out};
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("rms_norm(Tensor! out, Tensor x, Tensor weight, float eps) -> ()");
  ops.def(
      "fused_add_rms_norm(Tensor! out, Tensor! residual_out, Tensor x, Tensor residual, "
      "Tensor weight, float eps) -> ()");
  ops.def("rms_norm_alloc(Tensor x, Tensor weight, float eps) -> Tensor");
  ops.def("fused_add_rms_norm_alloc(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  ops.def("rms_norm_static_fp8(Tensor! out, Tensor x, Tensor weight, Tensor scale, float eps) -> ()");
  ops.def(
      "fused_add_rms_norm_static_fp8(Tensor! out, Tensor! residual_out, Tensor x, "
      "Tensor residual, Tensor weight, Tensor scale, float eps) -> ()");
  ops.def(
      "rms_norm_dynamic_fp8(Tensor! out, Tensor! scales, Tensor x, Tensor weight, float eps, "
      "int group_size, float? scale_ub) -> ()");
  ops.def(
      "fused_add_rms_norm_dynamic_fp8(Tensor! out, Tensor! scales, Tensor! residual_out, "
      "Tensor x, Tensor residual, Tensor weight, float eps, int group_size, float? scale_ub) -> ()");
  const auto device = fused_llm::binding::kKernelDevice;
  ops.impl("rms_norm", device, &rms_norm);
  ops.impl("fused_add_rms_norm", device, &fused_add_rms_norm);
  ops.impl("rms_norm_alloc", device, &rms_norm_alloc);
  ops.impl("fused_add_rms_norm_alloc", device, &fused_add_rms_norm_alloc);
  ops.impl("rms_norm_static_fp8", device, &rms_norm_static_fp8);
  ops.impl("fused_add_rms_norm_static_fp8", device, &fused_add_rms_norm_static_fp8);
  ops.impl("rms_norm_dynamic_fp8", device, &rms_norm_dynamic_fp8);
  ops.impl("fused_add_rms_norm_dynamic_fp8", device, &fused_add_rms_norm_dynamic_fp8);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
