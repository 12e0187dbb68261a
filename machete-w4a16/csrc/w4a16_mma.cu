// machete-w4a16's small-M kernel: int4 weights x 16-bit tokens on the tensor cores (mma.sync
// m16n8k16, fp32 accumulation), for decode-sized M (1 .. 32), where streaming the weight is the
// whole cost. Semantics and arguments: w4a16_mma.h.
//
// Swap AB: the product is computed as out^T = W x^T, so 16 rows of W fill the mma's 16-row A
// side and the few tokens its 8-column B side (M = 1 wastes 7/8 of B, not 15/16 of A).
//
// The layout does the fragment work (no shuffles; no shared memory on the weight path, except in
// the Hopper variant at the end of this file, which stages the same bytes by TMA). A warp
// owns W rows r0 .. r0 + 15; lane (g = lane / 4, t = lane % 4) reads rows r0 + g and r0 + g + 8.
// In each 128-column window a lane takes columns 32t .. 32t + 31 of its two rows: one 16-byte
// load per row (4 packed words). Over the window's eight k16 steps s, the mma's k positions
// (2t, 2t + 1) are mapped to columns 32t + 4s + {0, 1} and (2t + 8, 2t + 9) to 32t + 4s + {2, 3}:
// the same columns for A (W) and B (x), so the sum over k is the true product. Then word u of a
// lane's 16 bytes holds the columns of steps 2u and 2u + 1, and the A register of columns
// 8u + 2i, 8u + 2i + 1 is nibble slots (i, i + 4) of that word: with AWQ's slot order one shift
// and one AND-OR (0x000F000F, then the exponent of 128 (bf16) / 1024 (fp16)) make the two 16-bit
// values 128 + q (1024 + q) exactly. Subtracting 128 + z is exact and the multiply by the scale
// rounds once: dequantize()'s value. The B registers are x[token, 32t + 4s .. 32t + 4s + 3]:
// four 16-byte loads per token per window, L1-resident (every warp of the slice reads them).
//
// Parallelism: block = `warps` warps on one 16-row tile, warp w taking windows w, w + warps, ...
// of the block's K slice (gridDim.y slices); the warps' accumulators are summed in shared
// memory in warp order, the K slices through fp32 partials summed in slice order by the last
// block to arrive (an acq_rel-fenced counter): deterministic, one launch. On sm90 code
// w4a16_ring_kernel runs the same split and sums with the weights in per-warp TMA rings (its K
// split of 2 summed in a thread-block cluster instead, in the same order).
#include "w4a16_mma.h"

#include "common/launch.h"  // opt_in_dynamic_smem
#include "common/pdl.cuh"
#include "w4a16_dequant.cuh"
#include "common/tma.cuh"

#include <atomic>

namespace fused_llm {
namespace machete_w4a16 {
namespace {

// mma.sync m16n8k16, fp32 accumulators: c += A B (A four registers, B two, per lane).
template <class T>
struct MmaSync;
template <>
struct MmaSync<__nv_bfloat16> {
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaSync<__half> {
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The weight stream is read once: keep it out of L1 so x (re-read by every warp) stays there.
// L2::256B: a miss fetches the 256 bytes around it, the windows the block's next warps read from
// the same rows: 1-5% faster on the eight 8B / 70B projections at M = 1 and 16 (8B down, M = 1:
// 18.5 us against 19.4; H100, graph-replayed, L2-rotated; benchmarks/results/mma_variants_*).
// Tried and not kept: 4 windows in flight (slower at M = 1 on 5 of 6 shapes) and prefetching
// x's window into L1 with the weights (5-15% slower at M = 16, no change in L1 hit rate).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

struct KernelArgs {
  int m, n, k;
  const void* x;
  int64_t x_row_stride;
  const uint32_t* qweight;
  const void* scales;
  const uint8_t* zeros;
  int group_shift;
  const void* bias;
  bool bias_fp32;
  void* out;
  int64_t out_row_stride;
  const void* residual;  // W4A16MmaParams::residual
  int64_t residual_row_stride;
  int split_k;
  float* partials;
  int32_t* counters;
  bool early_weights;  // W4A16MmaParams::early_weights
  bool cluster;        // the ring's K split of kClusterSplit: its slices are one cluster (store_tile)
};

// The K split whose slices the ring kernel sums in a thread-block cluster. H100, M = 8 / 16, the
// eight projections, every launch of split 2-4 x warps x row tiles, both reductions in the same
// rounds (benchmarks/results/mma_ring_cluster_split_*): at split 2 the cluster was faster at most
// launches (M = 16 4 warps, 2 row tiles: 8B O 12.8 -> 9.6 us, 8B down 26.0 -> 21.3, 70B QKV 27.2
// -> 25.8, 70B gate/up 130.5 -> 122.8, down 67.1 -> 60.4), at 3 and 4 mostly slower (8B QKV 8
// warps, 1 row tile, split 4: 20.5 -> 25.0): a cluster of 3-4 blocks must fit one GPC at once.
constexpr int kClusterSplit = 2;

// One window's products for a warp: RT row tiles x NT token tiles over the window's eight k16
// steps, A from the lane's packed words (dequantized in registers), B from x's fragments. Both
// kernels of this file call it, so they sum in the same order (the same bits).
template <class T, int NT, int RT>
__device__ __forceinline__ void mma_window(float (&acc)[RT][NT][4], const uint32_t (&wq)[RT][2][4],
                                           const typename Elem<T>::T2 (&zz)[RT][2],
                                           const typename Elem<T>::T2 (&s2)[RT][2], const uint4 (&xv)[NT][4]) {
#pragma unroll
  for (int word = 0; word < 4; ++word) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k16 step 2 word + half
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const uint32_t frag[4] = {
            dequant_pair<T>(wq[r][0][word], 2 * half, zz[r][0], s2[r][0]),      // row g, k 2t, 2t + 1
            dequant_pair<T>(wq[r][1][word], 2 * half, zz[r][1], s2[r][1]),      // row g + 8
            dequant_pair<T>(wq[r][0][word], 2 * half + 1, zz[r][0], s2[r][0]),  // row g, k 2t + 8, 2t + 9
            dequant_pair<T>(wq[r][1][word], 2 * half + 1, zz[r][1], s2[r][1]),  // row g + 8
        };
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4& v = xv[nt][word];  // columns 32t + 8 word .. + 7: steps 2 word, 2 word + 1
          MmaSync<T>::mma(acc[r][nt], frag, half ? v.z : v.x, half ? v.w : v.y);
        }
      }
    }
  }
}

// x's B fragments of a lane (g = lane / 4, t = lane % 4): token g of each n8 tile, columns
// 32t .. 32t + 31 of a window as four 16-byte loads (L1-resident: every warp of the SM reads
// them); tokens past m read nothing and hold zeros. Both kernels of this file read x this way
// (the ring above m = 1).
template <class T, int NT>
struct XFragments {
  const uint4* row[NT];
  bool has_token[NT];
  __device__ __forceinline__ XFragments(const KernelArgs& a, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int token = nt * kTokensPerMma + g;
      has_token[nt] = token < a.m;
      row[nt] = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) +
                                               static_cast<int64_t>(has_token[nt] ? token : 0) * a.x_row_stride) +
                4 * t;
    }
  }
  __device__ __forceinline__ void load(uint4 (&dst)[NT][4], int w) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[nt][j] = has_token[nt] ? __ldg(row[nt] + 16 * w + j) : make_uint4(0, 0, 0, 0);
    }
  }
};

