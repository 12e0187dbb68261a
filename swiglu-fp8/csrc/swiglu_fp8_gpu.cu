// GPU kernels of swiglu-fp8 (CUDA; hipified for ROCm gfx942). Framework-free: raw pointers,
// element strides and a stream in, a cudaError_t value out.
//
// For every row (T = input dtype; gate = x[row, :d], up = x[row, d:2d]):
//   h   = T(act(float(gate)))        act in fp32, rounded to T (fp32: no rounding)
//   y   = T(float(h) * float(up))    16-bit T: one packed multiply (exact product, rounded once)
//   out = y | e4m3(clamp(y * inv_scale, +-fp8_max)), inv_scale static, per row or per group.
//
// Activations (all in fp32):
//   * 16-bit T: silu(g) = g * rcp(1 + ex2(-g log2 e)) (ex2.approx.ftz + rcp.approx.ftz: two MUFU
//     ops, three FP32 ops); gelu_tanh uses the identical-in-exact-arithmetic form
//     g * sigmoid(2u) = g / (1 + exp(-2u)), u = sqrt(2/pi)
//     (g + 0.044715 g^3), which is well conditioned (0.5 g (1 + tanh(u)) cancels for g << 0, and
//     tanh.approx.f32 has a 2^-11 relative error, far too coarse there). The fast paths have a
//     relative error of ~2^-22 plus |t| 2^-24 (t the exponent: the rounding of g * log2 e), i.e.
//     <= ~1e-6 for |g| < 20; far below the 16-bit rounding, so the result differs from torch's
//     (accurate expf, then rounded) only when act(g) lies that close to a bf16/fp16 rounding
//     boundary: a 1-ulp difference in a small fraction of elements (more often for fp16).
//   * fp32 T: torch's own formulas with accurate libm: g / (1 + expf(-g)) (IEEE division),
//     0.5 g (1 + tanhf(u)).
//   * gelu (erf): g * 0.5 * (1 + erff(g * sqrt(1/2))) for every dtype (torch's form).
//   The activation is a runtime switch on a uniform value (one branch per 16-byte vector), not a
//   template parameter: it keeps the instantiation count at a third.
//
// Three kernels:
//   * swiglu_ew_kernel (kNone, kStatic, kDynamicGroup, and the ungated bare activation, which
//     is kNone without the up half): elementwise, 16-byte vectors (8-byte at decode sizes), grid =
//     rows x column chunks, ITEMS vectors per thread with every load issued before any use. A
//     quant group is 1 << group_vecs_log2 consecutive vectors = as many adjacent lanes, so its
//     max is an xor shuffle (no row reduction).
//   * swiglu_token_kernel (kDynamicToken): the row's y held in registers (ITERS vectors per
//     thread, TPR threads per row, several rows per block when TPR is small), a row max
//     reduction, then the quantized stores (rmsnorm-fp8's fast-kernel structure).
//   * swiglu_generic_kernel: one block per row, scalar strided loops; per-token recomputes y in
//     its second pass (gate/up re-read from L2). Any alignment, any d (1, 7, ...).
// Launch configs are chosen in choose_ew_config() / choose_token_config(), outside the kernels.
// x and out must not overlap (in-place is not supported).

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/launch.h"
#include "common/pdl.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "swiglu_fp8.h"

