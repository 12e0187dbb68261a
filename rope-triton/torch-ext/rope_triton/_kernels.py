"""Triton kernels of rope-triton and their launchers (raw tensors in, nothing checked here: the
public functions in ``__init__`` check arguments first). Their launch configurations, and what
picks them: ``_config``.

Imported lazily: only when a CUDA/ROCm tensor (or a CPU tensor under ``TRITON_INTERPRET=1``)
reaches an op, so the CPU variant works without Triton installed.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from ._config import (
    PROJECTION_CONFIGS,
    RmsMatmulRopeConfig,
    RmsMatmulRopeHeadsConfig,
    RmsMatmulRopePersistentConfig,
    RopeConfig,
    _whole_head_config,
    rms_matmul_rope_config,
    rope_config,
)
from ._triton_launch import PlanTable, aligned16, check_override

try:  # the backend-dispatching libdevice (CUDA: __nv_*, ROCm: __ocml_*)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.math import libdevice  # type: ignore[no-redef]


# ---------------------------------------------------------------------------------------------
# Rotary embedding
# ---------------------------------------------------------------------------------------------


@triton.jit
def _round_to(v, dtype: tl.constexpr, bits: tl.constexpr, zero):
    """v rounded to dtype (RNE) and back to fp32: an eager torch op's rounding of its result.
    ``zero`` is a runtime 0 the compiler cannot see through: xor-ing the bits with it keeps the
    round trip (and, for fp32, the separate multiply and add) from being folded or contracted.
    Measured on an H200 without it: 24% of bf16 / fp16 results differed from transformers'
    (one product was left unrounded), and fp32 results by an ulp (fused multiply-add)."""
    return (v.to(dtype).to(bits, bitcast=True) ^ zero.to(bits)).to(dtype, bitcast=True).to(tl.float32)


@triton.jit
def _cos_sin(
    cos_ptr, sin_ptr, inv_freq_ptr, pos, b, s, tmask, c_sb, c_ss, c_srow, c_sj,
    HALF: tl.constexpr, BLOCK_P: tl.constexpr, HF_ROUNDING: tl.constexpr,
    HAS_POS: tl.constexpr, FROM_POSITIONS: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """cos / sin [BLOCK_S, 1, BLOCK_P] in fp32 for the lower (c_lo, s_lo) and upper (c_hi, s_hi)
    halves. FROM_POSITIONS: computed from pos[b, s] * inv_freq[j] in fp32 (accurate libdevice
    cos / sin); else read from the tables at row pos[b, s] (HAS_POS: row stride c_srow) or at
    (b, s) (strides c_sb, c_ss; 0 broadcasts), column j (stride c_sj). HF_ROUNDING reads the
    full-width table: transformers multiplies the upper half by cos[j + HALF].

    Called after the program has issued its q / k loads, and everything that uses ``pos`` is
    in here: any use of a loaded value (even a conversion) waits for the load, so reading cos /
    sin before the q / k loads put two DRAM round trips in series in every program."""
    pairs = tl.arange(0, BLOCK_P)
    if FROM_POSITIONS:
        inv_freq = tl.load(inv_freq_ptr + pairs, mask=pairs < HALF, other=0.0)
        angle = pos.to(tl.float32)[:, None] * inv_freq[None, :]
        if COMPILED:  # libdevice: accurate cos / sin (full range reduction; angles reach 1e5 rad)
            c_lo = libdevice.cos(angle)
            s_lo = libdevice.sin(angle)
        else:  # Triton's interpreter has no libdevice; its tl.cos is numpy's (accurate)
            c_lo = tl.cos(angle)
            s_lo = tl.sin(angle)
        c_hi = c_lo
        s_hi = s_lo
    else:
        if HAS_POS:
            c_row = pos.to(tl.int64) * c_srow
        else:
            c_row = b * c_sb + s * c_ss
        cmask = tmask[:, None] & (pairs[None, :] < HALF)
        c_off = c_row[:, None] + pairs[None, :] * c_sj
        c_lo = tl.load(cos_ptr + c_off, mask=cmask, other=0.0).to(tl.float32)
        s_lo = tl.load(sin_ptr + c_off, mask=cmask, other=0.0).to(tl.float32)
        if HF_ROUNDING:
            c_hi = tl.load(cos_ptr + c_off + HALF * c_sj, mask=cmask, other=0.0).to(tl.float32)
            s_hi = tl.load(sin_ptr + c_off + HALF * c_sj, mask=cmask, other=0.0).to(tl.float32)
        else:
            c_hi = c_lo
            s_hi = s_lo
    return c_lo[:, None, :], s_lo[:, None, :], c_hi[:, None, :], s_hi[:, None, :]  # broadcast over heads


@triton.jit
def _rope_heads(
    x_base,
    o_base,
    tok_off,
    otok_off,
    tmask,
    stride_h,
    ostride_h,
    n_heads,
    h0,
    cos_ptr,
    sin_ptr,
    inv_freq_ptr,
    pos,
    b,
    s,
    c_sb,
    c_ss,
    c_srow,
    c_sj,
    c_lo,
    s_lo,
    c_hi,
    s_hi,
    HALF: tl.constexpr,
    ROT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HF_ROUNDING: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    HAS_POS: tl.constexpr,
    FROM_POSITIONS: tl.constexpr,
    COS_FIRST: tl.constexpr,
    COMPILED: tl.constexpr,
    zero,
):
    """Rotate heads h0 .. h0 + BLOCK_H of BLOCK_S tokens ([BLOCK_S, BLOCK_H, BLOCK_P] tiles;
    tok_off / otok_off [BLOCK_S] are the tokens' offsets in x / o, tmask their validity): pairs
    (j, j + HALF), or (2j, 2j + 1) when INTERLEAVED, j < HALF = ROT / 2; columns ROT ..
    HEAD_DIM are copied when COPY_TAIL. cos / sin ([BLOCK_S, BLOCK_P] rows, shared by the
    program's heads) are read here, after the x loads are issued (`_cos_sin`)."""
    heads = h0 + tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, BLOCK_P)
    hmask = (tmask[:, None] & (heads[None, :] < n_heads))[:, :, None]
    mask = hmask & (pairs[None, None, :] < HALF)
    row = tok_off[:, None, None] + heads[None, :, None] * stride_h
    orow = otok_off[:, None, None] + heads[None, :, None] * ostride_h
    if INTERLEAVED:
        lo_col = 2 * pairs[None, None, :]
        hi_col = lo_col + 1
    else:
        lo_col = pairs[None, None, :]
        hi_col = lo_col + HALF
    x_lo = tl.load(x_base + row + lo_col, mask=mask, other=0.0)
    x_hi = tl.load(x_base + row + hi_col, mask=mask, other=0.0)
    if COPY_TAIL:
        tail = ROT + tl.arange(0, BLOCK_TAIL)[None, None, :]
        tail_mask = hmask & (tail < HEAD_DIM)
        x_tail = tl.load(x_base + row + tail, mask=tail_mask)
    if not COS_FIRST:  # else c_lo .. s_hi came in, read before the branch on q / k
        c_lo, s_lo, c_hi, s_hi = _cos_sin(
            cos_ptr, sin_ptr, inv_freq_ptr, pos, b, s, tmask, c_sb, c_ss, c_srow, c_sj, HALF, BLOCK_P,
            HF_ROUNDING, HAS_POS, FROM_POSITIONS, COMPILED,
        )  # fmt: skip
    dtype = x_lo.dtype
    bits = tl.int16 if dtype != tl.float32 else tl.int32
    lo = x_lo.to(tl.float32)
    hi = x_hi.to(tl.float32)
    if HF_ROUNDING:
        # transformers: q * cos + rotate_half(q) * sin, each op rounded to the dtype.
        out_lo = _round_to(lo * c_lo, dtype, bits, zero) + _round_to(-hi * s_lo, dtype, bits, zero)
        out_hi = _round_to(hi * c_hi, dtype, bits, zero) + _round_to(lo * s_hi, dtype, bits, zero)
    else:
        out_lo = lo * c_lo - hi * s_lo
        out_hi = hi * c_hi + lo * s_hi
    tl.store(o_base + orow + lo_col, out_lo.to(dtype), mask=mask)
    tl.store(o_base + orow + hi_col, out_hi.to(dtype), mask=mask)
    if COPY_TAIL:
        tl.store(o_base + orow + tail, x_tail, mask=tail_mask)


@triton.jit(do_not_specialize=["zero"])
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr,
    cos_ptr, sin_ptr, pos_ptr, inv_freq_ptr,
    S, T,
    q_sb, q_ss, q_sh, k_sb, k_ss, k_sh,
    qo_sb, qo_ss, qo_sh, ko_sb, ko_ss, ko_sh,
    c_sb, c_ss, c_srow, c_sj,
    p_sb, p_ss,
    HQ, HK, HQ_BLOCKS, zero,
    HALF: tl.constexpr,
    ROT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HF_ROUNDING: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    HAS_POS: tl.constexpr,
    FROM_POSITIONS: tl.constexpr,
    COS_FIRST: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """grid = (token blocks of BLOCK_S, q head blocks of BLOCK_HQ + k head blocks of BLOCK_HK);
    token t = (b, s) with b = t // S, t < T = B * S. cos / sin: see `_cos_sin`."""
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    t = pid_t * BLOCK_S + tl.arange(0, BLOCK_S)
    tmask = t < T
    b = (t // S).to(tl.int64)
    s = (t % S).to(tl.int64)
    if HAS_POS or FROM_POSITIONS:  # issued here, first used in _cos_sin
        pos = tl.load(pos_ptr + b * p_sb + s * p_ss, mask=tmask, other=0)
    else:
        pos = b  # not read
    if COS_FIRST:
        c_lo, s_lo, c_hi, s_hi = _cos_sin(
            cos_ptr, sin_ptr, inv_freq_ptr, pos, b, s, tmask, c_sb, c_ss, c_srow, c_sj, HALF, BLOCK_P,
            HF_ROUNDING, HAS_POS, FROM_POSITIONS, COMPILED,
        )  # fmt: skip
    else:
        c_lo, s_lo, c_hi, s_hi = zero, zero, zero, zero  # not read: _rope_heads reads them
    if pid_h < HQ_BLOCKS:
        _rope_heads(
            q_ptr, qo_ptr, b * q_sb + s * q_ss, b * qo_sb + s * qo_ss, tmask, q_sh, qo_sh, HQ,
            pid_h * BLOCK_HQ, cos_ptr, sin_ptr, inv_freq_ptr, pos, b, s, c_sb, c_ss, c_srow, c_sj,
            c_lo, s_lo, c_hi, s_hi, HALF, ROT, HEAD_DIM, BLOCK_HQ, BLOCK_P, BLOCK_TAIL, INTERLEAVED,
            HF_ROUNDING, COPY_TAIL, HAS_POS, FROM_POSITIONS, COS_FIRST, COMPILED, zero,
        )  # fmt: skip
    else:
        _rope_heads(
            k_ptr, ko_ptr, b * k_sb + s * k_ss, b * ko_sb + s * ko_ss, tmask, k_sh, ko_sh, HK,
            (pid_h - HQ_BLOCKS) * BLOCK_HK, cos_ptr, sin_ptr, inv_freq_ptr, pos, b, s, c_sb, c_ss,
            c_srow, c_sj, c_lo, s_lo, c_hi, s_hi, HALF, ROT, HEAD_DIM, BLOCK_HK, BLOCK_P, BLOCK_TAIL,
            INTERLEAVED, HF_ROUNDING, COPY_TAIL, HAS_POS, FROM_POSITIONS, COS_FIRST, COMPILED, zero,
        )  # fmt: skip


# The tensors of a rope launch, in the kernel's parameter order: what changes between calls
# that share a launch plan.
_ROPE_VARYING = ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr", "sin_ptr", "pos_ptr", "inv_freq_ptr")
_ROPE_PLANS = PlanTable(_rope_kernel)


def _interpreting() -> bool:
    """Triton's interpreter (CPU tensors, TRITON_INTERPRET=1): the kernels take their
    COMPILED=False branches, which avoid what it lacks (libdevice, bf16 tl.dot). It also rounds
    fp32 -> bf16 by truncation, not to nearest: bf16 results there are within one ulp."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def launch_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    pos: torch.Tensor | None,
    inv_freq: torch.Tensor | None,
    rotary_dim: int,
    interleaved: bool,
    hf_rounding: bool,
    table_rows: str,
    cfg: RopeConfig | None = None,
):
    """q, k, q_out, k_out: [B, S, H, D] views (any strides, unit last stride); cos/sin: 2-D
    [rows, width] (table_rows = "pos": row pos[b, s]; "bs": 3-D [B or 1, S, width] by (b, s));
    pos: [B or 1, S] int; inv_freq: [rotary_dim / 2] fp32 (then cos/sin are None). ``cfg``:
    a `RopeConfig` that replaces `rope_config`'s pick (tuning, tests; no launch plan then).
    Returns the launch plan of this call signature (called as ``plan(q, k, q_out, k_out, cos,
    sin, pos, inv_freq)``, absent ones replaced by q), or None when it has none."""
    B, S, HQ, D = q.shape
    T = B * S
    if T == 0:
        return None
    # A launch plan per call signature (see _triton_launch): everything below is a function of
    # this key, and a repeated key skips the JIT's per-call argument binding (decode: 40 -> 10 us).
    key = None
    if cfg is None and q.is_cuda:
        key = (
            q.get_device(),  # a plan launches on the GPU it was made on
            q.shape, q.stride(), k.shape, k.stride(), q_out.stride(), k_out.stride(), q.dtype,
            None if cos is None else (cos.shape, cos.stride(), sin.stride(), cos.dtype),
            None if pos is None else (pos.shape, pos.stride(), pos.dtype), inv_freq is not None,
            rotary_dim, interleaved, hf_rounding, table_rows,
            q_out.data_ptr() == q.data_ptr(), k_out.data_ptr() == k.data_ptr(),
            aligned16(*[t for t in (q, k, q_out, k_out, cos, sin, pos, inv_freq) if t is not None]),
        )
        plan = _ROPE_PLANS.get(key)
        if plan is not None:
            dummy = q
            plan(q, k, q_out, k_out, cos if cos is not None else dummy, sin if sin is not None else dummy,
                 pos if pos is not None else dummy, inv_freq if inv_freq is not None else dummy)
            return plan
    HK = k.shape[2]
    half = rotary_dim // 2
    block_p = triton.next_power_of_2(half)
    if cfg is None:
        cfg = rope_config(T, HQ, block_p)
    else:
        check_override(cfg, RopeConfig)
    hq_blocks = triton.cdiv(HQ, cfg.BLOCK_HQ)
    hk_blocks = triton.cdiv(HK, cfg.BLOCK_HK)
    copy_tail = rotary_dim < D and (q_out.data_ptr() != q.data_ptr() or k_out.data_ptr() != k.data_ptr())
    from_positions = inv_freq is not None
    has_pos = pos is not None and not from_positions
    dummy = q  # a valid pointer for the arguments a configuration does not read
    if from_positions:
        c_sb = c_ss = c_srow = c_sj = 0
    elif table_rows == "pos":
        c_sb = c_ss = 0
        c_srow, c_sj = cos.stride(0), cos.stride(1)
    else:
        c_sb, c_ss, c_sj = cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), cos.stride(2)
        c_srow = 0
    p_sb = (pos.stride(0) if pos.shape[0] > 1 else 0) if pos is not None else 0
    p_ss = pos.stride(1) if pos is not None else 0
    grid = (triton.cdiv(T, cfg.BLOCK_S), hq_blocks + hk_blocks)
    args = (
        q, k, q_out, k_out,
        cos if cos is not None else dummy, sin if sin is not None else dummy,
        pos if pos is not None else dummy, inv_freq if inv_freq is not None else dummy,
        S, T,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        c_sb, c_ss, c_srow, c_sj,
        p_sb, p_ss,
        HQ, HK, hq_blocks, 0,
    )  # fmt: skip
    kwargs = dict(
        HALF=half, ROT=rotary_dim, HEAD_DIM=D, BLOCK_P=block_p,
        BLOCK_TAIL=triton.next_power_of_2(max(D - rotary_dim, 1)),
        INTERLEAVED=interleaved, HF_ROUNDING=hf_rounding, COPY_TAIL=copy_tail,
        HAS_POS=has_pos, FROM_POSITIONS=from_positions, COMPILED=not _interpreting(),
        **cfg.launch_kwargs(),
    )  # fmt: skip
    return _ROPE_PLANS.launch_and_plan(key, grid, _ROPE_VARYING, args, kwargs)


# ---------------------------------------------------------------------------------------------
# Fused RMSNorm -> matmul -> RoPE (NeoX half rotation per head)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _dot_t(a, b, acc, COMPILED: tl.constexpr):
    """acc + a @ b^T. In the interpreter with fp32 operands: Triton 3.9's interpreter multiplies
    bf16 operands as raw bits (bf16 / fp16 values are exact in fp32, so nothing is lost)."""
    if COMPILED:
        acc = tl.dot(a, tl.trans(b), acc)
    else:
        acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc)
    return acc


@triton.jit
def _add_squares(x, squares, SQUARES_MMA: tl.constexpr, COMPILED: tl.constexpr):
    """x^2 of one K step added up: elementwise into [BLOCK_M, BLOCK_K] (summed across K once,
    after the loop: no K step pays a cross-thread reduction), or SQUARES_MMA on the tensor
    cores as x x^T into [BLOCK_M, BLOCK_M] (its diagonal is wanted; bf16 / fp16 squares are
    exact in fp32), so the x tile feeds only MMAs when the RMSNorm weight is folded into W.
    (One return, after the if: the compiler does not prune code after a constexpr-if return.)"""
    if SQUARES_MMA:
        squares = _dot_t(x, x, squares, COMPILED)
    else:
        xf = x.to(tl.float32)
        squares = squares + xf * xf
    return squares


@triton.jit
def _row_sums(squares, BLOCK_M: tl.constexpr, SQUARES_MMA: tl.constexpr):
    """sum(x^2) per row from `_add_squares`' accumulator."""
    if SQUARES_MMA:
        diag = tl.arange(0, BLOCK_M)[:, None] == tl.arange(0, BLOCK_M)[None, :]
        sums = tl.sum(tl.where(diag, squares, 0.0), axis=1)
    else:
        sums = tl.sum(squares, axis=1)
    return sums


@triton.jit
def _rsqrt(v, COMPILED: tl.constexpr):
    """1 / sqrt(v): libdevice's where compiled (the interpreter has no libdevice)."""
    if COMPILED:
        r = libdevice.rsqrt(v)
    else:
        r = 1.0 / tl.sqrt(v)
    return r


@triton.jit
def _grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row block, column block) of tile number ``tile`` in grouped order: GROUP_M row blocks per
    sweep over the column blocks, so tiles running together share x rows and W rows in L2."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_size, (tile % per_group) // group_size


@triton.jit
def _rms_matmul_rope_kernel(
    x_ptr, g_ptr, w_ptr, x_desc, w_desc, g_desc, cos_ptr, sin_ptr, out_ptr, part_ptr, sq_ptr, count_ptr,
    M, N, K, K_SPLIT, eps,
    s_xm, s_wn, s_cm, s_cj, s_om,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_NH: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    HAS_G: tl.constexpr,
    SQUARES_MMA: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """out[m, n] for a tile of BLOCK_M tokens x (columns j0 .. j0 + BLOCK_NH of one head's lower
    half, and the same columns + HALF of its upper half). The two halves are two accumulators
    with identical layouts, fed by the same x tile (two tl.dot per K step), so every rotation
    pair (j, j + HALF) sits in one thread and the RoPE epilogue is elementwise.

    acc = (x * g) @ W^T streamed over K (HAS_G False: x @ W^T, g already folded into W), with
    sum(x^2) accumulated from the same x tiles; the RMS scale rsqrt(mean(x^2) + eps) is a
    per-row factor applied to the accumulators, then RoPE.

    SPLIT_K > 1 (decode: few tokens, so few output tiles to spread W's read over the GPU):
    program (m, n, s) covers K range s; it stores its fp32 partial accumulators and sum(x^2),
    and the last of the SPLIT_K programs of a tile to arrive (an acq_rel counter) adds the
    partials in split order (deterministic), runs the epilogue and resets the counter: still one
    launch. GROUP_M > 1 orders the tiles GROUP_M row blocks at a time (x and W reused in L2).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if GROUP_M > 1:
        pid_m, pid_n = _grouped_tile(pid_n * tl.num_programs(0) + pid_m, tl.num_programs(0), tl.num_programs(1), GROUP_M)
    j_blocks: tl.constexpr = HALF // BLOCK_NH
    j0 = (pid_n % j_blocks) * BLOCK_NH
    lo_row0 = (pid_n // j_blocks) * HEAD_DIM + j0  # first W row (= output column) of the lower half
    nn = tl.arange(0, BLOCK_NH)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rows64 = rows.to(tl.int64)

    acc_lo = tl.zeros((BLOCK_M, BLOCK_NH), dtype=tl.float32)
    acc_hi = tl.zeros((BLOCK_M, BLOCK_NH), dtype=tl.float32)
    # x^2: see `_add_squares`
    if SQUARES_MMA:
        squares = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    else:
        squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    # W tiles [BLOCK_NH, BLOCK_K], contiguous along K (nn.Linear rows), transposed for the dot.
    w_lo_tile = w_ptr + (lo_row0 + nn).to(tl.int64)[:, None] * s_wn + ks[None, :]
    w_hi_tile = w_lo_tile + HALF * s_wn
    x_rows = x_ptr + rows64[:, None] * s_xm + ks[None, :]
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if USE_TMA:  # sm90: the copy engine, zero-filled past M and K
            x = x_desc.load([pid_m * BLOCK_M, k0])
            w_lo = w_desc.load([lo_row0, k0])
            w_hi = w_desc.load([lo_row0 + HALF, k0])
        elif EVEN_K:  # no K mask: keeps the loads vectorized (K % BLOCK_K == 0, the usual case)
            x = tl.load(x_rows + k0, mask=rmask[:, None], other=0.0)
            w_lo = tl.load(w_lo_tile + k0)
            w_hi = tl.load(w_hi_tile + k0)
        else:
            kmask = (k0 + ks) < k_hi
            x = tl.load(x_rows + k0, mask=rmask[:, None] & kmask[None, :], other=0.0)
            w_lo = tl.load(w_lo_tile + k0, mask=kmask[None, :], other=0.0)
            w_hi = tl.load(w_hi_tile + k0, mask=kmask[None, :], other=0.0)
        squares = _add_squares(x, squares, SQUARES_MMA, COMPILED)
        if HAS_G:
            g = _load_g(g_desc, g_ptr, k0, K, BLOCK_K, EVEN_K, USE_TMA)
            xg = (x.to(tl.float32) * g.to(tl.float32)).to(x.dtype)
        else:
            xg = x
        acc_lo = _dot_t(xg, w_lo, acc_lo, COMPILED)
        acc_hi = _dot_t(xg, w_hi, acc_hi, COMPILED)
    sumsq = _row_sums(squares, BLOCK_M, SQUARES_MMA)

    if SPLIT_K > 1:
        # partials [SPLIT_K, m_pad, n_tiles * 2 * BLOCK_NH]: this tile's lower then upper half
        n_pad = tl.num_programs(1) * 2 * BLOCK_NH
        m_pad = tl.num_programs(0) * BLOCK_M
        tile_lo = pid_n * 2 * BLOCK_NH + nn
        part = part_ptr + pid_k.to(tl.int64) * m_pad * n_pad + rows64[:, None] * n_pad + tile_lo[None, :]
        tl.store(part, acc_lo)
        tl.store(part + BLOCK_NH, acc_hi)
        sq = sq_ptr + (pid_k * tl.num_programs(1) + pid_n).to(tl.int64) * m_pad + rows64
        tl.store(sq, sumsq)
        tl.debug_barrier()  # every thread's partial stored before the counter releases them
        counter = count_ptr + pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc_lo = tl.zeros((BLOCK_M, BLOCK_NH), dtype=tl.float32)
            acc_hi = tl.zeros((BLOCK_M, BLOCK_NH), dtype=tl.float32)
            sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for s in range(SPLIT_K):  # in split order, so results do not depend on arrival order
                part = part_ptr + s * m_pad * n_pad + rows64[:, None] * n_pad + tile_lo[None, :]
                acc_lo += tl.load(part, cache_modifier=".cg")
                acc_hi += tl.load(part + BLOCK_NH, cache_modifier=".cg")
                sq = sq_ptr + (s * tl.num_programs(1) + pid_n).to(tl.int64) * m_pad + rows64
                sumsq += tl.load(sq, cache_modifier=".cg")
            tl.atomic_xchg(counter, 0)  # ready for the next call (the buffer is cached)
            _rms_rope_epilogue(
                acc_lo, acc_hi, sumsq, rows64, rmask, lo_row0, j0, cos_ptr, sin_ptr, out_ptr, K, eps,
                s_cm, s_cj, s_om, HALF, BLOCK_NH, COMPILED,
            )  # fmt: skip
    else:
        _rms_rope_epilogue(
            acc_lo, acc_hi, sumsq, rows64, rmask, lo_row0, j0, cos_ptr, sin_ptr, out_ptr, K, eps,
            s_cm, s_cj, s_om, HALF, BLOCK_NH, COMPILED,
        )  # fmt: skip


@triton.jit
def _rms_rope_epilogue(
    acc_lo, acc_hi, sumsq, rows64, rmask, lo_row0, j0, cos_ptr, sin_ptr, out_ptr, K, eps,
    s_cm, s_cj, s_om,
    HALF: tl.constexpr, BLOCK_NH: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """RMS scale per row, then each (lower, upper) column pair rotated: elementwise, since the
    two halves are accumulators with the same layout."""
    r = _rsqrt(sumsq / K + eps, COMPILED)
    lo = acc_lo * r[:, None]
    hi = acc_hi * r[:, None]
    nn = tl.arange(0, BLOCK_NH)
    mask = rmask[:, None] & (nn[None, :] >= 0)
    c_off = rows64[:, None] * s_cm + (j0 + nn)[None, :] * s_cj
    c = tl.load(cos_ptr + c_off, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + c_off, mask=mask, other=0.0).to(tl.float32)
    o = out_ptr + rows64[:, None] * s_om + (lo_row0 + nn)[None, :]
    tl.store(o, (lo * c - hi * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o + HALF, (hi * c + lo * s).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_x(x_desc, x_rows, off_m, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr):
    """One K step's x tile [BLOCK_M, BLOCK_K]: TMA (zero-filled past M and K), or pointer loads
    from rows wrapped into range (never stored), masked along K only where K is not a multiple
    of BLOCK_K."""
    if USE_TMA:
        x = x_desc.load([off_m, k0])
    elif EVEN_K:
        x = tl.load(x_rows + k0)
    else:
        x = tl.load(x_rows + k0, mask=((k0 + tl.arange(0, BLOCK_K)) < K)[None, :], other=0.0)
    return x


@triton.jit
def _load_g(g_desc, g_ptr, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr):
    """One K step's RMSNorm weights [1, BLOCK_K]. Through TMA where x and W come that way, so the
    load joins their software pipeline: a pointer load in the K loop is not pipelined (the
    compiled loop issues it synchronously), so every K step waited an L2 round trip for it."""
    if USE_TMA:
        g = g_desc.load([0, k0])
    elif EVEN_K:
        g = tl.load(g_ptr + k0 + tl.arange(0, BLOCK_K))[None, :]
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(g_ptr + ks, mask=ks < K, other=0.0)[None, :]
    return g


@triton.jit
def _load_x_w(x_desc, w_desc, x_rows, w_rows, off_m, off_n, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
              USE_TMA: tl.constexpr):  # fmt: skip
    """One K step's x [BLOCK_M, BLOCK_K] and W [BLOCK_N, BLOCK_K] tiles (see `_load_x`)."""
    return (_load_x(x_desc, x_rows, off_m, k0, K, BLOCK_K, EVEN_K, USE_TMA),
            _load_x(w_desc, w_rows, off_n, k0, K, BLOCK_K, EVEN_K, USE_TMA))  # fmt: skip


@triton.jit
def _whole_head_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row offset, column offset) of tile number ``tile`` in grouped order (`_grouped_tile`)."""
    pid_m, pid_n = _grouped_tile(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _rms_matmul_rope_heads_kernel(
    x_ptr, g_ptr, w_ptr, x_desc, w_desc, g_desc, cos_ptr, sin_ptr, out_ptr,
    M, N, K, eps,
    s_xm, s_wn, s_cm, s_cj, s_om,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    HAS_G: tl.constexpr,
    SQUARES_MMA: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """The prefill form of `_rms_matmul_rope_kernel`: a tile is BLOCK_M tokens x HEADS whole
    heads (HEADS * HEAD_DIM consecutive W rows, one accumulator, one tl.dot per K step: the
    128 x 256 tile of a cuBLAS-class GEMM), and the epilogue splits each head's columns into
    its two halves (reshape [BLOCK_M, HEADS, 2, HALF] -> [.., HALF, 2] -> split): a register
    shuffle once per tile instead of two half-width dots every K step. HALF a power of two.
    Grouped tile order (GROUP_M row blocks per column sweep: x and W reused in L2)."""
    BLOCK_N: tl.constexpr = HEADS * HEAD_DIM
    off_m, off_n = _whole_head_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = off_m + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)
    ks = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SQUARES_MMA:
        squares = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    else:
        squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    x_rows = x_ptr + (rows % M).to(tl.int64)[:, None] * s_xm + ks[None, :]
    w_rows = w_ptr + ((off_n + tl.arange(0, BLOCK_N)) % N).to(tl.int64)[:, None] * s_wn + ks[None, :]
    for k0 in range(0, K, BLOCK_K):
        x, w = _load_x_w(x_desc, w_desc, x_rows, w_rows, off_m, off_n, k0, K, BLOCK_K, EVEN_K, USE_TMA)
        squares = _add_squares(x, squares, SQUARES_MMA, COMPILED)
        if HAS_G:
            g = _load_g(g_desc, g_ptr, k0, K, BLOCK_K, EVEN_K, USE_TMA)
            xg = (x.to(tl.float32) * g.to(tl.float32)).to(x.dtype)
        else:
            xg = x
        acc = _dot_t(xg, w, acc, COMPILED)
    acc = acc * _rsqrt(_row_sums(squares, BLOCK_M, SQUARES_MMA) / K + eps, COMPILED)[:, None]
    _rope_heads_epilogue(acc, rows64, rows < M, off_n, N, cos_ptr, sin_ptr, out_ptr, s_cm, s_cj, s_om, BLOCK_M, HEADS,
                         HEAD_DIM, HALF)  # fmt: skip


@triton.jit
def _load_shares(sq_ptr, rows, n_shares, m_pad, ready, MAX_SHARES: tl.constexpr):
    """sum(x^2) of rows from the shares published by the first round of
    `_rms_matmul_rope_persistent_kernel`: one 2-D load (one L2 round trip, not one per share),
    added up in a fixed order. Nothing is read where ``ready`` is false."""
    share = tl.arange(0, MAX_SHARES)
    valid = share < tl.where(ready, n_shares, 0)  # (a scalar mask operand: the interpreter rejects it)
    parts = tl.load(sq_ptr + share[:, None] * m_pad + rows[None, :], mask=valid[:, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
    return tl.sum(parts, axis=0)


@triton.jit
def _wait_for_shares(count_ptr, n_prog, SPIN_LIMIT: tl.constexpr):
    """True once every program of the first round has published its share of sum(x^2) (acquire
    loads of the count). False past SPIN_LIMIT polls: the grid was not all resident (another
    kernel holds SMs, or Triton's interpreter runs programs one at a time), and the caller sums
    its rows itself, so a program never waits on one that cannot start."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    polls = seen * 0
    while (seen < n_prog) & (polls < SPIN_LIMIT):
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        polls += 1
    return seen >= n_prog


@triton.jit
def _x_row_sums(x_ptr, rows, M, K, s_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """sum(x^2) of rows read straight from x (the fallback of `_wait_for_shares`)."""
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + (rows % M).to(tl.int64)[:, None] * s_xm
    sums = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xf = tl.load(x_rows + (k0 + ks)[None, :], mask=((k0 + ks) < K)[None, :], other=0.0).to(tl.float32)
        sums += tl.sum(xf * xf, axis=1)
    return sums


@triton.jit
def _rope_heads_epilogue(acc, rows64, rmask, off_n, N, cos_ptr, sin_ptr, out_ptr, s_cm, s_cj, s_om,
                         BLOCK_M: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr):  # fmt: skip
    """RoPE on a [BLOCK_M, HEADS * HEAD_DIM] tile of whole heads, already RMS-scaled: each head's
    columns split into its two halves (reshape [BLOCK_M, HEADS, 2, HALF] -> [.., HALF, 2] ->
    split), rotated, stored. HALF a power of two."""
    lo, hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, HEADS, 2, HALF)), (0, 1, 3, 2)))
    jj = tl.arange(0, HALF)
    heads = tl.arange(0, HEADS)
    c_off = rows64[:, None] * s_cm + jj[None, :] * s_cj
    c = tl.load(cos_ptr + c_off, mask=rmask[:, None], other=0.0).to(tl.float32)[:, None, :]
    s = tl.load(sin_ptr + c_off, mask=rmask[:, None], other=0.0).to(tl.float32)[:, None, :]
    col = off_n + heads[None, :, None] * HEAD_DIM + jj[None, None, :]
    mask = rmask[:, None, None] & (col < N)
    o = out_ptr + rows64[:, None, None] * s_om + col
    tl.store(o, (lo * c - hi * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o + HALF, (hi * c + lo * s).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _shares_of(row_block, n_prog, num_m):
    """How many first-round programs (p % num_m == row_block, p < n_prog) share a row block's x^2."""
    return (n_prog - 1 - row_block) // num_m + 1


@triton.jit
def _rms_matmul_rope_persistent_kernel(
    x_ptr, w_ptr, x_desc, w_desc, cos_ptr, sin_ptr, out_ptr, sq_ptr, count_ptr,
    M, N, K, eps,
    s_xm, s_wn, s_cm, s_cj, s_om,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    MAX_SHARES: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """Prefill, RMSNorm weight folded into W: one program per SM looping over tiles of BLOCK_M
    tokens x HEADS whole heads (x @ W^T on the tensor cores, RMS scale and RoPE in the epilogue),
    in grouped order (`_whole_head_tile`).

    sum(x^2) without paying for it in every tile. Computed in each tile (x x^T on the MMA, as
    `_rms_matmul_rope_heads_kernel` does) it costs 25% more MMA work at 64 x 256 tiles and 50%
    at 128 x 256. Here only the first round's tiles compute it, each a share: program p sums
    row block p % num_m over share p // num_m of the K steps (x' x'^T on the MMA, x' a second x
    tile loaded in those steps only), stores the sums to sq[share] and counts them (release).
    A program's first epilogue waits for all shares (acquire; the first round is resident at
    once, one program per SM, so the wait is short); later tiles load their sums before the
    mainloop.

    count_ptr: [0] shares published, [1] programs done, both zero at rest: the last program out
    zeroes them (no memset per call; CUDA-graph safe)."""
    BLOCK_N: tl.constexpr = HEADS * HEAD_DIM
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    num_m = tl.cdiv(M, BLOCK_M)
    k_steps = tl.cdiv(K, BLOCK_K)
    m_pad = num_m * BLOCK_M
    ks = tl.arange(0, BLOCK_K)
    # this program's share of sum(x^2): row block sq_m, K steps [sq_lo, sq_hi), first tile only
    sq_m = pid % num_m
    share = pid // num_m
    sq_shares = _shares_of(sq_m, n_prog, num_m)
    sq_lo = share * k_steps // sq_shares
    sq_hi = (share + 1) * k_steps // sq_shares
    sq_rows = sq_m * BLOCK_M + tl.arange(0, BLOCK_M)
    sq_x_rows = x_ptr + (sq_rows % M).to(tl.int64)[:, None] * s_xm + ks[None, :]
    ready = pid < 0  # all shares seen (a tensor: reassigned in the loop)
    for tile in range(pid, num_m * tl.cdiv(N, BLOCK_N), n_prog):
        off_m, off_n = _whole_head_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = off_m + tl.arange(0, BLOCK_M)
        tile_shares = _shares_of(off_m // BLOCK_M, n_prog, num_m)
        x_rows = x_ptr + (rows % M).to(tl.int64)[:, None] * s_xm + ks[None, :]
        w_rows = w_ptr + ((off_n + tl.arange(0, BLOCK_N)) % N).to(tl.int64)[:, None] * s_wn + ks[None, :]
        sums = _load_shares(sq_ptr, rows, tile_shares, m_pad, ready, MAX_SHARES)
        # the first tile's share steps first (with x' x'^T), then the rest: [hi, k_steps), [0, lo)
        first = tile == pid
        lo = tl.where(first, sq_lo, 0)
        hi = tl.where(first, sq_hi, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        squares = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
        for step in range(lo, hi):
            x, w = _load_x_w(x_desc, w_desc, x_rows, w_rows, off_m, off_n, step * BLOCK_K, K, BLOCK_K, EVEN_K, USE_TMA)
            xs = _load_x(x_desc, sq_x_rows, sq_m * BLOCK_M, step * BLOCK_K, K, BLOCK_K, EVEN_K, USE_TMA)
            squares = _dot_t(xs, xs, squares, COMPILED)
            acc = _dot_t(x, w, acc, COMPILED)
        for j in range(0, k_steps - (hi - lo)):
            step = hi + j
            step = tl.where(step >= k_steps, step - k_steps, step)
            x, w = _load_x_w(x_desc, w_desc, x_rows, w_rows, off_m, off_n, step * BLOCK_K, K, BLOCK_K, EVEN_K, USE_TMA)
            acc = _dot_t(x, w, acc, COMPILED)
        if first:
            tl.store(sq_ptr + share * m_pad + sq_rows, _row_sums(squares, BLOCK_M, True))
            tl.debug_barrier()  # every thread's sums stored before the count releases them
            tl.atomic_add(count_ptr, 1, sem="release")
        if ready == 0:
            ready = _wait_for_shares(count_ptr, n_prog, SPIN_LIMIT)
            if ready:
                sums = _load_shares(sq_ptr, rows, tile_shares, m_pad, ready, MAX_SHARES)
            else:
                sums = _x_row_sums(x_ptr, rows, M, K, s_xm, BLOCK_M, BLOCK_K)
        acc = acc * _rsqrt(sums / K + eps, COMPILED)[:, None]
        _rope_heads_epilogue(acc, rows.to(tl.int64), rows < M, off_n, N, cos_ptr, sin_ptr, out_ptr, s_cm, s_cj, s_om,
                             BLOCK_M, HEADS, HEAD_DIM, HALF)  # fmt: skip
    done = tl.atomic_add(count_ptr + 1, 1, sem="acq_rel")
    if done == n_prog - 1:  # every program is past its waits
        tl.atomic_xchg(count_ptr, 0)
        tl.atomic_xchg(count_ptr + 1, 0)


@triton.jit
def _rms_norm_kernel(
    x_ptr, g_ptr, out_ptr, K, eps, s_xm, s_om, BLOCK: tl.constexpr, HAS_G: tl.constexpr, COMPILED: tl.constexpr
):  # fmt: skip
    """out[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * g (no g when HAS_G is False: folded into
    W), one row per program (fp32 math, one rounding): the first step of the unfused projection."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + row * s_xm + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        squares += x * x
    r = _rsqrt(tl.sum(squares, axis=0) / K + eps, COMPILED)
    for k0 in range(0, K, BLOCK):
        mask = k0 + cols < K
        x = tl.load(x_ptr + row * s_xm + k0 + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * r
        if HAS_G:
            y = y * tl.load(g_ptr + k0 + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * s_om + k0 + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_unfused_projection(
    x: torch.Tensor, g: torch.Tensor | None, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    out: torch.Tensor, eps: float, head_dim: int,
) -> None:  # fmt: skip
    """The same result in three launches: RMSNorm (Triton) -> x_n @ w^T (cuBLAS, into out) ->
    RoPE in place on out (the rotary kernel). What ``impl="auto"`` runs where the one-launch
    kernel measured slower (see `rms_norm_matmul_rope`)."""
    M, K = x.shape
    if M == 0 or w.shape[0] == 0:
        return
    x_n = torch.empty_like(x)
    block = min(triton.next_power_of_2(K), 4096)
    _rms_norm_kernel[(M,)](x, g if g is not None else x, x_n, K, eps, x.stride(0), x_n.stride(0), BLOCK=block,
                           HAS_G=g is not None, COMPILED=not _interpreting(), num_warps=max(1, min(8, block // 512)))  # fmt: skip
    torch.mm(x_n, w.t(), out=out)
    rot = out.view(1, M, w.shape[0] // head_dim, head_dim)
    half = head_dim // 2
    launch_rope(rot, rot[:, :, :0], rot, rot[:, :, :0], cos[None, :, :half], sin[None, :, :half], None, None,
                head_dim, False, False, "bs")  # fmt: skip


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """The split-K arrival counters: zeroed once per device and left zeroed by the kernel
    (the last program of a tile resets its counter), so a call costs no memset. Calls on
    concurrent streams of one device share them: not supported (one stream at a time)."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def launch_rms_matmul_rope(
    x: torch.Tensor,
    g: torch.Tensor | None,
    w: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    head_dim: int,
    cfg: RmsMatmulRopeConfig | RmsMatmulRopeHeadsConfig | RmsMatmulRopePersistentConfig | None = None,
) -> None:
    """x [M, K] (unit last stride), g [K] or None (folded into w), w [N, K] (unit last stride), cos/sin [M, >= head_dim/2]
    (column j of the first half is used), out [M, N]. ``cfg``: one of the projection's
    configurations, which replaces `rms_matmul_rope_config`'s pick (tuning, tests); its USE_TMA
    None is decided here."""
    M, K = x.shape
    N = w.shape[0]
    if M == 0 or N == 0:
        return
    if cfg is None:
        cfg = rms_matmul_rope_config(M, K, head_dim, folded=g is None, tma=_use_tma(x, w, g))
    else:
        _check_projection_override(cfg, g, head_dim)
        if cfg.USE_TMA is None:
            cfg = dataclasses.replace(cfg, USE_TMA=_use_tma(x, w, g))
    if isinstance(cfg, RmsMatmulRopePersistentConfig):
        if _launch_persistent(x, w, cos, sin, out, eps, head_dim, cfg):
            return
        cfg = _whole_head_config(head_dim, cfg.USE_TMA)  # more row blocks than programs: x^2 in every tile
    if isinstance(cfg, RmsMatmulRopeHeadsConfig):
        _launch_heads(x, g, w, cos, sin, out, eps, head_dim, cfg)
        return
    block_k = cfg.BLOCK_K
    k_split = triton.cdiv(triton.cdiv(K, cfg.SPLIT_K), block_k) * block_k
    split = triton.cdiv(K, k_split)  # no empty splits
    if split != cfg.SPLIT_K:
        cfg = dataclasses.replace(cfg, SPLIT_K=split)
    block_n = 2 * cfg.BLOCK_NH
    x_desc, w_desc, g_desc = _descriptors(x, w, g, cfg.BLOCK_M, cfg.BLOCK_NH, block_k, cfg.USE_TMA)
    grid = (triton.cdiv(M, cfg.BLOCK_M), N // block_n, split)
    if split > 1:
        m_pad, n_pad = grid[0] * cfg.BLOCK_M, grid[1] * block_n
        part = torch.empty((split, m_pad, n_pad), dtype=torch.float32, device=x.device)
        sq = torch.empty((split, grid[1], m_pad), dtype=torch.float32, device=x.device)
        counters = _split_counters(x.device, grid[0] * grid[1])
    else:
        part = sq = counters = out  # not read
    _rms_matmul_rope_kernel[grid](
        x, g if g is not None else x, w, x_desc, w_desc, g_desc, cos, sin, out, part, sq, counters,
        M, N, K, k_split, eps,
        x.stride(0), w.stride(0), cos.stride(0), cos.stride(1), out.stride(0),
        HEAD_DIM=head_dim, HALF=head_dim // 2, EVEN_K=K % block_k == 0, HAS_G=g is not None,
        COMPILED=not _interpreting(), **cfg.launch_kwargs(),
    )  # fmt: skip


def _check_projection_override(cfg, g: torch.Tensor | None, head_dim: int) -> None:
    """What a caller's configuration must fit besides its own fields (picked ones always do)."""
    check_override(cfg, *PROJECTION_CONFIGS)
    name = type(cfg).__name__
    if isinstance(cfg, RmsMatmulRopeConfig):
        if (head_dim // 2) % cfg.BLOCK_NH:
            raise ValueError(f"cfg: {name}.BLOCK_NH must divide head_dim / 2 = {head_dim // 2}, got {cfg.BLOCK_NH}")
        return
    if head_dim & (head_dim - 1):
        raise ValueError(f"cfg: {name} (whole-head tiles) needs a power-of-two head_dim, got {head_dim}")
    if isinstance(cfg, RmsMatmulRopePersistentConfig) and g is not None:
        raise ValueError(f"cfg: {name} takes the RMSNorm weight folded into w (g None), got a g")


def _use_tma(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor | None = None) -> bool:
    """Hopper's copy engine: CUDA sm90, 16-byte aligned bases and row strides (g, the RMSNorm
    weight where passed, read as one row [1, K])."""
    rows = (x, w) if g is None else (x, w, g.view(1, -1))
    return (
        x.is_cuda and torch.version.hip is None and not _interpreting()
        and torch.cuda.get_device_capability(x.device)[0] == 9
        and all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in rows)
    )  # fmt: skip


def _descriptors(x, w, g, block_m: int, block_n: int, block_k: int, tma: bool):
    """TMA descriptors of x, w and g (the RMSNorm weight as one row [1, K]; None: folded), or
    placeholders (never read) on the pointer path."""
    if not tma:
        return x, x, x
    from triton.tools.tensor_descriptor import TensorDescriptor

    g_desc = TensorDescriptor.from_tensor(g.view(1, -1), [1, block_k]) if g is not None else x
    return (TensorDescriptor.from_tensor(x, [block_m, block_k]), TensorDescriptor.from_tensor(w, [block_n, block_k]),
            g_desc)  # fmt: skip


# Polls of the shares counter (each an L2 atomic round trip, under a microsecond) before a
# program sums its rows itself: first-round waits measured a few microseconds; the limit only
# matters when the grid is not all resident (see `_wait_for_shares`).
_SPIN_LIMIT = 1 << 14


def _launch_persistent(x, w, cos, sin, out, eps: float, head_dim: int, cfg: RmsMatmulRopePersistentConfig) -> bool:
    """`_rms_matmul_rope_persistent_kernel`: one program per SM (``cfg.PROGRAMS`` to override; in
    the interpreter, one per row block). False, having launched nothing, where there are more
    row blocks than programs (each row block needs a share of x^2 from the first round)."""
    M, K = x.shape
    N = w.shape[0]
    block_m, block_k = cfg.BLOCK_M, cfg.BLOCK_K
    block_n = cfg.HEADS * head_dim
    num_m = triton.cdiv(M, block_m)
    programs = cfg.PROGRAMS
    if programs is None:
        programs = num_m if _interpreting() else torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = min(programs, num_m * triton.cdiv(N, block_n))
    if programs < num_m:
        return False
    sq = torch.empty((triton.cdiv(programs, num_m), num_m * block_m), dtype=torch.float32, device=x.device)
    x_desc, w_desc, _ = _descriptors(x, w, None, block_m, block_n, block_k, cfg.USE_TMA)
    _rms_matmul_rope_persistent_kernel[(programs,)](
        x, w, x_desc, w_desc, cos, sin, out, sq, _split_counters(x.device, 2),
        M, N, K, eps,
        x.stride(0), w.stride(0), cos.stride(0), cos.stride(1), out.stride(0),
        HEAD_DIM=head_dim, HALF=head_dim // 2, MAX_SHARES=triton.next_power_of_2(sq.shape[0]),
        EVEN_K=K % block_k == 0, SPIN_LIMIT=4 if _interpreting() else _SPIN_LIMIT,
        COMPILED=not _interpreting(), **cfg.launch_kwargs(),
    )  # fmt: skip
    return True


def _launch_heads(x, g, w, cos, sin, out, eps: float, head_dim: int, cfg: RmsMatmulRopeHeadsConfig) -> None:
    M, K = x.shape
    N = w.shape[0]
    block_m, block_k = cfg.BLOCK_M, cfg.BLOCK_K
    block_n = cfg.HEADS * head_dim
    x_desc, w_desc, g_desc = _descriptors(x, w, g, block_m, block_n, block_k, cfg.USE_TMA)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _rms_matmul_rope_heads_kernel[grid](
        x, g if g is not None else x, w, x_desc, w_desc, g_desc, cos, sin, out,
        M, N, K, eps,
        x.stride(0), w.stride(0), cos.stride(0), cos.stride(1), out.stride(0),
        HEAD_DIM=head_dim, HALF=head_dim // 2, HAS_G=g is not None, EVEN_K=K % block_k == 0,
        COMPILED=not _interpreting(), **cfg.launch_kwargs(),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# One-token decode attention over a static cache (grouped K / V heads, a boolean mask)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _decode_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, part_ptr, lse_ptr,
    L, CHUNK, scale, H,
    s_qb, s_qh, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ml,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_L: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """One program: sequence b, K / V head h_kv, cache slots [s * CHUNK, (s + 1) * CHUNK). The
    GROUP query heads that read this K / V head (GQA) are the rows of one tl.dot tile (padded to
    GROUP_P >= 16 rows, the MMA's least), so each K / V slot is read once per sequence. Online
    softmax over the slice in fp32; writes the slice's normalized output part [S, B, H, D] and
    its log-sum-exp lse [S, B, H] (-inf where every slot of the slice is masked)."""
    bh = tl.program_id(0)
    s = tl.program_id(1)
    H_kv = H // GROUP
    b = bh // H_kv
    h_kv = bh % H_kv
    rows = tl.arange(0, GROUP_P)
    d = tl.arange(0, HEAD_DIM)
    live = rows < GROUP
    heads = h_kv * GROUP + rows
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * s_qb + heads[:, None].to(tl.int64) * s_qh + d[None, :], mask=live[:, None], other=0.0)
    k_head = k_ptr + b64 * s_kb + h_kv.to(tl.int64) * s_kh
    v_head = v_ptr + b64 * s_vb + h_kv.to(tl.int64) * s_vh
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM], tl.float32)
    lo = s * CHUNK
    hi = tl.minimum(lo + CHUNK, L)
    for n0 in range(lo, hi, BLOCK_L):
        pos = n0 + tl.arange(0, BLOCK_L)
        valid = tl.load(mask_ptr + b64 * s_mb + pos.to(tl.int64) * s_ml, mask=pos < hi, other=0) != 0
        k = tl.load(k_head + pos[:, None].to(tl.int64) * s_kl + d[None, :], mask=valid[:, None], other=0.0)
        if COMPILED:
            sc = tl.dot(q, tl.trans(k))
        else:  # the interpreter multiplies 16-bit dot operands as raw bits (see _dot_t)
            sc = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
        sc = tl.where(valid[None, :], sc * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no valid slot yet: exp(-inf) = 0
        p = tl.exp(sc - m_ref[:, None])
        alpha = tl.exp(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + pos[:, None].to(tl.int64) * s_vl + d[None, :], mask=valid[:, None], other=0.0)
        if COMPILED:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    B = tl.num_programs(0) // H_kv
    row = (s * B + b).to(tl.int64) * H + heads
    tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=live[:, None])
    tl.store(lse_ptr + row, lse, mask=live)


@triton.jit
def _decode_attention_combine_kernel(
    part_ptr, lse_ptr, out_ptr, BH, S, s_ob, s_oh, H,
    S_P: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """out[b, h] = the slices' parts weighted by exp(lse - max lse), over their sum. A head
    whose every slot is masked gets 0 / 0 = NaN, as SDPA's math gives for an all -inf row."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    sl = tl.arange(0, S_P)
    d = tl.arange(0, HEAD_DIM)
    lse = tl.load(lse_ptr + sl.to(tl.int64) * BH + bh, mask=sl < S, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    part = tl.load(part_ptr + (sl.to(tl.int64) * BH + bh)[:, None] * HEAD_DIM + d[None, :], mask=(sl < S)[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b.to(tl.int64) * s_ob + h.to(tl.int64) * s_oh + d, out.to(out_ptr.dtype.element_ty))


# Slots a program reads at least, and the programs aimed for: about two per SM over every
# sequence and K / V head. The probe of 2026-11-29 (H200, 32 / 8 heads, D 128, one sequence;
# benchmarks/results/decode_attention_split_kv_probe_*) read 6.4 / 9.0 / 11.8 us a layer at 540 /
# 2070 / 4128 valid slots with 64-slot blocks and 10-22 slices of 64-192 slots; cuDNN 13.8 / 15.1 /
# 18.7 us in the same graphs.
DECODE_BLOCK_L = 64
DECODE_MIN_CHUNK = 64
_DECODE_PROGRAMS_PER_SM = 2


def decode_attention_slices(L: int, BH_kv: int, sms: int) -> tuple[int, int]:
    """(slices, slots a slice) for L cache slots, BH_kv (sequence, K / V head) pairs and a GPU
    of ``sms`` multiprocessors."""
    want = max(1, triton.cdiv(_DECODE_PROGRAMS_PER_SM * sms, max(BH_kv, 1)))
    slices = max(1, min(want, triton.cdiv(L, DECODE_MIN_CHUNK)))
    chunk = triton.cdiv(triton.cdiv(L, slices), DECODE_BLOCK_L) * DECODE_BLOCK_L
    return triton.cdiv(L, chunk), chunk


def launch_decode_attention(q, k, v, mask, out, scale: float, sms: int | None = None) -> None:
    """q [B, H, 1, D] (head dim contiguous), k / v [B, H_kv, L, D] (head dim contiguous), mask
    [B, L] bool (a stride-0 batch where shared; True: attend), out [B, H, 1, D]; ``sms``: the
    GPU's multiprocessors (default: q's device's; 4 in the interpreter)."""
    B, H, _, D = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    group = H // H_kv
    if sms is None:
        sms = 4 if _interpreting() else torch.cuda.get_device_properties(q.device).multi_processor_count
    slices, chunk = decode_attention_slices(L, B * H_kv, sms)
    part = torch.empty((slices, B, H, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((slices, B, H), dtype=torch.float32, device=q.device)
    _decode_attention_split_kernel[(B * H_kv, slices)](
        q, k, v, mask, part, lse,
        L, chunk, scale, H,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        mask.stride(0), mask.stride(1),
        GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, BLOCK_L=DECODE_BLOCK_L,
        COMPILED=not _interpreting(), num_warps=4,
    )  # fmt: skip
    _decode_attention_combine_kernel[(B * H,)](
        part, lse, out, B * H, slices, out.stride(0), out.stride(1), H,
        S_P=triton.next_power_of_2(slices), HEAD_DIM=D, num_warps=4,
    )  # fmt: skip
