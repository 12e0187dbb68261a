// skinny-gemm's plain-load tensor-core GEMV (skinny_mma.h says what it computes and why): the
// kernel and its launch by configuration, instantiated per input dtype in a unit of its own
// (skinny_mma_{bf16,f16,e4m3}.cu), so the dtypes compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
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

// The compiled configurations: (row_groups, unroll, warps, stages). Stages 0: the loads land in
// two register sets; not 4 chunks at 16 warps there: two register sets of them exceed the 128
// registers a thread of a 512-thread block may hold (spills). Stages > 0: a ring in shared memory
// (mma_smem_bytes: at most 96 KiB a block).
#define SKINNY_MMA_CONFIGS(X) \
  X(1, 1, 4, 0) X(1, 1, 8, 0) X(1, 1, 16, 0) X(1, 2, 4, 0) X(1, 2, 8, 0) X(1, 2, 16, 0) X(1, 4, 4, 0) X(1, 4, 8, 0) \
  X(2, 1, 4, 0) X(2, 1, 8, 0) X(2, 1, 16, 0) X(2, 2, 4, 0) X(2, 2, 8, 0) X(2, 2, 16, 0) X(2, 4, 4, 0) X(2, 4, 8, 0) \
  X(1, 1, 4, 8) X(1, 1, 8, 4) X(1, 1, 8, 8) X(1, 1, 16, 4) X(1, 2, 4, 4) X(1, 2, 4, 8) X(1, 2, 8, 3) X(1, 2, 8, 4) \
  X(1, 4, 4, 4) X(2, 1, 8, 4) X(2, 2, 4, 4) X(2, 2, 8, 3)

// Shared memory of a staged block: `stages` x (unroll chunks x (RG rows of W + 1 or 2 rows of x)) x
// 16 bytes a lane, for each warp.
constexpr int mma_smem_bytes(int rg, int unroll, int warps, int stages, bool two_tiles) {
  return stages * unroll * (rg + (two_tiles ? 2 : 1)) * 32 * 16 * warps;
}

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

__device__ __forceinline__ void cp_async_w(uint32_t dst, const uint8_t* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy));
}

__device__ __forceinline__ void cp_async_x(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ uint4 load_shared(uint32_t src) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(src));
  return r;
}

// The K loop with a shared-memory ring of STAGES steps a warp: each lane copies its own 16-byte
// pieces (cp.async) and reads back only those, so no barrier is needed between the lanes; the
// loads in flight are STAGES - 1 steps ahead instead of one, and cost no registers.
template <DType kIn, int RG, bool TWO_TILES, int U, int STAGES>
__device__ __forceinline__ void k_loop_staged(float (&acc)[RG][4], const uint8_t* const (&w)[RG], const uint8_t* xa,
                                              const uint8_t* xb, int steps, bool xa_live, bool xb_live,
                                              uint64_t policy) {
  constexpr int kStepBytes = kMmaChunkBytes * U;
  constexpr int kRows = RG + (TWO_TILES ? 2 : 1);  // 16-byte pieces a chunk: RG of W, 1 or 2 of x
  constexpr int kStageBytes = U * kRows * 32 * 16;  // a warp's stage
  extern __shared__ __align__(16) uint8_t ring[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + warp * STAGES * kStageBytes + lane * 16;
  // piece (u, j) of stage s: j < RG rows of W, then x rows g (and g + 8)
  const auto piece = [&](int s, int u, int j) { return base + s * kStageBytes + (u * kRows + j) * 32 * 16; };
  const auto issue = [&](int step, int s) {
    if (step < steps) {
      const int o = step * kStepBytes;
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int r = 0; r < RG; ++r) cp_async_w(piece(s, u, r), w[r] + o + kMmaChunkBytes * u, policy);
        cp_async_x(piece(s, u, RG), xa + o + kMmaChunkBytes * u);
        if (TWO_TILES) cp_async_x(piece(s, u, RG + 1), xb + o + kMmaChunkBytes * u);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);  // empty past the last step: the counts stay uniform
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s, s);
  int read = 0, write = STAGES - 1;
  for (int i = 0; i < steps; ++i) {
    issue(i + STAGES - 1, write);
    write = write + 1 == STAGES ? 0 : write + 1;
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));  // step i's pieces (this lane's) have landed
    Step<RG, U> st;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < RG; ++r) st.w[u][r] = load_shared(piece(read, u, r));
      st.xa[u] = load_shared(piece(read, u, RG));
      if (TWO_TILES) st.xb[u] = load_shared(piece(read, u, RG + 1));
    }
    read = read + 1 == STAGES ? 0 : read + 1;
    mma_chunks<kIn, RG, TWO_TILES, U>(st, acc, xa_live, xb_live);
  }
  asm volatile("cp.async.wait_all;\n" ::);
}

