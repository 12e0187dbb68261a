// skinny-gemm's plain-load tensor-core GEMV (skinny_mma.h says what it computes and why): the
// kernel and its launch by configuration, instantiated per input dtype in a unit of its own
// (skinny_mma_{bf16,f16,e4m3}.cu), so the dtypes compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/launch.h"  // opt_in_dynamic_smem
#include "common/tma.cuh"     // smem_u32 and the cluster helpers (sm_90 split launches)
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
  int steps;  // K's steps of `unroll` chunks
};

// The compiled configurations of the register loop: (row_groups, unroll, warps). Not 4 chunks at
// 16 warps: two register sets of them exceed the 128 registers a thread of a 512-thread block may
// hold (spills).
#define SKINNY_MMA_CONFIGS(X) \
  X(1, 1, 4) X(1, 1, 8) X(1, 1, 16) X(1, 2, 4) X(1, 2, 8) X(1, 2, 16) X(1, 4, 4) X(1, 4, 8) \
  X(2, 1, 4) X(2, 1, 8) X(2, 1, 16) X(2, 2, 4) X(2, 2, 8) X(2, 2, 16) X(2, 4, 4) X(2, 4, 8)

// The compiled configurations of the staged loop (4-chunk steps): (row_groups, warps, stages,
// split). Shared memory a block: warps x stages x (2.5 KiB a row group + 2 KiB a token tile); the
// set keeps 3-6 blocks an SM (blocks past what fits wait for a second wave: 2304 rows at 8 warps x
// 3 stages read in 26.7 us against 22.0 at 4 warps, H200, 4 tokens).
#define SKINNY_MMA_STAGED_CONFIGS(X)                                                                  \
  X(1, 4, 2, 1) X(1, 4, 3, 1) X(1, 8, 2, 1) X(1, 2, 3, 1) X(1, 4, 2, 2) X(1, 2, 2, 2) X(1, 2, 3, 2) \
  X(1, 2, 2, 4) X(1, 4, 2, 4) X(2, 2, 2, 4) X(2, 2, 2, 2) X(2, 4, 2, 2) X(2, 4, 2, 4)

// The compiled configurations of the staged loop with x shared by the block's warps (shared_x):
// (row_groups, warps, stages, split), each split over a cluster (sm_90): the block's rows are
// 8 x row_groups x warps, so 2304 rows at 4 warps are 72 row blocks, 288 blocks at split 4.
#define SKINNY_MMA_SHARED_X_CONFIGS(X) X(1, 4, 2, 4) X(1, 4, 3, 4) X(1, 8, 2, 4) X(1, 8, 2, 8) X(2, 4, 2, 8)

// The compiled configurations of the row-run loop: (segments, runs a span, spans a step, warps).
// Each takes up to two token tiles: 16 tokens at 2 segments, 8 at 4, 4 at 8. The set is the H200
// probe's fastest at 2 / 4 / 8 tokens (2304 x 16384 bf16) and their neighbours.
#define SKINNY_MMA_ROW_RUN_CONFIGS(X)                                                                     \
  X(8, 4, 2, 8) X(8, 4, 2, 4) X(8, 2, 2, 16) X(8, 2, 2, 8) X(8, 2, 1, 8) X(8, 4, 1, 8) X(4, 1, 2, 8) \
  X(4, 1, 2, 4) X(4, 1, 4, 8) X(4, 2, 1, 8) X(4, 2, 2, 4) X(4, 2, 2, 8) X(4, 4, 1, 4) X(2, 1, 2, 8) X(2, 2, 2, 8)

// The compiled configurations of the wgmma loop (sm_90a, skinny_wgmma_kernel.cuh): (segments, chunks a
// step, warps: 4 a K part, stages); `split` 1-4 at run time (a cluster). The first is the H200 probe's
// fastest at 16 tokens (2304 x 16384: 216 blocks at split 3, 2 an SM, 97 KiB of ring each).
#define SKINNY_WGMMA_CONFIGS(X) X(2, 1, 8, 4) X(2, 1, 4, 4) X(2, 1, 8, 3) X(2, 2, 4, 3) X(1, 2, 4, 3) X(1, 2, 8, 3)

// The wgmma loop's launches, in the 9.0a units (skinny_wgmma_{bf16,f16,e4m3}.cu).
cudaError_t launch_wgmma_bf16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);
cudaError_t launch_wgmma_f16(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);
cudaError_t launch_wgmma_e4m3(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream);

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