namespace fused_llm {
namespace swiglu_fp8 {
namespace {

// Activations as ints (mirrors of the header enum; the quantization modes and formats are in
// common/fp8.cuh).
constexpr int kActSilu = static_cast<int>(Activation::kSilu);
constexpr int kActGeluTanh = static_cast<int>(Activation::kGeluTanh);
constexpr int kActGelu = static_cast<int>(Activation::kGelu);

// The activations run hardware approximations where the result is rounded to 16 bits, which
// hides their ~2^-22 relative error (see the top of this file), and torch's accurate formulas
// for fp32 outputs.
template <class T>
constexpr bool kFastAct = Elem<T>::kBytes == 2;

// ---- activations -------------------------------------------------------------------------
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // torch's kBeta = sqrt(2) * (2/sqrt(pi)) / 2
constexpr float kKappa = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f;     // torch's kAlpha = M_SQRT1_2

// Hardware approximations for the 16-bit paths: 2^x and 1/x, flush-to-zero forms (one MUFU op
// each, no denormal fix-up instructions; 1/x of x >= 2^126 flushes to 0, i.e. act(g) = -0 instead
// of a ~1e-37 value for g in [-88.7, -87.3], where torch's exp has not yet overflowed).
__device__ __forceinline__ float fast_exp2(float x) {
#ifndef USE_ROCM
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

__device__ __forceinline__ float fast_rcp(float x) {
#ifndef USE_ROCM
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return __fdividef(1.0f, x);
#endif
}

constexpr float kLog2e = 1.4426950408889634f;

// g * sigmoid(z) given t = -z * log2(e): g / (1 + 2^t). g = -inf gives -inf * 0 = NaN, as torch's
// -inf / inf; NaN stays NaN.
__device__ __forceinline__ float mul_sigmoid_fast(float g, float t) { return g * fast_rcp(1.0f + fast_exp2(t)); }

// act(g) in fp32. kFast (16-bit T only): hardware ex2 / rcp approximations, see the top comment.
// !kFast: torch's formulas with accurate libm calls and IEEE division.
template <bool kFast>
__device__ __forceinline__ float act_silu(float g) {
  if constexpr (kFast) {
    return mul_sigmoid_fast(g, g * -kLog2e);
  } else {
    return div_rn(g, 1.0f + expf(-g));
  }
}

template <bool kFast>
__device__ __forceinline__ float act_gelu_tanh(float g) {
  if constexpr (kFast) {
    // 0.5 g (1 + tanh(u)) == g * sigmoid(2u); 2u = g (2 kBeta + 2 kBeta kKappa g^2), and the
    // -log2(e) of the exponent is folded into the two constants.
    constexpr float c0 = -2.0f * kSqrt2OverPi * kLog2e;
    constexpr float c1 = -2.0f * kSqrt2OverPi * kKappa * kLog2e;
    return mul_sigmoid_fast(g, g * fmaf(c1, g * g, c0));
  } else {
    const float cube = g * g * g;
    const float inner = kSqrt2OverPi * (g + kKappa * cube);
    return 0.5f * g * (1.0f + tanhf(inner));
  }
}

__device__ __forceinline__ float act_gelu(float g) { return g * 0.5f * (1.0f + erff(g * kSqrtHalf)); }

template <bool kFast>
__device__ __forceinline__ float act_scalar(float g, int act) {
  switch (act) {
    case kActSilu:
      return act_silu<kFast>(g);
    case kActGeluTanh:
      return act_gelu_tanh<kFast>(g);
    case kActGelu:
    default:
      return act_gelu(g);
  }
}

// h = T(act(gate)) for one vector, returned packed in T (one cvt per pair).
// The switch is on a uniform value: one branch per vector, each case a straight unrolled loop.
template <class T, int NW>
__device__ __forceinline__ Vec<NW> act_vec(const Vec<NW>& g, int act) {
  using E = Elem<T>;
  constexpr int kVec = NW * E::kPerWord;
  float f[kVec];
  unpack_vec<T>(g, f);
  if (act == kActSilu) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) f[k] = act_silu<kFastAct<T>>(f[k]);
  } else if (act == kActGeluTanh) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) f[k] = act_gelu_tanh<kFastAct<T>>(f[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) f[k] = act_gelu(f[k]);
  }
  return pack_vec<T, NW>(f);
}

// y = T(float(T(act(gate))) * float(up)): h, then one packed multiply per pair.
template <class T, int NW>
__device__ __forceinline__ Vec<NW> swiglu_vec(const Vec<NW>& g, const Vec<NW>& u, int act) {
  return mul_vec<T>(act_vec<T>(g, act), u);
}

// ---- kernel arguments --------------------------------------------------------------------
struct KernelArgs {
  const void* x;              // [rows, 2d], row stride x_stride
  void* out;                  // [rows, d]: T (kNone) or fp8 bytes, row stride out_stride
  int64_t x_stride, out_stride;  // elements
  int64_t rows;
  int64_t d;
  const float* static_scale;  // [1] (kStatic)
  float* scales;              // token: [rows]; group: [rows, d / group_size]
  int64_t scales_row_stride, scales_group_stride;
  float scale_ub;             // > 0: upper bound on amax
  float fp8_max;              // 448 (fn) or 240 (fnuz)
  float min_scale;            // kMinScaleFactor / fp8_max
  int group_size;             // elements per group (kQGroup)
  int act;                    // kAct*
  int gated;                  // 0: bare activation (x rows of d elements, kQNone)
  // fast kernels only
  int nvec;                   // d / VEC
  int group_vecs_log2;        // group_size / VEC = 1 << group_vecs_log2 (kQGroup)
  int tpr;                    // token kernel: threads per row
  int tpr_log2;               // token kernel, tpr <= warp size: tpr = 1 << tpr_log2
  int rows_per_block;         // token kernel
};

// scale = max(min(amax, ub) / fp8_max, floor); returns 1 / scale (IEEE divisions).
__device__ __forceinline__ float dynamic_scale(const KernelArgs& a, float amax, float* scale_out) {
  const float scale = fp8_scale(amax, a.scale_ub, a.fp8_max, a.min_scale);
  *scale_out = scale;
  return div_rn(1.0f, scale);
}

// Quantize one vector of y (as floats) and store its VEC fp8 bytes at vector index vi.
template <int kVec, int FMT>
__device__ __forceinline__ void store_fp8_vec(uint8_t* out_row, int vi, const float* f, float inv,
                                              float fp8_max) {
  store_vec<kVec / 4>(out_row, vi, fp8_pack_vec<kVec, FMT>(f, inv, fp8_max));
}

// ---- elementwise fast kernel (kNone / kStatic / kDynamicGroup) ----------------------------
// grid = (row blocks, column chunks), block = (threads per row chunk, rows per block); a chunk is
// ITEMS * blockDim.x vectors; thread t of a row handles vectors chunk_base + j * blockDim.x + t,
// j < ITEMS (coalesced per j). blockDim.y > 1 only for rows shorter than a warp (the row's lanes
// are adjacent, a power of two, so group shuffles stay inside the row). Lanes past the row end
// (or past the last row) load zeros, store nothing, and still take part in the group shuffles
// (their groups are wholly out of range: nvec and chunk_base are multiples of the group width).
constexpr int kEwMaxThreads = 512;

// GATED = false (with kQNone only): the bare activation, x rows of d elements, no up half.
// VB: bytes per vector, 16, or 8 for 16-bit T at decode sizes (see choose_ew_config).
template <class T, int ITEMS, int QM, int FMT, bool GATED, int VB>
__global__ void __launch_bounds__(kEwMaxThreads) swiglu_ew_kernel(const KernelArgs a) {
  pdl_launch_dependents();  // a PDL dependent may launch now (common/csrc/pdl.cuh)
  static_assert(GATED || QM == kQNone, "the ungated activation is not quantized");
  using E = Elem<T>;
  constexpr int NW = VB / 4;
  constexpr int kVec = VB / E::kBytes;
  const int64_t row_raw = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool row_ok = row_raw < a.rows;
  const int64_t row = row_ok ? row_raw : 0;
  const int nvec = a.nvec;
  const int nthreads = blockDim.x;
  const int base = static_cast<int>(blockIdx.y) * (ITEMS * nthreads) + static_cast<int>(threadIdx.x);

  const char* gate = static_cast<const char*>(a.x) + row * a.x_stride * E::kBytes;
  const char* up = gate + a.d * E::kBytes;

  // Every load of the thread goes out before any use.
  Vec<NW> g[ITEMS];
  Vec<NW> u[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int vi = base + j * nthreads;
    const bool in = row_ok && vi < nvec;
    g[j] = in ? load_vec<NW>(gate, vi) : zero_vec<NW>();
    if constexpr (GATED) u[j] = in ? load_vec<NW>(up, vi) : zero_vec<NW>();
  }
  float inv_scale = 0.0f;
  if constexpr (QM == kQStatic) inv_scale = div_rn(1.0f, __ldg(a.static_scale));

  char* out_row = static_cast<char*>(a.out) + row * a.out_stride * (QM == kQNone ? E::kBytes : 1);
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int vi = base + j * nthreads;
    const bool in = row_ok && vi < nvec;
    Vec<NW> y;
    if constexpr (GATED) {
      y = swiglu_vec<T>(g[j], u[j], a.act);
    } else {
      y = act_vec<T>(g[j], a.act);
    }
    if constexpr (QM == kQNone) {
      if (in) store_vec<NW>(out_row, vi, y);
    } else {
      float f[kVec];
      unpack_vec<T>(y, f);
      float inv = inv_scale;
      if constexpr (QM == kQGroup) {
        float gmax = 0.0f;
#pragma unroll
        for (int k = 0; k < kVec; ++k) gmax = fmaxf(gmax, fabsf(f[k]));
        const int gv = 1 << a.group_vecs_log2;
        gmax = warp_reduce<ReduceAmax>(gmax, gv);
        float scale;
        inv = dynamic_scale(a, gmax, &scale);
        if (in && (vi & (gv - 1)) == 0)
          a.scales[row * a.scales_row_stride + (vi >> a.group_vecs_log2) * a.scales_group_stride] = scale;
      }
      if (in) store_fp8_vec<kVec, FMT>(reinterpret_cast<uint8_t*>(out_row), vi, f, inv, a.fp8_max);
    }
  }
}

