// Torch binding of gated-mlp. The package's default kernels are Python custom ops (the Triton
// kernel on CUDA / ROCm, plain torch on CPU: torch-ext/gated_mlp/__init__.py), registered in
// this build's op namespace as torch.library fragments. This file defines that namespace
// (TORCH_LIBRARY) and, in CUDA builds only, the compiled CuTe kernels' ops (one schema):
//   gated_mlp_sm80 / gated_mlp_sm90(Tensor! out, Tensor x, Tensor w_gate, Tensor w_up,
//                                   Tensor? bias_gate, Tensor? bias_up, str activation) -> ()
// CPU and ROCm builds compile this file too and register no op: the .so then only carries the
// namespace, so `_ops.py` loads the same way on every variant.
//
// The Python layer checks arguments first, with friendlier messages; the checks here keep
// direct torch.ops callers safe.
#include "torch_binding.h"

#include <torch/library.h>

#include "registration.h"

#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <string>

#include "common/binding_utils.h"
#include "gated_mlp_sm80.h"
#include "gated_mlp_sm90.h"

namespace gm = fused_llm::gated_mlp;

namespace {

using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// A 2-D [rows, cols] operand on x's device with x's dtype and a unit-stride last dimension.
void check_matrix(const at::Tensor& t, const char* name, const at::Tensor& x, int64_t rows, int64_t cols,
                  const char* shape_hint) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols,
              msg(name, ": expected shape ", shape_hint, " = [", rows, ", ", cols, "], got ", shape_str(t)));
  TORCH_CHECK(t.scalar_type() == x.scalar_type(),
              msg(name, ": expected dtype ", x.scalar_type(), " (x's), got ", t.scalar_type()));
  check_same_device(t, name, x);
  check_last_dim_contiguous(t, name);
}

// An input read in 16-byte units (sm80: cp.async vectors; sm90: TMA rows): aligned start, row
// stride a multiple of 8 elements.
void check_vector_rows(const at::Tensor& t, const char* name, const char* kernel) {
  TORCH_CHECK(aligned16(t), msg(name, ": expected a 16-byte aligned start (the ", kernel, " kernel reads 16-byte units)"));
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) % 8 == 0,
              msg(name, ": expected a row stride that is a multiple of 8 elements (16 bytes), got ", t.stride(0)));
}

std::optional<at::Tensor> bias_fp32(const std::optional<at::Tensor>& b, const char* name, const at::Tensor& x,
                                    int64_t U) {
  if (!b.has_value()) return std::nullopt;
  TORCH_CHECK(b->dim() == 1 && b->size(0) == U, msg(name, ": expected shape [", U, "], got ", shape_str(*b)));
  TORCH_CHECK(b->scalar_type() == x.scalar_type() || b->scalar_type() == at::kFloat,
              msg(name, ": expected dtype ", x.scalar_type(), " (x's) or float32, got ", b->scalar_type()));
  check_same_device(*b, name, x);
  return b->to(at::kFloat).contiguous();  // [U]: negligible, and the kernel reads one format
}

// The compiled kernels: what each needs beyond the shared checks.
enum class Kernel { kSm80, kSm90 };

const char* kernel_name(Kernel k) { return k == Kernel::kSm80 ? "sm80" : "sm90"; }