// Part `i` of `parts` even ranges of [0, total): ceil(total / parts) each, the last ones shorter or
// empty. How every loop here cuts K's steps over a cluster's blocks and a block's warps.
struct StepRange {
  int lo, n;
};
__device__ __forceinline__ StepRange even_part(int total, int parts, int i) {
  const int per = (total + parts - 1) / parts;
  const int lo = min(i * per, total);
  return {lo, min(lo + per, total) - lo};
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

// C element (token, row) from its fp32 sum: the FP8 scales ((acc * x_scale) * w_scale, as the
// Triton kernel), the bias, one rounding, the store.
template <DType kIn>
__device__ __forceinline__ void store_c(const MmaArgs& a, int token, int row, float v) {
  if constexpr (kIn == DType::kFloat8E4M3) v = v * a.x_scale[token * a.x_scale_step] * a.w_scale[row * a.w_scale_step];
  if (a.bias != nullptr) v += load_bias(a.bias, a.bias_dtype, row);
  store_out(a.out, a.out_dtype, int64_t(token) * a.out_row_stride + row, v);
}

// The warps' tiles summed in warp order, then (SPLIT > 1, sm_90) the cluster's blocks' sums in
// rank order by block 0; thread i then owns C element (r, j) of lane i % 32: token g + 8 (j / 2),
// row row0 + 8 r + 2 t + j % 2, and stores it (store_c).
template <DType kIn, int RG, int WARPS, int SPLIT>
__device__ __forceinline__ void finish(const MmaArgs& a, const float (&acc)[RG][4], int row0, int rank) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float partial[WARPS][RG * 4][32];
  __shared__ float block_sum[SPLIT > 1 ? RG * 4 * 32 : 1];  // this block's sums, read by the cluster's block 0
#pragma unroll
  for (int r = 0; r < RG; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][4 * r + j][lane] = acc[r][j];
  }
  __syncthreads();
  if constexpr (SPLIT > 1) {
    for (int i = threadIdx.x; i < RG * 4 * 32; i += WARPS * 32) {
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < WARPS; ++q) v += partial[q][i / 32][i % 32];
      block_sum[i] = v;
    }
    tma::cluster_sync();  // every block's sum written (release / acquire at cluster scope)
  }
  if (SPLIT == 1 || rank == 0) {
    for (int i = threadIdx.x; i < RG * 4 * 32; i += WARPS * 32) {
      const int ln = i % 32, rj = i / 32, r = rj / 4, j = rj % 4;
      const int token = (ln >> 2) + (j >= 2 ? 8 : 0), row = row0 + 8 * r + 2 * (ln & 3) + (j & 1);
      if (token >= a.m || row >= a.n) continue;
      float v = 0.f;
      if constexpr (SPLIT > 1) {
        const uint32_t mine = tma::smem_u32(&block_sum[i]);
        for (int q = 0; q < SPLIT; ++q) v += tma::ld_cluster_f32(tma::map_to_cta(mine, q));
      } else {
#pragma unroll
        for (int q = 0; q < WARPS; ++q) v += partial[q][rj][ln];
      }
      store_c<kIn>(a, token, row, v);
    }
  }
  if constexpr (SPLIT > 1) tma::cluster_sync();  // the blocks' sums stay until block 0 has read them
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
  const StepRange mine = even_part(a.steps, WARPS, warp);
  const int steps = mine.n;
  const int64_t k0 = int64_t(mine.lo) * kStepBytes + 16 * t;
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

  finish<kIn, RG, WARPS, 1>(a, acc, row0, 0);
}

// ---- The staged loop: W read as whole row runs, fragments from shared memory ----------------
//
// Why: the register loop's loads each cover 64 bytes of 8 rows. On an H200, a loop of only loads
// in that pattern read 2304 x 16384 bf16 in 21.3 us in a layer, one whose loads each cover 256
// bytes of 2 rows in 19.9, FP8 11.9 against 10.8 (.exp trace probes, 2026-11-29): the wider
// request is worth ~1-2 us, as much as the 1.15x floor asks. So each warp copies, per step,
// 256 contiguous bytes of each of its block's 8 x row_groups rows (2 rows a cp.async instruction)
// into a per-warp ring of `stages` stages, and each lane reads its fragments back with ld.shared:
//
// * a stage is those rows' 256 bytes, each row padded to 320 bytes (rows 2p and 2p + 1 land 64
//   bytes = 16 banks apart, so a quarter-warp's 16-byte reads of fragments hit distinct banks),
//   then x's fragments: lane (g, t)'s 16 bytes of x row g (and g + 8) at byte 16 t of each
//   64-byte chunk, stored where that lane reads them back (it copies only its own bytes; lanes
//   past m copy nothing, and the garbage they read reaches only C rows past m, never stored);
// * building mma's A operand from those 16-byte reads costs register moves (29% of the 4-token
//   launch's executed instructions, ncu), yet fragments by ldmatrix from plain rows, which need
//   none, read 0.6-2.5 us slower at 2-8 bf16 tokens (one token tile's x read twice), and two
//   accumulator chains changed nothing (H200; docs/skinny-gemm-mma-gemv.md, nineteenth session);
// * cp.async.cg for W (L2 only, evict-first), .ca for x (read by every block: kept in L1);
//   `stages - 1` steps in flight; one __syncwarp before a stage is read (other lanes' copies)
//   and one after (before it is refilled);
// * `split` > 1 (sm_90): a cluster of `split` blocks shares a row group, each a K range, and
//   block 0 of the cluster sums the blocks' tiles in rank order through distributed shared
//   memory (deterministic). 2304 rows are 288 blocks: on 132 SMs, 24 SMs hold 3 and finish last
//   (H200 traces: the 3-block SMs' warps end 1-3.5 us after the others'); 576 blocks of 4 warps
//   spread 4-5 an SM (FP8 at 4 tokens: 15.0 -> 12.9 us).
constexpr int kStagedChunks = 4;                                        // 64-byte chunks a step
constexpr int kStagedStepBytes = kStagedChunks * kMmaChunkBytes;         // 256 bytes of a row a step
constexpr int kStagedRowBytes = kStagedStepBytes + 64;                   // a row in shared memory
constexpr int kStagedWBytes = 8 * kStagedRowBytes;                       // a stage's W rows, a row group
constexpr int kStagedXBytes = kStagedChunks * 32 * 16;                   // a stage's x fragments, a tile

