// Framework-free interface of machete-w4a16's compiled large-M kernel (Hopper wgmma, sm_90a):
//
//   out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] ),   w[n, k] = T((q[n, k] - z) * s)
//
// the semantics of w4a16_mma.h (dequantize()'s value, fp32 sums, one rounding), on the same
// prepacked weight (torch-ext/machete_w4a16/_format.py). The weight tile is dequantized in
// registers straight into wgmma's register A operand (the product is computed as out^T = W x^T);
// x is the shared-memory B operand. w4a16_wgmma.cu says how.
//
// CUDA only, and only in code built for sm_90a (wgmma): the binding includes this header in
// CUDA builds and the Python dispatch calls the op only on capability 9.0 GPUs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "w4a16_mma.h"  // DType

namespace fused_llm {
namespace machete_w4a16 {

// K columns one pipeline stage holds (one 128-byte swizzle row of x per token).
constexpr int kWgmmaStepK = 64;

// The block tiles the launcher takes: rows of W (one warpgroup, with its 64-row wgmmas, per 64
// rows) x tokens (the wgmma's N).
enum class WgmmaTile : int32_t {
  k128x256 = 0,  // two warpgroups, n256: 128 accumulators a thread, one block an SM
  k128x128 = 1,  // two warpgroups, n128: two blocks an SM
  k128x64 = 2,   // two warpgroups, n64: two blocks an SM
  k64x256 = 3,   // one warpgroup, n256, one block an SM: twice the tiles of k128x256
};
constexpr int wgmma_tile_rows(WgmmaTile t) { return t == WgmmaTile::k64x256 ? 64 : 128; }
constexpr int wgmma_tile_tokens(WgmmaTile t) {
  return t == WgmmaTile::k128x256 || t == WgmmaTile::k64x256 ? 256 : t == WgmmaTile::k128x128 ? 128 : 64;
}

struct W4A16WgmmaParams {
  int64_t m = 0;  // rows of x and out, >= 0 (0 launches nothing)
  int64_t n = 0;  // output features (rows of W), a positive multiple of 16
  int64_t k = 0;  // input features, a positive multiple of kWgmmaStepK
  DType dtype = DType::kBFloat16;

  // x [m, k]: unit-stride rows, row stride a multiple of 8 elements, base 16-byte aligned.
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const uint32_t* qweight = nullptr;  // [n, k / 8], contiguous, 16-byte aligned
  const void* scales = nullptr;       // [k / G, n] of T, contiguous, 16-byte aligned
  const uint8_t* zeros = nullptr;     // [k / G, n] uint8, contiguous, 16-byte aligned, or nullptr (8)
  // log2 of the group size G (a power of two >= 32), or >= 31 for one group per output channel.
  int group_shift = 7;
  const void* bias = nullptr;  // [n] or nullptr
  bool bias_fp32 = false;      // bias dtype float32 (else T)

  void* out = nullptr;  // [m, n] of T, unit-stride rows, row stride >= n and a multiple of 8, 16-byte aligned
  int64_t out_row_stride = 0;

  WgmmaTile tile = WgmmaTile::k128x256;
  // split_k > 1 (<= kWgmmaMaxSplit, <= k / 64) shares each output tile's K steps out evenly over
  // split_k blocks whose fp32 tiles are summed in split order (deterministic): at the 256-token
  // tile the blocks are a thread-block cluster summing through distributed shared memory; at the
  // others the last block of the tile to arrive sums `partials` (w4a16_wgmma_partial_floats()
  // floats), counting arrivals in `counters` (w4a16_wgmma_tiles() int32, zero on entry, left zero).
  //
  // split_k == 0 is stream-K: min(stream_blocks, all tiles' K steps) persistent blocks each take
  // an equal run of the tiles' K steps in tile order, so no SM idles when the tiles do not fill
  // whole waves (8B QKV at M = 256: 48 tiles on 132 SMs). A tile shared by several blocks is
  // summed by the block holding its last step, adding the others' fp32 partials (one a block, in
  // `partials`) in block order (deterministic); `counters` counts their arrivals as above.
  int split_k = 1;
  int stream_blocks = 0;  // split_k == 0: the persistent blocks (the SMs x blocks an SM of the tile)
  float* partials = nullptr;
  int32_t* counters = nullptr;
};

// Blocks an SM of a tile: each tile's kernel is compiled for it (__launch_bounds__, w4a16_wgmma.cu
// launch_zeros), and stream_blocks is made of it.
constexpr int wgmma_blocks_per_sm(WgmmaTile t) {
  return t == WgmmaTile::k128x128 || t == WgmmaTile::k128x64 ? 2 : 1;
}

// The largest K split: a portable cluster size.
constexpr int kWgmmaMaxSplit = 8;

// Output tiles of a launch (the counters a split of the 128- / 64-token tiles, or stream-K, needs).
int64_t w4a16_wgmma_tiles(const W4A16WgmmaParams& p);

// Blocks a stream-K launch runs: stream_blocks, at most one a K step of the tiles.
int64_t stream_k_blocks(const W4A16WgmmaParams& p);

// fp32 elements of the partials the launch needs (0: none).
int64_t w4a16_wgmma_partial_floats(const W4A16WgmmaParams& p);

// nullptr when the kernel can run `p`, else a message naming the violated precondition (a
// static string). The launcher checks it too and returns cudaErrorInvalidValue instead.
const char* w4a16_wgmma_check(const W4A16WgmmaParams& p);

// Enqueues the kernel on `stream`; m == 0 launches nothing. Returns cudaGetLastError() after
// the launch. Needs a GPU of capability 9.0 (the code is sm_90a only).
cudaError_t w4a16_wgmma_launch(const W4A16WgmmaParams& p, cudaStream_t stream);

}  // namespace machete_w4a16
}  // namespace fused_llm
