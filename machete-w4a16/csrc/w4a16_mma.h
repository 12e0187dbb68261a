// Framework-free interface of machete-w4a16's compiled small-M kernel (mma.sync, sm80+):
//
//   out[m, n] = T( sum_k x[m, k] w[n, k] + bias[n] ),   w[n, k] = T((q[n, k] - z) * s)
//   with a residual:  out[m, n] = T( float(that) + float(residual[m, n]) )
//
// T = float16 or bfloat16 (x, scales, out); q the 4-bit code, z the zero point (8, or the uint8
// zeros of the weight's group), s the scale of the weight's group, the product rounded once to T
// (exactly dequantize()'s value); products summed in fp32, the bias added in fp32, one rounding
// to T. A residual is added after that rounding, in fp32, and rounded again: the bits of
// torch's `residual + gemm(...)`, one kernel fewer (a decoder layer's down projection). The
// weight is the package's one layout (torch-ext/machete_w4a16/_format.py): qweight
// int32 [n, k / 8], word j of a row holds columns 8j .. 8j + 7 with column 8j + c in nibble
// slot (c / 2) + 4 (c % 2), i.e. the slots hold columns 0, 2, 4, 6, 1, 3, 5, 7 (AWQ's order):
// one AND-OR of a word shifted by 4i makes the two 16-bit values of columns 8j + 2i and
// 8j + 2i + 1, which is one register of an mma.sync A fragment (w4a16_mma.cu says how a warp's
// fragments map to columns).
//
// CUDA only: the binding includes this header only in CUDA builds (CUDA_KERNEL); ROCm and CPU
// use the package's Triton / plain-torch paths.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fused_llm {
namespace machete_w4a16 {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };

// Rows of W one warp's mma tile covers, and the K columns one pass of a warp consumes (eight
// m16n8k16 steps; each lane loads 16 bytes of each of its two W rows).
constexpr int kTileRows = 16;
constexpr int kWindow = 128;
// Tokens one mma covers (n8) and the most tokens the kernel takes (n8 tiles per warp: 1, 2, 4).
constexpr int kTokensPerMma = 8;
constexpr int kMaxM = 32;

struct W4A16MmaParams {
  int64_t m = 0;  // rows of x and out, 1 .. kMaxM (0 launches nothing)
  int64_t n = 0;  // output features (rows of W), >= 1, any value
  int64_t k = 0;  // input features, a positive multiple of kWindow
  DType dtype = DType::kBFloat16;

  // x [m, k]: unit-stride rows, row stride a multiple of 8 elements, base 16-byte aligned.
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const uint32_t* qweight = nullptr;  // [n, k / 8], contiguous, 16-byte aligned
  const void* scales = nullptr;       // [k / G, n] of T, contiguous
  const uint8_t* zeros = nullptr;     // [k / G, n] uint8, contiguous, or nullptr (zero point 8)
  // log2 of the group size G (a power of two >= 32: a lane's 32 columns of a window lie in
  // one group), or >= 31 for one group per output channel (every column in group 0).
  int group_shift = 7;
  const void* bias = nullptr;  // [n] or nullptr
  bool bias_fp32 = false;      // bias dtype float32 (else T)

  void* out = nullptr;  // [m, n] of T, unit-stride rows, row stride >= n
  int64_t out_row_stride = 0;
  // [m, n] of T, unit-stride rows (any row stride: rows may even overlap), or nullptr. Read once
  // per output element by the thread that writes it, so it may even be `out` itself.
  const void* residual = nullptr;
  int64_t residual_row_stride = 0;

  // Launch shape: split_k > 1 splits the K windows over gridDim.y blocks whose fp32 partials
  // ([split_k, m, n] in `partials`) the last block of each row block to arrive sums in split
  // order (deterministic); `counters` [ceil(n / 16)] int32, zero on entry, left zero. On the
  // ring a split of 2 sums in a thread-block cluster instead (same order; both still required).
  int split_k = 1;
  int warps = 4;      // warps per block (4 or 8): each takes every warps-th window of the slice
  int row_tiles = 1;  // 16-row tiles per warp (1 or 2): a block covers 16 row_tiles rows
  float* partials = nullptr;
  int32_t* counters = nullptr;
  // The device's multiprocessors (0: unknown). With it the launcher fetches x a window ahead
  // when the grid fits at 16 warps an SM (w4a16_mma.cu launch_shape); results are identical.
  int sms = 0;
  // Launch as a programmatic dependent of the stream's previous kernel (sm90+; ignored below):
  // the blocks start (the register kernel also hints its first weights into L2) while that
  // kernel finishes; they read x and the weights only once it has completed.
  bool pdl = true;
  // On sm90+ code: stream the weights through a per-warp ring of TMA boxes in shared memory
  // instead of each lane's registers (w4a16_mma.cu w4a16_ring_kernel; x's window in the ring at
  // m == 1, read from global memory above), where the copy engine can address the tensors
  // (n % 8 == 0, with zeros n % 16 == 0; 16-byte aligned scales / zeros), else the register
  // kernel. Same work split and summation order: the same bits.
  bool ring = true;
  // The caller's promise that the kernel right before this one on the stream did not write
  // qweight, scales or zeros (a layer's weights, made long before): as a programmatic dependent
  // the register kernel then loads its first windows before griddepcontrol.wait, while that
  // kernel finishes (false: only L2 hints before the wait). x is read after the wait either
  // way. The ring kernel ignores it (measured no faster; w4a16_mma.cu says where).
  bool early_weights = false;
};

// nullptr when the kernel can run `p`, else a message naming the violated precondition (a
// static string). The launcher checks it too and returns cudaErrorInvalidValue instead.
const char* w4a16_mma_check(const W4A16MmaParams& p);

// Enqueues the kernel on `stream`; m == 0 launches nothing. Returns the launch's error
// (cudaLaunchKernelEx's, then cleared), cudaSuccess when it was enqueued. Needs a GPU of
// capability >= 8.0 (bf16 mma.sync).
cudaError_t w4a16_mma_launch(const W4A16MmaParams& p, cudaStream_t stream);

}  // namespace machete_w4a16
}  // namespace fused_llm