__host__ __device__ constexpr int staged_stage_bytes(int row_groups, bool two_tiles) {
  return row_groups * kStagedWBytes + (two_tiles ? 2 : 1) * kStagedXBytes;
}

__device__ __forceinline__ void cp_async_w(uint32_t dst, const uint8_t* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void cp_async_x(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Two e4m3 (the low 16 bits of `pair`) as f16x2: exact (every e4m3 value is an f16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  uint32_t r;
  asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(pair));
  return r;
}
// The high two e4m3 of `word` as f16x2, the half taken in place: the shift down before the
// conversion cost 32 / 48 SHF a staged loop body (one / two token tiles); without it the staged
// FP8 launches read 0.1-1.5 us faster (H200, 2304 x 16384, 1-16 tokens).
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t word) {
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(word));
  return r;
}

// One 64-byte chunk of the staged loop: lane (g, t) holds 16 bytes of W row g (wf) and of x rows
// g (xa) and g + 8 (xb) at the same K offsets. 16-bit: two m16n8k16, words (0, 1) then (2, 3), the
// register loop's K permutation. e4m3: each word's 4 bytes converted to f16 (low pair: k 2t, 2t + 1;
// high pair: 2t + 8, 2t + 9) and multiplied by m16n8k16 f16 into the fp32 accumulators: sm_90 runs
// m16n8k32 e4m3 as such conversions plus two f16 mmas into a zeroed tile and four adds, which this
// saves (H200: FP8 at 2304 x 16384, 4 tokens, split 2: 12.9 us).
template <DType kIn, bool TWO_TILES>
__device__ __forceinline__ void staged_chunk(float (&acc)[4], const uint4& wf, const uint4& xa, const uint4& xb) {
  if constexpr (kIn == DType::kFloat8E4M3) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = word(wf, j), x0 = word(xa, j), x1 = TWO_TILES ? word(xb, j) : 0u;
      const uint32_t frag[4] = {e4m3x2_to_f16x2(x0), TWO_TILES ? e4m3x2_to_f16x2(x1) : 0u, e4m3x2_hi_to_f16x2(x0),
                                TWO_TILES ? e4m3x2_hi_to_f16x2(x1) : 0u};
      mma_step<DType::kFloat16>(acc, frag, e4m3x2_to_f16x2(w), e4m3x2_hi_to_f16x2(w));
    }
  } else {
#pragma unroll
    for (int kstep = 0; kstep < 2; ++kstep) {
      const int lo = 2 * kstep, hi = 2 * kstep + 1;
      const uint32_t frag[4] = {word(xa, lo), TWO_TILES ? word(xb, lo) : 0u, word(xa, hi), TWO_TILES ? word(xb, hi) : 0u};
      mma_step<kIn>(acc, frag, word(wf, lo), word(wf, hi));
    }
  }
}

