"""skinny-gemm's compiled Hopper kernel (``TmaConfig``: csrc/skinny_tma*.cu) against fp64
references of ``x @ w.T (+ bias)`` on the same fp16 / bf16 inputs, and of
``(x @ w.T) * x_scale * w_scale (+ bias)`` on e4m3fn inputs (``reference_fp8``: the exact FP8
products summed, then the scales in fp32).

The kernel runs on capability 9.0 GPUs of a CUDA build; everywhere else the tests check the
configuration, the dispatch and the fallbacks (a TmaConfig on CPU runs the plain-torch path).

Tolerance, per output element (``assert_gemm_close``): one ulp of the output dtype at the
reference's magnitude (one rounding) plus 1e-4 of the output's scale (fp32 sums in the MMA's
order; a row tile cut between blocks adds the blocks' fp32 partial tiles in block order).
"""

from __future__ import annotations

from importlib import import_module

import pytest
import torch
import torch.nn.functional as F
from skinny_gemm_testing import assert_fully_written, assert_only_declared_outputs_mutate, opcheck, poison_
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

_config = import_module(sg.__name__ + "._config")

TMA = DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0) and bool(sg.tma_configs())
needs_tma = pytest.mark.skipif(not TMA, reason="the compiled Hopper kernel: a CUDA build on a capability 9.0 GPU")


def run_config(x, w, bias, cfg, out=None):
    """gemm with ``cfg`` on a poisoned output (``out``, or a new one)."""
    out = poison_(torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=DEVICE)) if out is None else out
    return sg.gemm(x, w, bias, out=out, config=cfg)


def run_config_fp8(x, w, xs, ws, bias, cfg, out_dtype=torch.bfloat16):
    """The FP8 op with ``cfg`` on a poisoned output of ``out_dtype``."""
    out = poison_(torch.empty(x.shape[0], w.shape[0], dtype=out_dtype, device=DEVICE))
    sg.ops.skinny_gemm_fp8(out, x, w, xs.reshape(-1), ws.reshape(-1), bias, True, cfg.as_list())
    return out


def check_fp8_values(N, K, M, scales, cfg, seed):
    """gemm_fp8 with ``cfg`` against reference_fp8: ``scales`` "tensor" (both per tensor),
    "token-channel" (per token and per output channel) or "token-tensor"."""
    x, w, xs, ws = make_fp8(M, N, K, torch.float8_e4m3fn, seed=seed,
                            per_token=scales != "tensor", per_channel=scales == "token-channel")  # fmt: skip
    got = sg.gemm_fp8(x, w, xs, ws, config=cfg)
    assert_gemm_close(got, reference_fp8(x, w, xs, ws), f"FP8 {cfg} {M}x{N}x{K} {scales}")


def check_fp8_out_and_bias(out_dtype, bias_dtype, K, cfg, seed):
    """The FP8 op with ``cfg`` writing ``out_dtype``, with a bias of ``bias_dtype`` (or none), 7 x 1000 x K."""
    x, w, xs, ws = make_fp8(7, 1000, K, torch.float8_e4m3fn, seed=seed)
    b = None if bias_dtype is None else torch.randn(1000, generator=gen(seed + 1)).to(bias_dtype).to(DEVICE)
    got = run_config_fp8(x, w, xs, ws, b, cfg, out_dtype)
    assert got.dtype == out_dtype
    assert_gemm_close(got, reference_fp8(x, w, xs, ws, b), f"FP8 out {out_dtype} bias {bias_dtype}")


def fp8_binding_cases(out, x, w, xs, ws, config: tuple) -> list:
    """The scale, dtype and bias checks both compiled FP8 ops make, as (args, message) pairs for x
    [4, K] and w [32, K], the op's configuration arguments ``config`` last."""
    xs4, ws32 = xs.reshape(4), ws.reshape(32)
    return [
        ((out, x, w, xs4[:3], ws32, None, *config),
         r"x_scale: expected a contiguous float32 \[1\] \(per tensor\) or \[4\] \(per token\)"),
        ((out, x, w, xs4, ws32.double(), None, *config), r"w_scale: expected a contiguous float32 \[1\] \(per tensor\) or \[32\]"),
        ((out, x.view(torch.uint8), w, xs4, ws32, None, *config), "x: expected dtype float8_e4m3fn"),
        ((out.view(torch.int16), x, w, xs4, ws32, None, *config), "out: expected dtype bfloat16, float16 or float32"),
        ((out, x, w, xs4, ws32, torch.zeros(32, dtype=torch.int32, device=DEVICE), *config),
         "bias: expected a contiguous .32. tensor of dtype bfloat16, float16 or float32"),
    ]  # fmt: skip


