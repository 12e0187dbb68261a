// gated-mlp's sm80 kernel in CuTe: act(x W_gate^T + b_g) * (x W_up^T + b_u), one GEMM with a
// dual accumulator. Framework-free (raw pointers, sizes, strides, a cudaStream_t in; a
// cudaError_t out). CUDA only: listed in the cuda [kernel.*] section alone (never hipified);
// ROCm runs the package's Triton kernel.
//
// The issue's seed interleaved gate and up columns of W so that each thread's mma.sync
// fragment held (gate, up) pairs. The same effect, without reordering the weight: each CTA
// loads an x tile once and multiplies it by a W_gate tile and a W_up tile into two fp32
// accumulators with identical layouts (same TiledMMA, same partition), so element i of one
// and element i of the other are the same (row, column) and the epilogue is elementwise.
//
// Structure (the standard CuTe sm80 GEMM, cf. cutlass/examples/cute/tutorial/sgemm_sm80.cu):
//   * CTA tile 128 (M) x 128 (U) x 32 (K); 256 threads = 8 warps laid out 2 (M) x 4 (U) over
//     SM80_16x8x16 F32 += BF16/F16 MMA atoms, permuted to 32 x 64 x 16 so each warp covers
//     16 x 16 per atom group (one LDSM.x4 per B operand and K step). Each warp thus owns a
//     64 x 32 block of each accumulator: 2 x 64 fp32 accumulator registers per thread, the
//     register budget of CUTLASS's 128 x 256 sm80 tile (64 x 64 per warp).
//   * K loop: 4-stage cp.async pipeline (16-byte SM80_CP_ASYNC_CACHEGLOBAL vectors: weights
//     and x are streamed, L1 would only be polluted), one stage = x 128 x 32 + W_gate 128 x 32
//     + W_up 128 x 32 bf16/fp16 = 24 KiB, 96 KiB in all: under the 99 KiB an sm86 / sm89
//     block may opt into (A100 has 163 KiB; 4 stages rather than 3 because 1 CTA per SM is
//     what the registers allow anyway). smem -> registers by ldmatrix (SM75_U32x4_LDSM_N) from
//     Swizzle<2,3,3> layouts (8 x 32 atoms, K-major: conflict-free LDSM and 16-byte stores),
//     double-buffered in registers across the two 16-wide K blocks of a stage.
//   * Tails: rows past M (x) or U (W), and K vectors past D, are not loaded: their smem
//     vectors are zero-filled with ordinary stores instead, so no out-of-bounds address is
//     ever formed or read (D % 8 == 0, so a 16-byte vector is entirely in or out). The
//     epilogue stores only rows < M and columns < U.
//   * Epilogue in registers: y = act(acc_g + b_g) * (acc_u + b_u) in fp32, one rounding to
//     T, stored straight from the accumulator layout (two adjacent columns per 32-bit store
//     when aligned). No split-K, no grouped tile order, no smem-staged epilogue: this is the
//     issue's sm80 path, checked for correctness; it has not been tuned on an sm80 GPU.
//
// Grid: x = row tiles (fastest: the CTAs in flight share W tiles, which is the large operand
// at inference sizes), y = column tiles (at most 65535, so U <= 65535 * 128).

#include "gated_mlp_sm80.h"

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>

#include "gated_mlp_common.cuh"

namespace fused_llm {
namespace gated_mlp {
namespace {

using namespace cute;

template <class T>
struct MmaAtomFor;
template <>
struct MmaAtomFor<cute::bfloat16_t> {
  using type = SM80_16x8x16_F32BF16BF16F32_TN;
};
template <>
struct MmaAtomFor<cute::half_t> {
  using type = SM80_16x8x16_F32F16F16F32_TN;
};

template <class T>
struct Sm80Config {
  using Element = T;
  using BlockM = Int<kSm80BlockM>;
  using BlockN = Int<kSm80BlockN>;
  using BlockK = Int<kSm80BlockK>;
  using Stages = Int<kSm80Stages>;
  static constexpr int kThreads = kSm80Threads;

