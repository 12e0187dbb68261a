// generated from common/torch/binding_utils.h by `fused-llm sync`, do not edit
// Argument-check helpers of the packages' torch bindings (torch-ext/torch_binding.cpp): error
// messages, tensor descriptions, dtype mapping, memory overlap, and the FP8 scale arguments.
//
// Error messages are built as one std::string. TORCH_CHECK's own formatting streams each
// argument into a std::ostringstream instantiated in the extension .so, and with the GPU image's
// build (torch 2.11 + cu130 through cpp_extension) every check whose message streamed an integer
// (or a shape through c10's operator<<) died with SIGSEGV, while messages made only of strings
// and ScalarType names raised normally (seen in rmsnorm-fp8). msg() only concatenates strings,
// so no stream is used.
//
// Internal linkage (unnamed namespace): each package's .so keeps its own copy, so two packages
// stamped from different versions of this file can be loaded in one process.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#elif defined(ROCM_KERNEL)
#include <c10/hip/HIPStream.h>
#elif defined(CPU_KERNEL)
#include <ATen/Parallel.h>
#endif

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace fused_llm {
namespace binding {
namespace {

// The dispatch key this build registers its kernels under (a ROCm build registers under CUDA,
// as torch's HIP backend does).
#if defined(CUDA_KERNEL) || defined(ROCM_KERNEL)
constexpr c10::DeviceType kKernelDevice = c10::kCUDA;
#else
constexpr c10::DeviceType kKernelDevice = c10::kCPU;
#endif

inline std::string msg_part(const char* s) { return s; }
inline std::string msg_part(const std::string& s) { return s; }
inline std::string msg_part(std::string_view s) { return std::string(s); }
inline std::string msg_part(c10::ScalarType t) { return c10::toString(t); }
template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
std::string msg_part(I v) {
  return std::to_string(v);
}

// The concatenation of `parts` (strings, integers, ScalarTypes) as one string.
template <class... A>
std::string msg(const A&... parts) {
  std::string s;
  (s += ... += msg_part(parts));
  return s;
}

// Shapes and devices as strings, for msg(): c10's operator<< would stream them.
inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline std::string device_str(const at::Tensor& t) {
  std::string s = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
  return t.device().has_index() ? s + ":" + std::to_string(t.device().index()) : s;
}

// `t` on `ref`'s device ("name: expected device cuda:0, got cpu").
inline void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(),
              msg(name, ": expected device ", device_str(ref), ", got ", device_str(t)));
}

// A unit-stride last dimension (a last dimension of size 1 has any stride).
inline void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1,
              msg(name, ": the last dimension must be contiguous (stride 1), got stride ", t.stride(-1)));
}

// float32 / float16 / bfloat16 as a package's DType enum (its kFloat32, kFloat16, kBFloat16).
template <class DType>
DType float_dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      TORCH_CHECK(false, msg(name, ": expected float32, float16 or bfloat16, got ", t.scalar_type()));
  }
}

// The e4m3 format of an FP8 output as a package's Fp8Format enum (kE4M3FN, kE4M3FNUZ).
template <class Fp8Format>
Fp8Format fp8_format_of(const at::Tensor& out) {
  if (out.scalar_type() == at::kFloat8_e4m3fn) return Fp8Format::kE4M3FN;
  TORCH_CHECK(out.scalar_type() == at::kFloat8_e4m3fnuz,
              msg("out: expected float8_e4m3fn or float8_e4m3fnuz, got ", out.scalar_type()));
  return Fp8Format::kE4M3FNUZ;
}

// Bytes from a strided tensor's first element to the end of its last one (its extent in memory).
inline int64_t byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  return (last + 1) * static_cast<int64_t>(t.element_size());
}

// Whether the byte ranges of two non-empty tensors intersect (disjoint ranges cannot alias;
// intersecting ones may still interleave without sharing an element).
inline bool ranges_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto pa = reinterpret_cast<intptr_t>(a.data_ptr()), pb = reinterpret_cast<intptr_t>(b.data_ptr());
  return !(pa + byte_span(a) <= pb || pb + byte_span(b) <= pa);
}