def run_tma(x, w, bias=None, cfg=None, out=None):
    """gemm with a TmaConfig (default: TmaConfig()) on a poisoned output."""
    return run_config(x, w, bias, cfg or sg.TmaConfig(), out)


# ---------------------------------------------------------------------------------------------
# Configuration (any device)
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_config_forms():
    """A TmaConfig's op / table form is [0, tile_n, boxes_k, stages, split]; six ints are a
    SkinnyConfig; each parses back to its configuration. Split 0 is tma_split's choice: the
    most K slices (1-8) whose blocks fit one an SM (1 where the row tiles alone are more)."""
    cfg = sg.TmaConfig(128, 1, 4, 2)
    assert cfg.as_list() == [0, 128, 1, 4, 2]
    assert _config.config_from_list(cfg.as_list()) == cfg
    assert _config.config_from_list([16, 64, 128, 4, 4, 4]) == sg.SkinnyConfig(16, 64, 128, 4, 4, 4)
    assert [sg.tma_split(n, 64, 132) for n in (2304, 6144, 4096, 13312, 64, 1)] == [3, 1, 2, 1, 8, 8]


@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "make_it, exc, match",
    [
        (lambda: sg.TmaConfig(48), ValueError, r"TmaConfig.tile_n: expected one of \[16, 32, 64, 128\], got 48"),
        (lambda: sg.TmaConfig(64, 3), ValueError, r"TmaConfig.boxes_k: expected one of \[1, 2, 4, 8\], got 3"),
        (lambda: sg.TmaConfig(64, 2, 9), ValueError, r"TmaConfig.stages: expected one of \[2, 3, 4, 5, 6, 7, 8\], got 9"),
        (lambda: sg.TmaConfig(64, 2, 6, 9), ValueError, r"TmaConfig.split: expected one of \[0, 1, .*, 8\], got 9"),
        (lambda: sg.TmaConfig(64.0), TypeError, "TmaConfig.tile_n: expected an int, got 64.0"),
        (lambda: _config.config_from_list([1, 2, 3]), ValueError, r"config: expected 6 ints \(SkinnyConfig\), \[0, tile_n"),
    ],
    ids=["tile_n", "boxes_k", "stages", "split", "type", "list"],
)
def test_config_errors(make_it, exc, match):
    with pytest.raises(exc, match=match):
        make_it()


@pytest.mark.kernels_ci
def test_fp8_off_gpu_a_tma_config_is_the_reference_path():
    """gemm_fp8 with a TmaConfig off a capable GPU's kernel (CPU here): the same function in torch."""
    if DEVICE == "cuda":
        pytest.skip("CPU semantics")
    x, w, xs, ws = make_fp8(5, 40, 256, torch.float8_e4m3fn, seed=1)
    got = sg.gemm_fp8(x, w, xs, ws, config=sg.TmaConfig())
    assert_gemm_close(got, reference_fp8(x, w, xs, ws), "TmaConfig FP8 on CPU")


@pytest.mark.kernels_ci
def test_off_gpu_a_tma_config_is_the_reference_path():
    """Off a capable GPU's kernel (CPU here) a TmaConfig computes the same function in torch."""
    if DEVICE == "cuda":
        pytest.skip("CPU semantics")
    x, w, b = make(5, 40, 200, torch.bfloat16, seed=2, bias=True)
    assert_gemm_close(run_tma(x, w, b), reference(x, w, b), "TmaConfig on CPU")
    assert sg.tma_configs() == []  # a CPU build has no compiled kernel


