// Framework-free interface of skinny-gemm's compiled Hopper kernel (sm90: TMA, mbarriers,
// mma.sync):
//
//   out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] )      T = bfloat16 or float16
//
// products and sums in fp32, the bias added in fp32, one rounding, for 1 <= m <= kMaxM tokens.
// The weight stream is the whole cost at these m (2304 x 16384 bf16 is 75.5 MB against 16 tokens'
// 0.5 MB), so the kernel is built around reading it at the memory's speed:
//
// * A split-K grid of thread-block clusters: row tile t of tile_n rows is one cluster of `split`
//   blocks (1-8), block r of it reading the r-th of `split` contiguous slices of K. A split is
//   chosen so that tiles x split fills the GPU (2304 rows of 64 are 36 tiles: a split of 4-6
//   makes 144-216 blocks, two or three an SM); the blocks share the memory's bandwidth, so each
//   slice streams in about the same time.
// * One producer warp per block streams its slice through a ring of `stages` shared-memory
//   stages: one thread issues the TMA boxes of a stage (the tile's rows x stage_k columns of W,
//   128-byte swizzled, and the tokens' x columns) on the stage's mbarrier, waiting only for the
//   stage to be handed back; the consumer warps (16 rows of W each) read their mma.sync A and B
//   fragments with ldmatrix from the stage and hand it back.
// * The slices' fp32 partial tiles are summed through distributed shared memory: each block
//   leaves its partial in its own shared memory, and after a cluster barrier the rows of
//   consumer warp w are added by block w % split in block order, which adds the bias and writes
//   them: the same bits on every run, and no global memory between the blocks. (A first design
//   cut the work into equal ranges of (tile, K stage) units over a persistent grid and summed
//   the cut tiles through global partials and arrival counters; the fences and round trips of
//   that fixup cost 5.6 us of 25.6 at 2304 x 16384, H200: docs/skinny-gemm-tma-kernel.md.)
//
// CUDA only (the binding includes this header in CUDA builds alone); the kernel's code exists
// for capability 9.0 (the launch refuses other GPUs): the package's Triton kernel serves sm80 and
// gfx942.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fused_llm {
namespace skinny_gemm {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };

// Tokens the kernel takes: two n8 tiles of mma.sync m16n8k16.
constexpr int kMaxM = 16;
// K columns of one TMA box of W / x: 128 bytes, the span of the 128-byte swizzle.
constexpr int kBoxK = 64;

struct SkinnyTmaConfig {
  int tile_n = 64;      // rows of W a unit covers: 16 per consumer warp; 32, 64 or 128
  int boxes_k = 2;      // 64-column boxes per stage: stage_k = 64 * boxes_k columns; 1, 2 or 4
  int stages = 6;       // shared-memory stages of the ring: 2 .. 8 (within the SM's 227 KiB)
  int split = 1;        // K slices of a row tile, the blocks of its cluster: 1 .. kMaxSplit
};

// The most K slices (blocks of a cluster: the portable cluster size).
constexpr int kMaxSplit = 8;

struct SkinnyTmaParams {
  int64_t m = 0;  // 1 .. kMaxM (0 launches nothing)
  int64_t n = 0;  // >= 1, any value (the last tile's rows past n read as zeros, never stored)
  int64_t k = 0;  // >= 8, a multiple of 8 (the copy engine's 16-byte row strides)
  DType dtype = DType::kBFloat16;

  // x [m, k] and w [n, k]: unit-stride rows, row strides multiples of 8 elements, bases 16-byte
  // aligned (the tensor maps' rules).
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const void* w = nullptr;
  int64_t w_row_stride = 0;
  const void* bias = nullptr;  // [n] or nullptr
  bool bias_fp32 = false;      // bias dtype float32 (else T)
  void* out = nullptr;         // [m, n] of T, unit-stride rows
  int64_t out_row_stride = 0;
  SkinnyTmaConfig config;
};

// Whether `config` is one the library has code for ((tile_n, boxes_k, stages) compiled, split
// 1 .. kMaxSplit).
bool skinny_tma_config_supported(const SkinnyTmaConfig& config);
// The compiled (tile_n, boxes_k, stages) triples: sets `*configs` to the first of `count`
// entries (their split is kMaxSplit, the most any takes) and returns count.
int skinny_tma_compiled_configs(const SkinnyTmaConfig** configs);

// Enqueues the kernel on `stream`. Returns cudaErrorNotSupported (with nothing enqueued) where
// the device is not capability 9.0, the tensor maps cannot be encoded (alignment, driver) or the
// configuration is not one of the compiled ones; other CUDA errors of the launch (a cluster the
// device cannot place) as they come.
cudaError_t skinny_tma_launch(const SkinnyTmaParams& p, cudaStream_t stream);

}  // namespace skinny_gemm
}  // namespace fused_llm
