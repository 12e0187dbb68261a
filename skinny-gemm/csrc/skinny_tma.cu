// skinny-gemm's compiled Hopper kernel: the weight stream of a decode-sized GEMM through the copy
// engine at the memory's speed (skinny_tma.h says what it computes and the plan).
//
// Block: kCW = tile_n / 16 consumer warps and one producer warp. Work: the product's units are
// (row tile of tile_n rows, K stage of stage_k = 64 * boxes_k columns), ordered tile-major
// (the K stages of tile 0, then tile 1, ...); program p of P takes units [p U / P, (p + 1) U / P)
// of the U in all (stream-K), so each SM reads the same bytes to within one stage.
//
// Shared memory: `stages` stages, each boxes_k boxes of W (tile_n rows x 128 bytes, 128-byte
// swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8), so the ldmatrix rows of a fragment
// fall in distinct banks) and boxes_k boxes of x (8 or 16 token rows, the same swizzle; rows past
// m read as zeros). A stage's `full` barrier completes on the boxes' bytes; its `empty` barrier
// on one arrival per consumer warp, after which the producer refills it.
//
// Consumers: warp w owns rows 16 w .. 16 w + 15 of the tile: per k16 step one ldmatrix.x4 of W
// (the A fragment) and one of x (B, one or two n8 token tiles), mma.sync m16n8k16 into fp32.
// At the end of a tile's units in the program's range the warps flush their accumulators: a
// tile wholly inside one program is written out directly; otherwise the program stores its
// partial tile in one of its two slots of `partials` (only the first and the last tile of a
// range can be cut: slot 2 p for its first tile, 2 p + 1 for another) and counts its arrival;
// the last of the tile's programs adds the slots in program order (deterministic) and the bias,
// and writes the tile.
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
  int64_t units;     // tiles * k_stages
  int64_t programs;
  const void* bias;
  bool bias_fp32;
  void* out;
  int64_t out_row_stride;
  float* partials;
  int32_t* counters;
};

// The program whose range holds unit u: the largest p with floor(p U / P) <= u.
__device__ __forceinline__ int64_t program_of(int64_t u, int64_t units, int64_t programs) {
  return ((u + 1) * programs + units - 1) / units - 1;
}
// Program q's partial slot for a tile it cuts: 2 q for the first tile of its range, 2 q + 1 for
// the last (the tiles between lie wholly inside the range and are written directly).
__device__ __forceinline__ int64_t slot_of(int64_t q, int64_t tile, const int64_t k_stages, int64_t units,
                                           int64_t programs) {
  return 2 * q + (tile != q * units / programs / k_stages ? 1 : 0);
}

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

// The consumer warps' barrier (named barrier 1; the producer warp never joins it).
template <int kThreads>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
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
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ int last_arrival;
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t p = blockIdx.x;
  const int64_t u_begin = p * a.units / a.programs, u_end = (p + 1) * a.units / a.programs;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s]);
      mbar_init(&empty[s], S::kCW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == S::kCW) {  // producer
    if (lane == 0) {
      int64_t tile = u_begin / a.k_stages, ks = u_begin % a.k_stages;
      for (int64_t u = u_begin, i = 0; u < u_end; ++u, ++i) {
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
        if (++ks == a.k_stages) {
          ks = 0;
          ++tile;
        }
      }
    }
    return;
  }

  // Consumers.
  float acc[kNT][4];
