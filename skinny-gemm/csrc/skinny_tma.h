// Framework-free interface of skinny-gemm's compiled Hopper kernel (sm90: TMA, mbarriers,
// mma.sync):
//
//   out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] )      T = bfloat16 or float16
//
// products and sums in fp32, the bias added in fp32, one rounding, for 1 <= m <= kMaxM tokens.
// The weight stream is the whole cost at these m (2304 x 16384 bf16 is 75.5 MB against 16 tokens'
// 0.5 MB), so the kernel is built around reading it at the memory's speed:
//
// * A persistent grid: `programs` blocks (one or two an SM) split the (row tile, K stage) units of
//   the whole product into equal contiguous ranges, so every SM streams the same number of bytes
//   and none waits on a second wave (stream-K). A range may start or end inside a row tile; the
//   tiles it cuts are summed across the blocks that share them.
// * One producer warp per block streams its range through a ring of `stages` shared-memory
//   stages: one thread issues the TMA boxes of a stage (the tile's rows x stage_k columns of W,
//   128-byte swizzled, and the tokens' x columns) on the stage's mbarrier, waiting only for the
//   stage to be handed back; the consumer warps (16 rows of W each) read their mma.sync A and B
//   fragments with ldmatrix from the stage and hand it back.
// * A row tile cut between blocks is summed in a fixed order: each block stores its fp32 partial
//   tile in one of its two slots of `partials`, and the last to arrive (an arrival counter per tile) adds the
//   slots in block order, adds the bias and writes the tile: the same bits on every run.
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
  int blocks_per_sm = 1;  // 1, or 2 where two blocks fit an SM (programs = SMs x blocks_per_sm, at most the units)
};

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

  // fp32 [2 * programs * tile_n * 16] (skinny_tma_partial_floats); int32 [tiles]
  // (ceil(n / tile_n)), zero on entry, left zero (so one launch at a time uses them).
  float* partials = nullptr;
  int32_t* counters = nullptr;
  SkinnyTmaConfig config;
};

// The grid a launch with these parameters takes on a GPU of `sms` multiprocessors.
int64_t skinny_tma_programs(const SkinnyTmaParams& p, int sms);
// The floats `partials` must hold for that launch.
int64_t skinny_tma_partial_floats(const SkinnyTmaParams& p, int sms);
// Whether `config` is one the library has code for (tile_n, boxes_k, stages, blocks_per_sm).
bool skinny_tma_config_supported(const SkinnyTmaConfig& config);
// The compiled (tile_n, boxes_k, stages) triples: sets `*configs` to the first of `count`
// entries, whose blocks_per_sm is the most blocks an SM holds (1 or 2), and returns count.
int skinny_tma_compiled_configs(const SkinnyTmaConfig** configs);

// Enqueues the kernel on `stream`. Returns cudaErrorNotSupported (with nothing enqueued) where
// the device is not capability 9.0, the tensor maps cannot be encoded (alignment, driver) or the
// configuration is not one of the compiled ones; other CUDA errors of the launch as they come.
cudaError_t skinny_tma_launch(const SkinnyTmaParams& p, cudaStream_t stream);

}  // namespace skinny_gemm
}  // namespace fused_llm
