// gated-mlp's sm90 kernel in CuTe: act(x W_gate^T + b_g) * (x W_up^T + b_u) in one GEMM, with
// Hopper's copy engine (TMA) and warpgroup MMA (wgmma). Framework-free (raw pointers, sizes,
// strides, a cudaStream_t in; a cudaError_t out). CUDA only, built for sm_90a (wgmma and
// setmaxnreg exist only there); compiled for other targets the kernel body is empty and the
// launcher refuses to run it (gated_mlp_sm90_launch checks the device).
//
// Why a hand-written kernel next to the Triton one: Triton's sm90 kernel issues TMA and wgmma
// from the same warps, one tile per program, and measured 0.93-1.02x cuBLAS's GEMM alone on an
// H200 (gated-mlp/README.md). This one is laid out like CUTLASS's "warp-specialized cooperative
// persistent" GEMMs:
//   * 384 threads: warpgroup 0 is the producer (one thread issues every TMA copy; the others
//     exit, and the group gives its registers back with setmaxnreg, 40 per thread), warpgroups
//     1 and 2 are consumers (232 registers per thread), each computing 64 of the tile's 128 rows.
//   * Dual accumulator as one wgmma tile: a B stage holds 128 rows of W_gate then 128 rows of
//     W_up (two TMA boxes into the two halves of one 256 x 64 K-major buffer), so a single
//     64 x 256 x 16 wgmma per K block computes both products for the consumer's 64 rows over
//     the same A tile. In the accumulator fragment value i (i < 64) is gate column c and value
//     i + 64 is up column c + 128 of the same row (the wgmma C layout puts 8-column blocks
//     outermost: value = col pair + 2 * row half + 4 * block, blocks 0-15 gate, 16-31 up), so
//     the epilogue is elementwise in registers and stores a 128 x 128 tile of T.
//   * 4 shared-memory stages of 48 KiB (x 128 x 64 + W 256 x 64, 128-byte swizzle), handed
//     between producer and consumers by CUTLASS's PipelineTmaAsync (mbarriers with transaction
//     counts). The consumers keep one K step of wgmma in flight and free a stage as soon as
//     the wgmma reading it has retired.
//   * Clusters of 2 CTAs along M share their W stages: each CTA's copy engine loads half of the
//     gate box and half of the up box and multicasts it into both CTAs' shared memory, so W
//     crosses L2 -> SM once per two row tiles (a stage reads 16 KiB of x + 16 KiB of W per CTA
//     instead of 16 + 32: at ~700 TFLOP/s the unshared version pulls ~11 TB/s out of L2).
//     A stage is refilled only when the consumers of both CTAs have released it
//     (PipelineTmaAsync counts their arrivals across the cluster).
//   * Persistent: one cluster per pair of SMs (as many as can be resident) takes cluster
//     tiles (2 row tiles x 1 column tile) c, c + clusters, ... in grouped order (8 row-tile
//     pairs per column sweep, so x and W tiles are reused from L2), and the producer runs
//     ahead into the next tile while the consumers finish the epilogue of this one. With an
//     odd number of row tiles the last pair's second CTA loads a zero-filled x box and stores
//     nothing.
//   * Tails: TMA zero-fills rows past M / U and columns past D (any D >= 1); the epilogue
//     stores only rows < M and columns < U. Stores go straight from registers, two adjacent
//     columns per 32-bit store when aligned.

#include "gated_mlp_sm90.h"

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "gated_mlp_common.cuh"

namespace fused_llm {
namespace gated_mlp {
namespace {

using namespace cute;

// CTAs per cluster (along M: they share W), and cluster tiles per column sweep of the grouped
// tile order (8 x 2 = 16 row tiles).
constexpr int kClusterM = 2;
constexpr int kGroupM = 8;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;  // 2 x 128 x 232 + 128 x 40 = 64512 of the SM's 65536

template <class T>
struct Sm90Config {
  using Element = T;
  using BlockM = Int<kSm90BlockM>;
  using BlockN = Int<kSm90BlockN>;
  using BlockN2 = Int<2 * kSm90BlockN>;  // one B stage: W_gate rows, then W_up rows
  using BlockK = Int<kSm90BlockK>;
  using Stages = Int<kSm90Stages>;
  static constexpr int kThreads = kSm90Threads;
  static constexpr int kConsumerThreads = 256;

