// skinny-gemm's wgmma loop of the tensor-core GEMV (SkinnyMmaConfig::wgmma, skinny_mma.h): for
// 9-16 tokens on sm_90a, where the mma.sync loops pay for x once a warp. Included by one unit per
// input dtype (skinny_wgmma_{bf16,f16,e4m3}.cu), compiled for 9.0a only.
//
// A block is `warps` / 4 warpgroups (K parts) over the same 64 / S weight rows; a cluster of
// `split` blocks (consecutive along x) splits a row block's K range, each block's warpgroups that
// range again. Each K part streams its range through a ring of `stages` shared-memory stages:
//
// * A (W) rows m = S r + s: weight row r of the block, segment s. A step is `unroll` chunks; a
//   chunk is S segments of 128 contiguous bytes of each row (one wgmma k-extent of 128 bytes: four
//   k16 steps of 16-bit inputs, four k32 steps of e4m3). A row m of a chunk's A tile is its 128
//   bytes at m x 128, 16-byte piece j in slot j ^ (m % 8) (the 128-byte swizzle of wgmma's K-major
//   layout), so the warp's copies, consecutive lanes consecutive pieces of one row (512
//   contiguous bytes of 4 / S rows), fill 8 distinct bank groups a row: without the swizzle the
//   same copies conflicted 8-16 ways and read 2304 x 16384 at half the speed (H200).
// * B (x) columns n = 16 s + token, the same pieces of x's rows, the same swizzle; tokens past m
//   are not copied (their columns reach only D columns never read).
// * D[(r, s)][(s', token)] accumulates over K; only s == s' is wanted: out[token][r] is the sum of
//   those entries over s (a select and one shuffle for S = 2). The S x wider B is the price of the
//   wide row runs; at 16 tokens the tensor cores have room for it.
// * All copies are 16-byte cp.async (W .cg with evict-first, x .ca); a step: wait for its copies,
//   proxy fence, the K part's named barrier, issue the copies of step + stages - 1, the wgmmas,
//   wait for them (the next step's copies land in the stage they read).
// * Sums, all in fixed orders (deterministic): the K parts' tiles through shared memory; a
//   cluster's ranks 1..split-1 store theirs into rank 0's shared memory between two cluster
//   barriers; rank 0 adds them in rank order, applies the FP8 scales and the bias and writes the
//   rows. (Two cheaper syncs, the first barrier's arrival made at the start and an mbarrier in
//   rank 0 that the others arrived on after their stores, gave the same values but
//   compute-sanitizer's racecheck reported hazards on the inbox and the K parts' tiles, H200.)
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/tma.cuh"   // smem_u32, fence_proxy_async
#include "skinny_device.cuh"
#include "skinny_mma_kernel.cuh"  // MmaArgs, SKINNY_WGMMA_CONFIGS, launch_clustered