template <DType kIn, int RG, bool TWO_TILES, int WARPS, int STAGES, int SPLIT>
__device__ __forceinline__ void gemv_staged(const MmaArgs& a) {
  constexpr int kStage = staged_stage_bytes(RG, TWO_TILES);
  constexpr int kCopies = 4 * RG;  // W copies a lane a step: 2 rows x 256 bytes an instruction
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rank = SPLIT > 1 ? int(blockIdx.x % SPLIT) : 0;  // a cluster's blocks are consecutive
  const int row0 = int(blockIdx.x / SPLIT) * 8 * RG;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  extern __shared__ __align__(16) uint8_t staged_smem[];
  const uint32_t ring = tma::smem_u32(staged_smem) + warp * STAGES * kStage;

  // The cluster's blocks take K's steps in even ranges, their warps even ranges of those.
  const StepRange block = even_part(a.steps, SPLIT, rank), mine = even_part(block.n, WARPS, warp);
  const int steps = mine.n;
  const int64_t k0 = int64_t(block.lo + mine.lo) * kStagedStepBytes;

  // Copies: lane l takes 16 bytes at byte 16 (l % 16) of rows 2 j + l / 16, j < 4 x row_groups
  // (the last row for rows past n: copied, never stored); x: its own fragments (rows g, g + 8;
  // live ones).
  const int half = lane >> 4, unit = lane & 15;
  const uint8_t* w_src[kCopies];
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {
    w_src[j] = a.w + int64_t(min(row0 + 2 * j + half, a.n - 1)) * a.w_row_bytes + k0 + 16 * unit;
  }
  const uint32_t w_dst = half * kStagedRowBytes + 16 * unit;  // + 2 j rows
  const bool xa_live = g < a.m, xb_live = TWO_TILES && g + 8 < a.m;
  const uint8_t* xa_src = a.x + int64_t(g) * a.x_row_bytes + k0 + 16 * t;
  const uint8_t* xb_src = a.x + int64_t(g + 8) * a.x_row_bytes + k0 + 16 * t;
  const uint32_t x_dst = RG * kStagedWBytes + 16 * lane;  // + chunk x 512, + tile x kStagedXBytes
  const uint32_t w_frag = g * kStagedRowBytes + 16 * t;    // + chunk x 64, + row group x kStagedWBytes

  auto issue = [&](int i) {  // step i of the warp's range into its stage
    const uint32_t stage = ring + (i % STAGES) * kStage;
    const int64_t off = int64_t(i) * kStagedStepBytes;
#pragma unroll
    for (int j = 0; j < kCopies; ++j) cp_async_w(stage + w_dst + 2 * j * kStagedRowBytes, w_src[j] + off, policy);
#pragma unroll
    for (int c = 0; c < kStagedChunks; ++c) {
      if (xa_live) cp_async_x(stage + x_dst + 512 * c, xa_src + off + kMmaChunkBytes * c);
      if (xb_live) cp_async_x(stage + x_dst + kStagedXBytes + 512 * c, xb_src + off + kMmaChunkBytes * c);
    }
  };

  float acc[RG][4] = {};
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < steps) issue(i);
    cp_async_commit();  // a group per step, empty past the range: the wait below counts steps
  }
  for (int i = 0; i < steps; ++i) {
    if (i + STAGES - 1 < steps) issue(i + STAGES - 1);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // this lane's copies of step i have landed
    __syncwarp();                 // and every lane's
    const uint32_t stage = ring + (i % STAGES) * kStage;
#pragma unroll
    for (int c = 0; c < kStagedChunks; ++c) {
      const uint4 xa = lds128(stage + x_dst + 512 * c);
      const uint4 xb = TWO_TILES ? lds128(stage + x_dst + kStagedXBytes + 512 * c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        staged_chunk<kIn, TWO_TILES>(acc[r], lds128(stage + r * kStagedWBytes + w_frag + kMmaChunkBytes * c), xa, xb);
      }
    }
    __syncwarp();  // every lane has read the stage before step i + STAGES is copied into it
  }
  finish<kIn, RG, WARPS, SPLIT>(a, acc, row0, rank);
}

// ---- The staged loop with x shared by the block's warps -------------------------------------
//
// Why: in the staged loop above every warp copies its own x fragments, so a row group reads all
// of x's K range: at 16 tokens x's bytes are twice W's (16 x 2 bytes a column against 8 rows x 2),
// 151 MB through L2 for 2304 x 16384's 75 MB of W, and 16 tokens read 2.4 us slower than 2.
// Here the block's warps take the same K range and different row groups (warp q: rows
// row0 + 8 RG q ..), and the block copies x's fragments once, kXChunkSteps steps at a time, into
// two shared buffers that all its warps read: x's traffic through L2 is divided by the warps.
// Measured (H200, in a layer, 2304 x 16384 bf16): 8 tokens 21.1 us against the staged loop's
// 21.8, 16 tokens 23.3 against cuBLAS's 23.4: x's bytes are not what holds 16 tokens
// (docs/skinny-gemm-mma-gemv.md). A __syncthreads at each chunk's first step orders the buffers (x's copies of a chunk ride in
// the commit group of its first step's W copies, so a lane's wait for that step covers them;
// the barrier makes every lane's copies visible and proves the chunk two back consumed, since a
// chunk is issued kXChunkSteps - (STAGES - 1) >= 1 steps after the barrier that retires the
// chunk before it). W keeps its per-warp ring. K splits over a cluster as above. The W copies and
// the chunk loop repeat gemv_staged's: folded into shared helpers they compiled to different SASS
// for gemv_staged's 3-stage launches (its main loop no longer unrolled twice: 16 HMMA fewer in the
// body), which no GPU has timed, so the two stay apart.
constexpr int kXChunkSteps = 4;

template <bool TWO_TILES>
__host__ __device__ constexpr int xs_buffer_bytes() {
  return kXChunkSteps * (TWO_TILES ? 2 : 1) * kStagedXBytes;
}
template <int RG, bool TWO_TILES, int WARPS, int STAGES>
__host__ __device__ constexpr int xs_smem_bytes() {
  return 2 * xs_buffer_bytes<TWO_TILES>() + WARPS * STAGES * RG * kStagedWBytes;
}

