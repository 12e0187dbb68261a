// GPU kernels of rmsnorm-fp8 (CUDA; hipified for ROCm gfx942). Framework-free: raw pointers,
// element strides and a stream in, a cudaError_t value out.
//
// For every row (T = input dtype, all statistics in fp32):
//   v   = T(x + residual) -> residual_out         (or v = x without a residual)
//   rstd = rsqrt(mean(v^2) + eps)
//   y   = T(float(T(v * rstd)) * weight)
//   out = y | e4m3(clamp(y * inv_scale, +-fp8_max)), inv_scale static, per row or per group.
//
// Two kernels:
//   * rms_norm_fast_kernel: 16-byte vectors, the whole row held in registers (read once from
//     global memory), TPR threads per row, ITERS vectors per thread, several rows per block when
//     TPR is small. Used when pointers/strides are 16-byte aligned and the row fits on chip.
//   * rms_norm_generic_kernel: one block per row, scalar strided loops, later passes re-read
//     v from global memory (L2). Any alignment, any H (1, 7, 10^6 ...).
// Launch configs are chosen in choose_fast_config(), outside the kernel bodies.
//
// Aliasing: residual_out may alias residual and out may alias x. In both kernels every element
// of x / residual is read by the thread that later writes the same element of out /
// residual_out, before it writes it; that is why x and residual use plain (coherent) loads and
// only weight goes through the read-only path (__ldg).

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/launch.h"
#include "common/pdl.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "rmsnorm_fp8.h"

namespace fused_llm {
namespace rmsnorm_fp8 {
namespace {

// ---- kernel arguments --------------------------------------------------------------------
struct KernelArgs {
  const void* x;             // [rows, H], row stride x_stride
  const void* residual;      // [rows, H] or nullptr
  const void* weight;        // [H]
  void* residual_out;        // [rows, H] when residual != nullptr
  void* out;                 // [rows, H]: T (kNone) or fp8 bytes
  int64_t x_stride, residual_stride, residual_out_stride, out_stride;  // elements
  int64_t rows;
  int64_t hidden;
  float inv_hidden;          // 1 / H: mean = sum * (1 / H), as torch's mean reduction does
  float eps;
  const float* static_scale;  // [1] (kStatic)
  float* scales;              // token: [rows]; group: [rows, H / group_size]
  int64_t scales_row_stride, scales_group_stride;
  float scale_ub;             // > 0: upper bound on amax
  float fp8_max;              // 448 (fn) or 240 (fnuz)
  float min_scale;            // kMinScaleFactor / fp8_max
  int group_size;             // elements per group (kQGroup)
  // fast kernel only
  int nvec;                   // H / VEC
  int tpr_log2;               // threads per row = 1 << tpr_log2
  int rows_per_block;
  int group_vecs_log2;        // group_size / VEC = 1 << group_vecs_log2 (kQGroup)
};

// Fast kernel register budget: ITERS <= 4 fits 64 registers, so 1024-thread blocks (2048
// resident threads/SM at <= 32 registers, 1024 at 64). ITERS 8 would need ~100-128 registers
// and 512-thread blocks, covering no more columns than 1024 x 4, so it is not instantiated.
constexpr int kFastMaxThreads = 1024;
constexpr int kFastMaxIters = 4;

// ---- fast kernel -------------------------------------------------------------------------
// Thread t of a row handles vectors j * TPR + t, j < ITERS. Block = rows_per_block x TPR.
template <class T, int ITERS, int QM, int FMT>
__global__ void __launch_bounds__(kFastMaxThreads)
    rms_norm_fast_kernel(const KernelArgs a) {
  pdl_launch_dependents();  // a PDL dependent may launch now (common/csrc/pdl.cuh)
  using E = Elem<T>;
  constexpr int kVec = 16 / E::kBytes;
  __shared__ float s_sum[kMaxWarps];
  __shared__ float s_max[kMaxWarps];

  const int tpr = 1 << a.tpr_log2;
  const int t = threadIdx.x & (tpr - 1);
  const int nvec = a.nvec;
  const int64_t row_raw = static_cast<int64_t>(blockIdx.x) * a.rows_per_block + (threadIdx.x >> a.tpr_log2);
  // Threads of a row past the end still take part in the shuffles; they load and store nothing.
  const bool row_ok = row_raw < a.rows;
  const int64_t row = row_ok ? row_raw : 0;
  const bool has_res = a.residual != nullptr;

  const char* x_row = static_cast<const char*>(a.x) + row * a.x_stride * E::kBytes;
  const char* r_row = static_cast<const char*>(a.residual) + row * a.residual_stride * E::kBytes;
  char* ro_row = static_cast<char*>(a.residual_out) + row * a.residual_out_stride * E::kBytes;

  // Issue every load of the row before any use: x and residual, and the weight too when
  // ITERS <= 2 (decode shapes: its latency would otherwise add a dependent round trip, and
  // 3 x 2 vectors fit the register budget; at ITERS 4 they do not, see below).
  Vec<4> v[ITERS];
  Vec<4> r[ITERS];
  Vec<4> w[ITERS];
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    const int vi = j * tpr + t;
    const bool in = vi < nvec;
    v[j] = (in && row_ok) ? load_vec<4>(x_row, vi) : zero_vec<4>();
    r[j] = (in && row_ok && has_res) ? load_vec<4>(r_row, vi) : zero_vec<4>();
    if constexpr (ITERS <= 2) w[j] = in ? load_vec_readonly<4>(a.weight, vi) : zero_vec<4>();
  }
  float inv_scale = 0.0f;
  if constexpr (QM == kQStatic) inv_scale = div_rn(1.0f, __ldg(a.static_scale));

