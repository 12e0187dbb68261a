// Framework-free interface of gated-mlp's sm80 kernel (CuTe: mma.sync + cp.async + ldmatrix).
// The computation and its arguments: gated_mlp_params.h. Here d must be a multiple of 8
// (16-byte cp.async vectors).
//
// CUDA only: the binding includes this header only when compiled for CUDA (CUDA_KERNEL), and
// the .cu is listed in the cuda [kernel.*] section alone, so nothing here is hipified; ROCm and
// the CPU use the package's Triton / plain-torch paths.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gated_mlp_params.h"

namespace fused_llm {
namespace gated_mlp {

// Tile shape of the kernel (documented in the .cu): 128 rows x 128 columns of each of the two
// accumulators, K steps of 32, 4-stage cp.async pipeline, 256 threads (8 warps).
constexpr int kSm80BlockM = 128;
constexpr int kSm80BlockN = 128;
constexpr int kSm80BlockK = 32;
constexpr int kSm80Stages = 4;
constexpr int kSm80Threads = 256;

// nullptr when the kernel can run `p`, else a message naming the violated precondition (a
// static string: no numbers, the caller formats those). The launcher checks it too and
// returns cudaErrorInvalidValue instead of launching.
const char* gated_mlp_sm80_check(const GatedMlpParams& p);

// Dynamic shared memory one CTA needs (bytes): more than the 48 KiB default, so the launcher
// opts in per kernel; GPUs of capability 8.x allow >= 99 KiB.
int gated_mlp_sm80_smem_bytes();

// Enqueues the kernel on `stream`; m == 0 launches nothing. Returns cudaGetLastError() after
// the launch (cudaSuccess when nothing was launched), or cudaErrorInvalidValue when
// gated_mlp_sm80_check(p) fails. Needs a GPU of capability >= 8.0 (sm_80 code, or its PTX
// JIT-compiled on newer GPUs).
cudaError_t gated_mlp_sm80_launch(const GatedMlpParams& p, cudaStream_t stream);

}  // namespace gated_mlp
}  // namespace fused_llm
