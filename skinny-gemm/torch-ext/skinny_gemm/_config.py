"""The launch configurations of the skinny kernels and the default choice (plain Python: no
Triton needed, so the public functions can check a ``config`` argument on any variant):
:class:`SkinnyConfig` for the Triton kernel, :class:`TmaConfig` for the compiled Hopper one,
:class:`MmaConfig` for the compiled tensor-core GEMV."""

from __future__ import annotations

from dataclasses import dataclass

from ._triton_launch import check_config


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch of ``_skinny_gemm_kernel``: BLOCK_M tokens (1, 2: the FMA GEMV; else >= 16, the
    tl.dot tile's narrow side), BLOCK_N weight rows (>= 16 for a dot tile, its wide side; the
    GEMV takes any power of two: few rows with long K steps read each row in long runs),
    BLOCK_K columns per step, SPLIT_K slices (an upper bound: the launcher rounds the slice to
    whole steps and drops empty slices), num_warps, num_stages."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    SPLIT_K: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        check_config(self, powers_of_two={"BLOCK_M": 1, "BLOCK_N": 1, "BLOCK_K": 32, "num_warps": 1},
                     at_least={"SPLIT_K": 1, "num_stages": 1})  # fmt: skip
        if self.BLOCK_M not in (1, 2) and self.BLOCK_M < 16:
            # 4 and 8 tokens ran the GEMV 1.4-2.8x slower than cuBLAS (2304 x 16384, H200, 2026-11-28:
            # benchmarks/results/few_token_gemv_probe_*.log); the tensor cores take them.
            raise ValueError(f"SkinnyConfig.BLOCK_M: expected 1 or 2 (GEMV) or a power of two >= 16 (tl.dot), got {self.BLOCK_M}")
        if self.BLOCK_M >= 16 and self.BLOCK_N < 16:
            raise ValueError(f"SkinnyConfig.BLOCK_N: expected a power of two >= 16 with a tl.dot tile (BLOCK_M {self.BLOCK_M}), "
                             f"got {self.BLOCK_N}")  # fmt: skip

    def launch_kwargs(self) -> dict:
        return {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K,
                "num_warps": self.num_warps, "num_stages": self.num_stages}  # fmt: skip

    def as_list(self) -> list[int]:
        """The form the ops and the tuning table take (``int[] config``)."""
        return [self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.SPLIT_K, self.num_warps, self.num_stages]


# The compiled Hopper kernel's choices (csrc/skinny_tma.h): rows of W a block covers (16 a
# consumer warp), 128-byte TMA boxes of K a stage (64 16-bit or 128 FP8 columns), stages of the
# ring, K slices of a row tile (the blocks of a thread-block cluster; 0: tma_split's choice).
# Which (tile_n, boxes_k, stages) combinations a build has code for is the binding's list
# (``skinny_tma_configs``), checked when a call reaches a GPU.
TMA_TILE_N = (16, 32, 64, 128)
TMA_BOXES_K = (1, 2, 4, 8)
TMA_STAGES = range(2, 9)
TMA_SPLIT = range(0, 9)
TMA_MAX_M = 16


