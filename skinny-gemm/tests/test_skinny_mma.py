"""skinny-gemm's compiled tensor-core GEMV (``MmaConfig``: csrc/skinny_mma.cu) against fp64
references of ``x @ w.T (+ bias)`` on the same fp16 / bf16 inputs, and of ``(x @ w.T) * x_scale *
w_scale (+ bias)`` on e4m3fn inputs (``reference_fp8``: the exact FP8 products summed, then the
scales in the kernel's order).

The kernel runs on capability >= 8.0 GPUs of a CUDA build (FP8: >= 8.9); everywhere else the
tests check the configuration, the dispatch and the fallbacks (an MmaConfig on CPU runs the
plain-torch path).

Tolerance, per output element (``assert_gemm_close``): one ulp of the output dtype at the
reference's magnitude (one rounding) plus 1e-4 of the output's scale (fp32 sums in the MMA's
order; the warps' K ranges added in warp order).
"""

from __future__ import annotations

from importlib import import_module

import pytest
import torch
import torch.nn.functional as F
from skinny_gemm_testing import assert_fully_written, poison_
from test_skinny_gemm import (  # noqa: F401
    DEVICE,
    _gpu_key,
    assert_gemm_close,
    gen,
    make,
    make_fp8,
    reference,
    reference_fp8,
    sg,
    table,
)
from test_skinny_tma import (
    check_cuda_graph_capture,
    check_deterministic,
    check_fp8_out_and_bias,
    check_fp8_values,
    check_opcheck,
    check_opcheck_fp8,
    fp8_binding_cases,
    run_config,
    run_config_fp8,
)

_config = import_module(sg.__name__ + "._config")

MMA = (
    DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 0)
    and bool(sg.mma_configs())
)  # fmt: skip
needs_mma = pytest.mark.skipif(not MMA, reason="the compiled GEMV: a CUDA build on a capability >= 8.0 GPU")
MMA_FP8 = MMA and torch.cuda.get_device_capability() >= (8, 9)
needs_mma_fp8 = pytest.mark.skipif(not MMA_FP8, reason="the compiled GEMV on FP8: a capability >= 8.9 GPU")
CLUSTERS = MMA and torch.cuda.get_device_capability() >= (9, 0)


def runnable_mma_configs() -> list:
    """The compiled launches this GPU runs: a K split (a thread-block cluster) from capability 9.0."""
    configs = sg.mma_configs(DEVICE)
    assert all(c.split == 1 or CLUSTERS for c in configs) and len(configs) <= len(sg.mma_configs())
    return configs


# The staged loop's launches under test: 2 and 3 stages, 1 and 2 row groups, (sm_90) K split
# over 2 and 4 blocks, and x shared by the block's warps (split 4 and 8; 64 rows a block).
STAGED = [sg.MmaConfig(1, 4, 4, 2), sg.MmaConfig(1, 4, 2, 3), sg.MmaConfig(1, 4, 4, 2, 2), sg.MmaConfig(2, 4, 4, 2, 2),
          sg.MmaConfig(1, 4, 8, 2, 8, shared_x=True), sg.MmaConfig(1, 4, 4, 3, 4, shared_x=True),
          sg.MmaConfig(2, 4, 4, 2, 8, shared_x=True), sg.MmaConfig(2, 4, 2, 2, 4)]


def staged_configs() -> list:
    return [c for c in STAGED if c.split == 1 or CLUSTERS]


# The row-run loop's launches under test: 8 segments (up to 4 tokens), 4 (up to 8) and 2 (up to 16),
# one to four loads a span, one to four spans a step, 4-16 warps.
ROW_RUNS = [sg.MmaConfig(4, 2, 8, segments=8), sg.MmaConfig(2, 2, 16, segments=8), sg.MmaConfig(1, 2, 8, segments=4),
            sg.MmaConfig(2, 2, 4, segments=4), sg.MmaConfig(1, 4, 8, segments=4), sg.MmaConfig(4, 1, 4, segments=4),
            sg.MmaConfig(2, 2, 8, segments=2)]


# The wgmma loop's launches under test (capability 9.0): segments 2 and 1, one and two warpgroups,
# 3 and 4 stages, clusters of 1-4 blocks.
WGMMA = MMA and torch.cuda.get_device_capability() == (9, 0)
needs_wgmma = pytest.mark.skipif(not WGMMA, reason="the GEMV's wgmma loop: a CUDA build on a capability 9.0 GPU")
WGMMAS = [sg.MmaConfig(1, 1, 8, 4, 3, segments=2, wgmma=True), sg.MmaConfig(1, 1, 4, 4, 4, segments=2, wgmma=True),
          sg.MmaConfig(1, 1, 8, 3, 1, segments=2, wgmma=True), sg.MmaConfig(1, 2, 4, 3, 2, segments=2, wgmma=True),
          sg.MmaConfig(1, 2, 4, 3, 4, segments=1, wgmma=True), sg.MmaConfig(1, 2, 8, 3, 3, segments=1, wgmma=True)]