template <DType kIn, int RG, bool TWO_TILES, int WARPS, int STAGES, int SPLIT>
__device__ __forceinline__ void gemv_staged_xs(const MmaArgs& a) {
  static_assert(kXChunkSteps >= STAGES, "a chunk is issued after the barrier that retires its buffer");
  constexpr int kTiles = TWO_TILES ? 2 : 1;
  constexpr int kStage = RG * kStagedWBytes;
  constexpr int kCopies = 4 * RG;
  constexpr int kXPieces = kXChunkSteps * kTiles * kStagedChunks;  // 32 lanes x 16 bytes each
  static_assert(kXPieces % WARPS == 0, "a chunk's x pieces split evenly over the warps");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rank = SPLIT > 1 ? int(blockIdx.x % SPLIT) : 0;
  const int row0 = int(blockIdx.x / SPLIT) * 8 * RG * WARPS + 8 * RG * warp;  // this warp's rows
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  extern __shared__ __align__(16) uint8_t staged_smem[];
  const uint32_t xbuf = tma::smem_u32(staged_smem);
  const uint32_t ring = xbuf + 2 * xs_buffer_bytes<TWO_TILES>() + warp * STAGES * kStage;

  const StepRange block = even_part(a.steps, SPLIT, rank);
  const int steps = block.n;  // every warp of the block: the same
  const int64_t k0 = int64_t(block.lo) * kStagedStepBytes;

  const int half = lane >> 4, unit = lane & 15;
  const uint8_t* w_src[kCopies];
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {
    w_src[j] = a.w + int64_t(min(row0 + 2 * j + half, a.n - 1)) * a.w_row_bytes + k0 + 16 * unit;
  }
  const uint32_t w_dst = half * kStagedRowBytes + 16 * unit;
  const uint32_t w_frag = g * kStagedRowBytes + 16 * t;
  // x piece q of this lane (q < kXPieces / WARPS): index i = warp + q WARPS = (step s, tile, chunk c),
  // lane (g, t)'s 16 bytes of token g + 8 tile at byte 64 c + 16 t of the step, stored where every
  // warp's lane (g, t) reads them: buffer + s x tiles x 2 KiB + tile x 2 KiB + 512 c + 16 lane.
  auto issue = [&](int i) {
    const uint32_t stage = ring + (i % STAGES) * kStage;
    const int64_t off = int64_t(i) * kStagedStepBytes;
#pragma unroll
    for (int j = 0; j < kCopies; ++j) cp_async_w(stage + w_dst + 2 * j * kStagedRowBytes, w_src[j] + off, policy);
    if (i % kXChunkSteps == 0) {
      const uint32_t buf = xbuf + ((i / kXChunkSteps) & 1) * xs_buffer_bytes<TWO_TILES>();
#pragma unroll
      for (int q = 0; q < kXPieces / WARPS; ++q) {
        const int idx = warp + q * WARPS;
        const int c = idx % kStagedChunks, tile = (idx / kStagedChunks) % kTiles, s = idx / (kStagedChunks * kTiles);
        const int token = g + 8 * tile;
        if (token < a.m && i + s < steps) {
          cp_async_x(buf + (s * kTiles + tile) * kStagedXBytes + 512 * c + 16 * lane,
                     a.x + int64_t(token) * a.x_row_bytes + k0 + off + int64_t(s) * kStagedStepBytes + kMmaChunkBytes * c + 16 * t);
        }
      }
    }
  };

  float acc[RG][4] = {};
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < steps) issue(i);
    cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    if (i + STAGES - 1 < steps) issue(i + STAGES - 1);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    if (i % kXChunkSteps == 0) {
      __syncthreads();  // the chunk's x from every lane; the chunk two back read by every warp
    } else {
      __syncwarp();
    }
    const uint32_t stage = ring + (i % STAGES) * kStage;
    const uint32_t xs = xbuf + ((i / kXChunkSteps) & 1) * xs_buffer_bytes<TWO_TILES>() +
                        (i % kXChunkSteps) * kTiles * kStagedXBytes + 16 * lane;