  // 8 rows x 64 elements (128 bytes) with the 128-byte swizzle, K-major: what both the TMA
  // box and the wgmma descriptors describe.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<T>;
  using SmemLayoutBox = decltype(tile_to_shape(SmemAtom{}, Shape<BlockM, BlockK>{}));
  using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, Shape<BlockM, BlockK, Stages>{}));
  using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, Shape<BlockN2, BlockK, Stages>{}));
  static constexpr int kBoxElems = kSm90BlockM * kSm90BlockK;
  static constexpr uint32_t kStageBytes = 3 * kBoxElems * sizeof(T);

  // Two consumer warpgroups stacked along M, each one 64 x 256 x 16 wgmma per K block.
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<_64, BlockN2, BlockK>, GMMA::Major::K, GMMA::Major::K>(),
      Layout<Shape<_2, _1, _1>>{}));
  using Pipeline = cutlass::PipelineTmaAsync<kSm90Stages>;
};

// The stage buffers are addressed box by box (TMA) and as whole tiles (wgmma): the tiled
// layouts must place box j of stage s at element offset (s * boxes_per_stage + j) * kBoxElems.
template <class Cfg>
constexpr bool layouts_are_box_major() {
  using A = typename Cfg::SmemLayoutA;
  using B = typename Cfg::SmemLayoutB;
  using Box = typename Cfg::SmemLayoutBox;
  constexpr int kBox = Cfg::kBoxElems;
  return cosize(Box{}) == kBox && A{}(0, 0, 1) == kBox && B{}(kSm90BlockN, 0, 0) == kBox &&
         B{}(0, 0, 1) == 2 * kBox && A{}(5, 9, 0) == Box{}(5, 9) && B{}(kSm90BlockN + 5, 9, 0) == kBox + Box{}(5, 9);
}

template <class Cfg>
struct Sm90Storage {
  using T = typename Cfg::Element;
  cute::ArrayEngine<T, cosize_v<typename Cfg::SmemLayoutA>> a;
  cute::ArrayEngine<T, cosize_v<typename Cfg::SmemLayoutB>> b;
  typename Cfg::Pipeline::SharedStorage pipeline;
};
// The 128-byte swizzle repeats every 1024 bytes and TMA / wgmma apply it to address bits, so
// the buffers start 1024-byte aligned: the kernel rounds the dynamic shared memory base up.
constexpr int kSmemAlign = 1024;

// A [rows, cols] row-major operand as one TMA descriptor with a 128 x 64 box; multicast: each
// of the cluster's kClusterM CTAs loads 1 / kClusterM of the box into all of them.
template <class T, class Op>
auto make_box_tma(Op op, const T* ptr, int rows, int cols, int64_t row_stride) {
  Tensor g = make_tensor(make_gmem_ptr(ptr), make_layout(make_shape(rows, cols), make_stride(row_stride, _1{})));
  using Box = Shape<Int<kSm90BlockM>, Int<kSm90BlockK>>;
  if constexpr (std::is_same_v<Op, SM90_TMA_LOAD_MULTICAST>) {
    return make_tma_atom(op, g, typename Sm90Config<T>::SmemLayoutBox{}, Box{}, Int<kClusterM>{});
  } else {
    return make_tma_atom(op, g, typename Sm90Config<T>::SmemLayoutBox{}, Box{});
  }
}
template <class T>
using BoxTma = decltype(make_box_tma<T>(SM90_TMA_LOAD{}, nullptr, 1, 1, 8));
template <class T>
using SharedBoxTma = decltype(make_box_tma<T>(SM90_TMA_LOAD_MULTICAST{}, nullptr, 1, 1, 8));

template <class T>
struct Sm90Args {
  BoxTma<T> tma_x;
  SharedBoxTma<T> tma_gate, tma_up;
  int m, u, d;
  int tiles_m, tiles_n;
  int pairs_m;  // row-tile pairs: cluster tiles = pairs_m * tiles_n
  const float* bias_gate;
  const float* bias_up;
  T* out;
  int64_t out_row_stride;
};