@pytest.mark.kernels_ci
def test_table_entry_dispatch(table):
    """A table entry of the compiled kernel: dispatch_buckets gives the TmaConfig; dispatch_config
    gives it where the kernel can run (and on CPU, whose path computes the same function), and
    linear runs gemm with it; where it cannot (a build or GPU without it, a misaligned w)
    dispatch_config gives None and linear / linear_fp8 run cuBLAS."""
    N, K = 48, 256
    x, w, b = make(5, N, K, torch.bfloat16, seed=3, bias=True)
    entry = [0, 64, 2, 6, 2]
    table[(_gpu_key(), "bfloat16", N, K)] = [(8, entry)]
    runs = DEVICE == "cpu" or TMA
    assert sg.dispatch_config(x, w) == (sg.TmaConfig(64, 2, 6, 2) if runs else None)
    assert sg.dispatch_buckets(w) == [(8, sg.TmaConfig(64, 2, 6, 2))]
    got = sg.linear(x, w, b)
    if runs:
        assert torch.equal(got, sg.gemm(x, w, b, config=sg.TmaConfig(64, 2, 6, 2)))
    else:
        assert torch.equal(got, F.linear(x, w, b)), "a GPU without the kernel: cuBLAS"
    if DEVICE == "cuda":
        wide = torch.empty(N, K + 1, dtype=w.dtype, device=DEVICE)[:, 1:]  # rows 2 bytes off 16-byte alignment
        wide.copy_(w)
        assert sg.dispatch_config(x, wide) is None
        assert torch.equal(sg.linear(x, wide, b), F.linear(x, wide, b)), "a w the copy engine cannot read: cuBLAS"
        if torch.cuda.get_device_capability() >= (8, 9):  # FP8: K 40 is no multiple of 16 bytes
            xq, wq, xs, ws = make_fp8(5, N, 40, torch.float8_e4m3fn, seed=4)
            table[(_gpu_key(), "float8_e4m3fn", N, 40)] = [(8, entry)]
            assert sg.dispatch_config(xq, wq) is None
            assert torch.equal(sg.linear_fp8(xq, wq, xs, ws), sg.gemm_fp8(xq, wq, xs, ws)), "FP8 K the copy engine cannot read"


# ---------------------------------------------------------------------------------------------
# Values (a capability 9.0 GPU)
# ---------------------------------------------------------------------------------------------

# The Llama-405B TP8 QKV and Llama-3-8B shapes, off-tile N (1000: 1000 / 64 leaves 40
# rows), K not a multiple of a stage (4104 = 64 x 64 + 8: a box reaching past K, boxes past it
# skipped), tiny N and K (one unit, fewer units than SMs).
SHAPES = [(2304, 16384), (6144, 4096), (1000, 4104), (96, 200), (130, 64), (17, 8)]