#pragma unroll
    for (int c = 0; c < kStagedChunks; ++c) {
      const uint4 xa = lds128(xs + 512 * c);
      const uint4 xb = TWO_TILES ? lds128(xs + kStagedXBytes + 512 * c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        staged_chunk<kIn, TWO_TILES>(acc[r], lds128(stage + r * kStagedWBytes + w_frag + kMmaChunkBytes * c), xa, xb);
      }
    }
    __syncwarp();
  }

  // Lane (g, t) holds C (token g + 8 (j / 2), row row0 + 8 r + 2 t + j % 2) in acc[r][j]. With a
  // split, each block's tile goes to its shared memory and the cluster's block 0 sums the ranks
  // in rank order (the staged loop's order).
  if constexpr (SPLIT > 1) {
    __shared__ float tile_sum[WARPS][RG * 4][32];
#pragma unroll
    for (int r = 0; r < RG; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) tile_sum[warp][4 * r + j][lane] = acc[r][j];
    }
    tma::cluster_sync();
    if (rank == 0) {
#pragma unroll
      for (int r = 0; r < RG; ++r) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int token = g + (j >= 2 ? 8 : 0), row = row0 + 8 * r + 2 * t + (j & 1);
          if (token >= a.m || row >= a.n) continue;
          const uint32_t mine = tma::smem_u32(&tile_sum[warp][4 * r + j][lane]);
          float v = 0.f;
          for (int q = 0; q < SPLIT; ++q) v += tma::ld_cluster_f32(tma::map_to_cta(mine, q));
          store_c<kIn>(a, token, row, v);
        }
      }
    }
    tma::cluster_sync();
  } else {
#pragma unroll
    for (int r = 0; r < RG; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int token = g + (j >= 2 ? 8 : 0), row = row0 + 8 * r + 2 * t + (j & 1);
        if (token < a.m && row < a.n) store_c<kIn>(a, token, row, 0.f + acc[r][j]);
      }
    }
  }
}

// ---- The row-run loop: W read as the one-token GEMV reads it, straight into fragments --------
//
// Why: a warp of the register loop covers 8 rows x 64 bytes a load, of the staged loop 2 rows x
// 256 bytes but through shared memory; the one-token FMA GEMV's 16-byte lane loads cover 256-512
// contiguous bytes of 1-2 rows and read 2304 x 16384 bf16 at 95% of the read floor. Here each
// lane's 16-byte W load is that GEMV's, and mma.sync still does the products:
//
// * B's 8 columns are (row, segment) pairs, n = row * S + seg: S segments of 64 bytes, side by
//   side, of 8 / S rows (S = 2: 4 rows x 128 bytes a warp load, 4: 2 x 256, 8: 1 x 512). Lane
//   (g, t) loads 16 bytes of row g / S at byte 64 (g % S) + 16 t of the span (the register loop's
//   lane layout inside each segment, so the same K permutation makes the loaded words fragments).
// * A's 16 rows are (token, segment) pairs alike, m = token * S + seg: lane (g, t) loads x's
//   tokens g / S and g / S + 8 / S at the same bytes as its W load. A token tile is 16 / S tokens
//   (8, 4 or 2); `MT` tiles cover m.
// * C[(token, seg)][(row, seg')] multiplies segment seg of x by segment seg' of W; only seg ==
//   seg' is wanted (1 / S of the tile, the rest dropped by a select, so nothing of it reaches a
//   sum), and out[token][row] sums those diagonal entries over the segments (a fixed butterfly of
//   shuffles) and over every span of K. The tensor cores do S times the useful products: at 1-8
//   tokens they have the room (one to four mma a 16-byte W load); at 16 they do not (the best
//   launch, 2 segments x 2 tiles, read 2304 x 16384 bf16 in 25.3 us against cuBLAS's 23.3).
// * A block is `WARPS` warps over the same RI x 8 / S rows, each a contiguous range of K's steps
//   (`U` spans of S x 64 bytes), summed in shared memory in warp order (deterministic). A step's
//   loads are all issued before its first mma (hold); the warp's next loads wait for its mmas, and
//   the many resident warps (48-96 registers a thread) keep the memory system busy.
//
// H200, 2304 x 16384 bf16 in a layer (.exp probe, 2026-11-29): 19.05 / 19.76 / 19.86 us at 2 / 4 / 8
// tokens (S 8 x 4 runs x 2 spans x 8 warps; S 4 x 1 x 2 x 8; S 2 x 1 x 2 x 8) against cuBLAS's
// 23.54 / 23.68 / 24.29 and the staged loop's 20.75 / 20.91 / 21.18.
template <int MT, int RI, int U>
struct RowStep {
  uint4 w[U][RI], xa[U][MT], xb[U][MT];
};

// Lane (g, t)'s lanes to sum over (the other segments of its (token, row)): the bits of g % S
// (lane bits 2..) and of (2 t) % S / 2 (lane bits 0..).
template <int S>
__device__ __forceinline__ float sum_segments(float v) {
#pragma unroll
  for (int b = 1; b < S / 2; b <<= 1) v += __shfl_xor_sync(0xffffffffu, v, b);
#pragma unroll
  for (int b = 4; b < 4 * S; b <<= 1) v += __shfl_xor_sync(0xffffffffu, v, b);
  return v;
}

