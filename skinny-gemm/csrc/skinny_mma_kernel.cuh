// skinny-gemm's plain-load tensor-core GEMV (skinny_mma.h says what it computes and why): the
// kernel and its launch by configuration, instantiated per input dtype in a unit of its own
// (skinny_mma_{bf16,f16,e4m3}.cu), so the dtypes compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "skinny_device.cuh"
#include "skinny_mma.h"

namespace fused_llm {
namespace skinny_gemm {

// What the kernel reads, in bytes: the launcher's checks done (skinny_mma.cu).
struct MmaArgs {
  const uint8_t* x;
  int64_t x_row_bytes;
  const uint8_t* w;
  int64_t w_row_bytes;
  const void* bias;
  DType bias_dtype;
  const float* x_scale;  // e4m3 only
  const float* w_scale;
  int x_scale_step;  // 0 (per tensor) or 1 (per token)
  int w_scale_step;  // 0 (per tensor) or 1 (per output row)
  void* out;
  DType out_dtype;
  int64_t out_row_stride;
  int m, n;
  int steps;           // K's steps of `unroll` chunks
  int steps_per_warp;  // ceil(steps / warps): warp q takes steps [q s, (q + 1) s) of them
};

// The compiled configurations: (row_groups, unroll, warps). Not 4 chunks at 16 warps: two
// register sets of them exceed the 128 registers a thread of a 512-thread block may hold (spills).
#define SKINNY_MMA_CONFIGS(X) \
  X(1, 1, 4) X(1, 1, 8) X(1, 1, 16) X(1, 2, 4) X(1, 2, 8) X(1, 2, 16) X(1, 4, 4) X(1, 4, 8) \
  X(2, 1, 4) X(2, 1, 8) X(2, 1, 16) X(2, 2, 4) X(2, 2, 8) X(2, 2, 16) X(2, 4, 4) X(2, 4, 8)

cudaError_t launch_mma_bf16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);
cudaError_t launch_mma_f16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);
cudaError_t launch_mma_e4m3(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);

namespace mma_detail {

// W is read once: not kept in L1, and first out of L2 (an evict-first policy), so x (read by
// every block) stays.
__device__ __forceinline__ uint4 load_w(const uint8_t* p, uint64_t policy) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(policy));
  return r;
}

__device__ __forceinline__ uint4 load_x(const uint8_t* p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// Every loaded register materialised before the step's first mma, so all of a step's loads are
// issued before any is waited on (without it ptxas may sink a load next to its use).
__device__ __forceinline__ void hold(uint4& v) { asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)); }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One step's registers: U chunks of RG weight rows' and the two x rows' 16 bytes.
template <int RG, int U>
struct Step {
  uint4 w[U][RG], xa[U], xb[U];
};

template <int RG, bool TWO_TILES, int U>
__device__ __forceinline__ void load_step(Step<RG, U>& s, const uint8_t* const (&w)[RG], const uint8_t* xa,
                                          const uint8_t* xb, int offset, uint64_t policy) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int o = offset + kMmaChunkBytes * u;
#pragma unroll
    for (int r = 0; r < RG; ++r) s.w[u][r] = load_w(w[r] + o, policy);
    s.xa[u] = load_x(xa + o);  // rows past m: row 0 loaded (the same sectors as row 0's lanes), zeroed in use
    if (TWO_TILES) s.xb[u] = load_x(xb + o);
  }
}

template <DType kIn, int RG, bool TWO_TILES, int U>
__device__ __forceinline__ void mma_chunks(Step<RG, U>& s, float (&acc)[RG][4], bool xa_live, bool xb_live) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int r = 0; r < RG; ++r) hold(s.w[u][r]);
    hold(s.xa[u]);
    if (TWO_TILES) hold(s.xb[u]);
    if (!xa_live) s.xa[u] = zero;
    if (!TWO_TILES || !xb_live) s.xb[u] = zero;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int kstep = 0; kstep < 2; ++kstep) {  // the chunk's two mma steps: words 2 s and 2 s + 1
      const int lo = 2 * kstep, hi = 2 * kstep + 1;
      const uint32_t x_frag[4] = {word(s.xa[u], lo), word(s.xb[u], lo), word(s.xa[u], hi), word(s.xb[u], hi)};
#pragma unroll
      for (int r = 0; r < RG; ++r) mma_step<kIn>(acc[r], x_frag, word(s.w[u][r], lo), word(s.w[u][r], hi));
    }
  }
}

