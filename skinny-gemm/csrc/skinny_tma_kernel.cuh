// skinny-gemm's compiled Hopper kernel: the weight stream of a decode-sized GEMM through the copy
// engine at the memory's speed (skinny_tma.h says what it computes and the plan). Included by
// one translation unit per input dtype (skinny_tma_{bf16,f16,e4m3}.cu), each instantiating the
// compiled shapes for its dtype, so the three compile in parallel.
//
// Grid: tiles x split blocks in clusters of `split`: block b is K slice r = b % split of row tile
// b / split (a cluster's blocks are consecutive, rank r). Block: kCW = tile_n / 16 consumer
// warps and one producer warp. Slice r holds K stages [r S / split, (r + 1) S / split) of the
// S = ceil(K / stage_k) of a tile (stage_k = boxes_k boxes of 128 bytes of K: 64 16-bit or 128
// FP8 columns each); a slice may be empty.
//
// Shared memory: `stages` stages, each boxes_k boxes of W (tile_n rows x 128 bytes, 128-byte
// swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8), so the ldmatrix rows of a fragment
// fall in distinct banks) and boxes_k boxes of x (8 or 16 token rows, the same swizzle; rows past
// m read as zeros). A stage's `full` barrier completes on the boxes' bytes; its `empty` barrier
// on one arrival per consumer warp, after which the producer refills it.
//
// Consumers: warp w owns rows 16 w .. 16 w + 15 of the tile: per 32-byte K step one ldmatrix.x4
// of W (the A fragment) and one of x (B, one or two n8 token tiles), then mma.sync m16n8k16
// (16-bit) or m16n8k32 (e4m3) into fp32. The two instructions' fragments hold the same bytes of
// a row (thread t: bytes 4 (t % 4) .. + 3 and 16 + those of its rows), so one ldmatrix pattern
// serves both. After the slice, a split of 1 writes the tile. Otherwise each thread leaves its
// fp32 values in the ring's first bytes (its slot: the same offset in every block of the
// cluster), the cluster waits on its barrier, and block w % split adds warp w's slots of blocks
// 0 .. split - 1 in that order through distributed shared memory (deterministic), applies the
// FP8 scales and the bias and writes the rows; a second cluster barrier keeps every block's
// shared memory until it has been read.
//
// Programmatic dependent launch (common/pdl.cuh): every block signals its dependents at once,
// and the producer fills the ring with W (which no kernel before this one writes) before
// griddepcontrol.wait; x, the scales, the bias and out are touched only after the wait. Launched
// after a kernel that signals early (the norms of rmsnorm-fp8, another call of this kernel), the
// first `stages` stages of W stream in while that kernel finishes.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/launch.h"  // opt_in_dynamic_smem
#include "common/pdl.cuh"
#include "common/tma.cuh"
#include "skinny_device.cuh"
#include "skinny_tma.h"

