// Framework-free interface of skinny-gemm's tensor-core GEMV (sm80 and sm90: mma.sync):
//
//   16-bit:  out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] )                T = bfloat16 or float16
//   FP8:     out[m, n] = O( (sum_k x[m, k] w[n, k]) * x_scale[m] * w_scale[n] + bias[n] )
//            x, w e4m3fn; scales fp32 per tensor or per token / output row; O = bf16, fp16 or fp32
//
// products and sums in fp32, the scales and the bias applied in fp32, one rounding, for
// 1 <= m <= kMmaMaxM tokens (32 / segments for the row-run loop).
//
// Why a second compiled kernel: at 2-16 tokens every kernel built on staged tiles (the package's
// Triton dot tile and TMA ring, cuBLAS) read 2304 x 16384 bf16 at 80-86% of the read floor on an
// H200 in a layer, where the one-token FMA GEMV, which only streams plain 16-byte loads, read
// 95%. This kernel streams W the GEMV's way and still multiplies on the tensor cores:
//
// * mma.sync with x as A (16 token rows; those past m zero or garbage, their C rows never
//   stored: an A row reaches only its own C row) and W^T as B (8 weight rows): lane
//   (g, t) = (lane / 4, lane % 4) loads 16 contiguous bytes of W row g and of x rows g and g + 8
//   at byte 16 t of each 64-byte chunk of a row. That chunk is two mma steps: m16n8k16 for 16-bit
//   inputs, m16n8k32 for e4m3 (both take a fragment register as 4 bytes of K). K is permuted alike
//   for W and x inside a chunk (step s takes the lane's words 2 s and 2 s + 1 as its low and high
//   K words), so the 16 bytes a lane loads are its fragments: no shuffle, no layout change.
// * The register loop (stages 0): a block is `warps` warps over the same `row_groups` x 8 rows;
//   K's chunks are cut into steps of `unroll` chunks and each warp takes a contiguous range of
//   steps, the next step's loads issued before this step's mmas. The warps' fp32 tiles are summed
//   in shared memory in warp order (deterministic), the scales and bias applied and the rows
//   written: no K split across blocks, no global workspace.
// * The staged loop (stages 2-3, 4-chunk steps): the same fragments and sums, but
//   each warp copies W with cp.async as 256-byte runs of 2 rows an instruction into a per-warp
//   ring of `stages` shared-memory stages and reads its fragments back from there (wider requests:
//   see skinny_mma_kernel.cuh). With `split` > 1 (sm_90) a thread-block cluster of `split` blocks
//   shares a row group, each a K range, summed by the cluster's block 0 in rank order.
// * `shared_x` (the staged loop; its compiled launches split K over a cluster): the block's warps each take their own row groups
//   over the block's K range instead of a share of K over the same rows, and x's fragments are
//   copied once a block into shared memory that every warp reads: x's traffic through L2 divided
//   by the warps.
// * The row-run loop (`segments` 2, 4 or 8, 1-8 tokens): each lane's 16-byte W load is the one-token
//   GEMV's (a warp load covers 4 rows x 128, 2 x 256 or 1 x 512 contiguous bytes) and goes straight
//   into mma.sync as B columns (row, 64-byte segment); x's A rows are (token, segment) alike, and
//   the wanted products are the tile's segment-diagonal entries, summed over segments at the end
//   (see skinny_mma_kernel.cuh).
// * The wgmma loop (`wgmma` 1, sm_90a, 1-16 tokens): W and x both copied by 16-byte cp.async into
//   128-byte-swizzled shared memory, wgmma's A rows (row, segment) pairs (`segments` 1 or 2) and B
//   columns (segment, token): x read once a warpgroup by the tensor cores, not once a warp; K split
//   over the block's warpgroups and a cluster of `split` blocks (see skinny_wgmma_kernel.cuh).
//
// CUDA only (the binding includes this header in CUDA builds alone).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "skinny_tma.h"  // DType