template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS>
__device__ __forceinline__ void gemv(const MmaArgs& a) {
  constexpr int kStepBytes = kMmaChunkBytes * U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * RG * 8;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  // Lane (g, t): rows row0 + 8 r + g of W (the last row for rows past n: read, never stored),
  // rows g and g + 8 of x (row 0 past m: read, zeroed before use), byte 16 t of each chunk, from
  // the warp's first step on. Whole steps only (the launcher's rule), so the loop has no
  // remainder: with a remainder loop of single chunks (1, 2, 8) compiled to 74 registers a thread,
  // without it to 64 (bf16, sm_90): 3 against 4 blocks an SM, 26.1 against 22.0 us at 2304 x 16384
  // with 4 tokens (H200, in a layer).
  const int s_lo = min(warp * a.steps_per_warp, a.steps);
  const int steps = min(s_lo + a.steps_per_warp, a.steps) - s_lo;
  const int64_t k0 = int64_t(s_lo) * kStepBytes + 16 * t;
  const uint8_t* w[RG];
#pragma unroll
  for (int r = 0; r < RG; ++r) w[r] = a.w + int64_t(min(row0 + 8 * r + g, a.n - 1)) * a.w_row_bytes + k0;
  const bool xa_live = g < a.m, xb_live = TWO_TILES && g + 8 < a.m;
  const uint8_t* xa = a.x + (xa_live ? g : 0) * a.x_row_bytes + k0;
  const uint8_t* xb = a.x + (xb_live ? g + 8 : 0) * a.x_row_bytes + k0;

  float acc[RG][4];
#pragma unroll
  for (int r = 0; r < RG; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
  if (steps > 0) {
    // Two register sets: the next step's loads are in flight while this step's mmas run (one set
    // let the compiler sink each load next to its use: ~2 loads in flight, 33 us instead of 22 at
    // 2304 x 16384, H200, 2026-11-29).
    Step<RG, U> s0, s1;
    load_step<RG, TWO_TILES, U>(s0, w, xa, xb, 0, policy);
    for (int i = 0; i < steps; i += 2) {
      const bool more = i + 1 < steps;
      if (more) load_step<RG, TWO_TILES, U>(s1, w, xa, xb, (i + 1) * kStepBytes, policy);
      mma_chunks<kIn, RG, TWO_TILES, U>(s0, acc, xa_live, xb_live);
      if (!more) break;
      if (i + 2 < steps) load_step<RG, TWO_TILES, U>(s0, w, xa, xb, (i + 2) * kStepBytes, policy);
      mma_chunks<kIn, RG, TWO_TILES, U>(s1, acc, xa_live, xb_live);
    }
  }

  // The warps' tiles summed in warp order; thread i then owns C element (r, j) of lane i % 32:
  // token g + 8 (j / 2), row row0 + 8 r + 2 t + j % 2. Then the scales ((acc * x_scale) *
  // w_scale, as the Triton kernel), the bias, one rounding.
  __shared__ float partial[WARPS][RG * 4][32];
#pragma unroll
  for (int r = 0; r < RG; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][4 * r + j][lane] = acc[r][j];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < RG * 4 * 32; i += WARPS * 32) {
    const int ln = i % 32, rj = i / 32, r = rj / 4, j = rj % 4;
    const int token = (ln >> 2) + (j >= 2 ? 8 : 0), row = row0 + 8 * r + 2 * (ln & 3) + (j & 1);
    if (token >= a.m || row >= a.n) continue;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) v += partial[q][rj][ln];
    if constexpr (kIn == DType::kFloat8E4M3) v = v * a.x_scale[token * a.x_scale_step] * a.w_scale[row * a.w_scale_step];
    if (a.bias != nullptr) v += load_bias(a.bias, a.bias_dtype, row);
    store_out(a.out, a.out_dtype, int64_t(token) * a.out_row_stride + row, v);
  }
}

// mma.sync with e4m3 operands exists from sm_89 on: the sm_80 build has no FP8 kernel body (the
// launcher refuses FP8 below capability 8.9).
#if defined(__CUDA_ARCH__)
constexpr int kDeviceArch = __CUDA_ARCH__;
#else
constexpr int kDeviceArch = 1000;
#endif

template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) skinny_mma_kernel(const __grid_constant__ MmaArgs a) {
  if constexpr (kIn != DType::kFloat8E4M3 || kDeviceArch >= 890) {
    gemv<kIn, RG, TWO_TILES, U, WARPS>(a);
  } else {
    __trap();
  }
}

template <DType kIn, int RG, int U, int WARPS>
cudaError_t launch_config(const MmaArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((int64_t(a.n) + 8 * RG - 1) / (8 * RG)));
  if (a.m > 8) {
    skinny_mma_kernel<kIn, RG, true, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  } else {
    skinny_mma_kernel<kIn, RG, false, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace mma_detail

template <DType kIn>
cudaError_t launch_mma_dtype(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
#define SKINNY_MMA_CASE(RG, U, WARPS) \
  if (c.row_groups == RG && c.unroll == U && c.warps == WARPS) return mma_detail::launch_config<kIn, RG, U, WARPS>(a, stream);
  SKINNY_MMA_CONFIGS(SKINNY_MMA_CASE)
#undef SKINNY_MMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace skinny_gemm
}  // namespace fused_llm