// Checks shared by both kernels, then the kernel's own (alignment, D, device), then the launch.
void run_kernel(Kernel kernel, at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate,
                const at::Tensor& w_up, const std::optional<at::Tensor>& bias_gate,
                const std::optional<at::Tensor>& bias_up, std::string_view activation) {
  const char* name = kernel_name(kernel);
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [M, D] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              msg("x: expected dtype bfloat16 or float16, got ", x.scalar_type()));
  TORCH_CHECK(x.is_cuda(), msg("x: expected a CUDA tensor, got device ", device_str(x)));
  const int64_t M = x.size(0), D = x.size(1);
  if (kernel == Kernel::kSm80) {
    TORCH_CHECK(D >= 8 && D % 8 == 0,
                msg("x: the sm80 kernel needs D (x.size(1)) to be a positive multiple of 8, got ", D));
  } else {
    TORCH_CHECK(D >= 1, msg("x: the sm90 kernel needs D (x.size(1)) >= 1, got ", D));
  }
  TORCH_CHECK(w_gate.dim() == 2, msg("w_gate: expected a 2-D [U, D] tensor, got ", w_gate.dim(), "-D"));
  const int64_t U = w_gate.size(0);
  check_matrix(x, "x", x, M, D, "[M, D]");
  check_matrix(w_gate, "w_gate", x, U, D, "[U, D]");
  check_matrix(w_up, "w_up", x, U, D, "[U, D] (w_gate's)");
  check_matrix(out, "out", x, M, U, "[M, U]");
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh",
              msg("activation: expected \"silu\" or \"gelu_tanh\", got \"", activation, "\""));
  const auto bg = bias_fp32(bias_gate, "bias_gate", x, U);
  const auto bu = bias_fp32(bias_up, "bias_up", x, U);
  TORCH_CHECK(M <= 1 || out.stride(0) >= U,
              msg("out: expected rows that do not overlap (row stride >= ", U, "), got row stride ", out.stride(0)));
  for (const auto& [t, arg] : {std::pair<const at::Tensor*, const char*>{&x, "x"}, {&w_gate, "w_gate"},
                               {&w_up, "w_up"}, {bias_gate ? &*bias_gate : nullptr, "bias_gate"},
                               {bias_up ? &*bias_up : nullptr, "bias_up"}}) {
    TORCH_CHECK(t == nullptr || !ranges_overlap(out, *t),
                msg("out: overlaps ", arg, " in memory (the output must be separate)"));
  }
  if (M == 0 || U == 0) return;
  check_vector_rows(x, "x", name);
  check_vector_rows(w_gate, "w_gate", name);
  check_vector_rows(w_up, "w_up", name);

  const c10::cuda::CUDAGuard guard(x.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const int smem = kernel == Kernel::kSm80 ? gm::gated_mlp_sm80_smem_bytes() : gm::gated_mlp_sm90_smem_bytes();
  if (kernel == Kernel::kSm80) {
    TORCH_CHECK(prop->major >= 8, msg("x: the sm80 kernel needs a GPU of capability >= 8.0, got ", prop->major, ".",
                                      prop->minor));
  } else {
    TORCH_CHECK(prop->major == 9 && prop->minor == 0,
                msg("x: the sm90 kernel needs a GPU of capability 9.0 (Hopper; it is built for sm_90a), got ",
                    prop->major, ".", prop->minor));
  }
  TORCH_CHECK(prop->sharedMemPerBlockOptin >= static_cast<size_t>(smem),
              msg("x: the ", name, " kernel needs ", smem, " bytes of shared memory per block, this GPU allows ",
                  static_cast<int64_t>(prop->sharedMemPerBlockOptin)));

  gm::GatedMlpParams p;
  p.m = M;
  p.d = D;
  p.u = U;
  p.dtype = x.scalar_type() == at::kBFloat16 ? gm::DType::kBFloat16 : gm::DType::kFloat16;
  p.activation = activation == "silu" ? gm::Activation::kSilu : gm::Activation::kGeluTanh;
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.w_gate = w_gate.data_ptr();
  p.w_gate_row_stride = w_gate.stride(0);
  p.w_up = w_up.data_ptr();
  p.w_up_row_stride = w_up.stride(0);
  p.bias_gate = bg.has_value() ? bg->data_ptr<float>() : nullptr;
  p.bias_up = bu.has_value() ? bu->data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  const char* reason = kernel == Kernel::kSm80 ? gm::gated_mlp_sm80_check(p) : gm::gated_mlp_sm90_check(p);
  TORCH_CHECK(reason == nullptr, msg("gated_mlp_", name, ": ", reason == nullptr ? "" : reason));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const cudaError_t err = kernel == Kernel::kSm80 ? gm::gated_mlp_sm80_launch(p, stream)
                                                  : gm::gated_mlp_sm90_launch(p, prop->multiProcessorCount, stream);
  TORCH_CHECK(err == cudaSuccess, msg("gated_mlp_", name, ": kernel launch failed: ", cudaGetErrorString(err)));
}

}  // namespace

void gated_mlp_sm80(at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                    const std::optional<at::Tensor>& bias_gate, const std::optional<at::Tensor>& bias_up,
                    std::string_view activation) {
  run_kernel(Kernel::kSm80, out, x, w_gate, w_up, bias_gate, bias_up, activation);
}

void gated_mlp_sm90(at::Tensor& out, const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                    const std::optional<at::Tensor>& bias_gate, const std::optional<at::Tensor>& bias_up,
                    std::string_view activation) {
  run_kernel(Kernel::kSm90, out, x, w_gate, w_up, bias_gate, bias_up, activation);
}
#endif  // CUDA_KERNEL

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
#if defined(CUDA_KERNEL)
  ops.def(
      "gated_mlp_sm80(Tensor! out, Tensor x, Tensor w_gate, Tensor w_up, Tensor? bias_gate, Tensor? bias_up, "
      "str activation) -> ()");
  ops.impl("gated_mlp_sm80", c10::kCUDA, &gated_mlp_sm80);
  ops.def(
      "gated_mlp_sm90(Tensor! out, Tensor x, Tensor w_gate, Tensor w_up, Tensor? bias_gate, Tensor? bias_up, "
      "str activation) -> ()");
  ops.impl("gated_mlp_sm90", c10::kCUDA, &gated_mlp_sm90);
#else
  (void)ops;  // CPU / ROCm: the namespace only (see the top of this file)
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
