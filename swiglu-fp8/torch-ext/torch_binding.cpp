// Torch binding of swiglu-fp8: schemas, argument checks (the Python layer checks first and
// with friendlier messages; these keep direct torch.ops callers safe), dispatch.
#include "torch_binding.h"

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <string>
#include <type_traits>
#include <vector>

#include "registration.h"
#include "swiglu_fp8.h"

#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#elif defined(ROCM_KERNEL)
#include <c10/hip/HIPStream.h>
#elif defined(CPU_KERNEL)
#include <ATen/Parallel.h>
#endif

namespace sg = fused_llm::swiglu_fp8;

namespace {

// Error messages are built here as one std::string. TORCH_CHECK's own formatting streams each
// argument into a std::ostringstream instantiated in this .so, and with the GPU image's build
// (torch 2.11 + cu130 through cpp_extension) every check whose message streamed an integer
// (or a shape through c10's operator<<) died with SIGSEGV, while messages made only of strings
// and ScalarType names raised normally. msg() only concatenates strings, so no stream is used.
// The same helpers (msg, shape_str, device_str) are in each CUDA package's binding on purpose:
// a package builds and loads alone (kernel-builder / the Hub see only its own directory).
std::string msg_part(const char* s) { return s; }
std::string msg_part(const std::string& s) { return s; }
std::string msg_part(c10::ScalarType t) { return c10::toString(t); }
template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
std::string msg_part(I v) {
  return std::to_string(v);
}
template <class... A>
std::string msg(const A&... parts) {
  std::string s;
  (s += ... += msg_part(parts));
  return s;
}

// Shapes and devices as strings, for msg(): c10's operator<< would stream them.
std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string device_str(const at::Tensor& t) {
  std::string s = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
  return t.device().has_index() ? s + ":" + std::to_string(t.device().index()) : s;
}

sg::DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return sg::DType::kFloat32;
    case at::kHalf: return sg::DType::kFloat16;
    case at::kBFloat16: return sg::DType::kBFloat16;
    default:
      TORCH_CHECK(false,
                  msg(name, ": expected float32, float16 or bfloat16, got ", t.scalar_type()));
  }
}

sg::Fp8Format to_fp8_format(const at::Tensor& out) {
  if (out.scalar_type() == at::kFloat8_e4m3fn) return sg::Fp8Format::kE4M3FN;
  TORCH_CHECK(out.scalar_type() == at::kFloat8_e4m3fnuz,
              msg("out: expected float8_e4m3fn or float8_e4m3fnuz, got ", out.scalar_type()));
  return sg::Fp8Format::kE4M3FNUZ;
}

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
  TORCH_CHECK(x.stride(1) == 1,
              msg("x: the last dimension must be contiguous (stride 1), got stride ", x.stride(1)));
  const int64_t d = x.size(1) / 2;
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == d,
              msg("out: expected shape [", x.size(0), ", ", d, "], got ", shape_str(out)));
  TORCH_CHECK(out.device() == x.device(),
              msg("out: expected device ", device_str(x), ", got ", device_str(out)));
  TORCH_CHECK(
      d <= 1 || out.stride(1) == 1,
      msg("out: the last dimension must be contiguous (stride 1), got stride ", out.stride(1)));
  sg::SwigluParams p;
  p.rows = x.size(0);
  p.d = d;
  p.dtype = to_dtype(x, "x");
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
  TORCH_CHECK(x.size(1) == 1 || x.stride(1) == 1,
              msg("x: the last dimension must be contiguous (stride 1), got stride ", x.stride(1)));
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == x.size(1),
              msg("out: expected shape ", shape_str(x), " (x's), got ", shape_str(out)));
  TORCH_CHECK(out.device() == x.device(),
              msg("out: expected device ", device_str(x), ", got ", device_str(out)));
  TORCH_CHECK(
      out.size(1) == 1 || out.stride(1) == 1,
      msg("out: the last dimension must be contiguous (stride 1), got stride ", out.stride(1)));
  sg::SwigluParams p;
  p.rows = x.size(0);
  p.d = x.size(1);
  p.dtype = to_dtype(x, "x");
  p.act = to_activation(activation);
  p.gated = false;
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  return p;
}

