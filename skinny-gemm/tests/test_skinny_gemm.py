"""skinny-gemm against fp64 references: ``x @ w.T (+ bias)`` on the same fp16 / bf16 inputs, and
``((x @ w.T) * x_scale) * w_scale (+ bias)`` on the same FP8 inputs, the product of the FP8
matmul rounded to fp32 and the scales applied in fp32 as the kernel applies them.

On CUDA the Triton kernel runs compiled; on CPU it runs in Triton's interpreter (conftest sets
TRITON_INTERPRET=1), or the plain-torch path when Triton is missing.

Tolerance, per output element: one ulp of the output dtype at the reference's magnitude (the
kernel rounds once, to nearest on a GPU; Triton's interpreter truncates, still within one ulp)
plus 1e-4 of the output's scale for the fp32 summation order over K (every product of two
16-bit or FP8 values is exact in fp32, so only the order of the fp32 sums differs: a few fp32
ulps of the partial sums, ~1e-6 relative at K = 16384; 1e-4 leaves room for the split-K
partials and the atomic reduction's varying order).
"""

from __future__ import annotations

import os

import kernels
import pytest
import torch
import torch.nn.functional as F
from skinny_gemm_testing import (
    assert_fully_written,
    assert_only_declared_outputs_mutate,
    device,
    opcheck,
    poison_,
)

sg = kernels.get_kernel("fused-llm/skinny-gemm", version=1)

DEVICE = device()
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
TRITON = DEVICE == "cuda" or INTERPRETED
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
DTYPES = [torch.bfloat16, torch.float16]


def _fp8_dtypes() -> list[torch.dtype]:
    """The FP8 formats this device multiplies: both on CPU; the GPU's own on CUDA / ROCm; none on
    CUDA GPUs below capability 8.9 (no FP8 there)."""
    if DEVICE == "cpu":
        return [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName
        return [torch.float8_e4m3fnuz if "gfx94" in arch else torch.float8_e4m3fn]
    return [torch.float8_e4m3fn] if torch.cuda.get_device_capability() >= (8, 9) else []


FP8 = _fp8_dtypes()


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def make(M, N, K, dtype, seed=0, bias=False):
    """x [M, K] unit variance, w [N, K] std 1/sqrt(K) (outputs of order one), bias [N] or None."""
    g = gen(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype)
    b = (0.1 * torch.randn(N, generator=g)).to(dtype) if bias else None
    return x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)


def make_fp8(M, N, K, fp8, seed=0, per_token=True, per_channel=True):
    """FP8 x [M, K] and w [N, K] (unit-variance values, in range for both formats), x_scale
    [M, 1] or [1], w_scale [N, 1] or [1] (w's ~ 1/sqrt(K): outputs of order one)."""
    g = gen(seed)
    x = torch.randn(M, K, generator=g).to(fp8)
    w = torch.randn(N, K, generator=g).to(fp8)
    xs = torch.rand(M if per_token else 1, 1, generator=g) + 0.5
    ws = (torch.rand(N if per_channel else 1, 1, generator=g) + 0.5) / K**0.5
    if not per_token:
        xs = xs.reshape(1)
    if not per_channel:
        ws = ws.reshape(1)
    return x.to(DEVICE), w.to(DEVICE), xs.to(DEVICE), ws.to(DEVICE)


def reference(x, w, bias=None) -> torch.Tensor:
    y = x.double().reshape(-1, x.shape[-1]) @ w.double().T
    if bias is not None:
        y = y + bias.double()
    return y.reshape(*x.shape[:-1], w.shape[0])


def reference_fp8(x, w, xs, ws, bias=None) -> torch.Tensor:
    """The kernel's order: the exact FP8 products summed (fp64 here), rounded to fp32, times
    x_scale, times w_scale (fp32), plus the bias."""
    acc = (x.double().reshape(-1, x.shape[-1]) @ w.double().T).float()
    y = (acc * xs.float().reshape(-1, 1)) * ws.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.double().reshape(*x.shape[:-1], w.shape[0])


def assert_gemm_close(got: torch.Tensor, ref: torch.Tensor, name: str, atol_frac: float = 1e-4) -> None:
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
        raise AssertionError(f"{name}: error {err.flatten()[i].item():.3g} at flat index {i} ({got.flatten()[i].item():g} vs "
                             f"{ref.flatten()[i].item():g}) is {worst:.2f}x the tolerance")  # fmt: skip