namespace fused_llm {
namespace skinny_gemm {
namespace wgmma_detail {

constexpr int kChunkBytes = 128;  // a segment's bytes of a row in one chunk
constexpr int kMaxSplit = 4;      // a cluster's ranks: rank 0's inbox holds split - 1 tiles

template <int S>
__host__ __device__ constexpr int rows() {
  return 64 / S;
}
template <int S, int U>
__host__ __device__ constexpr int stage_bytes() {
  return U * (64 * kChunkBytes + 16 * S * kChunkBytes);  // A tiles (64 rows) and B tiles (16 S rows) of U chunks
}
template <int S, int U, int KP, int D>
__host__ __device__ constexpr int smem_bytes() {
  return KP * D * stage_bytes<S, U>() + 1024;  // + the slack that aligns the ring to 1024 bytes
}

// K-major, 128-byte swizzle: 8-row atoms of 1024 bytes (SBO); the k steps inside a row advance the
// start address by 32 bytes.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// D (64 x 16 S, fp32: 8 S registers a thread) = A (64 x 32 bytes of K) B^T + (accumulate ? D : 0),
// both from shared memory.
template <DType kIn, int S>
__device__ __forceinline__ void wgmma_step(float* d, uint64_t a, uint64_t b, int accumulate) {
#define SKINNY_WGMMA_ASM(SHAPE_TYPES, TAIL)                                                                    \
  if constexpr (S == 1) {                                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n16" SHAPE_TYPES " {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1" TAIL \
                 ";\n}\n"                                                                                       \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                 : "l"(a), "l"(b), "r"(accumulate));                                                            \
  } else {                                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n32" SHAPE_TYPES                                              \
                 " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1" TAIL ";\n}\n"  \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
                   "+f"(d[15])                                                                                  \
                 : "l"(a), "l"(b), "r"(accumulate));                                                            \
  }
  static_assert(S == 1 || S == 2, "segments of the wgmma loop: 1 or 2");
  if constexpr (kIn == DType::kBFloat16) {
    SKINNY_WGMMA_ASM("k16.f32.bf16.bf16", ", 0, 0")
  } else if constexpr (kIn == DType::kFloat16) {
    SKINNY_WGMMA_ASM("k16.f32.f16.f16", ", 0, 0")
  } else {
    static_assert(kIn == DType::kFloat8E4M3, "an input dtype of the kernels");
    SKINNY_WGMMA_ASM("k32.f32.e4m3.e4m3", "")
  }
#undef SKINNY_WGMMA_ASM
}

// The copies are the staged loop's (skinny_mma_kernel.cuh): W .cg with an evict-first policy, x .ca.
using mma_detail::cp_async_commit;
using mma_detail::cp_async_w;
using mma_detail::cp_async_wait;
using mma_detail::cp_async_x;

template <DType kIn, int S, int U, int KP, int D>
__device__ __forceinline__ void gemv_wgmma(const MmaArgs& a) {
  constexpr int kRows = rows<S>(), kPieces = 8 * S * U;  // 16-byte pieces of a row a step
  constexpr int kATile = 64 * kChunkBytes, kBTile = 16 * S * kChunkBytes, kStage = stage_bytes<S, U>();
  constexpr int kWPieces = kRows * kPieces / 128, kXPieces = 16 * kPieces / 128;  // a thread's, a step
  static_assert(kRows * kPieces % 128 == 0 && 16 * kPieces % 128 == 0, "whole pieces a thread");
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ float part[KP][16][kRows];
  __shared__ float fin[16 * kRows];
  __shared__ float inbox[kMaxSplit - 1][16 * kRows];

  const int tid = threadIdx.x, kp = tid >> 7, tig = tid & 127, warp = tig >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, seg = g % S;
  uint32_t split = 1, rank = 0;
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(split));
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int row0 = int(blockIdx.x / split) * kRows;
  // The cluster's ranks take K's steps in near-even ranges cut on multiples of KP (the last rank
  // the rest), the K parts even shares of those: a block's K parts run equal step counts wherever
  // steps % KP == 0 (2304 x 16384 split 3: 42 / 42 / 44 steps, 21 or 22 a K part, the same longest
  // part as 42 / 43 / 43; timed the same, H200). With unequal counts compute-sanitizer's racecheck
  // reported hazards between the K parts' tile stores and their sum after the __syncthreads that
  // orders them (the named barriers' counts differing; the values were right); with equal counts
  // it reports none.
  auto bound = [&](uint32_t r) { return r == split ? a.steps : int(int64_t(a.steps) * r / split) / KP * KP; };
  const int b0 = bound(rank), b1 = bound(rank + 1);
  const int s0 = b0 + (b1 - b0) * kp / KP, n = b0 + (b1 - b0) * (kp + 1) / KP - s0;
  const uint32_t ring = ((tma::smem_u32(smem) + 1023) & ~1023u) + kp * D * kStage;

  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));

  // This thread's pieces: W's piece L = tig + 128 q of the step (row L / kPieces, piece b of its
  // run: chunk c, segment s, 16-byte j), then x's alike over 16 token rows.
  const uint8_t* w_src[kWPieces];
  uint32_t w_dst[kWPieces];