// ---- per-token fast kernel -----------------------------------------------------------------
// Thread t of a row handles vectors j * tpr + t, j < ITERS; y stays in registers (packed T)
// between the row max and the quantized stores. Block = rows_per_block x tpr (tpr > warp size:
// one row per block).
template <class T, int ITERS, int FMT>
__global__ void __launch_bounds__(1024) swiglu_token_kernel(const KernelArgs a) {
  pdl_launch_dependents();  // a PDL dependent may launch now (common/csrc/pdl.cuh)
  using E = Elem<T>;
  constexpr int kVec = 16 / E::kBytes;
  __shared__ float s_max[kMaxWarps];

  const int tpr = a.tpr;
  int t, local_row;
  if (tpr <= kWarpSize) {
    t = threadIdx.x & (tpr - 1);
    local_row = threadIdx.x >> a.tpr_log2;
  } else {
    t = threadIdx.x;
    local_row = 0;
  }
  const int nvec = a.nvec;
  const int64_t row_raw = static_cast<int64_t>(blockIdx.x) * a.rows_per_block + local_row;
  // Threads of a row past the end still take part in the shuffles; they load and store nothing.
  const bool row_ok = row_raw < a.rows;
  const int64_t row = row_ok ? row_raw : 0;

  const char* gate = static_cast<const char*>(a.x) + row * a.x_stride * E::kBytes;
  const char* up = gate + a.d * E::kBytes;

  Vec<4> v[ITERS];  // gate, then y
  Vec<4> u[ITERS];
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    const int vi = j * tpr + t;
    const bool in = row_ok && vi < nvec;
    v[j] = in ? load_vec<4>(gate, vi) : zero_vec<4>();
    u[j] = in ? load_vec<4>(up, vi) : zero_vec<4>();
  }
  // Zero inputs give y = 0, the identity of max |y|.
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    v[j] = swiglu_vec<T>(v[j], u[j], a.act);
    float f[kVec];
    unpack_vec<T>(v[j], f);
