// Torch binding of skinny-gemm. The package's default kernels are Python custom ops (Triton on
// CUDA / ROCm, plain torch on CPU: torch-ext/skinny_gemm/__init__.py), registered in this build's
// op namespace as torch.library fragments. This file defines that namespace (TORCH_LIBRARY) and,
// in CUDA builds only, the compiled Hopper kernel's ops:
//   skinny_tma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int tile_n, int boxes_k,
//              int stages, int split) -> ()
//   skinny_tma_configs() -> int[]      (the compiled (tile_n, boxes_k, stages, most K slices),
//                                       flattened)
// CPU and ROCm builds compile this file too and register no op: the .so then only carries the
// namespace, so `_ops.py` loads the same way on every variant.
//
// The Python layer checks arguments first, with friendlier messages; the checks here keep
// direct torch.ops callers safe, and every one runs before anything is written.
#include "torch_binding.h"

#include <torch/library.h>

#include "registration.h"

#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "common/binding_utils.h"
#include "skinny_tma.h"

namespace sg = fused_llm::skinny_gemm;

namespace {

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

std::string compiled_list() {
  const sg::SkinnyTmaConfig* configs = nullptr;
  const int n = sg::skinny_tma_compiled_configs(&configs);
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += (i ? ", (" : "(") + std::to_string(configs[i].tile_n) + ", " + std::to_string(configs[i].boxes_k) + ", " +
         std::to_string(configs[i].stages) + ")";
  }
  return s;
}

}  // namespace

void skinny_tma(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t tile_n, int64_t boxes_k, int64_t stages, int64_t split) {
  using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [M, K] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              msg("x: expected dtype bfloat16 or float16, got ", x.scalar_type()));
  TORCH_CHECK(x.is_cuda(), msg("x: expected a CUDA tensor, got device ", device_str(x)));
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M <= sg::kMaxM, msg("x: the TMA kernel takes at most ", sg::kMaxM, " rows (tokens), got ", M));
  TORCH_CHECK(M == 0 || (K >= 8 && K % 8 == 0),
              msg("x: K must be a positive multiple of 8 (16-byte rows for the copy engine), got ", K));
  TORCH_CHECK(x.stride(1) == 1 && (M <= 1 || x.stride(0) % 8 == 0) && aligned16(x),
              msg("x: expected unit-stride rows, a row stride that is a multiple of 8 and a 16-byte aligned base, got "
                  "strides [", x.stride(0), ", ", x.stride(1), "]"));
  TORCH_CHECK(w.dim() == 2 && w.size(1) == K && w.scalar_type() == x.scalar_type(),
              msg("w: expected a ", x.scalar_type(), " [N, ", K, "] tensor, got ", w.scalar_type(), " ", shape_str(w)));
  check_same_device(w, "w", x);
  const int64_t N = w.size(0);
  TORCH_CHECK(w.stride(1) == 1 && w.stride(0) % 8 == 0 && aligned16(w),
              msg("w: expected unit-stride rows, a row stride that is a multiple of 8 and a 16-byte aligned base, got "
                  "strides [", w.stride(0), ", ", w.stride(1), "]"));
  if (bias.has_value()) {
    TORCH_CHECK((bias->scalar_type() == x.scalar_type() || bias->scalar_type() == at::kFloat) && bias->dim() == 1 &&
                    bias->size(0) == N && bias->is_contiguous(),
                msg("bias: expected a contiguous [", N, "] tensor of x's dtype or float32, got ", bias->scalar_type(), " ",
                    shape_str(*bias)));
    check_same_device(*bias, "bias", x);
  }
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.dim() == 2 && out.size(0) == M && out.size(1) == N,
              msg("out: expected a ", x.scalar_type(), " [", M, ", ", N, "] tensor, got ", out.scalar_type(), " ",
                  shape_str(out)));
  check_last_dim_contiguous(out, "out");
  check_same_device(out, "out", x);
  TORCH_CHECK(M <= 1 || out.stride(0) >= N, msg("out: expected a row stride >= N = ", N, ", got ", out.stride(0)));
  TORCH_CHECK(!ranges_overlap(out, x) && !ranges_overlap(out, w) && !(bias.has_value() && ranges_overlap(out, *bias)),
              msg("out: overlaps x, w or bias in memory (the output must be separate)"));
  const auto small = [](int64_t v) { return v >= 1 && v <= 1024; };  // checked before the narrowing below
  TORCH_CHECK(small(tile_n) && small(boxes_k) && small(stages),
              msg("config: (tile_n, boxes_k, stages) = (", tile_n, ", ", boxes_k, ", ", stages,
                  ") is not compiled; compiled: ", compiled_list()));
  TORCH_CHECK(split >= 1 && split <= sg::kMaxSplit,
              msg("config: split (K slices, the blocks of a cluster) must be 1 .. ", sg::kMaxSplit, ", got ", split));
  sg::SkinnyTmaParams p;
  p.config = {static_cast<int>(tile_n), static_cast<int>(boxes_k), static_cast<int>(stages), static_cast<int>(split)};
  TORCH_CHECK(sg::skinny_tma_config_supported(p.config),
              msg("config: (tile_n, boxes_k, stages) = (", tile_n, ", ", boxes_k, ", ", stages,
                  ") is not compiled; compiled: ", compiled_list()));
  if (M == 0 || N == 0) return;

  const c10::cuda::CUDAGuard guard(x.device());
  const auto* props = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(props->major == 9 && props->minor == 0,
              msg("skinny_tma: needs a GPU of capability 9.0 (TMA; the kernel is built for sm_90), got ", props->major,
                  ".", props->minor));
  p.m = M;
  p.n = N;
  p.k = K;
  p.dtype = x.scalar_type() == at::kBFloat16 ? sg::DType::kBFloat16 : sg::DType::kFloat16;
  p.x = x.data_ptr();
  p.x_row_stride = M == 1 ? K : x.stride(0);  // a single row's stride is never used
  p.w = w.data_ptr();
  p.w_row_stride = w.stride(0);
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.bias_fp32 = bias.has_value() && bias->scalar_type() == at::kFloat;
  p.out = out.data_ptr();
  p.out_row_stride = M == 1 ? N : out.stride(0);
  const cudaError_t err = sg::skinny_tma_launch(p, at::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, msg("skinny_tma: kernel launch failed: ", cudaGetErrorString(err)));
}

std::vector<int64_t> skinny_tma_configs() {
  const sg::SkinnyTmaConfig* configs = nullptr;
  const int n = sg::skinny_tma_compiled_configs(&configs);
  std::vector<int64_t> flat;
  for (int i = 0; i < n; ++i) {
    flat.push_back(configs[i].tile_n);
    flat.push_back(configs[i].boxes_k);
    flat.push_back(configs[i].stages);
    flat.push_back(configs[i].split);
  }
  return flat;
}
#endif  // CUDA_KERNEL

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
#if defined(CUDA_KERNEL)
  ops.def(
      "skinny_tma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int tile_n, int boxes_k, int stages, "
      "int split) -> ()");
  ops.impl("skinny_tma", c10::kCUDA, &skinny_tma);
  ops.def("skinny_tma_configs() -> int[]", &skinny_tma_configs);
#else
  (void)ops;  // CPU / ROCm: the namespace only (see the top of this file)
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