  // 8 rows x 32 K elements (64 bytes per row), swizzled: the 16-byte chunk index (bits 3-4 of
  // the element offset) is XORed with the row pair (bits 6-7), so the 8 rows an LDSM phase
  // reads fall in distinct banks.
  using SmemLayoutAtom = decltype(composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, BlockK>, Stride<BlockK, _1>>{}));
  using SmemLayoutA = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlockM, BlockK, Stages>{}));
  using SmemLayoutB = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlockN, BlockK, Stages>{}));

  using TiledMma = decltype(make_tiled_mma(typename MmaAtomFor<T>::type{}, Layout<Shape<_2, _4, _1>>{},
                                           Tile<_32, _64, _16>{}));

  // 256 threads as 64 rows x 4 vectors of 8 elements (one 32-wide K step of a row = 64 bytes):
  // a 128-row tile takes two passes per thread.
  using GmemCopy = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, T>{},
                                            Layout<Shape<_64, _4>, Stride<_4, _1>>{},
                                            Layout<Shape<_1, _8>>{}));
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, T>;
};

template <class Cfg>
struct SharedStorage {
  using T = typename Cfg::Element;
  cute::array_aligned<T, cute::cosize_v<typename Cfg::SmemLayoutA>, 128> a;
  cute::array_aligned<T, cute::cosize_v<typename Cfg::SmemLayoutB>, 128> b_gate;
  cute::array_aligned<T, cute::cosize_v<typename Cfg::SmemLayoutB>, 128> b_up;
};

