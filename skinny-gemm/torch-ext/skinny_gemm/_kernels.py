"""Triton kernel of skinny-gemm and its launcher (raw tensors in, nothing checked here: the
public functions in ``__init__`` check arguments first).

Imported lazily: only when a CUDA/ROCm tensor (or a CPU tensor under ``TRITON_INTERPRET=1``)
reaches an op, so the CPU variant works without Triton installed.

``_skinny_gemm_kernel`` computes ``out = (x @ w^T) * x_scale * w_scale + bias`` for small M
(decode: the weight stream is the whole cost; 2304 x 16384 bf16 is 75 MB against 32 x 16384
x 2 = 1 MB of activations):

* **Swap AB.** Each program owns BLOCK_N rows of W and BLOCK_M rows of x and computes
  ``W_tile x_tile^T`` ([BLOCK_N, BLOCK_M]): W's rows sit on the MMA's wide side (64 on
  wgmma's M), the few tokens on its narrow side (16 / 32 / 64, x padded by wrapping its row
  index, never stored). At BLOCK_M = 1 there is no MMA: a [BLOCK_N, BLOCK_K] fp32 FMA
  accumulator, reduced once after the K loop (a GEMV). At BLOCK_M = 2 the same GEMV for two
  tokens: a [2, BLOCK_N, BLOCK_K] accumulator (each weight element converted once and
  multiplied by both tokens' x), reduced once after the loop.
* **Split K.** The grid is (N tiles, K slices, M tiles): with few tiles over N, slicing K keeps
  every SM streaming weights. K slices are multiples of BLOCK_K.
* **Reduction.** ``REDUCE`` 0: one slice, the program writes its tile. 1 (deterministic): each
  slice stores its fp32 partial tile, and the last to arrive (an acq_rel counter per tile) adds
  them in slice order, so the sum does not depend on arrival order. 2 (atomic, what
  ``deterministic=False`` runs): each slice adds its tile into an fp32 workspace with atomics,
  and the last to arrive reads it, zeroes it and writes the tile; less traffic (one tile read
  instead of SPLIT_K), an order that varies from run to run. The counters and the atomic
  workspace are cached per device and left zeroed by the kernel: no memset per call.
* **Epilogue** (fp32): the FP8 scales (``acc * x_scale[m] * w_scale[n]``, stride 0 for a per
  tensor scale), the bias, one rounding to out's dtype.

Interpreter (CPU, TRITON_INTERPRET=1): the same code with fp32 ``tl.dot`` operands
(Triton 3.9's interpreter multiplies 16-bit dot operands as raw bits); every 16-bit and FP8
value is exact in fp32, so only the summation order differs from the compiled kernel.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._config import SkinnyConfig, skinny_config
from ._triton_launch import PlanTable, aligned16, zeroed_buffer

REDUCE_NONE, REDUCE_ORDERED, REDUCE_ATOMIC = 0, 1, 2


@triton.jit
def _epilogue(res, rows, cols, M, N, xs_ptr, ws_ptr, s_xs, s_ws, b_ptr, out_ptr, s_om,
              HAS_BIAS: tl.constexpr, SCALED: tl.constexpr):  # fmt: skip
    """res [BLOCK_N, BLOCK_M] fp32 (W rows down, tokens across: the MMA's orientation, kept to
    the end so no layout conversion runs) -> out[rows, cols]: ``res * x_scale * w_scale + bias``
    in fp32, one rounding; rows >= M and cols >= N are not stored."""
    if SCALED:
        xs = tl.load(xs_ptr + (rows % M) * s_xs)
        ws = tl.load(ws_ptr + (cols % N) * s_ws)
        res = res * xs[None, :]
        res = res * ws[:, None]
    if HAS_BIAS:
        res += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[:, None]
    o = out_ptr + rows.to(tl.int64)[None, :] * s_om + cols[:, None]
    tl.store(o, res.to(out_ptr.dtype.element_ty), mask=(rows < M)[None, :] & (cols < N)[:, None])


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, K_SPLIT, SPLIT_K, s_xm, s_xk, s_wn, s_om, s_xs, s_ws,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    REDUCE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    EVEN_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """out[m, n] = sum_k x[m, k] w[n, k] (* x_scale[m] * w_scale[n]) (+ bias[n]) for the
    program's BLOCK_N rows of w and BLOCK_M rows of x, over K slice pid_k of SPLIT_K (K_SPLIT
    columns, a multiple of BLOCK_K). SPLIT_K is a runtime argument: one compiled kernel serves
    every split of a tile configuration (the tuner sweeps splits without recompiling).

    x [M, K] (strides s_xm, s_xk), w [N, K] (row stride s_wn, K contiguous), both fp16 / bf16 or
    both FP8; x_scale fp32 [M] or [1] (stride s_xs: 1 or 0) and w_scale fp32 [N] or [1] (s_ws)
    when SCALED; bias [N]; out [M, N] (row stride s_om). REDUCE 1: part fp32 [tiles, SPLIT_K,
    BLOCK_N, BLOCK_M]; REDUCE 2: part fp32 [tiles, BLOCK_N, BLOCK_M], zero on entry, left zero;
    count int32 [tiles], zero on entry, left zero (REDUCE 1 and 2). Partial tiles keep the
    accumulator's [BLOCK_N, BLOCK_M] orientation: on an H100 with Triton 3.6 the atomic adds of
    the transposed tile ([BLOCK_M, BLOCK_N]) summed wrong values at M = 4 (error 0.16 on outputs
    of 0.01, tests of 2026-11-24; the cause inside Triton's lowering was not isolated); in this
    orientation the tests pass and no layout conversion runs before the adds."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    GEMV: tl.constexpr = BLOCK_M < 16  # FMA on the CUDA cores (1 or 2 tokens), else tl.dot
    # The GEMV streams W past L2 (read once) and keeps x there (every program reads it):
    # Inductor's M = 1 reduction does the same.
    w_evict: tl.constexpr = "evict_first" if GEMV else ""
    x_evict: tl.constexpr = "evict_last" if GEMV else ""
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    if not GEMV:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # (x W^T)^T
    elif BLOCK_M == 1:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    # Wrapped indices, never stored: no load masks on M or N.
    if GEMV and BLOCK_M > 1:
        # W as [1, BLOCK_N, BLOCK_K] and x as [BLOCK_M, 1, BLOCK_K]: loaded in the accumulator's
        # own 3-D layout. Loaded 2-D and then broadcast, each step's W went through a layout
        # conversion (Triton 3.9's sm90 TTGIR: a shared-memory round trip of the whole tile).
        w_rows = w_ptr + (cols % N).to(tl.int64)[None, :, None] * s_wn
        x_rows = x_ptr + (rows % M).to(tl.int64)[:, None, None] * s_xm
    else:
        w_rows = w_ptr + (cols % N).to(tl.int64)[:, None] * s_wn
        x_rows = x_ptr + (rows % M).to(tl.int64)[:, None] * s_xm
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + ks
        if GEMV and BLOCK_M > 1:
            kcol = kk[None, None, :]  # K along the last axis of the pointer tensors
        else:
            kcol = kk[None, :]
        w_ptrs = w_rows + kcol
        x_ptrs = x_rows + kcol.to(tl.int64) * s_xk  # s_xk == 1 is specialized away
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy=w_evict)
            x = tl.load(x_ptrs, eviction_policy=x_evict)
        else:
            kmask = kcol < k_hi
            w = tl.load(w_ptrs, mask=kmask, other=0.0, eviction_policy=w_evict)
            x = tl.load(x_ptrs, mask=kmask, other=0.0, eviction_policy=x_evict)
        if not GEMV:
            if COMPILED and SCALED:
                # FP8: promote the tensor core's partial sums to the fp32 accumulator after every
                # 32 products (one wgmma). Triton's sm90 default (2^30: never) accumulates the
                # whole K slice at the MMA's reduced precision: errors 2-6x an fp32 bound at K 4096
                # -16384 (H100, 2026-11-24), where gemm_fp8 promises fp32 accumulation.
                acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=32)
            elif COMPILED:
                acc = tl.dot(w, tl.trans(x), acc)
            else:
                acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc)
        elif BLOCK_M == 1:  # x is [1, BLOCK_K]
            acc2 += w.to(tl.float32) * x.to(tl.float32)
        else:  # every token's x times the same converted weights
            acc3 += w.to(tl.float32) * x.to(tl.float32)  # [1, N, K] x [M, 1, K]
    if not GEMV:
        res = acc  # [BLOCK_N, BLOCK_M]
    elif BLOCK_M == 1:
        res = tl.reshape(tl.sum(acc2, axis=1), (BLOCK_N, 1))
    else:
        res = tl.trans(tl.sum(acc3, axis=2))  # [BLOCK_N, BLOCK_M]

    if REDUCE == 0:
        _epilogue(res, rows, cols, M, N, xs_ptr, ws_ptr, s_xs, s_ws, b_ptr, out_ptr, s_om, HAS_BIAS, SCALED)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        plane = BLOCK_M * BLOCK_N
        counter = count_ptr + tile
        if REDUCE == 1:
            tile_part = part_ptr + tile.to(tl.int64) * (SPLIT_K * plane) + local
            tl.store(tile_part + pid_k * plane, res)
        else:
            tile_part = part_ptr + tile.to(tl.int64) * plane + local
            tl.atomic_add(tile_part, res, sem="relaxed")
        tl.debug_barrier()  # every thread's partial stored before the counter releases them
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            if REDUCE == 1:
                res = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for s in range(SPLIT_K):  # in slice order: the result does not depend on arrival order
                    res += tl.load(tile_part + s * plane, cache_modifier=".cg")
            else:
                res = tl.load(tile_part, cache_modifier=".cg")
                tl.store(tile_part, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32))  # zero for the next call
            tl.atomic_xchg(counter, 0)  # ready for the next call (the counters are cached)
            _epilogue(res, rows, cols, M, N, xs_ptr, ws_ptr, s_xs, s_ws, b_ptr, out_ptr, s_om, HAS_BIAS, SCALED)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_WORKSPACES: dict[torch.device, torch.Tensor] = {}