namespace fused_llm {
namespace skinny_gemm {

// What the launchers of the dtype units share (skinny_tma.cu fills it from the params).
struct KernelArgs {
  int64_t m, n, k;
  int64_t k_stages;  // K stages a tile has
  int split;         // K slices of a tile: the cluster's blocks
  DType out_dtype;
  DType bias_dtype;
  const void* bias;
  const float* x_scale;  // FP8 only: [1] or [m]
  const float* w_scale;  // FP8 only: [1] or [n]
  int x_scale_step;      // 0 (per tensor) or 1 (per token)
  int w_scale_step;      // 0 (per tensor) or 1 (per output row)
  void* out;
  int64_t out_row_stride;
};

// The compiled configurations: (tile_n, boxes_k, stages), each for one and two n8 token tiles and
// each input dtype.
#define SKINNY_TMA_CONFIGS(X) \
  X(16, 8, 3)                 \
  X(16, 8, 4)                 \
  X(16, 4, 6)                 \
  X(32, 8, 2)                 \
  X(64, 2, 4)                 \
  X(64, 2, 6)                 \
  X(64, 2, 8)                 \
  X(64, 1, 8)                 \
  X(64, 4, 3)                 \
  X(64, 4, 4)                 \
  X(128, 1, 4)                \
  X(128, 1, 6)                \
  X(128, 2, 3)                \
  X(128, 2, 4)                \
  X(32, 4, 4)                 \
  X(32, 4, 6)                 \
  X(32, 2, 6)                 \
  X(32, 2, 8)

// The launcher of one input dtype (defined by its unit): cudaErrorNotSupported where the
// configuration is not compiled or a tensor map cannot be encoded.
cudaError_t launch_bf16(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream);
cudaError_t launch_f16(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream);
cudaError_t launch_e4m3(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream);

namespace {

using namespace fused_llm::tma;

constexpr int kSwizzleRowBytes = 128;  // one box row: the span of the 128-byte swizzle
constexpr int kStepBytes = 32;         // K bytes of one mma step: k16 of 16-bit, k32 of e4m3

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

template <DType kIn, int kTileN, int kBoxes, int kStages, int kNT>
struct Shape {
  static constexpr int kElemBytes = kIn == DType::kFloat8E4M3 ? 1 : 2;
  static constexpr int kBoxK = kSwizzleRowBytes / kElemBytes;  // K columns of a box
  static constexpr int kCW = kTileN / 16;                       // consumer warps
  static constexpr int kThreads = 32 * (kCW + 1);               // + the producer warp
  static constexpr int kXRows = 8 * kNT;                        // token rows of x's box
  static constexpr int kWBox = kTileN * kSwizzleRowBytes;
  static constexpr int kXBox = kXRows * kSwizzleRowBytes;
  static constexpr int kStageBytes = kBoxes * (kWBox + kXBox);
  static constexpr int kStageK = kBoxK * kBoxes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack (1024 for the swizzle)
  static constexpr int kPartialFloats = kTileN * 8 * kNT;          // one block's fp32 tile
};

template <DType kIn, int kTileN, int kBoxes, int kStages, int kNT>
__global__ void __launch_bounds__(Shape<kIn, kTileN, kBoxes, kStages, kNT>::kThreads, 1)
    skinny_tma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                      const KernelArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = Shape<kIn, kTileN, kBoxes, kStages, kNT>;
  static_assert(S::kPartialFloats * 4 <= kStages * S::kStageBytes, "the partial tile reuses the ring");
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = blockIdx.x / a.split;
  const int rank = int(blockIdx.x % a.split);
  const int64_t ks_begin = rank * a.k_stages / a.split, ks_end = (rank + 1) * a.k_stages / a.split;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s]);
      mbar_init(&empty[s], S::kCW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Every block of this grid is resident once all have signalled, so a dependent launched now
  // takes only room this grid leaves.
  pdl_launch_dependents();

  // Two accumulator chains (the K steps alternate between them): one chain of dependent
  // mma.sync per stage left the consumers behind the copies (H200, 2304 x 16384, M = 1, a
  // scratch kernel: 20.4 -> 20.2 us).
  float acc[2][kNT][4];
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[c][t][0] = acc[c][t][1] = acc[c][t][2] = acc[c][t][3] = 0.0f;

  if (warp == S::kCW) {  // producer
    if (lane == 0) {
      // Boxes starting past K are not issued (the consumers skip them too); a box reaching past
      // K, m or n reads zeros there and still counts its whole size.
      const auto boxes_of = [&](int64_t ks) {
        const int64_t left = (a.k - ks * S::kStageK + S::kBoxK - 1) / S::kBoxK;
        return left < kBoxes ? int(left) : kBoxes;
      };
      const auto load_x = [&](int64_t ks, int s) {
        uint8_t* st = smem + s * S::kStageBytes;
        for (int b = 0, boxes = boxes_of(ks); b < boxes; ++b) {
          tma_load_2d(st + kBoxes * S::kWBox + b * S::kXBox, &xmap, &full[s], int(ks * S::kStageK + b * S::kBoxK), 0);
        }
      };
      // The first pass over the ring: W's boxes before the wait for the previous kernel, x's after.
      const int64_t first = ks_end - ks_begin < kStages ? ks_end - ks_begin : kStages;
      for (int64_t i = 0; i < first; ++i) {
        const int64_t ks = ks_begin + i;
        const int boxes = boxes_of(ks);
        mbar_expect_tx(&full[i], uint32_t(boxes * (S::kWBox + S::kXBox)));
        for (int b = 0; b < boxes; ++b) {
          tma_load_2d(smem + i * S::kStageBytes + b * S::kWBox, &wmap, &full[i], int(ks * S::kStageK + b * S::kBoxK),
                      int(tile * kTileN));
        }
      }
      pdl_wait_primaries();
      for (int64_t i = 0; i < first; ++i) load_x(ks_begin + i, int(i));
      for (int64_t ks = ks_begin + first, i = first; ks < ks_end; ++ks, ++i) {
        const int s = int(i % kStages);
        mbar_wait(&empty[s], int((i / kStages - 1) & 1));
        const int boxes = boxes_of(ks);
        mbar_expect_tx(&full[s], uint32_t(boxes * (S::kWBox + S::kXBox)));
        uint8_t* st = smem + s * S::kStageBytes;
        for (int b = 0; b < boxes; ++b) {
          tma_load_2d(st + b * S::kWBox, &wmap, &full[s], int(ks * S::kStageK + b * S::kBoxK), int(tile * kTileN));
        }
        load_x(ks, s);
      }
    }
    __syncwarp();
  } else {  // consumers
    // Their stores (out) and loads (bias, scales) wait for the previous kernel too; its stages
    // they would wait for anyway (x comes after the producer's wait).
    pdl_wait_primaries();
    // ldmatrix row addresses within a box (the swizzle XORs the chunk with the row's low 3 bits,
    // lane % 8 for every row a lane addresses: the tiles start at multiples of 8 rows).
    const int a_row = 16 * warp + (lane % 8) + ((lane / 8) & 1) * 8, a_chunk = lane / 16;
    const int b_row = (lane % 8) + (kNT == 2 ? (lane / 16) * 8 : 0), b_chunk = (lane / 8) & 1;
    const int swz = lane % 8;
    for (int64_t ks = ks_begin, i = 0; ks < ks_end; ++ks, ++i) {
      const int s = int(i % kStages);
      mbar_wait(&full[s], int((i / kStages) & 1));
      const uint32_t st = smem_u32(smem + s * S::kStageBytes);
      const int64_t k0 = ks * S::kStageK;
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        if (b == 0 || k0 + b * S::kBoxK < a.k) {
          const uint32_t wbox = st + b * S::kWBox + a_row * kSwizzleRowBytes;
          const uint32_t xbox = st + kBoxes * S::kWBox + b * S::kXBox + b_row * kSwizzleRowBytes;
#pragma unroll
          for (int kk = 0; kk < kSwizzleRowBytes / kStepBytes; ++kk) {
            float(&c)[kNT][4] = acc[kk & 1];
            uint32_t af[4];
            ldsm_x4(wbox + (((2 * kk + a_chunk) ^ swz) << 4), af);
            if constexpr (kNT == 2) {
              uint32_t bf[4];
              ldsm_x4(xbox + (((2 * kk + b_chunk) ^ swz) << 4), bf);
              mma_step<kIn>(c[0], af, bf[0], bf[1]);
              mma_step<kIn>(c[1], af, bf[2], bf[3]);
            } else {
              uint32_t b0, b1;
              ldsm_x2(xbox + (((2 * kk + b_chunk) ^ swz) << 4), b0, b1);
              mma_step<kIn>(c[0], af, b0, b1);
            }
          }
        }
      }
      // This warp's reads of the stage (generic proxy) ordered before the copy engine's next
      // writes into it (async proxy), then the stage goes back.
      fence_proxy_async();
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][t][j] += acc[1][t][j];
  }

