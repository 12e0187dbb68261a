// skinny-gemm's compiled Hopper kernel: the weight stream of a decode-sized GEMM through the copy
// engine at the memory's speed (skinny_tma.h says what it computes and the plan).
//
// Grid: tiles x split blocks in clusters of `split`: block b is K slice r = b % split of row tile
// b / split (a cluster's blocks are consecutive, rank r). Block: kCW = tile_n / 16 consumer
// warps and one producer warp. Slice r holds K stages [r S / split, (r + 1) S / split) of the
// S = ceil(K / stage_k) of a tile (stage_k = 64 * boxes_k columns); a slice may be empty.
//
// Shared memory: `stages` stages, each boxes_k boxes of W (tile_n rows x 128 bytes, 128-byte
// swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8), so the ldmatrix rows of a fragment
// fall in distinct banks) and boxes_k boxes of x (8 or 16 token rows, the same swizzle; rows past
// m read as zeros). A stage's `full` barrier completes on the boxes' bytes; its `empty` barrier
// on one arrival per consumer warp, after which the producer refills it.
//
// Consumers: warp w owns rows 16 w .. 16 w + 15 of the tile: per k16 step one ldmatrix.x4 of W
// (the A fragment) and one of x (B, one or two n8 token tiles), mma.sync m16n8k16 into fp32.
// After the slice, a split of 1 writes the tile. Otherwise each thread leaves its fp32 values
// in the ring's first bytes (its slot: the same offset in every block of the cluster), the
// cluster waits on its barrier, and block w % split adds warp w's slots of blocks 0 .. split - 1
// in that order through distributed shared memory (deterministic), adds the bias and writes the
// rows; a second cluster barrier keeps every block's shared memory until it has been read.
#include "skinny_tma.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/launch.h"
#include "common/tma.cuh"

namespace fused_llm {
namespace skinny_gemm {
namespace {

using namespace fused_llm::tma;

constexpr int kMaxDevices = 64;
constexpr int kSwizzleRowBytes = 128;  // one box row: kBoxK 16-bit columns

struct KernelArgs {
  int64_t m, n, k;
  int64_t k_stages;  // K stages a tile has
  int split;         // K slices of a tile: the cluster's blocks
  const void* bias;
  bool bias_fp32;
  void* out;
  int64_t out_row_stride;
};

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

template <bool kBF16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kBF16>
__device__ __forceinline__ float load_16(const void* p, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  if constexpr (kBF16) return __uint_as_float(uint32_t(bits) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(bits));
  return f;
}
template <bool kBF16>
__device__ __forceinline__ uint16_t round_16(float v) {
  uint16_t bits;
  if constexpr (kBF16) {
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
  }
  return bits;
}

template <bool kBF16, int kTileN, int kBoxes, int kStages, int kNT>
struct Shape {
  static constexpr int kCW = kTileN / 16;            // consumer warps
  static constexpr int kThreads = 32 * (kCW + 1);    // + the producer warp
  static constexpr int kXRows = 8 * kNT;             // token rows of x's box
  static constexpr int kWBox = kTileN * kSwizzleRowBytes;
  static constexpr int kXBox = kXRows * kSwizzleRowBytes;
  static constexpr int kStageBytes = kBoxes * (kWBox + kXBox);
  static constexpr int kStageK = kBoxK * kBoxes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack (1024 for the swizzle)
  static constexpr int kPartialFloats = kTileN * 8 * kNT;          // one block's fp32 tile
};

template <bool kBF16, int kTileN, int kBoxes, int kStages, int kNT>
__global__ void __launch_bounds__(Shape<kBF16, kTileN, kBoxes, kStages, kNT>::kThreads, 1)
    skinny_tma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                      const KernelArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = Shape<kBF16, kTileN, kBoxes, kStages, kNT>;
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

  // Two accumulator chains (the k16 steps alternate between them): one chain of dependent
  // mma.sync per stage left the consumers behind the copies (H200, 2304 x 16384, M = 1, a
  // scratch kernel: 20.4 -> 20.2 us).
  float acc[2][kNT][4];
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[c][t][0] = acc[c][t][1] = acc[c][t][2] = acc[c][t][3] = 0.0f;