// Tile `tile` of the grouped order -> (row tile, column tile).
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int group = kGroupM * tiles_n;
  const int first_m = (tile / group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int r = tile % group;
  tm = first_m + r % group_m;
  tn = r / group_m;
}

// One 128 x 64 box from the (BLK, BLK_K) global tile `g` into the box buffer at `s`: the whole
// box into this CTA, or (shared) this CTA's slice of it into every CTA of the cluster.
template <class Cfg, class Tma, class GTensor>
__device__ __forceinline__ void copy_box(const Tma& tma, uint64_t& barrier, const GTensor& g,
                                         typename Cfg::Element* s) {
  Tensor sbox = make_tensor(make_smem_ptr(s), typename Cfg::SmemLayoutBox{});
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sbox), group_modes<0, 2>(g));
  copy(tma.with(barrier), tg, ts);
}
template <class Cfg, class Tma, class GTensor>
__device__ __forceinline__ void copy_shared_box(const Tma& tma, uint64_t& barrier, const GTensor& g,
                                                typename Cfg::Element* s, int cta_rank) {
  constexpr uint16_t kAllCtas = (1u << kClusterM) - 1;
  Tensor sbox = make_tensor(make_smem_ptr(s), typename Cfg::SmemLayoutBox{});
  auto [tg, ts] = tma_partition(tma, cta_rank, Layout<Int<kClusterM>>{}, group_modes<0, 2>(sbox), group_modes<0, 2>(g));
  copy(tma.with(barrier, kAllCtas), tg, ts);
}