  // Rows row0 and row0 + 8 of the tile (this thread's four values per token tile): the FP8
  // scales ((acc * x_scale) * w_scale, as the Triton kernel), plus the bias, rounded once, stored.
  const auto write_rows = [&](const float (&v)[kNT][4]) {
    const int64_t row0 = tile * kTileN + 16 * warp + lane / 4;
    const int col0 = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      if (row < a.n) {
        const float bias = a.bias != nullptr ? load_bias(a.bias, a.bias_dtype, row) : 0.0f;
        float w_scale = 1.0f;
        if constexpr (kIn == DType::kFloat8E4M3) w_scale = a.w_scale[row * a.w_scale_step];
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int64_t token = 8 * t + col0 + j;
            if (token < a.m) {
              float y = v[t][2 * h + j];
              if constexpr (kIn == DType::kFloat8E4M3) y = y * a.x_scale[token * a.x_scale_step] * w_scale;
              store_out(a.out, a.out_dtype, token * a.out_row_stride + row, y + bias);
            }
          }
        }
      }
    }
  };

  if (a.split == 1) {
    if (warp < S::kCW) write_rows(acc[0]);
    return;
  }
  // Every stage has been read (each consumer waited for all of its slice's copies; the barrier
  // waits for every consumer's last reads): the ring's first bytes take this block's partial
  // tile, one float4 per token tile and thread, at the same offset in every block.
  float4* slots = reinterpret_cast<float4*>(smem);
  const int slot = (warp * 32 + lane) * kNT;
  __syncthreads();
  if (warp < S::kCW) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) slots[slot + t] = make_float4(acc[0][t][0], acc[0][t][1], acc[0][t][2], acc[0][t][3]);
  }
  cluster_sync();  // every block's partial written (release / acquire at cluster scope)
  if (warp < S::kCW && warp % a.split == rank) {
    float sum[kNT][4] = {};
    const uint32_t mine = smem_u32(slots + slot);
    for (int r = 0; r < a.split; ++r) {  // block order: the same sum on every run
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        const float4 v = ld_cluster_f4(map_to_cta(mine + 16 * t, r));
        sum[t][0] += v.x;
        sum[t][1] += v.y;
        sum[t][2] += v.z;
        sum[t][3] += v.w;
      }
    }
    write_rows(sum);
  }
  cluster_sync();  // every block's shared memory stays until the others have read it