  if (warp == S::kCW) {  // producer
    if (lane == 0) {
      for (int64_t ks = ks_begin, i = 0; ks < ks_end; ++ks, ++i) {
        const int s = int(i % kStages);
        if (i >= kStages) mbar_wait(&empty[s], int((i / kStages - 1) & 1));
        const int64_t k0 = ks * S::kStageK;
        // Boxes starting past K are not issued (the consumers skip them too); a box reaching past
        // K, m or n reads zeros there and still counts its whole size.
        const int64_t left = (a.k - k0 + kBoxK - 1) / kBoxK;
        const int boxes = left < kBoxes ? int(left) : kBoxes;
        mbar_expect_tx(&full[s], uint32_t(boxes * (S::kWBox + S::kXBox)));
        uint8_t* st = smem + s * S::kStageBytes;
        for (int b = 0; b < boxes; ++b) {
          tma_load_2d(st + b * S::kWBox, &wmap, &full[s], int(k0 + b * kBoxK), int(tile * kTileN));
          tma_load_2d(st + kBoxes * S::kWBox + b * S::kXBox, &xmap, &full[s], int(k0 + b * kBoxK), 0);
        }
      }
    }
    __syncwarp();
  } else {  // consumers
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
        if (b == 0 || k0 + b * kBoxK < a.k) {
          const uint32_t wbox = st + b * S::kWBox + a_row * kSwizzleRowBytes;
          const uint32_t xbox = st + kBoxes * S::kWBox + b * S::kXBox + b_row * kSwizzleRowBytes;
#pragma unroll
          for (int kk = 0; kk < kBoxK / 16; ++kk) {
            float(&c)[kNT][4] = acc[kk & 1];
            uint32_t af[4];
            ldsm_x4(wbox + (((2 * kk + a_chunk) ^ swz) << 4), af);
            if constexpr (kNT == 2) {
              uint32_t bf[4];
              ldsm_x4(xbox + (((2 * kk + b_chunk) ^ swz) << 4), bf);
              mma_16816<kBF16>(c[0], af, bf[0], bf[1]);
              mma_16816<kBF16>(c[1], af, bf[2], bf[3]);
            } else {
              uint32_t b0, b1;
              ldsm_x2(xbox + (((2 * kk + b_chunk) ^ swz) << 4), b0, b1);
              mma_16816<kBF16>(c[0], af, b0, b1);
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

  // Rows row0 and row0 + 8 of the tile (this thread's four values per token tile), plus the
  // bias, rounded and stored.
  const auto write_rows = [&](const float (&v)[kNT][4]) {
    uint16_t* out = static_cast<uint16_t*>(a.out);
    const int64_t row0 = tile * kTileN + 16 * warp + lane / 4;
    const int col0 = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      if (row < a.n) {
        float bias = 0.0f;
        if (a.bias != nullptr) bias = a.bias_fp32 ? static_cast<const float*>(a.bias)[row] : load_16<kBF16>(a.bias, row);
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int64_t token = 8 * t + col0 + j;
            if (token < a.m) out[token * a.out_row_stride + row] = round_16<kBF16>(v[t][2 * h + j] + bias);
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

// Whether `device` is capability 9.0 (the kernel's only code is sm_90), queried once per device.
bool capability_90(int device) {
  static std::atomic<int8_t> known[kMaxDevices];  // 0 unknown, 1 no, 2 yes
  if (device < kMaxDevices && known[device].load(std::memory_order_relaxed) != 0) {
    return known[device].load(std::memory_order_relaxed) == 2;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool yes = major == 9 && minor == 0;
  if (device < kMaxDevices) known[device].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

template <bool kBF16, int kTileN, int kBoxes, int kStages, int kNT>
cudaError_t launch_shape(const SkinnyTmaParams& p, KernelArgs a, int device, cudaStream_t stream) {
  using S = Shape<kBF16, kTileN, kBoxes, kStages, kNT>;
  if (encoder() == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType t16 = kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // One row of x has no stride to speak of: any valid one does.
  const uint64_t x_row_bytes = uint64_t(p.m == 1 ? p.k : p.x_row_stride) * 2;
  CUtensorMap wmap, xmap;
  // W without L2 promotion: a stage's boxes already read 128 * boxes_k contiguous bytes of each
  // row (H200, 2304 x 16384, M = 1: 20.9 -> 20.4 us without the 256-byte promotion).
  if (!encode_2d(&wmap, t16, p.w, p.k, p.n, uint64_t(p.w_row_stride) * 2, kBoxK, kTileN,
                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE) ||
      !encode_2d(&xmap, t16, p.x, p.k, p.m, x_row_bytes, kBoxK, S::kXRows, CU_TENSOR_MAP_SWIZZLE_128B)) {
    return cudaErrorNotSupported;
  }
  auto kernel = skinny_tma_kernel<kBF16, kTileN, kBoxes, kStages, kNT>;
  // The shared-memory limit is a per-device attribute: set once per device this process uses.
  static std::atomic<bool> limit_set[kMaxDevices];
  if (device >= kMaxDevices || !limit_set[device].load(std::memory_order_relaxed)) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return err;
    }
    if (device < kMaxDevices) limit_set[device].store(true, std::memory_order_relaxed);
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(a.split);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cdiv(p.n, kTileN) * a.split));
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = a.split > 1 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, wmap, xmap, a);
  if (err != cudaSuccess) (void)cudaGetLastError();  // clear it: the caller reports the returned error
  return err;
}

// The compiled configurations: (tile_n, boxes_k, stages), each for one and two n8 token tiles.
#define SKINNY_TMA_CONFIGS(X) \
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

template <bool kBF16>
cudaError_t launch_dtype(const SkinnyTmaParams& p, const KernelArgs& a, int device, cudaStream_t stream) {
  const SkinnyTmaConfig& c = p.config;
  const bool two = p.m > 8;
#define SKINNY_TMA_CASE(TN, BK, ST)                                                                      \
  if (c.tile_n == TN && c.boxes_k == BK && c.stages == ST) {                                             \
    return two ? launch_shape<kBF16, TN, BK, ST, 2>(p, a, device, stream)                                \
               : launch_shape<kBF16, TN, BK, ST, 1>(p, a, device, stream);                               \
  }
  SKINNY_TMA_CONFIGS(SKINNY_TMA_CASE)
#undef SKINNY_TMA_CASE
  return cudaErrorNotSupported;
}

}  // namespace

bool skinny_tma_config_supported(const SkinnyTmaConfig& c) {
  const SkinnyTmaConfig* configs = nullptr;
  const int n = skinny_tma_compiled_configs(&configs);
  for (int i = 0; i < n; ++i) {
    if (c.tile_n == configs[i].tile_n && c.boxes_k == configs[i].boxes_k && c.stages == configs[i].stages) {
      return c.split >= 1 && c.split <= kMaxSplit;
    }
  }
  return false;
}

int skinny_tma_compiled_configs(const SkinnyTmaConfig** configs) {
#define SKINNY_TMA_ENTRY(TN, BK, ST) SkinnyTmaConfig{TN, BK, ST, kMaxSplit},
  static const SkinnyTmaConfig kCompiled[] = {SKINNY_TMA_CONFIGS(SKINNY_TMA_ENTRY)};
#undef SKINNY_TMA_ENTRY
  *configs = kCompiled;
  return int(sizeof(kCompiled) / sizeof(kCompiled[0]));
}

cudaError_t skinny_tma_launch(const SkinnyTmaParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.m < 0 || p.m > kMaxM || p.n < 0 || p.k < 8 || p.k % 8 != 0 || !skinny_tma_config_supported(p.config) ||
      !aligned(p.x, 16) || !aligned(p.w, 16) || p.w_row_stride % 8 != 0 || (p.m > 1 && p.x_row_stride % 8 != 0) ||
      cdiv(p.n, p.config.tile_n) * p.config.split > int64_t(INT32_MAX)) {
    return cudaErrorNotSupported;
  }
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (!capability_90(device)) return cudaErrorNotSupported;
  KernelArgs a;
  a.m = p.m;
  a.n = p.n;
  a.k = p.k;
  a.k_stages = cdiv(p.k, int64_t(kBoxK) * p.config.boxes_k);
  a.split = p.config.split;
  a.bias = p.bias;
  a.bias_fp32 = p.bias_fp32;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  return p.dtype == DType::kBFloat16 ? launch_dtype<true>(p, a, device, stream)
                                     : launch_dtype<false>(p, a, device, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