def run_op(x, w, bias=None, deterministic=True, config=()) -> torch.Tensor:
    """The registered op on a poisoned output."""
    out = poison_(torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=DEVICE))
    sg.ops.skinny_gemm(out, x, w, bias, deterministic, list(config))
    return out


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

if DEVICE == "cuda":  # the shapes (Llama-405B TP8 QKV, Llama-3-8B) and off-tile sizes
    SIZES = [(1, 2304, 16384), (4, 2304, 16384), (16, 6144, 4096), (7, 4096, 14336), (32, 1000, 4096),
             (64, 4096, 4096), (3, 1001, 4000), (100, 512, 1024)]  # fmt: skip
else:  # the interpreter runs numpy per program: small shapes, the same branches
    # M = 1 (FMA GEMV), 5 (16-row dot tile, K tail), 16 (exact tile), 33 (64-row tile), 70 (two M tiles)
    SIZES = [(1, 72, 256), (5, 40, 200), (16, 64, 384), (33, 48, 256), (70, 24, 128)]


@pytest.mark.parametrize("M, N, K", SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm(M, N, K, deterministic, dtype):
    x, w, b = make(M, N, K, dtype, seed=M + N + K, bias=True)
    out = run_op(x, w, b, deterministic)
    assert_gemm_close(out, reference(x, w, b), f"{dtype} {'ordered' if deterministic else 'atomic'}")
    got = sg.gemm(x, w, b, deterministic=deterministic)
    if deterministic or not TRITON:
        assert torch.equal(got, out), "the public function and the op differ"
    out_nb = run_op(x, w, None, deterministic)
    assert_gemm_close(out_nb, reference(x, w), "no bias")


@pytest.mark.kernels_ci
def test_gemm_ci():
    test_gemm(*SIZES[1], True, torch.bfloat16)


@pytest.mark.skipif(not FP8, reason="no FP8 on this GPU (CUDA capability < 8.9)")
@pytest.mark.parametrize("M, N, K", SIZES[:4], ids=lambda v: str(v))
@pytest.mark.parametrize("per_token, per_channel", [(True, True), (False, False), (False, True), (True, False)],
                         ids=["token-channel", "tensor-tensor", "tensor-channel", "token-tensor"])  # fmt: skip
@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_gemm_fp8(M, N, K, per_token, per_channel, fp8):
    x, w, xs, ws = make_fp8(M, N, K, fp8, seed=M * N + K, per_token=per_token, per_channel=per_channel)
    got = sg.gemm_fp8(x, w, xs, ws)
    assert got.dtype == torch.bfloat16
    assert_gemm_close(got, reference_fp8(x, w, xs, ws), f"{fp8}")


@pytest.mark.skipif(not FP8, reason="no FP8 on this GPU (CUDA capability < 8.9)")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomic"])
def test_gemm_fp8_bias_out_dtypes(out_dtype, deterministic):
    """Bias in every accepted dtype, every out dtype, both reductions, a [..., K] x with its
    [..., 1] per-token scale."""
    M, N, K = (16, 4096, 4096) if DEVICE == "cuda" else (6, 40, 512)
    x, w, xs, ws = make_fp8(M, N, K, FP8[0], seed=21)
    for bias_dtype in (torch.float32, torch.bfloat16, torch.float16):
        b = (0.1 * torch.randn(N, generator=gen(22))).to(bias_dtype).to(DEVICE)
        got = sg.gemm_fp8(x.reshape(2, M // 2, K), w, xs.reshape(2, M // 2, 1), ws, b, out_dtype, deterministic=deterministic)
        assert got.shape == (2, M // 2, N) and got.dtype == out_dtype
        assert_gemm_close(got.reshape(M, N), reference_fp8(x, w, xs, ws, b), f"bias {bias_dtype} out {out_dtype}")


def test_edges():
    """M = 0, N = 0, K = 0 (out = bias), odd N and K at M = 1, the [..., K] leading dims."""
    x, w, b = make(3, 24, 40, torch.bfloat16, seed=30, bias=True)
    assert sg.gemm(x[:0], w, b).shape == (0, 24)
    assert sg.gemm(x, w[:0], b[:0]).shape == (3, 0)
    got = sg.gemm(x[:, :0], w[:, :0], b)
    assert torch.equal(got, b.expand(3, 24))
    assert torch.equal(sg.gemm(x[:, :0], w[:, :0]), torch.zeros(3, 24, dtype=torch.bfloat16, device=DEVICE))
    x1, w1, _ = make(1, 37, 333, torch.float16, seed=31)
    assert_gemm_close(sg.gemm(x1, w1), reference(x1, w1), "odd N and K")
    x3 = torch.randn(2, 3, 40, generator=gen(32)).bfloat16().to(DEVICE)
    got = sg.gemm(x3, w)
    assert got.shape == (2, 3, 24)
    assert_gemm_close(got, reference(x3, w), "leading dims")


def test_strides_and_out():
    """Non-contiguous x (transposed: K strided; every second row), w rows with padding (row
    stride > K), and a caller's out (poisoned: every element written, the same object back)."""
    N, K = (1000, 4096) if DEVICE == "cuda" else (40, 256)
    _, w, b = make(1, N, K, torch.bfloat16, seed=33, bias=True)
    xt = torch.randn(K, 6, generator=gen(34)).bfloat16().to(DEVICE).t()  # [6, K], strides (1, 6)
    assert_gemm_close(sg.gemm(xt, w, b), reference(xt, w, b), "transposed x")
    xs = torch.randn(10, K, generator=gen(35)).bfloat16().to(DEVICE)[::2]
    assert_gemm_close(sg.gemm(xs, w), reference(xs, w), "row-strided x")
    wpad = torch.randn(N, K + 24, generator=gen(36)).bfloat16().to(DEVICE)[:, :K] / K**0.5
    assert_gemm_close(sg.gemm(xs, wpad), reference(xs, wpad), "padded w rows")
    out = poison_(torch.empty(5, N, dtype=torch.bfloat16, device=DEVICE))
    got = sg.gemm(xs, w, b, out=out)
    assert got is out
    assert_gemm_close(out, reference(xs, w, b), "out=")


@pytest.mark.skipif(not TRITON, reason="the Triton kernel's configurations")
@pytest.mark.parametrize(
    "cfg",
    [(1, 32, 64, 1), (1, 16, 128, 3), (1, 1, 256, 1), (1, 4, 512, 1), (1, 1, 64, 3), (1, 4, 32, 7), (2, 4, 64, 1),
     (2, 2, 128, 3), (2, 1, 64, 5), (2, 8, 32, 7), (16, 32, 32, 5), (16, 64, 64, 2), (32, 16, 128, 4), (64, 32, 32, 3)],
    ids=lambda c: "M{}-N{}-K{}-split{}".format(*c),
)
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomic"])
def test_configs(cfg, deterministic):
    """Tile / split relations the tuning table may pick (GEMV for 1 / 2 tokens and dot
    tiles, uneven K splits, tiles past M and N), each called twice: the counters and the atomic workspace must be
    left zeroed."""
    config = sg.SkinnyConfig(*cfg, num_warps=4, num_stages=2)
    M, N, K = (37, 300, 1000) if DEVICE == "cuda" else (19, 72, 200)
    if config.BLOCK_M == 1:
        M = 1
    x, w, b = make(M, N, K, torch.bfloat16, seed=37, bias=True)
    ref = reference(x, w, b)
    for _ in range(2):
        assert_gemm_close(run_op(x, w, b, deterministic, config.as_list()), ref, str(cfg))
        assert_gemm_close(sg.gemm(x, w, b, deterministic=deterministic, config=config), ref, str(cfg))
    if FP8:
        xq, wq, xs, ws = make_fp8(M, N, K, FP8[0], seed=38)
        assert_gemm_close(sg.gemm_fp8(xq, wq, xs, ws, deterministic=deterministic, config=config),
                          reference_fp8(xq, wq, xs, ws), "fp8 " + str(cfg))  # fmt: skip


def test_default_config():
    """The GEMV at M = 1 for 16-bit inputs on CUDA where N / 4 programs fill the SMs twice (4
    rows, 8 KiB K steps or half that where it divides K), else the smallest dot tile holding M
    (64 at most), the K split within the K steps; gfx942's smaller K steps and 2 stages."""
    assert sg.skinny_config(1, 2304, 16384, 2) == sg.SkinnyConfig(1, 4, 4096, 1, 8, 2)
    assert sg.skinny_config(1, 4096, 4096, 2) == sg.SkinnyConfig(1, 4, 4096, 1, 8, 2)
    assert sg.skinny_config(1, 4096, 14336, 2).BLOCK_K == 2048  # 14336 = 7 * 2048
    assert sg.skinny_config(1, 16384, 6656, 2).BLOCK_K == 4096  # 6656 = 13 * 512: a masked tail
    assert sg.skinny_config(1, 1056, 48, 2, sms=132) == sg.SkinnyConfig(1, 4, 32, 1, 8, 2)
    assert sg.skinny_config(1, 1052, 16384, 2, sms=132).BLOCK_M == 16  # 263 programs: the dot tile
    for c in (sg.skinny_config(1, 2304, 16384, 1), sg.skinny_config(1, 2304, 16384, 2, hip=True)):
        assert c.BLOCK_M == 16 and 1 < c.SPLIT_K <= 16384 // c.BLOCK_K
    assert sg.skinny_config(5, 2304, 16384, 2).BLOCK_M == 16
    assert sg.skinny_config(33, 2304, 16384, 2).BLOCK_M == 64
    assert sg.skinny_config(500, 2304, 16384, 2).BLOCK_M == 64
    assert sg.skinny_config(16, 2304, 16384, 1).BLOCK_K == 256
    assert sg.skinny_config(16, 2304, 16384, 1, hip=True).BLOCK_K == 128
    assert sg.skinny_config(16, 2304, 16384, 2, hip=True).num_stages == 2
    assert sg.skinny_config(16, 100000, 64, 2).SPLIT_K == 1


# ---------------------------------------------------------------------------------------------
# Dispatch: linear / linear_fp8 and the tuning table
# ---------------------------------------------------------------------------------------------


def test_tuning_table_is_well_formed():
    """Every committed entry: a (gpu, dtype, N, K) key (FP8 also with "/tensor": per-tensor
    scales), M buckets in increasing order from the tuned set, each a valid SkinnyConfig,
    TmaConfig (not e4m3fnuz, M <= 16) or None."""
    from importlib import import_module

    table = import_module(sg.__name__ + "._tuning").TABLE
    config_from_list = import_module(sg.__name__ + "._config").config_from_list
    for (gpu, dtype, N, K), rows in table.items():
        fp8 = ("float8_e4m3fn", "float8_e4m3fnuz")
        assert isinstance(gpu, str) and dtype in ("bfloat16", "float16", *fp8, *(f"{d}/tensor" for d in fp8))
        assert N > 0 and K > 0
        buckets = [m for m, _ in rows]
        assert buckets == sorted(buckets) and set(buckets) <= {1, 2, 4, 8, 16, 32, 64}
        for m_max, cfg in rows:
            parsed = None if cfg is None else config_from_list(cfg)
            if isinstance(parsed, sg.TmaConfig):
                assert "fnuz" not in dtype and m_max <= 16, (gpu, dtype, N, K, m_max)


@pytest.fixture
def table(monkeypatch):
    """The tuning table replaced by an empty dict for the test (entries keyed by "cpu" or the
    GPU's name)."""
    from importlib import import_module

    tuning = import_module(sg.__name__ + "._tuning")
    fake: dict = {}
    monkeypatch.setattr(tuning, "TABLE", fake)
    return fake


def _gpu_key() -> str:
    return torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"


@pytest.mark.kernels_ci
def test_linear_dispatch(table):
    """Without an entry linear is F.linear, bit for bit; with one it runs the skinny kernel with
    the bucket's configuration (equal to gemm with that config), and M beyond the last bucket or
    a bucket of None goes back to F.linear."""
    N, K = 48, 256
    x, w, b = make(5, N, K, torch.bfloat16, seed=40, bias=True)
    assert torch.equal(sg.linear(x, w, b), F.linear(x, w, b))
    assert sg.dispatch_config(x, w) is None
    cfg8 = [16, 32, 64, 2, 4, 2]
    table[(_gpu_key(), "bfloat16", N, K)] = [(1, None), (8, cfg8)]
    assert sg.dispatch_config(x[:1], w) is None
    assert sg.dispatch_config(x, w) == sg.SkinnyConfig(*cfg8)
    expected = sg.gemm(x, w, b, config=sg.SkinnyConfig(*cfg8))
    assert torch.equal(sg.linear(x, w, b), expected)
    assert torch.equal(sg.linear(x[:1], w, b), F.linear(x[:1], w, b))
    x9 = torch.randn(9, K, generator=gen(41)).bfloat16().to(DEVICE)
    assert torch.equal(sg.linear(x9, w, b), F.linear(x9, w, b))
    assert torch.equal(sg.linear(x.half(), w.half()), F.linear(x.half(), w.half())), "another dtype: F.linear"


def test_table_configs_made_once_and_planned_apart(table, monkeypatch):
    """dispatch_config hands out one SkinnyConfig object per table entry (a construction checks
    every field: not once a call); on a GPU each configuration at one call signature gets its
    own launch plan (the plan key holds the configuration), and both plans give gemm's result."""
    N, K = 48, 256
    x, w, b = make(4, N, K, torch.bfloat16, seed=42, bias=True)
    cfg_a, cfg_b = [16, 32, 64, 2, 4, 2], [16, 16, 64, 1, 4, 2]
    table[(_gpu_key(), "bfloat16", N, K)] = [(4, cfg_a)]
    assert sg.dispatch_config(x, w) is sg.dispatch_config(x, w) == sg.SkinnyConfig(*cfg_a)
    if DEVICE != "cuda":
        return
    from importlib import import_module

    kern = import_module(sg.__name__ + "._kernels")
    monkeypatch.setattr(kern._PLANS, "entries", {})
    outs = [sg.gemm(x, w, b, config=sg.SkinnyConfig(*c)) for c in (cfg_a, cfg_b, cfg_a, cfg_b)]
    assert len(kern._PLANS.entries) == 2
    ref = reference(x, w, b)
    for out, c in zip(outs, (cfg_a, cfg_b, cfg_a, cfg_b)):
        assert_gemm_close(out, ref, str(c))


def test_dispatch_buckets(table):
    """A weight's buckets as dispatch_config reads them (configs as SkinnyConfig), in x's dtype
    when given; empty for a shape or dtype the table does not list."""
    w = torch.zeros(48, 256, dtype=torch.bfloat16, device=DEVICE)
    assert sg.dispatch_buckets(w) == []
    cfg8 = [16, 32, 64, 2, 4, 2]
    table[(_gpu_key(), "bfloat16", 48, 256)] = [(1, None), (8, cfg8)]
    assert sg.dispatch_buckets(w) == [(1, None), (8, sg.SkinnyConfig(*cfg8))]
    assert sg.dispatch_buckets(w, torch.float16) == [] and sg.dispatch_buckets(w[:, :128]) == []
    with pytest.raises(ValueError, match=r"w: expected a 2-D torch.Tensor \[N, K\], got torch.Size\(\[256\]\)"):
        sg.dispatch_buckets(w[0])


def test_linear_needs_grad_goes_to_f_linear(table):
    x, w, b = make(3, 32, 64, torch.bfloat16, seed=42, bias=True)
    table[(_gpu_key(), "bfloat16", 32, 64)] = [(64, [16, 32, 32, 1, 4, 2])]
    wp = torch.nn.Parameter(w.clone())
    y = sg.linear(x, wp, b)
    assert y.requires_grad and torch.equal(y, F.linear(x, wp, b))
    y.sum().backward()
    assert wp.grad is not None
    with torch.no_grad():
        assert_gemm_close(sg.linear(x, wp, b), reference(x, w, b), "no_grad: the skinny kernel")


@pytest.mark.skipif(not FP8, reason="no FP8 on this GPU (CUDA capability < 8.9)")
def test_linear_fp8(table):
    """Without an entry: torch._scaled_mm on a GPU where it takes the inputs, gemm_fp8 elsewhere;
    with one: gemm_fp8 with the entry's configuration."""
    M, N, K = (8, 2304, 4096) if DEVICE == "cuda" else (8, 48, 256)
    fp8 = FP8[0]
    for per_token, per_channel in ((True, True), (False, False), (False, True)):
        x, w, xs, ws = make_fp8(M, N, K, fp8, seed=43, per_token=per_token, per_channel=per_channel)
        ref = reference_fp8(x, w, xs, ws)
        got = sg.linear_fp8(x, w, xs, ws)
        # cuBLAS may accumulate FP8 in a different order (and split K): 1% of the scale there
        assert_gemm_close(got, ref, "linear_fp8", atol_frac=1e-2 if DEVICE == "cuda" else 1e-4)
    table[(_gpu_key(), str(fp8).removeprefix("torch."), N, K)] = [(64, [16, 64, 64, 2, 4, 2])]
    got = sg.linear_fp8(x, w, xs, ws)
    assert torch.equal(got, sg.gemm_fp8(x, w, xs, ws, config=sg.SkinnyConfig(16, 64, 64, 2, 4, 2)))


def test_layer():
    """layers.Linear passes kernelize's layer rules for nn.Linear and computes nn.Linear's
    forward (F.linear with today's table), gradients included."""
    from kernels.layer.layer import _validate_layer

    _validate_layer(check_cls=torch.nn.Linear, cls=sg.layers.Linear, repo="skinny-gemm")
    torch.manual_seed(44)
    lin = torch.nn.Linear(64, 24).to(device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 64, device=DEVICE).bfloat16()
    with torch.no_grad():
        assert torch.equal(sg.layers.Linear.forward(lin, x), lin(x))
    y = sg.layers.Linear.forward(lin, x)
    y.float().sum().backward()
    assert lin.weight.grad is not None


# ---------------------------------------------------------------------------------------------
# Bad input: every error names the argument, what was expected and what came, before writing
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    x, w, b = make(4, 32, 64, torch.bfloat16, seed=50, bias=True)
    xq, wq, xs, ws = make_fp8(4, 32, 64, FP8[0] if FP8 else torch.float8_e4m3fn, seed=51)
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE)
    return [
        ("x dtype", lambda: sg.gemm(x.float(), w), TypeError, "x: expected dtype float16 or bfloat16, got torch.float32"),
        ("x type", lambda: sg.gemm(x.tolist(), w), TypeError, "x: expected a torch.Tensor, got list"),
        ("x 0-d", lambda: sg.gemm(x[0, 0], w), ValueError, r"x: expected shape \[..., K\], got \(\)"),
        ("w dtype", lambda: sg.gemm(x, w.half()), TypeError, r"w: expected dtype torch.bfloat16 \(x's\), got torch.float16"),
        ("w K", lambda: sg.gemm(x, w[:, :32]), ValueError, r"w: expected shape \[N, 64\] \(nn.Linear layout, K = x.shape\[-1\]\), got \(32, 32\)"),
        ("w 1-d", lambda: sg.gemm(x, w[0]), ValueError, r"w: expected shape \[N, 64\]"),
        ("w K stride", lambda: sg.gemm(x, w.t().contiguous().t()), ValueError, r"w: expected the K dimension contiguous \(stride 1\), got strides \(1, 32\)"),
        ("bias shape", lambda: sg.gemm(x, w, b[:31]), ValueError, r"bias: expected shape \(32,\), got \(31,\)"),
        ("bias dtype", lambda: sg.gemm(x, w, b.half()), TypeError, "bias: expected dtype bfloat16 or float32, got torch.float16"),
        ("out shape", lambda: sg.gemm(x, w, out=out[:, :16]), ValueError, r"out: expected shape \(4, 32\), got \(4, 16\)"),
        ("out dtype", lambda: sg.gemm(x, w, out=out.half()), TypeError, "out: expected dtype torch.bfloat16, got torch.float16"),
        ("out strides", lambda: sg.gemm(x, w, out=torch.empty(32, 4, dtype=torch.bfloat16, device=DEVICE).t()), ValueError, r"out: expected a contiguous tensor, got strides \(1, 4\)"),
        ("deterministic", lambda: sg.gemm(x, w, deterministic=1), TypeError, "deterministic: expected True or False, got 1"),
        ("config type", lambda: sg.gemm(x, w, config=[16, 32, 32, 1]), TypeError, "config: expected a SkinnyConfig, a TmaConfig, an MmaConfig or None, got list"),
        ("config M", lambda: sg.SkinnyConfig(4, 32, 32, 1), ValueError, r"SkinnyConfig.BLOCK_M: expected 1 or 2 \(GEMV\) or a power of two >= 16 \(tl.dot\), got 4"),
        ("config K", lambda: sg.SkinnyConfig(16, 32, 48, 1), ValueError, "SkinnyConfig.BLOCK_K: expected a power of two >= 32, got 48"),
        ("config N", lambda: sg.SkinnyConfig(16, 8, 32, 1), ValueError, r"SkinnyConfig.BLOCK_N: expected a power of two >= 16 with a tl.dot tile \(BLOCK_M 16\), got 8"),
        ("grad", lambda: sg.gemm(x, torch.nn.Parameter(w)), RuntimeError, "x, w, bias: the skinny ops are inference only"),
        ("fp8 x dtype", lambda: sg.gemm_fp8(x, w, xs, ws), TypeError, "x: expected dtype float8_e4m3fn or float8_e4m3fnuz, got torch.bfloat16"),
        ("fp8 w dtype", lambda: sg.gemm_fp8(xq, w, xs, ws), TypeError, r"w: expected dtype torch.float8_e4m3\w+ \(x's\), got torch.bfloat16"),
        ("x_scale shape", lambda: sg.gemm_fp8(xq, wq, xs[:2], ws), ValueError, r"x_scale: expected shape \[1\] \(per tensor\) or \[4, 1\] \(per token\), got \(2, 1\)"),
        ("x_scale dtype", lambda: sg.gemm_fp8(xq, wq, xs.double(), ws), TypeError, "x_scale: expected dtype float32, got torch.float64"),
        ("w_scale shape", lambda: sg.gemm_fp8(xq, wq, xs, ws[:3]), ValueError, r"w_scale: expected shape \[1\] \(per tensor\) or \[32, 1\] \(per output channel\), got \(3, 1\)"),
        ("w_scale type", lambda: sg.gemm_fp8(xq, wq, xs, 0.5), TypeError, "w_scale: expected a float32 torch.Tensor, got float"),
        ("out_dtype", lambda: sg.gemm_fp8(xq, wq, xs, ws, out_dtype=torch.int8), TypeError, "out_dtype: expected bfloat16 or float16 or float32, got torch.int8"),
        ("fp8 bias dtype", lambda: sg.gemm_fp8(xq, wq, xs, ws, b.double()), TypeError, "bias: expected dtype bfloat16 or float16 or float32, got torch.float64"),
        ("linear_fp8 x_scale", lambda: sg.linear_fp8(xq, wq, xs[:2], ws), ValueError, r"x_scale: expected shape \[1\] \(per tensor\) or \[4, 1\]"),
    ]  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


def test_bad_input_writes_nothing():
    """A rejected call leaves a caller's out untouched (checks run before any write)."""
    x, w, b = make(4, 32, 64, torch.bfloat16, seed=52, bias=True)
    out = poison_(torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="bias: expected shape"):
        sg.gemm(x, w, b[:31], out=out)
    assert torch.isnan(out.float()).all()


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a second device type")
def test_bad_device():
    x, w, _ = make(4, 32, 64, torch.bfloat16, seed=53)
    with pytest.raises(ValueError, match=r"w: expected device cuda:0 \(x's\), got cpu"):
        sg.gemm(x, w.cpu())


# ---------------------------------------------------------------------------------------------
# torch.library contract, torch.compile, CUDA graphs, streams, determinism
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(bias):
    x, w, b = make(5, 48, 256, torch.bfloat16, seed=60, bias=bias)
    out = torch.empty(5, 48, dtype=torch.bfloat16, device=DEVICE)
    args = (out, x, w, b, True, [])
    opcheck(sg.ops.skinny_gemm, args)
    poison_(out)
    assert_only_declared_outputs_mutate(sg.ops.skinny_gemm, args)
    assert_gemm_close(out, reference(x, w, b), "after opcheck")


@pytest.mark.kernels_ci
@pytest.mark.skipif(not FP8, reason="no FP8 on this GPU (CUDA capability < 8.9)")
def test_opcheck_fp8():
    x, w, xs, ws = make_fp8(5, 48, 256, FP8[0], seed=61)
    xs, ws = xs.reshape(-1), ws.reshape(-1)
    b = torch.randn(48, generator=gen(62)).to(DEVICE)
    out = torch.empty(5, 48, dtype=torch.bfloat16, device=DEVICE)
    args = (out, x, w, xs, ws, b, True, [16, 32, 64, 2, 4, 2])
    opcheck(sg.ops.skinny_gemm_fp8, args)
    poison_(out)
    assert_only_declared_outputs_mutate(sg.ops.skinny_gemm_fp8, args)
    assert_gemm_close(out, reference_fp8(x, w, xs, ws, b), "after opcheck")


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph(table):
    x, w, b = make(6, 48, 128, torch.float16, seed=63, bias=True)
    lin = torch.nn.Linear(128, 48, dtype=torch.float16, device=DEVICE)
    table[(_gpu_key(), "float16", 48, 128)] = [(8, [16, 32, 32, 2, 4, 2])]
    fp8 = FP8[0] if FP8 else None

    def block(x):
        outs = [sg.gemm(x, w, b) + 1, sg.gemm(x, w, deterministic=False), sg.linear(x * 2, w), sg.layers.Linear.forward(lin, x)]
        if fp8 is not None:
            xq = x.to(fp8)
            outs.append(sg.gemm_fp8(xq, w.to(fp8), torch.ones(6, 1, device=DEVICE), torch.ones(1, device=DEVICE)))
        return outs

    with torch.no_grad():
        compiled = torch.compile(block, fullgraph=True, dynamic=False)
        got, expected = compiled(x), block(x)
    for i, (g, e) in enumerate(zip(got, expected)):
        if i == 1 and TRITON:  # atomic reduction: the order may differ between calls
            assert_gemm_close(g, e.double(), "atomic under compile")
        else:
            torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m, i=i: f"output {i}: {m}")


# CUDA graphs, a side stream and run-to-run determinism: only on a GPU (the interpreter runs
# programs one after another, so it has neither concurrency nor varying atomic order).


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("M", [1, 16, 100])
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomic"])
def test_cuda_graph_capture(M, deterministic):
    """Captured once, replayed on new inputs: the partials, the cached counters / workspace and
    the launch plans must be graph-safe (replays equal eager calls; atomic: within tolerance)."""
    x, w, b = make(M, 2304, 16384, torch.bfloat16, seed=70, bias=True)
    static_x = x.clone()
    sg.gemm(static_x, w, b, deterministic=deterministic)  # warm-up: compiles, makes the plan
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sg.gemm(static_x, w, b, deterministic=deterministic)
    for seed in (71, 72):
        new_x = torch.randn(M, 16384, generator=gen(seed)).bfloat16().to(DEVICE)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        if deterministic:
            assert torch.equal(static_out, sg.gemm(new_x, w, b))
        else:
            assert_gemm_close(static_out, reference(new_x, w, b), "graph replay, atomic")


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
def test_side_stream():
    """The op runs on the current stream: on a side stream, ordered after the producer of x."""
    x, w, _ = make(8, 4096, 4096, torch.float16, seed=73)
    expected = sg.gemm(x, w)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = sg.gemm(x, w)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, expected)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("M", [1, 4, 32])
def test_deterministic_split_k(M):
    """The ordered reduction adds the partials in slice order: repeated calls are bitwise equal
    (and the atomic one stays within the tolerance of the reference)."""
    x, w, _ = make(M, 2304, 16384, torch.bfloat16, seed=74)
    first = sg.gemm(x, w)
    for _ in range(5):
        assert torch.equal(sg.gemm(x, w), first)
    ref = reference(x, w)
    for _ in range(3):
        assert_gemm_close(sg.gemm(x, w, deterministic=False), ref, "atomic")


def test_reserve_workspaces():
    """The split-K buffers exist at the reserved sizes before any call (what kernelize does so
    that no first call inside a compiled CUDA graph allocates them); a no-op off CUDA."""
    sg.reserve_workspaces("cpu")
    if DEVICE != "cuda":
        return
    kern = sg._triton_kernels()
    sg.reserve_workspaces("cuda")
    dev = torch.device("cuda", torch.cuda.current_device())
    assert kern._COUNTERS[dev].numel() >= 1 << 14 and kern._WORKSPACES[dev].numel() >= 1 << 22
    assert not kern._COUNTERS[dev].any() and not kern._WORKSPACES[dev].any()
