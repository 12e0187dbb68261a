// skinny-gemm's plain-load tensor-core GEMV (skinny_mma.h says what it computes and why): the
// kernel, its compiled configurations and the launcher.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.h"
#include "skinny_device.cuh"
#include "skinny_mma.h"

namespace fused_llm {
namespace skinny_gemm {
namespace {

// W is read once: not kept in L1, and first out of L2 (an evict-first policy), so x (read by
// every block) stays.
__device__ __forceinline__ uint4 load_w(const void* p, uint64_t policy) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(policy));
  return r;
}

__device__ __forceinline__ uint4 load_x(const void* p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One step's registers: U chunks of RG weight rows' and the two x rows' 16 bytes.
template <int RG, int U>
struct Step {
  uint4 w[U][RG], xa[U], xb[U];
};

struct Args {
  const void* x;
  int64_t x_row_stride;
  const void* w;
  int64_t w_row_stride;
  const void* bias;
  DType bias_dtype;
  void* out;
  int64_t out_row_stride;
  int m, n, k;
};

// Lane (g, t)'s pointers: rows row0 + 8 r + g of W (the last row for rows past n: read, never
// stored), rows g and g + 8 of x (row 0 past m: read, zeroed before use), column 8 t.
template <int RG>
struct Lane {
  const uint16_t* w[RG];  // 16-bit elements of either dtype: only loaded as 16-byte words
  const uint16_t* xa;
  const uint16_t* xb;
  bool xa_live, xb_live;
};

template <int RG, bool TWO_TILES, int U>
__device__ __forceinline__ void load_step(Step<RG, U>& s, const Lane<RG>& l, int k, uint64_t policy) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int r = 0; r < RG; ++r) s.w[u][r] = load_w(l.w[r] + k + kMmaChunkK * u, policy);
    s.xa[u] = load_x(l.xa + k + kMmaChunkK * u);
    if (TWO_TILES) s.xb[u] = load_x(l.xb + k + kMmaChunkK * u);
  }
}

template <DType kIn, int RG, bool TWO_TILES, int U>
__device__ __forceinline__ void mma_chunks(Step<RG, U>& s, const Lane<RG>& l, float (*acc)[4]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (!l.xa_live) s.xa[u] = zero;
    if (!TWO_TILES || !l.xb_live) s.xb[u] = zero;
#pragma unroll
    for (int kstep = 0; kstep < 2; ++kstep) {  // the chunk's two k16 steps: words 2 s and 2 s + 1
      const int lo = 2 * kstep, hi = 2 * kstep + 1;
      const uint32_t x_frag[4] = {word(s.xa[u], lo), word(s.xb[u], lo), word(s.xa[u], hi), word(s.xb[u], hi)};
#pragma unroll
      for (int r = 0; r < RG; ++r) mma_step<kIn>(acc[r], x_frag, word(s.w[u][r], lo), word(s.w[u][r], hi));
    }
  }
}

template <DType kIn, int RG, bool TWO_TILES, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) skinny_mma_kernel(const Args a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * RG * 8;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  Lane<RG> l;
#pragma unroll
  for (int r = 0; r < RG; ++r) {
    l.w[r] = static_cast<const uint16_t*>(a.w) + int64_t(min(row0 + 8 * r + g, a.n - 1)) * a.w_row_stride + 8 * t;
  }
  l.xa_live = g < a.m;
  l.xb_live = g + 8 < a.m;
  l.xa = static_cast<const uint16_t*>(a.x) + (l.xa_live ? g : 0) * a.x_row_stride + 8 * t;
  l.xb = static_cast<const uint16_t*>(a.x) + (l.xb_live ? g + 8 : 0) * a.x_row_stride + 8 * t;

  // Warp `warp` takes chunks [c_lo, c_hi) of K's k / 32: whole steps of U, then single chunks.
  const int chunks = a.k / kMmaChunkK;
  const int per_warp = (chunks + WARPS - 1) / WARPS;
  const int c_lo = min(warp * per_warp, chunks), c_hi = min(c_lo + per_warp, chunks);
  const int steps = (c_hi - c_lo) / U;
  float acc[RG][4];
#pragma unroll
  for (int r = 0; r < RG; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
  constexpr int kStep = kMmaChunkK * U;
  int k = c_lo * kMmaChunkK;
  if (steps > 0) {
    // Two register sets: the next step's loads are in flight while this step's mmas run (one set
    // let the compiler sink each load next to its use: ~2 loads in flight, 33 us instead of 22 at
    // 2304 x 16384, H200, 2026-11-29).
    Step<RG, U> s0, s1;
    load_step<RG, TWO_TILES, U>(s0, l, k, policy);
    for (int i = 0; i < steps; i += 2) {
      if (i + 1 < steps) load_step<RG, TWO_TILES, U>(s1, l, k + kStep, policy);
      mma_chunks<kIn, RG, TWO_TILES, U>(s0, l, acc);
      if (i + 1 >= steps) break;
      if (i + 2 < steps) load_step<RG, TWO_TILES, U>(s0, l, k + 2 * kStep, policy);
      mma_chunks<kIn, RG, TWO_TILES, U>(s1, l, acc);
      k += 2 * kStep;
    }
    k = c_lo * kMmaChunkK + steps * kStep;
  }
  for (; k < c_hi * kMmaChunkK; k += kMmaChunkK) {
    Step<RG, 1> s;
    load_step<RG, TWO_TILES, 1>(s, l, k, policy);
    mma_chunks<kIn, RG, TWO_TILES, 1>(s, l, acc);
  }

  // The warps' tiles summed in warp order; thread i then owns C element (r, j) of lane i % 32:
  // token g + 8 (j / 2), row row0 + 8 r + 2 t + j % 2.
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
    if (a.bias != nullptr) v += load_bias(a.bias, a.bias_dtype, row);
    store_out(a.out, kIn, int64_t(token) * a.out_row_stride + row, v);
  }
}