template <class Cfg, int kAct>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gated_mlp_sm90_kernel(const __grid_constant__ Sm90Args<typename Cfg::Element> args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename Cfg::Element;
  using BlockM = typename Cfg::BlockM;
  using BlockN = typename Cfg::BlockN;
  using BlockN2 = typename Cfg::BlockN2;
  using BlockK = typename Cfg::BlockK;
  using Pipeline = typename Cfg::Pipeline;
  using PipelineState = typename Pipeline::PipelineState;
  constexpr int kBox = Cfg::kBoxElems;

  extern __shared__ uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<Sm90Storage<Cfg>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});

  const int warp_group = static_cast<int>(threadIdx.x) / 128;
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Cfg::kStageBytes;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x == 0;
  pipe_params.num_consumers = Cfg::kConsumerThreads;
  Pipeline pipeline(smem.pipeline, pipe_params, Shape<Int<kClusterM>, _1, _1>{});
  // The barriers warp 0 initialized are visible to every thread of the cluster (the peer CTA
  // multicasts into them and its consumers arrive on them).
  cute::cluster_arrive_relaxed();
  cute::cluster_wait();

  const int cta_rank = static_cast<int>(cute::block_rank_in_cluster());
  const int cluster = static_cast<int>(blockIdx.x) / kClusterM;
  const int clusters = static_cast<int>(gridDim.x) / kClusterM;
  const int tiles = args.pairs_m * args.tiles_n;  // cluster tiles
  const int k_tiles = (args.d + BlockK::value - 1) / BlockK::value;

  if (warp_group == 0) {
    // ---- producer: one thread issues the three TMA boxes of every stage -------------------
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x == 0) {
      Tensor mX = args.tma_x.get_tma_tensor(make_shape(args.m, args.d));
      Tensor mG = args.tma_gate.get_tma_tensor(make_shape(args.u, args.d));
      Tensor mU = args.tma_up.get_tma_tensor(make_shape(args.u, args.d));
      PipelineState write = cutlass::make_producer_start_state<Pipeline>();
      for (int tile = cluster; tile < tiles; tile += clusters) {
        int tm, tn;
        tile_coords(tile, args.pairs_m, args.tiles_n, tm, tn);
        tm = tm * kClusterM + cta_rank;
        Tensor gX = local_tile(mX, Shape<BlockM, BlockK>{}, make_coord(tm, _));  // (BLK_M, BLK_K, k)
        Tensor gG = local_tile(mG, Shape<BlockN, BlockK>{}, make_coord(tn, _));  // (BLK_N, BLK_K, k)
        Tensor gU = local_tile(mU, Shape<BlockN, BlockK>{}, make_coord(tn, _));
        for (int kt = 0; kt < k_tiles; ++kt) {
          pipeline.producer_acquire(write);  // the stage is free; arms its barrier for kStageBytes
          uint64_t& barrier = *pipeline.producer_get_barrier(write);
          const int s = static_cast<int>(write.index());
          T* b_stage = smem.b.begin() + s * 2 * kBox;
          copy_box<Cfg>(args.tma_x, barrier, gX(_, _, kt), smem.a.begin() + s * kBox);
          copy_shared_box<Cfg>(args.tma_gate, barrier, gG(_, _, kt), b_stage, cta_rank);
          copy_shared_box<Cfg>(args.tma_up, barrier, gU(_, _, kt), b_stage + kBox, cta_rank);
          ++write;
        }
      }
      // Every stage consumed (here and in the peer, whose consumers arrive on these barriers)
      // before the CTA may retire.
      pipeline.producer_tail(write);
    }
  } else {
    // ---- consumers: wgmma over the stages, then the gated epilogue -------------------------
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    const int ct = static_cast<int>(threadIdx.x) - 128;
    Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), typename Cfg::SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), typename Cfg::SmemLayoutB{});  // (2 BLK_N, BLK_K, PIPE)
    typename Cfg::TiledMma mma;
    auto thr_mma = mma.get_thread_slice(ct);
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // wgmma descriptors (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor acc = partition_fragment_C(mma, Shape<BlockM, BlockN2>{});  // fp32 ((2, 2, 32), 1, 1)
    Tensor tCc = thr_mma.partition_C(make_identity_tensor(Shape<BlockM, BlockN2>{}));  // -> (row, col)
    constexpr int kHalf = decltype(size(acc))::value / 2;  // values [0, 64): gate; [64, 128): up
    static_assert(kHalf == 64 && decltype(size<1>(acc))::value == 1 && decltype(size<2>(acc))::value == 1,
                  "one 64 x 256 wgmma tile per consumer: value i + 64 is value i's up column");

    PipelineState read;     // the stage the next wgmma reads
    PipelineState release;  // the oldest stage still held
    const bool pair_stores = args.out_row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(args.out) % 4 == 0;

    for (int tile = cluster; tile < tiles; tile += clusters) {
      int tm, tn;
      tile_coords(tile, args.pairs_m, args.tiles_n, tm, tn);
      tm = tm * kClusterM + cta_rank;

      // First K step: overwrite the accumulators (ScaleOut::Zero on its first K block).
      mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(acc);
      pipeline.consumer_wait(read);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        gemm(mma, tCrA(_, _, kb, read.index()), tCrB(_, _, kb, read.index()), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      ++read;
      warpgroup_fence_operand(acc);
      // Steady state: issue step k, wait for step k - 1 to retire, free its stage.
      for (int kt = 1; kt < k_tiles; ++kt) {
        pipeline.consumer_wait(read);
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, read.index()), tCrB(_, _, _, read.index()), acc);
        warpgroup_commit_batch();
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc);
        pipeline.consumer_release(release);
        ++release;
        ++read;
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      pipeline.consumer_release(release);
      ++release;

      // Epilogue: act(g + b_g) * (u + b_u) in fp32, one rounding to T, rows < M, cols < U.
      const int m0 = tm * BlockM::value;
      const int n0 = tn * BlockN::value;
      const int m_left = args.m - m0;  // <= 0 for the spare CTA of an odd last pair
      const int n_left = args.u - n0;
      T* out = args.out + static_cast<int64_t>(m0) * args.out_row_stride + n0;
      const float* bias_g = args.bias_gate == nullptr ? nullptr : args.bias_gate + n0;
      const float* bias_u = args.bias_up == nullptr ? nullptr : args.bias_up + n0;
      auto value = [&](int i, int col) {
        const float g = acc(i) + (bias_g != nullptr ? bias_g[col] : 0.0f);
        const float u = acc(i + kHalf) + (bias_u != nullptr ? bias_u[col] : 0.0f);
        return detail::gate_act<kAct>(g) * u;
      };
      CUTE_UNROLL
      for (int i = 0; i < kHalf; i += 2) {
        // Values i and i + 1: columns c and c + 1 (c even) of one row.
        const int r = get<0>(tCc(i));
        const int c = get<1>(tCc(i));
        if (r < m_left) {
          T* o = out + static_cast<int64_t>(r) * args.out_row_stride + c;
          if (pair_stores && c + 1 < n_left) {
            *reinterpret_cast<uint32_t*>(o) = detail::pack2<T>(value(i, c), value(i + 1, c + 1));
          } else {
            if (c < n_left) o[0] = T(value(i, c));
            if (c + 1 < n_left) o[1] = T(value(i + 1, c + 1));
          }
        }
      }
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <class Cfg>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(Sm90Storage<Cfg>)) + kSmemAlign;
}

