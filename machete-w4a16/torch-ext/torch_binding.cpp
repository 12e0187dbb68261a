// Torch binding of machete-w4a16. The package's default kernels are Python custom ops (Triton on
// CUDA / ROCm, plain torch on CPU: torch-ext/machete_w4a16/__init__.py), registered in this
// build's op namespace as torch.library fragments. This file defines that namespace
// (TORCH_LIBRARY) and, in CUDA builds only, the compiled small-M kernel's op:
//   w4a16_mma(Tensor! out, Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? bias,
//             int group_size, int split_k, int warps, int row_tiles, Tensor(a!)? counters,
//             bool ring=True, bool early_weights=False, Tensor? residual=None) -> ()
//   (ring: on sm90 code, the weights through a per-warp ring of TMA boxes where the tensors
//   allow it, w4a16_mma.h; False keeps the register kernel: A/B and tests.
//   early_weights: the caller's promise that the previous kernel on the stream did not write
//   qweight / scales / zeros, so the kernel reads them while that kernel finishes, w4a16_mma.h;
//   residual [M, N] of x's dtype: out = residual + the GEMM's rounded result, rounded again)
// and the Hopper large-M kernel's (capability 9.0 only: its code is sm_90a):
//   w4a16_wgmma(Tensor! out, Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? bias,
//               int group_size, int tile, int split_k, Tensor(a!)? counters) -> ()
// (w4a16_wgmma's split_k 0: stream-K over every block slot of the SMs, w4a16_wgmma.h.)
// counters (split_k > 1, or 0; w4a16_wgmma's 256-token tiles' split needs none: a thread-block
// cluster sums it): the arrival counter of each output tile, zero on entry, left zero.
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

#include "common/binding_utils.h"
#include "w4a16_mma.h"
#include "w4a16_wgmma.h"

namespace mw = fused_llm::machete_w4a16;

namespace {

// The arguments both compiled kernels take, checked before anything is written: x [M, K],
// qweight [N, K / 8], scales / zeros [groups, N], bias [N], out [M, N].
struct GemmShape {
  int64_t M, N, K;
  int group_shift;  // log2 of the group size, 31 for one group per channel
};

GemmShape check_gemm(const at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias,
                     int64_t group_size) {
  using namespace fused_llm::binding;  // msg, shape_str, device_str, checks (common/binding_utils.h)
  TORCH_CHECK(x.dim() == 2, msg("x: expected a 2-D [M, K] tensor, got ", x.dim(), "-D"));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              msg("x: expected dtype bfloat16 or float16, got ", x.scalar_type()));
  TORCH_CHECK(x.is_cuda(), msg("x: expected a CUDA tensor, got device ", device_str(x)));
  check_last_dim_contiguous(x, "x");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(qweight.scalar_type() == at::kInt && qweight.dim() == 2 && qweight.size(1) * 8 == K &&
                  qweight.is_contiguous(),
              msg("qweight: expected a contiguous int32 [N, ", K / 8, "] tensor, got ", qweight.scalar_type(), " ",
                  shape_str(qweight)));
  const int64_t N = qweight.size(0);
  TORCH_CHECK(group_size == -1 || (group_size >= 32 && (group_size & (group_size - 1)) == 0 && K % group_size == 0),
              msg("group_size: expected -1 or a power of two >= 32 dividing K = ", K, ", got ", group_size));
  const int64_t groups = group_size == -1 ? 1 : K / group_size;
  TORCH_CHECK(scales.scalar_type() == x.scalar_type() && scales.dim() == 2 && scales.size(0) == groups &&
                  scales.size(1) == N && scales.is_contiguous(),
              msg("scales: expected a contiguous ", x.scalar_type(), " [", groups, ", ", N, "] tensor, got ",
                  scales.scalar_type(), " ", shape_str(scales)));
  if (zeros.has_value()) {
    TORCH_CHECK(zeros->scalar_type() == at::kByte && zeros->dim() == 2 && zeros->size(0) == groups &&
                    zeros->size(1) == N && zeros->is_contiguous(),
                msg("zeros: expected a contiguous uint8 [", groups, ", ", N, "] tensor, got ", zeros->scalar_type(),
                    " ", shape_str(*zeros)));
    check_same_device(*zeros, "zeros", x);
  }
  if (bias.has_value()) {
    TORCH_CHECK((bias->scalar_type() == x.scalar_type() || bias->scalar_type() == at::kFloat) && bias->dim() == 1 &&
                    bias->size(0) == N && bias->is_contiguous(),
                msg("bias: expected a contiguous [", N, "] tensor of x's dtype or float32, got ", bias->scalar_type(),
                    " ", shape_str(*bias)));
    check_same_device(*bias, "bias", x);
  }
  TORCH_CHECK(out.scalar_type() == x.scalar_type() && out.dim() == 2 && out.size(0) == M && out.size(1) == N,
              msg("out: expected a ", x.scalar_type(), " [", M, ", ", N, "] tensor, got ", out.scalar_type(), " ",
                  shape_str(out)));
  check_last_dim_contiguous(out, "out");
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&qweight, "qweight"}, {&scales, "scales"},
                                {&out, "out"}}) {
    check_same_device(*t, name, x);
  }
  TORCH_CHECK(!ranges_overlap(out, x), msg("out: overlaps x in memory (the output must be separate)"));
  int shift = 31;
  if (group_size != -1) {
    shift = 0;
    while ((int64_t{1} << shift) < group_size) ++shift;
  }
  return {M, N, K, shift};
}

