"""gated-mlp against an fp32 reference (the same bf16 / fp16 inputs, products and sums in fp32).

On CUDA the Triton kernel runs compiled (TMA + wgmma on sm90, pointer loads elsewhere); on CPU
it runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1), or the plain-torch path
when Triton is missing. The compiled CuTe kernels (the CUDA build's ops: sm80, capability 8.0
code + PTX, and sm90, 9.0a) have their own section at the end, every test parametrized by
kernel (``-k sm80`` / ``-k sm90``): on a Hopper GPU both run, forced with ``impl=``. Tolerance: the kernel rounds once to the output dtype, so a result is
within one ulp of the fp32 reference's (the interpreter truncates instead of rounding: still
one ulp), plus a small absolute term for the fp32 summation order over K: 1e-4 of the
output's scale.
"""

from __future__ import annotations

import dataclasses
import os

import kernels
import pytest
import torch

from gated_mlp_testing import (
    assert_fp8_close,
    assert_fully_written,
    assert_only_declared_outputs_mutate,
    device,
    fp8_ulp,
    opcheck,
    poison_,
)

rt = kernels.get_kernel("fused-llm/gated-mlp", version=1)

DEVICE = device()
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def make_inputs(M, D, U, dtype, seed, bias=False):
    """Kaiming-like weights (std 1/sqrt(D)), unit-variance x: outputs of order one."""
    g = gen(seed)
    x = torch.randn(M, D, generator=g, device=DEVICE).to(dtype)
    w_gate = (torch.randn(U, D, generator=g, device=DEVICE) / D**0.5).to(dtype)
    w_up = (torch.randn(U, D, generator=g, device=DEVICE) / D**0.5).to(dtype)
    b = None
    if bias:
        b = (0.1 * torch.randn(U, generator=g, device=DEVICE)).to(dtype), (0.1 * torch.randn(U, generator=g, device=DEVICE)).to(dtype)
    return x, w_gate, w_up, b


def reference(x, w_gate, w_up, activation="silu", bias_gate=None, bias_up=None) -> torch.Tensor:
    return reference_from(x.double() @ w_gate.double().T, x.double() @ w_up.double().T, activation, bias_gate, bias_up)


def reference_from(g, u, activation, bias_gate, bias_up) -> torch.Tensor:
    """act(g + b_g) * (u + b_u) in fp64, from the two projections."""
    if bias_gate is not None:
        g = g + bias_gate.double()
    if bias_up is not None:
        u = u + bias_up.double()
    act = torch.nn.functional.silu(g) if activation == "silu" else torch.nn.functional.gelu(g, approximate="tanh")
    return act * u


def assert_gated_close(got: torch.Tensor, ref: torch.Tensor, name: str, atol_frac: float = 1e-4) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert_fully_written(got, name)
    if not got.numel():
        return
    scale = ref.abs().max().item()
    tol = ULP[got.dtype] * ref.abs() + atol_frac * scale + 1e-6
    err = (got.double() - ref).abs()
    worst = (err / tol).max().item()
    if worst > 1:
        i = int((err / tol).flatten().argmax())
        raise AssertionError(
            f"{name}: error {err.flatten()[i].item():.3g} at flat index {i} ({got.flatten()[i].item():g} vs "
            f"{ref.flatten()[i].item():g}) is {worst:.2f}x the tolerance"
        )


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

if DEVICE == "cuda":
    SIZES = [(1, 4096, 14336), (7, 4096, 14336), (64, 4096, 11008), (1000, 1024, 1000), (4096, 4096, 1000), (1000, 8192, 2048)]
else:  # the interpreter runs numpy per program: small shapes, the same edge cases
    SIZES = [(1, 256, 160), (7, 200, 100), (64, 128, 96), (100, 64, 40)]