  // v = T(x + residual) -> residual_out; sum of squares.
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    if (has_res) {
      v[j] = add_vec<T>(v[j], r[j]);  // T(x + residual), one packed add per pair
      const int vi = j * tpr + t;
      if (row_ok && vi < nvec) store_vec<4>(ro_row, vi, v[j]);
    }
    float f[kVec];
    unpack_vec<T>(v[j], f);
#pragma unroll
    for (int k = 0; k < kVec; ++k) ss = fmaf(f[k], f[k], ss);
  }
  // Weight loads go out before the reduction so their (mostly L2-hit) latency overlaps it.
  // Loading them together with x and residual would keep 3 x ITERS vectors live at once and
  // spill the 16-bit ITERS=4 kernels past their 64-register budget.
  if constexpr (ITERS > 2) {
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
      const int vi = j * tpr + t;
      w[j] = vi < nvec ? load_vec_readonly<4>(a.weight, vi) : zero_vec<4>();
    }
  }
  ss = row_reduce<ReduceSum>(ss, tpr, s_sum);
  const float rstd = rsqrtf(ss * a.inv_hidden + a.eps);

  // y = T(float(T(v * rstd)) * w), kept packed in v[]; |y| max for the token scale.
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    float f[kVec];
    unpack_vec<T>(v[j], f);
#pragma unroll
    for (int k = 0; k < kVec; ++k) f[k] *= rstd;
    // n = T(v * rstd) (2 elements per cvt), then y = T(n * w) as one packed multiply per pair.
    v[j] = mul_vec<T>(pack_vec<T, 4>(f), w[j]);
    if constexpr (QM == kQToken) {
      unpack_vec<T>(v[j], f);
#pragma unroll
      for (int k = 0; k < kVec; ++k) amax = fmaxf(amax, fabsf(f[k]));
    }
  }

  char* out_row = static_cast<char*>(a.out) + row * a.out_stride * (QM == kQNone ? E::kBytes : 1);
  if constexpr (QM == kQNone) {
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
      const int vi = j * tpr + t;
      if (row_ok && vi < nvec) store_vec<4>(out_row, vi, v[j]);
    }
    return;
  } else {
    if constexpr (QM == kQToken) {
      amax = row_reduce<ReduceAmax>(amax, tpr, s_max);
      const float scale = fp8_scale(amax, a.scale_ub, a.fp8_max, a.min_scale);
      if (row_ok && t == 0) a.scales[row * a.scales_row_stride] = scale;
      inv_scale = div_rn(1.0f, scale);
    }
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
      const int vi = j * tpr + t;
      float f[kVec];
      unpack_vec<T>(v[j], f);
      float inv = inv_scale;
      if constexpr (QM == kQGroup) {
        // A group is 1 << group_vecs_log2 consecutive vectors = as many adjacent lanes (same j).
        float gmax = 0.0f;
#pragma unroll
        for (int k = 0; k < kVec; ++k) gmax = fmaxf(gmax, fabsf(f[k]));
        const int gv = 1 << a.group_vecs_log2;
        gmax = warp_reduce<ReduceAmax>(gmax, gv);
        const float scale = fp8_scale(gmax, a.scale_ub, a.fp8_max, a.min_scale);
        if (row_ok && vi < nvec && (t & (gv - 1)) == 0)
          a.scales[row * a.scales_row_stride + (vi >> a.group_vecs_log2) * a.scales_group_stride] = scale;
        inv = div_rn(1.0f, scale);
      }
      const Vec<kVec / 4> q = fp8_pack_vec<kVec, FMT>(f, inv, a.fp8_max);
      if (row_ok && vi < nvec) store_vec<kVec / 4>(out_row, vi, q);
    }
  }
}

