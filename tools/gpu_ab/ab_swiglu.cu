// swiglu-fp8 A/B: the same deterministic cases through swiglu_launch_gpu; one hash line per case.
#include "ab_common.h"
#include "swiglu_fp8.h"
using namespace fused_llm;  // DType, Quant, Fp8Format (common/kernel_types.h)
using namespace fused_llm::swiglu_fp8;
int main() {
  const int64_t rows_list[] = {1, 3, 64, 257, 2048};
  const int64_t d_list[] = {7, 64, 2048, 4096, 11008, 13331, 14336};
  const Quant quants[] = {Quant::kNone, Quant::kStatic, Quant::kDynamicToken, Quant::kDynamicGroup};
  float* static_scale; CK(cudaMalloc(&static_scale, 4)); const float s0 = 8.0f / 448.0f; CK(cudaMemcpy(static_scale, &s0, 4, cudaMemcpyHostToDevice));
  int cases = 0;
  for (int64_t rows : rows_list) for (int64_t d : d_list) for (int dt = 0; dt < 3; ++dt) for (Quant q : quants) for (int act = 0; act < 3; ++act) for (int gated = 0; gated < 2; ++gated) {
    if (!gated && q != Quant::kNone) continue;
    if (q == Quant::kDynamicGroup && d % 128 != 0) continue;
    if (rows * d > (int64_t)1 << 24) continue;
    const int64_t in_cols = gated ? 2 * d : d;
    const size_t eb = dt == 0 ? 4 : 2;
    void* x = make_input(dt, rows * in_cols, rows * 7 + d * 13 + dt + act * 5 + (int)q * 11, 4.0f, 0.0f);
    const size_t out_bytes = rows * d * (q == Quant::kNone ? eb : 1);
    void* out; CK(cudaMalloc(&out, out_bytes)); CK(cudaMemset(out, 0xcd, out_bytes));
    const int64_t groups = q == Quant::kDynamicGroup ? d / 128 : 1;
    float* scales = nullptr;
    if (q == Quant::kDynamicToken || q == Quant::kDynamicGroup) { CK(cudaMalloc(&scales, rows * groups * 4)); CK(cudaMemset(scales, 0xcd, rows * groups * 4)); }
    SwigluParams p; p.rows = rows; p.d = d; p.dtype = (DType)dt; p.act = (Activation)act; p.gated = gated; p.x = x; p.x_row_stride = in_cols;
    p.out = out; p.out_row_stride = d; p.quant = q; p.fp8_format = Fp8Format::kE4M3FN; p.static_scale = static_scale; p.scales = scales;
    p.scales_row_stride = groups; p.scales_group_stride = 1; p.group_size = q == Quant::kDynamicGroup ? 128 : 0; p.scale_ub = rows == 3 ? 1.5f : 0.0f;
    const int err = swiglu_launch_gpu(p, nullptr); CK(cudaDeviceSynchronize());
    std::printf("case rows=%lld d=%lld dt=%d q=%d act=%d gated=%d err=%d out=%016llx sc=%016llx\n", (long long)rows, (long long)d, dt, (int)q, act, gated, err,
                (unsigned long long)fnv(out, out_bytes), (unsigned long long)(scales ? fnv(scales, rows * groups * 4) : 0));
    ++cases;
    CK(cudaFree(x)); CK(cudaFree(out)); if (scales) CK(cudaFree(scales));
  }
  std::printf("cases %d\n", cases);
}
