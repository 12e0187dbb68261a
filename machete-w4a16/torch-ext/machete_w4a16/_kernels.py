"""Triton kernels of machete-w4a16 and their launcher (raw tensors in, nothing checked here: the
public functions in ``__init__`` check arguments first).

Imported lazily: only when a CUDA/ROCm tensor (or a CPU tensor under ``TRITON_INTERPRET=1``)
reaches the op, so the CPU variant works without Triton installed.

The CUDA build also has two compiled kernels, the weights dequantized in registers straight into
tensor-core A operands: a small-M one (csrc/w4a16_mma.cu, op ``w4a16_mma``: mma.sync), which
``select_config`` picks where :func:`mma_supported` (M <= 32, K % 128 == 0, groups >= 32), and
a Hopper large-M one (csrc/w4a16_wgmma.cu, op ``w4a16_wgmma``: wgmma), picked above that where
:func:`wgmma_supported` (capability 9.0, K % 64 == 0, N % 16 == 0, groups >= 32);
``launch_w4a16`` runs them through a ``_CompiledPlan``.

Both Triton kernels compute ``out = x @ dequantize(qw)^T (+ bias)`` with fp32 accumulation,
reading the package's one weight layout (``_format``): qweight int32 [N, K/8] (K contiguous, 8
codes per int32, column 8j + c in nibble slot c // 2 + 4 (c % 2)), scales [K/G, N], zeros uint8
[K/G, N] or None (zero 8), perm [K] or None. A weight tile is dequantized in registers to exactly ``dequantize()``'s values (x's
dtype) and multiplied by ``tl.dot`` (or FMAs):

* ``_w4a16_splitk_kernel`` (small M, the weight stream is the whole cost): one program per
  (BLOCK_N rows of W, K slice, BLOCK_M rows of x); the K slices of a tile store fp32 partials
  and the last to arrive (an acq_rel counter) adds them in slice order (deterministic), adds
  the bias and writes the tile: one launch. ``USE_DOT=False`` (BLOCK_M == 1, GEMV) multiplies
  with FMAs into a [BLOCK_N, BLOCK_K] fp32 accumulator reduced once at the end; ``USE_DOT``
  computes W x^T so W's rows fill the MMA's wide side and the few tokens its narrow one.
* ``_w4a16_tiled_kernel`` (large M): one program per [BLOCK_M, BLOCK_N] output tile in grouped
  order, the whole K loop, ``(W xp^T)^T`` with W's nibble planes as the register A operand and
  xp, x copied into plane order by ``_w4a16_permute_x_kernel`` first.

Dequantization (``_dequant_codes``), compiled: the 4-bit code q is OR-ed into the mantissa of a
16-bit float whose exponent makes it ``1024 + q`` (fp16, 0x6400) or ``128 + q`` (bf16, 0x4300),
a bit cast instead of an int-to-float conversion; subtracting ``1024 + z`` (``128 + z``) is
exact, and one multiply by the scale rounds once, like ``dequantize()``. Interpreter: the same
values computed in fp32 and rounded explicitly (Triton 3.9's interpreter truncates fp32 ->
bf16 and multiplies bf16 dot operands as raw bits), then an fp32 dot.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import _config, _tuning
from ._triton_launch import PlanTable, aligned16, device_name, zeroed_buffer

_COMPILED_OPS: dict[str, object] = {}


def _compiled_op(name: str):
    """A CUDA build's compiled op (``w4a16_mma``: csrc/w4a16_mma.cu; ``w4a16_wgmma``:
    csrc/w4a16_wgmma.cu), or None (CPU / ROCm builds). Looked up on first use, not at import:
    ``fused-llm check-targets`` loads this module without a build's ``_ops.py``."""
    if name not in _COMPILED_OPS:
        try:
            from ._ops import ops
        except ImportError:
            ops = None
        _COMPILED_OPS[name] = getattr(ops, name, None)
    return _COMPILED_OPS[name]


def _mma_op():
    return _compiled_op("w4a16_mma")


def _wgmma_op():
    return _compiled_op("w4a16_wgmma")