// The block's K slice, windows [begin, end): blockIdx.y's share of whole windows
// (w4a16_mma_launch rounds split_k so that none is empty).
struct KSlice {
  int begin, end;
};
__device__ __forceinline__ KSlice block_slice(const KernelArgs& a) {
  const int windows = a.k / kWindow;
  const int per_split = (windows + a.split_k - 1) / a.split_k;
  const int begin = static_cast<int>(blockIdx.y) * per_split;
  return {begin, min(begin + per_split, windows)};
}

// The block's output tile from its warps' accumulators: summed in warp order in shared memory,
// the K slices (split_k > 1) through fp32 partials summed in slice order by the last block to
// arrive (an acq_rel-fenced counter); the bias, one rounding, the store. Both kernels end here.
template <class T, int NT, int RT, int WARPS>
__device__ __forceinline__ void store_tile(const float (&acc)[RT][NT][4], const KernelArgs& a) {
  constexpr int kRows = kTileRows * RT;             // rows of a block (and of each warp)
  constexpr int kOut = kRows * kTokensPerMma * NT;  // outputs of a block's tile
  __shared__ float red[WARPS][kOut];
  __shared__ bool last_block;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;

  // The warps' tiles, summed in warp order. Accumulator (c0, c1): row g, tokens 2t, 2t + 1;
  // (c2, c3): row g + 8. Shared layout [token][row].
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = nt * kTokensPerMma + 2 * t, row = kTileRows * r + g;
      red[warp][tok * kRows + row] = acc[r][nt][0];
      red[warp][(tok + 1) * kRows + row] = acc[r][nt][1];
      red[warp][tok * kRows + row + 8] = acc[r][nt][2];
      red[warp][(tok + 1) * kRows + row + 8] = acc[r][nt][3];
    }
  }
  __syncthreads();

  T* out = static_cast<T*>(a.out);
  auto finish = [&](int idx, float v) {
    const int tok = idx / kRows, row = row0 + idx % kRows;
    if (a.bias != nullptr) {
      v += a.bias_fp32 ? static_cast<const float*>(a.bias)[row] : Elem<T>::to_float(static_cast<const T*>(a.bias)[row]);
    }
    if (a.residual != nullptr) {  // torch's residual + out: out rounded, the sum in fp32, rounded
      const T r = static_cast<const T*>(a.residual)[static_cast<int64_t>(tok) * a.residual_row_stride + row];
      v = Elem<T>::to_float(Elem<T>::from_float(v)) + Elem<T>::to_float(r);
    }
    out[static_cast<int64_t>(tok) * a.out_row_stride + row] = Elem<T>::from_float(v);
  };
  const int valid = min(a.m, kTokensPerMma * NT) * kRows;  // [token][row] indices < valid
  if (a.split_k == 1) {
    for (int idx = threadIdx.x; idx < valid; idx += WARPS * 32) {
      if (row0 + idx % kRows >= a.n) continue;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) v += red[w][idx];
      finish(idx, v);
    }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.cluster) {
    // The K slices of this row block are one thread-block cluster (1, split_k, 1), rank = slice:
    // each slice's tile (its warps summed, in place in red[0]) is read by rank 0 through
    // distributed shared memory and summed in slice order: the global path's bits, without its
    // fence / counter / partials round trips through L2.
    for (int idx = threadIdx.x; idx < valid; idx += WARPS * 32) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) v += red[w][idx];
      red[0][idx] = v;
    }
    tma::cluster_sync();
    if (blockIdx.y == 0) {
      const uint32_t base = tma::smem_u32(&red[0][0]);
      for (int idx = threadIdx.x; idx < valid; idx += WARPS * 32) {
        if (row0 + idx % kRows >= a.n) continue;
        float v = 0.0f + red[0][idx];
        for (int s = 1; s < a.split_k; ++s) v += tma::ld_cluster_f32(tma::map_to_cta(base + 4 * idx, s));
        finish(idx, v);
      }
    }
    tma::cluster_sync();  // the other slices' tiles stay until rank 0 has read them
    return;
  }