// ---- generic kernel ----------------------------------------------------------------------
// One block per row (blockDim a multiple of the warp size). Pass 1 reads x (+ residual), writes
// residual_out and sums v^2; later passes re-read v (from residual_out, else x) from L2.
// Element c is handled by thread c % blockDim in every pass except the per-group passes (one warp
// per group), which only read v after the reduction barrier and write fp8 out / scales.
template <class T>
__global__ void __launch_bounds__(1024, 1) rms_norm_generic_kernel(const KernelArgs a, int quant, int fmt) {
  pdl_launch_dependents();  // a PDL dependent may launch now (common/csrc/pdl.cuh)
  using E = Elem<T>;
  __shared__ float s_sum[kMaxWarps];
  __shared__ float s_max[kMaxWarps];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const int64_t H = a.hidden;
  const bool has_res = a.residual != nullptr;

  const char* x_row = static_cast<const char*>(a.x) + row * a.x_stride * E::kBytes;
  const char* r_row = static_cast<const char*>(a.residual) + row * a.residual_stride * E::kBytes;
  char* ro_row = static_cast<char*>(a.residual_out) + row * a.residual_out_stride * E::kBytes;
  char* out_row = static_cast<char*>(a.out) + row * a.out_stride * (quant == kQNone ? E::kBytes : 1);
  const void* v_row = has_res ? static_cast<const void*>(ro_row) : static_cast<const void*>(x_row);

  float ss = 0.0f;
  for (int64_t c = tid; c < H; c += nthreads) {
    float v = E::load(x_row, c);
    if (has_res) {
      v = E::round(v + E::load(r_row, c));
      E::store(ro_row, c, v);
    }
    ss = fmaf(v, v, ss);
  }
  ss = row_reduce<ReduceSum>(ss, nthreads, s_sum);  // its barrier also publishes residual_out
  const float rstd = rsqrtf(ss * a.inv_hidden + a.eps);
  auto y_at = [&](int64_t c) {
    const float n = E::round(E::load(v_row, c) * rstd);
    return E::round(n * E::load(a.weight, c));
  };

  if (quant == kQNone) {
    for (int64_t c = tid; c < H; c += nthreads) E::store(out_row, c, y_at(c));
    return;
  }
  uint8_t* q_row = reinterpret_cast<uint8_t*>(out_row);
  if (quant == kQStatic || quant == kQToken) {
    float inv;
    if (quant == kQStatic) {
      inv = div_rn(1.0f, *a.static_scale);
    } else {
      float amax = 0.0f;
      for (int64_t c = tid; c < H; c += nthreads) amax = fmaxf(amax, fabsf(y_at(c)));
      amax = row_reduce<ReduceAmax>(amax, nthreads, s_max);
      const float scale = fp8_scale(amax, a.scale_ub, a.fp8_max, a.min_scale);
      if (tid == 0) a.scales[row * a.scales_row_stride] = scale;
      inv = div_rn(1.0f, scale);
    }
    for (int64_t c = tid; c < H; c += nthreads) q_row[c] = fp8_one(clamp_fp8(y_at(c) * inv, a.fp8_max), fmt);
    return;
  }
  // Per group: one warp per group, lanes stride over the group's columns.
  const int lane = tid % kWarpSize;
  const int nwarps = nthreads / kWarpSize;
  const int64_t gs = a.group_size;
  const int64_t ngroups = H / gs;
  for (int64_t g = tid / kWarpSize; g < ngroups; g += nwarps) {
    float amax = 0.0f;
    for (int64_t c = g * gs + lane; c < (g + 1) * gs; c += kWarpSize) amax = fmaxf(amax, fabsf(y_at(c)));
    amax = warp_reduce<ReduceAmax>(amax, kWarpSize);
    const float scale = fp8_scale(amax, a.scale_ub, a.fp8_max, a.min_scale);
    if (lane == 0) a.scales[row * a.scales_row_stride + g * a.scales_group_stride] = scale;
    const float inv = div_rn(1.0f, scale);
    for (int64_t c = g * gs + lane; c < (g + 1) * gs; c += kWarpSize)
      q_row[c] = fp8_one(clamp_fp8(y_at(c) * inv, a.fp8_max), fmt);
  }
}

