// rmsnorm-fp8 A/B: the same deterministic cases through rms_norm_launch_gpu; prints one hash line
// per case (outputs, residual_out, scales) and the timing of a few shapes.
#include "ab_common.h"
#include "rmsnorm_fp8.h"
using namespace fused_llm;  // DType, Quant, Fp8Format (common/kernel_types.h)
using namespace fused_llm::rmsnorm_fp8;
int main() {
  const int64_t rows_list[] = {1, 3, 64, 257, 2048};
  const int64_t hidden_list[] = {7, 64, 2048, 4096, 8192, 13331, 16384, 65536};
  const Quant quants[] = {Quant::kNone, Quant::kStatic, Quant::kDynamicToken, Quant::kDynamicGroup};
  float* static_scale; CK(cudaMalloc(&static_scale, 4)); const float s0 = 8.0f / 448.0f; CK(cudaMemcpy(static_scale, &s0, 4, cudaMemcpyHostToDevice));
  int cases = 0;
  for (int64_t rows : rows_list) for (int64_t H : hidden_list) for (int dt = 0; dt < 3; ++dt) for (Quant q : quants) for (int res = 0; res < 2; ++res) for (int fmt = 0; fmt < 2; ++fmt) {
    if (q == Quant::kNone && fmt == 1) continue;
    if (q == Quant::kDynamicGroup && H % 128 != 0) continue;
    if (rows * H > (int64_t)1 << 24) continue;
    const size_t n = rows * H, eb = dt == 0 ? 4 : 2;
    const uint64_t seed = rows * 1000003 + H * 31 + dt * 7 + (int)q * 3 + res;
    void* x = make_input(dt, n, seed, 2.0f, 0.0f);
    void* r = res ? make_input(dt, n, seed + 1, 1.0f, 0.0f) : nullptr;
    void* w = make_input(dt, H, seed + 2, 0.25f, 1.0f);
    void *out, *ro = nullptr; float* scales = nullptr;
    const size_t out_bytes = n * (q == Quant::kNone ? eb : 1);
    CK(cudaMalloc(&out, out_bytes)); CK(cudaMemset(out, 0xcd, out_bytes));
    if (res) { CK(cudaMalloc(&ro, n * eb)); CK(cudaMemset(ro, 0xcd, n * eb)); }
    const int64_t groups = q == Quant::kDynamicGroup ? H / 128 : 1;
    if (q == Quant::kDynamicToken || q == Quant::kDynamicGroup) { CK(cudaMalloc(&scales, rows * groups * 4)); CK(cudaMemset(scales, 0xcd, rows * groups * 4)); }
    RmsNormParams p; p.rows = rows; p.hidden = H; p.dtype = (DType)dt; p.x = x; p.x_row_stride = H; p.residual = r; p.residual_row_stride = H;
    p.weight = w; p.eps = 1e-6f; p.residual_out = ro; p.residual_out_row_stride = H; p.out = out; p.out_row_stride = H; p.quant = q;
    p.fp8_format = fmt ? Fp8Format::kE4M3FNUZ : Fp8Format::kE4M3FN; p.static_scale = static_scale; p.scales = scales;
    p.scales_row_stride = groups; p.scales_group_stride = 1; p.group_size = q == Quant::kDynamicGroup ? 128 : 0; p.scale_ub = (rows == 3) ? 1.5f : 0.0f;
    const int err = rms_norm_launch_gpu(p, nullptr); CK(cudaDeviceSynchronize());
    std::printf("case rows=%lld H=%lld dt=%d q=%d res=%d fmt=%d err=%d out=%016llx ro=%016llx sc=%016llx\n", (long long)rows, (long long)H, dt, (int)q, res, fmt, err,
                (unsigned long long)fnv(out, out_bytes), (unsigned long long)(res ? fnv(ro, n * eb) : 0), (unsigned long long)(scales ? fnv(scales, rows * groups * 4) : 0));
    ++cases;
    const bool timed = dt == 2 && res == 1 && fmt == 0 && (H == 4096 || H == 8192 || H == 16384) && (rows == 1 || rows == 64 || rows == 2048);
    if (timed) std::printf("time rows=%lld H=%lld q=%d %.3f us\n", (long long)rows, (long long)H, (int)q, time_us([&] { rms_norm_launch_gpu(p, nullptr); }));
    CK(cudaFree(x)); if (r) CK(cudaFree(r)); CK(cudaFree(w)); CK(cudaFree(out)); if (ro) CK(cudaFree(ro)); if (scales) CK(cudaFree(scales));
  }
  std::printf("cases %d\n", cases);
}