#endif
  // Split K: this slice's partial [token][row0 + row] -> partials[slice, token, row].
  for (int idx = threadIdx.x; idx < valid; idx += WARPS * 32) {
    const int tok = idx / kRows, row = row0 + idx % kRows;
    if (row >= a.n) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) v += red[w][idx];
    a.partials[(static_cast<int64_t>(blockIdx.y) * a.m + tok) * a.n + row] = v;
  }
  __threadfence();  // this block's partials visible device-wide before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(a.counters + blockIdx.x, 1);
    last_block = arrived == a.split_k - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();  // the other slices' partials, visible before they are read
  for (int idx = threadIdx.x; idx < valid; idx += WARPS * 32) {
    const int tok = idx / kRows, row = row0 + idx % kRows;
    if (row >= a.n) continue;
    float v = 0.0f;
    for (int s = 0; s < a.split_k; ++s) v += __ldcg(a.partials + (static_cast<int64_t>(s) * a.m + tok) * a.n + row);
    finish(idx, v);
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;  // ready for the next call
}

// Windows whose weights a warp keeps in flight (a sweep of 2 and 4 over the eight 8B / 70B
// projections at M = 1 and 16 on an H100 never picked 4: the registers cost more warps).
constexpr int kInFlight = 2;

// NT: n8 token tiles (m <= 8 NT); RT: 16-row tiles per warp (each B fragment, read from L1,
// feeds RT mmas: at M = 16 with RT = 1 the x reads held L1 at 88% of its throughput, 70B
// gate/up, H100 Nsight Compute); WARPS: warps per block; X_AHEAD (NT = RT = 1 only): x's window
// is fetched into registers with the window's weights instead of when it is consumed, at the
// cost of 128 registers a thread (78 without), so 16 warps an SM (launch_shape says when).
template <class T, int NT, int RT, bool ZEROS, int WARPS, bool X_AHEAD>
__global__ void __launch_bounds__(WARPS * 32, X_AHEAD ? 16 / WARPS : 1) w4a16_mma_kernel(const KernelArgs a) {
  static_assert(!X_AHEAD || (NT == 1 && RT == 1), "x ahead: one n8 tile, one row tile");
  using T2 = typename Elem<T>::T2;
  constexpr int kRows = kTileRows * RT;  // rows of a block (and of each warp)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const KSlice slice = block_slice(a);  // the block's K windows
  const int w_begin = slice.begin, w_end = slice.end;

  // Rows g and g + 8 of each of the warp's 16-row tiles; rows past n are clamped (read, never
  // stored): no predicates in the loop.
  const uint4* wp[RT][2];
  int rows[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rows[r][h] = min(row0 + kTileRows * r + g + 8 * h, a.n - 1);
      wp[r][h] = reinterpret_cast<const uint4*>(a.qweight + static_cast<int64_t>(rows[r][h]) * (a.k / 8)) + t;
    }
  }
  const T* scales = static_cast<const T*>(a.scales);
  const XFragments<T, NT> xf(a, g, t);
  const T2 zz_sym = zero_pair<T>(8);

  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.0f;
  }

  // Rolling prefetch: kInFlight windows of weights (and their scales) in flight per warp at all
  // times; a slot is refilled with the window kInFlight steps ahead as soon as it is consumed.
  uint4 q[kInFlight][RT][2];
  T sc[kInFlight][RT][2];
  uint8_t zp[kInFlight][RT][2];
  constexpr bool kXAhead = X_AHEAD;  // x's window fetched with the weights: 16 registers a slot
  uint4 xq[kXAhead ? kInFlight : 1][NT][4];
  auto fetch_x = [&](int u, int w) {
    if constexpr (kXAhead) {
      if (w < w_end) xf.load(xq[u], w);
    }
  };
  auto fetch_w = [&](int u, int w) {
    if (w < w_end) {
      const int64_t grp = static_cast<int64_t>((w * kWindow + 32 * t) >> a.group_shift) * a.n;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          q[u][r][h] = load_stream(wp[r][h] + 4 * w);
          sc[u][r][h] = scales[grp + rows[r][h]];
          if constexpr (ZEROS) zp[u][r][h] = a.zeros[grp + rows[r][h]];
        }
      }
    }
  };
  // Launched as a programmatic dependent (PDL), the block starts while the previous kernel on
  // the stream finishes. The weights do not depend on that kernel unless it wrote them: with
  // early_weights (the caller's promise that it did not) the first windows are loaded into
  // registers before griddepcontrol.wait, else only hinted into L2 (a hint cannot read stale
  // data) and loaded after it. x is always read after the wait. H100, a 32-layer chain of the
  // 8B GEMMs between their norms and activation (graphs replayed alternately): M = 1 2204 ->
  // 2139 us, M = 4 2284 -> 2224 (benchmarks/results/mma_early_weights_*).
  if (a.early_weights) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) fetch_w(u, w_begin + warp + u * WARPS);
  } else {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int w = w_begin + warp + u * WARPS;
      if (w < w_end) {
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
          for (int h = 0; h < 2; ++h) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(wp[r][h] + 4 * w));
        }
      }
    }
  }
  pdl_wait_primaries();
  if (!a.early_weights) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) fetch_w(u, w_begin + warp + u * WARPS);
  }
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) fetch_x(u, w_begin + warp + u * WARPS);

  for (int w0 = w_begin + warp; w0 < w_end; w0 += WARPS * kInFlight) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int w = w0 + u * WARPS;
      if (w >= w_end) break;
      uint4 xv[NT][4];
      if constexpr (kXAhead) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int j = 0; j < 4; ++j) xv[nt][j] = xq[u][nt][j];
        }
      } else {
        xf.load(xv, w);
      }
      T2 s2[RT][2], zz[RT][2];
      uint32_t wq[RT][2][4];