void set_static(sg::SwigluParams& p, const at::Tensor& out, const at::Tensor& scale,
                const at::Tensor& x) {
  p.quant = sg::Quant::kStatic;
  p.fp8_format = to_fp8_format(out);
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
              msg("scale: expected a float32 tensor with one element, got ", scale.scalar_type(),
                  " of shape ", shape_str(scale)));
  TORCH_CHECK(scale.device() == x.device(),
              msg("scale: expected device ", device_str(x), ", got ", device_str(scale)));
  p.static_scale = scale.data_ptr<float>();
}

void set_dynamic(sg::SwigluParams& p, const at::Tensor& out, at::Tensor& scales,
                 int64_t group_size, std::optional<double> scale_ub, const at::Tensor& x) {
  p.fp8_format = to_fp8_format(out);
  TORCH_CHECK(group_size == 0 || group_size == 64 || group_size == 128,
              msg("group_size: expected 0 (per token), 64 or 128, got ", group_size));
  TORCH_CHECK(group_size == 0 || p.d % group_size == 0,
              msg("group_size: output width d = ", p.d, " is not a multiple of ", group_size));
  const int64_t groups = group_size == 0 ? 1 : p.d / group_size;
  TORCH_CHECK(scales.scalar_type() == at::kFloat,
              msg("scales: expected float32, got ", scales.scalar_type()));
  TORCH_CHECK(scales.device() == x.device(),
              msg("scales: expected device ", device_str(x), ", got ", device_str(scales)));
  TORCH_CHECK(
      scales.dim() == 2 && scales.size(0) == x.size(0) && scales.size(1) == groups,
      msg("scales: expected shape [", x.size(0), ", ", groups, "], got ", shape_str(scales)));
  TORCH_CHECK(!scale_ub.has_value() || *scale_ub > 0, msg("scale_ub: must be > 0"));
  p.quant = group_size == 0 ? sg::Quant::kDynamicToken : sg::Quant::kDynamicGroup;
  p.group_size = static_cast<int32_t>(group_size);
  p.scales = scales.data_ptr<float>();
  p.scales_row_stride = scales.stride(0);
  p.scales_group_stride = scales.stride(1);
  p.scale_ub = scale_ub.has_value() ? static_cast<float>(*scale_ub) : 0.0f;
}

void launch(const sg::SwigluParams& p, const at::Tensor& x) {
  if (p.rows == 0) return;
  const c10::DeviceGuard guard(x.device());
#if defined(CUDA_KERNEL) || defined(ROCM_KERNEL)
  TORCH_CHECK(x.is_cuda(), msg("x: expected a GPU tensor, got device ", device_str(x)));
#if defined(CUDA_KERNEL)
  void* stream = at::cuda::getCurrentCUDAStream(x.get_device()).stream();
#else
  void* stream = c10::hip::getCurrentHIPStream(x.get_device()).stream();
#endif
  const int err = sg::swiglu_launch_gpu(p, stream);
  TORCH_CHECK(err == 0, msg("swiglu-fp8 kernel launch failed: ", sg::gpu_error_string(err)));
#else
  TORCH_CHECK(x.is_cpu(), msg("x: expected a CPU tensor, got device ", device_str(x)));
  // Chunks of >= 16K output elements amortize the thread-pool dispatch.
  const int64_t grain = std::max<int64_t>(1, 16384 / p.d);
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) { sg::swiglu_cpu(p, begin, end); });
#endif
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
  set_static(p, out, scale, x);
  launch(p, x);
}

void silu_and_mul_dynamic_fp8(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                              int64_t group_size, std::optional<double> scale_ub,
                              int64_t activation) {
  auto p = common_params(out, x, activation);
  set_dynamic(p, out, scales, group_size, scale_ub, x);
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
  p.dtype = to_dtype(x, "x");
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
#if defined(CUDA_KERNEL) || defined(ROCM_KERNEL)
  const auto device = c10::kCUDA;  // ROCm registers under CUDA too
#else
  const auto device = c10::kCPU;
#endif
  ops.impl("activation", device, &activation_only);
  ops.impl("silu_and_mul", device, &silu_and_mul);
  ops.impl("silu_and_mul_alloc", device, &silu_and_mul_alloc);
  ops.impl("silu_and_mul_static_fp8", device, &silu_and_mul_static_fp8);
  ops.impl("silu_and_mul_dynamic_fp8", device, &silu_and_mul_dynamic_fp8);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