// Static FP8 output: `out` an e4m3 tensor, `scale` one float32 on x's device. Fills the
// quantization fields of a package's parameter block (quant, fp8_format, static_scale).
template <class Params>
void set_static_fp8(Params& p, const at::Tensor& out, const at::Tensor& scale, const at::Tensor& x) {
  using Fp8Format = decltype(p.fp8_format);
  p.quant = decltype(p.quant)::kStatic;
  p.fp8_format = fp8_format_of<Fp8Format>(out);
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
              msg("scale: expected a float32 tensor with one element, got ", scale.scalar_type(), " of shape ",
                  shape_str(scale)));
  check_same_device(scale, "scale", x);
  p.static_scale = scale.data_ptr<float>();
}

// Dynamic FP8 output over rows of `cols` output columns: per token (group_size 0) or per group
// of 64 / 128 columns, scales [rows, cols / group] float32 (any strides), optional upper bound
// on the amax. `cols_what` names the columns in messages ("hidden size", "output width d").
template <class Params>
void set_dynamic_fp8(Params& p, const at::Tensor& out, at::Tensor& scales, int64_t group_size,
                     std::optional<double> scale_ub, const at::Tensor& x, int64_t cols, const char* cols_what) {
  using Fp8Format = decltype(p.fp8_format);
  using Quant = decltype(p.quant);
  p.fp8_format = fp8_format_of<Fp8Format>(out);
  TORCH_CHECK(group_size == 0 || group_size == 64 || group_size == 128,
              msg("group_size: expected 0 (per token), 64 or 128, got ", group_size));
  TORCH_CHECK(group_size == 0 || cols % group_size == 0,
              msg("group_size: ", cols_what, " ", cols, " is not a multiple of ", group_size));
  const int64_t groups = group_size == 0 ? 1 : cols / group_size;
  TORCH_CHECK(scales.scalar_type() == at::kFloat, msg("scales: expected float32, got ", scales.scalar_type()));
  check_same_device(scales, "scales", x);
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == x.size(0) && scales.size(1) == groups,
              msg("scales: expected shape [", x.size(0), ", ", groups, "], got ", shape_str(scales)));
  TORCH_CHECK(!scale_ub.has_value() || *scale_ub > 0, msg("scale_ub: must be > 0"));
  p.quant = group_size == 0 ? Quant::kDynamicToken : Quant::kDynamicGroup;
  p.group_size = static_cast<int32_t>(group_size);
  p.scales = scales.data_ptr<float>();
  p.scales_row_stride = scales.stride(0);
  p.scales_group_stride = scales.stride(1);
  p.scale_ub = scale_ub.has_value() ? static_cast<float>(*scale_ub) : 0.0f;
}

// Runs a package's framework-free launcher over `rows` rows of `cols` columns on x's device,
// for the backend this .so is built for: `gpu(stream)` on a CUDA / ROCm build (x on the GPU;
// returns 0 or an error code that `error_string` names), `cpu(row_begin, row_end)` on a CPU
// build, over at::parallel_for chunks of >= 16384 elements (they amortize the thread-pool
// dispatch). `what` names the package in the launch-failure message. The callable the build
// does not use is never called, so it may name a launcher this build does not define.
template <class Gpu, class Cpu>
void launch_rows(const at::Tensor& x, int64_t rows, int64_t cols, const char* what, Gpu&& gpu,
                 const char* (*error_string)(int), Cpu&& cpu) {
  if (rows == 0) return;
  const c10::DeviceGuard guard(x.device());
#if defined(CUDA_KERNEL) || defined(ROCM_KERNEL)
  TORCH_CHECK(x.is_cuda(), msg("x: expected a GPU tensor, got device ", device_str(x)));
#if defined(CUDA_KERNEL)
  void* stream = at::cuda::getCurrentCUDAStream(x.get_device()).stream();
#else
  void* stream = c10::hip::getCurrentHIPStream(x.get_device()).stream();
#endif
  const int err = gpu(stream);
  TORCH_CHECK(err == 0, msg(what, " kernel launch failed: ", error_string(err)));
  (void)cols;
  (void)cpu;
#else
  TORCH_CHECK(x.is_cpu(), msg("x: expected a CPU tensor, got device ", device_str(x)));
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, cpu);
  (void)what;
  (void)gpu;
  (void)error_string;
#endif
}

}  // namespace
}  // namespace binding
}  // namespace fused_llm
