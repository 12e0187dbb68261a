"""Triton kernel of gated-mlp and its launcher (raw tensors in, nothing checked here: the public
functions in ``__init__`` check arguments first).

Imported lazily: only when a CUDA/ROCm tensor (or a CPU tensor under ``TRITON_INTERPRET=1``)
reaches an op, so the CPU variant works without Triton installed.

One kernel, two operand paths:
* TMA (sm90): x, W_gate and W_up tiles arrive through host-built tensor descriptors (the copy
  engine, zero-filled past the edges), and Triton issues wgmma on them.
* pointers (sm80, gfx942, the interpreter, unaligned views): ordinary loads, rows and columns
  wrapped modulo M / N so the loads need no masks (the wrapped rows are never stored).
Either way a tile holds two fp32 accumulators with identical layouts, acc_g = x @ W_gate^T and
acc_u = x @ W_up^T over the same A tile, and the epilogue act(acc_g + b_g) * (acc_u + b_u) is
elementwise: only the [M, U] gated product is written.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._triton_launch import Address, HostDescriptor, PlanTable, aligned16

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def _gate(acc_g, acc_u, ACTIVATION: tl.constexpr):
    """act(g) * u in fp32. silu(g) = g * sigmoid(g); gelu_tanh(g) = 0.5 g (1 + tanh(z)) =
    g * sigmoid(2 z), z = sqrt(2 / pi) (g + 0.044715 g^3): one exp either way."""
    if ACTIVATION == 0:
        a = acc_g * tl.sigmoid(acc_g)
    else:
        z2 = 1.5957691216057308 * (acc_g + 0.044715 * acc_g * acc_g * acc_g)
        a = acc_g * tl.sigmoid(z2)
    return a * acc_u


@triton.jit
def _fp8_grid_rne(y, MIN_EXP: tl.constexpr):
    """y rounded to nearest-even on the e4m3 grid (3 mantissa bits, subnormals below 2^MIN_EXP),
    in fp32. Interpreter only: Triton 3.9's interpreter converts fp32 -> fp8 without carrying
    a round-up into the exponent (127.95 became 64, not 128); values already on the grid
    convert exactly. The GPU's conversion instruction rounds correctly."""
    a = tl.abs(y)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), MIN_EXP)
    ulp = tl.exp2(e - 3)
    v = a / ulp  # exact: ulp is a power of two
    r = tl.floor(v)
    d = v - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
    return tl.where(y < 0, -r * ulp, r * ulp)


