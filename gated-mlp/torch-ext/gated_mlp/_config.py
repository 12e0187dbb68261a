"""Launch configuration of gated-mlp's Triton kernel: a frozen dataclass (its meta-parameters,
num_warps and num_stages, under the kernel's own names) and the function that picks it by shape
and GPU, with the measurements behind the choice. No autotuning: the picks are deterministic,
and cheap in Triton's interpreter.

The GPU enters as ``sms`` (its SM / CU count: 108 on an A100, 132 on an H100 / H200, 304 on an
MI300X) and ``tma``: Hopper's copy engine (CUDA sm90 with 16-byte aligned operands, the
launcher's `_tma_capable`); sm80 and gfx942 take the pointer-load tiles.

Override rule (both Triton packages; see ``_triton_launch``): the launcher's ``cfg``, when
given, replaces the picked configuration whole, nothing merged in; ``dataclasses.replace(picked,
FIELD=value)`` changes fields of a picked one. Fields are checked when a configuration is made.
The launcher picks once per launch plan (the picker is cached as well).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from ._triton_launch import MAX_PLANS, check_config

# The minimum of a tl.dot operand dimension.
_DOT_MIN = 16


@dataclass(frozen=True)
class GatedMlpConfig:
    """`_gated_mlp_kernel`: output tiles of BLOCK_M tokens x BLOCK_N columns (two accumulators,
    gate and up), K steps of BLOCK_K, GROUP_M row tiles per column sweep. SWAP_AB: W @ x^T
    accumulators (W's rows on the MMA's 64-row side, the tokens on its narrow side). SPLIT_K > 1:
    the tiles from N_FULL on are split over K, SPLIT_K programs each (the launcher drops empty
    splits; N_FULL 0: every tile). USE_TMA: x and W through TMA (None: the launcher decides
    with `_tma_capable`). N_FULL is a kernel argument, not a meta-parameter."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 1
    SPLIT_K: int = 1
    N_FULL: int = 0
    SWAP_AB: bool = False
    USE_TMA: bool | None = None
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        check_config(
            self, powers_of_two={"BLOCK_M": _DOT_MIN, "BLOCK_N": _DOT_MIN, "BLOCK_K": _DOT_MIN, "num_warps": 1},
            at_least={"GROUP_M": 1, "SPLIT_K": 1, "N_FULL": 0, "num_stages": 1}, flags=("SWAP_AB", "USE_TMA"),
            optional=("USE_TMA",),
        )  # fmt: skip

    def launch_kwargs(self) -> dict:
        """The keywords of the kernel launch (USE_TMA decided)."""
        return {"BLOCK_M": self.BLOCK_M, "BLOCK_N": self.BLOCK_N, "BLOCK_K": self.BLOCK_K, "GROUP_M": self.GROUP_M,
                "SPLIT_K": self.SPLIT_K, "SWAP_AB": self.SWAP_AB, "USE_TMA": self.USE_TMA, "num_warps": self.num_warps,
                "num_stages": self.num_stages}  # fmt: skip


@functools.lru_cache(maxsize=MAX_PLANS)
def gated_mlp_config(M: int, N: int, K: int, sms: int = 132, tma: bool = True, fp8: bool = False) -> GatedMlpConfig:
    """Tile shape, K split and pipelining for x [M, K] and W_gate / W_up [N, K] by token count
    (``fp8``: 1-byte operands): the best of `benchmarks/tune.py`'s sweeps, Llama 3 MLP shapes
    (cuBLAS + Liger in the same run):
    * M <= 64 with TMA: W @ x^T tiles, 64 W rows x 16 or 64 tokens, K steps of 256 bytes (see
      the comment below; H100 `tune.py --decode`); the earlier x @ W^T 64 x 128 tiles (rows
      past M zero-filled by the copy engine) were 4-9% slower there (FP8: 26%);
    * M <= 64 without TMA: 16 x 128 (64 x 64 past 16 tokens) tiles with pointer loads
      (mma.sync), within 3% of those earlier TMA tiles on an H200;
    * prefill: 128 x (128 + 128) TMA tiles, 8 warps (two accumulators = the unfused GEMM's
      128 x 256 tile), 16 row tiles per column sweep: 1.04x / 1.01x cuBLAS + Liger at 1024 /
      4096 tokens (0.99x / 0.94x cuBLAS alone); 64-wide or 4-warp tiles were 4-20% slower,
      GROUP_M 8 1-4% slower, a persistent TMA kernel (with or without Triton's warp
      specialization; removed) 13-20% slower, a TMA-store epilogue (registers -> shared
      memory -> bulk copy; removed) 0-17% slower on an H100 (8B 1024 / 16384 tokens: 426 / 6651
      us against 355 / 5689, bit-identical results); 3 vs 4 stages differ by less than the run-to-run spread (~5%).
    A K split (W's read spread over more programs) lost at these sizes (112+ tiles already
    cover the GPU), so it is used only when the tiles cover less than half of the SMs."""
    swap = False
    if M <= 64:
        block_m, group, warps = (16 if M <= 16 else 64), 1, 4
        if not tma:
            block_n, block_k, stages = 128, 64, 4
        else:
            # W @ x^T tiles (SWAP_AB): 64 W rows per wgmma, the tokens on its narrow side, and
            # K steps of 256 bytes. `tune.py --decode` on an H100 against the x W^T 64 x 128 x 64
            # tiles used before: 8B 80.0 / 81.0 / 83.8 us at M = 1 / 16 / 64 (was 87.9 / 86.0 /
            # 87.4; cuBLAS alone 81.4 / 83.0 / 87.5), 70B M = 1 309 us (328; cuBLAS 337), 405B
            # 1133 us (1223; cuBLAS 1189); FP8 8B M = 1 43.0 us (54.3; _scaled_mm 42.2).
            block_n, swap = 64, True
            block_k, stages = (256, 2) if fp8 else (128, 5 if M <= 16 else 4)
    else:
        block_m, block_n, block_k, group, warps = 128, 128, 64, 16, 8
        stages = 4 if M <= 2048 else 3
    if not tma and M > 16:
        block_n = 64  # pointer loads (sm80, gfx942): the register-staged tiles are smaller
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    split, full = 1, 0
    if 2 * tiles < sms:
        split = max(1, min(triton.cdiv(sms, tiles), triton.cdiv(K, block_k) // 2, 8))
    elif tiles > sms and block_m == 128 and tma and not fp8:  # measured in bf16 only
        # Split only the last, partial wave (one 128 x (128 + 128) tile per SM): its tiles
        # split SPLIT_K ways over K take 1 / SPLIT_K of a wave instead of a whole one. E.g.
        # 70B at 256 tokens: 448 tiles = 3 waves of 132 + 52, the 52 split 2 ways: 3.5 tile
        # times instead of 4.
        rest = tiles % sms
        if rest:
            tail_split = min(sms // rest, 4, triton.cdiv(K, block_k) // 2)
            if tail_split >= 2:
                split, full = tail_split, tiles - rest
    if fp8 and tma and M > 64:  # 1-byte elements: a 128-wide K step keeps the copies 128 bytes wide
        block_k = 128  # (after the split above, which counted 64-wide K steps)
    return GatedMlpConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group, SPLIT_K=split, N_FULL=full,
                          SWAP_AB=swap, USE_TMA=tma, num_warps=warps, num_stages=stages)  # fmt: skip