def tma_split(N: int, tile_n: int, sms: int) -> int:
    """The K slices a TmaConfig with split 0 takes: the most (1-8) whose blocks, ceil(N / tile_n)
    row tiles x split, fit in one block per multiprocessor (1 where the tiles alone are more).
    One block an SM at most, because the blocks stream their slices at the same rate: on an H100
    (132 SMs, 2026-11-28) 2304 x 16384 bf16 read in 27.2 us as 36 tiles x 3 slices (108 blocks)
    and in 30.0-31.8 us as 36 x 4 (144: twelve SMs ran two blocks, and the grid waited for
    them); a ring of TMA copies alone read the same bytes in 26.8-26.9 us from 108 or 132 blocks."""
    tiles = -(-N // tile_n)
    return max(1, min(8, sms // tiles))


@dataclass(frozen=True)
class TmaConfig:
    """One launch of the compiled Hopper kernel (``csrc/skinny_tma.h``: capability 9.0, fp16 /
    bf16 / e4m3fn, 1-16 tokens): the weight stream through a ring of ``stages`` shared-memory
    stages of ``tile_n`` rows x ``128 * boxes_k`` bytes of K filled by TMA, mma.sync consumers,
    each row tile cut into ``split`` K slices whose blocks form a thread-block cluster and sum
    their partials in a fixed order through distributed shared memory (always deterministic; 0:
    the split of :func:`tma_split`). Its table / op form is ``[0, tile_n, boxes_k, stages, split]`` (the 0
    where a :class:`SkinnyConfig` has BLOCK_M, which is never 0)."""

    tile_n: int = 64
    boxes_k: int = 4
    stages: int = 4
    split: int = 0

    def __post_init__(self):
        check_config(self, choices={"tile_n": TMA_TILE_N, "boxes_k": TMA_BOXES_K, "stages": TMA_STAGES,
                                    "split": TMA_SPLIT})  # fmt: skip

    def as_list(self) -> list[int]:
        """The form the ops and the tuning table take (``int[] config``)."""
        return [0, self.tile_n, self.boxes_k, self.stages, self.split]


# The compiled GEMV's choices (csrc/skinny_mma.h): groups of 8 weight rows a block, 64-byte
# chunks of K a step (32 columns of a 16-bit dtype, 64 of e4m3), warps a block (each a contiguous
# range of K's steps), shared-memory stages (0: the register loop) and K ranges a row group (a
# cluster of blocks, the staged loop on sm_90), and the row-run loop's segments (0: not it). Which
# combinations a build has code for is the binding's list (``skinny_mma_configs``), checked when a
# call reaches a GPU.
MMA_ROW_GROUPS = (1, 2)
MMA_ROW_RUNS = (1, 2, 4)  # the row-run loop's row_groups: W loads a span
MMA_UNROLL = (1, 2, 4)
MMA_WARPS = (2, 4, 8, 16)
MMA_STAGES = (0, 2, 3)
MMA_SPLIT = (1, 2, 4, 8)
MMA_MAX_M = 16
MMA_CHUNK_BYTES = 64
MMA_STAGED_UNROLL = 4  # the staged loop's step: 4 chunks (256 bytes of each of the block's rows)
MMA_SEGMENTS = (0, 2, 4, 8)
# The wgmma loop (sm_90a): segments 1 or 2, 128-byte chunks, 4 warps (a warpgroup) a K part, 3-4
# stages, a cluster of 1-4 blocks (csrc/skinny_wgmma_kernel.cuh).
MMA_WGMMA_SEGMENTS = (1, 2)
MMA_WGMMA_UNROLL = (1, 2)
MMA_WGMMA_WARPS = (4, 8)
MMA_WGMMA_STAGES = (3, 4)
MMA_WGMMA_SPLIT = (1, 2, 3, 4)


@dataclass(frozen=True)
class MmaConfig:
    """One launch of the compiled tensor-core GEMV (``csrc/skinny_mma.h``: fp16 / bf16 on
    capability >= 8.0, e4m3fn on >= 8.9; 1-16 tokens): each block multiplies ``8 * row_groups``
    weight rows by the tokens, its ``warps`` warps each taking a contiguous range of K's steps of
    ``unroll`` 64-byte chunks; the warps' tiles summed in a fixed order in shared memory. K must
    be a whole number of steps: a multiple of ``32 * unroll`` (16-bit) or ``64 * unroll`` (e4m3).

    ``stages`` 0 is the register loop: plain 16-byte loads straight into mma.sync fragments, the
    next step's in flight during this step's mmas. ``stages`` 2 or 3 is the staged loop (``unroll``
    4): W copied as 256-byte row runs into a per-warp ring of that many shared-memory stages,
    fragments read back from there; with ``split`` 2, 4 or 8 (capability 9.0) a cluster of that
    many blocks shares the block's rows, each a K range, summed in rank order. ``shared_x`` (the
    staged loop): the block's warps take ``row_groups`` groups of rows each, side by side, over the
    block's K range, and x's fragments are copied once a block into shared memory all its warps
    read (x's traffic through L2 divided by the warps; 8 tokens at 2304 x 16384 bf16: 21.1 against
    21.8 us, H200).

    ``segments`` 2, 4 or 8 is the row-run loop (stages 0, 1-8 tokens): each lane's 16-byte W load
    is the one-token GEMV's (a warp load covers 4 rows x 128, 2 x 256 or 1 x 512 contiguous bytes) and
    goes straight into mma.sync, the wanted products being the tile's segment-diagonal entries;
    ``row_groups`` (1, 2 or 4) is then the W loads a span of ``segments`` 64-byte chunks (a block
    covers ``row_groups * 8 // segments`` rows), ``unroll`` the spans a step; it takes up to
    ``32 // segments`` tokens (:attr:`max_m`). At 2304 x 16384 bf16 on an H200, in a layer: 19.1 /
    19.8 / 19.9 us at 2 / 4 / 8 tokens against cuBLAS's 23.5 / 23.7 / 24.3.

    ``wgmma`` (capability 9.0, 1-16 tokens) is the wgmma loop: W and x both copied by 16-byte
    cp.async into 128-byte-swizzled shared memory, wgmma's A rows (weight row, segment) pairs
    (``segments`` 1 or 2: a block covers ``64 // segments`` rows), its B columns (segment, token):
    x read once a warpgroup. ``unroll`` (1, 2): 128-byte chunks of each segment a step; ``warps``
    4 or 8: one or two warpgroups a block, each a K range; ``stages`` 3 or 4; ``split`` 1-4: a
    cluster of blocks splitting K, summed in rank order; FP8 products summed in fp32 (wgmma's e4m3
    accumulation promoted every 64 values). At 2304 x 16384 and 16 tokens on an H200, in a layer:
    21.6 us bf16, 13.2 per-tensor FP8 (cuBLAS 24.7 / 15.9).

    Its table / op form is ``[-1, row_groups, unroll, warps]`` (register loop),
    ``[-1, row_groups, unroll, warps, stages, split]`` or, shared x, ``[..., split, 1]``, the
    row-run loop ``[-1, row_groups, unroll, warps, 0, 1, 0, segments]`` and the wgmma loop
    ``[-1, 1, unroll, warps, stages, split, 0, segments, 1]``."""

    row_groups: int = 1
    unroll: int = 2
    warps: int = 8
    stages: int = 0
    split: int = 1
    shared_x: bool = False
    segments: int = 0
    wgmma: bool = False

    def __post_init__(self):
        if self.wgmma:
            check_config(self, choices={"row_groups": (1,), "unroll": MMA_WGMMA_UNROLL, "warps": MMA_WGMMA_WARPS,
                                        "stages": MMA_WGMMA_STAGES, "split": MMA_WGMMA_SPLIT,
                                        "segments": MMA_WGMMA_SEGMENTS},
                         flags=("shared_x", "wgmma"))  # fmt: skip
            if self.shared_x:
                raise ValueError("MmaConfig.shared_x: the wgmma loop shares x through its own stages, got shared_x True")
            return
        check_config(self, choices={"segments": MMA_SEGMENTS,
                                    "row_groups": MMA_ROW_RUNS if self.segments else MMA_ROW_GROUPS,
                                    "unroll": MMA_UNROLL, "warps": MMA_WARPS, "stages": MMA_STAGES, "split": MMA_SPLIT},
                     flags=("shared_x", "wgmma"))  # fmt: skip
        if self.segments and (self.stages or self.split != 1 or self.shared_x):
            raise ValueError(f"MmaConfig.segments: the row-run loop ({self.segments} segments) takes stages 0, split 1 and "
                             f"shared_x False, got stages {self.stages}, split {self.split}, shared_x {self.shared_x}")  # fmt: skip
        if self.stages and self.unroll != MMA_STAGED_UNROLL:
            raise ValueError(f"MmaConfig.stages: the staged loop ({self.stages} stages) takes unroll {MMA_STAGED_UNROLL} "
                             f"(256-byte steps), got unroll {self.unroll}")  # fmt: skip
        if self.split > 1 and not self.stages:
            raise ValueError(f"MmaConfig.split: a K split ({self.split}) is the staged loop's (stages 2 or 3), got stages 0")
        if self.shared_x and not self.stages:
            raise ValueError("MmaConfig.shared_x: x shared by a block's warps is the staged loop's (stages 2 or 3), got stages 0")

    def as_list(self) -> list[int]:
        """The form the ops and the tuning table take (``int[] config``)."""
        head = [-1, self.row_groups, self.unroll, self.warps]
        if self.wgmma:
            return [*head, self.stages, self.split, 0, self.segments, 1]
        if self.segments:
            return [*head, 0, 1, 0, self.segments]
        if not self.stages:
            return head
        return [*head, self.stages, self.split, 1] if self.shared_x else [*head, self.stages, self.split]

    def op_args(self) -> tuple[int, int, int, int, int, int, int, int]:
        """The ops' (row_groups, unroll, warps, stages, split, shared_x, segments, wgmma) arguments."""
        return (self.row_groups, self.unroll, self.warps, self.stages, self.split, int(self.shared_x), self.segments,
                int(self.wgmma))

    def step_k(self, elem_bytes: int) -> int:
        """K columns of one step (K must be a multiple of it) for inputs of ``elem_bytes``."""
        chunk = 2 * MMA_CHUNK_BYTES if self.wgmma else MMA_CHUNK_BYTES  # the wgmma loop's chunks: 128 bytes
        return chunk // elem_bytes * self.unroll * max(1, self.segments)

    @property
    def max_m(self) -> int:
        """The most tokens the launch takes: 16, or two token tiles of the row-run loop."""
        return 32 // self.segments if self.segments and not self.wgmma else MMA_MAX_M


def config_from_list(fields) -> SkinnyConfig | TmaConfig | MmaConfig:
    """An ``int[] config`` (an op argument, a table entry) as its configuration: six ints a
    :class:`SkinnyConfig`, ``[0, ...]`` with four more a :class:`TmaConfig`, ``[-1, ...]`` with
    three, five, six (the last ``shared_x``, 0 or 1), seven (then ``segments``) or eight (then ``wgmma``,
    0 or 1) more an :class:`MmaConfig`."""
    fields = [int(f) for f in fields]
    if len(fields) == 5 and fields[0] == 0:
        return TmaConfig(*fields[1:])
    if len(fields) in (4, 6) and fields[0] == -1:
        return MmaConfig(*fields[1:])
    if len(fields) == 7 and fields[0] == -1 and fields[6] in (0, 1):
        return MmaConfig(*fields[1:6], shared_x=bool(fields[6]))
    if len(fields) == 8 and fields[0] == -1 and fields[6] in (0, 1):
        return MmaConfig(*fields[1:6], shared_x=bool(fields[6]), segments=fields[7])
    if len(fields) == 9 and fields[0] == -1 and fields[6] in (0, 1) and fields[8] in (0, 1):
        return MmaConfig(*fields[1:6], shared_x=bool(fields[6]), segments=fields[7], wgmma=bool(fields[8]))
    if len(fields) != 6:
        raise ValueError(f"config: expected 6 ints (SkinnyConfig), [0, tile_n, boxes_k, stages, split] "
                         f"(TmaConfig) or [-1, row_groups, unroll, warps(, stages, split(, shared_x(, segments(, wgmma))))] (MmaConfig), "
                         f"got {fields}")  # fmt: skip
    return SkinnyConfig(*fields)


def skinny_config(M: int, N: int, K: int, elem_bytes: int, sms: int = 132, hip: bool = False) -> SkinnyConfig:
    """The default configuration (no autotuning: deterministic, and cheap in the interpreter).

    Defaults for shapes the tuning table (``benchmarks/tune.py``) does not list, from the H100
    sweeps at 2304 x 16384 (2026-11-24), each derived as follows.

    * M = 1, 16-bit on CUDA: the FMA GEMV on 4 weight rows a program, K steps of 8 KiB (half
      that where it divides K and 8 KiB does not: 2048 columns at K = 14336, as the tuner
      picked), 8 warps, no K split, where N / 4 programs give every SM two (N >= 1056 on an
      H100; below that the dot tile and its K split below). The tuner kept a few-row GEMV at
      M = 1 on all eleven bf16 shapes of the issue (1.04-1.24x cuBLAS, where the 16-row dot
      tile had been 0.93-1.00x; H100, 2026-11-24), mostly this one. Stages do not matter to it (Triton does not pipeline
      these loads: 128 bytes of shared memory at 3 stages; 2 and 3 measured the same). FP8
      keeps the dot tile below: the few-row GEMV won 5 of its 11 shapes.
    * BLOCK_M: the smallest tl.dot tile (16, 32, 64) holding M (FP8 and gfx942 also at M = 1);
      above 64 tokens, 64-row tiles (the kernel is not meant for prefill, but any M works).
    * BLOCK_N = 64 weight rows: wgmma's M; with 16 tokens the fp32 accumulator is 8 registers
      per thread at 4 warps.
    * BLOCK_K: 256 bytes of each weight row per step (128 16-bit or 256 FP8 elements); on gfx942
      128 bytes and 2 stages, so the 64-token tile (x and W, 2 buffers) fits 64 KiB of LDS.
    * SPLIT_K: about 2 programs per SM with 4 stages (the sweeps' winners had 0.8-2 per SM;
      more slices cost partial-tile traffic: 4 per SM was 2-10% slower), at most one slice
      per K step.
    """
    if M == 1 and elem_bytes == 2 and not hip and _cdiv(N, 4) >= 2 * sms:
        block_k = _pow2_floor(min(8192 // elem_bytes, K))
        if K % block_k and (K & -K) >= block_k // 2:
            block_k //= 2  # whole steps where half the step divides K
        return SkinnyConfig(1, 4, max(32, block_k), 1, num_warps=8, num_stages=2)
    block_m = min(64, max(16, _next_pow2(M)))
    block_k = max(32, (128 if hip else 256) // elem_bytes)
    block_n = 64
    tiles = _cdiv(N, block_n) * _cdiv(M, block_m)
    steps = _cdiv(K, block_k)
    split = max(1, min(_cdiv(2 * sms, tiles), steps))
    return SkinnyConfig(block_m, block_n, block_k, split, num_warps=4, num_stages=2 if hip else 4)