@needs_tma
@pytest.mark.parametrize("N, K", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_values(N, K, M, dtype):
    x, w, b = make(M, N, K, dtype, seed=M * 7 + N, bias=M % 2 == 1)
    assert_gemm_close(run_tma(x, w, b), reference(x, w, b), f"TmaConfig() {M}x{N}x{K}")


@needs_tma
def test_every_compiled_config():
    """Every compiled launch at 8 and 16 tokens (one and two n8 token tiles), with an fp32 bias,
    at one K slice (no cluster), tma_split's and the most (8; empty slices: test_every_split)."""
    x16, w, _ = make(16, 1000, 4104, torch.bfloat16, seed=4)
    b = torch.randn(1000, generator=gen(5)).to(DEVICE)
    for c in sg.tma_configs():
        for split in (1, 0, 8):
            cfg = sg.TmaConfig(c.tile_n, c.boxes_k, c.stages, split)
            for x in (x16[:8], x16):
                assert_gemm_close(run_tma(x, w, b, cfg), reference(x, w, b), f"{cfg} M={x.shape[0]}")


@needs_tma
@pytest.mark.parametrize("split", range(1, 9))
def test_every_split(split):
    """Each K split 1-8 (the blocks of a cluster), 1 and 16 tokens, at the issue's 2304 x 16384
    and at a K of two stages (splits past 2 leave slices empty)."""
    for N, K in ((2304, 16384), (200, 256)):
        for M in (1, 16):
            x, w, b = make(M, N, K, torch.bfloat16, seed=split * 31 + M, bias=True)
            cfg = sg.TmaConfig(64, 2, 4, split)
            assert_gemm_close(run_tma(x, w, b, cfg), reference(x, w, b), f"{cfg} {M}x{N}x{K}")


# FP8: K a multiple of 16 (16-byte rows); 4112 = 32 x 128 + 16: a box reaching past K, boxes
# past it skipped; 208: two boxes, the second partial.
FP8_SHAPES = [(2304, 16384), (6144, 4096), (1000, 4112), (96, 208), (17, 16)]


@needs_tma
@pytest.mark.parametrize("N, K", FP8_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("M", [1, 5, 9, 16])
@pytest.mark.parametrize("scales", ["tensor", "token-channel", "token-tensor"])
def test_fp8_values(N, K, M, scales):
    check_fp8_values(N, K, M, scales, sg.TmaConfig(), seed=M * 11 + N)


@needs_tma
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_fp8_out_and_bias_dtypes(out_dtype, bias_dtype):
    check_fp8_out_and_bias(out_dtype, bias_dtype, 4112, sg.TmaConfig(64, 2, 4, 3), seed=21)


@needs_tma
def test_fp8_every_config_and_split():
    """Every compiled launch on FP8 at 8 and 16 tokens and splits 1, tma_split's and 8; each split
    1-8 at 2304 x 16384."""
    x16, w, xs16, ws = make_fp8(16, 1000, 4112, torch.float8_e4m3fn, seed=23)
    for c in sg.tma_configs():
        for split in (1, 0, 8):
            cfg = sg.TmaConfig(c.tile_n, c.boxes_k, c.stages, split)
            for M in (8, 16):
                got = sg.gemm_fp8(x16[:M], w, xs16[:M], ws, config=cfg)
                assert_gemm_close(got, reference_fp8(x16[:M], w, xs16[:M], ws), f"FP8 {cfg} M={M}")
    x, w, xs, ws = make_fp8(16, 2304, 16384, torch.float8_e4m3fn, seed=24)
    for split in range(1, 9):
        cfg = sg.TmaConfig(64, 2, 4, split)
        assert_gemm_close(sg.gemm_fp8(x, w, xs, ws, config=cfg), reference_fp8(x, w, xs, ws), f"FP8 {cfg}")


@needs_tma
def test_fp8_bad_input():
    """FP8 rules of the compiled kernel, each an error naming the argument before anything is
    written: K a multiple of 16, the binding's scale shapes and dtypes."""
    x, w, xs, ws = make_fp8(4, 32, 64, torch.float8_e4m3fn, seed=25)
    with pytest.raises(ValueError, match="x: a TmaConfig needs K a multiple of 16"):
        sg.gemm_fp8(x[:, :40], w[:, :40], xs, ws, config=sg.TmaConfig())
    out = poison_(torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE))
    for args, match in fp8_binding_cases(out, x, w, xs, ws, (64, 2, 4, 1)):
        with pytest.raises(RuntimeError, match=match):
            sg.ops.skinny_tma_fp8(*args)
    assert torch.isnan(out.float()).all()


@needs_tma
def test_pdl_chain():
    """Programmatic dependent launch: each call's W streams in before it waits for the previous
    kernel, its x, out and scales only after. A chain where each call reads the previous call's
    output and writes a buffer the call before it read (ping-pong), eager and as a CUDA graph,
    equals the calls made one by one with a synchronize between them; pdl=False is the same
    bits."""
    N = K = 4096
    ws = [make(1, N, K, torch.bfloat16, seed=40 + i)[1] for i in range(6)]
    x = make(16, N, K, torch.bfloat16, seed=39)[0]
    cfg = sg.TmaConfig()
    expected, y = [], x
    for w in ws:
        y = sg.gemm(y, w, config=cfg)
        torch.cuda.synchronize()
        expected.append(y.clone())
    bufs = [torch.empty(16, N, dtype=torch.bfloat16, device=DEVICE) for _ in range(2)]

    def chain(x):
        y = x
        for i, w in enumerate(ws):
            y = sg.gemm(y, w, out=bufs[i % 2], config=cfg)
        return y

    assert torch.equal(chain(x), expected[-1])
    static_x = x.clone()
    chain(static_x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(static_x)
    for _ in range(3):
        poison_(bufs[0]), poison_(bufs[1])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bufs[(len(ws) - 1) % 2], expected[-1])
    out_pdl, out_plain = (torch.empty(16, N, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    sg.ops.skinny_tma(out_pdl, x, ws[0], None, 64, 2, 4, 4, True)
    sg.ops.skinny_tma(out_plain, x, ws[0], None, 64, 2, 4, 4, False)
    assert torch.equal(out_pdl, out_plain)


@needs_tma
def test_layouts_and_out():
    """x strided or misaligned (copied first), 3-D x, out= given (fully written), M = 0 (nothing
    launched), and an uncompiled configuration (an error naming config, out untouched)."""
    x, w, b = make(6, 512, 1024, torch.bfloat16, seed=6, bias=True)
    ref = reference(x, w, b)
    strided = torch.empty(6, 2048, dtype=x.dtype, device=DEVICE)[:, ::2]
    strided.copy_(x)
    assert_gemm_close(run_tma(strided, w, b), ref, "strided x")
    shifted = torch.empty(6 * 1024 + 1, dtype=x.dtype, device=DEVICE)[1:].view(6, 1024)
    shifted.copy_(x)
    assert_gemm_close(run_tma(shifted, w, b), ref, "misaligned x")
    y = sg.gemm(x.view(2, 3, 1024), w, b, config=sg.TmaConfig())
    assert_gemm_close(y.view(6, 512), ref, "3-D x")
    assert sg.gemm(x[:0], w, config=sg.TmaConfig()).shape == (0, 512)
    out = poison_(torch.empty(6, 512, dtype=x.dtype, device=DEVICE))
    missing = next(
        sg.TmaConfig(tn, bk, st)
        for tn in _config.TMA_TILE_N for bk in _config.TMA_BOXES_K for st in _config.TMA_STAGES
        if (tn, bk, st) not in {(c.tile_n, c.boxes_k, c.stages) for c in sg.tma_configs()}
    )  # fmt: skip
    with pytest.raises(ValueError, match="config: TmaConfig.* is not compiled in this build"):
        sg.gemm(x, w, out=out, config=missing)
    assert torch.isnan(out.float()).all()


@needs_tma
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, w: sg.gemm(torch.randn(17, 64, device=DEVICE).bfloat16(), w, config=sg.TmaConfig()),
         r"x: a TmaConfig takes 1 to 16 rows \(tokens\), got 17"),
        (lambda x, w: sg.gemm(x[:, :60], w[:, :60], config=sg.TmaConfig()),
         "x: a TmaConfig needs K a multiple of 8"),
        (lambda x, w: sg.gemm(x[:, :56], w[:, :56], config=sg.TmaConfig()),
         r"w: a TmaConfig needs a row stride that is a multiple of 8 elements"),
    ],
    ids=["M", "K", "w stride"],
)
def test_bad_input(call, match):
    x, w, _ = make(4, 32, 64, torch.bfloat16, seed=7)
    w = torch.cat([w, w[:, :4]], dim=1)[:, :64] if "stride" in match else w  # row stride 68
    with pytest.raises(ValueError, match=match):
        call(x, w)


