// Torch binding of skinny-gemm. The package's default kernels are Python custom ops (Triton on
// CUDA / ROCm, plain torch on CPU: torch-ext/skinny_gemm/__init__.py), registered in this build's
// op namespace as torch.library fragments. This file defines that namespace (TORCH_LIBRARY) and,
// in CUDA builds only, the compiled Hopper kernel's ops:
//   skinny_tma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int tile_n, int boxes_k,
//              int stages, int split, bool pdl=True) -> ()
//   skinny_tma_fp8(Tensor(a!) out, Tensor x, Tensor w, Tensor x_scale, Tensor w_scale,
//                  Tensor? bias, int tile_n, int boxes_k, int stages, int split,
//                  bool pdl=True) -> ()
//   skinny_tma_configs() -> int[]      (the compiled (tile_n, boxes_k, stages, most K slices),
//                                       flattened)
//   skinny_mma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int row_groups, int unroll,
//              int warps, int stages, int split, int shared_x=0, int segments=0, int wgmma=0) -> ()
//              (the tensor-core GEMV: csrc/skinny_mma.h)
//   skinny_mma_fp8(Tensor(a!) out, Tensor x, Tensor w, Tensor x_scale, Tensor w_scale,
//                  Tensor? bias, int row_groups, int unroll, int warps, int stages, int split,
//                  int shared_x=0, int segments=0, int wgmma=0) -> ()
//   skinny_mma_configs() -> int[]      (the compiled (row_groups, unroll, warps, stages, split,
//                                       shared_x, segments, wgmma), flattened)
// CPU and ROCm builds compile this file too and register no op: the .so then only carries the
// namespace, so `_ops.py` loads the same way on every variant.
//
// The Python layer checks arguments first, with friendlier messages; the checks here keep
// direct torch.ops callers safe, and every one runs before anything is written.
#include "torch_binding.h"

#include <torch/library.h>

#include <array>

#include "registration.h"

#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "common/binding_utils.h"
#include "skinny_mma.h"
#include "skinny_tma.h"

namespace sg = fused_llm::skinny_gemm;

namespace {

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// "(a, b, c), (d, e, f)": a kernel's compiled launches, their fields each, for messages.
template <typename Config, typename Fields>
std::string config_list(const Config* configs, int n, Fields fields) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += i ? ", (" : "(";
    bool first = true;
    for (const int f : fields(configs[i])) {
      s += (first ? "" : ", ") + std::to_string(f);
      first = false;
    }
    s += ")";
  }
  return s;
}

// A kernel's compiled launches, their fields one after the other (the *_configs ops' int[]).
template <typename Config, typename Fields>
std::vector<int64_t> flat_configs(const Config* configs, int n, Fields fields) {
  std::vector<int64_t> flat;
  for (int i = 0; i < n; ++i) {
    for (const int f : fields(configs[i])) flat.push_back(f);
  }
  return flat;
}

std::string compiled_list() {
  const sg::SkinnyTmaConfig* configs = nullptr;
  const int n = sg::skinny_tma_compiled_configs(&configs);
  return config_list(configs, n,
                     [](const sg::SkinnyTmaConfig& c) { return std::array<int, 3>{c.tile_n, c.boxes_k, c.stages}; });
}

std::array<int, 8> mma_fields(const sg::SkinnyMmaConfig& c) {
  return {c.row_groups, c.unroll, c.warps, c.stages, c.split, c.shared_x, c.segments, c.wgmma};
}

std::string mma_compiled_list() {
  const sg::SkinnyMmaConfig* configs = nullptr;
  const int n = sg::skinny_mma_compiled_configs(&configs);
  return config_list(configs, n, mma_fields);
}

sg::DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return sg::DType::kBFloat16;
    case at::kHalf:
      return sg::DType::kFloat16;
    case at::kFloat:
      return sg::DType::kFloat32;
    default:
      return sg::DType::kFloat8E4M3;
  }
}

