// Torch-facing entry point of machete-w4a16's compiled op (schema in torch_binding.cpp). Defined
// and registered only in CUDA builds: every other path of the package (Triton on CUDA / ROCm,
// plain torch on CPU) is a Python custom op.
#pragma once

#include <optional>

#include <ATen/ATen.h>

// out [M, N] = x [M, K] @ dequantize(qweight, scales, zeros)^T (+ bias): the mma.sync small-M
// kernel (csrc/w4a16_mma.h), M <= 32, K a multiple of 128, group size >= 32 or -1; `ring`: on
// sm90 code its weights through per-warp TMA rings where the tensors allow it;
// `early_weights`: the weights are read before the wait on the previous kernel (w4a16_mma.h);
// `residual` [M, N]: out = residual + that result (rounded, then the sum rounded: torch's add).
void w4a16_mma(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
               const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias, int64_t group_size,
               int64_t split_k, int64_t warps, int64_t row_tiles, const std::optional<at::Tensor>& counters,
               bool ring, bool early_weights, const std::optional<at::Tensor>& residual);

// The same product by the Hopper wgmma large-M kernel (csrc/w4a16_wgmma.h): K a multiple of 64,
// N of 16, group size >= 32 or -1; tile 0 / 1 / 2 = 128 x 256 / 128 x 128 / 128 x 64 (W rows x
// tokens); split_k 1 .. 8 blocks a tile. Capability 9.0 GPUs only.
void w4a16_wgmma(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                 const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& bias, int64_t group_size,
                 int64_t tile, int64_t split_k, const std::optional<at::Tensor>& counters);