@pytest.mark.parametrize("M, D, U", SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gated_mlp(M, D, U, activation, dtype):
    x, w_gate, w_up, _ = make_inputs(M, D, U, dtype, seed=M + D + U)
    out = poison_(torch.empty(M, U, dtype=dtype, device=DEVICE))
    rt.ops.gated_mlp(out, x, w_gate, w_up, None, None, activation)
    assert_gated_close(out, reference(x, w_gate, w_up, activation), f"{activation} {dtype}")
    assert torch.equal(rt.gated_mlp(x, w_gate, w_up, activation=activation), out)


@pytest.mark.skipif(DEVICE != "cuda", reason="the interpreter runs the pointer path anyway")
@pytest.mark.parametrize("M, D, U", SIZES[:4], ids=lambda v: str(v))
def test_pointer_path(M, D, U):
    """The operand path of GPUs without TMA (sm80, gfx942): its default tiles, forced here
    (Triton compiles it for the GPU at hand, so on an H100 / H200 it is the same Triton code,
    not an sm80 binary)."""
    x, w_gate, w_up, _ = make_inputs(M, D, U, torch.bfloat16, seed=M + 1)
    out = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
    kern = rt._triton_kernels()
    cfg = kern.gated_mlp_config(M, U, D, torch.cuda.get_device_properties(DEVICE).multi_processor_count, tma=False)
    kern.launch_gated_mlp(x, w_gate, w_up, None, None, out, "silu", cfg=cfg)
    assert_gated_close(out, reference(x, w_gate, w_up), "pointer path")


@pytest.mark.kernels_ci
def test_gated_mlp_ci():
    test_gated_mlp(*SIZES[1], "silu", torch.bfloat16)


@pytest.mark.parametrize("layout", ["separate", "concat", "interleaved"])
@pytest.mark.parametrize("bias", [False, True])
def test_weight_layouts_and_biases(layout, bias):
    """The same projection from separate weights, one concatenated weight (Phi-3's gate_up_proj)
    and the row-interleaved one: the kernel reads row-strided views, no copy."""
    M, D, U = (33, 1024, 3000) if DEVICE == "cuda" else (9, 128, 48)
    x, w_gate, w_up, b = make_inputs(M, D, U, torch.bfloat16, seed=5, bias=bias)
    b_gate, b_up = b if bias else (None, None)
    ref = reference(x, w_gate, w_up, "silu", b_gate, b_up)
    if layout == "separate":
        got = rt.gated_mlp(x, w_gate, w_up, bias_gate=b_gate, bias_up=b_up)
    elif layout == "concat":
        fused_b = torch.cat([b_gate, b_up]) if bias else None
        got = rt.gated_mlp_fused(x, torch.cat([w_gate, w_up]), layout="concat", bias=fused_b)
    else:
        fused_b = rt.interleave_gate_up(b_gate, b_up) if bias else None
        got = rt.gated_mlp_fused(x, rt.interleave_gate_up(w_gate, w_up), layout="interleaved", bias=fused_b)
    assert_gated_close(got, ref, layout)


def test_interleave_gate_up():
    w_gate, w_up = torch.arange(6.0).view(3, 2), -torch.arange(6.0).view(3, 2)
    w = rt.interleave_gate_up(w_gate, w_up)
    assert torch.equal(w[0::2], w_gate) and torch.equal(w[1::2], w_up)


def test_one_bias_and_fp32_bias():
    M, D, U = (5, 512, 256) if DEVICE == "cuda" else (5, 64, 32)
    x, w_gate, w_up, (b_gate, _) = make_inputs(M, D, U, torch.float16, seed=6, bias=True)
    assert_gated_close(rt.gated_mlp(x, w_gate, w_up, bias_gate=b_gate), reference(x, w_gate, w_up, "silu", b_gate), "gate bias")
    b32 = b_gate.float() * 3
    got = rt.gated_mlp(x, w_gate, w_up, activation="gelu_tanh", bias_up=b32)
    assert_gated_close(got, reference(x, w_gate, w_up, "gelu_tanh", None, b32), "fp32 up bias")


def test_leading_dims_non_contiguous_x_and_empty():
    D, U = (1024, 384) if DEVICE == "cuda" else (64, 48)
    _, w_gate, w_up, _ = make_inputs(1, D, U, torch.bfloat16, seed=7)
    x = torch.randn(D, 2, 3, device=DEVICE).bfloat16().permute(1, 2, 0)  # [2, 3, D], D strided
    got = rt.gated_mlp(x, w_gate, w_up)
    assert got.shape == (2, 3, U)
    assert_gated_close(got, reference(x, w_gate, w_up), "non-contiguous x")
    assert rt.gated_mlp(x[:, :0], w_gate, w_up).shape == (2, 0, U)
    assert rt.gated_mlp(x, w_gate[:0], w_up[:0]).shape == (2, 3, 0)


def test_row_strided_weight_views():
    """Weights as views with a padded row stride (a slice of a wider matrix)."""
    M, D, U = (17, 1024, 200) if DEVICE == "cuda" else (17, 64, 40)
    x, _, _, _ = make_inputs(M, D, U, torch.bfloat16, seed=8)
    big = (torch.randn(2 * U, D + 64, device=DEVICE) / D**0.5).bfloat16()
    w_gate, w_up = big[:U, 32 : 32 + D], big[U:, 32 : 32 + D]
    assert not w_gate.is_contiguous()
    assert_gated_close(rt.gated_mlp(x, w_gate, w_up), reference(x, w_gate, w_up), "strided views")


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize(
    "block_m, block_n, block_k, split, n_full, tma, swap",
    [(16, 32, 32, 1, 0, False, False), (16, 32, 32, 3, 0, False, False), (32, 64, 64, 2, 0, False, False),
     (64, 32, 32, 5, 0, False, False), (16, 32, 32, 2, 5, False, False), (16, 16, 64, 3, 8, False, False),
     (16, 32, 32, 3, 0, False, True), (32, 64, 64, 1, 0, False, True),
     (64, 64, 64, 1, 0, True, False), (128, 128, 64, 1, 0, True, False), (64, 64, 128, 4, 0, True, False),
     (128, 64, 64, 2, 3, True, False), (64, 64, 64, 3, 1, True, False),
     (16, 64, 64, 1, 0, True, True), (16, 128, 128, 3, 0, True, True), (64, 64, 64, 2, 1, True, True)],
)  # fmt: skip
def test_tile_configs(block_m, block_n, block_k, split, n_full, tma, swap):
    """Every tile shape and K split the launcher can pick (uneven splits, a K tail, tiles past
    M and U; every tile split, or only the tiles from N_FULL on; W @ x^T accumulators for
    decode), pointer loads and, on sm90, TMA; each called twice: the split-K counters must be
    left reset for the next call."""
    kern = rt._triton_kernels()
    M, D, U = (70, 1000, 300) if DEVICE == "cuda" else (37, 200, 72)
    if tma and not (DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("TMA needs sm90")
    x, w_gate, w_up, (b_gate, b_up) = make_inputs(M, D, U, torch.bfloat16, seed=9, bias=True)
    ref = reference(x, w_gate, w_up, "silu", b_gate, b_up)
    cfg = kern.GatedMlpConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=4, SPLIT_K=split, N_FULL=n_full,
                              SWAP_AB=swap, USE_TMA=tma, num_warps=4, num_stages=2)  # fmt: skip
    for _ in range(2):
        out = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
        kern.launch_gated_mlp(x, w_gate, w_up, b_gate, b_up, out, "silu", cfg=cfg)
        assert_gated_close(out, ref, f"config {cfg}")
    counters = kern._COUNTERS.get(x.device)
    assert counters is None or int(counters.abs().sum()) == 0


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton launcher's configuration")
def test_config_splits_only_a_short_last_wave():
    """At prefill the launcher splits the tiles of a short last wave over K and no others
    (the configuration only: the kernel runs such splits in test_tile_configs)."""
    kern = rt._triton_kernels()
    cfg = kern.gated_mlp_config(256, 28672, 8192, sms=132)  # 70B: 2 x 224 = 448 tiles = 3 x 132 + 52
    assert (cfg.SPLIT_K, cfg.N_FULL) == (2, 396), cfg
    cfg = kern.gated_mlp_config(256, 53248, 16384, sms=132)  # 405B: 832 tiles = 6 x 132 + 40
    assert (cfg.SPLIT_K, cfg.N_FULL) == (3, 792), cfg
    cfg = kern.gated_mlp_config(256, 14336, 4096, sms=132)  # 8B: 224 = 132 + 92: 92 x 2 > 132
    assert (cfg.SPLIT_K, cfg.N_FULL) == (1, 0), cfg
    cfg = kern.gated_mlp_config(1, 4096, 4096, sms=132)  # 32 tiles at decode: every tile split
    assert cfg.SPLIT_K > 1 and cfg.N_FULL == 0, cfg
    cfg = kern.gated_mlp_config(256, 28672, 8192, sms=132, fp8=True)  # measured in bf16 only
    assert cfg.SPLIT_K == 1, cfg


NEEDS_TRITON = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton launcher's configuration")


@NEEDS_TRITON
@pytest.mark.kernels_ci
def test_picked_configs():
    """A few picks pinned (Llama-3 8B MLP: U 14336, D 4096; sm90: TMA, 132 SMs; sm80: 108 SMs;
    gfx942: 304 CUs, both without TMA): a change here changes what runs on the GPU."""
    kern = rt._triton_kernels()
    C, pick = kern.GatedMlpConfig, kern.gated_mlp_config
    assert pick(1, 14336, 4096, 132, True) == C(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SWAP_AB=True, USE_TMA=True,
                                                num_stages=5)  # fmt: skip
    assert pick(1, 14336, 4096, 132, True, fp8=True) == C(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SWAP_AB=True,
                                                          USE_TMA=True, num_stages=2)  # fmt: skip
    assert pick(1024, 14336, 4096, 132, True) == C(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=16, USE_TMA=True,
                                                   num_warps=8, num_stages=4)  # fmt: skip
    assert pick(1, 14336, 4096, 108, False) == C(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, USE_TMA=False)
    # 112 tiles cover less than half of gfx942's 304 CUs: split over K
    assert pick(1, 14336, 4096, 304, False) == C(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, SPLIT_K=3, USE_TMA=False)


@NEEDS_TRITON
@pytest.mark.kernels_ci
def test_config_override_replaces_the_pick_whole(monkeypatch):
    """The launcher launches a caller's configuration as it is, nothing of the pick merged in (a
    dataclasses.replace of the pick differs only in the fields it names); USE_TMA None is decided
    by the launcher."""
    kern = rt._triton_kernels()
    kern._GATED_PLANS.entries.clear()  # no launch plan of an earlier test: every call goes through the JIT
    launched = []
    launch_and_plan = type(kern._GATED_PLANS).launch_and_plan

    def spy(self, key, grid, varying, args, kwargs):
        launched.append(kwargs)
        return launch_and_plan(self, key, grid, varying, args, kwargs)

    monkeypatch.setattr(type(kern._GATED_PLANS), "launch_and_plan", spy)
    M, D, U = 7, 200, 100
    x, w_gate, w_up, _ = make_inputs(M, D, U, torch.bfloat16, seed=40)
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if DEVICE == "cuda" else 132
    tma = kern._tma_capable(x, w_gate, w_up)
    picked = kern.gated_mlp_config(M, U, D, sms, tma)
    mine = dataclasses.replace(picked, BLOCK_N=64, BLOCK_K=32, SPLIT_K=1, num_warps=2, num_stages=2)
    undecided = dataclasses.replace(mine, USE_TMA=None)
    for cfg in (None, mine, undecided):
        out = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
        kern.launch_gated_mlp(x, w_gate, w_up, None, None, out, "silu", cfg)
        assert_gated_close(out, reference(x, w_gate, w_up), f"config {cfg}")
    assert len(launched) == 3
    for kwargs, cfg in zip(launched, (picked, mine, mine)):
        assert {name: kwargs[name] for name in cfg.launch_kwargs()} == cfg.launch_kwargs()


@NEEDS_TRITON
@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "fields, exc, match",
    [({"BLOCK_N": 48}, ValueError, "GatedMlpConfig.BLOCK_N: expected a power of two >= 16, got 48"),
     ({"BLOCK_K": 8}, ValueError, "GatedMlpConfig.BLOCK_K: expected a power of two >= 16, got 8"),
     ({"num_warps": 3}, ValueError, "GatedMlpConfig.num_warps: expected a power of two >= 1, got 3"),
     ({"N_FULL": -1}, ValueError, "GatedMlpConfig.N_FULL: expected an int >= 0, got -1"),
     ({"GROUP_M": 1.0}, TypeError, "GatedMlpConfig.GROUP_M: expected an int, got 1.0"),
     ({"SWAP_AB": "yes"}, TypeError, "GatedMlpConfig.SWAP_AB: expected True or False, got 'yes'")],
    ids=lambda v: str(v),
)  # fmt: skip
def test_bad_config(fields, exc, match):
    kern = rt._triton_kernels()
    with pytest.raises(exc, match=match):
        kern.GatedMlpConfig(**{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, **fields})