#pragma unroll
    for (int k = 0; k < kVec; ++k) amax = fmaxf(amax, fabsf(f[k]));
  }
  amax = row_reduce<ReduceAmax, WideRows::kBlock>(amax, tpr, s_max);
  float scale;
  const float inv = dynamic_scale(a, amax, &scale);
  if (row_ok && t == 0) a.scales[row * a.scales_row_stride] = scale;

  uint8_t* out_row = static_cast<uint8_t*>(a.out) + row * a.out_stride;
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    const int vi = j * tpr + t;
    if (row_ok && vi < nvec) {
      float f[kVec];
      unpack_vec<T>(v[j], f);
      store_fp8_vec<kVec, FMT>(out_row, vi, f, inv, a.fp8_max);
    }
  }
}

// ---- generic kernel ----------------------------------------------------------------------
// One block per row (blockDim a multiple of the warp size), scalar strided loops, any alignment.
// Per token: pass 1 computes max |y|, pass 2 recomputes y (gate/up from L2) and quantizes.
// Per group: one warp per group, lanes stride over the group's columns.
template <class T>
__global__ void __launch_bounds__(1024) swiglu_generic_kernel(const KernelArgs a, int quant, int fmt) {
  pdl_launch_dependents();  // a PDL dependent may launch now (common/csrc/pdl.cuh)
  using E = Elem<T>;
  __shared__ float s_max[kMaxWarps];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const int64_t d = a.d;
  const int act = a.act;

  const char* x_row = static_cast<const char*>(a.x) + row * a.x_stride * E::kBytes;
  const char* up_row = x_row + d * E::kBytes;
  char* out_row = static_cast<char*>(a.out) + row * a.out_stride * (quant == kQNone ? E::kBytes : 1);
  const bool gated = a.gated != 0;
  auto y_at = [&](int64_t c) {
    const float h = E::round(act_scalar<kFastAct<T>>(E::load(x_row, c), act));
    return gated ? E::round(h * E::load(up_row, c)) : h;
  };

  if (quant == kQNone) {
    for (int64_t c = tid; c < d; c += nthreads) E::store(out_row, c, y_at(c));
    return;
  }
  uint8_t* q_row = reinterpret_cast<uint8_t*>(out_row);
  if (quant == kQStatic || quant == kQToken) {
    float inv;
    if (quant == kQStatic) {
      inv = div_rn(1.0f, *a.static_scale);
    } else {
      float amax = 0.0f;
      for (int64_t c = tid; c < d; c += nthreads) amax = fmaxf(amax, fabsf(y_at(c)));
      amax = row_reduce<ReduceAmax, WideRows::kBlock>(amax, nthreads, s_max);
      float scale;
      inv = dynamic_scale(a, amax, &scale);
      if (tid == 0) a.scales[row * a.scales_row_stride] = scale;
    }
    for (int64_t c = tid; c < d; c += nthreads) q_row[c] = fp8_one(clamp_fp8(y_at(c) * inv, a.fp8_max), fmt);
    return;
  }
  const int lane = tid % kWarpSize;
  const int nwarps = nthreads / kWarpSize;
  const int64_t gs = a.group_size;
  const int64_t ngroups = d / gs;
  for (int64_t g = tid / kWarpSize; g < ngroups; g += nwarps) {
    float amax = 0.0f;
    for (int64_t c = g * gs + lane; c < (g + 1) * gs; c += kWarpSize) amax = fmaxf(amax, fabsf(y_at(c)));
    amax = warp_reduce<ReduceAmax>(amax, kWarpSize);
    float scale;
    const float inv = dynamic_scale(a, amax, &scale);
    if (lane == 0) a.scales[row * a.scales_row_stride + g * a.scales_group_stride] = scale;
    for (int64_t c = g * gs + lane; c < (g + 1) * gs; c += kWarpSize)
      q_row[c] = fp8_one(clamp_fp8(y_at(c) * inv, a.fp8_max), fmt);
  }
}