namespace fused_llm {
namespace skinny_gemm {

// Tokens the kernel takes: the 16 rows of mma.sync's A operand.
constexpr int kMmaMaxM = 16;
// K is read in chunks of 64 bytes of a row (one 16-byte load of each of the row's four lanes):
// 32 columns of a 16-bit dtype, 64 of e4m3.
constexpr int kMmaChunkBytes = 64;

struct SkinnyMmaConfig {
  int row_groups = 1;  // groups of 8 weight rows a block (and a warp): 1 or 2
  int unroll = 2;      // chunks a step: 1, 2 or 4 (K must be a whole number of steps; staged: 4)
  int warps = 8;       // warps a block, each a contiguous range of K's steps: 2, 4, 8 or 16
  int stages = 0;      // 0: the register loop; 2 or 3: the staged loop's shared-memory stages
  int split = 1;       // staged loop: K ranges of a row group, one block each in a cluster (> 1: sm_90)
  int shared_x = 0;    // staged loop, 1: the warps side by side on rows (row_groups each) over the
                       // block's K range, x's fragments copied once a block (see above)
  int segments = 0;    // 2, 4 or 8: the row-run loop (see above; stages 0, split 1): row_groups is then
                       // the W loads a span (each 8 / segments rows x segments x 64 bytes), unroll
                       // the spans a step; at most 32 / segments tokens
  int wgmma = 0;       // 1: the wgmma loop (row_groups 1, shared_x 0): segments 1 or 2 (64 / segments
                       // rows a block), unroll the 128-byte chunks of each segment a step, warps 4 a
                       // K part, stages 3 or 4, split 1-4 (a cluster)
};

// The most tokens a configuration takes: kMmaMaxM, or two token tiles of the row-run loop.
constexpr int mma_max_m(const SkinnyMmaConfig& c) {
  return c.segments != 0 && c.wgmma == 0 ? 32 / c.segments : kMmaMaxM;
}
// Bytes of K one step of a configuration reads from each row (the wgmma loop: 128-byte chunks).
constexpr int mma_step_bytes(const SkinnyMmaConfig& c) {
  return (c.wgmma != 0 ? 2 : 1) * kMmaChunkBytes * c.unroll * (c.segments != 0 ? c.segments : 1);
}

struct SkinnyMmaParams {
  int64_t m = 0;  // 1 .. mma_max_m(config) (0 launches nothing)
  int64_t n = 0;  // >= 1, any value (rows past n read row n - 1, never stored)
  int64_t k = 0;  // a positive multiple of a step: mma_step_bytes(config) bytes
  DType dtype = DType::kBFloat16;      // x and w: kBFloat16, kFloat16 or kFloat8E4M3
  DType out_dtype = DType::kBFloat16;  // dtype for 16-bit inputs; bf16, fp16 or fp32 for e4m3
  // x [m, k] and w [n, k]: unit-stride rows, row strides multiples of 16 bytes (below 2^31 bytes
  // for the row-run loop), bases 16-byte aligned (every load is 16 bytes).
  const void* x = nullptr;
  int64_t x_row_stride = 0;  // elements
  const void* w = nullptr;
  int64_t w_row_stride = 0;  // elements
  const void* bias = nullptr;  // [n] of out_dtype or kFloat32 (any of bf16 / fp16 / fp32 for e4m3), or nullptr
  DType bias_dtype = DType::kBFloat16;
  const float* x_scale = nullptr;  // e4m3 only: [1] or [m]
  const float* w_scale = nullptr;  // e4m3 only: [1] or [n]
  bool x_scale_per_token = false;
  bool w_scale_per_row = false;
  void* out = nullptr;  // [m, n] of out_dtype, unit-stride rows
  int64_t out_row_stride = 0;
  SkinnyMmaConfig config;
};

// Bytes of one element of a kernel input dtype.
constexpr int dtype_bytes(DType t) { return t == DType::kFloat8E4M3 ? 1 : t == DType::kFloat32 ? 4 : 2; }

// Whether `config` is one the library has code for.
bool skinny_mma_config_supported(const SkinnyMmaConfig& config);
// The compiled configurations: sets `*configs` to the first of `count` entries, returns count.
int skinny_mma_compiled_configs(const SkinnyMmaConfig** configs);

// Enqueues the kernel on `stream`. Returns cudaErrorNotSupported (with nothing enqueued) where the
// arguments break the rules above or the device is below capability 8.0 (8.9 for e4m3); other CUDA
// errors of the launch as they come.
cudaError_t skinny_mma_launch(const SkinnyMmaParams& p, cudaStream_t stream);

}  // namespace skinny_gemm
}  // namespace fused_llm