template <DType kIn, int S, int MT, int RI, int U, int WARPS>
__device__ __forceinline__ void gemv_rows(const MmaArgs& a) {
  constexpr int kRowsALoad = 8 / S, kTileTokens = 16 / S, kRows = RI * kRowsALoad;
  constexpr int kSpanBytes = kMmaChunkBytes * S, kStepBytes = kSpanBytes * U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  // Rows past n read row n - 1 and tokens past m token m - 1: their C entries are never stored.
  // The pointers hold the row and the lane's bytes; the warp's K start is the loop's offset.
  const StepRange mine = even_part(a.steps, WARPS, warp);
  const int lane_bytes = kMmaChunkBytes * (g % S) + 16 * t;
  const int lane_row = g / S;  // the lane's row in a load, and its token in a tile's half
  // 32-bit strides (the launcher's rule for this loop): 58 -> 48 registers a thread at 4 segments x
  // 1 load x 2 spans x 8 warps (sm_90a), 5 blocks an SM instead of 4.
  const int w_stride = static_cast<int>(a.w_row_bytes), x_stride = static_cast<int>(a.x_row_bytes);
  const uint8_t* w[RI];
#pragma unroll
  for (int i = 0; i < RI; ++i) w[i] = a.w + int64_t(min(row0 + kRowsALoad * i + lane_row, a.n - 1)) * w_stride + lane_bytes;
  const uint8_t *xa[MT], *xb[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    xa[mt] = a.x + int64_t(min(kTileTokens * mt + lane_row, a.m - 1)) * x_stride + lane_bytes;
    xb[mt] = a.x + int64_t(min(kTileTokens * mt + lane_row + 8 / S, a.m - 1)) * x_stride + lane_bytes;
  }
  float acc[MT][RI][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < RI; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
  }
  // One step at a time, not unrolled: unrolled by two, the next step's loads were hoisted and the
  // probe's loop compiled to 164-186 registers a thread instead of 96 (sm_90a).
#pragma unroll 1
  for (int step = mine.lo; step < mine.lo + mine.n; ++step) {
    const int64_t o = int64_t(step) * kStepBytes;
    RowStep<MT, RI, U> s;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < RI; ++i) s.w[u][i] = load_w(w[i] + o + kSpanBytes * u, policy);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        s.xa[u][mt] = load_x(xa[mt] + o + kSpanBytes * u);
        s.xb[u][mt] = load_x(xb[mt] + o + kSpanBytes * u);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < RI; ++i) hold(s.w[u][i]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        hold(s.xa[u][mt]);
        hold(s.xb[u][mt]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < RI; ++i) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) staged_chunk<kIn, true>(acc[mt][i], s.w[u][i], s.xa[u][mt], s.xb[u][mt]);
      }
    }
  }

  // Lane (g, t) holds C[g (+ 8)][2 t + j]: the diagonal entry where (2 t + j) % S == g % S. After the
  // segment sum, lane (g, t) with g % S == 0 and (2 t) % S == 0 owns (token, row) = (g / S (+ 8 / S)
  // of its tile, 2 t / S of its load).
  __shared__ float partial[WARPS][MT * kTileTokens][kRows];
  const int j = g % S - (2 * t) % S;
  const bool owner = g % S == 0 && (2 * t) % S == 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < RI; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v = sum_segments<S>(j == 0 ? acc[mt][i][2 * h] : j == 1 ? acc[mt][i][2 * h + 1] : 0.f);
        if (owner) partial[warp][kTileTokens * mt + g / S + h * (8 / S)][kRowsALoad * i + 2 * t / S] = v;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < MT * kTileTokens * kRows; e += WARPS * 32) {
    const int token = e / kRows, row = row0 + e % kRows;
    if (token >= a.m || row >= a.n) continue;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) v += partial[q][token][e % kRows];
    store_c<kIn>(a, token, row, v);
  }
}

// mma.sync with e4m3 operands exists from sm_89 on (and cvt to f16x2 from e4m3x2): the sm_80
// build has no FP8 kernel body (the launcher refuses FP8 below capability 8.9); clusters are sm_90.
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

template <DType kIn, int RG, bool TWO_TILES, int WARPS, int STAGES, int SPLIT, bool SHARED_X>
__global__ void __launch_bounds__(WARPS * 32) skinny_mma_staged_kernel(const __grid_constant__ MmaArgs a) {
  if constexpr ((kIn != DType::kFloat8E4M3 || kDeviceArch >= 890) && (SPLIT == 1 || kDeviceArch >= 900)) {
    if constexpr (SHARED_X) {
      gemv_staged_xs<kIn, RG, TWO_TILES, WARPS, STAGES, SPLIT>(a);
    } else {
      gemv_staged<kIn, RG, TWO_TILES, WARPS, STAGES, SPLIT>(a);
    }
  } else {
    __trap();
  }
}