def wgmma_configs() -> list:
    return WGMMAS if WGMMA else []


def contract_configs(M: int = 1) -> list:
    """The launches the op-contract and graph tests run: the register loop, the last staged launch,
    (sm_90: its launches split K over a cluster) the first one with x shared, where M fits, a
    row-run launch and (capability 9.0) a wgmma launch."""
    return [sg.MmaConfig(), staged_configs()[-1], *[c for c in staged_configs() if c.shared_x][:1],
            *[c for c in ROW_RUNS if c.segments == 4 and M <= c.max_m][:1], *wgmma_configs()[:1]]  # fmt: skip


def run_mma(x, w, bias=None, cfg=None, out=None):
    """gemm with an MmaConfig (default: MmaConfig()) on a poisoned output."""
    return run_config(x, w, bias, cfg or sg.MmaConfig(), out)


def run_mma_fp8(x, w, xs, ws, cfg=None):
    """The FP8 op with an MmaConfig (default: MmaConfig()) on a poisoned bf16 output."""
    return run_config_fp8(x, w, xs, ws, None, cfg or sg.MmaConfig())


# ---------------------------------------------------------------------------------------------
# Configuration (any device)
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_config_forms():
    """An MmaConfig's op / table form is [-1, row_groups, unroll, warps] (the register loop),
    [-1, row_groups, unroll, warps, stages, split] (the staged loop) or [..., split, 1] (the
    staged loop with x shared by the block's warps) and parses back."""
    cfg = sg.MmaConfig(2, 4, 8)
    assert cfg.as_list() == [-1, 2, 4, 8]
    assert _config.config_from_list(cfg.as_list()) == cfg
    assert _config.config_from_list([-1, 1, 2, 8]) == sg.MmaConfig()
    staged = sg.MmaConfig(1, 4, 4, stages=2, split=2)
    assert staged.as_list() == [-1, 1, 4, 4, 2, 2]
    assert _config.config_from_list(staged.as_list()) == staged
    assert staged.op_args() == (1, 4, 4, 2, 2, 0, 0, 0)
    shared = sg.MmaConfig(1, 4, 4, stages=3, split=4, shared_x=True)
    assert shared.as_list() == [-1, 1, 4, 4, 3, 4, 1]
    assert _config.config_from_list(shared.as_list()) == shared
    assert _config.config_from_list([-1, 1, 4, 4, 3, 4, 0]) == sg.MmaConfig(1, 4, 4, 3, 4)
    assert shared.op_args() == (1, 4, 4, 3, 4, 1, 0, 0)
    rows = sg.MmaConfig(4, 2, 8, segments=8)
    assert rows.as_list() == [-1, 4, 2, 8, 0, 1, 0, 8]
    assert _config.config_from_list(rows.as_list()) == rows
    assert rows.op_args() == (4, 2, 8, 0, 1, 0, 8, 0)
    assert (rows.max_m, rows.step_k(2), rows.step_k(1)) == (4, 512, 1024)
    assert (sg.MmaConfig(1, 2, 8, segments=4).max_m, sg.MmaConfig(1, 2, 8, segments=2).max_m, shared.max_m) == (8, 16, 16)
    wg = sg.MmaConfig(1, 1, 8, 4, 3, segments=2, wgmma=True)
    assert wg.as_list() == [-1, 1, 1, 8, 4, 3, 0, 2, 1]
    assert _config.config_from_list(wg.as_list()) == wg
    assert wg.op_args() == (1, 1, 8, 4, 3, 0, 2, 1)
    # 128-byte chunks of each segment a step; 16 tokens at any segments
    assert (wg.max_m, wg.step_k(2), wg.step_k(1)) == (16, 128, 256)
    assert sg.MmaConfig(1, 2, 4, 3, 4, segments=1, wgmma=True).step_k(2) == 128