@NEEDS_TRITON
@pytest.mark.kernels_ci
def test_bad_override_writes_nothing():
    """A cfg that is not a GatedMlpConfig (e.g. the dict form of earlier versions) raises before
    anything is launched."""
    kern = rt._triton_kernels()
    x, w_gate, w_up, _ = make_inputs(4, 64, 32, torch.bfloat16, seed=41)
    out = poison_(torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE))
    before = out.clone()
    with pytest.raises(TypeError, match=r"cfg: expected a GatedMlpConfig \(it replaces the picked configuration whole"):
        kern.launch_gated_mlp(x, w_gate, w_up, None, None, out, "silu", {"USE_TMA": False})
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))
    with pytest.raises(dataclasses.FrozenInstanceError):
        kern.gated_mlp_config(4, 32, 64).BLOCK_M = 64


# ---------------------------------------------------------------------------------------------
# FP8 (e4m3 x and weights, scales per tensor / token / channel; bf16, fp16 or FP8 out)
# ---------------------------------------------------------------------------------------------

FP8 = torch.float8_e4m3fnuz if torch.version.hip is not None else torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
# sm90 multiplies FP8 natively with Hopper's fast (short-mantissa) accumulation: results are
# off the fp64 reference by up to ~1% of the output's scale at K = 4096 (measured on an H200),
# not by rounding alone. Elsewhere (bf16 upcast, interpreter, plain torch) fp32 sums: 1e-4.
NATIVE_FP8 = DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability()[0] == 9
FP8_ATOL = 1e-2 if NATIVE_FP8 else 1e-4