template <DType kIn, int S, int MT, int RI, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) skinny_mma_rows_kernel(const __grid_constant__ MmaArgs a) {
  if constexpr (kIn != DType::kFloat8E4M3 || kDeviceArch >= 890) {
    gemv_rows<kIn, S, MT, RI, U, WARPS>(a);
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

// One launch of `kernel` over `blocks` blocks of `threads`, with `smem` bytes of dynamic shared
// memory (its limit raised once per device, `opted_in` caching that) and, for `cluster` > 1,
// thread-block clusters of that many consecutive blocks along x.
template <typename Kernel>
cudaError_t launch_clustered(Kernel kernel, std::atomic<int> (&opted_in)[64], int smem, int64_t blocks, int threads,
                             int cluster, const MmaArgs& a, cudaStream_t stream) {
  if (const cudaError_t err = opt_in_dynamic_smem(opted_in, kernel, smem); err != cudaSuccess) return err;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = cluster > 1 ? &attr : nullptr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // clear it: the caller reports the returned error
  return err;
}

// A staged loop's launch: a block covers 8 x row_groups rows (x row_groups for each warp with x
// shared: side by side on rows), `SPLIT` consecutive blocks a row block (one thread-block cluster
// along x); dynamic shared memory: the warps' W rings and x's stages, or with x shared its two
// buffers (the limit raised once per device, `opted_in` caching it).
template <DType kIn, int RG, bool TWO_TILES, int WARPS, int STAGES, int SPLIT, bool SHARED_X>
cudaError_t launch_staged_tiles(const MmaArgs& a, cudaStream_t stream) {
  constexpr int kRows = 8 * RG * (SHARED_X ? WARPS : 1);
  constexpr int kSmem = SHARED_X ? xs_smem_bytes<RG, TWO_TILES, WARPS, STAGES>()
                                 : WARPS * STAGES * staged_stage_bytes(RG, TWO_TILES);
  static std::atomic<int> opted_in[64];
  return launch_clustered(skinny_mma_staged_kernel<kIn, RG, TWO_TILES, WARPS, STAGES, SPLIT, SHARED_X>, opted_in, kSmem,
                          (int64_t(a.n) + kRows - 1) / kRows * SPLIT, WARPS * 32, SPLIT, a, stream);
}

// A row-run launch: a block covers RI x 8 / S rows; the fewest token tiles (16 / S tokens each)
// that hold m, at most two (the launcher refuses more tokens).
template <DType kIn, int S, int RI, int U, int WARPS>
cudaError_t launch_rows(const MmaArgs& a, cudaStream_t stream) {
  constexpr int kRows = RI * 8 / S;
  const dim3 grid(static_cast<unsigned>((int64_t(a.n) + kRows - 1) / kRows));
  if (a.m > 16 / S) {
    skinny_mma_rows_kernel<kIn, S, 2, RI, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  } else {
    skinny_mma_rows_kernel<kIn, S, 1, RI, U, WARPS><<<grid, WARPS * 32, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType kIn, int RG, int WARPS, int STAGES, int SPLIT, bool SHARED_X>
cudaError_t launch_staged(const MmaArgs& a, cudaStream_t stream) {
  return a.m > 8 ? launch_staged_tiles<kIn, RG, true, WARPS, STAGES, SPLIT, SHARED_X>(a, stream)
                 : launch_staged_tiles<kIn, RG, false, WARPS, STAGES, SPLIT, SHARED_X>(a, stream);
}

}  // namespace mma_detail

template <DType kIn>
cudaError_t launch_mma_dtype(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
  if (c.segments != 0) {
#define SKINNY_MMA_ROWS_CASE(S, RI, U, WARPS)                                               \
  if (c.segments == S && c.row_groups == RI && c.unroll == U && c.warps == WARPS) {         \
    return mma_detail::launch_rows<kIn, S, RI, U, WARPS>(a, stream);                        \
  }
    SKINNY_MMA_ROW_RUN_CONFIGS(SKINNY_MMA_ROWS_CASE)
#undef SKINNY_MMA_ROWS_CASE
  } else if (c.stages == 0) {
#define SKINNY_MMA_CASE(RG, U, WARPS) \
  if (c.row_groups == RG && c.unroll == U && c.warps == WARPS) return mma_detail::launch_config<kIn, RG, U, WARPS>(a, stream);
    SKINNY_MMA_CONFIGS(SKINNY_MMA_CASE)
#undef SKINNY_MMA_CASE
  } else if (c.unroll == mma_detail::kStagedChunks) {
#define SKINNY_MMA_STAGED_CASE(SHARED_X, RG, WARPS, STAGES, SPLIT)                                                 \
  if (c.shared_x == SHARED_X && c.row_groups == RG && c.warps == WARPS && c.stages == STAGES && c.split == SPLIT) { \
    return mma_detail::launch_staged<kIn, RG, WARPS, STAGES, SPLIT, SHARED_X>(a, stream);                          \
  }
#define SKINNY_MMA_PLAIN_CASE(...) SKINNY_MMA_STAGED_CASE(false, __VA_ARGS__)
#define SKINNY_MMA_XS_CASE(...) SKINNY_MMA_STAGED_CASE(true, __VA_ARGS__)
    SKINNY_MMA_STAGED_CONFIGS(SKINNY_MMA_PLAIN_CASE)
    SKINNY_MMA_SHARED_X_CONFIGS(SKINNY_MMA_XS_CASE)
#undef SKINNY_MMA_XS_CASE
#undef SKINNY_MMA_PLAIN_CASE
#undef SKINNY_MMA_STAGED_CASE
  }
  return cudaErrorNotSupported;
}

}  // namespace skinny_gemm
}  // namespace fused_llm
