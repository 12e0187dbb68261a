// Torch-facing entry points of skinny-gemm's compiled ops (schemas in torch_binding.cpp). Defined
// and registered only in CUDA builds: the package's other paths (Triton on CUDA / ROCm, plain
// torch on CPU) are Python custom ops.
#pragma once

#include <optional>
#include <vector>

#include <ATen/ATen.h>

// out [M, N] = x [M, K] @ w [N, K]^T (+ bias) by the Hopper TMA kernel (csrc/skinny_tma.h):
// 1 <= M <= 16, K a multiple of 8, capability 9.0 GPUs; (tile_n, boxes_k, stages) one of
// skinny_tma_configs(), split (K slices: the blocks of a thread-block cluster) 1 .. its most;
// pdl: launched as a programmatic dependent of the stream's previous kernel.
void skinny_tma(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t tile_n, int64_t boxes_k, int64_t stages, int64_t split, bool pdl);

// out [M, N] = (x [M, K] @ w [N, K]^T) * x_scale * w_scale (+ bias) on float8_e4m3fn x and w by
// the same kernel: x_scale fp32 [1] or [M], w_scale fp32 [1] or [N], K a multiple of 16, out
// bfloat16, float16 or float32, bias [N] of any of those; the rest as skinny_tma.
void skinny_tma_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& x_scale,
                    const at::Tensor& w_scale, const std::optional<at::Tensor>& bias, int64_t tile_n, int64_t boxes_k,
                    int64_t stages, int64_t split, bool pdl);

// The compiled (tile_n, boxes_k, stages, most K slices) quadruples, flattened.
std::vector<int64_t> skinny_tma_configs();

// out [M, N] = x [M, K] @ w [N, K]^T (+ bias) by the tensor-core GEMV (csrc/skinny_mma.h):
// 1 <= M <= 16 (32 / segments with segments, the row-run loop), K a multiple of one step (32 x unroll
// columns, x segments with segments; twice that for the wgmma loop), 16-byte aligned rows, capability
// >= 8.0 (9.0 with split > 1; exactly 9.0 for wgmma); (row_groups, unroll, warps, stages, split,
// shared_x, segments, wgmma) one of skinny_mma_configs().
void skinny_mma(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t row_groups, int64_t unroll, int64_t warps, int64_t stages, int64_t split, int64_t shared_x,
                int64_t segments, int64_t wgmma);

// out [M, N] = (x [M, K] @ w [N, K]^T) * x_scale * w_scale (+ bias) on float8_e4m3fn x and w by
// the same GEMV: K a multiple of one step (64 x unroll columns, x segments with segments),
// capability >= 8.9, scales, out and bias as skinny_tma_fp8.
void skinny_mma_fp8(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& x_scale,
                    const at::Tensor& w_scale, const std::optional<at::Tensor>& bias, int64_t row_groups,
                    int64_t unroll, int64_t warps, int64_t stages, int64_t split, int64_t shared_x,
                    int64_t segments, int64_t wgmma);

// The compiled (row_groups, unroll, warps, stages, split, shared_x, segments, wgmma) configurations, flattened.
std::vector<int64_t> skinny_mma_configs();