// ---- launch configuration ----------------------------------------------------------------
struct FastConfig {
  bool ok = false;
  int tpr = 0;              // threads per row, power of two
  int iters = 0;            // vectors per thread: 1, 2, 4
  int rows_per_block = 0;
};

// nvec = H / VEC vectors per row; group_vecs = vectors per quant group (1 outside group mode).
//
// One row per group of TPR threads, each thread holding ITERS vectors of the row in registers:
// * ITERS = 2 up to 1024 vectors (H <= 8192 in bf16/fp16), else 4 (up to 4096 vectors = H 32768
//   bf16; longer rows take the generic kernel). Measured on an H200 against ITERS 1 / 2 / 4 at
//   H 4096 / 8192 / 16384 and 1..1024 rows: this was the best or within 3% everywhere (e.g.
//   16384 x 256 rows: 10.4 us at ITERS 4 vs 11.6 at 2; 4096 x 512: 6.2 us at 2 vs 6.4 at 1).
//   More vectors per thread mean fewer threads per row, so more rows are resident at once
//   (64 registers at ITERS 4 still leave 1024 threads per SM) and the reductions are shorter.
// * TPR = next_pow2(ceil(nvec / ITERS)), raised to the group width in group mode.
// * rows per block: TPR < 256 packs 256 / TPR rows per block (256-thread blocks), but no more than
//   ceil(rows / num_sms) so that a few rows still spread over all SMs; rounded up so a block is
//   a whole number of warps (the shuffles use the full-warp mask).
// Tried on an H200 and dropped (measured, not guessed):
// * splitting decode rows over a thread-block cluster (sm90, DSMEM reduction): no faster at
//   16384 columns (3.64 us either way at 1 row), slower at 4096 (2.95 vs 2.35 us);
// * a persistent kernel (one 2-vector row per block, the next row's loads issued before the
//   current row's reduction): 16.6 vs 17.3 us at 512 x 16384, but slower from 1024 rows on
//   (2048 x 16384: 66.1 vs 60.0 us; 16384 x 16384: 475 vs 447 us).
FastConfig choose_fast_config(int64_t nvec, int64_t rows, int num_sms, int group_vecs) {
  FastConfig c;
  int iters = nvec <= 1024 ? 2 : kFastMaxIters;
  int tpr = next_pow2((nvec + iters - 1) / iters);
  if (tpr < group_vecs) tpr = group_vecs;
  if (tpr > kFastMaxThreads) return c;  // the row does not fit in registers
  // Raising TPR to the group width (or a short row) may leave fewer vectors per thread.
  while (iters > 1 && static_cast<int64_t>(tpr) * (iters / 2) >= nvec) iters /= 2;
  int rpb = 1;
  if (tpr < 256) {
    const int64_t spread = (rows + num_sms - 1) / num_sms;
    rpb = static_cast<int>(spread < 256 / tpr ? spread : 256 / tpr);
    const int warp_rows = tpr < kWarpSize ? kWarpSize / tpr : 1;  // 256 / tpr is a multiple
    rpb = (rpb + warp_rows - 1) / warp_rows * warp_rows;
  }
  c.ok = true;
  c.tpr = tpr;
  c.iters = iters;
  c.rows_per_block = rpb;
  return c;
}

template <class T, int ITERS, int QM, int FMT>
cudaError_t launch_fast(const KernelArgs& a, const FastConfig& c, cudaStream_t stream) {
  const int64_t blocks = (a.rows + c.rows_per_block - 1) / c.rows_per_block;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  rms_norm_fast_kernel<T, ITERS, QM, FMT>
      <<<static_cast<unsigned>(blocks), c.tpr * c.rows_per_block, 0, stream>>>(a);
  return cudaGetLastError();
}