void check_counters(const std::optional<at::Tensor>& counters, int64_t needed, const at::Tensor& x) {
  using namespace fused_llm::binding;
  if (!counters.has_value()) return;
  TORCH_CHECK(counters->scalar_type() == at::kInt && counters->dim() == 1 && counters->is_contiguous() &&
                  counters->numel() >= needed,
              msg("counters: expected a contiguous int32 tensor of >= ", needed, " zeros, got ",
                  counters->scalar_type(), " ", shape_str(*counters)));
  check_same_device(*counters, "counters", x);
}

// The fields both kernels' parameter structs share.
template <class Params>
void fill_common(Params& p, const GemmShape& s, at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                 const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                 const std::optional<at::Tensor>& bias) {
  p.m = s.M;
  p.n = s.N;
  p.k = s.K;
  p.dtype = x.scalar_type() == at::kBFloat16 ? mw::DType::kBFloat16 : mw::DType::kFloat16;
  p.x = x.data_ptr();
  p.x_row_stride = s.M == 1 ? 8 : x.stride(0);  // a single row's stride is never used
  p.qweight = reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>());
  p.scales = scales.data_ptr();
  p.zeros = zeros.has_value() ? zeros->data_ptr<uint8_t>() : nullptr;
  p.group_shift = s.group_shift;
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.bias_fp32 = bias.has_value() && bias->scalar_type() == at::kFloat;
  p.out = out.data_ptr();
  p.out_row_stride = s.M == 1 ? s.N : out.stride(0);
}

// The tail both ops share: the kernel's own check, the launch on the current stream.
template <class Params, class Check, class Launch>
void check_and_launch(const Params& p, const at::Tensor& x, const char* op, Check check, Launch launch) {
  using fused_llm::binding::msg;
  const char* reason = check(p);
  TORCH_CHECK(reason == nullptr, msg(op, ": ", reason == nullptr ? "" : reason));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const cudaError_t err = launch(p, stream);
  TORCH_CHECK(err == cudaSuccess, msg(op, ": kernel launch failed: ", cudaGetErrorString(err)));
}

}  // namespace