#pragma unroll
  for (int q = 0; q < kWPieces; ++q) {
    const int L = tig + 128 * q, r = L / kPieces, b = L % kPieces, c = b / (8 * S), s = (b / 8) % S, j = b % 8;
    const int m = S * r + s;
    w_src[q] = a.w + int64_t(min(row0 + r, a.n - 1)) * a.w_row_bytes + int64_t(s0) * kPieces * 16 + 16 * b;
    w_dst[q] = c * kATile + m * kChunkBytes + ((j ^ (m & 7)) << 4);
  }
  const uint8_t* x_src[kXPieces];
  uint32_t x_dst[kXPieces];
  bool x_live[kXPieces];
#pragma unroll
  for (int q = 0; q < kXPieces; ++q) {
    const int L = tig + 128 * q, tok = L / kPieces, b = L % kPieces, c = b / (8 * S), s = (b / 8) % S, j = b % 8;
    const int col = 16 * s + tok;
    x_live[q] = tok < a.m;
    x_src[q] = a.x + int64_t(min(tok, a.m - 1)) * a.x_row_bytes + int64_t(s0) * kPieces * 16 + 16 * b;
    x_dst[q] = U * kATile + c * kBTile + col * kChunkBytes + ((j ^ (col & 7)) << 4);
  }
  auto copy = [&](int i) {
    const uint32_t stage = ring + (i % D) * kStage;
    const int64_t off = int64_t(i) * kPieces * 16;
#pragma unroll
    for (int q = 0; q < kWPieces; ++q) cp_async_w(stage + w_dst[q], w_src[q] + off, policy);
#pragma unroll
    for (int q = 0; q < kXPieces; ++q)
      if (x_live[q]) cp_async_x(stage + x_dst[q], x_src[q] + off);
  };

  // FP8 wgmma adds its products into D at less than fp32 precision (truncating, so the error grows
  // with D's size): with D carried over a K part's ~2700 values (2304 x 16384, split 3, 2 K parts)
  // an output of order one was off by 0.0025, 4.4x the tests' tolerance; chains of 256 values still
  // 1.0-2.1x (H200). So FP8 wgmmas run in chains of two (64 values), each into its own registers
  // from zero, added into acc in fp32 after the step's wait; 16-bit inputs accumulate in acc.
  constexpr bool kPromote = kIn == DType::kFloat8E4M3;
  constexpr int kChainWgmmas = 2, kChains = kPromote ? 4 * U / kChainWgmmas : 1;
  float acc[8 * S], chain[kChains][8 * S];
#pragma unroll
  for (int i = 0; i < 8 * S; ++i) {
    acc[i] = 0.f;
#pragma unroll
    for (int q = 0; q < kChains; ++q) chain[q][i] = 0.f;
  }
#pragma unroll
  for (int q = 0; q < D - 1; ++q) {
    if (q < n) copy(q);
    cp_async_commit();  // a group a step, empty past the range
  }
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    cp_async_wait<D - 2>();  // this thread's copies of step i have landed
    tma::fence_proxy_async();  // generic-proxy writes before the wgmmas' reads
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + kp) : "memory");  // the K part's copies; its wgmmas of i - 1 done
    if (i + D - 1 < n) copy(i + D - 1);
    cp_async_commit();
    const uint32_t stage = ring + (i % D) * kStage;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int c = 0; c < U; ++c)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int w = 4 * c + kk;  // the step's wgmma
        wgmma_step<kIn, S>(kPromote ? chain[w / kChainWgmmas] : acc, desc_sw128(stage + c * kATile + 32 * kk),
                           desc_sw128(stage + U * kATile + c * kBTile + 32 * kk), !kPromote || w % kChainWgmmas != 0);
      }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if constexpr (kPromote) {
#pragma unroll
      for (int q = 0; q < kChains; ++q)
#pragma unroll
        for (int i = 0; i < 8 * S; ++i) acc[i] += chain[q][i];
    }
  }

  // acc[4 i + 2 h + e] = D[16 warp + 8 h + g][8 i + 2 t + e]: row m = 16 warp + 8 h + g is weight row
  // m / S, segment g % S; column 8 i + 2 t + e is token 8 (i % 2) + 2 t + e of segment i / 2.