// TMA descriptors need 16-byte multiple row strides even for a single row, which is never
// stepped over: give such a row the smallest legal stride.
int64_t tma_row_stride(int64_t rows, int64_t stride, int64_t cols) {
  return rows <= 1 ? (cols + 7) / 8 * 8 : stride;
}

template <class Cfg, int kAct>
cudaError_t launch_typed(const GatedMlpParams& p, int sm_count, int device, cudaStream_t stream) {
  using T = typename Cfg::Element;
  static_assert(layouts_are_box_major<Cfg>(), "shared-memory layouts do not match the TMA boxes");
  auto kernel = gated_mlp_sm90_kernel<Cfg, kAct>;
  constexpr int kSmem = smem_bytes<Cfg>();
  static std::atomic<int> opted_in[64];  // per kernel instantiation, per device
  cudaError_t err = opt_in_dynamic_smem(opted_in, kernel, kSmem);
  if (err != cudaSuccess) return err;
  const int m = static_cast<int>(p.m), u = static_cast<int>(p.u), d = static_cast<int>(p.d);
  Sm90Args<T> args{};
  args.tma_x = make_box_tma(SM90_TMA_LOAD{}, static_cast<const T*>(p.x), m, d, tma_row_stride(p.m, p.x_row_stride, p.d));
  args.tma_gate = make_box_tma(SM90_TMA_LOAD_MULTICAST{}, static_cast<const T*>(p.w_gate), u, d,
                               tma_row_stride(p.u, p.w_gate_row_stride, p.d));
  args.tma_up = make_box_tma(SM90_TMA_LOAD_MULTICAST{}, static_cast<const T*>(p.w_up), u, d,
                             tma_row_stride(p.u, p.w_up_row_stride, p.d));
  args.m = m;
  args.u = u;
  args.d = d;
  args.tiles_m = (m + kSm90BlockM - 1) / kSm90BlockM;
  args.tiles_n = (u + kSm90BlockN - 1) / kSm90BlockN;
  args.pairs_m = (args.tiles_m + kClusterM - 1) / kClusterM;
  args.bias_gate = p.bias_gate;
  args.bias_up = p.bias_up;
  args.out = static_cast<T*>(p.out);
  args.out_row_stride = p.out_row_stride;
  cudaLaunchAttribute cluster_dims[1];
  cluster_dims[0].id = cudaLaunchAttributeClusterDimension;
  cluster_dims[0].val.clusterDim.x = kClusterM;
  cluster_dims[0].val.clusterDim.y = 1;
  cluster_dims[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  config.attrs = cluster_dims;
  config.numAttrs = 1;
  // Persistent clusters: as many as can be resident at once (a GPC with an odd number of free
  // SMs leaves one idle), asked of the driver once per device; never more than the tiles.
  static std::atomic<int> resident[64] = {};
  int clusters = device < 64 ? resident[device].load(std::memory_order_relaxed) : 0;
  if (clusters == 0) {
    config.gridDim = dim3(kClusterM * (sm_count / kClusterM));
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < 1) {
      (void)cudaGetLastError();  // clear it: fall back to one cluster per SM pair
      clusters = sm_count / kClusterM;
    }
    if (device < 64) resident[device].store(clusters, std::memory_order_relaxed);
  }
  const int64_t tiles = int64_t{args.pairs_m} * args.tiles_n;
  config.gridDim = dim3(kClusterM * static_cast<unsigned>(tiles < clusters ? tiles : clusters));
  err = cudaLaunchKernelEx(&config, kernel, args);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

int gated_mlp_sm90_smem_bytes() {
  static_assert(smem_bytes<Sm90Config<cute::bfloat16_t>>() == smem_bytes<Sm90Config<cute::half_t>>());
  return smem_bytes<Sm90Config<cute::bfloat16_t>>();
}

const char* gated_mlp_sm90_check(const GatedMlpParams& p) {
  if (p.m < 0 || p.m > INT_MAX) return "m (rows of x): expected 0 <= m < 2^31";
  if (p.u < 1 || p.u > INT_MAX) return "u (rows of w_gate / w_up): expected 1 <= u < 2^31";
  if (p.d < 1 || p.d > INT_MAX) return "d (x.size(1)): expected 1 <= d < 2^31";
  if (int64_t{(p.m + kSm90BlockM - 1) / kSm90BlockM} * ((p.u + kSm90BlockN - 1) / kSm90BlockN) > INT_MAX)
    return "m, u: expected fewer than 2^31 output tiles";
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype: expected float16 or bfloat16";
  if (p.activation != Activation::kSilu && p.activation != Activation::kGeluTanh) return "activation: expected silu or gelu_tanh";
  if (p.x == nullptr || p.w_gate == nullptr || p.w_up == nullptr || p.out == nullptr) return "x, w_gate, w_up, out: null pointer";
  if (!detail::aligned16(p.x)) return "x: expected a 16-byte aligned start (TMA)";
  if (!detail::aligned16(p.w_gate)) return "w_gate: expected a 16-byte aligned start (TMA)";
  if (!detail::aligned16(p.w_up)) return "w_up: expected a 16-byte aligned start (TMA)";
  // Row strides: multiples of 16 bytes below 2^40 bytes (the descriptor's limits).
  constexpr int64_t kMaxStride = (int64_t{1} << 40) / 2;
  if (p.m > 1 && (p.x_row_stride < p.d || p.x_row_stride % 8 != 0 || p.x_row_stride >= kMaxStride))
    return "x: expected a row stride >= d and a multiple of 8 elements (16 bytes, TMA)";
  if (p.u > 1 && (p.w_gate_row_stride % 8 != 0 || p.w_gate_row_stride <= 0 || p.w_gate_row_stride >= kMaxStride))
    return "w_gate: expected a positive row stride that is a multiple of 8 elements (16 bytes, TMA)";
  if (p.u > 1 && (p.w_up_row_stride % 8 != 0 || p.w_up_row_stride <= 0 || p.w_up_row_stride >= kMaxStride))
    return "w_up: expected a positive row stride that is a multiple of 8 elements (16 bytes, TMA)";
  if (p.m > 1 && p.out_row_stride < p.u) return "out: expected a row stride >= u";
  if (reinterpret_cast<uintptr_t>(p.out) % 2 != 0) return "out: expected a 2-byte aligned start";
  return nullptr;
}

cudaError_t gated_mlp_sm90_launch(const GatedMlpParams& p, int sm_count, cudaStream_t stream) {
  if (gated_mlp_sm90_check(p) != nullptr || sm_count < 1) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNoKernelImageForDevice;  // sm_90a code only
  const bool silu = p.activation == Activation::kSilu;
  constexpr int kSilu = static_cast<int>(Activation::kSilu);
  constexpr int kGelu = static_cast<int>(Activation::kGeluTanh);
  using Bf16 = Sm90Config<cute::bfloat16_t>;
  using Fp16 = Sm90Config<cute::half_t>;
  if (p.dtype == DType::kBFloat16) {
    return silu ? launch_typed<Bf16, kSilu>(p, sm_count, device, stream) : launch_typed<Bf16, kGelu>(p, sm_count, device, stream);
  }
  return silu ? launch_typed<Fp16, kSilu>(p, sm_count, device, stream) : launch_typed<Fp16, kGelu>(p, sm_count, device, stream);
}

}  // namespace gated_mlp
}  // namespace fused_llm