#pragma unroll
      for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s2[r][h] = splat<T>(sc[u][r][h]);
          zz[r][h] = zz_sym;
          if constexpr (ZEROS) zz[r][h] = zero_pair<T>(zp[u][r][h]);
          wq[r][h][0] = q[u][r][h].x;
          wq[r][h][1] = q[u][r][h].y;
          wq[r][h][2] = q[u][r][h].z;
          wq[r][h][3] = q[u][r][h].w;
        }
      }
      fetch_x(u, w + WARPS * kInFlight);  // the slot's next window, in flight while this one computes
      fetch_w(u, w + WARPS * kInFlight);
      mma_window<T, NT, RT>(acc, wq, zz, s2, xv);
    }
  }

  pdl_launch_dependents();  // the next kernel may launch and fetch its weights during this epilogue
  store_tile<T, NT, RT, WARPS>(acc, a);
}


// ---- The Hopper variant of the weight stream: a per-warp ring of TMA boxes ----
//
// Same work split, fragments, math and epilogue as w4a16_mma_kernel (so the same bits), but the
// window's weights, its scales / zeros and (M = 1) x's window reach shared memory as the copy engine's
// boxes instead of each lane's registers: lane 0 of each warp issues one 16 RT-row x 64-byte box
// of W and the small boxes with it on the stage's mbarrier, the warp waits on that barrier alone
// (no block barrier), reads its fragments back (one conflict-free 16-byte load a row: a warp's
// eight rows are 512 contiguous bytes), and lane 0 refills the stage with the window
// kRingStages ahead. The prefetch's registers go (the register kernel takes 80-140 a thread under
// nvcc 13.0, the ring 52-74), and no lane waits on loads of its own. H100, each launch at the
// dispatch's shape, the two kernels' CUDA graphs replayed alternately, L2 cold
// (benchmarks/results/mma_tma_ring_ab_*), register kernel -> ring at M = 1: 8B QKV 8.99 -> 8.11
// us, O 6.94 -> 6.53, gate/up 33.3 -> 29.0, down 17.8 -> 17.4; 70B QKV 24.5 -> 20.5, O 19.6 ->
// 17.0, gate/up 114.1 -> 102.0, down 59.3 -> 55.9; a 32-layer 8B decode step's GEMMs 2.00 ->
// 1.72 ms. x's window rides in the ring at M = 1 only: a build that staged it for 8 tokens too
// (2 KiB a stage per 1 KiB of W, read back with 8-way bank conflicts) was slower on all eight at
// M = 8 (8B gate/up 34.0 -> 52.3 us). Above M = 1 each lane reads its B fragments from global
// memory (L1-resident, as the register kernel does) while the weights still come by TMA; with the
// register kernel's x and the ring's weights, M = 16 went (best launch of each, the same rounds;
// benchmarks/results/mma_ring_multi_token_*): 8B QKV 13.1 -> 11.6 us, gate/up 43.1 -> 36.2, down
// 23.6 -> 21.9; 70B QKV 30.1 -> 27.5, O 25.5 -> 20.4, gate/up 134.2 -> 110.8, down 81.7 -> 63.0
// (8B O 8.5 -> 8.2 in that run, 8.6 -> 9.8 in the next: the table keeps the register kernel there,
// _config RING). Tried on top and not kept (same harness): x's next window fetched a window ahead
// into registers (70B down 63.1 -> 58.8 us, 70B gate/up 111.8 -> 116.0: no net gain) or through a
// per-lane cp.async ring in the register kernel (8B down 23.5 -> 22.1, 8B gate/up 43.2 -> 46.0);
// a register cap for 24 warps an SM (80 registers, no spills; 70B O 20.3 -> 24.2); 4 stages
// (slower on all eight); the window's products summed in fp32 before one multiply by the scale
// (1-5% faster, but no longer dequantize()'s rounding: up to 9x the tests' tolerance against it).
// Nsight Compute, 8B QKV at M = 16 (192 blocks of 8 warps): 12 active warps an SM, 0.62 eligible
// per scheduler, an issue every 7.9 cycles a warp (37% of it waiting on x's L1 loads), DRAM at 28%
// of its peak: the four windows a warp owns are issue-bound, not bandwidth-bound.
//
// Stages a warp keeps in flight: 2 of 2 / 3 / 4 / 8 swept (3 within 1-2%, 4 2-10% slower, 8 up
// to 25% slower: more shared memory a block costs resident warps). On the H200 (4.8 TB/s, where
// the kernel reads the int4 bytes at 55-62% of a read-only kernel's rate) 3 stages again gained
// nothing: best launch per projection at M = 1 / 4 / 16 from 8% slower to 3% faster, against the
// committed table's run (benchmarks/results/mma_ring3_stages_*).
constexpr int kRingStages = 2;

