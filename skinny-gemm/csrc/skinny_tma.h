// Framework-free interface of skinny-gemm's compiled Hopper kernel (sm90: TMA, mbarriers,
// mma.sync):
//
//   16-bit:  out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] )                T = bfloat16 or float16
//   FP8:     out[m, n] = O( (sum_k x[m, k] w[n, k]) * x_scale[m] * w_scale[n] + bias[n] )
//            x, w e4m3fn; scales fp32 per tensor or per token / output row; O = bf16, fp16 or fp32
//
// products and sums in fp32, the scales and the bias applied in fp32, one rounding, for
// 1 <= m <= kMaxM tokens. The weight stream is the whole cost at these m (2304 x 16384 bf16 is
// 75.5 MB against 16 tokens' 0.5 MB), so the kernel is built around reading it at the memory's
// speed:
//
// * A split-K grid of thread-block clusters: row tile t of tile_n rows is one cluster of `split`
//   blocks (1-8), block r of it reading the r-th of `split` contiguous slices of K. A split is
//   chosen so that tiles x split fills the GPU (2304 rows of 64 are 36 tiles: a split of 4-6
//   makes 144-216 blocks, two or three an SM); the blocks share the memory's bandwidth, so each
//   slice streams in about the same time.
// * One producer warp per block streams its slice through a ring of `stages` shared-memory
//   stages: one thread issues the TMA boxes of a stage (the tile's rows x 128 bytes of K of W,
//   128-byte swizzled, and the tokens' x columns) on the stage's mbarrier, waiting only for the
//   stage to be handed back; the consumer warps (16 rows of W each) read their mma.sync A and B
//   fragments with ldmatrix from the stage and hand it back. FP8 runs the same ring: a box is
//   128 bytes of K either way, and mma.sync m16n8k32 e4m3 takes its fragments from the same
//   bytes as m16n8k16 does.
// * The slices' fp32 partial tiles are summed through distributed shared memory: each block
//   leaves its partial in its own shared memory, and after a cluster barrier the rows of
//   consumer warp w are added by block w % split in block order, which applies the scales and
//   the bias and writes them: the same bits on every run, and no global memory between the
//   blocks. (A first design cut the work into equal ranges of (tile, K stage) units over a
//   persistent grid and summed the cut tiles through global partials and arrival counters; the
//   fences and round trips of that fixup cost 5.6 us of 25.6 at 2304 x 16384, H200:
//   docs/skinny-gemm-tma-kernel.md.)
// * Programmatic dependent launch (`pdl`): the ring's first pass over W is issued before the
//   kernel waits for the one before it (W is no kernel's output), x and everything else after.
//
// CUDA only (the binding includes this header in CUDA builds alone); the kernel's code exists
// for capability 9.0 (the launch refuses other GPUs): the package's Triton kernel serves sm80 and
// gfx942.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fused_llm {
namespace skinny_gemm {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat8E4M3 = 2, kFloat32 = 3 };

// Tokens the kernel takes: two n8 tiles of mma.sync m16n8k16.
constexpr int kMaxM = 16;

struct SkinnyTmaConfig {
  int tile_n = 64;      // rows of W a block covers: 16 per consumer warp; 16, 32, 64 or 128
  int boxes_k = 2;      // 128-byte boxes of K per stage (64 16-bit or 128 FP8 columns each): 1-8
  int stages = 6;       // shared-memory stages of the ring: 2 .. 8 (within the SM's 227 KiB)
  int split = 1;        // K slices of a row tile, the blocks of its cluster: 1 .. kMaxSplit
};

// The most K slices (blocks of a cluster: the portable cluster size).
constexpr int kMaxSplit = 8;

struct SkinnyTmaParams {
  int64_t m = 0;  // 1 .. kMaxM (0 launches nothing)
  int64_t n = 0;  // >= 1, any value (the last tile's rows past n read as zeros, never stored)
  int64_t k = 0;  // >= 16 bytes of K, a multiple of 16 bytes (the copy engine's row strides)
  DType dtype = DType::kBFloat16;      // x and w: kBFloat16, kFloat16 or kFloat8E4M3
  DType out_dtype = DType::kBFloat16;  // 16-bit x: x's dtype; FP8: kBFloat16, kFloat16 or kFloat32

  // x [m, k] and w [n, k]: unit-stride rows, row strides multiples of 16 bytes, bases 16-byte
  // aligned (the tensor maps' rules).
  const void* x = nullptr;
  int64_t x_row_stride = 0;  // elements
  const void* w = nullptr;
  int64_t w_row_stride = 0;  // elements
  const void* bias = nullptr;           // [n] or nullptr
  DType bias_dtype = DType::kBFloat16;  // 16-bit x: x's dtype or kFloat32; FP8: any 16-bit or kFloat32
  const float* x_scale = nullptr;       // FP8: [1] or [m]
  bool x_scale_per_token = false;
  const float* w_scale = nullptr;       // FP8: [1] or [n]
  bool w_scale_per_row = false;
  void* out = nullptr;  // [m, n] of out_dtype, unit-stride rows
  int64_t out_row_stride = 0;
  bool pdl = true;  // launch as a programmatic dependent of the stream's previous kernel
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