@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "make_it, exc, match",
    [
        (lambda: sg.MmaConfig(3), ValueError, r"MmaConfig.row_groups: expected one of \[1, 2\], got 3"),
        (lambda: sg.MmaConfig(1, 8), ValueError, r"MmaConfig.unroll: expected one of \[1, 2, 4\], got 8"),
        (lambda: sg.MmaConfig(1, 2, 32), ValueError, r"MmaConfig.warps: expected one of \[2, 4, 8, 16\], got 32"),
        (lambda: sg.MmaConfig(1, 4, 4, 4), ValueError, r"MmaConfig.stages: expected one of \[0, 2, 3\], got 4"),
        (lambda: sg.MmaConfig(1, 2, 4, 2), ValueError,
         r"MmaConfig.stages: the staged loop \(2 stages\) takes unroll 4 \(256-byte steps\), got unroll 2"),
        (lambda: sg.MmaConfig(1, 4, 4, 0, 2), ValueError, r"MmaConfig.split: a K split \(2\) is the staged loop's"),
        (lambda: sg.MmaConfig(1, 4, 4, 0, 1, True), ValueError,
         r"MmaConfig.shared_x: x shared by a block's warps is the staged loop's \(stages 2 or 3\), got stages 0"),
        (lambda: sg.MmaConfig(1, 4, 4, 2, 4, 1), TypeError, "MmaConfig.shared_x: expected True or False, got 1"),
        (lambda: sg.MmaConfig(1.0), TypeError, "MmaConfig.row_groups: expected an int, got 1.0"),
        (lambda: _config.config_from_list([-1, 2]), ValueError,
         r"\[-1, row_groups, unroll, warps\(, stages, split\(, shared_x\(, segments\(, wgmma\)\)\)\)\] \(MmaConfig\)"),
        (lambda: _config.config_from_list([-1, 1, 4, 4, 2, 4, 2]), ValueError, r"\(MmaConfig\), got \[-1, 1, 4, 4, 2, 4, 2\]"),
        (lambda: sg.MmaConfig(1, 2, 8, segments=16), ValueError, r"MmaConfig.segments: expected one of \[0, 2, 4, 8\], got 16"),
        (lambda: sg.MmaConfig(8, 2, 8, segments=4), ValueError, r"MmaConfig.row_groups: expected one of \[1, 2, 4\], got 8"),
        (lambda: sg.MmaConfig(4, 2, 8), ValueError, r"MmaConfig.row_groups: expected one of \[1, 2\], got 4"),
        (lambda: sg.MmaConfig(1, 4, 4, 2, segments=4), ValueError,
         r"MmaConfig.segments: the row-run loop \(4 segments\) takes stages 0, split 1 and shared_x False, got stages 2"),
        (lambda: sg.MmaConfig(1, 1, 8, 4, 3, segments=4, wgmma=True), ValueError,
         r"MmaConfig.segments: expected one of \[1, 2\], got 4"),
        (lambda: sg.MmaConfig(1, 1, 8, 2, 3, segments=2, wgmma=True), ValueError,
         r"MmaConfig.stages: expected one of \[3, 4\], got 2"),
        (lambda: sg.MmaConfig(1, 1, 8, 4, 8, segments=2, wgmma=True), ValueError,
         r"MmaConfig.split: expected one of \[1, 2, 3, 4\], got 8"),
        (lambda: sg.MmaConfig(2, 1, 8, 4, 3, segments=2, wgmma=True), ValueError,
         r"MmaConfig.row_groups: expected one of \[1\], got 2"),
        (lambda: sg.MmaConfig(1, 1, 8, 4, 3, True, 2, True), ValueError,
         "MmaConfig.shared_x: the wgmma loop shares x through its own stages"),
        (lambda: sg.MmaConfig(1, 1, 8, 4, 3, segments=2, wgmma=1), TypeError, "MmaConfig.wgmma: expected True or False, got 1"),
    ],
    ids=["row_groups", "unroll", "warps", "stages", "staged shape", "split", "shared_x stages", "shared_x type", "type",
         "list", "shared_x list", "segments", "row runs", "row runs off the loop", "segments stages", "wgmma segments",
         "wgmma stages", "wgmma split", "wgmma row_groups", "wgmma shared_x", "wgmma type"],
)
def test_config_errors(make_it, exc, match):
    with pytest.raises(exc, match=match):
        make_it()


@pytest.mark.kernels_ci
def test_off_gpu_an_mma_config_is_the_reference_path():
    """Off a capable GPU's kernel (CPU here) an MmaConfig computes the same function in torch."""
    if DEVICE == "cuda":
        pytest.skip("CPU semantics")
    x, w, b = make(5, 40, 256, torch.bfloat16, seed=2, bias=True)
    want = reference(x, w, b)
    for cfg in (sg.MmaConfig(), *STAGED, *WGMMAS):
        assert_gemm_close(run_mma(x, w, b, cfg), want, f"{cfg} on CPU")
    assert sg.mma_configs() == []  # a CPU build has no compiled kernel


@pytest.mark.kernels_ci
def test_fp8_off_gpu_an_mma_config_is_the_reference_path():
    """gemm_fp8 with an MmaConfig off a capable GPU's kernel (CPU here): the same function in torch."""
    if DEVICE == "cuda":
        pytest.skip("CPU semantics")
    x, w, xs, ws = make_fp8(3, 32, 128, torch.float8_e4m3fn, seed=1)
    assert_gemm_close(sg.gemm_fp8(x, w, xs, ws, config=sg.MmaConfig()), reference_fp8(x, w, xs, ws), "FP8 on CPU")


