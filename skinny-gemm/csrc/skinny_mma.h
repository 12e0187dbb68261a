// Framework-free interface of skinny-gemm's plain-load tensor-core GEMV (sm80 and sm90: mma.sync,
// no shared memory in its loop):
//
//   out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] )        T = bfloat16 or float16
//
// products and sums in fp32, the bias added in fp32, one rounding, for 1 <= m <= kMmaMaxM tokens.
//
// Why a second compiled kernel: at 2-16 tokens every kernel built on staged tiles (the package's
// Triton dot tile and TMA ring, cuBLAS) read 2304 x 16384 bf16 at 80-86% of the read floor on an
// H200 in a layer, where the one-token FMA GEMV, which only streams plain 16-byte loads, read
// 95%. This kernel streams W the GEMV's way and still multiplies on the tensor cores:
//
// * mma.sync m16n8k16 with x as A (16 token rows, those past m zero) and W^T as B (8 weight
//   rows): lane (g, t) = (lane / 4, lane % 4) loads 16 contiguous bytes of W row g and of x rows
//   g and g + 8 at column 8 t of each 32-column chunk. K is permuted alike for W and x inside a
//   chunk (the fragment's logical columns 2t, 2t + 1 of k16 step s are physical 8t + 4s + {0, 1},
//   columns 2t + 8, 2t + 9 are 8t + 4s + {2, 3}), so the loaded registers are the fragments: no
//   shuffle, no conversion, no shared memory.
// * A block is `warps` warps over the same `row_groups` x 8 rows, each a contiguous range of K's
//   chunks; `unroll` chunks a step, the next step's loads issued before this step's mmas. The
//   warps' fp32 tiles are summed in shared memory in warp order (deterministic), the bias added
//   and the rows written: no K split across blocks, no global workspace.
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
// K is read in chunks of 32 columns (one 16-byte load of a row per lane of a row's four).
constexpr int kMmaChunkK = 32;

struct SkinnyMmaConfig {
  int row_groups = 1;  // groups of 8 weight rows a block: 1 or 2
  int unroll = 2;      // 32-column chunks a step: 1, 2 or 4
  int warps = 8;       // warps a block, each a contiguous range of K: 4, 8 or 16
};

struct SkinnyMmaParams {
  int64_t m = 0;  // 1 .. kMmaMaxM (0 launches nothing)
  int64_t n = 0;  // >= 1, any value (rows past n read row n - 1, never stored)
  int64_t k = 0;  // a positive multiple of kMmaChunkK
  DType dtype = DType::kBFloat16;  // x, w and out: kBFloat16 or kFloat16
  // x [m, k] and w [n, k]: unit-stride rows, row strides multiples of 8 elements, bases 16-byte
  // aligned (every load is 16 bytes).
  const void* x = nullptr;
  int64_t x_row_stride = 0;  // elements
  const void* w = nullptr;
  int64_t w_row_stride = 0;  // elements
  const void* bias = nullptr;  // [n] of dtype or kFloat32, or nullptr
  DType bias_dtype = DType::kBFloat16;
  void* out = nullptr;  // [m, n] of dtype, unit-stride rows
  int64_t out_row_stride = 0;
  SkinnyMmaConfig config;
};

// Whether `config` is one the library has code for.
bool skinny_mma_config_supported(const SkinnyMmaConfig& config);
// The compiled configurations: sets `*configs` to the first of `count` entries, returns count.
int skinny_mma_compiled_configs(const SkinnyMmaConfig** configs);

// Enqueues the kernel on `stream`. Returns cudaErrorNotSupported (with nothing enqueued) where the
// arguments break the rules above or the device is below capability 8.0; other CUDA errors of the
// launch as they come.
cudaError_t skinny_mma_launch(const SkinnyMmaParams& p, cudaStream_t stream);

}  // namespace skinny_gemm
}  // namespace fused_llm