#endif
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <DType kIn, int kTileN, int kBoxes, int kStages, int kNT>
cudaError_t launch_shape(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  using S = Shape<kIn, kTileN, kBoxes, kStages, kNT>;
  if (encoder() == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType type = kIn == DType::kBFloat16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : kIn == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  // One row of x has no stride to speak of: any valid one does.
  const uint64_t x_row_bytes = uint64_t(p.m == 1 ? p.k : p.x_row_stride) * S::kElemBytes;
  CUtensorMap wmap, xmap;
  // W without L2 promotion: a stage's boxes already read 128 * boxes_k contiguous bytes of each
  // row (H200, 2304 x 16384, M = 1: 20.9 -> 20.4 us without the 256-byte promotion).
  if (!encode_2d(&wmap, type, p.w, p.k, p.n, uint64_t(p.w_row_stride) * S::kElemBytes, S::kBoxK, kTileN,
                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE) ||
      !encode_2d(&xmap, type, p.x, p.k, p.m, x_row_bytes, S::kBoxK, S::kXRows, CU_TENSOR_MAP_SWIZZLE_128B)) {
    return cudaErrorNotSupported;
  }
  auto kernel = skinny_tma_kernel<kIn, kTileN, kBoxes, kStages, kNT>;
  static std::atomic<int> smem_opted_in[64];
  if (const cudaError_t err = opt_in_dynamic_smem(smem_opted_in, kernel, S::kSmemBytes); err != cudaSuccess) return err;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (p.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (a.split > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(a.split);
    attrs[n].val.clusterDim.y = 1;
    attrs[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cdiv(p.n, kTileN) * a.split));
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, wmap, xmap, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // clear it: the caller reports the returned error
  return err;
}

// The launcher of input dtype kIn: the compiled shape of p.config, for one or two token tiles.
template <DType kIn>
cudaError_t launch_dtype(const SkinnyTmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  const SkinnyTmaConfig& c = p.config;
  const bool two = p.m > 8;
#define SKINNY_TMA_CASE(TN, BK, ST)                                                          \
  if (c.tile_n == TN && c.boxes_k == BK && c.stages == ST) {                                 \
    return two ? launch_shape<kIn, TN, BK, ST, 2>(p, a, stream) : launch_shape<kIn, TN, BK, ST, 1>(p, a, stream); \
  }
  SKINNY_TMA_CONFIGS(SKINNY_TMA_CASE)
#undef SKINNY_TMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace
}  // namespace skinny_gemm
}  // namespace fused_llm