@triton.jit
def _epilogue(
    acc_g, acc_u, off_m, off_n, M, N, bg_ptr, bu_ptr, out_ptr, s_om,
    xs_ptr, s_xs, gs_ptr, us_ptr, s_ws, os_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr, QUANT_OUT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """SCALED (FP8 inputs): acc * x_scale[row] * w_scale[col] (stride 0: per tensor); then the
    bias, act(g) * u in fp32; QUANT_OUT: y / out_scale, clamped to +-FP8_MAX, rounded to FP8."""
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    if SCALED:
        xs = tl.load(xs_ptr + rows * s_xs, mask=rmask, other=0.0)[:, None]
        acc_g = acc_g * xs * tl.load(gs_ptr + cols * s_ws, mask=cmask, other=0.0)[None, :]
        acc_u = acc_u * xs * tl.load(us_ptr + cols * s_ws, mask=cmask, other=0.0)[None, :]
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y = _gate(acc_g, acc_u, ACTIVATION)
    if QUANT_OUT:
        y = tl.clamp(tl.math.div_rn(y, tl.load(os_ptr)), -FP8_MAX, FP8_MAX)  # as torch's y / s
        if not COMPILED:
            y = _fp8_grid_rne(y, FP8_MIN_EXP)
    o = out_ptr + rows.to(tl.int64)[:, None] * s_om + cols[None, :]
    tl.store(o, y.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _dot(a, b, acc, SWAP_AB: tl.constexpr):
    """acc += a @ b^T (a [BLOCK_M, BLOCK_K] x tile, b [BLOCK_N, BLOCK_K] W tile); SWAP_AB: acc^T
    += b @ a^T instead, so W's rows fill the MMA's 64-row side and the few tokens its narrow
    side (wgmma's N can be 8-256; its M is 64 per warpgroup)."""
    if SWAP_AB:
        acc = tl.dot(b, a.T, acc)
    else:
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _tile_offsets(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row tiles share each column sweep, so W tiles are reused from L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % group_m
    pid_n = (tile % group) // group_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _gated_mlp_kernel(
    x, wg, wu, bg_ptr, bu_ptr, out_ptr, part_ptr, count_ptr,
    xs_ptr, gs_ptr, us_ptr, os_ptr,
    M, N, K, K_SPLIT, N_FULL,
    s_xm, s_gn, s_un, s_om, s_xs, s_ws,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_TMA: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    QUANT_OUT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    UPCAST: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """out[off_m:+BLOCK_M, off_n:+BLOCK_N] = act(x W_g^T + b_g) * (x W_u^T + b_u).

    FP8 inputs: on sm90 (TMA) wgmma multiplies them natively with Hopper's fast FP8
    accumulation (a short accumulator mantissa: up to ~1% of the output's scale off an fp64
    reference at K = 4096 on an H200). Measured and dropped (H200, 8B MLP, M = 1024): adding
    the partial sums into fp32 every 64 products (Triton's max_num_imprecise_acc) halved the
    speed (458 vs 1122 TFLOP/s); summing 4 or 8 K steps in fresh accumulators before adding
    them cost 5-20%. The pointer path (UPCAST) widens FP8 to bf16 first (exact, full fp32
    accumulation), for GPUs without FP8 tensor cores (sm80).

    One program per output tile, in grouped order. SPLIT_K > 1: the tiles from N_FULL on are
    split over K, SPLIT_K programs each (program N_FULL + s * n_split + i covers K range s of
    split tile i); each stores its two fp32 partials, and the last of a tile's programs to
    arrive (an acq_rel counter) adds them in split order (deterministic), runs the epilogue and
    resets the counter: one launch. N_FULL = 0 at decode (too few tiles to keep W's read in
    flight: every tile split); at prefill, N_FULL = the tiles of the whole waves, so only a
    short last wave is split (its tiles finish in 1 / SPLIT_K of a tile's time).
    """
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    if SPLIT_K > 1:
        split_tile = pid >= N_FULL
        q = tl.maximum(pid - N_FULL, 0)
        n_split = num_m * num_n - N_FULL
        tile = tl.where(split_tile, N_FULL + q % n_split, pid)
        pid_k = tl.where(split_tile, q // n_split, 0)
        k_lo = pid_k * K_SPLIT
        k_hi = tl.where(split_tile, tl.minimum(k_lo + K_SPLIT, K), K)
    else:
        tile = pid
        k_lo = 0
        k_hi = K
    off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    if SWAP_AB:  # transposed accumulators, transposed back before the epilogue
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            a = x.load([off_m, k0])
            b_g = wg.load([off_n, k0])
            b_u = wu.load([off_n, k0])
            acc_g = _dot(a, b_g, acc_g, SWAP_AB)
            acc_u = _dot(a, b_u, acc_u, SWAP_AB)
    else:
        ks = tl.arange(0, BLOCK_K)
        rows = (off_m + tl.arange(0, BLOCK_M)) % M  # wrapped, never stored: no load masks
        cols = (off_n + tl.arange(0, BLOCK_N)) % N
        a_ptr = x + rows.to(tl.int64)[:, None] * s_xm + ks[None, :]
        g_ptr = wg + cols.to(tl.int64)[:, None] * s_gn + ks[None, :]
        u_ptr = wu + cols.to(tl.int64)[:, None] * s_un + ks[None, :]
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptr + k0)
                b_g = tl.load(g_ptr + k0)
                b_u = tl.load(u_ptr + k0)
            else:
                kmask = (k0 + ks) < k_hi
                a = tl.load(a_ptr + k0, mask=kmask[None, :], other=0.0)
                b_g = tl.load(g_ptr + k0, mask=kmask[None, :], other=0.0)
                b_u = tl.load(u_ptr + k0, mask=kmask[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.bfloat16)
                b_g = b_g.to(tl.bfloat16)
                b_u = b_u.to(tl.bfloat16)
            if COMPILED:
                acc_g = _dot(a, b_g, acc_g, SWAP_AB)
                acc_u = _dot(a, b_u, acc_u, SWAP_AB)
            else:  # Triton 3.9's interpreter multiplies bf16 operands as raw bits: use fp32 there
                af = a.to(tl.float32)
                acc_g = _dot(af, b_g.to(tl.float32), acc_g, SWAP_AB)
                acc_u = _dot(af, b_u.to(tl.float32), acc_u, SWAP_AB)
    if SWAP_AB:
        acc_g = acc_g.T
        acc_u = acc_u.T

    if SPLIT_K > 1 and pid >= N_FULL:
        # partials [split tiles, SPLIT_K, 2 (gate, up), BLOCK_M, BLOCK_N], fp32
        slot = (tile - N_FULL).to(tl.int64)
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        plane = BLOCK_M * BLOCK_N
        tile_part = part_ptr + slot * (SPLIT_K * 2 * plane) + local
        tl.store(tile_part + (2 * pid_k) * plane, acc_g)
        tl.store(tile_part + (2 * pid_k + 1) * plane, acc_u)
        tl.debug_barrier()  # every thread's partial stored before the counter releases them
        counter = count_ptr + slot
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):  # in split order: results do not depend on arrival order
                acc_g += tl.load(tile_part + (2 * s) * plane, cache_modifier=".cg")
                acc_u += tl.load(tile_part + (2 * s + 1) * plane, cache_modifier=".cg")
            tl.atomic_xchg(counter, 0)  # ready for the next call (the counters are cached)
            _epilogue(
                acc_g, acc_u, off_m, off_n, M, N, bg_ptr, bu_ptr, out_ptr, s_om, xs_ptr, s_xs, gs_ptr, us_ptr, s_ws,
                os_ptr, BLOCK_M, BLOCK_N, ACTIVATION, HAS_BIAS, SCALED, QUANT_OUT, FP8_MAX, FP8_MIN_EXP, COMPILED,
            )  # fmt: skip
    else:
        _epilogue(
            acc_g, acc_u, off_m, off_n, M, N, bg_ptr, bu_ptr, out_ptr, s_om, xs_ptr, s_xs, gs_ptr, us_ptr, s_ws,
            os_ptr, BLOCK_M, BLOCK_N, ACTIVATION, HAS_BIAS, SCALED, QUANT_OUT, FP8_MAX, FP8_MIN_EXP, COMPILED,
        )  # fmt: skip


def _interpreting() -> bool:
    """Triton's interpreter (CPU tensors, TRITON_INTERPRET=1): the kernel takes its
    COMPILED=False branch (fp32 tl.dot operands)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _tma_capable(*tensors: torch.Tensor) -> bool:
    """Hopper's copy engine: sm90 (CUDA, not ROCm), 16-byte aligned bases and row strides."""
    t0 = tensors[0]
    if not t0.is_cuda or torch.version.hip is not None or _interpreting():
        return False
    if torch.cuda.get_device_capability(t0.device)[0] != 9:
        return False
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def gated_mlp_config(M: int, N: int, K: int, sms: int = 132, tma: bool = True, fp8: bool = False) -> dict:
    """Tile shape, K split and pipelining by token count (no autotuning: deterministic, and
    cheap in the interpreter): the best of `benchmarks/tune.py`'s sweeps, Llama 3 MLP shapes
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
    if M <= 64:
        cfg = {"BLOCK_M": 16 if M <= 16 else 64, "GROUP_M": 1, "num_warps": 4}
        if not tma:
            cfg.update(BLOCK_N=128, BLOCK_K=64, num_stages=4)
        else:
            # W @ x^T tiles (SWAP_AB): 64 W rows per wgmma, the tokens on its narrow side, and
            # K steps of 256 bytes. `tune.py --decode` on an H100 against the x W^T 64 x 128 x 64
            # tiles used before: 8B 80.0 / 81.0 / 83.8 us at M = 1 / 16 / 64 (was 87.9 / 86.0 /
            # 87.4; cuBLAS alone 81.4 / 83.0 / 87.5), 70B M = 1 309 us (328; cuBLAS 337), 405B
            # 1133 us (1223; cuBLAS 1189); FP8 8B M = 1 43.0 us (54.3; _scaled_mm 42.2).
            cfg.update(BLOCK_N=64, SWAP_AB=True)
            if fp8:
                cfg.update(BLOCK_K=256, num_stages=2)
            else:
                cfg.update(BLOCK_K=128, num_stages=5 if M <= 16 else 4)
    else:
        stages = 4 if M <= 2048 else 3
        cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 16, "num_warps": 8, "num_stages": stages}
    if not tma and M > 16:
        cfg["BLOCK_N"] = 64  # pointer loads (sm80, gfx942): the register-staged tiles are smaller
    tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    split, full = 1, 0
    if 2 * tiles < sms:
        split = max(1, min(triton.cdiv(sms, tiles), triton.cdiv(K, cfg["BLOCK_K"]) // 2, 8))
    elif tiles > sms and cfg["BLOCK_M"] == 128 and tma and not fp8:  # measured in bf16 only
        # Split only the last, partial wave (one 128 x (128 + 128) tile per SM): its tiles
        # split SPLIT_K ways over K take 1 / SPLIT_K of a wave instead of a whole one. E.g.
        # 70B at 256 tokens: 448 tiles = 3 waves of 132 + 52, the 52 split 2 ways: 3.5 tile
        # times instead of 4.
        rest = tiles % sms
        if rest:
            tail_split = min(sms // rest, 4, triton.cdiv(K, cfg["BLOCK_K"]) // 2)
            if tail_split >= 2:
                split, full = tail_split, tiles - rest
    if fp8 and tma and M > 64:  # 1-byte elements: a 128-wide K step keeps the copies 128 bytes wide
        cfg["BLOCK_K"] = 128
    cfg["SPLIT_K"] = split
    cfg["N_FULL"] = full
    cfg["USE_TMA"] = tma
    return cfg


_COUNTERS: dict[torch.device, torch.Tensor] = {}

# The arguments that change between calls sharing a launch plan, in the kernel's parameter order.
_GATED_VARYING = ("x", "wg", "wu", "bg_ptr", "bu_ptr", "out_ptr", "part_ptr", "count_ptr", "xs_ptr", "gs_ptr", "us_ptr", "os_ptr")
_GATED_PLANS = PlanTable(_gated_mlp_kernel)


class _GatedPlan:
    """A launch plan of `_gated_mlp_kernel` plus what a call builds around it: x's descriptor
    (TMA), the K-split partials, the weights' cached descriptors (or addresses)."""

    __slots__ = ("launch", "weights", "x_block", "x_shape", "x_strides", "part_shape", "counters")

    def __init__(self, launch, weights, x_block, x_shape, x_strides, part_shape, counters):
        self.launch, self.weights, self.x_block = launch, weights, x_block
        self.x_shape, self.x_strides = x_shape, x_strides  # x as [M, K] (the key fixes both)
        self.part_shape, self.counters = part_shape, counters

    def __call__(self, x, bias_gate, bias_up, out, scales, out_scale) -> None:
        """x: [M, K] as planned, or any tensor with the same memory layout (x before its
        reshape to [M, K]); out likewise."""
        xa = x if self.x_block is None else HostDescriptor(x, self.x_shape, self.x_strides, self.x_block)
        if self.part_shape is not None:
            part, counters = torch.empty(self.part_shape, dtype=torch.float32, device=x.device), self.counters
        else:
            part = counters = out
        xs, gs, us = scales if scales is not None else (out, out, out)
        has_bias = bias_gate is not None
        self.launch(
            xa, *self.weights, bias_gate if has_bias else out, bias_up if has_bias else out, out, part, counters,
            xs, gs, us, out_scale if out_scale is not None else out,
        )


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """The split-K arrival counters: zeroed once per device and left zeroed by the kernel (the
    last program of a tile resets its counter), so a call costs no memset. Calls on concurrent
    streams of one device would share them: one stream at a time."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def launch_gated_mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    bias_gate: torch.Tensor | None,
    bias_up: torch.Tensor | None,
    out: torch.Tensor,
    activation: str,
    cfg: dict | None = None,
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    out_scale: torch.Tensor | None = None,
) -> "_GatedPlan | None":
    """x [M, K], w_gate / w_up [N, K] (unit last strides, any row strides), biases [N] or None,
    out [M, N] (unit last stride). FP8 x / W: ``scales`` = (x_scale [1] or [M], w_gate_scale
    and w_up_scale [1] or [N]), fp32; ``out_scale`` [1] when out is FP8. ``cfg``:
    `gated_mlp_config`'s form plus an optional ``USE_TMA``, to override the choice (tuning,
    tests). Returns the launch plan of this call signature, or None when it has none."""
    M, K = x.shape
    N = w_gate.shape[0]
    if M == 0 or N == 0:
        return None
    if K == 0:  # an empty sum: act(b_g) * b_u (quantized as asked), or zeros
        from ._reference import gated_mlp

        gated_mlp(x, w_gate, w_up, bias_gate, bias_up, out, activation, scales, out_scale)
        return None
    has_bias = bias_gate is not None
    quant_out = out.element_size() == 1
    # A launch plan per call signature (see _triton_launch): the configuration, the weights'
    # descriptors and the argument list are functions of this key (the weights' addresses
    # included: their descriptors are cached), and a repeated key skips the configuration,
    # the descriptor checks and the JIT's argument binding.
    key = None
    if cfg is None and x.is_cuda:
        key = (
            x.get_device(),  # a plan launches on the GPU it was made on (its SM count picked the tiles)
            x.shape, x.stride(), w_gate.shape, w_gate.stride(), w_up.stride(), out.stride(), x.dtype, out.dtype,
            w_gate.data_ptr(), w_up.data_ptr(), activation,
            None if not has_bias else (bias_gate.dtype, bias_up.dtype),
            None if scales is None else tuple(t.numel() for t in scales), out_scale is not None,
            aligned16(*[t for t in (x, out, bias_gate, bias_up, out_scale, *(scales or ())) if t is not None]),
        )
        plan = _GATED_PLANS.get(key)
        if plan is not None:
            plan(x, bias_gate, bias_up, out, scales, out_scale)
            return plan
    fp8 = x.element_size() == 1
    cfg = dict(cfg) if cfg is not None else {}
    tma = cfg.pop("USE_TMA", None)
    if tma is None:
        tma = _tma_capable(x, w_gate, w_up)
    if "BLOCK_M" not in cfg:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
        cfg = gated_mlp_config(M, N, K, sms, tma, fp8)
        tma = cfg.pop("USE_TMA")
    block_m, block_n, block_k, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg.pop("SPLIT_K")
    n_full = cfg.pop("N_FULL", 0)
    cfg.setdefault("SWAP_AB", False)
    k_split = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    split = triton.cdiv(K, k_split)  # no empty splits
    num_m, num_n = triton.cdiv(M, block_m), triton.cdiv(N, block_n)
    n_full = 0 if split == 1 else min(n_full, num_m * num_n - 1)  # at least one split tile
    n_split = num_m * num_n - n_full if split > 1 else 0
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        xa = TensorDescriptor.from_tensor(x, [block_m, block_k])
        ga = TensorDescriptor.from_tensor(w_gate, [block_n, block_k])
        ua = TensorDescriptor.from_tensor(w_up, [block_n, block_k])
    else:
        xa, ga, ua = x, w_gate, w_up
    part_shape = (n_split, split, 2, block_m, block_n)
    if split > 1:
        part = torch.empty(part_shape, dtype=torch.float32, device=x.device)
        counters = _split_counters(x.device, n_split)
    else:
        part = counters = out  # not read
    xs, gs, us = scales if scales is not None else (out, out, out)  # not read when unscaled
    grid = (n_full + n_split * split if split > 1 else num_m * num_n,)
    args = (
        xa, ga, ua,
        bias_gate if has_bias else out, bias_up if has_bias else out, out, part, counters,
        xs, gs, us, out_scale if quant_out else out,
        M, N, K, k_split, n_full,
        x.stride(0), w_gate.stride(0), w_up.stride(0), out.stride(0),
        1 if scales is not None and xs.numel() > 1 else 0, 1 if scales is not None and gs.numel() > 1 else 0,
    )  # fmt: skip
    kwargs = dict(
        SPLIT_K=split, ACTIVATION=ACTIVATIONS[activation], HAS_BIAS=has_bias, USE_TMA=tma,
        EVEN_K=K % block_k == 0, SCALED=scales is not None, QUANT_OUT=quant_out,
        FP8_MAX=torch.finfo(out.dtype).max if quant_out else 0.0,
        FP8_MIN_EXP=-7 if out.dtype == torch.float8_e4m3fnuz else -6, UPCAST=fp8 and not tma,
        COMPILED=not _interpreting(), **cfg,
    )  # fmt: skip
    launch = _GATED_PLANS.launch_and_plan(key, grid, _GATED_VARYING, args, kwargs)
    if launch is not None:
        weights = (
            (HostDescriptor(Address(w_gate), ga.shape, ga.strides, ga.block_shape),
             HostDescriptor(Address(w_up), ua.shape, ua.strides, ua.block_shape))
            if tma else (w_gate.data_ptr(), w_up.data_ptr())
        )  # fmt: skip
        plan = _GatedPlan(launch, weights, (block_m, block_k) if tma else None, (M, K), x.stride(),
                          part_shape if split > 1 else None, counters if split > 1 else None)
        _GATED_PLANS.put(key, plan)
        return plan
    return None