// Group rows of scales / zeros a 128-column window spans: G = 32: 4, 64: 2, larger or per
// channel (shift 31): 1.
__host__ __device__ constexpr int window_group_rows(int group_shift) {
  return group_shift < 7 ? kWindow >> group_shift : 1;
}

// One stage of a warp's ring (each box 128-byte aligned): W [16 RT rows][64 bytes], scales
// [group rows][16 RT] (up to 4 group rows: G = 32 puts four groups in a window), zeros likewise
// (uint8), at M = 1 x's window (128 columns of the one token).
template <class T, int RT, bool ZEROS, bool X_RING>
struct RingStage {
  static constexpr int kW = RT * kTileRows * kWindow / 2;
  static constexpr int kS = 4 * kTileRows * RT * static_cast<int>(sizeof(T));  // 128 RT
  static constexpr int kZ = ZEROS ? 128 : 0;                                   // 4 x 16 RT bytes
  static constexpr int kX = X_RING ? kWindow * static_cast<int>(sizeof(T)) : 0;
  static constexpr int kBytes = kW + kS + kZ + kX;
  static_assert(kBytes % 128 == 0 && kW % 128 == 0 && kS % 128 == 0, "boxes 128-byte aligned");
};

// The copy engine's view of the operands (launch_ring encodes them per call): qweight [n, k / 8]
// int32 in boxes of 16 RT rows x 16 words (one window), scales / zeros [k / G, n] in boxes of
// (group rows a window spans) x 16 RT, x [1, k] in boxes of 128 columns (M = 1). Boxes reaching past n
// read zeros.
struct RingMaps {
  CUtensorMap w, s, z, x;
};