// ---- launch configuration ----------------------------------------------------------------
// Problems of at most this many 16-byte vectors per SM (rows * d / VEC <= num_sms * 2048) are
// "small": one vector per thread of a full GPU.
constexpr int kEwSmallVectorsPerSm = 2048;
// Small problems of 16-bit T up to this many 16-byte vectors per SM run 8-byte vectors (4
// elements per thread) in 256-thread blocks: the activation costs two MUFU ops per element (ex2,
// rcp), and the MUFU unit retires 4 lanes per clock per SM sub-partition, so a warp of
// 8-element vectors spends 16 x 8 = 128 clocks there; at decode sizes there are too few warps to
// hide that behind the DRAM latency, and twice the warps halve it. Measured on an H200
// (tools/swiglu_decode_tune.cu, static e4m3, graph replay, cold inputs), best 8-byte shape
// against best 16-byte shape: 1 x 4096 1.384 vs 1.422 us, 1 x 28672 1.555 vs 1.603, 16 x 14336
// 1.885 vs 1.921, 64 x 14336 2.730 vs 2.767, 256 x 4096 2.864 vs 2.904; past ~1000 vectors per
// SM it loses (128 x 14336: 3.906 vs 3.757, 256 x 8192: 4.237 vs 4.095).
constexpr int kEwHalfVectorsPerSm = 1024;

struct EwConfig {
  bool ok = false;
  int threads = 0;     // threads per row chunk (blockDim.x): a multiple of the warp size, or a
                       // power of two >= the group width for rows shorter than a warp
  int items = 0;       // vectors per thread: 1 or 2
  int64_t chunks = 0;  // column chunks per row (grid.y)
  int rows_per_block = 1;  // blockDim.y
};