@triton.jit
def _round_bf16_rne(v):
    """fp32 v rounded to the nearest bf16 (ties to even), kept in fp32 (interpreter only)."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # 0xFFFF0000 as int32
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dequant_codes(q, s, z, HAS_ZEROS: tl.constexpr, IS_BF16: tl.constexpr, COMPILED: tl.constexpr):
    """4-bit codes q (int32) -> ``(q - z) * s``, rounded once; s (x's dtype) and z (uint8; unused
    without zeros, where z is 8) broadcast against q. Compiled: q is OR-ed into the mantissa of a
    16-bit float of value ``base + q`` (a bit cast, no int-to-float conversion), ``- (base + z)``
    is exact, the multiply rounds once; returns x's dtype. Interpreter: fp32 holding exactly
    those values."""
    if COMPILED:
        if IS_BF16:
            h = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 128 + q, exact
            base = 128.0
        else:
            h = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)  # 1024 + q, exact
            base = 1024.0
        if HAS_ZEROS:
            zz = (z.to(tl.float32) + base).to(h.dtype)  # base + z: exact in 16 bits
        else:
            zz = base + 8.0
        w = ((h - zz) * s).to(h.dtype)  # exact difference, one rounding
    else:
        if HAS_ZEROS:
            zf = z.to(tl.float32)
        else:
            zf = 8.0
        w = (q.to(tl.float32) - zf) * s.to(tl.float32)  # exact in fp32
        if IS_BF16:
            w = _round_bf16_rne(w)
        else:
            w = w.to(tl.float16).to(tl.float32)  # numpy's fp16 conversion rounds to nearest
    return w


@triton.jit
def _dequant(packed, s, z, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GT: tl.constexpr,
             HAS_ZEROS: tl.constexpr, IS_BF16: tl.constexpr, COMPILED: tl.constexpr):  # fmt: skip
    """packed int32 [BLOCK_N, BLOCK_K // 8] -> W tile [BLOCK_N, BLOCK_K] = (q - z) * s.

    s [BLOCK_N, GT] (x's dtype) and z [BLOCK_N, GT] (uint8; unused without zeros): GT groups
    of BLOCK_K // GT consecutive columns each (GT = 1: one group for the whole tile). Returns
    x's dtype when COMPILED, else fp32 holding exactly those values."""
    cols = tl.arange(0, 8)
    shifts = ((cols >> 1) + 4 * (cols & 1)) * 4  # column 8j + c sits in nibble slot c // 2 + 4 (c % 2)
    q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF  # [BN, BK/8, 8]: column 8j + c
    q = tl.reshape(q, (BLOCK_N, GT, BLOCK_K // GT))
    w = _dequant_codes(q, s[:, :, None], z[:, :, None], HAS_ZEROS, IS_BF16, COMPILED)
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _load_step(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, rows_x, cols_w, k0, k_hi, N, K, s_xm, s_xk,
    s_chan, z_chan, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, IS_BF16: tl.constexpr, EVEN_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """The x tile [len(rows_x), BLOCK_K] and the dequantized W tile [BLOCK_N, BLOCK_K] of the K
    step starting at k0 (columns from k_hi on masked to zero). GROUP: the group size, 0 for one
    group per channel (scales s_chan / zeros z_chan [BLOCK_N, 1], loaded once by the caller)."""
    ks = k0 + tl.arange(0, BLOCK_K)
    js = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    p_ptrs = qw_ptr + cols_w.to(tl.int64)[:, None] * (K // 8) + js[None, :]
    if HAS_PERM:
        if EVEN_K:
            xk = tl.load(perm_ptr + ks)
        else:
            xk = tl.load(perm_ptr + ks, mask=ks < k_hi, other=0)
    else:
        xk = ks
    x_ptrs = x_ptr + rows_x.to(tl.int64)[:, None] * s_xm + xk.to(tl.int64)[None, :] * s_xk
    if EVEN_K:
        packed = tl.load(p_ptrs)
        x = tl.load(x_ptrs)
    else:
        packed = tl.load(p_ptrs, mask=(js < k_hi // 8)[None, :], other=0)
        x = tl.load(x_ptrs, mask=(ks < k_hi)[None, :], other=0.0)
    if GROUP == 0:
        w = _dequant(packed, s_chan, z_chan, BLOCK_N, BLOCK_K, 1, HAS_ZEROS, IS_BF16, COMPILED)
    elif GROUP >= BLOCK_K:  # the whole step lies in group k0 // GROUP (GROUP % BLOCK_K == 0)
        g = k0 // GROUP
        s = tl.load(s_ptr + g * N + cols_w)[:, None]
        z = s
        if HAS_ZEROS:
            z = tl.load(z_ptr + g * N + cols_w)[:, None]
        w = _dequant(packed, s, z, BLOCK_N, BLOCK_K, 1, HAS_ZEROS, IS_BF16, COMPILED)
    else:  # BLOCK_K // GROUP groups in the step
        gs = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        gmask = gs < (K // GROUP)
        s = tl.load(s_ptr + gs[None, :] * N + cols_w[:, None], mask=gmask[None, :], other=0.0)
        z = s
        if HAS_ZEROS:
            z = tl.load(z_ptr + gs[None, :] * N + cols_w[:, None], mask=gmask[None, :], other=0)
        w = _dequant(packed, s, z, BLOCK_N, BLOCK_K, BLOCK_K // GROUP, HAS_ZEROS, IS_BF16, COMPILED)
    if not COMPILED:
        x = x.to(tl.float32)
    return x, w


@triton.jit
def _channel_params(s_ptr, z_ptr, cols_w, HAS_ZEROS: tl.constexpr):
    """Per-channel scales / zeros [BLOCK_N, 1] (group size -1: row 0 of [1, N])."""
    s = tl.load(s_ptr + cols_w)[:, None]
    z = s
    if HAS_ZEROS:
        z = tl.load(z_ptr + cols_w)[:, None]
    return s, z


@triton.jit
def _plane_scales(s_ptr, z_ptr, cols_w, jj, jmask, k0, N, s_chan, z_chan, GROUP: tl.constexpr,
                  BLOCK_K: tl.constexpr, HAS_ZEROS: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    """Scales and zeros of the K step at k0 for the nibble planes: [BLOCK_N, 1] when the step
    lies in one group (GROUP 0: per channel, or GROUP >= BLOCK_K), else [BLOCK_N, BLOCK_K / 8]
    (packed column jj holds inputs 8 jj .. 8 jj + 7, all in group 8 jj // GROUP: GROUP >= 8)."""
    if GROUP == 0:
        s = s_chan
        z = z_chan
    elif GROUP >= BLOCK_K:
        g = k0 // GROUP
        s = tl.load(s_ptr + g * N + cols_w)[:, None]
        z = s
        if HAS_ZEROS:
            z = tl.load(z_ptr + g * N + cols_w)[:, None]
    else:
        gs = (8 * jj) // GROUP
        if EVEN_K:
            s = tl.load(s_ptr + gs[None, :] * N + cols_w[:, None])
        else:  # columns past the slice (jmask False) may lie past K's last group
            s = tl.load(s_ptr + gs[None, :] * N + cols_w[:, None], mask=jmask[None, :], other=0.0)
        z = s
        if HAS_ZEROS:
            if EVEN_K:
                z = tl.load(z_ptr + gs[None, :] * N + cols_w[:, None])
            else:
                z = tl.load(z_ptr + gs[None, :] * N + cols_w[:, None], mask=jmask[None, :], other=0)
    return s, z


@triton.jit
def _dequant_plane(packed, i: tl.constexpr, s, z, HAS_ZEROS: tl.constexpr, IS_BF16: tl.constexpr,
                   COMPILED: tl.constexpr):  # fmt: skip
    """Nibble slot i of every packed int32 ([BLOCK_N, J], the inputs 8 j + SLOT_COLUMNS[i])
    dequantized. No reshape: each plane is the packed tile's own shape, so no layout conversion
    runs."""
    return _dequant_codes((packed >> (4 * i)) & 0xF, s, z, HAS_ZEROS, IS_BF16, COMPILED)


@triton.jit
def _join_cols(a, b):
    """[R, C], [R, C] -> [R, 2 C], a's columns first. In the MMA A-operand layout a block of 16
    columns is a block of registers, so this is register renaming: no shared memory, no layout
    conversion (sm90 TTGIR, Triton 3.9: none in the tiled kernel's loop)."""
    R: tl.constexpr = a.shape[0]
    C: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (R, 2 * C))


@triton.jit
def _dequant_planes(packed, s, z, HAS_ZEROS: tl.constexpr, IS_BF16: tl.constexpr, COMPILED: tl.constexpr):
    """packed int32 [R, J] -> W [R, 8 J] in plane order: column J i + jj is nibble plane i's
    column jj (input 8 jj + SLOT_COLUMNS[i] of the window), the order of the tiled kernel's xp.
    Each plane keeps the packed tile's shape (``_dequant_plane``); only whole planes are joined."""
    p01 = _join_cols(_dequant_plane(packed, 0, s, z, HAS_ZEROS, IS_BF16, COMPILED),
                     _dequant_plane(packed, 1, s, z, HAS_ZEROS, IS_BF16, COMPILED))  # fmt: skip
    p23 = _join_cols(_dequant_plane(packed, 2, s, z, HAS_ZEROS, IS_BF16, COMPILED),
                     _dequant_plane(packed, 3, s, z, HAS_ZEROS, IS_BF16, COMPILED))  # fmt: skip
    p45 = _join_cols(_dequant_plane(packed, 4, s, z, HAS_ZEROS, IS_BF16, COMPILED),
                     _dequant_plane(packed, 5, s, z, HAS_ZEROS, IS_BF16, COMPILED))  # fmt: skip
    p67 = _join_cols(_dequant_plane(packed, 6, s, z, HAS_ZEROS, IS_BF16, COMPILED),
                     _dequant_plane(packed, 7, s, z, HAS_ZEROS, IS_BF16, COMPILED))  # fmt: skip
    return _join_cols(_join_cols(p01, p23), _join_cols(p45, p67))


@triton.jit
def _store_out(acc, rows, cols, M, N, b_ptr, out_ptr, s_om, HAS_BIAS: tl.constexpr):
    """acc [len(rows), len(cols)] fp32 (+ bias) -> out, rounded once, rows < M and cols < N."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    o = out_ptr + rows.to(tl.int64)[:, None] * s_om + cols[None, :]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


@triton.jit
def _w4a16_splitk_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, K_SPLIT, s_xm, s_xk, s_om,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_PERM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_BF16: tl.constexpr,
    EVEN_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """out[m, n] = sum_k x[m, perm[k]] W[n, k] (+ bias[n]) for the program's BLOCK_N rows of W
    and BLOCK_M rows of x, over K slice pid_k (K_SPLIT columns, a multiple of BLOCK_K).

    x [M, K] (strides s_xm, s_xk), qw int32 [N, K / 8], scales / zeros [K / GROUP, N], perm
    [K] int32, bias [N], out [M, N] (row stride s_om); part fp32 [tiles, SPLIT_K, BLOCK_M,
    BLOCK_N] and count int32 [tiles] (zero on entry, left zero) when SPLIT_K > 1."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_w = cols % N  # wrapped, never stored: no load masks
    rows_x = rows % M
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    s_chan = tl.zeros((BLOCK_N, 1), dtype=tl.float32)
    z_chan = s_chan
    if GROUP == 0:
        s_chan, z_chan = _channel_params(s_ptr, z_ptr, cols_w, HAS_ZEROS)
    if USE_DOT:
        # tl.dot on the unpacked [BLOCK_N, BLOCK_K] tile (H100, 8B QKV, M = 16: 18.9 us; the
        # nibble-plane order below took 21.5 us at its best configuration, 2026-11-24).
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # (x W^T)^T
        for k0 in range(k_lo, k_hi, BLOCK_K):
            x, w = _load_step(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, rows_x, cols_w, k0, k_hi, N, K, s_xm, s_xk,
                              s_chan, z_chan, GROUP, BLOCK_N, BLOCK_K, HAS_ZEROS, HAS_PERM, IS_BF16, EVEN_K, COMPILED)  # fmt: skip
            acc = tl.dot(w, tl.trans(x), acc)
    else:
        # BLOCK_M == 1 (GEMV), nibble planes: packed column j holds inputs 8j .. 8j+7, nibble
        # slot i input 8j + SLOT_COLUMNS[i]. Unpacking a [BLOCK_N, BLOCK_K] tile is a reshape
        # that Triton lowers to a layout conversion through shared memory (21.5 us at 8B QKV,
        # M = 1, H100); each plane [BLOCK_N, BLOCK_K / 8] times the matching x entries (a
        # strided load of the one x row) keeps the packed tile's layout: 15.9 us at its best
        # configuration (2026-11-24).
        # The same products, summed in another order.
        J: tl.constexpr = BLOCK_K // 8
        js = tl.arange(0, J)
        p_rows = qw_ptr + cols_w.to(tl.int64)[:, None] * (K // 8)
        x_rows = x_ptr + rows_x.to(tl.int64)[:, None] * s_xm
        acc2 = tl.zeros((BLOCK_N, J), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            jj = k0 // 8 + js
            jmask = jj < k_hi // 8
            if EVEN_K:
                packed = tl.load(p_rows + jj[None, :])
            else:
                packed = tl.load(p_rows + jj[None, :], mask=jmask[None, :], other=0)
            s, z = _plane_scales(s_ptr, z_ptr, cols_w, jj, jmask, k0, N, s_chan, z_chan, GROUP, BLOCK_K, HAS_ZEROS, EVEN_K)
            for i in tl.static_range(8):
                kk = 8 * jj + (2 * (i % 4) + i // 4)  # slot i holds column 8j + SLOT_COLUMNS[i]
                if HAS_PERM:
                    if EVEN_K:
                        kk = tl.load(perm_ptr + kk)
                    else:
                        kk = tl.load(perm_ptr + kk, mask=jmask, other=0)
                if EVEN_K:
                    x = tl.load(x_rows + kk.to(tl.int64)[None, :] * s_xk)
                else:
                    x = tl.load(x_rows + kk.to(tl.int64)[None, :] * s_xk, mask=jmask[None, :], other=0.0)
                w = _dequant_plane(packed, i, s, z, HAS_ZEROS, IS_BF16, COMPILED)
                acc2 += w.to(tl.float32) * x.to(tl.float32)
    if USE_DOT:
        res = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    else:
        res = tl.reshape(tl.sum(acc2, axis=1), (1, BLOCK_N))

    if SPLIT_K > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        plane = BLOCK_M * BLOCK_N
        tile_part = part_ptr + tile.to(tl.int64) * (SPLIT_K * plane) + local
        tl.store(tile_part + pid_k * plane, res)
        tl.debug_barrier()  # every thread's partial stored before the counter releases them
        counter = count_ptr + tile
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            res = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):  # in slice order: the result does not depend on arrival order
                res += tl.load(tile_part + s * plane, cache_modifier=".cg")
            tl.atomic_xchg(counter, 0)  # ready for the next call (the counters are cached)
            _store_out(res, rows, cols, M, N, b_ptr, out_ptr, s_om, HAS_BIAS)
    else:
        _store_out(res, rows, cols, M, N, b_ptr, out_ptr, s_om, HAS_BIAS)


@triton.jit
def _w4a16_permute_x_kernel(
    x_ptr, perm_ptr, xp_ptr, M, K, s_xm, s_xk, s_pm,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_PERM: tl.constexpr,
):  # fmt: skip
    """The tiled kernel's x in nibble-plane order: within each window of BLOCK_K columns (J =
    BLOCK_K / 8), ``xp[:, k0 + J i + jj] = x[:, perm[k0 + 8 jj + SLOT_COLUMNS[i]]]`` (perm the
    identity without act order), so plane i's x is the contiguous slice ``xp[:, k0 + J i :
    k0 + J (i + 1)]``; zero where that column lies past K (xp [M, K rounded up to BLOCK_K], row
    stride s_pm: the tiled kernel's x loads need no K mask). One program per BLOCK_M rows and
    window; without act order it reads only the window's 2 BLOCK_K bytes of each row."""
    J: tl.constexpr = BLOCK_K // 8
    k0 = tl.program_id(1) * BLOCK_K
    t = tl.arange(0, BLOCK_K)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    if HAS_PERM:  # a gather through perm: column by column
        i = t // J
        kk = k0 + 8 * (t % J) + 2 * (i % 4) + i // 4  # slot i holds column 8 jj + SLOT_COLUMNS[i]
        valid = kk < K
        kk = tl.load(perm_ptr + kk, mask=valid, other=0)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * s_xm + kk.to(tl.int64)[None, :] * s_xk,
                    mask=rmask[:, None] & valid[None, :], other=0.0)  # fmt: skip
    else:
        # The window as it lies (vector loads), reordered in registers: column 8 jj + 2 a + b
        # goes to plane 4 b + a (SLOT_COLUMNS[4 b + a] = 2 a + b), i.e. [jj, a, b] -> [b, a, jj].
        # The column-by-column gather above ran at 0.9 TB/s (70B down, M = 4096, H100).
        kk = k0 + t
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * s_xm + kk.to(tl.int64)[None, :] * s_xk,
                    mask=rmask[:, None] & (kk < K)[None, :], other=0.0)  # fmt: skip
        x = tl.reshape(tl.permute(tl.reshape(x, (BLOCK_M, J, 4, 2)), (0, 3, 2, 1)), (BLOCK_M, BLOCK_K))
    tl.store(xp_ptr + rows.to(tl.int64)[:, None] * s_pm + (k0 + t)[None, :], x, mask=rmask[:, None])


@triton.jit
def _w4a16_tiled_kernel(
    xp_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, out_ptr,
    M, N, K, s_pm, s_om,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_BF16: tl.constexpr,
    EVEN_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """out[BLOCK_M x BLOCK_N tile] = x W^T (+ bias), the whole K loop; tiles in grouped order
    (GROUP_M row tiles share each column sweep, so W tiles are reused from L2). xp: x in plane
    order (``_w4a16_permute_x_kernel``, same BLOCK_K, act order folded in), [M, K rounded up to
    BLOCK_K], row stride s_pm; the other shapes as in ``_w4a16_splitk_kernel``.

    Swapped operands, (W x^T)^T: each K step loads the packed tile [BLOCK_N, BLOCK_K / 8] once
    and dequantizes it plane by plane into W's columns in plane order (``_dequant_planes``),
    the MMA's A operand straight from registers (sm90: wgmma with A in registers; Triton splits
    the step into two K = 64 wgmmas and keeps one in flight); the xp tile [BLOCK_K, BLOCK_M],
    one contiguous load in the same column order, is the B operand, which the pipeliner copies
    ahead into shared memory with the packed tile. With BLOCK_N = 16 num_warps and groups of
    >= BLOCK_K (or per channel), W never goes through shared memory (sm90 TTGIR, Triton 3.9; the
    earlier tiled kernel unpacked [BLOCK_N, BLOCK_K / 8, 8] codes into [BLOCK_N, BLOCK_K], a
    reshape Triton lowers through shared memory, and stored the tile there as the B operand);
    steps spanning groups (group 32, 64) still convert the W tile through shared memory once a
    step, the scales' gather keeping a layout of its own."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_w = cols % N  # wrapped, never stored: no load masks
    J: tl.constexpr = BLOCK_K // 8
    js = tl.arange(0, J)
    s_chan = tl.zeros((BLOCK_N, 1), dtype=tl.float32)
    z_chan = s_chan
    if GROUP == 0:
        s_chan, z_chan = _channel_params(s_ptr, z_ptr, cols_w, HAS_ZEROS)
    p_rows = qw_ptr + cols_w.to(tl.int64)[:, None] * (K // 8)
    x_tile = xp_ptr + (rows % M).to(tl.int64)[None, :] * s_pm + tl.arange(0, BLOCK_K)[:, None]  # [BLOCK_K, BLOCK_M]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # (x W^T)^T
    for k0 in range(0, K, BLOCK_K):
        jj = k0 // 8 + js
        jmask = jj < K // 8
        if EVEN_K:
            packed = tl.load(p_rows + jj[None, :])
        else:  # past K: code 0, times xp's zeros
            packed = tl.load(p_rows + jj[None, :], mask=jmask[None, :], other=0)
        s, z = _plane_scales(s_ptr, z_ptr, cols_w, jj, jmask, k0, N, s_chan, z_chan, GROUP, BLOCK_K, HAS_ZEROS, EVEN_K)
        w = _dequant_planes(packed, s, z, HAS_ZEROS, IS_BF16, COMPILED)
        xt = tl.load(x_tile + k0)
        if not COMPILED:
            xt = xt.to(tl.float32)
        acc = tl.dot(w, xt, acc)
    _store_out(tl.trans(acc), rows, cols, M, N, b_ptr, out_ptr, s_om, HAS_BIAS)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# Where the small-M split-K kernel stops and the tiled one starts. A structural default, not a
# measurement: the tiled kernel's smallest M tile is 64 rows, so below that it reads all of W
# for mostly-padding tiles. The crossover will be measured on the GPU (benchmarks/suite.py,
# providers ours_splitk / ours_tiled; benchmarks/tune.py picks the kernel per M bucket for the
# shapes it tunes, through _tuning.py) and this set from it.
SMALL_M_MAX = 64


def w4a16_config(M: int, N: int, K: int, group_size: int, sms: int = 132, hip: bool = False,
                 smem: int | None = None) -> dict:
    """Kernel and tile choice (no autotuning: deterministic, and cheap in the interpreter).

    The fallback of :func:`select_config` for shapes the tuning table (``benchmarks/tune.py``)
    does not list. Only the GEMV's BLOCK_N and stages were chosen by measurement (H100,
    2026-11-24, below); the rest are structural defaults, derived as each comment says.

    * M <= SMALL_M_MAX: the split-K kernel; BLOCK_M = 1 (FMA GEMV) at M = 1, else the
      smallest tl.dot tile (16, 32, 64) that holds M; BLOCK_N 128 W rows for the GEMV, 64 for
      tl.dot; BLOCK_K = 128
      (64 contiguous bytes of each W row; for tl.dot one g128 group per step, the GEMV's nibble
      planes take a scale per packed column when a step spans groups); the K split makes about
      4 programs per SM in flight (the weight stream needs many loads in flight per SM), at
      most one slice per K step.
    * larger M: the tiled kernel, tokens x W rows x warps 64 x 64 x 4 to M = 128, 128 x 64 x 4
      to 512, 256 x 128 x 8 above (measured, see the code), K steps of 128 (the smallest whose
      nibble planes make a 16-deep MMA), 8 row tiles per column sweep, 3 stages (2 for groups
      < 128 at 256 tokens; 64 x 64 x 4 everywhere on GPUs with less than 160 KiB of shared
      memory a block, ``smem``: sm86 / sm89). 16 W rows a
      warp (one 64-row wgmma tile per warp group) keeps W in registers: 128 rows on 4 warps
      (two tiles a warp group), 256 on 8, or K steps of 256 put a layout conversion through
      shared memory into the loop (sm90 TTGIR, Triton 3.9). ``hip`` (ROCm): 64 tokens and 2
      stages, within gfx942's 64 KiB of LDS (128 tokens in 3 stages took 96 KiB; not measured
      on an MI300X).

    With the split-K kernel's tl.dot, BLOCK_K never exceeds the group size (K steps inside one
    group need one scale per column) unless the group is smaller than 64 (then the step spans
    BLOCK_K / G groups); the nibble planes (the GEMV's, the tiled kernel's) take a scale per
    packed column when a step spans groups."""
    G = K if group_size == -1 else group_size
    if M <= SMALL_M_MAX:
        block_m = 1 if M == 1 else max(16, triton.next_power_of_2(M))
        block_k = 128
        if G >= 64 and block_m > 1:
            block_k = min(block_k, G)
        # GEMV: 128 W rows, 4 stages (best of 48 configurations at 8B QKV and down, H100,
        # 2026-11-24: 15.9 / 30.7 us against 16.5 / 32.0 with 64 rows, 3 stages).
        block_n = 128 if block_m == 1 else 64
        tiles = triton.cdiv(N, block_n) * triton.cdiv(M, block_m)
        steps = triton.cdiv(K, block_k)
        split = max(1, min(triton.cdiv(4 * sms, tiles), steps))
        return {"kernel": "splitk", "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split,
                "USE_DOT": block_m > 1, "num_warps": 4, "num_stages": 4 if block_m == 1 else 3}  # fmt: skip
    if hip:
        return {"kernel": "tiled", "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8,
                "num_stages": 2}  # fmt: skip
    if smem is not None and smem < 160 * 1024:
        # sm86 / sm89 (99 KiB a block): 256 x 128 tiles took 144 KiB on sm80 code (110 KiB in 2
        # stages); 64 x 64 in 3 stages takes ~60 KiB (+16 KiB for groups < 128). Not measured.
        return {"kernel": "tiled", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4,
                "num_stages": 3}  # fmt: skip
    # Tokens x W rows x warps, the best of 12 configurations per point (BLOCK_M 64 / 128 / 256,
    # 4 / 8 warps with 16 W rows a warp, BLOCK_K 128, 3 stages) at 8B QKV / gate-up / down and 70B
    # down, M = 64 .. 4096 (H100, 2026-11-24): 64 x 64 on 4 warps to M = 128, 128 x 64 on 4 to
    # 512 (256 x 128 on 8 won at 8B gate/up M = 256 only), 256 x 128 on 8 from 1024.
    block_m, block_n, warps = (64, 64, 4) if M <= 128 else (128, 64, 4) if M <= 512 else (256, 128, 8)
    # Groups of 32 / 64 convert the W tile through shared memory (32 KiB at 128 rows): with 256
    # tokens in 3 stages that asked for 240 KiB of the H100's 227 KiB; 2 stages fit.
    stages = 2 if block_m == 256 and G < 128 else 3
    return {"kernel": "tiled", "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128, "GROUP_M": 8,
            "num_warps": warps, "num_stages": stages}  # fmt: skip


_CAPABILITY: dict[int, tuple[int, int]] = {}


def _capability(x: torch.Tensor) -> tuple[int, int]:
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return cap


def mma_shape_ok(M: int, K: int, group_size: int) -> bool:
    """The shapes the compiled small-M kernel takes: 1 <= M <= 32, K a multiple of 128 (a lane's
    window), a group of >= 32 columns or one per channel (a lane's 32 columns of a window in one
    group)."""
    return 1 <= M <= _config.MMA_MAX_M and K % 128 == 0 and (group_size == -1 or group_size >= 32)


def wgmma_shape_ok(M: int, N: int, K: int, group_size: int) -> bool:
    """The shapes the compiled Hopper kernel takes: 1 <= M < 2^24, K a multiple of 64 (a pipeline
    stage), N of 16 (the 16-byte copies of a block's scales and zeros), a group of >= 32 columns
    or one per channel (a stage spans at most two groups)."""
    return 1 <= M < 1 << 24 and K % 64 == 0 and N % 16 == 0 and (group_size == -1 or group_size >= 32)


def mma_supported(x: torch.Tensor, M: int, K: int, group_size: int) -> bool:
    """Whether the compiled small-M kernel can run this call: the CUDA build on a GPU of
    capability >= 8.0 (bf16 mma.sync) and :func:`mma_shape_ok`."""
    if not (x.is_cuda and mma_shape_ok(M, K, group_size)):
        return False
    if _mma_op() is None:
        return False
    return _capability(x)[0] >= 8


def wgmma_supported(x: torch.Tensor, M: int, N: int, K: int, group_size: int) -> bool:
    """Whether the compiled Hopper kernel can run this call: the CUDA build on a GPU of
    capability 9.0 (its code is sm_90a) and :func:`wgmma_shape_ok`."""
    if not (x.is_cuda and wgmma_shape_ok(M, N, K, group_size)):
        return False
    if _wgmma_op() is None:
        return False
    return _capability(x) == (9, 0)


def _wgmma_tensors_ok(out: torch.Tensor, *weight) -> bool:
    """What the Hopper kernel needs of the tensors w4a16_gemm does not check: 16-byte aligned
    weight tensors (its copy engine's boxes) and an output it can write in 16-byte stores."""
    aligned = all(t.data_ptr() % 16 == 0 for t in weight if t is not None)
    return aligned and out.data_ptr() % 16 == 0 and (out.shape[0] <= 1 or out.stride(0) % 8 == 0)


def wgmma_config(M: int, N: int, K: int, sms: int = 132) -> dict:
    """The Hopper kernel's default launch (128 rows of W a block).

    From M = 256: 256 tokens a block (one block an SM). Unsplit where the tiles fill their waves
    of SMs (>= 95%: 8B O at M = 1024, 128 tiles); else, with the tiles in one wave, a K split (a
    thread-block cluster of 2-3 blocks, each slice >= 16 steps of 64) that fills it to >= 95% (70B
    O at M = 256: 64 tiles, 2 blocks each); else stream-K (SPLIT_K 0: every SM an equal run of the
    tiles' steps) where that run is >= 32 steps (70B QKV at M = 256, 80 tiles: 65.5 us against
    84.8 unsplit; 8B QKV at M = 1024, 192 tiles: 75.6 against 84.6 split in 2); else the split
    that fills the wave best (8B QKV at M = 256, 48 tiles: 2, 28.5 us against 29.1 stream-K,
    whose 23 steps a block do not pay for its partials; 8B O, 32 tiles: 3, 22.9 against 25.5).
    Clusters of 4 measured slower than of 2 (8B O at M = 256: 37.8 against 28.6 us: not all fit
    in one wave). H200, in a layer, benchmarks/results/tune_streamk_*: this rule picks the
    fastest 256-token launch at all 24 points of M = 256 / 1024 / 4096 there.
    Below M = 256: 128 tokens past M = 64, else 64 (two blocks an SM), a K split of 4 or 2 where
    the split tiles still fit the SMs' blocks at once and each slice keeps >= 16 steps
    (benchmarks/results/wgmma_split_*). The tuning table (benchmarks/tune.py) holds the measured
    launches of the listed shapes."""
    rows, steps = triton.cdiv(N, 128), K // 64
    if M >= 256:
        tiles = rows * triton.cdiv(M, 256)

        def filled(s: int) -> float:  # the share of the SMs' block slots the launch's waves use
            return tiles * s / (triton.cdiv(tiles * s, sms) * sms)

        splits = [s for s in (1, 2, 3) if s == 1 or (steps >= 16 * s and tiles * s <= sms)]
        full = [s for s in splits if filled(s) >= 0.95]
        if full:
            split = full[0]
        elif tiles * steps >= 32 * sms:
            split = 0  # stream-K
        else:
            split = max(splits, key=filled)
        return {"kernel": "wgmma", "BLOCK_N": 128, "BLOCK_M": 256, "SPLIT_K": split}
    tokens = 128 if M > 64 else 64
    tiles = rows * triton.cdiv(M, tokens)
    split = next((s for s in (4, 2) if tiles * s <= 2 * sms and steps >= 16 * s), 1)
    return {"kernel": "wgmma", "BLOCK_N": 128, "BLOCK_M": tokens, "SPLIT_K": split}


def mma_config(M: int, N: int, K: int, sms: int = 132) -> dict:
    """The compiled kernel's default launch, from two sweeps over the eight Llama-3 8B / 70B
    projections at M = 1 and 16 (split {1, 2, 4} x warps {4, 8} x windows in flight {2, 4}, then
    split {1, 2} x warps x row tiles {1, 2}; H100, 2026-11-24, graph-replayed, L2-rotated;
    benchmarks/results/INDEX.md): no K split (it won everywhere but 70B down at M = 1, by 2%), 8 warps a block up to 384 row tiles at M <= 8 and
    256 beyond (8B QKV at M = 16: 13.3 us with 4 warps, 17.0 with 8), 4 warps on larger N; two
    row tiles per warp past 8 tokens (each x fragment feeds two mmas: one row tile held L1 at
    88% of its throughput there)."""
    tiles = triton.cdiv(N, 16)
    row_tiles = 2 if M > 8 else 1
    return {"kernel": "mma", "SPLIT_K": 1, "num_warps": 8 if tiles <= (3 if M <= 8 else 2) * sms else 4,
            "ROW_TILES": row_tiles}  # fmt: skip


def select_config(M: int, N: int, K: int, group_size: int, x: torch.Tensor) -> dict:
    """The launch ``w4a16_gemm`` uses: the tuning table's entry for this GPU, x's dtype, (N, K),
    group size and M bucket (``_tuning.py``, written by ``benchmarks/tune.py``), else the
    structural default: the compiled small-M kernel where :func:`mma_supported`, else
    :func:`w4a16_config`. No device query while the table is empty."""
    table = _tuning.TABLE
    mma = mma_supported(x, M, K, group_size)
    wgmma = not mma and M > _config.MMA_MAX_M and wgmma_supported(x, M, N, K, group_size)
    compiled = "mma" if mma else "wgmma" if wgmma else None
    if table:
        dtype = str(x.dtype).removeprefix("torch.")
        bucket = _config.tuned_bucket(table, device_name(x.device), dtype, N, K, group_size, M)
        # Where a compiled kernel runs, only an entry of that kernel replaces its default: a
        # Triton entry in the same bucket was measured at the bucket's top M (e.g. 128), past the
        # small-M kernel's range, or without the Hopper kernel among the candidates. One
        # exception: in the bucket of 32 tokens (exactly: not a larger bucket that M falls into
        # where a key has none of 32) tune.py also measures the Hopper kernel against the small-M
        # one (at M = 32 it is faster on four of the eight 8B / 70B projections: 8B gate/up 51.5
        # against 64.5 us, H100, benchmarks/results/wgmma_small_m_*), so a Hopper entry there
        # replaces the small-M kernel where the Hopper kernel can run.
        if bucket is not None:
            m_max, cfg = bucket
            kind = cfg["kernel"] if cfg["kernel"] in ("mma", "wgmma") else None
            hopper_over_mma = (kind == "wgmma" and mma and m_max == _config.MMA_MAX_M
                               and wgmma_supported(x, M, N, K, group_size))  # fmt: skip
            if kind == compiled or hopper_over_mma:
                return cfg
    props = torch.cuda.get_device_properties(x.device) if x.is_cuda else None
    if mma:
        return mma_config(M, N, K, props.multi_processor_count)
    if wgmma:
        return wgmma_config(M, N, K, props.multi_processor_count)
    sms = props.multi_processor_count if props is not None else 132
    smem = getattr(props, "shared_memory_per_block_optin", None) if props is not None else None
    return w4a16_config(M, N, K, group_size, sms, hip=torch.version.hip is not None, smem=smem)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_SPLITK_PLANS = PlanTable(_w4a16_splitk_kernel)
_TILED_PLANS = PlanTable(_w4a16_tiled_kernel)
_PERMUTE_PLANS = PlanTable(_w4a16_permute_x_kernel)
_COMPILED_PLANS: dict[tuple, "_CompiledPlan"] = {}
_SPLITK_VARYING = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "perm_ptr", "b_ptr", "out_ptr", "part_ptr", "count_ptr")
_TILED_VARYING = ("xp_ptr", "qw_ptr", "s_ptr", "z_ptr", "b_ptr", "out_ptr")
_PERMUTE_VARYING = ("x_ptr", "perm_ptr", "xp_ptr")
# Rows per program of the x permutation: a [32, BLOCK_K] tile, 32 elements a thread at 4 warps.
PERMUTE_BLOCK_M = 32


class _SplitPlan:
    """A launch plan of the split-K kernel plus what a call allocates around it (the partials)."""

    __slots__ = ("counters", "launch", "part_shape")

    def __init__(self, launch, part_shape, counters):
        self.launch, self.part_shape, self.counters = launch, part_shape, counters

    def __call__(self, x, qweight, scales, zeros, perm, bias, out) -> None:
        if self.part_shape is not None:
            part, counters = torch.empty(self.part_shape, dtype=torch.float32, device=x.device), self.counters
        else:
            part = counters = out
        self.launch(x, qweight, scales, zeros if zeros is not None else scales, perm if perm is not None else scales,
                    bias if bias is not None else out, out, part, counters)  # fmt: skip


class _CompiledPlan:
    """A launch of a compiled kernel (``w4a16_mma`` / ``w4a16_wgmma``): its launch arguments
    after the group size (tiles, split, the arrival counters), and what the call does to x first
    (act order: the packed column k' reads x[:, perm[k']], so x is gathered once; a layout the
    kernels cannot read in 16-byte units is copied)."""

    __slots__ = ("args", "group_size", "op", "takes_residual")

    def __init__(self, op, group_size: int, args: tuple, takes_residual: bool = False):
        self.op, self.group_size, self.args, self.takes_residual = op, group_size, args, takes_residual

    def __call__(self, x, qweight, scales, zeros, perm, bias, out, residual=None) -> None:
        if perm is not None:
            x = x.index_select(1, perm)
        elif x.stride(1) != 1 or (x.shape[0] > 1 and (x.stride(0) % 8 or x.stride(0) < x.shape[1])) or x.data_ptr() % 16:
            x = x.clone(memory_format=torch.contiguous_format)
        if residual is None:
            self.op(out, x, qweight, scales, zeros, bias, self.group_size, *self.args)
        else:
            if residual.stride(-1) != 1:
                residual = residual.contiguous()
            self.op(out, x, qweight, scales, zeros, bias, self.group_size, *self.args, residual)


def _run_plan(plan, x, qweight, scales, zeros, perm, bias, out, residual) -> None:
    """One plan's launch, the residual added in its epilogue where the kernel takes one (the
    small-M kernel), else by torch afterwards: the same bits either way (the GEMM's rounded
    result plus the residual in fp32, rounded)."""
    if residual is not None and isinstance(plan, _CompiledPlan) and plan.takes_residual:
        plan(x, qweight, scales, zeros, perm, bias, out, residual)
        return
    plan(x, qweight, scales, zeros, perm, bias, out)
    if residual is not None:
        out.add_(residual)


class _TiledPlan:
    """The tiled kernel's two launches: x into nibble-plane order (into a buffer allocated per
    call, like any output: nothing cached outlives a CUDA graph), then the GEMM."""

    __slots__ = ("launch", "permute", "xp_shape")

    def __init__(self, permute, launch, xp_shape):
        self.permute, self.launch, self.xp_shape = permute, launch, xp_shape

    def __call__(self, x, qweight, scales, zeros, perm, bias, out) -> None:
        xp = torch.empty(self.xp_shape, dtype=x.dtype, device=x.device)
        self.permute(x, perm if perm is not None else scales, xp)
        self.launch(xp, qweight, scales, zeros if zeros is not None else scales, bias if bias is not None else out, out)


def launch_w4a16(x, qweight, scales, zeros, perm, bias, out, group_size: int, cfg: dict | None = None,
                 early_weights: bool = False, residual: torch.Tensor | None = None) -> None:
    """x [M, K] (any strides), qweight int32 [N, K/8], scales [K/G, N], zeros uint8 [K/G, N] or
    None, perm int32 [K] or None, bias [N] or None, out [M, N] (unit last stride). ``cfg``:
    `w4a16_config`'s form (tests, tuning); ``cfg["kernel"]`` picks the kernel. None:
    :func:`select_config` (the tuning table, else the structural default). ``early_weights``:
    the caller's promise that the kernel enqueued right before this call did not write qweight,
    scales or zeros; the small-M kernel then reads them while that kernel finishes
    (csrc/w4a16_mma.h). ``cfg["EARLY_WEIGHTS"]``, where given, overrides it. ``residual`` [M, N]
    of x's dtype or None: out = residual + the product (the product rounded, the sum rounded);
    the small-M kernel adds it in its epilogue, the other kernels leave it to ``out.add_``."""
    M, K = x.shape
    N = qweight.shape[0]
    if M == 0 or N == 0:
        return
    dev = x.device
    key = None
    if cfg is None and x.is_cuda:
        # A launch plan per call signature (_triton_launch): every integer argument and each
        # tensor's dtype and 16-byte alignment are functions of this key.
        key = (x.get_device(), x.shape, x.stride(), N, group_size, out.stride(0), x.dtype, zeros is not None,
               perm is not None, None if bias is None else bias.dtype,
               aligned16(*[t for t in (x, qweight, scales, zeros, perm, bias, out) if t is not None]),
               early_weights)  # fmt: skip
        plan = _COMPILED_PLANS.get(key) or _SPLITK_PLANS.get(key) or _TILED_PLANS.get(key)
        if plan is not None:
            _run_plan(plan, x, qweight, scales, zeros, perm, bias, out, residual)
            return
    forced = cfg is not None
    cfg = dict(cfg) if forced else select_config(M, N, K, group_size, x)
    if cfg["kernel"] == "wgmma" and not forced and not _wgmma_tensors_ok(out, qweight, scales, zeros):
        # Views the kernel's 16-byte copies and stores cannot take: the small-M kernel where it
        # runs (a Hopper entry of the 32-token bucket), else the Triton kernels.
        if mma_supported(x, M, K, group_size):
            cfg = mma_config(M, N, K, torch.cuda.get_device_properties(dev).multi_processor_count)
        else:
            cfg = w4a16_config(M, N, K, group_size)
    kernel = cfg.pop("kernel")
    if kernel == "mma":
        if not mma_supported(x, M, K, group_size):
            raise ValueError(f"cfg: the compiled 'mma' kernel cannot run M = {M}, K = {K}, group size {group_size} "
                             f"on {x.device} (needs the CUDA build, capability >= 8.0, M <= {_config.MMA_MAX_M}, "
                             "K % 128 == 0, group size >= 32 or -1)")  # fmt: skip
        # No counters without a K split: a lazily made buffer inside a torch.compile'd CUDA graph
        # (cudagraph trees) would be an untracked allocation of its pool.
        counters = zeroed_buffer(_COUNTERS, dev, triton.cdiv(N, 16), torch.int32) if cfg["SPLIT_K"] > 1 else None
        # RING (default on): the Hopper weight stream where the op can run it (the same bits;
        # csrc/w4a16_mma.h); off keeps the register kernel (a table entry's RING 0, A/B, tests).
        args = (cfg["SPLIT_K"], cfg["num_warps"], cfg["ROW_TILES"], counters, bool(cfg.get("RING", True)),
                bool(cfg.get("EARLY_WEIGHTS", early_weights)))
        plan = _CompiledPlan(_mma_op(), group_size, args, takes_residual=True)
        if key is not None:
            _COMPILED_PLANS[key] = plan
        _run_plan(plan, x, qweight, scales, zeros, perm, bias, out, residual)
        return
    if kernel == "wgmma":
        if not wgmma_supported(x, M, N, K, group_size):
            raise ValueError(f"cfg: the compiled 'wgmma' kernel cannot run M = {M}, N = {N}, K = {K}, group size "
                             f"{group_size} on {x.device} (needs the CUDA build, capability 9.0, K % 64 == 0, "
                             "N % 16 == 0, group size >= 32 or -1)")  # fmt: skip
        if not _wgmma_tensors_ok(out, qweight, scales, zeros):
            raise ValueError("cfg: the compiled 'wgmma' kernel reads and writes in 16-byte units: qweight, scales, "
                             "zeros and out must be 16-byte aligned, out's row stride a multiple of 8")  # fmt: skip
        tile = (cfg["BLOCK_N"], cfg["BLOCK_M"])
        if tile not in _config.WGMMA_TILES:
            raise ValueError(f"cfg: the 'wgmma' kernel's (BLOCK_N, BLOCK_M) must be one of {_config.WGMMA_TILES}, got {tile}")
        split = min(cfg["SPLIT_K"], K // 64, _config.WGMMA_MAX_SPLIT)  # 0: stream-K
        tiles = triton.cdiv(N, tile[0]) * triton.cdiv(M, tile[1])
        # Read only where the split sums through global memory (the op knows which tiles do).
        counters = zeroed_buffer(_COUNTERS, dev, tiles, torch.int32) if split != 1 else None
        args = (_config.WGMMA_TILES.index(tile), split, counters)
        plan = _CompiledPlan(_wgmma_op(), group_size, args)
        if key is not None:
            _COMPILED_PLANS[key] = plan
        _run_plan(plan, x, qweight, scales, zeros, perm, bias, out, residual)
        return
    G = 0 if group_size == -1 else group_size
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    if G and not (G % block_k == 0 or block_k % G == 0):
        raise ValueError(f"cfg: BLOCK_K {block_k} and group size {G} must divide one another")
    common = dict(GROUP=G, HAS_ZEROS=zeros is not None, HAS_PERM=perm is not None, HAS_BIAS=bias is not None,
                  IS_BF16=x.dtype == torch.bfloat16, COMPILED=not _interpreting())  # fmt: skip
    z, p, b = (zeros if zeros is not None else scales), (perm if perm is not None else scales), (bias if bias is not None else out)
    if kernel == "splitk":
        split = cfg.pop("SPLIT_K")
        k_split = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
        split = triton.cdiv(K, k_split)  # no empty slices
        num_n, num_m = triton.cdiv(N, block_n), triton.cdiv(M, block_m)
        if split > 1:
            part = torch.empty((num_n * num_m, split, block_m, block_n), dtype=torch.float32, device=dev)
            counters = zeroed_buffer(_COUNTERS, dev, num_n * num_m, torch.int32)
        else:
            part = counters = out  # not read
        use_dot = cfg.pop("USE_DOT", block_m > 1)
        if not use_dot and block_m != 1:
            raise ValueError(f"cfg: USE_DOT=False needs BLOCK_M 1, got {block_m}")
        args = (x, qweight, scales, z, p, b, out, part, counters, M, N, K, k_split, x.stride(0), x.stride(1), out.stride(0))
        kwargs = dict(SPLIT_K=split, USE_DOT=use_dot, EVEN_K=K % block_k == 0, **common, **cfg)
        grid = (num_n, split, num_m)
        launch = _SPLITK_PLANS.launch_and_plan(key, grid, _SPLITK_VARYING, args, kwargs)
        if launch is not None:
            _SPLITK_PLANS.put(key, _SplitPlan(launch, part.shape if split > 1 else None, counters if split > 1 else None))
    elif kernel == "tiled":
        if block_k < 128:
            raise ValueError(f"cfg: the tiled kernel's BLOCK_K must be >= 128 (K = BLOCK_K / 8 >= 16 per plane MMA), got {block_k}")
        kp = triton.cdiv(K, block_k) * block_k
        xp = torch.empty((M, kp), dtype=x.dtype, device=dev)
        pre_args = (x, p, xp, M, K, x.stride(0), x.stride(1), kp)
        pre_kwargs = dict(BLOCK_M=PERMUTE_BLOCK_M, BLOCK_K=block_k, HAS_PERM=perm is not None, num_warps=4)
        pre_grid = (triton.cdiv(M, PERMUTE_BLOCK_M), kp // block_k)
        permute = _PERMUTE_PLANS.launch_and_plan(key, pre_grid, _PERMUTE_VARYING, pre_args, pre_kwargs, store=False)
        del common["HAS_PERM"]
        args = (xp, qweight, scales, z, b, out, M, N, K, kp, out.stride(0))
        kwargs = dict(EVEN_K=K % block_k == 0, **common, **cfg)
        grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
        # The two plans live on as one _TiledPlan, or not at all (a bare tiled plan would be
        # called with the permutation's arguments).
        launch = _TILED_PLANS.launch_and_plan(key, grid, _TILED_VARYING, args, kwargs, store=False)
        if launch is not None and permute is not None:
            _TILED_PLANS.put(key, _TiledPlan(permute, launch, xp.shape))
    else:
        raise ValueError(f"cfg: kernel must be 'splitk', 'tiled', 'mma' or 'wgmma', got {kernel!r}")
    if residual is not None:  # as _run_plan does for these kernels' plans
        out.add_(residual)