template <class T, int NT, int RT, bool ZEROS, int WARPS, bool X_RING>
__global__ void __launch_bounds__(WARPS * 32) w4a16_ring_kernel(const __grid_constant__ KernelArgs a,
                                                                  const __grid_constant__ RingMaps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(!X_RING || NT == 1, "x's window in the ring: one token (m = 1)");
  using namespace tma;
  using T2 = typename Elem<T>::T2;
  using St = RingStage<T, RT, ZEROS, X_RING>;
  constexpr int kRows = kTileRows * RT;
  extern __shared__ uint8_t ring_raw[];
  __shared__ uint64_t full_bar[WARPS][kRingStages];  // stage arrival barriers, one ring a warp

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const KSlice slice = block_slice(a);  // the block's K windows
  const int w_begin = slice.begin, w_end = slice.end;
  const int first = w_begin + warp;  // the warp's windows: first, first + WARPS, ...
  const int my_windows = first < w_end ? (w_end - first + WARPS - 1) / WARPS : 0;
  uint8_t* ring = ring_raw + ((128 - (smem_u32(ring_raw) & 127)) & 127) + warp * kRingStages * St::kBytes;
  // Group rows a window spans (G = 32: 4, 64: 2, else 1) and this lane's among them.
  const int group_rows = window_group_rows(a.group_shift);
  const int lane_group = a.group_shift < 7 ? (32 * t) >> a.group_shift : 0;
  const uint32_t tx_bytes =
      St::kW + group_rows * kRows * static_cast<int>(sizeof(T) + (ZEROS ? 1 : 0)) + St::kX;

  if (lane == 0) {
    for (int s = 0; s < kRingStages; ++s) mbar_init(&full_bar[warp][s]);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int i) {  // lane 0: window i of the warp into stage i % kRingStages
    const int w = first + i * WARPS;
    uint8_t* st = ring + (i % kRingStages) * St::kBytes;
    uint64_t* bar = &full_bar[warp][i % kRingStages];
    const int group = a.group_shift >= 31 ? 0 : (w * kWindow) >> a.group_shift;
    mbar_expect_tx(bar, tx_bytes);
    tma_load_2d(st, &maps.w, bar, w * (kWindow / 8), row0);
    tma_load_2d(st + St::kW, &maps.s, bar, row0, group);
    if constexpr (ZEROS) tma_load_2d(st + St::kW + St::kS, &maps.z, bar, row0, group);
    if constexpr (X_RING) tma_load_2d(st + St::kW + St::kS + St::kZ, &maps.x, bar, w * kWindow, 0);
  };
  // m > 1: x's B fragments are read from global memory, before the stage's wait so that their
  // latency overlaps it.
  const XFragments<T, NT> xf(a, g, t);
  // As a programmatic dependent the block starts (barriers set up) while the previous kernel
  // finishes; the copies follow griddepcontrol.wait, as every read does in w4a16_mma_kernel
  // without early_weights. Not taken here: early_weights (the weights' boxes issued before the
  // wait: no faster in a 32-layer chain of the 8B GEMMs between their norms, 1870.8 us either
  // way, and 8% slower in a chain of norm -> QKV pairs, 8.87 -> 9.56 us a pair; benchmarks/results/
  // mma_early_weights_*), and L2 hints of the first windows (one lane's: within 3% of none;
  // every lane's: 6-15% slower at 8B QKV / O; scratch A/B, H100).
  pdl_wait_primaries();
  if (lane == 0) {
    for (int i = 0; i < kRingStages && i < my_windows; ++i) issue(i);
  }

  const bool x_lane = g == 0;  // the lanes whose B fragments hold the token (m = 1)
  const T2 zz_sym = zero_pair<T>(8);
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[r][nt][0] = acc[r][nt][1] = acc[r][nt][2] = acc[r][nt][3] = 0.0f;
  }
  for (int i = 0; i < my_windows; ++i) {
    const uint8_t* st = ring + (i % kRingStages) * St::kBytes;
    uint4 xv[NT][4];
    if constexpr (!X_RING) xf.load(xv, first + i * WARPS);
    mbar_wait(&full_bar[warp][i % kRingStages], (i / kRingStages) & 1);
    uint32_t wq[RT][2][4];
    T2 s2[RT][2], zz[RT][2];
    const uint32_t st_addr = smem_u32(st);
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = kTileRows * r + g + 8 * h;  // row of the box
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(wq[r][h][0]), "=r"(wq[r][h][1]), "=r"(wq[r][h][2]), "=r"(wq[r][h][3])
                     : "r"(st_addr + row * (kWindow / 2) + 16 * t));
        unsigned short bits;
        asm volatile("ld.shared.u16 %0, [%1];\n"
                     : "=h"(bits)
                     : "r"(st_addr + St::kW + (lane_group * kRows + row) * static_cast<uint32_t>(sizeof(T))));
        s2[r][h] = splat<T>(Elem<T>::from_bits(bits));
        zz[r][h] = zz_sym;
        if constexpr (ZEROS) zz[r][h] = zero_pair<T>((st + St::kW + St::kS)[lane_group * kRows + row]);
      }
    }
    if constexpr (X_RING) {  // the token's B fragments from the stage; the other lanes hold zeros
      const uint32_t xs = st_addr + St::kW + St::kS + St::kZ + 64 * t;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xv[0][j] = make_uint4(0, 0, 0, 0);
        if (x_lane) {
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(xv[0][j].x), "=r"(xv[0][j].y), "=r"(xv[0][j].z), "=r"(xv[0][j].w)
                       : "r"(xs + 16 * j));
        }
      }
    }
    __syncwarp();  // every lane's reads of the stage done before lane 0 hands it back to the copy engine
    if (lane == 0 && i + kRingStages < my_windows) {
      fence_proxy_async();
      issue(i + kRingStages);
    }
    mma_window<T, NT, RT>(acc, wq, zz, s2, xv);
  }
  pdl_launch_dependents();
  store_tile<T, NT, RT, WARPS>(acc, a);
#endif  // __CUDA_ARCH__ >= 900
}

constexpr int kMaxDevices = 64;  // devices whose kernel code version is cached (device_code_waits)