@pytest.mark.kernels_ci
def test_table_entry_dispatch(table):
    """A table entry of the GEMV: dispatch_buckets gives the MmaConfig; dispatch_config gives it
    where the kernel can run (and on CPU, whose path computes the same function) and linear runs
    gemm with it; where it cannot (K not a whole number of its steps, a misaligned w) cuBLAS."""
    N, K = 48, 256
    x, w, b = make(5, N, K, torch.bfloat16, seed=3, bias=True)
    entry = [-1, 2, 1, 4]
    table[(_gpu_key(), "bfloat16", N, K)] = [(8, entry)]
    runs = DEVICE == "cpu" or MMA
    assert sg.dispatch_config(x, w) == (sg.MmaConfig(2, 1, 4) if runs else None)
    assert sg.dispatch_buckets(w) == [(8, sg.MmaConfig(2, 1, 4))]
    got = sg.linear(x, w, b)
    if runs:
        assert torch.equal(got, sg.gemm(x, w, b, config=sg.MmaConfig(2, 1, 4)))
    else:
        assert torch.equal(got, F.linear(x, w, b)), "a GPU without the kernel: cuBLAS"
    if DEVICE == "cuda":
        wide = torch.empty(N, K + 1, dtype=w.dtype, device=DEVICE)[:, 1:]  # rows 2 bytes off 16-byte alignment
        wide.copy_(w)
        assert sg.dispatch_config(x, wide) is None
        assert torch.equal(sg.linear(x, wide, b), F.linear(x, wide, b)), "a w the 16-byte loads cannot read: cuBLAS"
        x48, w48, _ = make(5, N, 48, torch.bfloat16, seed=4)
        table[(_gpu_key(), "bfloat16", N, 48)] = [(8, entry)]
        assert sg.dispatch_config(x48, w48) is None, "K = 48: no multiple of 32"
        x96, w96, _ = make(5, N, 96, torch.bfloat16, seed=4)
        table[(_gpu_key(), "bfloat16", N, 96)] = [(8, [-1, 1, 4, 4])]
        assert sg.dispatch_config(x96, w96) is None, "K = 96: no multiple of a 4-chunk step (128)"


# ---------------------------------------------------------------------------------------------
# Values (a capability >= 8.0 GPU)
# ---------------------------------------------------------------------------------------------

# The Llama-405B TP8 QKV and Llama-3-8B shapes; N off the 8- and 16-row groups (1000 =
# 62 x 16 + 8, 17); K not a multiple of the warps' steps (MmaConfig(): steps of 64 columns; 4160
# = 65 steps: 9 a warp, the last warp 2; odd counts), fewer steps than warps (192: 3 steps, five
# warps idle), one step (64).
SHAPES = [(2304, 16384), (6144, 4096), (1000, 4160), (96, 192), (130, 64), (17, 64)]