template <class Cfg, int kAct>
__global__ void __launch_bounds__(Cfg::kThreads, 1) gated_mlp_sm80_kernel(const GatedMlpParams p) {
  using T = typename Cfg::Element;
  using BlockM = typename Cfg::BlockM;
  using BlockN = typename Cfg::BlockN;
  using BlockK = typename Cfg::BlockK;
  constexpr int kStages = Cfg::Stages::value;

  extern __shared__ __align__(128) uint128_t smem_raw[];  // SharedStorage: 128-byte aligned members
  auto& smem = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw);

  const int M = static_cast<int>(p.m);
  const int N = static_cast<int>(p.u);
  const int K = static_cast<int>(p.d);
  const int m0 = static_cast<int>(blockIdx.x) * BlockM::value;
  const int n0 = static_cast<int>(blockIdx.y) * BlockN::value;
  const int m_left = M - m0;  // rows of this tile that exist (> 0)
  const int n_left = N - n0;  // columns of this tile that exist (> 0)
  const int k_tiles = (K + BlockK::value - 1) / BlockK::value;

  // This CTA's operand tiles, (BLK, BLK_K, k_tile). Coordinates past M, U or D are never
  // dereferenced (see load_tile).
  const T* x = static_cast<const T*>(p.x) + static_cast<int64_t>(m0) * p.x_row_stride;
  const T* wg = static_cast<const T*>(p.w_gate) + static_cast<int64_t>(n0) * p.w_gate_row_stride;
  const T* wu = static_cast<const T*>(p.w_up) + static_cast<int64_t>(n0) * p.w_up_row_stride;
  Tensor gA = make_tensor(make_gmem_ptr(x), make_shape(BlockM{}, BlockK{}, k_tiles),
                          make_stride(p.x_row_stride, _1{}, BlockK{}));
  Tensor gBg = make_tensor(make_gmem_ptr(wg), make_shape(BlockN{}, BlockK{}, k_tiles),
                           make_stride(p.w_gate_row_stride, _1{}, BlockK{}));
  Tensor gBu = make_tensor(make_gmem_ptr(wu), make_shape(BlockN{}, BlockK{}, k_tiles),
                           make_stride(p.w_up_row_stride, _1{}, BlockK{}));

  Tensor sA = make_tensor(make_smem_ptr(smem.a.data()), typename Cfg::SmemLayoutA{});        // (BLK_M, BLK_K, PIPE)
  Tensor sBg = make_tensor(make_smem_ptr(smem.b_gate.data()), typename Cfg::SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
  Tensor sBu = make_tensor(make_smem_ptr(smem.b_up.data()), typename Cfg::SmemLayoutB{});

  // ---- global -> shared (cp.async), predicated per 16-byte vector -------------------------
  typename Cfg::GmemCopy gmem_copy;
  auto thr_copy = gmem_copy.get_slice(threadIdx.x);
  Tensor tAgA = thr_copy.partition_S(gA);     // (CPY, CPY_M, CPY_K, k)
  Tensor tAsA = thr_copy.partition_D(sA);     // (CPY, CPY_M, CPY_K, PIPE)
  Tensor tBgBg = thr_copy.partition_S(gBg);   // (CPY, CPY_N, CPY_K, k)
  Tensor tBsBg = thr_copy.partition_D(sBg);   // (CPY, CPY_N, CPY_K, PIPE)
  Tensor tBgBu = thr_copy.partition_S(gBu);
  Tensor tBsBu = thr_copy.partition_D(sBu);
  // (row, k) of each vector within a tile; A and B tiles have the same shape and partition.
  static_assert(BlockM::value == BlockN::value, "A and B tiles share one copy partition");
  Tensor tAc = thr_copy.partition_S(make_identity_tensor(make_shape(BlockM{}, BlockK{})));  // (CPY, CPY_M, CPY_K)

  auto load_tile = [&](int k_tile, int stage) {
    const int k_left = K - k_tile * BlockK::value;
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tAsA); ++i) {
      const int row = get<0>(tAc(0, i, 0));
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tAsA); ++j) {
        const bool k_in = get<1>(tAc(0, i, j)) < k_left;
        if (k_in && row < m_left) {
          copy(gmem_copy, tAgA(_, i, j, k_tile), tAsA(_, i, j, stage));
        } else {
          clear(tAsA(_, i, j, stage));
        }
        if (k_in && row < n_left) {
          copy(gmem_copy, tBgBg(_, i, j, k_tile), tBsBg(_, i, j, stage));
          copy(gmem_copy, tBgBu(_, i, j, k_tile), tBsBu(_, i, j, stage));
        } else {
          clear(tBsBg(_, i, j, stage));
          clear(tBsBu(_, i, j, stage));
        }
      }
    }
  };

  // ---- MMA partitions, shared -> registers (ldmatrix) ------------------------------------
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));    // (MMA, MMA_M, MMA_K)
  Tensor tCrBg = thr_mma.partition_fragment_B(sBg(_, _, 0));  // (MMA, MMA_N, MMA_K)
  Tensor tCrBu = thr_mma.partition_fragment_B(sBu(_, _, 0));
  Tensor acc_g = partition_fragment_C(mma, Shape<BlockM, BlockN>{});  // (MMA, MMA_M, MMA_N) fp32
  Tensor acc_u = partition_fragment_C(mma, Shape<BlockM, BlockN>{});  // same layout as acc_g
  clear(acc_g);
  clear(acc_u);

  auto s2r_copy_a = make_tiled_copy_A(typename Cfg::SmemCopyAtom{}, mma);
  auto s2r_thr_a = s2r_copy_a.get_slice(threadIdx.x);
  Tensor tXsA = s2r_thr_a.partition_S(sA);  // (CPY, MMA_M, MMA_K, PIPE)
  Tensor tXrA = s2r_thr_a.retile_D(tCrA);   // (CPY, MMA_M, MMA_K)
  auto s2r_copy_b = make_tiled_copy_B(typename Cfg::SmemCopyAtom{}, mma);
  auto s2r_thr_b = s2r_copy_b.get_slice(threadIdx.x);
  Tensor tXsBg = s2r_thr_b.partition_S(sBg);  // (CPY, MMA_N, MMA_K, PIPE)
  Tensor tXrBg = s2r_thr_b.retile_D(tCrBg);   // (CPY, MMA_N, MMA_K)
  Tensor tXsBu = s2r_thr_b.partition_S(sBu);
  Tensor tXrBu = s2r_thr_b.retile_D(tCrBu);

  constexpr int kBlocks = decltype(size<2>(tCrA))::value;  // 16-wide K blocks per stage: 2
  static_assert(kBlocks == decltype(size<2>(tXrA))::value, "ldmatrix and MMA disagree on K blocks");

  auto load_regs = [&](int stage, auto k_block) {
    copy(s2r_copy_a, tXsA(_, _, k_block, stage), tXrA(_, _, k_block));
    copy(s2r_copy_b, tXsBg(_, _, k_block, stage), tXrBg(_, _, k_block));
    copy(s2r_copy_b, tXsBu(_, _, k_block, stage), tXrBu(_, _, k_block));
  };

  // ---- pipelined main loop --------------------------------------------------------------
  // Tile t lives in stage t % kStages. Every iteration commits one cp.async group (empty past
  // the last tile), so "all but the newest kStages - 2 groups complete" always means "the
  // next tile has landed".
  int k_tile_next = 0;
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (k_tile_next < k_tiles) load_tile(k_tile_next, s);
    cp_async_fence();
    ++k_tile_next;
  }
  int read_stage = 0;
  int write_stage = kStages - 1;

  cp_async_wait<kStages - 2>();
  __syncthreads();
  load_regs(read_stage, Int<0>{});

  CUTE_NO_UNROLL
  for (int t = 0; t < k_tiles; ++t) {
    CUTE_UNROLL
    for (int kb = 0; kb < kBlocks; ++kb) {
      if (kb == kBlocks - 1) {
        // The stage of tile t + 1 (read_stage was advanced at kb == 0). The barrier also
        // orders every thread's reads of the stage tile t used before the next iteration's
        // cp.async overwrites it.
        if (t + 1 < k_tiles) {
          cp_async_wait<kStages - 2>();
          __syncthreads();
          load_regs(read_stage, Int<0>{});
        }
      } else {
        load_regs(read_stage, kb + 1);
      }
      if (kb == 0) {
        // Refill the stage tile t - 1 used (all reads of it precede the barrier above, in
        // iteration t - 1).
        if (k_tile_next < k_tiles) load_tile(k_tile_next, write_stage);
        cp_async_fence();
        ++k_tile_next;
        write_stage = read_stage;
        read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
      }
      gemm(mma, tCrA(_, _, kb), tCrBg(_, _, kb), acc_g);
      gemm(mma, tCrA(_, _, kb), tCrBu(_, _, kb), acc_u);
    }
  }

  // ---- epilogue: act(g + b_g) * (u + b_u), one rounding, straight from registers ----------
  Tensor tCc = thr_mma.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{}));  // (MMA, MMA_M, MMA_N) -> (row, col)
  static_assert(decltype(size(acc_g))::value % 2 == 0, "accumulator values come in column pairs");
  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(m0) * p.out_row_stride + n0;
  const float* bias_g = p.bias_gate == nullptr ? nullptr : p.bias_gate + n0;
  const float* bias_u = p.bias_up == nullptr ? nullptr : p.bias_up + n0;
  const bool pair_stores = p.out_row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(p.out) % 4 == 0;
  auto value = [&](int i, int col) {
    const float g = acc_g(i) + (bias_g != nullptr ? bias_g[col] : 0.0f);
    const float u = acc_u(i) + (bias_u != nullptr ? bias_u[col] : 0.0f);
    return detail::gate_act<kAct>(g) * u;
  };
  CUTE_UNROLL
  for (int i = 0; i < size(acc_g); i += 2) {
    // Values 2j and 2j + 1 of an SM80 16x8 accumulator are columns c and c + 1 of one row:
    // one 32-bit store when both exist and the address allows it.
    const int r0 = get<0>(tCc(i)), c0 = get<1>(tCc(i));
    const int r1 = get<0>(tCc(i + 1)), c1 = get<1>(tCc(i + 1));
    const bool ok0 = r0 < m_left && c0 < n_left;
    const bool ok1 = r1 < m_left && c1 < n_left;
    if (ok0 && ok1 && pair_stores && r1 == r0 && c1 == c0 + 1 && c0 % 2 == 0) {
      *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(r0) * p.out_row_stride + c0) =
          detail::pack2<T>(value(i, c0), value(i + 1, c1));
    } else {
      if (ok0) out[static_cast<int64_t>(r0) * p.out_row_stride + c0] = T(value(i, c0));
      if (ok1) out[static_cast<int64_t>(r1) * p.out_row_stride + c1] = T(value(i + 1, c1));
    }
  }
}