// The operand checks both compiled kernels' ops share, each before anything is written: x [M, K]
// (its dtype and M, K checked by the caller) and w [N, K] in x's dtype with unit-stride rows, row
// strides multiples of `unit` elements and 16-byte aligned bases (16-byte loads or copies); bias [N]
// of x's dtype or float32 (bfloat16, float16 or float32 with bias_any_out_dtype); out [M, N] (its
// dtype checked by the caller) overlapping none of them. Returns N.
int64_t check_operands(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                       const std::optional<at::Tensor>& bias, int64_t unit, bool bias_any_out_dtype) {
  using namespace fused_llm::binding;  // msg, shape_str, checks (common/binding_utils.h)
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(x.stride(1) == 1 && (M <= 1 || x.stride(0) % unit == 0) && aligned16(x),
              msg("x: expected unit-stride rows, a row stride that is a multiple of ", unit,
                  " and a 16-byte aligned base, got strides [", x.stride(0), ", ", x.stride(1), "]"));
  TORCH_CHECK(w.dim() == 2 && w.size(1) == K && w.scalar_type() == x.scalar_type(),
              msg("w: expected a ", x.scalar_type(), " [N, ", K, "] tensor, got ", w.scalar_type(), " ", shape_str(w)));
  check_same_device(w, "w", x);
  const int64_t N = w.size(0);
  TORCH_CHECK(w.stride(1) == 1 && w.stride(0) % unit == 0 && aligned16(w),
              msg("w: expected unit-stride rows, a row stride that is a multiple of ", unit,
                  " and a 16-byte aligned base, got strides [", w.stride(0), ", ", w.stride(1), "]"));
  if (bias.has_value()) {
    const auto t = bias->scalar_type();
    const bool dtype_ok = bias_any_out_dtype ? (t == at::kBFloat16 || t == at::kHalf || t == at::kFloat)
                                             : (t == x.scalar_type() || t == at::kFloat);
    TORCH_CHECK(dtype_ok && bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(),
                msg("bias: expected a contiguous [", N, "] tensor of ",
                    bias_any_out_dtype ? "dtype bfloat16, float16 or float32" : "x's dtype or float32", ", got ", t,
                    " ", shape_str(*bias)));
    check_same_device(*bias, "bias", x);
  }
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.size(1) == N,
              msg("out: expected a [", M, ", ", N, "] tensor, got ", shape_str(out)));
  check_last_dim_contiguous(out, "out");
  check_same_device(out, "out", x);
  TORCH_CHECK(M <= 1 || out.stride(0) >= N, msg("out: expected a row stride >= N = ", N, ", got ", out.stride(0)));
  TORCH_CHECK(!ranges_overlap(out, x) && !ranges_overlap(out, w) && !(bias.has_value() && ranges_overlap(out, *bias)),
              msg("out: overlaps x, w or bias in memory (the output must be separate)"));
  return N;
}

// The operands' pointers, sizes, strides and dtypes, in either kernel's params (checked first:
// check_operands).
template <typename Params>
void set_operands(Params& p, const at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                  const std::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  p.m = M;
  p.n = N;
  p.k = K;
  p.dtype = dtype_of(x.scalar_type());
  p.x = x.data_ptr();
  p.x_row_stride = M == 1 ? K : x.stride(0);  // a single row's stride is never used
  p.w = w.data_ptr();
  p.w_row_stride = w.stride(0);
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.bias_dtype = dtype_of(bias.has_value() ? bias->scalar_type() : out.scalar_type());
  p.out = out.data_ptr();
  p.out_row_stride = M == 1 ? N : out.stride(0);
}