_PLANS = PlanTable(_skinny_gemm_kernel)
_VARYING = ("x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "b_ptr", "out_ptr", "part_ptr", "count_ptr")


class _Plan:
    """A launch plan of the kernel plus what a call allocates around it (the ordered partials)."""

    __slots__ = ("counters", "launch", "part", "part_shape")

    def __init__(self, launch, part_shape, part, counters):
        self.launch, self.part_shape, self.part, self.counters = launch, part_shape, part, counters

    def __call__(self, x, w, xs, ws, bias, out) -> None:
        part = self.part
        if self.part_shape is not None:
            part = torch.empty(self.part_shape, dtype=torch.float32, device=x.device)
        elif part is None:
            part = out
        counters = self.counters if self.counters is not None else out
        self.launch(x, w, xs if xs is not None else out, ws if ws is not None else out,
                    bias if bias is not None else out, out, part, counters)  # fmt: skip


def _device_sms(x: torch.Tensor) -> int:
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132


def launch_skinny(x, w, bias, out, x_scale=None, w_scale=None, deterministic: bool = True,
                  cfg: SkinnyConfig | None = None) -> None:  # fmt: skip
    """x [M, K] (any strides), w [N, K] (K contiguous, any row stride), bias [N] or None, out
    [M, N] (unit last stride); FP8: x_scale fp32 [M] or [1], w_scale fp32 [N] or [1] (both
    contiguous). ``deterministic``: the ordered split-K reduction, else the atomic one. ``cfg``
    replaces :func:`skinny_config`'s choice (tests, tuning, the dispatch table)."""
    M, K = x.shape
    N = w.shape[0]
    if M == 0 or N == 0:
        return
    dev = x.device
    scaled = x_scale is not None
    key = None
    if x.is_cuda:
        # A launch plan per call signature (_triton_launch): every integer argument and each
        # tensor's dtype and 16-byte alignment are functions of this key (and of cfg: the
        # dispatch table's configurations are frozen dataclasses, made once each).
        key = (x.get_device(), x.shape, x.stride(), N, w.stride(0), out.stride(0), x.dtype, out.dtype,
               None if bias is None else bias.dtype, None if not scaled else (x_scale.numel(), w_scale.numel()),
               deterministic, cfg,
               aligned16(*[t for t in (x, w, x_scale, w_scale, bias, out) if t is not None]))  # fmt: skip
        plan = _PLANS.get(key)
        if plan is not None:
            plan(x, w, x_scale, w_scale, bias, out)
            return
    if cfg is None:
        cfg = skinny_config(M, N, K, x.element_size(), _device_sms(x), hip=torch.version.hip is not None and x.is_cuda)
    block_m, block_n, block_k = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    k_split = triton.cdiv(triton.cdiv(K, cfg.SPLIT_K), block_k) * block_k
    split = triton.cdiv(K, k_split)  # no empty slices
    num_n, num_m = triton.cdiv(N, block_n), triton.cdiv(M, block_m)
    tiles = num_n * num_m
    part_shape = None
    if split == 1:
        reduce, part, counters = REDUCE_NONE, out, out  # not read
    elif deterministic:
        reduce = REDUCE_ORDERED
        part_shape = (tiles, split, block_n, block_m)
        part = torch.empty(part_shape, dtype=torch.float32, device=dev)
        counters = zeroed_buffer(_COUNTERS, dev, tiles, torch.int32)
    else:
        reduce = REDUCE_ATOMIC
        part = zeroed_buffer(_WORKSPACES, dev, tiles * block_m * block_n, torch.float32)
        counters = zeroed_buffer(_COUNTERS, dev, tiles, torch.int32)
    xs = x_scale if scaled else out
    ws = w_scale if scaled else out
    s_xs = (1 if x_scale.numel() > 1 else 0) if scaled else 0
    s_ws = (1 if w_scale.numel() > 1 else 0) if scaled else 0
    args = (x, w, xs, ws, bias if bias is not None else out, out, part, counters,
            M, N, K, k_split, split, x.stride(0), x.stride(1), w.stride(0), out.stride(0), s_xs, s_ws)  # fmt: skip
    kwargs = dict(REDUCE=reduce, HAS_BIAS=bias is not None, SCALED=scaled, EVEN_K=K % block_k == 0,
                  COMPILED=not _interpreting(), **cfg.launch_kwargs())  # fmt: skip
    launch = _PLANS.launch_and_plan(key, (num_n, split, num_m), _VARYING, args, kwargs)
    if launch is not None:
        keep = part if reduce == REDUCE_ATOMIC else None
        _PLANS.put(key, _Plan(launch, part_shape, keep, counters if reduce != REDUCE_NONE else None))
