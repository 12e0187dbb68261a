// Reductions across the threads of a row in the GPU kernels (CUDA; hipified for ROCm gfx942):
// xor-shuffle butterflies inside a warp, then one shared-memory slot per warp when a row spans
// several warps.
#pragma once

#include <cuda_runtime.h>

namespace fused_llm {

#ifndef USE_ROCM
constexpr int kWarpSize = 32;
#else
constexpr int kWarpSize = 64;  // gfx942 wavefront
#endif
// Shared-memory slots for one partial per warp of a 1024-thread block.
constexpr int kMaxWarps = 1024 / kWarpSize;

__device__ __forceinline__ float shfl_xor(float v, int offset) {
#ifndef USE_ROCM
  return __shfl_xor_sync(0xffffffffu, v, offset);
#else
  return __shfl_xor(v, offset);
#endif
}

// The combining operations. kIdentity fills the slots of warps outside the row.
struct ReduceSum {
  static constexpr float kIdentity = 0.0f;
  __device__ __forceinline__ static float combine(float a, float b) { return a + b; }
};
// Max of non-negative values (max |y| for an FP8 scale): 0 is its identity there.
struct ReduceAmax {
  static constexpr float kIdentity = 0.0f;
  __device__ __forceinline__ static float combine(float a, float b) { return fmaxf(a, b); }
};

// Combine over `width` consecutive lanes (a power of two <= kWarpSize, the group starting at a
// multiple of width); every lane of the group gets the result. All lanes of the warp must call
// it (the shuffles use the full-warp mask).
template <class Op>
__device__ __forceinline__ float warp_reduce(float v, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) v = Op::combine(v, shfl_xor(v, o));
  return v;
}

// How a block's threads form rows when a row spans more than one warp.
enum class WideRows {
  kPow2,   // rows of a power-of-two number of threads, several rows per block allowed
  kBlock,  // the block is one row, of any whole number of warps
};

// Combine over the `tpr` consecutive threads of a row; every thread gets its row's result.
// tpr <= warp size: a power of two; xor shuffles inside the warp (several rows per warp stay
// separate). tpr > warp size: each warp combines, then the row's warps combine through `smem`
// (kMaxWarps slots), laid out as `kWide` says. Every thread of the block must call it, with the
// same tpr (it has a barrier when tpr > warp size, and the block is a whole number of warps).
template <class Op, WideRows kWide = WideRows::kPow2>
__device__ __forceinline__ float row_reduce(float v, int tpr, float* smem) {
  v = warp_reduce<Op>(v, tpr < kWarpSize ? tpr : kWarpSize);
  if (tpr > kWarpSize) {
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    // The row's warps are [first, first + count).
    const int count = kWide == WideRows::kPow2 ? tpr / kWarpSize : static_cast<int>(blockDim.x / kWarpSize);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    const int first = kWide == WideRows::kPow2 ? warp & ~(count - 1) : 0;
    v = lane < count ? smem[first + lane] : Op::kIdentity;
    v = warp_reduce<Op>(v, kWarpSize);
  }
  return v;
}

}  // namespace fused_llm