template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS, int STAGES>
__device__ __forceinline__ void gemv(const MmaArgs& a) {
  constexpr int kStepBytes = kMmaChunkBytes * U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * RG * 8;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  // Lane (g, t): rows row0 + 8 r + g of W (the last row for rows past n: read, never stored),
  // rows g and g + 8 of x (row 0 past m: read, zeroed before use), byte 16 t of each chunk, from
  // the warp's first step on. Whole steps only (the launcher's rule), so the loop has no
  // remainder: a remainder loop of single chunks cost 8 registers a thread (74 against 66 at
  // (1, 2, 8), bf16, sm_90), the difference between 3 and 4 blocks an SM.
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
  if constexpr (STAGES > 0) {
    k_loop_staged<kIn, RG, TWO_TILES, U, STAGES>(acc, w, xa, xb, steps, xa_live, xb_live, policy);
  } else if (steps > 0) {
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

template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) skinny_mma_kernel(const __grid_constant__ MmaArgs a) {
  if constexpr (kIn != DType::kFloat8E4M3 || kDeviceArch >= 890) {
    gemv<kIn, RG, TWO_TILES, U, WARPS, STAGES>(a);
  } else {
    __trap();
  }
}

// Launches one instance, a staged one first raising its dynamic shared-memory limit (once a
// device: a flag of this instance's own): by default the dynamic and static shared memory of a block
// must fit 48 KiB together, and a ring of 48 KiB beside the warps' sums (2 KiB) did not.
template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS, int STAGES>
cudaError_t launch_instance(const MmaArgs& a, cudaStream_t stream) {
  constexpr int kSmem = STAGES ? mma_smem_bytes(RG, U, WARPS, STAGES, TWO_TILES) : 0;
  const auto kernel = skinny_mma_kernel<kIn, RG, TWO_TILES, U, WARPS, STAGES>;
  if constexpr (kSmem > 0) {
    static std::atomic<uint64_t> raised{0};  // a bit a device ordinal < 64
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (!(raised.load(std::memory_order_relaxed) & bit)) {
      if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
          e != cudaSuccess) {
        return e;
      }
      raised.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  const dim3 grid(static_cast<unsigned>((int64_t(a.n) + 8 * RG - 1) / (8 * RG)));
  kernel<<<grid, WARPS * 32, kSmem, stream>>>(a);
  return cudaGetLastError();
}

template <DType kIn, int RG, int U, int WARPS, int STAGES>
cudaError_t launch_config(const MmaArgs& a, cudaStream_t stream) {
  return a.m > 8 ? launch_instance<kIn, RG, true, U, WARPS, STAGES>(a, stream)
                 : launch_instance<kIn, RG, false, U, WARPS, STAGES>(a, stream);
}

}  // namespace mma_detail

template <DType kIn>
cudaError_t launch_mma_dtype(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
#define SKINNY_MMA_CASE(RG, U, WARPS, STAGES)                                          \
  if (c.row_groups == RG && c.unroll == U && c.warps == WARPS && c.stages == STAGES) \
    return mma_detail::launch_config<kIn, RG, U, WARPS, STAGES>(a, stream);
  SKINNY_MMA_CONFIGS(SKINNY_MMA_CASE)
#undef SKINNY_MMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace skinny_gemm
}  // namespace fused_llm