// The checks and the launch both TMA ops share: x [M, K] (its dtype checked by the caller), w, bias
// (x's dtype or float32; any of bfloat16 / float16 / float32 with bias_any_out_dtype), out [M, N]
// (its dtype checked by the caller), the configuration; fills p and launches.
void run_tma(sg::SkinnyTmaParams& p, at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
             const std::optional<at::Tensor>& bias, bool bias_any_out_dtype, int64_t tile_n, int64_t boxes_k,
             int64_t stages, int64_t split, bool pdl) {
  using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)
  TORCH_CHECK(x.is_cuda(), msg("x: expected a CUDA tensor, got device ", device_str(x)));
  const bool fp8 = x.scalar_type() == at::kFloat8_e4m3fn;
  const int64_t unit = fp8 ? 16 : 8;  // 16 bytes of K: the copy engine's row-stride unit
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M <= sg::kMaxM, msg("x: the TMA kernel takes at most ", sg::kMaxM, " rows (tokens), got ", M));
  TORCH_CHECK(M == 0 || (K >= unit && K % unit == 0),
              msg("x: K must be a positive multiple of ", unit, " (16-byte rows for the copy engine), got ", K));
  const int64_t N = check_operands(out, x, w, bias, unit, bias_any_out_dtype);
  const auto small = [](int64_t v) { return v >= 1 && v <= 1024; };  // checked before the narrowing below
  TORCH_CHECK(small(tile_n) && small(boxes_k) && small(stages),
              msg("config: (tile_n, boxes_k, stages) = (", tile_n, ", ", boxes_k, ", ", stages,
                  ") is not compiled; compiled: ", compiled_list()));
  TORCH_CHECK(split >= 1 && split <= sg::kMaxSplit,
              msg("config: split (K slices, the blocks of a cluster) must be 1 .. ", sg::kMaxSplit, ", got ", split));
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
  set_operands(p, out, x, w, bias);
  p.out_dtype = dtype_of(out.scalar_type());
  p.pdl = pdl;
  const cudaError_t err = sg::skinny_tma_launch(p, at::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, msg("skinny_tma: kernel launch failed: ", cudaGetErrorString(err)));
}

// The FP8 scales both compiled kernels' FP8 ops take: fp32, contiguous, [1] (per tensor) or one per
// token (x_scale [M]) / output row (w_scale [N]), on x's device, apart from out.
template <typename Params>
void check_scales(Params& p, const at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& x_scale,
                  const at::Tensor& w_scale) {
  using namespace fused_llm::binding;
  TORCH_CHECK(w.dim() == 2, msg("w: expected a 2-D [N, K] tensor, got ", w.dim(), "-D"));
  const int64_t M = x.size(0), N = w.size(0);
  const auto check_scale = [&](const at::Tensor& s, const char* name, int64_t rows, const char* what) {
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 1 && (s.size(0) == 1 || s.size(0) == rows) &&
                    s.is_contiguous(),
                msg(name, ": expected a contiguous float32 [1] (per tensor) or [", rows, "] (", what, ") tensor, got ",
                    s.scalar_type(), " ", shape_str(s)));
    check_same_device(s, name, x);
  };
  check_scale(x_scale, "x_scale", M, "per token");
  check_scale(w_scale, "w_scale", N, "per output row");
  p.x_scale = x_scale.data_ptr<float>();
  p.x_scale_per_token = x_scale.size(0) > 1;  // [1] with one row: the same element either way
  p.w_scale = w_scale.data_ptr<float>();
  p.w_scale_per_row = w_scale.size(0) > 1;
  TORCH_CHECK(!ranges_overlap(out, x_scale) && !ranges_overlap(out, w_scale),
              msg("out: overlaps x_scale or w_scale in memory (the output must be separate)"));
}

// The dtypes both compiled kernels' 16-bit ops take: x [M, K] bfloat16 or float16, out x's dtype.
void check_16bit_dtypes(const at::Tensor& out, const at::Tensor& x) {
  using namespace fused_llm::binding;
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [M, K] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              msg("x: expected dtype bfloat16 or float16, got ", x.scalar_type()));
  TORCH_CHECK(out.scalar_type() == x.scalar_type(),
              msg("out: expected dtype ", x.scalar_type(), " (x's), got ", out.scalar_type()));
}

// The FP8 ops' x and out dtypes: x float8_e4m3fn, out bfloat16, float16 or float32.
void check_fp8_dtypes(const at::Tensor& out, const at::Tensor& x) {
  using namespace fused_llm::binding;
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [M, K] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.scalar_type() == at::kFloat8_e4m3fn, msg("x: expected dtype float8_e4m3fn, got ", x.scalar_type()));
  const auto o = out.scalar_type();
  TORCH_CHECK(o == at::kBFloat16 || o == at::kHalf || o == at::kFloat,
              msg("out: expected dtype bfloat16, float16 or float32, got ", o));
}