#pragma unroll
  for (int ih = 0; ih < 2; ++ih)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = 0.f;
#pragma unroll
        for (int s = 0; s < S; ++s)
          if (seg == s) v = acc[4 * (2 * s + ih) + 2 * h + e];
        if constexpr (S == 2) v += __shfl_xor_sync(0xffffffffu, v, 4);  // the row's other segment (lane g ^ 1)
        if (seg == 0) part[kp][8 * ih + 2 * t + e][(16 * warp + 8 * h + g) / S] = v;
      }
  __syncthreads();
  for (int idx = tid; idx < 16 * kRows; idx += KP * 128) {
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < KP; ++q) v += part[q][idx / kRows][idx % kRows];
    fin[idx] = v;
  }
  __syncthreads();
  if (split > 1) {
    tma::cluster_sync();  // every rank has started: rank 0's inbox exists
    if (rank != 0) {
      const uint32_t dst = tma::map_to_cta(tma::smem_u32(&inbox[rank - 1][0]), 0);
      for (int idx = tid; idx < 16 * kRows; idx += KP * 128)
        asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(dst + 4 * idx), "f"(fin[idx]) : "memory");
    }
    tma::cluster_sync();  // the stores before rank 0's reads (release / acquire), rank 0 alive until they land
    if (rank != 0) return;
  }
  for (int idx = tid; idx < 16 * kRows; idx += KP * 128) {
    const int tok = idx / kRows, row = row0 + idx % kRows;
    if (tok >= a.m || row >= a.n) continue;
    float v = fin[idx];
    for (uint32_t q = 1; q < split; ++q) v += inbox[q - 1][idx];
    if constexpr (kIn == DType::kFloat8E4M3) v = v * a.x_scale[tok * a.x_scale_step] * a.w_scale[row * a.w_scale_step];
    if (a.bias != nullptr) v += load_bias(a.bias, a.bias_dtype, row);
    store_out(a.out, a.out_dtype, int64_t(tok) * a.out_row_stride + row, v);
  }
}

template <DType kIn, int S, int U, int KP, int D>
__global__ void __launch_bounds__(KP * 128) skinny_wgmma_kernel(const __grid_constant__ MmaArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  gemv_wgmma<kIn, S, U, KP, D>(a);
#else
  __trap();  // wgmma is sm_90a: the unit is built for 9.0a only, the launcher calls it on capability 9.0
#endif
}

// A block covers 64 / S rows; `split` consecutive blocks a row block (a cluster along x).
template <DType kIn, int S, int U, int KP, int D>
cudaError_t launch(const MmaArgs& a, int split, cudaStream_t stream) {
  static std::atomic<int> opted_in[64];
  return mma_detail::launch_clustered(skinny_wgmma_kernel<kIn, S, U, KP, D>, opted_in, smem_bytes<S, U, KP, D>(),
                                      (int64_t(a.n) + rows<S>() - 1) / rows<S>() * split, KP * 128, split, a, stream);
}

}  // namespace wgmma_detail

template <DType kIn>
cudaError_t launch_wgmma_dtype(const SkinnyMmaConfig& c, const MmaArgs& a, cudaStream_t stream) {
  if (c.split < 1 || c.split > wgmma_detail::kMaxSplit) return cudaErrorNotSupported;
#define SKINNY_WGMMA_CASE(S, U, WARPS, STAGES)                                          \
  if (c.segments == S && c.unroll == U && c.warps == WARPS && c.stages == STAGES) {     \
    return wgmma_detail::launch<kIn, S, U, WARPS / 4, STAGES>(a, c.split, stream);      \
  }
  SKINNY_WGMMA_CONFIGS(SKINNY_WGMMA_CASE)
#undef SKINNY_WGMMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace skinny_gemm
}  // namespace fused_llm