@needs_mma
@pytest.mark.parametrize("N, K", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_values(N, K, M, dtype):
    x, w, b = make(M, N, K, dtype, seed=M * 7 + N, bias=M % 2 == 1)
    assert_gemm_close(run_mma(x, w, b), reference(x, w, b), f"MmaConfig() {M}x{N}x{K}")


@needs_mma
def test_every_compiled_config():
    """Every compiled launch at 1, 8 and 16 tokens (one and two x rows a lane), with an fp32 bias,
    at a K of 33 four-chunk steps (66 / 132 of two / one chunk: uneven warp ranges) and an N off
    the row groups; the row-run loop at 1, half its tokens + 1 and all (one and two token tiles)
    at 33 of its steps where 4224 is not a whole number of them."""
    x16, w, _ = make(16, 1000, 4224, torch.bfloat16, seed=4)
    b = torch.randn(1000, generator=gen(5)).to(DEVICE)
    for cfg in runnable_mma_configs():
        xs, ws = x16, w
        if 4224 % cfg.step_k(2):
            xs, ws, _ = make(16, 1000, 33 * cfg.step_k(2), torch.bfloat16, seed=6)
        tokens = (1, 8, 16) if not cfg.segments else (1, cfg.max_m // 2 + 1, cfg.max_m)
        for x in (xs[:M] for M in tokens):
            assert_gemm_close(run_mma(x, ws, b, cfg), reference(x, ws, b), f"{cfg} M={x.shape[0]}")


# The row-run loop: 2304 x 16384; Llama-3-8B down's K (14336: 28 or 56 steps: uneven warp ranges);
# N off the loads' rows (1001, odd) and below one block (3); one step (K = 512 at 8 segments x 2
# spans: most warps idle).
ROW_RUN_SHAPES = [(2304, 16384), (1001, 14336), (3, 2048), (40, 512)]


@needs_mma
@pytest.mark.parametrize("N, K", ROW_RUN_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_row_run_values(N, K, M, dtype):
    x, w, b = make(M, N, K, dtype, seed=M * 19 + N, bias=M % 2 == 1)
    want = reference(x, w, b)
    for cfg in ROW_RUNS:
        if M <= cfg.max_m and K % cfg.step_k(2) == 0:
            assert_gemm_close(run_mma(x, w, b, cfg), want, f"{cfg} {M}x{N}x{K}")


@needs_mma
def test_row_run_bad_input():
    """The row-run loop's rules, each an error naming the argument before anything is written:
    at most 32 / segments tokens, K a whole number of its steps (segments x 64-byte chunks)."""
    x, w, _ = make(5, 32, 1024, torch.bfloat16, seed=14)
    out = poison_(torch.empty(5, 32, dtype=x.dtype, device=DEVICE))
    with pytest.raises(ValueError, match=r"x: an MmaConfig takes 1 to 4 rows \(tokens\) with 8 segments, got 5"):
        sg.gemm(x, w, out=out, config=sg.MmaConfig(4, 2, 8, segments=8))
    with pytest.raises(ValueError, match="x: an MmaConfig with unroll 2 and 8 segments needs K a multiple of 512"):
        sg.gemm(x[:4, :768], w[:, :768].contiguous(), out=out[:4], config=sg.MmaConfig(4, 2, 8, segments=8))
    with pytest.raises(RuntimeError, match=r"x: this mma configuration takes at most 4 rows \(tokens\), got 5"):
        sg.ops.skinny_mma(out, x, w, None, 4, 2, 8, 0, 1, 0, 8)
    with pytest.raises(RuntimeError, match=r"config: .* = \(4, 2, 8, 2, 1, 0, 8, 0\) is not compiled"):
        sg.ops.skinny_mma(out, x, w, None, 4, 2, 8, 2, 1, 0, 8)
    assert torch.isnan(out.float()).all()


# The wgmma loop: K in 256- or 512-byte steps; 2304 x 16384 (the 405B TP8 QKV: 36 / 72 row blocks), N off
# the 32- and 64-row blocks (1001), fewer steps than a cluster's K parts (40 x 512: some empty), fewer
# rows than a block (3 x 256).
WGMMA_SHAPES = [(2304, 16384), (1001, 4096), (40, 512), (3, 256)]


@needs_wgmma
@pytest.mark.parametrize("N, K", WGMMA_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 2, 5, 9, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_wgmma_values(N, K, M, dtype):
    x, w, b = make(M, N, K, dtype, seed=M * 29 + N, bias=M % 2 == 1)
    want = reference(x, w, b)
    for cfg in WGMMAS:
        if K % cfg.step_k(2) == 0:
            assert_gemm_close(run_mma(x, w, b, cfg), want, f"{cfg} {M}x{N}x{K}")


@needs_wgmma
@pytest.mark.parametrize("N, K", [(2304, 16384), (1001, 4096), (40, 512)], ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 9, 16])
@pytest.mark.parametrize("scales", ["tensor", "token-channel"])
def test_wgmma_fp8_values(N, K, M, scales):
    for cfg in WGMMAS:
        if K % cfg.step_k(1) == 0:
            check_fp8_values(N, K, M, scales, cfg, seed=M * 31 + N)


@needs_wgmma
def test_wgmma_bad_input():
    """The wgmma loop's rules, each an error naming the argument before anything is written: at
    most 16 tokens, K a whole number of its steps (segments x unroll 128-byte chunks)."""
    cfg = WGMMAS[0]
    x, w, _ = make(17, 32, 1024, torch.bfloat16, seed=15)
    out = poison_(torch.empty(17, 32, dtype=x.dtype, device=DEVICE))
    with pytest.raises(ValueError, match=r"x: an MmaConfig takes 1 to 16 rows \(tokens\), got 17"):
        sg.gemm(x, w, out=out, config=cfg)
    with pytest.raises(ValueError, match="x: an MmaConfig with unroll 1 and 2 segments needs K a multiple of 128"):
        sg.gemm(x[:4, :192], w[:, :192].contiguous(), out=out[:4], config=cfg)
    with pytest.raises(RuntimeError, match=r"x: this mma configuration takes at most 16 rows \(tokens\), got 17"):
        sg.ops.skinny_mma(out, x, w, None, *cfg.op_args())
    with pytest.raises(RuntimeError, match=r"x: K must be a positive multiple of 128"):
        sg.ops.skinny_mma(out[:4], x[:4, :192], w[:, :192].contiguous(), None, *cfg.op_args())
    assert torch.isnan(out.float()).all()


@needs_wgmma
def test_wgmma_deterministic():
    """The K parts' and the cluster's sums run in fixed orders: the same bits call after call."""
    x, w, b = make(16, 2304, 16384, torch.bfloat16, seed=41, bias=True)
    for cfg in WGMMAS:
        first = run_mma(x, w, b, cfg)
        for _ in range(3):
            assert torch.equal(run_mma(x, w, b, cfg), first), cfg


# The staged loop: K in 256-byte steps (128 16-bit columns); 2304 x 16384 (the 405B TP8 QKV), N off
# the row groups with 33 steps (uneven warp and split ranges), one step (K = 128: most warps and
# split blocks idle).
STAGED_SHAPES = [(2304, 16384), (1000, 4224), (40, 128)]


@needs_mma
@pytest.mark.parametrize("N, K", STAGED_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 5, 9, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_staged_values(N, K, M, dtype):
    x, w, b = make(M, N, K, dtype, seed=M * 11 + N, bias=M % 2 == 0)
    want = reference(x, w, b)
    for cfg in staged_configs():
        assert_gemm_close(run_mma(x, w, b, cfg), want, f"{cfg} {M}x{N}x{K}")


@needs_mma
def test_staged_bad_input():
    """The staged loop's step is 256 bytes: K a multiple of 128 16-bit columns (an error naming x
    before anything is written); a split launch below capability 9.0 is refused the same way."""
    x, w, _ = make(4, 32, 192, torch.bfloat16, seed=13)
    out = poison_(torch.empty(4, 32, dtype=x.dtype, device=DEVICE))
    with pytest.raises(ValueError, match="x: an MmaConfig with unroll 4 needs K a multiple of 128"):
        sg.gemm(x, w, out=out, config=sg.MmaConfig(1, 4, 4, 2))
    if not CLUSTERS:
        with pytest.raises(ValueError, match="config: an MmaConfig with split 2 runs in a thread-block cluster"):
            sg.gemm(x[:, :128], w[:, :128].contiguous(), out=out, config=sg.MmaConfig(1, 4, 4, 2, 2))
    assert torch.isnan(out.float()).all()


@needs_mma
def test_layouts_and_out():
    """x strided or misaligned (copied first), 3-D x, a w with a row stride past K, out= given
    (fully written), M = 0 (nothing launched), and an uncompiled configuration (an error naming
    config, out untouched)."""
    x, w, b = make(6, 512, 1024, torch.bfloat16, seed=6, bias=True)
    ref = reference(x, w, b)
    strided = torch.empty(6, 2048, dtype=x.dtype, device=DEVICE)[:, ::2]
    strided.copy_(x)
    assert_gemm_close(run_mma(strided, w, b), ref, "strided x")
    shifted = torch.empty(6 * 1024 + 1, dtype=x.dtype, device=DEVICE)[1:].view(6, 1024)
    shifted.copy_(x)
    assert_gemm_close(run_mma(shifted, w, b), ref, "misaligned x")
    wide = torch.empty(512, 1024 + 64, dtype=w.dtype, device=DEVICE)[:, :1024]
    wide.copy_(w)
    assert_gemm_close(run_mma(x, wide, b), ref, "w row stride 1088")
    y = sg.gemm(x.view(2, 3, 1024), w, b, config=sg.MmaConfig())
    assert_gemm_close(y.view(6, 512), ref, "3-D x")
    assert sg.gemm(x[:0], w, config=sg.MmaConfig()).shape == (0, 512)
    out = poison_(torch.empty(6, 512, dtype=x.dtype, device=DEVICE))
    compiled = {c.op_args() for c in sg.mma_configs()}
    missing = next(
        sg.MmaConfig(rg, u, wp)
        for rg in _config.MMA_ROW_GROUPS for u in _config.MMA_UNROLL for wp in _config.MMA_WARPS
        if sg.MmaConfig(rg, u, wp).op_args() not in compiled
    )  # fmt: skip
    with pytest.raises(ValueError, match="config: MmaConfig.* is not compiled in this build"):
        sg.gemm(x, w, out=out, config=missing)
    assert torch.isnan(out.float()).all()


@needs_mma
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, w: sg.gemm(torch.randn(17, 64, device=DEVICE).bfloat16(), w, config=sg.MmaConfig()),
         r"x: an MmaConfig takes 1 to 16 rows \(tokens\), got 17"),
        (lambda x, w: sg.gemm(x[:, :48], w[:, :48].contiguous(), config=sg.MmaConfig()),
         "x: an MmaConfig with unroll 2 needs K a multiple of 64"),
        (lambda x, w: sg.gemm(x, w, config=sg.MmaConfig()),
         r"w: an MmaConfig needs 16-byte aligned rows \(a row stride of a multiple of 8 elements"),
    ],
    ids=["M", "K", "w stride"],
)
def test_bad_input(call, match):
    x, w, _ = make(4, 32, 64, torch.bfloat16, seed=7)
    w = torch.cat([w, w[:, :4]], dim=1)[:, :64] if "stride" in match else w  # row stride 68
    out = poison_(torch.empty(4, 32, dtype=x.dtype, device=DEVICE))
    with pytest.raises(ValueError, match=match):
        call(x, w)
    assert torch.isnan(out.float()).all()


@needs_mma
def test_binding_checks():
    """The compiled op's own checks (direct torch.ops callers), each before anything is written."""
    x, w, _ = make(4, 32, 64, torch.bfloat16, seed=8)
    out = poison_(torch.empty(4, 32, dtype=x.dtype, device=DEVICE))
    op = sg.ops.skinny_mma
    cases = [
        ((out, x, w, None, 3, 2, 8, 0, 1),
         r"config: \(row_groups, unroll, warps, stages, split, shared_x, segments, wgmma\) = \(3, 2, 8, 0, 1, 0, 0, 0\) is not "
         "compiled"),
        ((out, x, w, None, 2**32 + 1, 2, 8, 0, 1), r"config: .* = \(4294967297, 2, 8, 0, 1, 0, 0, 0\) is not compiled"),
        ((out, x, w, None, 1, 4, 4, 4, 1), r"config: .* = \(1, 4, 4, 4, 1, 0, 0, 0\) is not compiled"),
        ((out, x, w, None, 1, 4, 4, 2, 4, 2), r"config: .* = \(1, 4, 4, 2, 4, 2, 0, 0\) is not compiled"),
        ((out, x, w, None, 1, 2, 8, 2**32, 1), r"config: .* = \(1, 2, 8, 4294967296, 1, 0, 0, 0\) is not compiled"),
        ((out, x, w, None, 1, 2, 8, 0, 1, 0, 3), r"config: .* = \(1, 2, 8, 0, 1, 0, 3, 0\) is not compiled"),
        ((out, x, w, None, 1, 1, 8, 4, 3, 0, 2, 2), r"config: .* = \(1, 1, 8, 4, 3, 0, 2, 2\) is not compiled"),
        ((out, x[:, :48], w[:, :48], None, 1, 2, 8, 0, 1), r"x: K must be a positive multiple of 64 \(one step"),
        ((out, x, w, None, 1, 4, 8, 0, 1), "x: K must be a positive multiple of 128"),
        ((out, x, w.half(), None, 1, 2, 8, 0, 1), r"w: expected a BFloat16 \[N, 64\] tensor"),
        ((out[:, :16], x, w, None, 1, 2, 8, 0, 1), r"out: expected a \[4, 32\] tensor"),
        ((out.half(), x, w, None, 1, 2, 8, 0, 1), r"out: expected dtype BFloat16 \(x's\), got Half"),
        ((out, x.float(), w, None, 1, 2, 8, 0, 1), "x: expected dtype bfloat16 or float16"),
        ((out, x, w, torch.zeros(31, device=DEVICE), 1, 2, 8, 0, 1), r"bias: expected a contiguous \[32\] tensor"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            op(*args)
    assert torch.isnan(out.float()).all()


@needs_mma
def test_deterministic():
    """The warps' K ranges are summed in warp order (and a cluster's blocks in rank order)."""
    check_deterministic(sg.MmaConfig())
    for cfg in staged_configs():
        check_deterministic(cfg)
    for cfg in ROW_RUNS[:3]:
        check_deterministic(cfg, M=cfg.max_m)


# ---------------------------------------------------------------------------------------------
# torch.library contract, torch.compile, CUDA graphs
# ---------------------------------------------------------------------------------------------


@needs_mma
def test_opcheck():
    for cfg in contract_configs(5):
        check_opcheck(cfg)


@needs_mma
def test_torch_compile_fullgraph(table):
    x, w, b = make(6, 256, 512, torch.float16, seed=11, bias=True)
    table[(_gpu_key(), "float16", 256, 512)] = [(8, [-1, 1, 2, 4])]

    def block(x):
        return [sg.gemm(x, w, b, config=sg.MmaConfig(2, 1, 8)) + 1, sg.linear(x * 2, w)]

    with torch.no_grad():
        got = torch.compile(block, fullgraph=True, dynamic=False)(x)
        expected = block(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@needs_mma
@pytest.mark.parametrize("M", [1, 16])
def test_cuda_graph_capture(M):
    for cfg in contract_configs(M):
        check_cuda_graph_capture(cfg, M)


# ---------------------------------------------------------------------------------------------
# FP8 e4m3fn (a capability >= 8.9 GPU): m16n8k32 on the same 64-byte chunks
# ---------------------------------------------------------------------------------------------

# MmaConfig(): steps of 128 e4m3 columns. 4224 = 33 steps (uneven warp ranges), 256: two steps
# (six warps idle), 128: one.
FP8_SHAPES = [(2304, 16384), (6144, 4096), (1000, 4224), (96, 256), (17, 128)]


@needs_mma_fp8
@pytest.mark.parametrize("N, K", FP8_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 5, 9, 16])
@pytest.mark.parametrize("scales", ["tensor", "token-channel", "token-tensor"])
def test_fp8_values(N, K, M, scales):
    check_fp8_values(N, K, M, scales, sg.MmaConfig(), seed=M * 13 + N)


@needs_mma_fp8
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_fp8_out_and_bias_dtypes(out_dtype, bias_dtype):
    check_fp8_out_and_bias(out_dtype, bias_dtype, 4224, sg.MmaConfig(2, 1, 8), seed=31)


@needs_mma_fp8
def test_fp8_every_compiled_config():
    """Every compiled launch on FP8 at 1, 8 and 16 tokens, K = 17 four-chunk steps; the row-run
    loop at 1, half its tokens + 1 and all, at 17 of its steps."""
    x16, w, xs16, ws = make_fp8(16, 1000, 4352, torch.float8_e4m3fn, seed=33)
    for cfg in runnable_mma_configs():
        xq, wq, xsq, wsq = (x16, w, xs16, ws) if 4352 % cfg.step_k(1) == 0 else \
            make_fp8(16, 1000, 17 * cfg.step_k(1), torch.float8_e4m3fn, seed=36)
        for M in ((1, 8, 16) if not cfg.segments else (1, cfg.max_m // 2 + 1, cfg.max_m)):
            got = run_mma_fp8(xq[:M], wq, xsq[:M], wsq, cfg=cfg)
            assert_gemm_close(got, reference_fp8(xq[:M], wq, xsq[:M], wsq), f"FP8 {cfg} M={M}")


@needs_mma_fp8
@pytest.mark.parametrize("N, K", [(2304, 16384), (1001, 14336)], ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 3, 8, 16])
@pytest.mark.parametrize("scales", ["tensor", "token-channel"])
def test_row_run_fp8_values(N, K, M, scales):
    for cfg in ROW_RUNS:
        if M <= cfg.max_m and K % cfg.step_k(1) == 0:
            check_fp8_values(N, K, M, scales, cfg, seed=M * 23 + N)


# The staged loop on FP8: 256-column steps (4352 = 17 steps, 256 = one).
@needs_mma_fp8
@pytest.mark.parametrize("N, K", [(2304, 16384), (1000, 4352), (96, 256)], ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 9, 16])
@pytest.mark.parametrize("scales", ["tensor", "token-channel"])
def test_staged_fp8_values(N, K, M, scales):
    for cfg in staged_configs():
        check_fp8_values(N, K, M, scales, cfg, seed=M * 17 + N)


@needs_mma_fp8
def test_fp8_bad_input():
    """FP8 rules of the GEMV, each an error naming the argument before anything is written: K a
    whole number of steps (gemm_fp8 and the op), the op's scale, dtype and bias checks."""
    x, w, xs, ws = make_fp8(4, 32, 256, torch.float8_e4m3fn, seed=34)
    with pytest.raises(ValueError, match="x: an MmaConfig with unroll 2 needs K a multiple of 128"):
        sg.gemm_fp8(x[:, :192], w[:, :192].contiguous(), xs, ws, config=sg.MmaConfig())
    out = poison_(torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE))
    xs4, ws32 = xs.reshape(4), ws.reshape(32)
    cases = fp8_binding_cases(out, x, w, xs, ws, (1, 2, 8, 0, 1)) + [
        ((out, x[:, :192], w[:, :192], xs4, ws32, None, 1, 2, 8, 0, 1), r"x: K must be a positive multiple of 128"),
        ((out, x[:, :128], w[:, :128], xs4, ws32, None, 1, 4, 4, 2, 1), r"x: K must be a positive multiple of 256"),
        ((out, x, w.view(torch.uint8), xs4, ws32, None, 1, 2, 8, 0, 1), r"w: expected a Float8_e4m3fn \[N, 256\] tensor"),
        ((out, x, w, xs4, ws32, None, 3, 2, 8, 0, 1),
         r"config: \(row_groups, unroll, warps, stages, split, shared_x, segments, wgmma\) = \(3, 2, 8, 0, 1, 0, 0, 0\) is not "
         "compiled"),
    ]  # fmt: skip
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            sg.ops.skinny_mma_fp8(*args)
    assert torch.isnan(out.float()).all()


@needs_mma_fp8
def test_fp8_deterministic():
    x, w, xs, ws = make_fp8(16, 2304, 16384, torch.float8_e4m3fn, seed=35)
    for cfg in [sg.MmaConfig(), *staged_configs(), *ROW_RUNS[:2]]:
        xm, xsm = x[: cfg.max_m], xs[: cfg.max_m]
        first = run_mma_fp8(xm, w, xsm, ws, cfg)
        for _ in range(3):
            assert torch.equal(run_mma_fp8(xm, w, xsm, ws, cfg), first), cfg


@needs_mma_fp8
def test_fp8_opcheck():
    for cfg in contract_configs(5):
        check_opcheck_fp8(cfg)


@needs_mma_fp8
@pytest.mark.parametrize("M", [1, 16])
def test_fp8_cuda_graph_capture(M):
    """Captured once, replayed on new x and scales: equal to eager calls, fully written (the
    register loop, the staged one, on sm_90 the staged one with x shared, and at one token a
    row-run launch)."""
    x, w, xs, ws = make_fp8(M, 2304, 16384, torch.float8_e4m3fn, seed=37)
    for cfg in contract_configs(M):
        sx, sxs = x.clone(), xs.clone()
        sg.gemm_fp8(sx, w, sxs, ws, config=cfg)  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = sg.gemm_fp8(sx, w, sxs, ws, config=cfg)
        for seed in (38, 39):
            nx, _, nxs, _ = make_fp8(M, 8, 16384, torch.float8_e4m3fn, seed=seed)
            sx.copy_(nx)
            sxs.copy_(nxs)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, sg.gemm_fp8(nx, w, nxs, ws, config=cfg))
            assert_fully_written(static_out, f"FP8 graph replay {cfg}")
