// Framework-free interface of gated-mlp's sm90 kernel (CuTe: TMA + wgmma, warp-specialized and
// persistent; Hopper only, built for sm_90a). Opt-in (impl="sm90"): on an H100 it measured
// 0.84-1.0x the package's Triton kernel at prefill sizes, which stays the default there. The computation and its arguments:
// gated_mlp_params.h. Here d may be any size >= 1 (the copy engine zero-fills past it), and
// every row stride of x / w_gate / w_up must be a multiple of 8 elements (16 bytes), with
// 16-byte aligned bases: what Hopper's tensor-copy descriptors require.
//
// CUDA only: the binding includes this header only when compiled for CUDA (CUDA_KERNEL).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gated_mlp_params.h"

namespace fused_llm {
namespace gated_mlp {

// Tile shape (documented in the .cu): 128 rows x 128 columns of each of the two accumulators
// (one 128 x 256 wgmma tile), K steps of 64, 4 shared-memory stages; 384 threads = a producer
// warpgroup (TMA) and two consumer warpgroups (wgmma, 64 rows each); clusters of 2 CTAs along
// M multicast their W tiles.
constexpr int kSm90BlockM = 128;
constexpr int kSm90BlockN = 128;
constexpr int kSm90BlockK = 64;
constexpr int kSm90Stages = 4;
constexpr int kSm90Threads = 384;

// nullptr when the kernel can run `p`, else a message naming the violated precondition (a
// static string). The launcher checks it too and returns cudaErrorInvalidValue instead.
const char* gated_mlp_sm90_check(const GatedMlpParams& p);

// Dynamic shared memory one CTA needs (bytes): ~193 KiB, which Hopper allows (227 KiB).
int gated_mlp_sm90_smem_bytes();

// Enqueues the kernel on `stream`: persistent clusters of 2 CTAs (as many as fit on the GPU's
// sm_count SMs, at most one per pair of row tiles and column tile), each taking output tiles
// in grouped order. m == 0 launches nothing. Returns cudaGetLastError() after the launch,
// cudaErrorInvalidValue when gated_mlp_sm90_check(p) fails, or the driver's error when a
// tensor-copy descriptor cannot be encoded. Needs a GPU of capability 9.0 (sm_90a code only).
cudaError_t gated_mlp_sm90_launch(const GatedMlpParams& p, int sm_count, cudaStream_t stream);

}  // namespace gated_mlp
}  // namespace fused_llm