void w4a16_mma(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
               const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias, int64_t group_size,
               int64_t split_k, int64_t warps, int64_t row_tiles, const std::optional<at::Tensor>& counters,
               bool ring, bool early_weights, const std::optional<at::Tensor>& residual) {
  using namespace fused_llm::binding;
  const GemmShape s = check_gemm(out, x, qweight, scales, zeros, bias, group_size);
  check_counters(counters, (s.N + mw::kTileRows - 1) / mw::kTileRows, x);
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == x.scalar_type() && residual->dim() == 2 && residual->size(0) == s.M &&
                    residual->size(1) == s.N,
                msg("residual: expected a ", x.scalar_type(), " [", s.M, ", ", s.N, "] tensor, got ",
                    residual->scalar_type(), " ", shape_str(*residual)));
    check_last_dim_contiguous(*residual, "residual");
    check_same_device(*residual, "residual", x);
  }
  if (s.M == 0 || s.N == 0) return;

  mw::W4A16MmaParams p;
  fill_common(p, s, out, x, qweight, scales, zeros, bias);
  p.split_k = static_cast<int>(split_k);
  p.warps = static_cast<int>(warps);
  p.row_tiles = static_cast<int>(row_tiles);
  p.ring = ring;
  p.early_weights = early_weights;
  if (residual.has_value()) {
    p.residual = residual->data_ptr();
    p.residual_row_stride = s.M == 1 ? s.N : residual->stride(0);
  }
  p.counters = counters.has_value() ? counters->data_ptr<int32_t>() : nullptr;
  const c10::cuda::CUDAGuard guard(x.device());
  p.sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;  // cached by ATen per device
  // The split-K partials [split_k, M, N] (for a split in range; the kernel's check names one out of range).
  at::Tensor partials;
  if (split_k > 1 && split_k <= s.K / mw::kWindow) {
    partials = at::empty({split_k, s.M, s.N}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  check_and_launch(p, x, "w4a16_mma", mw::w4a16_mma_check, mw::w4a16_mma_launch);
}

void w4a16_wgmma(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                 const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias, int64_t group_size,
                 int64_t tile, int64_t split_k, const std::optional<at::Tensor>& counters) {
  using fused_llm::binding::msg;
  const GemmShape s = check_gemm(out, x, qweight, scales, zeros, bias, group_size);
  TORCH_CHECK(tile >= 0 && tile <= 3,
              msg("tile: expected 0 (128 x 256), 1 (128 x 128), 2 (128 x 64) or 3 (64 x 256), got ", tile));
  // In range before the narrowing below (the kernel's check names the k / 64 bound).
  TORCH_CHECK(split_k >= 0 && split_k <= mw::kWgmmaMaxSplit,
              msg("w4a16_wgmma: split_k must be 0 (stream-K) or in 1 .. min(k / 64, 8), got ", split_k));
  mw::W4A16WgmmaParams p;
  fill_common(p, s, out, x, qweight, scales, zeros, bias);
  p.tile = static_cast<mw::WgmmaTile>(tile);
  p.split_k = static_cast<int>(split_k);
  check_counters(counters, mw::w4a16_wgmma_tiles(p), x);
  if (s.M == 0 || s.N == 0) return;
  p.counters = counters.has_value() ? counters->data_ptr<int32_t>() : nullptr;
  const c10::cuda::CUDAGuard guard(x.device());
  const auto* props = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(props->major == 9 && props->minor == 0,
              msg("w4a16_wgmma: needs a GPU of capability 9.0 (sm_90a code), got ", props->major, ".", props->minor));
  // Stream-K: one persistent block per block slot of the SMs (ATen caches the properties).
  if (split_k == 0) p.stream_blocks = props->multiProcessorCount * mw::wgmma_blocks_per_sm(p.tile);
  at::Tensor partials;  // the split's fp32 partials (the 128- / 64-token tiles, stream-K); the check follows
  if (const int64_t floats = mw::w4a16_wgmma_partial_floats(p); floats > 0) {
    partials = at::empty({floats}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  check_and_launch(p, x, "w4a16_wgmma", mw::w4a16_wgmma_check, mw::w4a16_wgmma_launch);
}
#endif  // CUDA_KERNEL

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
#if defined(CUDA_KERNEL)
  ops.def(
      "w4a16_mma(Tensor! out, Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? bias, int group_size, "
      "int split_k, int warps, int row_tiles, Tensor(a!)? counters, bool ring=True, bool early_weights=False, "
      "Tensor? residual=None) -> ()");
  ops.impl("w4a16_mma", c10::kCUDA, &w4a16_mma);
  ops.def(
      "w4a16_wgmma(Tensor! out, Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? bias, int group_size, "
      "int tile, int split_k, Tensor(a!)? counters) -> ()");
  ops.impl("w4a16_wgmma", c10::kCUDA, &w4a16_wgmma);
#else
  (void)ops;  // CPU / ROCm: the namespace only (see the top of this file)
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
