// machete-w4a16's large-M kernel: int4 weights x 16-bit tokens on Hopper's warpgroup MMA (wgmma,
// fp32 accumulation), for prefill-sized M, where the tensor cores, not the weight stream, set the
// pace. Semantics and arguments: w4a16_wgmma.h.
//
// Machete's idea on the package's own layout: the product is computed as out^T = W x^T, so the
// dequantized weight is wgmma's register A operand (it never goes back to shared memory) and the
// tokens are its N side, read by the tensor cores from shared memory (the B descriptor).
//
// Block: two warpgroups (256 threads), each owning 64 of the block's 128 rows of W and all TOK
// tokens of the tile (the wgmma's N: 64, 128 or 256); or, at the 64 x 256 tile, one warpgroup on
// 64 rows (twice the tiles, for shapes whose 128-row tiles leave SMs idle). Each K step of 64
// columns is one pipeline stage in shared memory, filled by the copy engine (TMA boxes on one
// mbarrier per stage, issued by thread 0):
//   x:      TOK rows x 128 bytes, 128-byte swizzled (16-byte chunk c of row r at c ^ (r % 8)), the
//           canonical K-major layout of a wgmma B operand: descriptor stride 1024 bytes per 8
//           rows, a k16 slice 32 bytes further;
//   W:      128 rows x 32 bytes (8 packed words), as they lie in qweight;
//   scales / zeros: the step's group rows (two at G = 32) for the block's rows.
// The A fragment of a 64-row wgmma is, per warp, the m16n8k16 A fragment: lane (g, t) holds rows
// g and g + 8, columns (2t, 2t + 1) and (2t + 8, 2t + 9) of the k16 slice. With the package's
// nibble order (slots hold columns 0, 2, 4, 6, 1, 3, 5, 7) columns 2t, 2t + 1 of word j are slots
// (t, t + 4): the word shifted by 4t, one AND-OR (0x000F000F and the exponent of 128 / 1024)
// makes the two 16-bit values 128 + q (1024 + q) exactly, subtracting 128 + z is exact and the
// multiply by the scale rounds once, dequantize()'s value. So the columns stay in their natural
// order (x needs no permutation): k16 slice kk reads words 2kk and 2kk + 1 of rows g and g + 8,
// 8-byte shared loads that the lane's quad shares (a broadcast).
//
// Pipelining: stages are filled kStages - 2 steps ahead. Each k16 slice is one wgmma and one
// commit group with A registers of its own; after issuing slice kk a warpgroup waits until at
// most three groups are pending (slice kk + 1 of the previous step retired) and dequantizes
// slice kk + 1 into its registers while up to three wgmmas run. At the top of step i a block
// barrier follows all four waits of step i - 1; after the last only slices 1-3 of step i - 1
// can be pending, so every wgmma (and shared load) of step i - 2 has retired and its stage is
// the one refilled.
//
// Split K (grid.y = S > 1, each block an even share of the tile's steps), summed in slice order
// (deterministic) two ways. At the 256-token tile (one block an SM) the S blocks are one
// thread-block cluster (1, S, 1): each stages its fp32 tile in its own shared memory and, after a
// cluster barrier, sums its share of the tile (a band of its tokens) over the S tiles through
// distributed shared memory. At the 128- / 64-token tiles the slices' fp32 tiles go to global memory and the last
// block of the tile to arrive (an acq_rel-fenced counter) sums them; clusters measured slower
// there (the two blocks an SM those tiles run may put a cluster's blocks on one SM).
// Stream-K (split_k 0, its own instantiation): one persistent block per block slot of the SMs,
// each an equal run of all tiles' steps in tile order, done last tile first; a tile's blocks
// other than the one holding its last step store fp32 partials (in the accumulators' own
// thread order, coalesced), which that block adds in block order (deterministic), fetched by the
// copy engine into its free stages. It wins where whole tiles leave SMs idle and a block's run
// is long (70B QKV at M = 256: 80 tiles, 65.5 us against 84.8 unsplit, H200); with short runs
// the partials cost more than the balance gains (8B O at M = 256: 25.5 against 22.9 for the
// 3-block cluster). A first version on the H100 (benchmarks/results/wgmma_split_*), in the days
// of the global-memory split sums, lost to the best split everywhere (8B QKV at M = 256: 43.4
// against 36.5 us). A rotated K order per block was tried and not kept.
//
// What a split costs at the 256-token tile (Nsight Compute, H200 at its base clock, 8B O / QKV at
// M = 256, benchmarks/results/ncu_wgmma_m256_*): unsplit, 32 blocks take ~77K cycles for 64 steps,
// ramp and epilogue included (<= 1200 a step, >= 85% of the tensor cores' rate); split in 3 (96 blocks, 21 steps)
// or 2 (8B QKV, 96 blocks, 32 steps) and stream-K (132 blocks, 15.5 steps) each spend ~10-12K
// cycles a block beyond their steps (~5 us at the boost clock), the fp32 partial tiles (128 KB a
// block) and their sums: so at 15-32 steps a block the sum costs what the balance gains. Not the
// bandwidth: L2 at 18-27% of its peak, DRAM at 7%. Timed against K at M = 256, N = 6144 (H200,
// 2026-11-30, each call after a 1 MiB op): unsplit 4.2 us + 0.594 a step, a 2-block cluster 7.3 us
// + 0.613 a block's step, cuBLAS 2.5 us + 0.285 a 64-column step of the whole GEMM. Sending the
// other blocks' bands from registers into their shared memory (st.async on their barriers)
// instead of the staged tile and distributed loads: 3.7 us slower (8B QKV 31.9 against 28.2 us).
//
// Measured (H100, graph-replayed against cuBLAS bf16, benchmarks/results/tune_*): 0.83-1.32x at
// M = 256, 0.80-0.96x at 1024, 0.90-0.97x at 4096 (the quick benchmark). Filling the stages with
// every thread's cp.async instead had held it at half the tensor cores' rate: the copies, not
// the dequantization, were the limit (docs/machete-w4a16-hopper-kernel.md).
#include "w4a16_wgmma.h"

