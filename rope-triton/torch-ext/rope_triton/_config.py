"""Launch configurations of rope-triton's Triton kernels: one frozen dataclass per kernel (its
meta-parameters, num_warps and num_stages, under the kernel's own names) and one function per
kernel that picks it by shape and GPU, with the measurements behind the choice. No autotuning:
the picks are deterministic, and cheap in Triton's interpreter.

* `RopeConfig` for `_rope_kernel`, picked by `rope_config`.
* `RmsMatmulRopeConfig` (`_rms_matmul_rope_kernel`: half-head tiles, optionally split over K),
  `RmsMatmulRopeHeadsConfig` (`_rms_matmul_rope_heads_kernel`: whole-head tiles) and
  `RmsMatmulRopePersistentConfig` (`_rms_matmul_rope_persistent_kernel`): the fused
  projection's kernels, one of which `rms_matmul_rope_config` picks.

The GPU enters as ``tma``: Hopper's copy engine (CUDA sm90 with 16-byte aligned operands, the
launcher's `_use_tma`); sm80 and gfx942 take the pointer-load configurations.

Override rule (both Triton packages; see ``_triton_launch``): a launcher's ``cfg``, when given,
replaces the picked configuration whole, nothing merged in; ``dataclasses.replace(picked,
FIELD=value)`` changes fields of a picked one. Fields are checked when a configuration is made.
The launchers pick once per launch plan; the pickers are cached (the projection has no plans).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import triton

from ._triton_launch import MAX_PLANS, check_config

# ---------------------------------------------------------------------------------------------
# Rotary embedding
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    """`_rope_kernel`: BLOCK_S tokens x BLOCK_HQ q heads (or BLOCK_HK kv heads) per program;
    COS_FIRST: cos / sin read before the q / k loads are issued, not after. No num_stages: the
    kernel has no loop to pipeline."""

    BLOCK_S: int
    BLOCK_HQ: int
    BLOCK_HK: int
    num_warps: int = 4
    COS_FIRST: bool = False

    def __post_init__(self) -> None:
        check_config(self, powers_of_two={"BLOCK_S": 1, "BLOCK_HQ": 1, "BLOCK_HK": 1, "num_warps": 1},
                     flags=("COS_FIRST",))  # fmt: skip

    def launch_kwargs(self) -> dict:
        """The keywords of the kernel launch."""
        return {"BLOCK_S": self.BLOCK_S, "BLOCK_HQ": self.BLOCK_HQ, "BLOCK_HK": self.BLOCK_HK,
                "COS_FIRST": self.COS_FIRST, "num_warps": self.num_warps}  # fmt: skip


@functools.lru_cache(maxsize=MAX_PLANS)
def rope_config(tokens: int, hq: int, block_p: int) -> RopeConfig:
    """Tokens and heads per program for ``tokens`` tokens (B x S), ``hq`` q heads and rotation
    pairs padded to ``block_p``; the same on every GPU.

    32 tokens x 2 q heads (or 1 kv head) per program at prefill: 4K rotation pairs, 16 KB of
    bf16 read and written, in 8 warps. From `benchmarks/tune_rotary.py` on an H100 (32 q / 8
    kv heads, head_dim 128, 64 .. 4096 tokens, 190 configurations per size): this shape was
    within 4% of the best at every size, in both memory orders (bhsd and bshd); head-major
    blocks were 2-14% slower in bshd order too, and the previous one-token-per-program shape
    1.35x (64 tokens) to 3.5x (1024) slower. kv heads get their own block: 8 kv heads in a q
    head block would leave lanes masked. One token: one head per program (40 programs), the
    best there.

    COS_FIRST (cos / sin read before the q / k loads are issued, not after): A/B on the H100
    with harness timing (`tune_rotary.py --cos-first`, results/tune_rotary_cos_first_*): after
    wins in one-warp programs (1 / 2 / 4 tokens: 1.83 / 1.94 / 2.00 us against 2.08 / 2.34 /
    2.35: a program waits on one DRAM round trip instead of two in series); before wins from
    8 tokens on, where programs have 2-8 warps (8 / 64 / 256 tokens: 2.42 / 2.78 / 4.17 us
    against 2.53 / 3.04 / 4.28; within 2% either way from 1024 on)."""
    bhq, bhk = (1, 1) if tokens == 1 else (min(2, triton.next_power_of_2(max(hq, 1))), 1)  # (q may have no heads)
    bs = min(max(1, 4096 // (block_p * bhq)), triton.next_power_of_2(tokens))
    warps = max(1, min(8, bs * bhq * block_p // 512))
    return RopeConfig(BLOCK_S=bs, BLOCK_HQ=bhq, BLOCK_HK=bhk, num_warps=warps, COS_FIRST=warps > 1)


# ---------------------------------------------------------------------------------------------
# Fused RMSNorm -> matmul -> RoPE
# ---------------------------------------------------------------------------------------------

# The minimum of a tl.dot operand dimension.
_DOT_MIN = 16


@dataclass(frozen=True)
class RmsMatmulRopeConfig:
    """`_rms_matmul_rope_kernel`: tiles of BLOCK_M tokens x (BLOCK_NH + BLOCK_NH) columns (the
    same columns of one head's two halves), K steps of BLOCK_K. SPLIT_K > 1: SPLIT_K programs
    per tile, each over a K range (the launcher drops empty ones). GROUP_M row blocks per column
    sweep. SQUARES_MMA: x^2 on the tensor cores as diag(x x^T). USE_TMA: x, W and g through TMA
    (None: the launcher decides with `_use_tma`)."""

    BLOCK_M: int
    BLOCK_NH: int
    BLOCK_K: int
    SPLIT_K: int = 1
    GROUP_M: int = 1
    SQUARES_MMA: bool = False
    USE_TMA: bool | None = None
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        check_config(
            self, powers_of_two={"BLOCK_M": _DOT_MIN, "BLOCK_NH": _DOT_MIN, "BLOCK_K": _DOT_MIN, "num_warps": 1},
            at_least={"SPLIT_K": 1, "GROUP_M": 1, "num_stages": 1}, flags=("SQUARES_MMA", "USE_TMA"),
            optional=("USE_TMA",),
        )  # fmt: skip

    def launch_kwargs(self) -> dict:
        """The keywords of the kernel launch (USE_TMA decided)."""
        return {"BLOCK_M": self.BLOCK_M, "BLOCK_NH": self.BLOCK_NH, "BLOCK_K": self.BLOCK_K, "SPLIT_K": self.SPLIT_K,
                "GROUP_M": self.GROUP_M, "SQUARES_MMA": self.SQUARES_MMA, "USE_TMA": self.USE_TMA,
                "num_warps": self.num_warps, "num_stages": self.num_stages}  # fmt: skip


@dataclass(frozen=True)
class RmsMatmulRopeHeadsConfig:
    """`_rms_matmul_rope_heads_kernel`: tiles of BLOCK_M tokens x HEADS whole heads (one
    accumulator, one tl.dot per K step of BLOCK_K), GROUP_M row blocks per column sweep.
    SQUARES_MMA, USE_TMA: as in `RmsMatmulRopeConfig`."""

    BLOCK_M: int
    HEADS: int
    BLOCK_K: int
    GROUP_M: int = 1
    SQUARES_MMA: bool = False
    USE_TMA: bool | None = None
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        check_config(
            self, powers_of_two={"BLOCK_M": _DOT_MIN, "HEADS": 1, "BLOCK_K": _DOT_MIN, "num_warps": 1},
            at_least={"GROUP_M": 1, "num_stages": 1}, flags=("SQUARES_MMA", "USE_TMA"), optional=("USE_TMA",),
        )  # fmt: skip

    def launch_kwargs(self) -> dict:
        """The keywords of the kernel launch (USE_TMA decided)."""
        return {"BLOCK_M": self.BLOCK_M, "HEADS": self.HEADS, "BLOCK_K": self.BLOCK_K, "GROUP_M": self.GROUP_M,
                "SQUARES_MMA": self.SQUARES_MMA, "USE_TMA": self.USE_TMA, "num_warps": self.num_warps,
                "num_stages": self.num_stages}  # fmt: skip


@dataclass(frozen=True)
class RmsMatmulRopePersistentConfig:
    """`_rms_matmul_rope_persistent_kernel` (RMSNorm weight folded into W): the tiles of
    `RmsMatmulRopeHeadsConfig` (x^2 always on the tensor cores) looped over by PROGRAMS programs
    (None: one per SM; one per row block in the interpreter). PROGRAMS is the launch grid, not a
    meta-parameter."""

    BLOCK_M: int
    HEADS: int
    BLOCK_K: int
    GROUP_M: int = 16
    USE_TMA: bool | None = None
    num_warps: int = 4
    num_stages: int = 4
    PROGRAMS: int | None = None

    def __post_init__(self) -> None:
        check_config(
            self, powers_of_two={"BLOCK_M": _DOT_MIN, "HEADS": 1, "BLOCK_K": _DOT_MIN, "num_warps": 1},
            at_least={"GROUP_M": 1, "num_stages": 1, "PROGRAMS": 1}, flags=("USE_TMA",),
            optional=("USE_TMA", "PROGRAMS"),
        )  # fmt: skip

    def launch_kwargs(self) -> dict:
        """The keywords of the kernel launch (USE_TMA decided)."""
        return {"BLOCK_M": self.BLOCK_M, "HEADS": self.HEADS, "BLOCK_K": self.BLOCK_K, "GROUP_M": self.GROUP_M,
                "USE_TMA": self.USE_TMA, "num_warps": self.num_warps, "num_stages": self.num_stages}  # fmt: skip


PROJECTION_CONFIGS = (RmsMatmulRopeConfig, RmsMatmulRopeHeadsConfig, RmsMatmulRopePersistentConfig)


def _whole_head_config(head_dim: int, tma: bool) -> RmsMatmulRopeHeadsConfig:
    """Whole-head tiles, 64 tokens x 256 columns (`_rms_matmul_rope_heads_kernel`), 5 stages, x^2
    on the MMA: against the unfused sequence 0.95x / 0.79x / 0.92x at 256 / 1024 / 4096 tokens
    (half-head tiles: 0.73x / 0.73x / 0.60x; results/tune_projection_heads_*). 1024 tokens make
    320 tiles, 2.4 waves on 132 SMs; smaller tiles (64 x 128) were slower there (0.72x), larger
    ones everywhere (128 x 256: 0.89x at best). With the weight passed (x * g in registers
    every K step) these tiles gained nothing (0.44x - 0.57x, as the half-head tiles), so that
    case keeps the half-head tiles."""
    return RmsMatmulRopeHeadsConfig(BLOCK_M=64, HEADS=max(1, 256 // head_dim), BLOCK_K=64, GROUP_M=16, SQUARES_MMA=True,
                                    USE_TMA=tma, num_warps=4, num_stages=5)  # fmt: skip


@functools.lru_cache(maxsize=MAX_PLANS)
def rms_matmul_rope_config(
    M: int, K: int, head_dim: int, folded: bool = False, tma: bool = True
) -> RmsMatmulRopeConfig | RmsMatmulRopeHeadsConfig | RmsMatmulRopePersistentConfig:
    """Kernel, tile shape, K split and x-side variant by token count M (K: x's width; head_dim a
    multiple of 32). ``folded``: the RMSNorm weight is folded into W (`fold_rms_weight`), so the
    x tiles feed the MMAs unmodified. ``tma``: the GPU's copy engine is used (sm90). The best of
    `benchmarks/tune_projection.py` on an H100 (Llama-3 8B [W_q; W_k], 5120 x 4096, bf16;
    harness timing, inputs past L2; results/tune_projection_*):

    | tokens | unfused (RMSNorm + cuBLAS + RoPE) | weight passed, TMA (sm90) | weight folded, TMA (sm90) |
    |---|---|---|---|
    | 1 | 21.4-21.5 us | 18.9 (16 x (32 + 32), K 256) | 18.3 (16 x (32 + 32), K 256) |
    | 16 | 22.3-22.4 | 19.0 (16 x (32 + 32), K 256) | 18.6 (16 x (32 + 32), K 256) |
    | 32 | 22.7-23.0 | 20.6 (16 x (64 + 64), K 256) | 19.0 (16 x (64 + 64), K 256) |
    | 64 | 23.1-23.3 | 26.3 (32 x (64 + 64), K 128) | 19.7 (64 x (32 + 32), K 128, 6 stages) |
    | 128 | 24.0 | 38.6 (whole-head tiles) | 23.1 (64 x (64 + 64), K 64, 6 stages; whole-head tiles 24.4) |
    | 1024 | 68.6-69.2 | 126.5 (64 x (64 + 64), K 64) | 86.5-94 (whole heads: 64 x 256, x^2 on the MMA) |

    All unsplit (SPLIT_K 1: one program per column tile, 40-80 of them on 132 SMs, no fp32
    partials, no second pass) and 4 stages unless stated. Earlier sweeps offered K splits of
    2 - 8 only, and those took 19.7 / 19.8 / 20.2 / 23.0 us folded at 1 / 16 / 32 / 64 tokens
    (results/tune_projection_decode_split1_*; 128 and 256 tokens: results/tune_projection_128_256_*,
    where at 256 the whole-head tiles stayed the best, 0.93x). The weight-passed numbers are
    with g read through TMA (results/tune_projection_weight_passed_*): before, its pointer load
    was the one load of the K loop outside the software pipeline, and the best tiles took
    21.0 / 20.8 / 22.0 / 26.2 us at 1 / 16 / 32 / 64 tokens.

    Per K step, with the weight passed, every x tile goes through registers (x * g rounded
    back to bf16) before the MMA, in every column tile; that costs most where the x tiles are
    largest (64 rows, prefill). Folded, x^2 can also go to the tensor cores as the diagonal of
    x x^T (SQUARES_MMA; exact: bf16 squares fit fp32), which won folded from 1 token on.

    Also measured and not kept (b72a360, results/tune_projection_decode_*): W x^T tiles (the
    tokens on wgmma's narrow side, which won in gated-mlp) at most 1% faster with a split and
    slower without one; SPLIT_K 3; and summing x^2 once per row block in a program of its own
    instead of in every tile (21.3 us at 64 tokens against 19.7), though a scratch build
    without any x^2 ran the 64-row unsplit tile 1.2 us faster. Without TMA (sm80, ROCm: never
    timed) the earlier split tiles stay; their shared memory also fits an A100."""
    whole_heads = folded and tma and head_dim & (head_dim - 1) == 0 and head_dim <= 256
    if M <= 128 and folded and tma:
        if M > 64:  # 2 row blocks: 80 tiles of 64 x (64 + 64) (the 64-token shape makes 160: 2 waves)
            cfg = RmsMatmulRopeConfig(BLOCK_M=64, BLOCK_NH=64, BLOCK_K=64, SQUARES_MMA=True, num_stages=6)
        elif M > 32:
            cfg = RmsMatmulRopeConfig(BLOCK_M=64, BLOCK_NH=32, BLOCK_K=128, SQUARES_MMA=True, num_stages=6)
        else:
            cfg = RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=64 if M > 16 else 32, BLOCK_K=256, SQUARES_MMA=True)
    elif M <= 64 and tma:  # weight passed: x^2 in registers (the x tile is there for x * g anyway)
        cfg = RmsMatmulRopeConfig(BLOCK_M=32, BLOCK_NH=64, BLOCK_K=128) if M > 32 else \
              RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=64 if M > 16 else 32, BLOCK_K=256)  # fmt: skip
    elif M <= 16:
        cfg = RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=64, BLOCK_K=128, SPLIT_K=2) if folded else \
              RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=128, SPLIT_K=4)  # fmt: skip
    elif M <= 32:
        cfg = RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=128, SPLIT_K=2) if folded else \
              RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=64, SPLIT_K=4)  # fmt: skip
    elif M <= 64:
        cfg = RmsMatmulRopeConfig(BLOCK_M=64, BLOCK_NH=64, BLOCK_K=128, SPLIT_K=2, SQUARES_MMA=True) if folded else \
              RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=64, BLOCK_K=64, SPLIT_K=2)  # fmt: skip
    elif whole_heads and M > 1024:
        # The persistent kernel: x^2 shared out over the first round's tiles instead of computed
        # in every tile. Against the unfused sequence 0.95x at 2048 tokens (64 x 256 tiles) and
        # 1.12x at 4096 (128 x 256, 8 warps; whole-head tiles there: 0.95x). At 256 - 1024
        # tokens the whole-head kernel was as fast or faster (docs/rope-triton-projection-prefill.md;
        # its TAIL_SPLIT 2 / 4 rows are a K split of a short last round, measured slower
        # everywhere and removed). A stream-K last round (9eac92f) was slower too: 94 us at
        # 1024 tokens against 88, 275 at 4096 against 259 (docs/rope-triton-projection-prefill.md).
        return RmsMatmulRopePersistentConfig(
            BLOCK_M=128 if M > 2048 else 64, HEADS=max(1, 256 // head_dim), BLOCK_K=64, USE_TMA=tma,
            num_warps=8 if M > 2048 else 4, num_stages=3 if M > 2048 else 4,
        )  # fmt: skip
    elif whole_heads:
        return _whole_head_config(head_dim, tma)
    else:  # weight passed, pointer loads (no TMA), or a head_dim the whole-head epilogue cannot split
        cfg = RmsMatmulRopeConfig(BLOCK_M=64, BLOCK_NH=64, BLOCK_K=64, GROUP_M=8 if folded else 1, SQUARES_MMA=folded,
                                  num_stages=3)  # fmt: skip
    block_nh = cfg.BLOCK_NH
    while (head_dim // 2) % block_nh:  # head_dim / 2 is a multiple of 16 (checked by the caller)
        block_nh //= 2
    split = cfg.SPLIT_K
    if split > 1:  # no more splits than half the K steps (short K)
        split = max(1, min(split, triton.cdiv(K, cfg.BLOCK_K) // 2))
    return dataclasses.replace(cfg, BLOCK_NH=block_nh, SPLIT_K=split, USE_TMA=tma)