// Elementwise kernel (kNone / kStatic / kDynamicGroup); nvec = d / VEC vectors per row.
// * Small problems (at most one vector per thread of a full GPU, rows * nvec <= num_sms * 2048,
//   i.e. decode and small prefill): ITEMS = 1, 128-thread blocks. A sweep of every block size
//   32..512 x ITEMS 1/2 on an H200 (tools/swiglu_decode_tune.cu, graph replay, d 4096..28672,
//   rows 1..128, static e4m3, cold and L2-resident inputs) found ITEMS = 1 faster than 2 at every
//   decode size (by 0.1-0.2 us) and 128 threads the fastest or within 0.02 us of it at all of
//   them: e.g. 1 row x 4096: 1.45 us against 1.49 (32 threads), 1.56 (512); 16 rows x 14336:
//   1.38 us L2-resident against 1.54 (32 threads). 64 or 32 threads only when 128 would leave
//   more than 1/16 of a row idle (short rows). The smaller of these problems (16-bit T, up to
//   kEwHalfVectorsPerSm) run 8-byte vectors in 256-thread blocks instead (see there).
// * Large problems: ITEMS = 2 (four 16-byte loads in flight per thread; with ~2048 resident
//   threads per SM that is ~4x the bytes in flight HBM needs), block 512..64 threads, the one
//   that wastes the least row tail (ties to the larger block): d = 11008 (1376 vectors) uses
//   128-vector chunks (2.3% idle) rather than 512 (11.6%).
// * Rows of <= 16 vectors (d <= 128 bf16) pack several rows per block (next_pow2(nvec) lanes
//   each, 256-thread blocks, no more than ceil(rows / num_sms) rows so that few rows still
//   spread), instead of leaving most of a 32-thread block idle.
// Row blocks go on grid.x (up to 2^31 - 1), chunks on grid.y (up to 65535).
EwConfig choose_ew_config(int64_t nvec, int64_t rows, int num_sms, bool small, int max_small_threads = 128) {
  EwConfig c;
  if (nvec <= 16) {
    c.items = 1;
    c.threads = next_pow2(nvec);
    c.chunks = 1;
    const int64_t spread = (rows + num_sms - 1) / num_sms;
    int rpb = static_cast<int>(spread < 256 / c.threads ? spread : 256 / c.threads);
    const int warp_rows = kWarpSize / c.threads;
    c.rows_per_block = (rpb + warp_rows - 1) / warp_rows * warp_rows;
    c.ok = (rows + c.rows_per_block - 1) / c.rows_per_block <= 0x7fffffff;
    return c;
  }
  c.items = small ? 1 : 2;
  const int cands_small[] = {256, 128, 64, kWarpSize};
  const int cands_large[] = {512, 256, 128, 64};
  const int ncands = 4;
  const int* cands = small ? cands_small : cands_large;
  int64_t best_waste = -1;
  for (int i = 0; i < ncands; ++i) {
    const int t = cands[i];
    if (t % kWarpSize != 0) continue;  // ROCm: 64-lane waves
    if (small && t > max_small_threads && i != ncands - 1) continue;
    const int64_t chunk = static_cast<int64_t>(t) * c.items;
    const int64_t chunks = (nvec + chunk - 1) / chunk;
    const int64_t waste = chunks * chunk - nvec;
    if (small) {
      // The first (largest) block that idles <= 1/16 of the row; else a single warp.
      if (waste * 16 <= nvec || i == ncands - 1) {
        c.threads = t;
        c.chunks = chunks;
        break;
      }
    } else if (best_waste < 0 || waste < best_waste) {
      best_waste = waste;
      c.threads = t;
      c.chunks = chunks;
    }
  }
  c.ok = c.threads > 0 && c.chunks <= 65535 && rows <= 0x7fffffff;
  return c;
}

struct TokenConfig {
  bool ok = false;
  int tpr = 0;             // threads per row: power of two <= warp size, else a warp multiple
  int iters = 0;           // vectors per thread: 1, 2, 4
  int rows_per_block = 0;
};