// The compiled configurations: (row_groups, unroll, warps). Not 4 chunks at 16 warps: two
// register sets of them exceed the 128 registers a thread of a 512-thread block may hold (spills).
#define SKINNY_MMA_CONFIGS(X) \
  X(1, 1, 4) X(1, 1, 8) X(1, 1, 16) X(1, 2, 4) X(1, 2, 8) X(1, 2, 16) X(1, 4, 4) X(1, 4, 8) \
  X(2, 1, 4) X(2, 1, 8) X(2, 1, 16) X(2, 2, 4) X(2, 2, 8) X(2, 2, 16) X(2, 4, 4) X(2, 4, 8)

template <DType kIn, int RG, int U, int WARPS>
cudaError_t launch_config(const Args& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((int64_t(a.n) + 8 * RG - 1) / (8 * RG)));
  if (a.m > 8) {
    skinny_mma_kernel<kIn, RG, true, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  } else {
    skinny_mma_kernel<kIn, RG, false, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType kIn>
cudaError_t launch_dtype(const SkinnyMmaConfig& c, const Args& a, cudaStream_t stream) {
#define SKINNY_MMA_CASE(RG, U, WARPS) \
  if (c.row_groups == RG && c.unroll == U && c.warps == WARPS) return launch_config<kIn, RG, U, WARPS>(a, stream);
  SKINNY_MMA_CONFIGS(SKINNY_MMA_CASE)
#undef SKINNY_MMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace

bool skinny_mma_config_supported(const SkinnyMmaConfig& c) {
  const SkinnyMmaConfig* configs = nullptr;
  const int n = skinny_mma_compiled_configs(&configs);
  for (int i = 0; i < n; ++i) {
    const SkinnyMmaConfig& k = configs[i];
    if (c.row_groups == k.row_groups && c.unroll == k.unroll && c.warps == k.warps) return true;
  }
  return false;
}

int skinny_mma_compiled_configs(const SkinnyMmaConfig** configs) {
#define SKINNY_MMA_ENTRY(RG, U, WARPS) SkinnyMmaConfig{RG, U, WARPS},
  static const SkinnyMmaConfig kCompiled[] = {SKINNY_MMA_CONFIGS(SKINNY_MMA_ENTRY)};
#undef SKINNY_MMA_ENTRY
  *configs = kCompiled;
  return int(sizeof(kCompiled) / sizeof(kCompiled[0]));
}

cudaError_t skinny_mma_launch(const SkinnyMmaParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const bool sixteen = p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16;
  const bool bias_ok = p.bias == nullptr || p.bias_dtype == p.dtype || p.bias_dtype == DType::kFloat32;
  if (!sixteen || !bias_ok || p.m < 0 || p.m > kMmaMaxM || p.n < 0 || p.n > INT32_MAX || p.k < kMmaChunkK ||
      p.k % kMmaChunkK != 0 || p.k > INT32_MAX || !aligned(p.x, 16) || !aligned(p.w, 16) || p.w_row_stride % 8 != 0 ||
      (p.m > 1 && p.x_row_stride % 8 != 0) || !skinny_mma_config_supported(p.config)) {
    return cudaErrorNotSupported;
  }
  int cc = 0;
  if (const cudaError_t err = compute_capability(&cc); err != cudaSuccess) return err;
  if (cc < 80) return cudaErrorNotSupported;  // mma.sync bf16
  Args a;
  a.x = p.x;
  a.x_row_stride = p.x_row_stride;
  a.w = p.w;
  a.w_row_stride = p.w_row_stride;
  a.bias = p.bias;
  a.bias_dtype = p.bias_dtype;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  return p.dtype == DType::kBFloat16 ? launch_dtype<DType::kBFloat16>(p.config, a, stream)
                                     : launch_dtype<DType::kFloat16>(p.config, a, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