// The checks and the launch both GEMV ops share: x [M, K] (its dtype checked by the caller), w,
// bias (x's dtype or float32; any of bfloat16 / float16 / float32 with bias_any_out_dtype), out
// [M, N] (its dtype checked by the caller), the configuration; fills p and launches.
void run_mma(sg::SkinnyMmaParams& p, at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
             const std::optional<at::Tensor>& bias, bool bias_any_out_dtype, int64_t row_groups, int64_t unroll,
             int64_t warps, int64_t stages, int64_t split, int64_t shared_x, int64_t segments, int64_t wgmma) {
  using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)
  TORCH_CHECK(x.is_cuda(), msg("x: expected a CUDA tensor, got device ", device_str(x)));
  const bool fp8 = x.scalar_type() == at::kFloat8_e4m3fn;
  const int64_t elem = fp8 ? 1 : 2, unit = 16 / elem;  // 16-byte loads
  const int64_t M = x.size(0), K = x.size(1);
  const auto small = [](int64_t v) { return v >= 1 && v <= 1024; };  // checked before the narrowing below
  const auto narrow = [&](int64_t v) { return static_cast<int>(small(v) ? v : 0); };
  // Out of range: 0, never a compiled value (-1 for stages, whose 0 is the register loop).
  p.config = {narrow(row_groups), narrow(unroll), narrow(warps), stages == 0 ? 0 : (small(stages) ? int(stages) : -1),
              narrow(split), shared_x == 0 ? 0 : (shared_x == 1 ? 1 : -1), segments == 0 ? 0 : narrow(segments),
              wgmma == 0 ? 0 : (wgmma == 1 ? 1 : -1)};
  TORCH_CHECK(sg::skinny_mma_config_supported(p.config),
              msg("config: (row_groups, unroll, warps, stages, split, shared_x, segments, wgmma) = (", row_groups, ", ",
                  unroll, ", ", warps, ", ", stages, ", ", split, ", ", shared_x, ", ", segments, ", ", wgmma,
                  ") is not compiled; compiled: ", mma_compiled_list()));
  const int max_m = sg::mma_max_m(p.config);
  TORCH_CHECK(M <= max_m, msg("x: this mma configuration takes at most ", max_m, " rows (tokens), got ", M));
  const int64_t step = sg::mma_step_bytes(p.config) / elem;  // K columns of one step
  TORCH_CHECK(M == 0 || (K >= step && K % step == 0),
              msg("x: K must be a positive multiple of ", step, " (one step of the configuration), got ", K));
  const int64_t N = check_operands(out, x, w, bias, unit, bias_any_out_dtype);
  TORCH_CHECK(N <= INT32_MAX, msg("w: expected at most 2^31 - 1 rows, got ", N));
  if (M == 0 || N == 0) return;

  const c10::cuda::CUDAGuard guard(x.device());
  const auto* props = at::cuda::getCurrentDeviceProperties();
  const int cc = props->major * 10 + props->minor;
  TORCH_CHECK(cc >= (fp8 ? 89 : 80),
              msg("skinny_mma: needs a GPU of capability ", fp8 ? "8.9 (mma.sync e4m3)" : "8.0 (mma.sync bf16)",
                  " or above, got ", props->major, ".", props->minor));
  TORCH_CHECK(split == 1 || cc >= 90, msg("config: split ", split, " runs in a thread-block cluster: needs a GPU of "
                                          "capability 9.0 or above, got ", props->major, ".", props->minor));
  TORCH_CHECK(wgmma == 0 || cc == 90, msg("config: the wgmma loop is sm_90a code: needs a GPU of capability 9.0, got ",
                                          props->major, ".", props->minor));
  set_operands(p, out, x, w, bias);
  p.out_dtype = dtype_of(out.scalar_type());
  const cudaError_t err = sg::skinny_mma_launch(p, at::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, msg("skinny_mma: kernel launch failed: ", cudaGetErrorString(err)));
}

}  // namespace