def quantize(t: torch.Tensor, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """t as FP8 with fp32 scales (amax / FP8_MAX), one per row or one for the tensor."""
    amax = t.abs().amax(dim=1) if per_row else t.abs().amax().reshape(1)
    scale = (amax.float() / FP8_MAX).clamp(min=1e-12)
    q = (t.float() / (scale[:, None] if per_row else scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def make_fp8_inputs(M, D, U, seed, per_row: bool):
    x, w_gate, w_up, _ = make_inputs(M, D, U, torch.float32, seed)
    (xq, xs), (gq, gs), (uq, us) = (quantize(t, per_row) for t in (x, w_gate, w_up))
    return xq, gq, uq, xs, gs, us


def reference_fp8(xq, gq, uq, xs, gs, us, activation="silu", bias_gate=None, bias_up=None) -> torch.Tensor:
    g = (xq.double() @ gq.double().T) * xs.double()[:, None] * gs.double()[None, :]
    u = (xq.double() @ uq.double().T) * xs.double()[:, None] * us.double()[None, :]
    return reference_from(g, u, activation, bias_gate, bias_up)


def assert_fp8_out_close(q: torch.Tensor, y_ref: torch.Tensor, out_scale: torch.Tensor, name: str) -> None:
    """The FP8 output within one FP8 ulp of the fp64 result quantized the same way, and at most
    1% of the bytes differing (rounding-boundary flips). The interpreter truncates instead of
    rounding (every inexact value may differ by an ulp); native FP8 accumulation (sm90) adds
    FP8_ATOL of the output's scale to the bound."""
    ref_q = (y_ref / out_scale.double()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    if not NATIVE_FP8:
        assert_fp8_close(q, ref_q, out_scale, out_scale, max_mismatch=1.0 if INTERPRETED else 0.01, name=name)
        return
    assert_fully_written(q, name)
    deq = q.double() * out_scale.double()
    ref_deq = ref_q.double() * out_scale.double()
    tol = fp8_ulp(ref_q, FP8).double() * out_scale.double() * 1.001 + FP8_ATOL * y_ref.abs().max()
    worst = ((deq - ref_deq).abs() / tol).max().item()
    assert worst <= 1.0, f"{name}: dequantized error up to {worst:.2f}x (one FP8 ulp + {FP8_ATOL:g} of the scale)"


FP8_SIZES = [(1, 4096, 14336), (64, 4096, 1000), (1000, 8192, 2048), (4096, 4096, 1024)] if DEVICE == "cuda" else [(1, 256, 160), (37, 128, 96)]


@pytest.mark.parametrize("M, D, U", FP8_SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("per_row", [False, True], ids=["per-tensor", "per-token-and-channel"])
@pytest.mark.parametrize("out", ["bf16", "fp8"])
def test_gated_mlp_fp8(M, D, U, per_row, out):
    xq, gq, uq, xs, gs, us = make_fp8_inputs(M, D, U, seed=M + U, per_row=per_row)
    y_ref = reference_fp8(xq, gq, uq, xs, gs, us)
    if out == "bf16":
        got = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
        rt.ops.gated_mlp_fp8(got, xq, gq, uq, xs, gs, us, None, None, None, "silu")
        assert_gated_close(got, y_ref, "fp8 in, bf16 out", FP8_ATOL)
    else:
        out_scale = (y_ref.abs().max().float() / FP8_MAX).reshape(1)
        got = poison_(torch.empty(M, U, dtype=FP8, device=DEVICE))
        rt.ops.gated_mlp_fp8(got, xq, gq, uq, xs, gs, us, None, None, out_scale, "silu")
        assert_fp8_out_close(got, y_ref, out_scale, "fp8 in, fp8 out")
        public = rt.gated_mlp_fp8(xq, gq, uq, xs, gs, us, out_dtype=FP8, out_scale=out_scale)
        assert torch.equal(public.view(torch.uint8), got.view(torch.uint8))


@pytest.mark.kernels_ci
def test_gated_mlp_fp8_ci():
    test_gated_mlp_fp8(*FP8_SIZES[-1], True, "fp8")


def test_gated_mlp_fp8_bias_gelu_fp16_and_saturation():
    """Biases (fp32 and bf16), GeGLU, fp16 out, leading dims, an out_scale small enough that
    results saturate at the format's max."""
    M, D, U = (48, 1024, 384) if DEVICE == "cuda" else (12, 64, 48)
    xq, gq, uq, xs, gs, us = make_fp8_inputs(M, D, U, seed=21, per_row=True)
    b_gate = 0.1 * torch.randn(U, device=DEVICE)
    b_up = (0.1 * torch.randn(U, device=DEVICE)).bfloat16()
    y_ref = reference_fp8(xq, gq, uq, xs, gs, us, "gelu_tanh", b_gate, b_up)
    got = rt.gated_mlp_fp8(xq.view(3, M // 3, D), gq, uq, xs.view(3, M // 3, 1), gs, us, activation="gelu_tanh",
                           bias_gate=b_gate, bias_up=b_up, out_dtype=torch.float16)  # fmt: skip
    assert got.shape == (3, M // 3, U) and got.dtype == torch.float16
    assert_gated_close(got.view(M, U), y_ref, "fp8 gelu bias fp16 out", FP8_ATOL)
    small = (y_ref.abs().max().float() / FP8_MAX / 8).reshape(1)  # the largest 1/8 saturate
    q = rt.gated_mlp_fp8(xq, gq, uq, xs, gs, us, activation="gelu_tanh", bias_gate=b_gate, bias_up=b_up,
                         out_dtype=FP8, out_scale=small)  # fmt: skip
    assert q.float().abs().max().item() == FP8_MAX
    assert_fp8_out_close(q, y_ref, small, "saturating out_scale")


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize("tma", [False, True], ids=["pointers (bf16 upcast)", "tma (native fp8)"])
@pytest.mark.parametrize("split, swap", [(1, False), (3, False), (2, True)])
def test_fp8_tile_configs(tma, split, swap):
    if tma and not (DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("TMA needs sm90")
    kern = rt._triton_kernels()
    M, D, U = (70, 1024, 300) if DEVICE == "cuda" else (37, 256, 72)
    xq, gq, uq, xs, gs, us = make_fp8_inputs(M, D, U, seed=22, per_row=True)
    y_ref = reference_fp8(xq, gq, uq, xs, gs, us)
    out_scale = (y_ref.abs().max().float() / FP8_MAX).reshape(1)
    cfg = kern.GatedMlpConfig(BLOCK_M=16 if swap else 64, BLOCK_N=64, BLOCK_K=64 if tma else 32, GROUP_M=4, SPLIT_K=split,
                              SWAP_AB=swap, USE_TMA=tma, num_warps=4, num_stages=2)  # fmt: skip
    for _ in range(2):
        q = poison_(torch.empty(M, U, dtype=FP8, device=DEVICE))
        kern.launch_gated_mlp(xq, gq, uq, None, None, q, "silu", cfg, (xs, gs, us), out_scale)
        assert_fp8_out_close(q, y_ref, out_scale, f"config {cfg}")


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the argument, before anything is written
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    x = torch.randn(4, 64, device=DEVICE).bfloat16()
    w = torch.randn(32, 64, device=DEVICE).bfloat16()
    wide = torch.randn(32, 72, device=DEVICE).bfloat16()
    odd_rows = torch.randn(32, 67, device=DEVICE).bfloat16()[:, :64]  # row stride 67: 134 bytes
    xq, wq = x.to(FP8), w.to(FP8)
    wq_odd = torch.randn(32, 72, device=DEVICE).to(FP8)[:, :64]  # row stride 72 bytes
    one = torch.ones(1, device=DEVICE)
    return [
        ("x dtype", lambda: rt.gated_mlp(x.float(), w, w), TypeError, "x: expected dtype float16 or bfloat16"),
        ("x type", lambda: rt.gated_mlp([1.0], w, w), TypeError, "x: expected a torch.Tensor"),
        ("w_gate dtype", lambda: rt.gated_mlp(x, w.half(), w), TypeError, "w_gate: expected dtype torch.bfloat16"),
        ("w_up dtype", lambda: rt.gated_mlp(x, w, w.float()), TypeError, "w_up: expected dtype torch.bfloat16"),
        ("w_gate shape", lambda: rt.gated_mlp(x, w[:, :32], w), ValueError, r"w_gate: expected shape \[U, 64\]"),
        ("w_up rows", lambda: rt.gated_mlp(x, w, w[:16]), ValueError, r"w_up: expected shape \[32, 64\]"),
        ("w_up 3-D", lambda: rt.gated_mlp(x, w, w[None]), ValueError, "w_up: expected shape"),
        ("w_gate K stride", lambda: rt.gated_mlp(x, torch.randn(64, 32, device=DEVICE).bfloat16().T, w), ValueError, "w_gate: the D dimension must be contiguous"),
        ("w_up row stride", lambda: rt.gated_mlp(x, w, odd_rows), ValueError, "w_up: expected a row stride that is a multiple of 16 bytes"),
        ("w_gate misaligned", lambda: rt.gated_mlp(x, wide[:, 1:65], w), ValueError, "w_gate: expected a 16-byte aligned start"),
        ("bias shape", lambda: rt.gated_mlp(x, w, w, bias_gate=torch.zeros(31, device=DEVICE)), ValueError, r"bias_gate: expected shape \(32,\)"),
        ("bias dtype", lambda: rt.gated_mlp(x, w, w, bias_up=torch.zeros(32, device=DEVICE).half()), TypeError, "bias_up: expected dtype"),
        ("activation", lambda: rt.gated_mlp(x, w, w, activation="relu"), ValueError, "activation: expected one of"),
        ("impl", lambda: rt.gated_mlp(x, w, w, impl="cutlass"), ValueError, r"impl: expected one of \('auto', 'triton', 'sm80', 'sm90'\)"),
        ("fused impl", lambda: rt.gated_mlp_fused(x, torch.cat([w, w]), impl=None), ValueError, "impl: expected one of"),
        ("layout", lambda: rt.gated_mlp_fused(x, torch.cat([w, w]), layout="stacked"), ValueError, "layout: expected 'concat' or 'interleaved'"),
        ("fused rows", lambda: rt.gated_mlp_fused(x, w[:31]), ValueError, "w_gate_up: expected an even number of rows"),
        ("fused bias", lambda: rt.gated_mlp_fused(x, torch.cat([w, w]), bias=torch.zeros(63, device=DEVICE)), ValueError, r"bias: expected shape \(64,\), got \(63,\)"),
        ("fused bias dtype", lambda: rt.gated_mlp_fused(x, torch.cat([w, w]), bias=torch.zeros(64, device=DEVICE).half()), TypeError, "bias: expected dtype bfloat16 or float32, got torch.float16"),
        ("fused weight type", lambda: rt.gated_mlp_fused(x, w.tolist()), TypeError, "w_gate_up: expected a torch.Tensor, got list"),
        ("interleave type", lambda: rt.interleave_gate_up(w, None), TypeError, "w_up: expected a torch.Tensor, got NoneType"),
        ("interleave dtype", lambda: rt.interleave_gate_up(w, w.half()), TypeError, "w_up: expected dtype torch.bfloat16 \\(w_gate's\\), got torch.float16"),
        ("triton_enabled_for", lambda: rt.triton_enabled_for(None), TypeError, "t: expected a torch.Tensor, got NoneType"),
        ("interleave shapes", lambda: rt.interleave_gate_up(w, w[:3]), ValueError, "w_up: expected w_gate's shape"),
        ("fp8 x dtype", lambda: rt.gated_mlp_fp8(x, w, w, one, one, one), TypeError, "x: expected dtype float8_e4m3fn or float8_e4m3fnuz"),
        ("fp8 w dtype", lambda: rt.gated_mlp_fp8(xq, w, wq, one, one, one), TypeError, "w_gate: expected dtype torch.float8_e4m3fn"),
        ("fp8 w format", lambda: rt.gated_mlp_fp8(xq, wq, wq.view(torch.uint8).view(torch.float8_e4m3fnuz), one, one, one), TypeError, "w_up: expected dtype"),
        ("x_scale dtype", lambda: rt.gated_mlp_fp8(xq, wq, wq, one.half(), one, one), TypeError, "x_scale: expected dtype float32"),
        ("x_scale shape", lambda: rt.gated_mlp_fp8(xq, wq, wq, torch.ones(3, device=DEVICE), one, one), ValueError, r"x_scale: expected one value or one per token \(4\)"),
        ("w_gate_scale shape", lambda: rt.gated_mlp_fp8(xq, wq, wq, one, torch.ones(31, device=DEVICE), one), ValueError, "w_gate_scale: expected one value or one per output channel"),
        ("w scales differ", lambda: rt.gated_mlp_fp8(xq, wq, wq, one, torch.ones(32, device=DEVICE), one), ValueError, "w_up_scale: expected as many values"),
        ("out_scale missing", lambda: rt.gated_mlp_fp8(xq, wq, wq, one, one, one, out_dtype=xq.dtype), ValueError, "out_scale: required"),
        ("out_scale unused", lambda: rt.gated_mlp_fp8(xq, wq, wq, one, one, one, out_scale=one), ValueError, "out_scale: only for an FP8 out_dtype"),
        ("out_dtype", lambda: rt.gated_mlp_fp8(xq, wq, wq, one, one, one, out_dtype=torch.float32), ValueError, "out_dtype: expected bfloat16, float16"),
        ("fp8 row stride", lambda: rt.gated_mlp_fp8(xq, wq, wq_odd, one, one, one), ValueError, "w_up: expected a row stride that is a multiple of 16 bytes"),
    ]  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a second device type")
def test_bad_device():
    x = torch.randn(4, 64, device=DEVICE).bfloat16()
    w = torch.randn(32, 64).bfloat16()
    with pytest.raises(ValueError, match="w_gate: expected device"):
        rt.gated_mlp(x, w, w)


# ---------------------------------------------------------------------------------------------
# torch.library contract, torch.compile, the layer
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(bias):
    x, w_gate, w_up, b = make_inputs(5, 64, 48, torch.bfloat16, seed=10, bias=bias)
    b_gate, b_up = b if bias else (None, None)
    out = torch.empty(5, 48, dtype=torch.bfloat16, device=DEVICE)
    opcheck(rt.ops.gated_mlp, (out, x, w_gate, w_up, b_gate, b_up, "silu"))


@pytest.mark.kernels_ci
@pytest.mark.parametrize("out", ["bf16", "fp8"])
def test_opcheck_fp8(out):
    xq, gq, uq, xs, gs, us = make_fp8_inputs(5, 64, 48, seed=23, per_row=True)
    dtype = torch.bfloat16 if out == "bf16" else FP8
    out_scale = None if out == "bf16" else torch.full((1,), 0.01, device=DEVICE)
    args = (torch.empty(5, 48, dtype=dtype, device=DEVICE), xq, gq, uq, xs, gs, us, None, None, out_scale, "silu")
    opcheck(rt.ops.gated_mlp_fp8, args)
    assert_only_declared_outputs_mutate(rt.ops.gated_mlp_fp8, args)


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph():
    x, w_gate, w_up, _ = make_inputs(6, 64, 48, torch.bfloat16, seed=11)
    w_fused = torch.cat([w_gate, w_up])

    xq, gq, uq, xs, gs, us = make_fp8_inputs(6, 64, 48, seed=24, per_row=False)
    out_scale = torch.full((1,), 0.01, device=DEVICE)

    def block(x):
        a = rt.gated_mlp(x, w_gate, w_up)
        b = rt.gated_mlp_fused(x * 2, w_fused, activation="gelu_tanh")
        c = rt.gated_mlp_fp8(xq, gq, uq, xs, gs, us, out_dtype=FP8, out_scale=out_scale)
        return a + 1, b, c.float()

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for got, expected in zip(compiled(x), block(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh", "relu"])
@pytest.mark.parametrize("mlp_bias", [False, True])
def test_llama_mlp_layer(hidden_act, mlp_bias):
    """The layer's forward on a stock transformers LlamaMLP equals the module's own forward
    (bf16 rounding of the intermediate aside); activations the kernel lacks keep the module's."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    hidden, inter = (1024, 2816) if DEVICE == "cuda" else (64, 176)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, hidden_act=hidden_act, mlp_bias=mlp_bias)
    torch.manual_seed(12)
    mlp = LlamaMLP(config).to(device=DEVICE, dtype=torch.bfloat16).eval()
    x = torch.randn(3, 5, hidden, device=DEVICE).bfloat16()
    with torch.no_grad():
        got = rt.layers.LlamaMLP.forward(mlp, x)
        expected = mlp(x)
        if hidden_act == "relu":
            assert torch.equal(got, expected)
            return
        # The eager module rounds gate(x), up(x), act and the product to bf16: compare to the
        # exact (fp64) MLP with a bound that holds for both.
        act = "silu" if hidden_act == "silu" else "gelu_tanh"
        h = reference(x, mlp.gate_proj.weight, mlp.up_proj.weight, act, mlp.gate_proj.bias, mlp.up_proj.bias)
        exact = torch.nn.functional.linear(h, mlp.down_proj.weight.double(), None if mlp.down_proj.bias is None else mlp.down_proj.bias.double())
    scale = exact.abs().max().item()
    err_ours = (got.double() - exact).abs().max().item()
    err_eager = (expected.double() - exact).abs().max().item()
    assert err_ours <= max(2 * err_eager, 2e-2 * scale), f"layer: max error {err_ours:.3g} (eager's {err_eager:.3g})"


# ---------------------------------------------------------------------------------------------
# The compiled CuTe kernels (impl="sm80" / "sm90"): the CUDA build's ops. Each test runs once per
# kernel (ids "sm80" / "sm90", so ``-k sm90`` selects one). sm80: on an H100 / H200 it runs as
# mma.sync code built for sm_90a (correctness there, not an A100 speed). sm90: TMA + wgmma,
# capability 9.0 only.
# ---------------------------------------------------------------------------------------------

SM80 = DEVICE == "cuda" and rt.sm80_available()
SM90 = DEVICE == "cuda" and rt.sm90_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm80 = pytest.mark.skipif(not SM80, reason="the CuTe sm80 kernel is in the CUDA build only (this is the cpu build or no GPU)")
needs_sm90 = pytest.mark.skipif(not SM90, reason="the CuTe sm90 kernel: CUDA build and a capability 9.0 GPU")
KERNELS = [pytest.param("sm80", marks=needs_sm80, id="sm80"), pytest.param("sm90", marks=needs_sm90, id="sm90")]


def compiled_op(kernel: str):
    return getattr(rt.ops, f"gated_mlp_{kernel}")


COMPILED_M = [0, 1, 7, 64, 1000]
COMPILED_DU = [(1000, 1000), (72, 136), (4096, 14336)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("D, U", COMPILED_DU, ids=lambda v: str(v))
@pytest.mark.parametrize("M", COMPILED_M)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_values(kernel, M, D, U, activation, dtype):
    """Tails in M (7, 1000 = 7 x 128 + 104), U (1000, 136) and K (1000, 72 are not multiples of
    the 32 / 64-wide K steps), one row, no rows."""
    x, w_gate, w_up, _ = make_inputs(M, D, U, dtype, seed=M + D + U + 1)
    out = poison_(torch.empty(M, U, dtype=dtype, device=DEVICE))
    compiled_op(kernel)(out, x, w_gate, w_up, None, None, activation)
    assert_gated_close(out, reference(x, w_gate, w_up, activation), f"{kernel} {activation} {dtype}")
    assert torch.equal(rt.gated_mlp(x, w_gate, w_up, activation=activation, impl=kernel), out)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_ci(kernel):
    test_compiled_values(kernel, 7, 1000, 1000, "silu", torch.bfloat16)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("M", [129, 4096])
def test_compiled_persistent_tiles(kernel, M):
    """More output tiles than SMs (4096 x 2000: 32 x 16 tiles on 132 SMs, several per
    persistent CTA) and a second row tile of one row (M = 129)."""
    D, U = 256, 2000
    x, w_gate, w_up, _ = make_inputs(M, D, U, torch.bfloat16, seed=M + 3)
    got = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
    compiled_op(kernel)(got, x, w_gate, w_up, None, None, "silu")
    assert_gated_close(got, reference(x, w_gate, w_up), f"{kernel} M={M}")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["separate", "concat", "interleaved"])
@pytest.mark.parametrize("bias", ["none", "x dtype", "fp32", "gate only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_weight_layouts_and_biases(kernel, layout, bias, dtype):
    """Separate weights, the concat and row-interleaved [2U, D] weights read as row-strided
    views (row stride D and 2D), and biases in x's dtype or fp32, or one of the two."""
    M, D, U = 33, 1000, 1000
    x, w_gate, w_up, (b_gate, b_up) = make_inputs(M, D, U, dtype, seed=31, bias=True)
    if bias == "none":
        b_gate = b_up = None
    elif bias == "fp32":
        b_gate, b_up = b_gate.float() * 3, b_up.float() * 3
    elif bias == "gate only":
        b_up = None
    ref = reference(x, w_gate, w_up, "gelu_tanh", b_gate, b_up)
    if layout == "separate" or bias == "gate only":
        got = rt.gated_mlp(x, w_gate, w_up, activation="gelu_tanh", bias_gate=b_gate, bias_up=b_up, impl=kernel)
    elif layout == "concat":
        fused_b = torch.cat([b_gate, b_up]) if b_gate is not None else None
        got = rt.gated_mlp_fused(x, torch.cat([w_gate, w_up]), activation="gelu_tanh", bias=fused_b, impl=kernel)
    else:
        fused_b = rt.interleave_gate_up(b_gate, b_up) if b_gate is not None else None
        got = rt.gated_mlp_fused(x, rt.interleave_gate_up(w_gate, w_up), layout="interleaved", activation="gelu_tanh",
                                 bias=fused_b, impl=kernel)  # fmt: skip
    assert_gated_close(got, ref, f"{kernel} {layout} bias={bias}")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("x_pad", [8, 3], ids=["x row stride D+8", "x row stride D+3 (copied)"])
@pytest.mark.parametrize("out_pad", [0, 5], ids=["out contiguous", "out row stride U+5"])
def test_compiled_strided_x_and_out(kernel, x_pad, out_pad):
    """x rows with a padded row stride (read in place when it is a multiple of 8 elements; the
    public function copies x otherwise); a weight view with a padded row stride; an output
    with an odd row stride (no paired 32-bit stores) written through the op directly."""
    M, D, U = 70, 72, 136
    g = gen(32)
    x = torch.randn(M, D + x_pad, generator=g, device=DEVICE).bfloat16()[:, :D]
    big = (torch.randn(2 * U, D + 24, generator=g, device=DEVICE) / D**0.5).bfloat16()
    w_gate, w_up = big[:U, 8 : 8 + D], big[U:, 16 : 16 + D]  # row stride D + 24, 16-byte aligned starts
    ref = reference(x, w_gate, w_up)
    assert_gated_close(rt.gated_mlp(x, w_gate, w_up, impl=kernel), ref, "public, strided x")
    out_big = poison_(torch.empty(M, U + out_pad, dtype=torch.bfloat16, device=DEVICE))
    out = out_big[:, :U]
    x_in = x if x_pad % 8 == 0 else x.contiguous()
    compiled_op(kernel)(out, x_in, w_gate, w_up, None, None, "silu")
    assert_gated_close(out, ref, "op, strided out")
    if out_pad:
        assert torch.isnan(out_big[:, U:].float()).all(), "wrote past the output's columns"
    out_odd = poison_(torch.empty(M * (U + 1) + 1, dtype=torch.bfloat16, device=DEVICE))[1:].view(M, U + 1)[:, :U]
    compiled_op(kernel)(out_odd, x_in, w_gate, w_up, None, None, "silu")  # 2-byte aligned start
    assert_gated_close(out_odd, ref, "op, odd output address")


@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_leading_dims_non_contiguous_x_and_empty(kernel):
    D, U = 1024, 384
    _, w_gate, w_up, _ = make_inputs(1, D, U, torch.bfloat16, seed=33)
    x = torch.randn(D, 2, 3, device=DEVICE).bfloat16().permute(1, 2, 0)  # [2, 3, D], D strided
    got = rt.gated_mlp(x, w_gate, w_up, impl=kernel)
    assert got.shape == (2, 3, U)
    assert_gated_close(got, reference(x, w_gate, w_up), f"{kernel} non-contiguous x")
    assert rt.gated_mlp(x[:, :0], w_gate, w_up, impl=kernel).shape == (2, 0, U)
    assert rt.gated_mlp(x, w_gate[:0], w_up[:0], impl=kernel).shape == (2, 3, 0)


@pytest.mark.parametrize("kernel", KERNELS[1:])
@pytest.mark.parametrize("D", [1, 60, 200])
def test_compiled_sm90_any_d(kernel, D):
    """The sm90 kernel takes any D (the copy engine zero-fills the K tail) as long as the row
    strides are multiples of 8 elements: D = 1, 60 and 200 through padded views."""
    M, U = 130, 136
    g = gen(38 + D)
    stride = (D + 7) // 8 * 8 + 8
    x = torch.randn(M, stride, generator=g, device=DEVICE).bfloat16()[:, :D]
    w = (torch.randn(2 * U, stride, generator=g, device=DEVICE) / D**0.5).bfloat16()
    w_gate, w_up = w[:U, :D], w[U:, :D]
    out = poison_(torch.empty(M, U, dtype=torch.bfloat16, device=DEVICE))
    compiled_op(kernel)(out, x, w_gate, w_up, None, None, "silu")
    assert_gated_close(out, reference(x, w_gate, w_up), f"sm90 D={D}")


@needs_sm80
def test_sm80_auto_dispatch(monkeypatch):
    """impl="auto" runs the sm80 kernel on capability 8.x GPUs when its preconditions hold, the
    Triton kernel otherwise (here the GPU's capability is faked as 8.x)."""
    M, D, U = 9, 1000, 200
    x, w_gate, w_up, _ = make_inputs(M, D, U, torch.bfloat16, seed=34)
    sm80 = rt.gated_mlp(x, w_gate, w_up, impl="sm80")
    triton = rt.gated_mlp(x, w_gate, w_up, impl="triton")
    if torch.cuda.get_device_capability()[0] != 8:
        assert torch.equal(rt.gated_mlp(x, w_gate, w_up), triton), "auto: Triton on this GPU at 9 tokens"
    monkeypatch.setattr(rt, "_is_sm8x", lambda index: True)
    monkeypatch.setattr(rt, "_is_sm90", lambda index: False)
    rt._FAST_CALLS.entries.clear()  # a repeated call signature skips the dispatch (the GPU never changes)
    assert rt._auto_impl(x, w_gate, w_up) == "sm80"
    assert torch.equal(rt.gated_mlp(x, w_gate, w_up), sm80), "auto on 8.x: the sm80 kernel"
    big = (torch.randn(U, 64, device=DEVICE) / 8).bfloat16()
    x60, w60 = x[:, :60].contiguous(), big[:, :60]  # D = 60: not a multiple of 8
    assert rt._auto_impl(x60, w60, w60) == "triton"
    assert torch.equal(rt.gated_mlp(x60, w60, w60), rt.gated_mlp(x60, w60, w60, impl="triton"))
    misaligned = torch.empty(M * D + 4, dtype=torch.bfloat16, device=DEVICE)[4:].view(M, D).copy_(x)  # 8-byte aligned
    assert rt._auto_impl(misaligned, w_gate, w_up) == "triton"
    rt._FAST_CALLS.entries.clear()  # no signature keeps the faked GPU's dispatch for later tests


@needs_sm90
def test_sm90_not_auto():
    """impl="auto" on a capability 9.0 GPU keeps the Triton kernel (the sm90 kernel measured
    slower on an H100); the sm90 kernel runs only when asked for."""
    x, w_gate, w_up, _ = make_inputs(300, 1000, 200, torch.bfloat16, seed=39)
    assert rt._auto_impl(x, w_gate, w_up) == "triton"
    assert torch.equal(rt.gated_mlp(x, w_gate, w_up), rt.gated_mlp(x, w_gate, w_up, impl="triton"))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bias", [False, True])
def test_compiled_opcheck(kernel, bias):
    x, w_gate, w_up, b = make_inputs(5, 64, 48, torch.bfloat16, seed=35, bias=bias)
    b_gate, b_up = b if bias else (None, None)
    out = torch.empty(5, 48, dtype=torch.bfloat16, device=DEVICE)
    opcheck(rt.ops.gated_mlp, (out, x, w_gate, w_up, b_gate, b_up, "silu", kernel))
    opcheck(compiled_op(kernel), (out, x, w_gate, w_up, b_gate, b_up, "gelu_tanh"))
    poison_(out)  # opcheck may leave this very result in out: "written" must show as a change
    assert_only_declared_outputs_mutate(compiled_op(kernel), (out, x, w_gate, w_up, b_gate, b_up, "silu"))
    assert_gated_close(out, reference(x, w_gate, w_up, "silu", b_gate, b_up), f"{kernel} after opcheck")


@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_torch_compile_fullgraph(kernel):
    x, w_gate, w_up, _ = make_inputs(6, 64, 48, torch.bfloat16, seed=36)
    w_fused = torch.cat([w_gate, w_up])

    def block(x):
        a = rt.gated_mlp(x, w_gate, w_up, impl=kernel)
        b = rt.gated_mlp_fused(x * 2, w_fused, activation="gelu_tanh", impl=kernel)
        out = torch.empty(6, 48, dtype=x.dtype, device=x.device)
        compiled_op(kernel)(out, x, w_gate, w_up, None, None, "silu")
        return a + 1, b, out

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for got, expected in zip(compiled(x), block(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _compiled_bad_cases(kernel: str):
    x = torch.randn(4, 64, device=DEVICE).bfloat16()
    w = torch.randn(32, 64, device=DEVICE).bfloat16()
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE)
    x60 = torch.randn(4, 60, device=DEVICE).bfloat16()
    w60 = torch.randn(32, 64, device=DEVICE).bfloat16()[:, :60]  # 16-byte row stride, D = 60
    x_rows = torch.randn(4, 68, device=DEVICE).bfloat16()[:, :64]  # row stride 68: not a multiple of 8
    x_start = torch.randn(4 * 64 + 4, device=DEVICE).bfloat16()[4:].view(4, 64)  # 8-byte aligned
    ok = SM80 if kernel == "sm80" else SM90
    op = compiled_op(kernel) if ok else None
    cases = [
        ("op x row stride", lambda: op(out, x_rows, w, w, None, None, "silu"), RuntimeError, "x: expected a row stride that is a multiple of 8 elements"),
        ("op x start", lambda: op(out, x_start, w, w, None, None, "silu"), RuntimeError, "x: expected a 16-byte aligned start"),
        ("op w_up rows", lambda: op(out, x, w, w[:16], None, None, "silu"), RuntimeError, r"w_up: expected shape \[U, D\] \(w_gate's\) = \[32, 64\], got \[16, 64\]"),
        ("op w_gate dtype", lambda: op(out, x, w.half(), w, None, None, "silu"), RuntimeError, "w_gate: expected dtype BFloat16"),
        ("op out shape", lambda: op(out[:, :16], x, w, w, None, None, "silu"), RuntimeError, r"out: expected shape \[M, U\] = \[4, 32\]"),
        ("op out overlaps x", lambda: op(x[:, :32], x, w, w, None, None, "silu"), RuntimeError, "out: overlaps x"),
        ("op bias dtype", lambda: op(out, x, w, w, torch.zeros(32, device=DEVICE).half(), None, "silu"), RuntimeError, "bias_gate: expected dtype BFloat16 \\(x's\\) or float32"),
        ("op bias shape", lambda: op(out, x, w, w, None, torch.zeros(31, device=DEVICE), "silu"), RuntimeError, r"bias_up: expected shape \[32\]"),
        ("op activation", lambda: op(out, x, w, w, None, None, "relu"), RuntimeError, "activation: expected \"silu\" or \"gelu_tanh\""),
        ("op x dtype", lambda: op(out.float(), x.float(), w.float(), w.float(), None, None, "silu"), RuntimeError, "x: expected dtype bfloat16 or float16"),
    ]
    if kernel == "sm80":
        cases += [
            ("public D % 8", lambda: rt.gated_mlp(x60, w60, w60, impl="sm80"), ValueError, r"x: impl='sm80' needs D = x.shape\[-1\] to be a positive multiple of 8 \(16-byte vectors\), got 60"),
            ("op D % 8", lambda: op(out, x60, w60, w60, None, None, "silu"), RuntimeError, r"x: the sm80 kernel needs D \(x.size\(1\)\) to be a positive multiple of 8, got 60"),
        ]
    else:  # D = 60 is fine for sm90, but a contiguous [4, 60] x has a row stride of 60
        cases += [("op D = 60 x rows", lambda: op(out, x60, w60, w60, None, None, "silu"), RuntimeError, "x: expected a row stride that is a multiple of 8 elements")]
    return [(kernel, *c) for c in cases]  # fmt: skip


@pytest.mark.parametrize("case", _compiled_bad_cases("sm80") + _compiled_bad_cases("sm90"), ids=lambda c: f"{c[0]}-{c[1]}")
def test_compiled_bad_input(case):
    kernel, _, call, exc, match = case
    if not (SM80 if kernel == "sm80" else SM90):
        pytest.skip(f"the CuTe {kernel} kernel does not run here")
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("kernel", ["sm80", "sm90"])
def test_compiled_unavailable_raises(kernel):
    """Where a CuTe kernel cannot run (cpu / rocm builds, or sm90 off Hopper): impl="sm80" /
    "sm90" names the argument; "auto" and "triton" run the default path."""
    if SM80 if kernel == "sm80" else SM90:
        pytest.skip(f"the {kernel} kernel runs here")
    x, w_gate, w_up, _ = make_inputs(3, 64, 32, torch.bfloat16, seed=37)
    want = f"impl: '{kernel}' (needs the compiled CuTe {kernel} kernel|runs on CUDA GPUs only|needs a GPU of capability 9.0)"
    with pytest.raises(ValueError, match=want):
        rt.gated_mlp(x, w_gate, w_up, impl=kernel)
    out = torch.empty(3, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=f"impl: '{kernel}'"):
        rt.ops.gated_mlp(out, x, w_gate, w_up, None, None, "silu", kernel)
    assert torch.equal(rt.gated_mlp(x, w_gate, w_up, impl="triton"), rt.gated_mlp(x, w_gate, w_up))


@pytest.mark.kernels_ci
def test_compiled_build_variant_loads():
    """gated-mlp is a [torch] package: every backend's variant is an arch variant with the
    binding's .so, whose TORCH_LIBRARY namespace the Python custom ops share (fragments). Only
    the CUDA build registers gated_mlp_sm80, with capability 8.0 + PTX in its metadata."""
    import json
    from pathlib import Path

    variant = Path(rt.__file__).parent
    assert not variant.name.startswith("torch-"), f"{variant.name}: a noarch variant"
    meta = json.loads((variant / "metadata.json").read_text())
    assert rt.__name__ == meta["id"] and (variant / f"{meta['id']}.abi3.so").is_file()
    assert rt.add_op_namespace_prefix("gated_mlp") == f"{meta['id']}::gated_mlp"
    for name in ("gated_mlp", "gated_mlp_fp8"):
        assert hasattr(rt.ops, name), f"the Python custom op {name} is missing from {meta['id']}"
    assert rt.sm80_available() == rt.sm90_available() == (meta["backend"]["type"] == "cuda")
    if meta["backend"]["type"] == "cuda":
        assert meta["backend"]["archs"] == ["8.0+PTX", "9.0a"]


# ---------------------------------------------------------------------------------------------
# Repeated call signatures: launch plans, the fast path of gated_mlp, CUDA graphs, streams
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_repeated_calls_through_plans():
    # The first call of a signature goes through the checks and the JIT and makes a plan; later
    # ones (fresh x, same shapes) reuse it. Interleaved: an x 2 bytes into a buffer (another
    # signature: no TMA, pointer loads), new weights at other addresses, a 3-D x.
    D, U = (512, 384) if DEVICE == "cuda" else (64, 48)
    for seed in range(4):
        x, w_gate, w_up, _ = make_inputs(7, D, U, torch.bfloat16, seed=400 + (seed // 2))
        x3 = x.view(1, 7, D)
        if seed % 2:
            x3 = torch.cat([x.new_zeros(1), x.flatten()])[1:].view(1, 7, D)
        for _ in range(2):
            got = rt.gated_mlp(x3, w_gate, w_up)
            assert got.shape == (1, 7, U)
            assert_gated_close(got.view(7, U), reference(x, w_gate, w_up), f"seed {seed}")


@pytest.mark.kernels_ci
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs and streams")
def test_cuda_graph_capture_and_side_stream():
    x, w_gate, w_up, _ = make_inputs(1, 4096, 1024, torch.bfloat16, seed=410)
    x = x.view(1, 1, 4096)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (makes the plan) on a non-default stream
        for _ in range(3):
            got = rt.gated_mlp(x, w_gate, w_up)
    torch.cuda.current_stream().wait_stream(side)
    assert_gated_close(got.view(1, -1), reference(x.view(1, -1), w_gate, w_up), "side stream")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rt.gated_mlp(x, w_gate, w_up)
    x.copy_(torch.randn(1, 1, 4096, device=DEVICE).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert_gated_close(captured.view(1, -1), reference(x.view(1, -1), w_gate, w_up), "graph replay")