#include <algorithm>
#include <atomic>

#include "common/launch.h"  // opt_in_dynamic_smem
#include "common/tma.cuh"
#include "w4a16_dequant.cuh"

namespace fused_llm {
namespace machete_w4a16 {
namespace {

using namespace tma;  // the copy engine's device and host helpers (common/tma.cuh)

constexpr int kWarpgroupThreads = 128;
constexpr int kSlices = kWgmmaStepK / 16;  // k16 wgmma slices a step
constexpr int kWarpgroupRows = 64;  // rows of W a warpgroup covers (its m64 wgmmas)
constexpr int kGroupM = 8;     // row tiles of x that walk W's tiles together (L2 reuse of W)

// wgmma m64nNk16, A (4 registers a thread) from registers, B from shared memory through a
// descriptor, D += A B (accumulate != 0) or D = A B; B K-major (no transpose), scales +1.
template <class T, int N>
struct Wgmma;
// One specialization per N and type, from one macro per N (the operand lists differ by N).
#define W4A16_WGMMA_N64(CTYPE, PTXTYPE)                                                          \
  template <>                                                                                     \
  struct Wgmma<CTYPE, 64> {                                                                       \
    __device__ __forceinline__ static void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, \
                                               int accumulate) {                                   \
      asm volatile(                                                                               \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                            \
          "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTXTYPE "." PTXTYPE " {"                    \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"  \
          "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));           \
    }                                                                                             \
  };
W4A16_WGMMA_N64(__nv_bfloat16, "bf16")
W4A16_WGMMA_N64(__half, "f16")
#undef W4A16_WGMMA_N64

#define W4A16_WGMMA_N128(CTYPE, PTXTYPE)                                                          \
  template <>                                                                                     \
  struct Wgmma<CTYPE, 128> {                                                                       \
    __device__ __forceinline__ static void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, \
                                               int accumulate) {                                   \
      asm volatile(                                                                               \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                            \
          "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTXTYPE "." PTXTYPE " {"                    \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"  \
          "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));           \
    }                                                                                             \
  };
W4A16_WGMMA_N128(__nv_bfloat16, "bf16")
W4A16_WGMMA_N128(__half, "f16")
#undef W4A16_WGMMA_N128

#define W4A16_WGMMA_N256(CTYPE, PTXTYPE)                                                          \
  template <>                                                                                     \
  struct Wgmma<CTYPE, 256> {                                                                       \
    __device__ __forceinline__ static void mma(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, \
                                               int accumulate) {                                   \
      asm volatile(                                                                               \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                            \
          "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTXTYPE "." PTXTYPE " {"                    \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"  \
          "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"                          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),  \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])  \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));           \
    }                                                                                             \
  };
W4A16_WGMMA_N256(__nv_bfloat16, "bf16")
W4A16_WGMMA_N256(__half, "f16")
#undef W4A16_WGMMA_N256


__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// A load with acquire semantics at GPU scope: stream-K's wait for the partials a counter counts.
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// v += p, lane by lane: a slice's partial into the running sum of the split-K epilogues.
__device__ __forceinline__ void add_to(float4& v, const float4& p) {
  v.x += p.x;
  v.y += p.y;
  v.z += p.z;
  v.w += p.w;
}

// Keeps registers live (and in place) up to this point: the A operands of an in-flight wgmma,
// and the accumulators around the asynchronous region.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor of a K-major, 128-byte swizzled B tile: start address, leading
// offset (unused by swizzled K-major layouts: 1), stride 1024 bytes between 8-row groups, swizzle
// mode 1 (128 bytes). The tile base is 1024-byte aligned, so a k16 slice 32 bytes in needs no base
// offset: the swizzle XORs address bits 4-6 with bits 7-9.
__device__ __forceinline__ uint64_t b_descriptor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

struct KernelArgs {
  int m, n, k;
  int group_shift;
  bool two_groups;  // G = 32: a step spans two groups
  const void* bias;
  bool bias_fp32;
  void* out;
  int64_t out_row_stride;
  int tiles_m, tiles_n;
  int split_k;       // blocks a tile (gridDim.y): 1 .. kWgmmaMaxSplit, each an even share of the steps;
                     // 0: stream-K over gridDim.x blocks
  float* partials;   // the 64- / 128-token tiles' split: fp32 [split_k][tiles][TOK][kRows];
                     // stream-K: [blocks][TOK * kRows], each a block's partial in its threads' order
  int32_t* counters;  // and the arrival counter of each tile
};

// The staged fp32 tile [TOK][kRows] of a K split, rows XOR-swizzled by token so that a warp's
// stores of one accumulator (8 rows x 4 token pairs) hit 32 banks (unswizzled: 4-way
// conflicts); groups of 4 rows stay contiguous (a float4 of the reduction).
template <int kRowsT>
__device__ __forceinline__ int staged_index(int tok, int row) {
  return tok * kRowsT + (row ^ (8 * ((tok / 2) % 4)));
}

// The copy engine's view of the operands (cuTensorMapEncodeTiled, w4a16_wgmma_launch): x [m, k]
// in boxes of TOK rows x 64 columns, 128-byte swizzled; qweight [n, k / 8] int32 in boxes of
// 128 rows x 8 words; scales / zeros [k / G, n] in boxes of 1 (2 at G = 32) groups x 128 rows.
// Boxes reaching past m or n read zeros.
struct TensorMaps {
  CUtensorMap x, w, s, z;
};

template <class T, int TOK, int WGS, int kStages>
struct Layout {
  static constexpr int kThreads = kWarpgroupThreads * WGS;  // WGS warpgroups, each on 64 rows of W
  static constexpr int kRows = kWarpgroupRows * WGS;        // rows of W a block covers
  static constexpr int kX = TOK * 128;                   // x: TOK rows of 64 columns
  static constexpr int kW = kRows * 32;                  // W: 8 packed words a row
  static constexpr int kS = 2 * kRows * int(sizeof(T));  // scales: up to two group rows
  static constexpr int kZ = 2 * kRows;                   // zeros: up to two group rows
  static constexpr int kBytes = kStages * (kX + kW + kS + kZ) + 1024;  // + alignment slack
  static_assert(kStages * (kX + kW + kS + kZ) >= TOK * kRows * 4, "the epilogue's fp32 tile fits in the stages");
};

template <class T, bool ZEROS, int TOK, int WGS, int kStages, int MIN_BLOCKS, bool STREAM_K>
__global__ void __launch_bounds__(kWarpgroupThreads * WGS, MIN_BLOCKS)
    w4a16_wgmma_kernel(const __grid_constant__ KernelArgs a, const __grid_constant__ TensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a code only; other targets get an empty kernel (never launched)
  using T2 = typename Elem<T>::T2;
  using L = Layout<T, TOK, WGS, kStages>;
  constexpr int kThreads = L::kThreads, kRows = L::kRows;
  extern __shared__ uint8_t smem_raw[];
  __shared__ bool last_block;
  __shared__ uint64_t full[kStages];  // stage arrival barriers
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // the swizzle's period
  uint8_t* xs = smem;
  uint8_t* ws = xs + kStages * L::kX;
  uint8_t* ss = ws + kStages * L::kW;
  uint8_t* zs = ss + kStages * L::kS;

  const int steps = a.k / kWgmmaStepK;
  const int tid = threadIdx.x;
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row = 64 * wg + 16 * warp + g;  // this lane's W rows in the block: row and row + 8

  // The tile a run works on: its first token and W row. Grouped raster: kGroupM row tiles of x
  // sweep W's tiles together (tile ids in launch order: blockIdx.x, or stream-K's tile order).
  int m0 = 0, n0 = 0;
  auto set_tile = [&](int tile) {
    const int group = kGroupM * a.tiles_n;
    const int first_m = (tile / group) * kGroupM;
    const int gm = min(a.tiles_m - first_m, kGroupM);
    m0 = (first_m + (tile % group) % gm) * TOK;
    n0 = ((tile % group) / gm) * kRows;
  };

  // One stage, issued by thread 0: x's box, W's box, the group rows of scales (and zeros).
  const int group_rows = a.two_groups ? 2 : 1;
  const uint32_t stage_bytes =
      L::kX + L::kW + group_rows * kRows * (int(sizeof(T)) + (ZEROS ? 1 : 0));
  auto load_stage = [&](int st, int step) {
    const int grp = (step * kWgmmaStepK) >> a.group_shift;  // group_shift 31: group 0 (k < 2^30)
    mbar_expect_tx(&full[st], stage_bytes);
    tma_load_2d(xs + st * L::kX, &maps.x, &full[st], step * kWgmmaStepK, m0);
    tma_load_2d(ws + st * L::kW, &maps.w, &full[st], step * kWgmmaStepK / 8, n0);
    tma_load_2d(ss + st * L::kS, &maps.s, &full[st], n0, grp);
    if constexpr (ZEROS) tma_load_2d(zs + st * L::kZ, &maps.z, &full[st], n0, grp);
  };
  __shared__ uint64_t part_full[2];  // stream-K: the halves of a partial landing in shared memory
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s]);
    if constexpr (STREAM_K) {
      mbar_init(&part_full[0]);
      mbar_init(&part_full[1]);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  float acc[TOK / 2];
  const T2 zz_sym = zero_pair<T>(8);
  // One A register set per k16 slice of a step: ptxas keeps the wgmmas asynchronous only when
  // each slice has registers of its own (two alternating sets, waiting for all but one group,
  // made it serialize every wgmma: ptxas's C7513).
  uint32_t frag[kSlices][4];
  const uint32_t xs_addr = smem_u32(xs);

  // A run: K steps [s_begin, s_begin + nsteps) of the tile at (m0, n0), summed into acc from
  // zero. The stages and their barriers' phases continue from `it`, the steps this block ran
  // before (stream-K blocks run several). A run's first kStages - 2 stages are requested by
  // `prologue` (thread 0), which the run issues itself unless the caller did (stream-K requests
  // the next run's stages before it stores a partial).
  int it = 0;
  auto prologue = [&](int s_begin, int nsteps) {
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
      if (s < nsteps) load_stage((it + s) % kStages, s_begin + s);
    }
  };
  auto run = [&](int s_begin, int nsteps, bool requested) {
#pragma unroll
    for (int i = 0; i < TOK / 2; ++i) acc[i] = 0.0f;
    if (tid == 0 && !requested) prologue(s_begin, nsteps);
    for (int i = 0; i < nsteps; ++i) {
      const int st = (it + i) % kStages;
      mbar_wait(&full[st], ((it + i) / kStages) % 2);  // step i's boxes have landed
      __syncthreads();  // every wgmma of step i - 2 retired (see the top)
      const uint8_t* wst = ws + st * L::kW;
      const T* sst = reinterpret_cast<const T*>(ss + st * L::kS);
      const uint8_t* zst = zs + st * L::kZ;
      T2 s_lo, s_hi, z_lo, z_hi;  // the slice's group: scale, base + zero for rows g and g + 8
#pragma unroll
      for (int kk = 0; kk < kSlices; ++kk) {
        // A step spans one group, or two at G = 32. No branch here: control flow between a wgmma
        // and its wait makes ptxas serialize the wgmmas (C7513); the second half reloads row 0 or 1.
        if (kk == 0 || kk == kSlices / 2) {
          const int gi = kk == 0 ? 0 : (a.two_groups ? 1 : 0);
          s_lo = splat<T>(sst[gi * kRows + row]);
          s_hi = splat<T>(sst[gi * kRows + row + 8]);
          z_lo = z_hi = zz_sym;
          if constexpr (ZEROS) {
            z_lo = zero_pair<T>(zst[gi * kRows + row]);
            z_hi = zero_pair<T>(zst[gi * kRows + row + 8]);
          }
        }
        const uint2 lo = *reinterpret_cast<const uint2*>(wst + row * 32 + kk * 8);        // row g: words 2kk, 2kk + 1
        const uint2 hi = *reinterpret_cast<const uint2*>(wst + (row + 8) * 32 + kk * 8);  // row g + 8
        frag[kk][0] = dequant_pair<T>(lo.x, t, z_lo, s_lo);  // row g, columns 2t, 2t + 1
        frag[kk][1] = dequant_pair<T>(hi.x, t, z_hi, s_hi);  // row g + 8
        frag[kk][2] = dequant_pair<T>(lo.y, t, z_lo, s_lo);  // row g, columns 2t + 8, 2t + 9
        frag[kk][3] = dequant_pair<T>(hi.y, t, z_hi, s_hi);  // row g + 8
        wgmma_fence();  // the A registers just written, before the wgmma reads them
        Wgmma<T, TOK>::mma(acc, frag[kk], b_descriptor(xs_addr + st * L::kX + kk * 32), 1);
        wgmma_commit();
        if (kk == 0 && tid == 0 && i + kStages - 2 < nsteps) {  // the refill, behind this step's first slice
          fence_proxy_async();
          load_stage((it + i + kStages - 2) % kStages, s_begin + i + kStages - 2);
        }
        wgmma_wait<kSlices - 1>();  // slice kk + 1 of the previous step retired: its registers are free
        fence_regs(frag[(kk + 1) % kSlices]);
      }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    it += nsteps;
  };

  // Accumulator value i: W row `row` + 8 ((i / 2) % 2), token 8 (i / 4) + 2t + i % 2.
  T* out = static_cast<T*>(a.out);
  auto bias_of = [&](int n) {
    if (a.bias == nullptr) return 0.0f;
    return a.bias_fp32 ? static_cast<const float*>(a.bias)[n] : Elem<T>::to_float(static_cast<const T*>(a.bias)[n]);
  };
  // The whole tile's sum (acc) to out, with the bias, rounded once. Through shared memory (the
  // stages are free once every block's wgmma retired and every copy landed), so that each output
  // row leaves in 16-byte stores: [TOK tokens][kRows rows] of T.
  auto store_tile = [&]() {
    __syncthreads();
    T* tile = reinterpret_cast<T*>(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      const float bn = n0 + r < a.n ? bias_of(n0 + r) : 0.0f;
#pragma unroll
      for (int i = 0; i < TOK / 2; ++i) {
        if ((i / 2) % 2 != h) continue;
        const int tok = 8 * (i / 4) + 2 * t + i % 2;
        // Rows XOR-swizzled by (tok / 2) % 4 (8-row groups, a 16-byte chunk, stay whole): a warp's
        // stores of one accumulator then hit distinct banks (unswizzled: 4-way conflicts). Written
        // with t, which it equals: the general form cost ptxas 64 more registers.
        tile[tok * kRows + (r ^ (16 * t))] = Elem<T>::from_float(acc[i] + bn);  // (tok / 2) % 4 == t
      }
    }
    __syncthreads();
    constexpr int kChunks = kRows * int(sizeof(T)) / 16;  // 16-byte chunks of a token's row
    for (int c = tid; c < TOK * kChunks; c += kThreads) {
      const int tok = c / kChunks, n = n0 + (c % kChunks) * 8;
      if (m0 + tok < a.m && n < a.n) {  // n % 16 == 0: a chunk lies wholly inside or past n
        *reinterpret_cast<uint4*>(out + static_cast<int64_t>(m0 + tok) * a.out_row_stride + n) =
            *reinterpret_cast<const uint4*>(tile + tok * kRows + (((c % kChunks) * 8) ^ (16 * ((tok / 2) % 4))));
      }
    }
  };

  if constexpr (STREAM_K) {  // a.split_k == 0: its own instantiation, so the split launches keep their code
    // Stream-K: this block's equal run [begin, end) of all tiles' steps (tile-major), cut at the
    // tile boundaries into runs, done last run first. A tile's steps lie in consecutive blocks;
    // the block holding its last step sums it. So a block's last run, when it ends inside a tile,
    // is a partial: done first, stored early to the block's slot (in the accumulators' own
    // layout: each thread writes and reads back its own float4s, coalesced, no shared memory),
    // counted in the tile's counter. Every other run ends a tile: the block waits there for the
    // tile's earlier blocks' partials (their first work, long done), adds them in block order,
    // and stores the tile. The waits are only on lower blocks, launched no later.
    const int blocks = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
    const int64_t total = int64_t{a.tiles_m} * a.tiles_n * steps;
    const int64_t begin = b * total / blocks, end = (b + 1) * total / blocks;
    constexpr int kSlotQuads = TOK * kRows / 4;  // float4s of a slot: TOK / 8 a thread
    bool requested = false;
    for (int64_t e = end; e > begin;) {
      const int tile = static_cast<int>((e - 1) / steps);
      const int64_t tile_begin = int64_t{tile} * steps;
      const int64_t s0 = max(begin, tile_begin);
      set_tile(tile);
      run(static_cast<int>(s0 - tile_begin), static_cast<int>(e - s0), requested);
      requested = false;
      if (e != tile_begin + steps) {
        // A partial (the block's last run, ending inside the tile). The next run's first stages
        // go out before it is stored: its stages are free (the run's final barrier retired every
        // wgmma up to two steps back, and the stores read only registers).
        if (s0 > begin) {
          const int prev = tile - 1;
          const int64_t prev_begin = max(begin, int64_t{prev} * steps);
          set_tile(prev);
          __syncthreads();  // both warpgroups' last wgmmas retired before their stages refill
          if (tid == 0) prologue(static_cast<int>(prev_begin - int64_t{prev} * steps), static_cast<int>(s0 - prev_begin));
          requested = true;
        }
        float4* slot = reinterpret_cast<float4*>(a.partials) + int64_t{b} * kSlotQuads;
#pragma unroll
        for (int j = 0; j < TOK / 8; ++j) {
          __stcg(slot + j * kThreads + tid, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
        }
        __threadfence();  // this block's partial visible device-wide before its arrival is counted
        __syncthreads();
        if (tid == 0) atomicAdd(a.counters + tile, 1);
      } else {
        if (s0 != tile_begin) {
          // The tile's last step, not its first: blocks first .. b - 1 hold the rest, each a partial.
          const int first = static_cast<int>(((tile_begin + 1) * blocks + total - 1) / total - 1);
          if (tid == 0) {
            while (ld_acquire_gpu(a.counters + tile) < b - first) {
            }
            a.counters[tile] = 0;  // ready for the next call: every arrival is in
          }
          // The partials come in halves through the copy engine into the free stages (two
          // buffers of TOK x 64 floats), a half's copy in flight while the other is added. Loaded
          // straight into registers (8 float4s in flight a thread) they made 8B O at M = 256
          // take 26.7 us; this way 25.5.
          constexpr uint32_t kHalf = TOK * kRows * 2;  // bytes: half a slot
          float* half_buf[2] = {reinterpret_cast<float*>(smem), reinterpret_cast<float*>(smem + kHalf)};
          auto fetch = [&](int r, int h) {
            mbar_expect_tx(&part_full[h], kHalf);
            bulk_load(half_buf[h], reinterpret_cast<const uint8_t*>(a.partials) + (int64_t{r} * 2 + h) * kHalf, kHalf,
                      &part_full[h]);
          };
          __syncthreads();  // every wgmma and shared load of the run done: the stages are free
          if (tid == 0) {
            asm volatile("fence.proxy.async;\n" ::: "memory");  // the acquired partials, to the copy engine
            fetch(first, 0);
            fetch(first, 1);
          }
          for (int r = first; r < b; ++r) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              mbar_wait(&part_full[h], (r - first) % 2);
              const float4* src = reinterpret_cast<const float4*>(half_buf[h]);
#pragma unroll
              for (int j = 0; j < TOK / 16; ++j) {
                const float4 p = src[j * kThreads + tid];
                const int i = 4 * (h * TOK / 16 + j);
                acc[i] += p.x;
                acc[i + 1] += p.y;
                acc[i + 2] += p.z;
                acc[i + 3] += p.w;
              }
              if (r + 1 < b) {
                __syncthreads();  // every thread's reads of this half done before it refills
                if (tid == 0) {
                  fence_proxy_async();
                  fetch(r + 1, h);
                }
              }
            }
          }
        }
        store_tile();
        if (s0 > begin) {
          fence_proxy_async();  // the staged tile's shared memory, read, before the copy engine refills it
          __syncthreads();
        }
      }
      e = s0;
    }
    return;
  }

  set_tile(static_cast<int>(blockIdx.x));
  const int slice = static_cast<int>(blockIdx.y);  // its rank in the cluster
  const int s_begin = slice * steps / a.split_k;
  run(s_begin, (slice + 1) * steps / a.split_k - s_begin, false);  // >= 1 step: steps >= split_k
  if (a.split_k == 1) {
    store_tile();
    return;
  }
  // Split K: this slice's fp32 tile [TOK][kRows] in its own shared memory (the stages are free).
  __syncthreads();
  float* ptile = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < TOK / 2; ++i) {
    // staged_index(tok, r) with (tok / 2) % 4 == t written as t: the general form cost ptxas 64-85
    // more registers.
    ptile[(8 * (i / 4) + 2 * t + i % 2) * kRows + ((row + 8 * ((i / 2) % 2)) ^ (8 * t))] = acc[i];
  }
  constexpr int kQuads = TOK * kRows / 4;  // float4s of a tile
  constexpr int kBatch = 4;                // float4s a thread sums at once, their loads in flight
  // A float4 of the summed tile: rows n .. n + 3 of token m, rounded once, the bias added.
  auto store_quad = [&](int c, const float4& v) {
    const int n = n0 + (c % (kRows / 4)) * 4, m = m0 + c / (kRows / 4);
    if (n >= a.n || m >= a.m) return;
    union {
      T h[4];
      uint2 u;
    } o;
    o.h[0] = Elem<T>::from_float(v.x + bias_of(n));
    o.h[1] = Elem<T>::from_float(v.y + bias_of(n + 1));
    o.h[2] = Elem<T>::from_float(v.z + bias_of(n + 2));
    o.h[3] = Elem<T>::from_float(v.w + bias_of(n + 3));
    // n % 4 == 0, the output 16-byte aligned with a row stride of 8: one 8-byte store.
    *reinterpret_cast<uint2*>(out + static_cast<int64_t>(m) * a.out_row_stride + n) = o.u;
  };
  // Shared-memory offset (floats) of float4 c ([token][4 rows]) of the staged tile.
  auto staged_quad = [](int c) { return staged_index<kRows>(c / (kRows / 4), (c % (kRows / 4)) * 4); };
  if constexpr (TOK == 256) {
    // The tile's blocks are one cluster: each sums its share of the tile's float4s (a band of
    // tokens) over the cluster's staged tiles in slice order through distributed shared memory,
    // its own tile through its own shared memory (a local load; 8B O at M = 256 measured 23.3 us
    // either way).
    cluster_sync();
    const int share = kQuads / a.split_k;  // the last block takes the remainder
    const int c_begin = slice * share, c_end = slice + 1 == a.split_k ? kQuads : c_begin + share;
    const uint32_t ptile_addr = smem_u32(ptile);
    for (int c0 = c_begin + tid; c0 < c_end; c0 += kThreads * kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int r = 0; r < a.split_k; ++r) {
        float4 p[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int c = min(c0 + j * kThreads, c_end - 1);  // past the share: read, never stored
          p[j] = r == slice ? *reinterpret_cast<const float4*>(ptile + staged_quad(c))
                            : ld_cluster_f4(map_to_cta(ptile_addr + 4 * staged_quad(c), r));
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) add_to(v[j], p[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (c0 + j * kThreads < c_end) store_quad(c0 + j * kThreads, v[j]);
      }
    }
    cluster_sync();  // the other blocks' reads of this block's tile done before it exits
  } else {
    // Through global memory (a cluster's blocks may share an SM at these tiles' two blocks an SM,
    // which measured slower: benchmarks/results/wgmma_split_*): this slice's partial to its slot,
    // then the last block of the tile to arrive sums the slots in slice order.
    __syncthreads();
    const int tile = blockIdx.x;
    const int64_t slot = int64_t{kQuads} * 4;
    float4* mine = reinterpret_cast<float4*>(a.partials + (int64_t{slice} * a.tiles_m * a.tiles_n + tile) * slot);
    for (int c = tid; c < kQuads; c += kThreads) {
      __stcg(mine + c, *reinterpret_cast<const float4*>(ptile + staged_quad(c)));
    }
    __threadfence();  // this block's partial visible device-wide before its arrival is counted
    __syncthreads();
    if (tid == 0) last_block = atomicAdd(a.counters + tile, 1) == a.split_k - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();  // the other slices' partials, visible before they are read
    static_assert(kQuads % (kThreads * kBatch) == 0, "whole batches");
    for (int c0 = tid; c0 < kQuads; c0 += kThreads * kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int r = 0; r < a.split_k; ++r) {
        const float4* src =
            reinterpret_cast<const float4*>(a.partials + (int64_t{r} * a.tiles_m * a.tiles_n + tile) * slot);
        float4 p[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) p[j] = __ldcg(src + c0 + j * kThreads);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) add_to(v[j], p[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) store_quad(c0 + j * kThreads, v[j]);
    }
    if (tid == 0) a.counters[tile] = 0;  // ready for the next call
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <class T, bool ZEROS, int TOK, int WGS, int STAGES, int MIN_BLOCKS>
cudaError_t launch_tile(const W4A16WgmmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  using L = Layout<T, TOK, WGS, STAGES>;
  constexpr int kRows = L::kRows;
  if (encoder() == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType t16 =
      p.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const uint32_t group_rows = a.two_groups ? 2 : 1;
  const uint64_t groups = a.group_shift >= 31 ? 1 : (p.k >> a.group_shift);
  // One row of x has no stride to speak of (the binding passes 8 elements): any valid one does.
  const uint64_t x_row_bytes = p.m == 1 ? uint64_t(p.k) * 2 : uint64_t(p.x_row_stride) * 2;
  TensorMaps maps;
  bool ok = encode_2d(&maps.x, t16, p.x, p.k, p.m, x_row_bytes, kWgmmaStepK, TOK, CU_TENSOR_MAP_SWIZZLE_128B) &&
            encode_2d(&maps.w, CU_TENSOR_MAP_DATA_TYPE_INT32, p.qweight, p.k / 8, p.n, uint64_t(p.k) / 2,
                      kWgmmaStepK / 8, kRows, CU_TENSOR_MAP_SWIZZLE_NONE) &&
            encode_2d(&maps.s, t16, p.scales, p.n, groups, uint64_t(p.n) * 2, kRows, group_rows,
                      CU_TENSOR_MAP_SWIZZLE_NONE);
  if (ZEROS) {
    ok = ok && encode_2d(&maps.z, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.zeros, p.n, groups, uint64_t(p.n), kRows,
                         group_rows, CU_TENSOR_MAP_SWIZZLE_NONE);
  } else {
    maps.z = maps.s;  // never read
  }
  if (!ok) return cudaErrorInvalidValue;
  auto kernel = a.split_k == 0 ? w4a16_wgmma_kernel<T, ZEROS, TOK, WGS, STAGES, MIN_BLOCKS, true>
                               : w4a16_wgmma_kernel<T, ZEROS, TOK, WGS, STAGES, MIN_BLOCKS, false>;
  // The shared-memory limit is a per-device attribute of each kernel (split, stream-K): set once
  // per device this process uses.
  static std::atomic<int> opted_in[2][64];
  if (const cudaError_t err = opt_in_dynamic_smem(opted_in[a.split_k == 0 ? 1 : 0], kernel, L::kBytes);
      err != cudaSuccess) {
    return err;
  }
  // The 256-token tile's K split is a cluster of the tile's split_k blocks (1, split_k, 1).
  cudaLaunchConfig_t config = {};
  config.gridDim = a.split_k == 0 ? dim3(static_cast<unsigned>(stream_k_blocks(p)))
                                  : dim3(static_cast<unsigned>(a.tiles_m * a.tiles_n), static_cast<unsigned>(a.split_k));
  config.blockDim = dim3(L::kThreads);
  config.dynamicSmemBytes = L::kBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(a.split_k);
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = TOK == 256 && a.split_k > 1 ? 1 : 0;
  if (const cudaError_t err = cudaLaunchKernelEx(&config, kernel, a, maps); err != cudaSuccess) {
    (void)cudaGetLastError();  // returned, not left for the next launch check to find
    return err;
  }
  return cudaGetLastError();
}

// The block tiles (w4a16_wgmma.h), from a sweep of eleven shapes / stage counts on an H100
// (benchmarks/results/wgmma_sweep_*): 256 tokens take one block an SM (128 accumulators a thread)
// and five stages; 128 and 64 tokens fit two blocks an SM, whose independent pipelines beat
// deeper ones (128 x 128: 4 stages at two blocks an SM against 8 at one, 0.4-12% faster; the
// 256 x 128 tile with two 64-row wgmmas a warpgroup measured 0-8% slower than 128 x 256; on the
// H200, the 128- / 64-token tiles with 10 / 16 stages at one block an SM: faster at 2 of 12
// points, by 2-5%, up to 45% slower at the rest; benchmarks/results/wgmma_m256_session25_*).
// The one-warpgroup 64 x 256 tile runs a step at ~59% of the tensor cores' rate (8B QKV at
// M = 256, 96 blocks unsplit: 32.5 us), against ~87% with two warpgroups, so it wins only where
// halving the tiles' rows saves a deeper K split: 8B O at M = 256 as 128 blocks of 32 steps,
// 21.4 us against 22.7 for the 128-row tile in 3.
template <class T, bool ZEROS>
cudaError_t launch_zeros(const W4A16WgmmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  switch (p.tile) {
    case WgmmaTile::k128x256:
      return launch_tile<T, ZEROS, 256, 2, 6, wgmma_blocks_per_sm(WgmmaTile::k128x256)>(p, a, stream);
    case WgmmaTile::k128x128:
      return launch_tile<T, ZEROS, 128, 2, 5, wgmma_blocks_per_sm(WgmmaTile::k128x128)>(p, a, stream);
    case WgmmaTile::k128x64:
      return launch_tile<T, ZEROS, 64, 2, 8, wgmma_blocks_per_sm(WgmmaTile::k128x64)>(p, a, stream);
    case WgmmaTile::k64x256:  // one warpgroup: 6 x 34.4 KB stages
      return launch_tile<T, ZEROS, 256, 1, 6, wgmma_blocks_per_sm(WgmmaTile::k64x256)>(p, a, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t launch_dtype(const W4A16WgmmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  return p.zeros != nullptr ? launch_zeros<T, true>(p, a, stream) : launch_zeros<T, false>(p, a, stream);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int64_t stream_k_blocks(const W4A16WgmmaParams& p) {
  return std::min<int64_t>(p.stream_blocks, w4a16_wgmma_tiles(p) * (p.k / kWgmmaStepK));
}

int64_t w4a16_wgmma_tiles(const W4A16WgmmaParams& p) {
  const int rows = wgmma_tile_rows(p.tile), tokens = wgmma_tile_tokens(p.tile);
  return ((p.n + rows - 1) / rows) * ((p.m + tokens - 1) / tokens);
}

int64_t w4a16_wgmma_partial_floats(const W4A16WgmmaParams& p) {
  if (p.split_k == 0) return stream_k_blocks(p) * wgmma_tile_rows(p.tile) * wgmma_tile_tokens(p.tile);
  if (p.split_k <= 1 || wgmma_tile_tokens(p.tile) == 256) return 0;  // 256 tokens: a cluster sums it
  return p.split_k * w4a16_wgmma_tiles(p) * wgmma_tile_rows(p.tile) * wgmma_tile_tokens(p.tile);
}

const char* w4a16_wgmma_check(const W4A16WgmmaParams& p) {
  if (p.m < 0 || p.m >= (int64_t{1} << 31) / 128) return "m must be in 0 .. 2^24";
  if (p.n < 16 || p.n % 16 != 0 || p.n >= (int64_t{1} << 30)) return "n must be a positive multiple of 16";
  if (p.k < kWgmmaStepK || p.k % kWgmmaStepK != 0 || p.k >= (int64_t{1} << 30)) return "k must be a positive multiple of 64";
  if (p.group_shift < 5) return "the group size must be >= 32 (or one group per channel)";
  if (p.x == nullptr || p.qweight == nullptr || p.scales == nullptr || p.out == nullptr) return "null tensor";
  if (!aligned16(p.x) || p.x_row_stride % 8 != 0) return "x must be 16-byte aligned with a row stride a multiple of 8";
  if (!aligned16(p.qweight) || !aligned16(p.scales) || (p.zeros != nullptr && !aligned16(p.zeros))) {
    return "qweight, scales and zeros must be 16-byte aligned";
  }
  if (p.out_row_stride < p.n) return "out rows must not overlap";
  if (!aligned16(p.out) || p.out_row_stride % 8 != 0) {
    return "out must be 16-byte aligned with a row stride a multiple of 8";
  }
  if (p.tile != WgmmaTile::k128x256 && p.tile != WgmmaTile::k128x128 && p.tile != WgmmaTile::k128x64 &&
      p.tile != WgmmaTile::k64x256) {
    return "unknown tile";
  }
  if (p.split_k < 0 || p.split_k > std::min<int64_t>(p.k / kWgmmaStepK, kWgmmaMaxSplit)) {
    return "split_k must be 0 (stream-K) or in 1 .. min(k / 64, 8)";
  }
  if (p.split_k == 0 && (p.stream_blocks < 1 || p.stream_blocks >= (int64_t{1} << 20))) {
    return "stream-K (split_k 0) needs stream_blocks in 1 .. 2^20";
  }
  if (w4a16_wgmma_partial_floats(p) > 0 && (p.partials == nullptr || p.counters == nullptr)) {
    return p.split_k == 0 ? "stream-K (split_k 0) needs partials and counters"
                          : "split_k > 1 with the 128- / 64-token tile needs partials and counters";
  }
  return nullptr;
}

cudaError_t w4a16_wgmma_launch(const W4A16WgmmaParams& p, cudaStream_t stream) {
  if (w4a16_wgmma_check(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  KernelArgs a;
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.group_shift = p.group_shift >= 31 ? 31 : p.group_shift;
  a.two_groups = p.group_shift == 5;
  a.bias = p.bias;
  a.bias_fp32 = p.bias_fp32;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  const int rows = wgmma_tile_rows(p.tile), tokens = wgmma_tile_tokens(p.tile);
  a.tiles_n = static_cast<int>((p.n + rows - 1) / rows);
  a.tiles_m = static_cast<int>((p.m + tokens - 1) / tokens);
  a.split_k = p.split_k;
  a.partials = p.partials;
  a.counters = p.counters;
  return p.dtype == DType::kBFloat16 ? launch_dtype<__nv_bfloat16>(p, a, stream) : launch_dtype<__half>(p, a, stream);
}

}  // namespace machete_w4a16
}  // namespace fused_llm