@needs_tma
def test_binding_checks():
    """The compiled op's own checks (direct torch.ops callers), each before anything is written:
    values that would narrow to a compiled launch, a split out of 1-8 (0 is the Python layer's)."""
    x, w, _ = make(4, 32, 64, torch.bfloat16, seed=8)
    out = poison_(torch.empty(4, 32, dtype=x.dtype, device=DEVICE))
    op = sg.ops.skinny_tma
    cases = [
        ((out, x, w, None, 64, 3, 6, 1), r"config: \(tile_n, boxes_k, stages\) = \(64, 3, 6\) is not compiled"),
        ((out, x, w, None, 2**32 + 64, 2, 6, 1), r"config: .* = \(4294967360, 2, 6\) is not compiled"),
        ((out, x, w, None, 64, 2, 6, 0), r"config: split \(K slices, the blocks of a cluster\) must be 1 .. 8, got 0"),
        ((out, x, w, None, 64, 2, 6, 9), r"config: split .* got 9"),
        ((out, x, w.half(), None, 64, 2, 6, 1), r"w: expected a BFloat16 \[N, 64\] tensor"),
        ((out[:, :16], x, w, None, 64, 2, 6, 1), r"out: expected a \[4, 32\] tensor"),
        ((out.half(), x, w, None, 64, 2, 6, 1), r"out: expected dtype BFloat16 \(x's\), got Half"),
        ((out, x.float(), w, None, 64, 2, 6, 1), "x: expected dtype bfloat16 or float16"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            op(*args)
    assert torch.isnan(out.float()).all()


def check_deterministic(cfg, M: int = 16):
    """A compiled kernel's sums in a fixed order: repeated calls with ``cfg`` are bitwise equal."""
    x, w, _ = make(M, 2304, 16384, torch.bfloat16, seed=9)
    first = run_config(x, w, None, cfg)
    for _ in range(5):
        assert torch.equal(run_config(x, w, None, cfg), first)


@needs_tma
def test_deterministic():
    """The K slices are summed in block order."""
    check_deterministic(sg.TmaConfig())


# ---------------------------------------------------------------------------------------------
# torch.library contract, torch.compile, CUDA graphs
# ---------------------------------------------------------------------------------------------


def check_opcheck(cfg):
    """The 16-bit op's torch.library contract with ``cfg`` as its int[] config, and its result."""
    x, w, b = make(5, 200, 512, torch.bfloat16, seed=10, bias=True)
    out = torch.empty(5, 200, dtype=torch.bfloat16, device=DEVICE)
    args = (out, x, w, b, True, cfg.as_list())
    opcheck(sg.ops.skinny_gemm, args)
    poison_(out)
    assert_only_declared_outputs_mutate(sg.ops.skinny_gemm, args)
    assert_gemm_close(out, reference(x, w, b), "after opcheck")


def check_opcheck_fp8(cfg):
    """The FP8 op's torch.library contract with ``cfg`` as its int[] config, and its result."""
    xq, wq, xs, ws = make_fp8(5, 200, 512, torch.float8_e4m3fn, seed=10)
    out = torch.empty(5, 200, dtype=torch.bfloat16, device=DEVICE)
    args = (out, xq, wq, xs.reshape(5), ws.reshape(200), None, True, cfg.as_list())
    opcheck(sg.ops.skinny_gemm_fp8, args)
    poison_(out)
    assert_only_declared_outputs_mutate(sg.ops.skinny_gemm_fp8, args)
    assert_gemm_close(out, reference_fp8(xq, wq, xs, ws), "FP8 after opcheck")


@needs_tma
def test_opcheck():
    check_opcheck(sg.TmaConfig())
    check_opcheck_fp8(sg.TmaConfig())


@needs_tma
def test_torch_compile_fullgraph(table):
    x, w, b = make(6, 256, 512, torch.float16, seed=11, bias=True)
    table[(_gpu_key(), "float16", 256, 512)] = [(8, [0, 64, 2, 6, 2])]

    xq, wq, xs, ws = make_fp8(6, 256, 512, torch.float8_e4m3fn, seed=11)

    def block(x):
        return [sg.gemm(x, w, b, config=sg.TmaConfig(128, 2, 4)) + 1, sg.linear(x * 2, w),
                sg.gemm_fp8(xq, wq, xs, ws, config=sg.TmaConfig(64, 2, 4))]  # fmt: skip

    with torch.no_grad():
        got = torch.compile(block, fullgraph=True, dynamic=False)(x)
        expected = block(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def check_cuda_graph_capture(cfg, M):
    """Captured once with ``cfg``, replayed on new inputs: equal to eager calls, fully written."""
    x, w, b = make(M, 2304, 16384, torch.bfloat16, seed=12, bias=True)
    static_x = x.clone()
    sg.gemm(static_x, w, b, config=cfg)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sg.gemm(static_x, w, b, config=cfg)
    for seed in (13, 14):
        new_x = torch.randn(M, 16384, generator=gen(seed)).bfloat16().to(DEVICE)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, sg.gemm(new_x, w, b, config=cfg))
        assert_fully_written(static_out, "graph replay")


@needs_tma
@pytest.mark.parametrize("M", [1, 16])
def test_cuda_graph_capture(M):
    """A cluster launch in a graph."""
    check_cuda_graph_capture(sg.TmaConfig(), M)