void skinny_tma(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t tile_n, int64_t boxes_k, int64_t stages, int64_t split, bool pdl) {
  check_16bit_dtypes(out, x);
  sg::SkinnyTmaParams p;
  run_tma(p, out, x, w, bias, /*bias_any_out_dtype=*/false, tile_n, boxes_k, stages, split, pdl);
}

void skinny_tma_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& x_scale,
                    const at::Tensor& w_scale, const std::optional<at::Tensor>& bias, int64_t tile_n, int64_t boxes_k,
                    int64_t stages, int64_t split, bool pdl) {
  check_fp8_dtypes(out, x);
  sg::SkinnyTmaParams p;
  check_scales(p, out, x, w, x_scale, w_scale);
  run_tma(p, out, x, w, bias, /*bias_any_out_dtype=*/true, tile_n, boxes_k, stages, split, pdl);
}

void skinny_mma(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t row_groups, int64_t unroll, int64_t warps, int64_t stages, int64_t split, int64_t shared_x,
                int64_t segments, int64_t wgmma) {
  check_16bit_dtypes(out, x);
  sg::SkinnyMmaParams p;
  run_mma(p, out, x, w, bias, /*bias_any_out_dtype=*/false, row_groups, unroll, warps, stages, split, shared_x,
          segments, wgmma);
}

void skinny_mma_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& x_scale,
                    const at::Tensor& w_scale, const std::optional<at::Tensor>& bias, int64_t row_groups,
                    int64_t unroll, int64_t warps, int64_t stages, int64_t split, int64_t shared_x,
                    int64_t segments, int64_t wgmma) {
  check_fp8_dtypes(out, x);
  sg::SkinnyMmaParams p;
  check_scales(p, out, x, w, x_scale, w_scale);
  run_mma(p, out, x, w, bias, /*bias_any_out_dtype=*/true, row_groups, unroll, warps, stages, split, shared_x,
          segments, wgmma);
}

std::vector<int64_t> skinny_mma_configs() {
  const sg::SkinnyMmaConfig* configs = nullptr;
  const int n = sg::skinny_mma_compiled_configs(&configs);
  return flat_configs(configs, n, mma_fields);
}

std::vector<int64_t> skinny_tma_configs() {
  const sg::SkinnyTmaConfig* configs = nullptr;
  const int n = sg::skinny_tma_compiled_configs(&configs);
  return flat_configs(configs, n, [](const sg::SkinnyTmaConfig& c) {
    return std::array<int, 4>{c.tile_n, c.boxes_k, c.stages, c.split};
  });
}
#endif  // CUDA_KERNEL

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
#if defined(CUDA_KERNEL)
  ops.def(
      "skinny_tma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int tile_n, int boxes_k, int stages, "
      "int split, bool pdl=True) -> ()");
  ops.impl("skinny_tma", c10::kCUDA, &skinny_tma);
  ops.def(
      "skinny_tma_fp8(Tensor(a!) out, Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, Tensor? bias, "
      "int tile_n, int boxes_k, int stages, int split, bool pdl=True) -> ()");
  ops.impl("skinny_tma_fp8", c10::kCUDA, &skinny_tma_fp8);
  ops.def("skinny_tma_configs() -> int[]", &skinny_tma_configs);
  ops.def(
      "skinny_mma(Tensor(a!) out, Tensor x, Tensor w, Tensor? bias, int row_groups, int unroll, int warps, int stages, "
      "int split, int shared_x=0, int segments=0, int wgmma=0) -> ()");
  ops.impl("skinny_mma", c10::kCUDA, &skinny_mma);
  ops.def(
      "skinny_mma_fp8(Tensor(a!) out, Tensor x, Tensor w, Tensor x_scale, Tensor w_scale, Tensor? bias, "
      "int row_groups, int unroll, int warps, int stages, int split, int shared_x=0, int segments=0, "
      "int wgmma=0) -> ()");
  ops.impl("skinny_mma_fp8", c10::kCUDA, &skinny_mma_fp8);
  ops.def("skinny_mma_configs() -> int[]", &skinny_mma_configs);
#else
  (void)ops;  // CPU / ROCm: the namespace only (see the top of this file)
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