// Whether the kernel's code has griddepcontrol: it was compiled from sm90+ PTX (__CUDA_ARCH__ is
// the PTX architecture). Not the binary version: compute_80 PTX JIT-compiled for a Hopper GPU
// reports binaryVersion 90 and has no wait. Every kernel of this file is compiled for the same
// architectures: asked once per device.
bool device_code_waits(const void* kernel) {
  static std::atomic<int8_t> known[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  if (const int8_t k = known[device].load(std::memory_order_relaxed); k != 0) return k == 2;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool waits = attr.ptxVersion >= 90;
  known[device].store(waits ? 2 : 1, std::memory_order_relaxed);
  return waits;
}

// Launches `kernel` with `args`; with `pdl`, as a programmatic dependent of the stream's previous
// kernel, only where this kernel's code waits for it (device_code_waits: the sm80 code has no
// griddepcontrol and would race the previous kernel). Returns the launch's own error, cleared.
template <class Kernel, class... Args>
cudaError_t launch_kernel_ex(Kernel* kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, bool pdl,
                             unsigned cluster_y, const Args&... args) {
  pdl = pdl && device_code_waits(reinterpret_cast<const void*>(kernel));
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = cluster_y;
    attrs[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args...);
  if (err != cudaSuccess) cudaGetLastError();  // clear it: the caller reports the returned error
  return err;
}
template <class Kernel, class... Args>
cudaError_t launch_kernel(Kernel* kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, bool pdl,
                          const Args&... args) {
  return launch_kernel_ex(kernel, grid, threads, smem, stream, pdl, 1u, args...);
}

// Whether the TMA ring can take this call: sm90+ code (device_code_waits), the
// driver's tensor-map encoder, and rows of scales / zeros the copy engine can address (16-byte
// aligned bases and row strides: n % 8 == 0, with zeros n % 16 == 0). x and qweight already meet
// the kernel's own 16-byte rules (w4a16_mma_check).
bool ring_supported(const W4A16MmaParams& p, const void* ring_kernel) {
  if (!p.ring || tma::encoder() == nullptr) return false;
  if (p.n % 8 != 0 || reinterpret_cast<uintptr_t>(p.scales) % 16 != 0) return false;
  if (p.zeros != nullptr && (p.n % 16 != 0 || reinterpret_cast<uintptr_t>(p.zeros) % 16 != 0)) return false;
  return device_code_waits(ring_kernel);
}

// Launches the ring kernel; kRingUnavailable (nothing enqueued, no error left pending) where a
// tensor map or the shared-memory limit cannot be set up: the caller runs the register kernel.
constexpr cudaError_t kRingUnavailable = cudaErrorNotSupported;
template <class T, int NT, int RT, bool ZEROS, int WARPS, bool X_RING>
cudaError_t launch_ring(const W4A16MmaParams& p, dim3 grid, cudaStream_t stream, const KernelArgs& a) {
  using St = RingStage<T, RT, ZEROS, X_RING>;
  constexpr int kRows = kTileRows * RT;
  const CUtensorMapDataType t16 = p.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const uint64_t groups = a.group_shift >= 31 ? 1 : (p.k >> a.group_shift);
  const uint32_t group_rows = window_group_rows(a.group_shift);
  RingMaps maps;
  const CUtensorMapSwizzle none = CU_TENSOR_MAP_SWIZZLE_NONE;
  bool ok = tma::encode_2d(&maps.w, CU_TENSOR_MAP_DATA_TYPE_INT32, p.qweight, p.k / 8, p.n, uint64_t(p.k) / 2,
                           kWindow / 8, kRows, none) &&
            tma::encode_2d(&maps.s, t16, p.scales, p.n, groups, uint64_t(p.n) * sizeof(T), kRows, group_rows, none);
  if (X_RING) {
    ok = ok && tma::encode_2d(&maps.x, t16, p.x, p.k, 1, uint64_t(p.k) * sizeof(T), kWindow, 1, none);
  } else {
    maps.x = maps.s;  // never read: x comes from global memory
  }
  if (ZEROS) {
    ok = ok && tma::encode_2d(&maps.z, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.zeros, p.n, groups, uint64_t(p.n), kRows,
                              group_rows, none);
  } else {
    maps.z = maps.s;  // never read
  }
  if (!ok) return kRingUnavailable;  // the encoder's own failure leaves no runtime error
  auto kernel = w4a16_ring_kernel<T, NT, RT, ZEROS, WARPS, X_RING>;
  const size_t smem = size_t{WARPS} * kRingStages * St::kBytes + 128;  // + the 128-byte alignment slack
  // The shared-memory limit is a per-device attribute: set once per device this process uses (a
  // failure, already cleared, runs the register kernel instead).
  static std::atomic<int> opted_in[64];
  if (opt_in_dynamic_smem(opted_in, kernel, static_cast<int>(smem)) != cudaSuccess) return kRingUnavailable;
  // A K split of 2 is one thread-block cluster (1, 2, 1) whose slices sum through distributed
  // shared memory (store_tile); larger splits through global partials.
  // A cluster launch the device refuses (e.g. no room for the cluster) runs with the partials.
  KernelArgs ac = a;
  ac.cluster = a.split_k == kClusterSplit;
  cudaError_t err = launch_kernel_ex(kernel, grid, WARPS * 32, smem, stream, p.pdl, ac.cluster ? grid.y : 1u, ac, maps);
  if (err != cudaSuccess && ac.cluster) {
    ac.cluster = false;
    err = launch_kernel_ex(kernel, grid, WARPS * 32, smem, stream, p.pdl, 1u, ac, maps);
  }
  return err;
}

template <class T, int NT, int RT, bool ZEROS, int WARPS>
cudaError_t launch_variant(dim3 grid, cudaStream_t stream, const KernelArgs& a, bool pdl, bool x_ahead) {
  constexpr int kThreads = WARPS * 32;
  if constexpr (NT == 1 && RT == 1) {
    if (x_ahead) return launch_kernel(w4a16_mma_kernel<T, NT, RT, ZEROS, WARPS, true>, grid, kThreads, 0, stream, pdl, a);
  }
  return launch_kernel(w4a16_mma_kernel<T, NT, RT, ZEROS, WARPS, false>, grid, kThreads, 0, stream, pdl, a);
}

template <class T, int NT, bool ZEROS>
cudaError_t launch_shape(const W4A16MmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  const int rows = kTileRows * p.row_tiles;
  const dim3 grid(static_cast<unsigned>((p.n + rows - 1) / rows), static_cast<unsigned>(p.split_k));
  // The TMA ring where it can run (any of its kernels stands for all in the check); x's window
  // rides in the ring at m = 1 only.
  if (ring_supported(p, reinterpret_cast<const void*>(w4a16_ring_kernel<T, 1, 1, ZEROS, 8, true>))) {
    const int key = (p.warps == 4 ? 0 : 2) + (p.row_tiles == 1 ? 0 : 1);
    cudaError_t err = kRingUnavailable;
    if (NT == 1 && p.m == 1) {
      switch (key) {
        case 0: err = launch_ring<T, 1, 1, ZEROS, 4, true>(p, grid, stream, a); break;
        case 1: err = launch_ring<T, 1, 2, ZEROS, 4, true>(p, grid, stream, a); break;
        case 2: err = launch_ring<T, 1, 1, ZEROS, 8, true>(p, grid, stream, a); break;
        default: err = launch_ring<T, 1, 2, ZEROS, 8, true>(p, grid, stream, a); break;
      }
    } else {
      switch (key) {
        case 0: err = launch_ring<T, NT, 1, ZEROS, 4, false>(p, grid, stream, a); break;
        case 1: err = launch_ring<T, NT, 2, ZEROS, 4, false>(p, grid, stream, a); break;
        case 2: err = launch_ring<T, NT, 1, ZEROS, 8, false>(p, grid, stream, a); break;
        default: err = launch_ring<T, NT, 2, ZEROS, 8, false>(p, grid, stream, a); break;
      }
    }
    if (err != kRingUnavailable) return err;
  }
  // x ahead where every block is resident at its 16 warps an SM (a grid of one wave): there the
  // warps' serial wait on x's window was the limit (M = 1, H100: 8B O 7.50 -> 7.00 us, 8B down
  // 18.97 -> 17.34); where more blocks than that would be resident (8B QKV's 384 at 8 warps:
  // 9.18 -> 11.30 us) the lost occupancy costs more (benchmarks/results/mma_variants_*).
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y;
  const bool x_ahead = NT == 1 && p.row_tiles == 1 && p.sms > 0 && blocks <= int64_t{p.sms} * (16 / p.warps);
  const bool pdl = p.pdl;
  if (p.warps == 4) {
    if (p.row_tiles == 1) return launch_variant<T, NT, 1, ZEROS, 4>(grid, stream, a, pdl, x_ahead);
    return launch_variant<T, NT, 2, ZEROS, 4>(grid, stream, a, pdl, false);
  }
  if (p.row_tiles == 1) return launch_variant<T, NT, 1, ZEROS, 8>(grid, stream, a, pdl, x_ahead);
  return launch_variant<T, NT, 2, ZEROS, 8>(grid, stream, a, pdl, false);
}

template <class T, bool ZEROS>
cudaError_t launch_tokens(const W4A16MmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  if (p.m <= 8) return launch_shape<T, 1, ZEROS>(p, a, stream);
  if (p.m <= 16) return launch_shape<T, 2, ZEROS>(p, a, stream);
  return launch_shape<T, 4, ZEROS>(p, a, stream);
}

template <class T>
cudaError_t launch_dtype(const W4A16MmaParams& p, const KernelArgs& a, cudaStream_t stream) {
  return p.zeros != nullptr ? launch_tokens<T, true>(p, a, stream) : launch_tokens<T, false>(p, a, stream);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

const char* w4a16_mma_check(const W4A16MmaParams& p) {
  if (p.m < 0 || p.m > kMaxM) return "m must be in 0 .. 32";
  if (p.n < 1 || p.n >= (int64_t{1} << 31) / kMaxM) return "n must be >= 1 (and below 2^26)";
  if (p.k < kWindow || p.k % kWindow != 0 || p.k >= (int64_t{1} << 30)) return "k must be a positive multiple of 128";
  if (p.group_shift < 5) return "the group size must be >= 32 (or one group per channel)";
  if (p.x == nullptr || p.qweight == nullptr || p.scales == nullptr || p.out == nullptr) return "null tensor";
  if (!aligned16(p.x) || p.x_row_stride % 8 != 0) return "x must be 16-byte aligned with a row stride a multiple of 8";
  if (!aligned16(p.qweight)) return "qweight must be 16-byte aligned";
  if (p.out_row_stride < p.n) return "out rows must not overlap";
  if (!((p.warps == 4 || p.warps == 8) && (p.row_tiles == 1 || p.row_tiles == 2))) return "warps must be 4 or 8, row_tiles 1 or 2";
  const int64_t windows = p.k / kWindow;
  if (p.split_k < 1 || p.split_k > windows) return "split_k must be in 1 .. k / 128";
  if (p.split_k > 1 && (p.partials == nullptr || p.counters == nullptr)) return "split_k > 1 needs partials and counters";
  return nullptr;
}

cudaError_t w4a16_mma_launch(const W4A16MmaParams& p, cudaStream_t stream) {
  if (w4a16_mma_check(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  KernelArgs a;
  a.m = static_cast<int>(p.m);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.x = p.x;
  a.x_row_stride = p.x_row_stride;
  a.qweight = p.qweight;
  a.scales = p.scales;
  a.zeros = p.zeros;
  a.group_shift = p.group_shift >= 31 ? 31 : p.group_shift;
  a.bias = p.bias;
  a.bias_fp32 = p.bias_fp32;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  a.residual = p.residual;
  a.residual_row_stride = p.residual_row_stride;
  // Slices of whole windows, none empty (the launcher's split may not divide the windows).
  const int windows = a.k / kWindow;
  const int per_split = (windows + p.split_k - 1) / p.split_k;
  a.split_k = (windows + per_split - 1) / per_split;
  a.partials = p.partials;
  a.counters = p.counters;
  a.early_weights = p.early_weights;
  a.cluster = false;  // launch_ring sets it
  W4A16MmaParams q = p;
  q.split_k = a.split_k;
  return p.dtype == DType::kBFloat16 ? launch_dtype<__nv_bfloat16>(q, a, stream) : launch_dtype<__half>(q, a, stream);
}

}  // namespace machete_w4a16
}  // namespace fused_llm