// Per-token kernel (rmsnorm-fp8's measured choices): one row per TPR threads, ITERS vectors per
// thread in registers.
// * ITERS = 2 up to 1024 vectors per row, else 4 (up to 4096 vectors = d 32768 bf16 / 16384
//   fp32; longer rows take the generic kernel). At ITERS 4 a thread holds 8 loaded vectors
//   (gate + up) before they collapse to 4 y vectors: within the 64 registers of a 1024-thread
//   block.
// * TPR = ceil(nvec / ITERS): rounded to a power of two when <= warp size (xor shuffles), else
//   to a warp multiple (one row per block; no power-of-two padding: d = 14336 bf16 runs 448
//   threads, not 512).
// * Rows of at most a warp (TPR <= warp size) pack 256 / TPR rows per block, but no more than
//   ceil(rows / num_sms) so that a few rows still spread over all SMs; rounded up so a block is
//   whole warps. Longer rows run one row per block (>= 64 threads: 32 resident blocks per SM
//   still fill it), which is what lets TPR be any warp multiple.
TokenConfig choose_token_config(int64_t nvec, int64_t rows, int num_sms) {
  TokenConfig c;
  int iters = nvec <= 1024 ? 2 : 4;
  const int64_t per = (nvec + iters - 1) / iters;
  int64_t tpr = per <= kWarpSize ? next_pow2(per) : (per + kWarpSize - 1) / kWarpSize * kWarpSize;
  if (tpr > 1024) return c;  // the row does not fit in registers
  // A short row padded to a power of two may need fewer vectors per thread.
  while (iters > 1 && tpr * (iters / 2) >= nvec) iters /= 2;
  int rpb = 1;
  if (tpr <= kWarpSize) {
    const int64_t spread = (rows + num_sms - 1) / num_sms;
    rpb = static_cast<int>(spread < 256 / tpr ? spread : 256 / tpr);
    const int warp_rows = kWarpSize / static_cast<int>(tpr);
    rpb = (rpb + warp_rows - 1) / warp_rows * warp_rows;
  }
  if ((rows + rpb - 1) / rpb > 0x7fffffff) return c;
  c.ok = true;
  c.tpr = static_cast<int>(tpr);
  c.iters = iters;
  c.rows_per_block = rpb;
  return c;
}

template <class T, int ITEMS, int QM, int FMT, bool GATED, int VB>
cudaError_t launch_ew(const KernelArgs& a, const EwConfig& c, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.rows + c.rows_per_block - 1) / c.rows_per_block),
                  static_cast<unsigned>(c.chunks));
  const dim3 block(static_cast<unsigned>(c.threads), static_cast<unsigned>(c.rows_per_block));
  swiglu_ew_kernel<T, ITEMS, QM, FMT, GATED, VB><<<grid, block, 0, s>>>(a);
  return cudaGetLastError();
}

template <class T, int ITEMS, int VB>
cudaError_t dispatch_ew(const SwigluParams& p, const KernelArgs& a, const EwConfig& c, cudaStream_t s) {
  const bool fnuz = p.fp8_format == Fp8Format::kE4M3FNUZ;
  if (!p.gated) return launch_ew<T, ITEMS, kQNone, kFmtFn, false, VB>(a, c, s);
  switch (p.quant) {
    case Quant::kNone:
      return launch_ew<T, ITEMS, kQNone, kFmtFn, true, VB>(a, c, s);
    case Quant::kStatic:
      return fnuz ? launch_ew<T, ITEMS, kQStatic, kFmtFnuz, true, VB>(a, c, s)
                  : launch_ew<T, ITEMS, kQStatic, kFmtFn, true, VB>(a, c, s);
    case Quant::kDynamicGroup:
      return fnuz ? launch_ew<T, ITEMS, kQGroup, kFmtFnuz, true, VB>(a, c, s)
                  : launch_ew<T, ITEMS, kQGroup, kFmtFn, true, VB>(a, c, s);
    default:
      return cudaErrorInvalidValue;
  }
}