template <class Cfg, int kAct>
cudaError_t launch_typed(const GatedMlpParams& p, cudaStream_t stream) {
  auto kernel = gated_mlp_sm80_kernel<Cfg, kAct>;
  constexpr int kSmem = static_cast<int>(sizeof(SharedStorage<Cfg>));
  static std::atomic<int> opted_in[64];  // per kernel instantiation, per device
  if (const cudaError_t err = opt_in_dynamic_smem(opted_in, kernel, kSmem); err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.m + kSm80BlockM - 1) / kSm80BlockM),
                  static_cast<unsigned>((p.u + kSm80BlockN - 1) / kSm80BlockN));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

int gated_mlp_sm80_smem_bytes() {
  static_assert(sizeof(SharedStorage<Sm80Config<cute::bfloat16_t>>) == sizeof(SharedStorage<Sm80Config<cute::half_t>>));
  return static_cast<int>(sizeof(SharedStorage<Sm80Config<cute::bfloat16_t>>));
}

const char* gated_mlp_sm80_check(const GatedMlpParams& p) {
  if (p.m < 0 || p.m > INT_MAX) return "m (rows of x): expected 0 <= m < 2^31";
  if (p.u < 1 || p.u > int64_t{65535} * kSm80BlockN) return "u (rows of w_gate / w_up): expected 1 <= u <= 65535 * 128";
  if (p.d < 8 || p.d % 8 != 0 || p.d > INT_MAX) return "d (x.size(1)): expected a positive multiple of 8 (16-byte vectors)";
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype: expected float16 or bfloat16";
  if (p.activation != Activation::kSilu && p.activation != Activation::kGeluTanh) return "activation: expected silu or gelu_tanh";
  if (p.x == nullptr || p.w_gate == nullptr || p.w_up == nullptr || p.out == nullptr) return "x, w_gate, w_up, out: null pointer";
  if (!detail::aligned16(p.x)) return "x: expected a 16-byte aligned start";
  if (!detail::aligned16(p.w_gate)) return "w_gate: expected a 16-byte aligned start";
  if (!detail::aligned16(p.w_up)) return "w_up: expected a 16-byte aligned start";
  if (p.m > 1 && (p.x_row_stride < p.d || p.x_row_stride % 8 != 0)) return "x: expected a row stride >= d and a multiple of 8 elements";
  if (p.u > 1 && p.w_gate_row_stride % 8 != 0) return "w_gate: expected a row stride that is a multiple of 8 elements";
  if (p.u > 1 && p.w_up_row_stride % 8 != 0) return "w_up: expected a row stride that is a multiple of 8 elements";
  if (p.m > 1 && p.out_row_stride < p.u) return "out: expected a row stride >= u";
  if (reinterpret_cast<uintptr_t>(p.out) % 2 != 0) return "out: expected a 2-byte aligned start";
  return nullptr;
}

cudaError_t gated_mlp_sm80_launch(const GatedMlpParams& p, cudaStream_t stream) {
  if (gated_mlp_sm80_check(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  const bool silu = p.activation == Activation::kSilu;
  constexpr int kSilu = static_cast<int>(Activation::kSilu);
  constexpr int kGelu = static_cast<int>(Activation::kGeluTanh);
  using Bf16 = Sm80Config<cute::bfloat16_t>;
  using Fp16 = Sm80Config<cute::half_t>;
  if (p.dtype == DType::kBFloat16) {
    return silu ? launch_typed<Bf16, kSilu>(p, stream) : launch_typed<Bf16, kGelu>(p, stream);
  }
  return silu ? launch_typed<Fp16, kSilu>(p, stream) : launch_typed<Fp16, kGelu>(p, stream);
}

}  // namespace gated_mlp
}  // namespace fused_llm