#pragma unroll
  for (int t = 0; t < kNT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  // ldmatrix row addresses within a box (the swizzle XORs the chunk with the row's low 3 bits,
  // lane % 8 for every row a lane addresses: the tiles start at multiples of 8 rows).
  const int a_row = 16 * warp + (lane % 8) + ((lane / 8) & 1) * 8, a_chunk = lane / 16;
  const int b_row = (lane % 8) + (kNT == 2 ? (lane / 16) * 8 : 0), b_chunk = (lane / 8) & 1;
  const int swz = lane % 8;

  int64_t tile = u_begin / a.k_stages, ks = u_begin % a.k_stages;
  for (int64_t u = u_begin, i = 0; u < u_end; ++u, ++i) {
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
          uint32_t af[4];
          ldsm_x4(wbox + (((2 * kk + a_chunk) ^ swz) << 4), af);
          if constexpr (kNT == 2) {
            uint32_t bf[4];
            ldsm_x4(xbox + (((2 * kk + b_chunk) ^ swz) << 4), bf);
            mma_16816<kBF16>(acc[0], af, bf[0], bf[1]);
            mma_16816<kBF16>(acc[1], af, bf[2], bf[3]);
          } else {
            uint32_t b0, b1;
            ldsm_x2(xbox + (((2 * kk + b_chunk) ^ swz) << 4), b0, b1);
            mma_16816<kBF16>(acc[0], af, b0, b1);
          }
        }
      }
    }
    // This warp's reads of the stage (generic proxy) ordered before the copy engine's next
    // writes into it (async proxy), then the stage goes back.
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);

    if (ks == a.k_stages - 1 || u == u_end - 1) {  // the last of this tile's units in the range
      const int64_t first = program_of(tile * a.k_stages, a.units, a.programs);
      const int64_t last = program_of(tile * a.k_stages + a.k_stages - 1, a.units, a.programs);
      const int64_t row0 = tile * kTileN + 16 * warp + lane / 4;
      const int col0 = 2 * (lane % 4);
      const int slot_offset = (warp * 32 + lane) * 4 * kNT;
      bool write = true;
      if (first != last) {
        float* mine = a.partials + slot_of(p, tile, a.k_stages, a.units, a.programs) * S::kPartialFloats + slot_offset;
#pragma unroll
        for (int t = 0; t < kNT; ++t) reinterpret_cast<float4*>(mine)[t] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        __threadfence();  // this partial visible device-wide before the arrival is counted
        consumers_sync<S::kCW * 32>();
        if (threadIdx.x == 0) {
          const int arrived = atomicAdd(a.counters + tile, 1);
          last_arrival = arrived == int(last - first);
          if (last_arrival) a.counters[tile] = 0;  // every other program of the tile has arrived
        }
        consumers_sync<S::kCW * 32>();
        write = last_arrival;
        if (write) {
          __threadfence();  // the other programs' partials, visible before they are read
#pragma unroll
          for (int t = 0; t < kNT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
          for (int64_t q = first; q <= last; ++q) {  // program order: the same sum on every run
            const float* part =
                a.partials + slot_of(q, tile, a.k_stages, a.units, a.programs) * S::kPartialFloats + slot_offset;
#pragma unroll
            for (int t = 0; t < kNT; ++t) {
              const float4 v = __ldcg(reinterpret_cast<const float4*>(part) + t);
              acc[t][0] += v.x;
              acc[t][1] += v.y;
              acc[t][2] += v.z;
              acc[t][3] += v.w;
            }
          }
        }
      }
      if (write) {
        uint16_t* out = static_cast<uint16_t*>(a.out);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows row0 and row0 + 8
          const int64_t row = row0 + 8 * h;
          if (row < a.n) {
            float bias = 0.0f;
            if (a.bias != nullptr) {
              bias = a.bias_fp32 ? static_cast<const float*>(a.bias)[row] : load_16<kBF16>(a.bias, row);
            }
#pragma unroll
            for (int t = 0; t < kNT; ++t) {
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const int64_t token = 8 * t + col0 + j;
                if (token < a.m) out[token * a.out_row_stride + row] = round_16<kBF16>(acc[t][2 * h + j] + bias);
              }
            }
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kNT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    }
    if (++ks == a.k_stages) {
      ks = 0;
      ++tile;
    }
  }
#endif
}

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
  if (!encode_2d(&wmap, t16, p.w, p.k, p.n, uint64_t(p.w_row_stride) * 2, kBoxK, kTileN,
                 CU_TENSOR_MAP_SWIZZLE_128B) ||
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
  kernel<<<dim3(static_cast<unsigned>(a.programs)), dim3(S::kThreads), S::kSmemBytes, stream>>>(wmap, xmap, a);
  return cudaGetLastError();
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

// Blocks of a launch shape one SM holds: two where two blocks of its 16-token instantiation fit
// the SM's shared memory (228 KiB on the H100 and H200, 1 KiB of it reserved per block, and
// the barriers' static bytes), else one: a second block that cannot be resident would run as a
// second wave and undo the equal split.
template <int kTileN, int kBoxes, int kStages>
constexpr int max_blocks_per_sm() {
  constexpr int per_block = Shape<true, kTileN, kBoxes, kStages, 2>::kSmemBytes + 1024 + 256;
  return 2 * per_block <= 228 * 1024 ? 2 : 1;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool skinny_tma_config_supported(const SkinnyTmaConfig& c) {
  const SkinnyTmaConfig* configs = nullptr;
  const int n = skinny_tma_compiled_configs(&configs);
  for (int i = 0; i < n; ++i) {
    if (c.tile_n == configs[i].tile_n && c.boxes_k == configs[i].boxes_k && c.stages == configs[i].stages) {
      return c.blocks_per_sm >= 1 && c.blocks_per_sm <= configs[i].blocks_per_sm;
    }
  }
  return false;
}

int skinny_tma_compiled_configs(const SkinnyTmaConfig** configs) {
#define SKINNY_TMA_ENTRY(TN, BK, ST) SkinnyTmaConfig{TN, BK, ST, max_blocks_per_sm<TN, BK, ST>()},
  static const SkinnyTmaConfig kCompiled[] = {SKINNY_TMA_CONFIGS(SKINNY_TMA_ENTRY)};
#undef SKINNY_TMA_ENTRY
  *configs = kCompiled;
  return int(sizeof(kCompiled) / sizeof(kCompiled[0]));
}

int64_t skinny_tma_programs(const SkinnyTmaParams& p, int sms) {
  const SkinnyTmaConfig& c = p.config;
  const int64_t units = cdiv(p.n, c.tile_n) * cdiv(p.k, int64_t(kBoxK) * c.boxes_k);
  const int64_t want = int64_t(sms) * c.blocks_per_sm;
  return units < want ? units : want;
}

int64_t skinny_tma_partial_floats(const SkinnyTmaParams& p, int sms) {
  return 2 * skinny_tma_programs(p, sms) * p.config.tile_n * kMaxM;
}

cudaError_t skinny_tma_launch(const SkinnyTmaParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.m < 0 || p.m > kMaxM || p.n < 0 || p.k < 8 || p.k % 8 != 0 || !skinny_tma_config_supported(p.config) ||
      !aligned(p.x, 16) || !aligned(p.w, 16) || p.w_row_stride % 8 != 0 || (p.m > 1 && p.x_row_stride % 8 != 0)) {
    return cudaErrorNotSupported;
  }
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (!capability_90(device)) return cudaErrorNotSupported;
  int sms = 0;
  if (const cudaError_t err = sm_count(&sms); err != cudaSuccess) return err;
  KernelArgs a;
  a.m = p.m;
  a.n = p.n;
  a.k = p.k;
  a.k_stages = cdiv(p.k, int64_t(kBoxK) * p.config.boxes_k);
  a.units = cdiv(p.n, p.config.tile_n) * a.k_stages;
  a.programs = skinny_tma_programs(p, sms);
  a.bias = p.bias;
  a.bias_fp32 = p.bias_fp32;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  a.partials = p.partials;
  a.counters = p.counters;
  return p.dtype == DType::kBFloat16 ? launch_dtype<true>(p, a, device, stream)
                                     : launch_dtype<false>(p, a, device, stream);
}

}  // namespace skinny_gemm
}  // namespace fused_llm