template <class T, int ITERS>
cudaError_t launch_token(const SwigluParams& p, const KernelArgs& a, const TokenConfig& c, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((a.rows + c.rows_per_block - 1) / c.rows_per_block);
  const int threads = c.tpr * c.rows_per_block;
  if (p.fp8_format == Fp8Format::kE4M3FNUZ) {
    swiglu_token_kernel<T, ITERS, kFmtFnuz><<<blocks, threads, 0, s>>>(a);
  } else {
    swiglu_token_kernel<T, ITERS, kFmtFn><<<blocks, threads, 0, s>>>(a);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_typed(const SwigluParams& p, KernelArgs a, cudaStream_t s) {
  constexpr int eb = Elem<T>::kBytes;
  constexpr int vec = 16 / eb;
  const bool is_group = p.quant == Quant::kDynamicGroup;

  // Fast paths: every 16-byte gate / up load and every T (16 bytes) or fp8 (VEC bytes) store
  // must be aligned, and a group must be a power-of-two number of whole vectors inside a warp.
  bool fast = p.d % vec == 0 && p.d / vec <= 0x3fffffff && aligned(p.x, 16) &&
              (p.x_row_stride * eb) % 16 == 0;
  if (p.quant == Quant::kNone) {
    fast = fast && aligned(p.out, 16) && (p.out_row_stride * eb) % 16 == 0;
  } else {
    fast = fast && aligned(p.out, vec) && p.out_row_stride % vec == 0;
  }
  int group_vecs = 1;
  if (is_group) {
    group_vecs = group_vectors(p.group_size, vec);
    fast = fast && group_vecs > 0;
  }

  if (fast) {
    int num_sms = 0;
    const cudaError_t e = sm_count(&num_sms);
    if (e != cudaSuccess) return e;
    const int64_t nvec = p.d / vec;
    a.nvec = static_cast<int>(nvec);
    a.group_vecs_log2 = log2_exact(group_vecs);
    if (p.quant == Quant::kDynamicToken) {
      const TokenConfig c = choose_token_config(nvec, p.rows, num_sms);
      if (c.ok) {
        a.tpr = c.tpr;
        a.tpr_log2 = log2_exact(c.tpr);
        a.rows_per_block = c.rows_per_block;
        switch (c.iters) {
          case 1: return launch_token<T, 1>(p, a, c, s);
          case 2: return launch_token<T, 2>(p, a, c, s);
          case 4: return launch_token<T, 4>(p, a, c, s);
          default: return cudaErrorInvalidConfiguration;
        }
      }
    } else {
      const bool small = p.rows * nvec <= static_cast<int64_t>(num_sms) * kEwSmallVectorsPerSm;
      if constexpr (eb == 2) {
        if (small && nvec > 16 && 2 * group_vecs <= kWarpSize &&
            p.rows * nvec <= static_cast<int64_t>(num_sms) * kEwHalfVectorsPerSm) {
          // 8-byte vectors: twice the threads for the same row (see kEwHalfVectorsPerSm).
          const EwConfig c = choose_ew_config(2 * nvec, p.rows, num_sms, true, 256);
          if (c.ok) {
            a.nvec = static_cast<int>(2 * nvec);
            a.group_vecs_log2 = log2_exact(2 * group_vecs);
            return dispatch_ew<T, 1, 8>(p, a, c, s);
          }
        }
      }
      const EwConfig c = choose_ew_config(nvec, p.rows, num_sms, small);
      if (c.ok) {
        return c.items == 1 ? dispatch_ew<T, 1, 16>(p, a, c, s) : dispatch_ew<T, 2, 16>(p, a, c, s);
      }
    }
  }

  // Generic kernel: one block per row; the block covers short rows with few idle warps and
  // takes 1024 threads once a row has enough columns to use them.
  if (p.rows > 0x7fffffff) return cudaErrorInvalidConfiguration;
  int threads;
  if (p.d >= 8192) {
    threads = 1024;
  } else {
    const int64_t want = (p.d + kWarpSize - 1) / kWarpSize * kWarpSize;
    threads = static_cast<int>(want < 256 ? want : 256);
  }
  swiglu_generic_kernel<T><<<static_cast<unsigned>(p.rows), threads, 0, s>>>(
      a, static_cast<int>(p.quant), static_cast<int>(p.fp8_format));
  return cudaGetLastError();
}

}  // namespace

int swiglu_launch_gpu(const SwigluParams& p, void* stream) {
  if (p.rows == 0) return 0;
  if (p.rows < 0 || p.d < 1 || p.x == nullptr || p.out == nullptr)
    return static_cast<int>(cudaErrorInvalidValue);
  switch (p.act) {
    case Activation::kSilu:
    case Activation::kGeluTanh:
    case Activation::kGelu:
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  if (!p.gated && p.quant != Quant::kNone) return static_cast<int>(cudaErrorInvalidValue);
  if (!quant_params_valid(p, p.d)) return static_cast<int>(cudaErrorInvalidValue);

  KernelArgs a{};
  a.x = p.x;
  a.out = p.out;
  a.x_stride = p.x_row_stride;
  a.out_stride = p.out_row_stride;
  a.rows = p.rows;
  a.d = p.d;
  set_quant_args(a, p);
  a.act = static_cast<int>(p.act);
  a.gated = p.gated ? 1 : 0;

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(dispatch_dtype(p.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, a, s); }));
}

const char* gpu_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace swiglu_fp8
}  // namespace fused_llm
