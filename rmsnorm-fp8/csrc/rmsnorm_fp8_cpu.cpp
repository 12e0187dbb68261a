// CPU implementation of the rmsnorm-fp8 ops (framework-free C++). Same math and rounding
// order as the GPU kernel (see rmsnorm_fp8.h); the caller splits rows across threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_elem.h"
#include "rmsnorm_fp8.h"

namespace fused_llm {
namespace rmsnorm_fp8 {
namespace {

using cpu::dynamic_fp8_scale;
using cpu::Elem;
using cpu::quantize_fp8;
using cpu::round_to;

template <DType D>
void rows_impl(const RmsNormParams& p, int64_t row_begin, int64_t row_end) {
  using S = typename Elem<D>::Storage;
  const int64_t H = p.hidden;
  const S* w = static_cast<const S*>(p.weight);
  const float fp8_max = fp8_max_value(p.fp8_format);
  std::vector<float> y(static_cast<size_t>(H));
  for (int64_t r = row_begin; r < row_end; ++r) {
    const S* x = static_cast<const S*>(p.x) + r * p.x_row_stride;
    // Pass 1: v = T(x + residual), written to residual_out; sum of squares in fp32, over 8
    // interleaved partial sums (vectorizes, and keeps the error ~sqrt(H/8) ulps).
    float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (p.residual != nullptr) {
      const S* res = static_cast<const S*>(p.residual) + r * p.residual_row_stride;
      S* res_out = static_cast<S*>(p.residual_out) + r * p.residual_out_row_stride;
      for (int64_t i = 0; i < H; ++i) {
        const S v = Elem<D>::store(Elem<D>::load(x[i]) + Elem<D>::load(res[i]));
        const float vf = Elem<D>::load(v);
        y[i] = vf;
        res_out[i] = v;
        partial[i & 7] += vf * vf;
      }
    } else {
      for (int64_t i = 0; i < H; ++i) {
        const float vf = Elem<D>::load(x[i]);
        y[i] = vf;
        partial[i & 7] += vf * vf;
      }
    }
    float sumsq = 0.f;
    for (float ps : partial) sumsq += ps;
    const float rstd = 1.0f / std::sqrt(sumsq / static_cast<float>(H) + p.eps);
    // Pass 2: y = T(T(v * rstd) * w).
    for (int64_t i = 0; i < H; ++i) y[i] = round_to<D>(round_to<D>(y[i] * rstd) * Elem<D>::load(w[i]));

    if (p.quant == Quant::kNone) {
      S* out = static_cast<S*>(p.out) + r * p.out_row_stride;
      for (int64_t i = 0; i < H; ++i) out[i] = Elem<D>::store(y[i]);
      continue;
    }
    uint8_t* q = static_cast<uint8_t*>(p.out) + r * p.out_row_stride;
    auto quantize = [&](int64_t begin, int64_t end, float inv_scale) {
      for (int64_t i = begin; i < end; ++i) q[i] = quantize_fp8(y[i], inv_scale, fp8_max, p.fp8_format);
    };
    auto dynamic_scale = [&](int64_t begin, int64_t end) {
      return dynamic_fp8_scale(y.data() + begin, end - begin, p.scale_ub, fp8_max);
    };
    if (p.quant == Quant::kStatic) {
      quantize(0, H, 1.0f / p.static_scale[0]);
    } else if (p.quant == Quant::kDynamicToken) {
      const float scale = dynamic_scale(0, H);
      p.scales[r * p.scales_row_stride] = scale;
      quantize(0, H, 1.0f / scale);
    } else {
      for (int64_t g = 0; g * p.group_size < H; ++g) {
        const int64_t begin = g * p.group_size, end = begin + p.group_size;
        const float scale = dynamic_scale(begin, end);
        p.scales[r * p.scales_row_stride + g * p.scales_group_stride] = scale;
        quantize(begin, end, 1.0f / scale);
      }
    }
  }
}

}  // namespace

void rms_norm_cpu(const RmsNormParams& p, int64_t row_begin, int64_t row_end) {
  cpu::dispatch_dtype(p.dtype, [&](auto d) { rows_impl<decltype(d)::value>(p, row_begin, row_end); });
}

}  // namespace rmsnorm_fp8
}  // namespace fused_llm