template <class T, int ITERS>
cudaError_t dispatch_quant(const RmsNormParams& p, const KernelArgs& a, const FastConfig& c,
                           cudaStream_t s) {
  const bool fnuz = p.fp8_format == Fp8Format::kE4M3FNUZ;
  switch (p.quant) {
    case Quant::kNone:
      return launch_fast<T, ITERS, kQNone, kFmtFn>(a, c, s);
    case Quant::kStatic:
      return fnuz ? launch_fast<T, ITERS, kQStatic, kFmtFnuz>(a, c, s)
                  : launch_fast<T, ITERS, kQStatic, kFmtFn>(a, c, s);
    case Quant::kDynamicToken:
      return fnuz ? launch_fast<T, ITERS, kQToken, kFmtFnuz>(a, c, s)
                  : launch_fast<T, ITERS, kQToken, kFmtFn>(a, c, s);
    case Quant::kDynamicGroup:
      return fnuz ? launch_fast<T, ITERS, kQGroup, kFmtFnuz>(a, c, s)
                  : launch_fast<T, ITERS, kQGroup, kFmtFn>(a, c, s);
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t launch_typed(const RmsNormParams& p, KernelArgs a, cudaStream_t s) {
  constexpr int eb = Elem<T>::kBytes;
  constexpr int vec = 16 / eb;
  const bool has_res = p.residual != nullptr;
  const bool is_group = p.quant == Quant::kDynamicGroup;

  // Fast path: every 16-byte access (and the VEC-byte fp8 stores) must be aligned, and a group
  // must be a power-of-two number of whole vectors inside one warp.
  const auto rows_ok16 = [](const void* ptr, int64_t stride) {
    return aligned(ptr, 16) && (stride * eb) % 16 == 0;
  };
  bool fast = p.hidden % vec == 0 && rows_ok16(p.x, p.x_row_stride) && aligned(p.weight, 16);
  if (has_res) {
    fast = fast && rows_ok16(p.residual, p.residual_row_stride) &&
           rows_ok16(p.residual_out, p.residual_out_row_stride);
  }
  if (p.quant == Quant::kNone) {
    fast = fast && rows_ok16(p.out, p.out_row_stride);
  } else {
    fast = fast && aligned(p.out, vec) && p.out_row_stride % vec == 0;
  }
  int group_vecs = 1;
  if (is_group) {
    group_vecs = group_vectors(p.group_size, vec);
    fast = fast && group_vecs > 0;
  }

  FastConfig c;
  if (fast) {
    int num_sms = 0;
    const cudaError_t e = sm_count(&num_sms);
    if (e != cudaSuccess) return e;
    c = choose_fast_config(p.hidden / vec, p.rows, num_sms, group_vecs);
  }
  if (c.ok) {
    a.nvec = static_cast<int>(p.hidden / vec);
    a.tpr_log2 = log2_exact(c.tpr);
    a.rows_per_block = c.rows_per_block;
    a.group_vecs_log2 = log2_exact(group_vecs);
    switch (c.iters) {
      case 1: return dispatch_quant<T, 1>(p, a, c, s);
      case 2: return dispatch_quant<T, 2>(p, a, c, s);
      case 4: return dispatch_quant<T, 4>(p, a, c, s);
      default: return cudaErrorInvalidConfiguration;
    }
  }

  // Generic kernel: one block per row; 1024 threads once a row has enough columns to use them.
  if (p.rows > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const int threads = p.hidden >= 8192 ? 1024 : 256;
  rms_norm_generic_kernel<T><<<static_cast<unsigned>(p.rows), threads, 0, s>>>(
      a, static_cast<int>(p.quant), static_cast<int>(p.fp8_format));
  return cudaGetLastError();
}

}  // namespace

int rms_norm_launch_gpu(const RmsNormParams& p, void* stream) {
  if (p.rows == 0) return 0;
  if (p.rows < 0 || p.hidden < 1 || p.x == nullptr || p.weight == nullptr || p.out == nullptr)
    return static_cast<int>(cudaErrorInvalidValue);
  if (p.residual != nullptr && p.residual_out == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  if (!quant_params_valid(p, p.hidden)) return static_cast<int>(cudaErrorInvalidValue);

  KernelArgs a{};
  a.x = p.x;
  a.residual = p.residual;
  a.weight = p.weight;
  a.residual_out = p.residual_out;
  a.out = p.out;
  a.x_stride = p.x_row_stride;
  a.residual_stride = p.residual_row_stride;
  a.residual_out_stride = p.residual_out_row_stride;
  a.out_stride = p.out_row_stride;
  a.rows = p.rows;
  a.hidden = p.hidden;
  a.inv_hidden = 1.0f / static_cast<float>(p.hidden);
  a.eps = p.eps;
  set_quant_args(a, p);

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(dispatch_dtype(p.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, a, s); }));
}

const char* gpu_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace rmsnorm_fp8
}  // namespace fused_llm
