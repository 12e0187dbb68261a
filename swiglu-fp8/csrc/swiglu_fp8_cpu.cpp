// CPU implementation of the swiglu-fp8 ops (framework-free C++). Same math and rounding
// order as the GPU kernel (see swiglu_fp8.h); the caller splits rows across threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_elem.h"
#include "swiglu_fp8.h"

namespace fused_llm {
namespace swiglu_fp8 {
namespace {

using cpu::dynamic_fp8_scale;
using cpu::Elem;
using cpu::quantize_fp8;
using cpu::round_to;

// The activations in fp32 with the C library's accurate expf / tanhf / erff (the GPU kernel
// may use faster approximations within the tests' tolerance).
template <Activation A> float activate(float g);
template <> float activate<Activation::kSilu>(float g) { return g / (1.0f + std::exp(-g)); }
template <> float activate<Activation::kGeluTanh>(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}
template <> float activate<Activation::kGelu>(float g) {
  constexpr float kSqrtHalf = 0.7071067811865476f;
  return 0.5f * g * (1.0f + std::erf(g * kSqrtHalf));
}

// y = T(T(act(gate)) * up) as fp32, the value every output mode starts from.
template <DType D, Activation A>
float gated(const typename Elem<D>::Storage* gate, const typename Elem<D>::Storage* up, int64_t i) {
  const float h = round_to<D>(activate<A>(Elem<D>::load(gate[i])));
  return round_to<D>(h * Elem<D>::load(up[i]));
}

template <DType D, Activation A>
void rows_impl(const SwigluParams& p, int64_t row_begin, int64_t row_end) {
  using S = typename Elem<D>::Storage;
  const int64_t d = p.d;
  const float fp8_max = fp8_max_value(p.fp8_format);
  const bool dynamic = p.quant == Quant::kDynamicToken || p.quant == Quant::kDynamicGroup;
  std::vector<float> y(dynamic ? static_cast<size_t>(d) : 0);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const S* gate = static_cast<const S*>(p.x) + r * p.x_row_stride;
    const S* up = gate + d;

    if (!p.gated) {  // the bare activation: T(act(x)); x holds d elements per row
      S* out = static_cast<S*>(p.out) + r * p.out_row_stride;
      for (int64_t i = 0; i < d; ++i) out[i] = Elem<D>::store(activate<A>(Elem<D>::load(gate[i])));
      continue;
    }
    if (p.quant == Quant::kNone) {
      S* out = static_cast<S*>(p.out) + r * p.out_row_stride;
      for (int64_t i = 0; i < d; ++i) out[i] = Elem<D>::store(gated<D, A>(gate, up, i));
      continue;
    }
    uint8_t* q = static_cast<uint8_t*>(p.out) + r * p.out_row_stride;
    auto quantize = [&](float v, float inv_scale) { return quantize_fp8(v, inv_scale, fp8_max, p.fp8_format); };
    if (p.quant == Quant::kStatic) {
      const float inv_scale = 1.0f / p.static_scale[0];
      for (int64_t i = 0; i < d; ++i) q[i] = quantize(gated<D, A>(gate, up, i), inv_scale);
      continue;
    }
    // Dynamic: y is needed twice (absmax, then quantization), so it is kept for the row.
    for (int64_t i = 0; i < d; ++i) y[i] = gated<D, A>(gate, up, i);
    auto dynamic_scale = [&](int64_t begin, int64_t end) {
      return dynamic_fp8_scale(y.data() + begin, end - begin, p.scale_ub, fp8_max);
    };
    const int64_t group = p.quant == Quant::kDynamicToken ? d : p.group_size;
    for (int64_t g = 0; g * group < d; ++g) {
      const int64_t begin = g * group, end = begin + group;
      const float scale = dynamic_scale(begin, end);
      p.scales[r * p.scales_row_stride + g * p.scales_group_stride] = scale;
      const float inv_scale = 1.0f / scale;
      for (int64_t i = begin; i < end; ++i) q[i] = quantize(y[i], inv_scale);
    }
  }
}

template <DType D>
void rows_by_activation(const SwigluParams& p, int64_t row_begin, int64_t row_end) {
  switch (p.act) {
    case Activation::kSilu: return rows_impl<D, Activation::kSilu>(p, row_begin, row_end);
    case Activation::kGeluTanh: return rows_impl<D, Activation::kGeluTanh>(p, row_begin, row_end);
    case Activation::kGelu: return rows_impl<D, Activation::kGelu>(p, row_begin, row_end);
  }
}

}  // namespace

void swiglu_cpu(const SwigluParams& p, int64_t row_begin, int64_t row_end) {
  cpu::dispatch_dtype(p.dtype, [&](auto d) { rows_by_activation<decltype(d)::value>(p, row_begin, row_end); });
}

}  // namespace swiglu_fp8
}  // namespace fused_llm
