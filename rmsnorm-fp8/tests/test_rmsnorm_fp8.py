"""rmsnorm-fp8 against a plain-PyTorch fp64 reference that rounds and quantizes like the kernel.

The package is loaded the way users load it, through kernels.get_kernel; LOCAL_KERNELS points
at the fresh build (set by the checkout's conftest, or by kernel-builder's ci-test).
Runs on CUDA when torch has a GPU (the CUDA variant), else on the CPU variant.
"""

from __future__ import annotations

import itertools

import kernels
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rmsnorm_fp8_testing import (
    assert_close,
    assert_fp8_close,
    assert_fully_written,
    assert_only_declared_outputs_mutate,
    device,
    dynamic_fp8_ref,
    empty_poisoned,
    FP8_DTYPES,
    FP8_MAX,
    opcheck,
    quantize_fp8_ref,
    seed_of,
    size_id,
)

rmsnorm_fp8 = kernels.get_kernel("fused-llm/rmsnorm-fp8", version=1)

DEVICE = device()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HIDDEN = (1, 7, 64, 2048, 4096, 5120, 8192, 16384, 13331)  # 13331: odd and large
ROWS = (0, 1, 3, 257, 4096)
EPS = 1e-6


def affordable(rows: int, hidden: int) -> bool:
    """All sizes on a GPU; on the CPU (CI: 2 cores) skip the few > 4M-element cases."""
    return DEVICE == "cuda" or rows * hidden <= 1 << 22


SIZES = [(r, h) for r, h in itertools.product(ROWS, HIDDEN) if affordable(r, h)]


# ---------------------------------------------------------------------------------------
# Reference: fp64 statistics, the kernel's rounding order, the kernel's quantization.
# ---------------------------------------------------------------------------------------


def ref_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    dtype = x.dtype
    v = x if residual is None else (x.float() + residual.float()).to(dtype)
    vd = v.double()
    normed = (vd * torch.rsqrt(vd.pow(2).mean(-1, keepdim=True) + eps)).float().to(dtype)
    y = (normed.float() * weight.float()).to(dtype)
    return y, v


def make_inputs(rows: int, hidden: int, dtype: torch.dtype, *, seed: int, residual: bool = True):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(rows, hidden, dtype=dtype, device=DEVICE, generator=gen) * 2
    res = torch.randn(rows, hidden, dtype=dtype, device=DEVICE, generator=gen) if residual else None
    w = (torch.rand(hidden, dtype=torch.float32, device=DEVICE, generator=gen) + 0.5).to(dtype)
    return x, res, w


# ---------------------------------------------------------------------------------------
# Unquantized
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=size_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused_add", [False, True], ids=["plain", "fused_add"])
def test_rms_norm(size, dtype, fused_add):
    rows, hidden = size
    x, res, w = make_inputs(rows, hidden, dtype, seed=seed_of(rows, hidden, str(dtype)), residual=fused_add)
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    out = empty_poisoned((rows, hidden), dtype, DEVICE)
    if fused_add:
        got, new_res = rmsnorm_fp8.fused_add_rms_norm(x, res, w, EPS, out=out)
        assert_fully_written(new_res, "residual_out")
        assert torch.equal(new_res, v_ref), "residual_out must equal x + residual rounded to the dtype"
    else:
        got = rmsnorm_fp8.rms_norm(x, w, EPS, out=out)
    assert got is out
    assert_close(got, y_ref, "out")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_ci(dtype):
    test_rms_norm((3, 4096), dtype, True)
    test_rms_norm((1, 7), dtype, False)


# ---------------------------------------------------------------------------------------
# Static FP8
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=size_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("fused_add", [False, True], ids=["plain", "fused_add"])
def test_static_fp8(size, dtype, fp8_dtype, fused_add):
    rows, hidden = size
    x, res, w = make_inputs(rows, hidden, dtype, seed=seed_of(rows, hidden, "static"), residual=fused_add)
    # A scale that sends the largest values past the FP8 maximum, so saturation is exercised.
    scale = torch.tensor([3.0 / FP8_MAX[fp8_dtype]], device=DEVICE)
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    q_ref = quantize_fp8_ref(y_ref, 1.0 / scale, fp8_dtype)
    out = empty_poisoned((rows, hidden), fp8_dtype, DEVICE)
    if fused_add:
        q, new_res = rmsnorm_fp8.fused_add_rms_norm_fp8(x, res, w, scale, EPS, fp8_dtype=fp8_dtype, out=out)
        assert torch.equal(new_res, v_ref)
    else:
        q = rmsnorm_fp8.rms_norm_fp8(x, w, scale, EPS, fp8_dtype=fp8_dtype, out=out)
    assert q is out
    assert_fp8_close(q, q_ref, scale, scale)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_static_fp8_ci(fp8_dtype):
    test_static_fp8((257, 2048), torch.bfloat16, fp8_dtype, True)


# ---------------------------------------------------------------------------------------
# Dynamic FP8: per token and per group
# ---------------------------------------------------------------------------------------

DYNAMIC_SIZES = [(r, h) for r, h in SIZES if h % 64 == 0] + [(5, 7), (2, 1)]


@pytest.mark.parametrize("size", DYNAMIC_SIZES, ids=size_id)
@pytest.mark.parametrize("group", [None, 64, 128], ids=["token", "g64", "g128"])
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_dynamic_fp8(size, group, fp8_dtype, dtype):
    rows, hidden = size
    if group and hidden % group:
        pytest.skip("hidden size not a multiple of the group")
    fused_add = rows % 2 == 1  # both paths over the size list, at half the cases
    x, res, w = make_inputs(rows, hidden, dtype, seed=seed_of(rows, hidden, group), residual=fused_add)
    if rows:
        x[0].zero_()  # an all-zero row (and group): the scale floor keeps it finite
        if res is not None:
            res[0].zero_()
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    q_ref, s_ref = dynamic_fp8_ref(y_ref, fp8_dtype, group, None)
    out = empty_poisoned((rows, hidden), fp8_dtype, DEVICE)
    scales = empty_poisoned(tuple(s_ref.shape), torch.float32, DEVICE)
    kwargs = dict(group_size=group, fp8_dtype=fp8_dtype, out=out, scales=scales)
    if fused_add:
        q, s, new_res = rmsnorm_fp8.fused_add_rms_norm_dynamic_fp8(x, res, w, EPS, **kwargs)
        assert torch.equal(new_res, v_ref)
    else:
        q, s = rmsnorm_fp8.rms_norm_dynamic_fp8(x, w, EPS, **kwargs)
    assert q is out and s is scales
    assert s.dtype == torch.float32 and s.shape == s_ref.shape
    assert_fully_written(s, "scales")
    torch.testing.assert_close(s, s_ref, rtol=2 * 2**-7 if dtype != torch.float32 else 1e-5, atol=0)
    g = group or hidden
    expand = lambda sc: sc.repeat_interleave(g, dim=-1) if rows else sc.reshape(0, hidden)  # noqa: E731
    assert_fp8_close(q, q_ref, expand(s), expand(s_ref))


@pytest.mark.parametrize("group", [None, 128])
def test_dynamic_scale_ub_and_column_major(group):
    x, res, w = make_inputs(33, 1024, torch.bfloat16, seed=7)
    x[3] *= 50  # a row whose absmax exceeds the bound
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    q_ref, s_ref = dynamic_fp8_ref(y_ref, torch.float8_e4m3fn, group, 4.0)
    q, s, _ = rmsnorm_fp8.fused_add_rms_norm_dynamic_fp8(
        x, res, w, EPS, group_size=group, scale_ub=4.0, column_major_scales=True, fp8_dtype=torch.float8_e4m3fn
    )
    assert s.shape == s_ref.shape and s.stride() == (1, s.shape[0]), "column-major scales: groups-major storage"
    torch.testing.assert_close(s, s_ref, rtol=2 * 2**-7, atol=0)
    assert (s <= 4.0 / 448 * (1 + 2**-7)).all(), "scale_ub bounds every scale"
    g = group or 1024
    assert_fp8_close(q, q_ref, s.repeat_interleave(g, -1), s_ref.repeat_interleave(g, -1))


@pytest.mark.kernels_ci
@pytest.mark.parametrize("rows", [1, 5, 16, 40])
@pytest.mark.parametrize("hidden", [8192, 16384])
def test_decode_shapes_ci(rows, hidden):
    # Decode shapes (few rows, long rows: the most threads per row), every quant mode.
    test_rms_norm((rows, hidden), torch.bfloat16, True)
    test_static_fp8((rows, hidden), torch.bfloat16, torch.float8_e4m3fn, True)
    test_dynamic_fp8((rows, hidden), None, torch.float8_e4m3fn, torch.bfloat16)
    test_dynamic_fp8((rows, hidden), 128, torch.float8_e4m3fnuz, torch.float16)


@pytest.mark.kernels_ci
def test_dynamic_fp8_ci():
    test_dynamic_fp8((257, 2048), 128, torch.float8_e4m3fn, torch.bfloat16)
    test_dynamic_fp8((3, 4096), None, torch.float8_e4m3fnuz, torch.bfloat16)


# ---------------------------------------------------------------------------------------
# Layouts: non-contiguous rows, leading dims, in place
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_rows(dtype):
    hidden = 1024
    wide = torch.randn(65, hidden + 96, dtype=dtype, device=DEVICE)
    x = wide[:, 32 : 32 + hidden]  # row stride hidden + 96, 64-byte offset
    res = torch.randn(65, 2 * hidden, dtype=dtype, device=DEVICE)[:, ::1][:, :hidden]
    w = torch.rand(hidden, dtype=dtype, device=DEVICE) + 0.5
    assert not x.is_contiguous() and not res.is_contiguous()
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    out, new_res = rmsnorm_fp8.fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(new_res, v_ref)
    assert_close(out, y_ref, "out")
    scale = torch.tensor([0.01], device=DEVICE)
    q = rmsnorm_fp8.rms_norm_fp8(x, w, scale, EPS)
    assert_fp8_close(q, quantize_fp8_ref(ref_norm(x, None, w, EPS)[0], 1 / scale, q.dtype), scale, scale)


def test_misaligned_rows_take_the_generic_path():
    # A 1-element offset breaks 16-byte alignment; results must not change.
    base = torch.randn(40 * 2049, dtype=torch.bfloat16, device=DEVICE)
    x = base[1:].view(-1)[: 40 * 2048].view(40, 2048)
    w = torch.rand(2048, dtype=torch.bfloat16, device=DEVICE) + 0.5
    assert_close(rmsnorm_fp8.rms_norm(x, w, EPS), ref_norm(x, None, w, EPS)[0], "out")


@pytest.mark.parametrize("group", [None, 64, 128], ids=["token", "g64", "g128"])
@pytest.mark.parametrize("hidden", [2048, 65536], ids=["misaligned2048", "wide65536"])
def test_generic_kernel_dynamic(group, hidden):
    # The generic kernel: a 1-element offset breaks 16-byte alignment, and 65536 bf16 columns
    # are more than the vectorized kernel keeps in registers. Both fused-add and static too.
    rows = 5
    base = torch.randn(rows * hidden + 1, dtype=torch.bfloat16, device=DEVICE)
    x = base[1:].view(rows, hidden) if hidden == 2048 else base[:-1].view(rows, hidden)
    res = torch.randn(rows, hidden, dtype=torch.bfloat16, device=DEVICE)
    w = torch.rand(hidden, dtype=torch.bfloat16, device=DEVICE) + 0.5
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    q_ref, s_ref = dynamic_fp8_ref(y_ref, torch.float8_e4m3fn, group, None)
    q, s, new_res = rmsnorm_fp8.fused_add_rms_norm_dynamic_fp8(x, res, w, EPS, group_size=group)
    assert torch.equal(new_res, v_ref)
    torch.testing.assert_close(s, s_ref, rtol=2 * 2**-7, atol=0)
    g = group or hidden
    assert_fp8_close(q, q_ref, s.repeat_interleave(g, -1), s_ref.repeat_interleave(g, -1))
    scale = torch.tensor([0.01], device=DEVICE)
    q, _ = rmsnorm_fp8.fused_add_rms_norm_fp8(x, res, w, scale, EPS)
    assert_fp8_close(q, quantize_fp8_ref(y_ref, 1 / scale, q.dtype), scale, scale)


def test_overlapping_outputs_are_refused():
    x, res, w = make_inputs(4, 64, torch.bfloat16, seed=2)
    with pytest.raises(RuntimeError, match="out: expected an output whose elements do not share memory"):
        rmsnorm_fp8.rms_norm(x, w, EPS, out=torch.empty(1, 64, dtype=x.dtype, device=DEVICE).expand(4, 64))
    buf = torch.randn(5, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(RuntimeError, match="out: overlaps another argument"):
        rmsnorm_fp8.rms_norm(buf[1:], w, EPS, out=buf[:-1])
    with pytest.raises(RuntimeError, match="residual_out: overlaps another argument|out: overlaps another argument"):
        rmsnorm_fp8.fused_add_rms_norm(x, res, w, EPS, out=res)


def test_leading_dims():
    x, res, w = make_inputs(6, 256, torch.bfloat16, seed=3)
    x3, r3 = x.view(2, 3, 256), res.view(2, 3, 256)
    out, new_res = rmsnorm_fp8.fused_add_rms_norm(x3, r3, w, EPS)
    assert out.shape == (2, 3, 256) and new_res.shape == (2, 3, 256)
    assert_close(out.view(6, 256), ref_norm(x, res, w, EPS)[0], "out")
    q, s = rmsnorm_fp8.rms_norm_dynamic_fp8(x3, w, EPS)
    assert q.shape == (2, 3, 256) and s.shape == (2, 3, 1)


@pytest.mark.kernels_ci
def test_in_place():
    x, res, w = make_inputs(17, 4096, torch.bfloat16, seed=11)
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    x_ptr, res_ptr = x.data_ptr(), res.data_ptr()
    out, new_res = rmsnorm_fp8.fused_add_rms_norm(x, res, w, EPS, out=x, inplace=True)
    assert out.data_ptr() == x_ptr and new_res.data_ptr() == res_ptr
    assert torch.equal(res, v_ref)
    assert_close(x, y_ref, "x (in place)")


# ---------------------------------------------------------------------------------------
# Random shapes and strides
# ---------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 70),
    hidden=st.integers(1, 3000),
    pad=st.integers(0, 40),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_shapes(rows, hidden, pad, dtype, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(rows, hidden + pad, dtype=dtype, device=DEVICE, generator=gen)[:, pad:]
    res = torch.randn(rows, hidden, dtype=dtype, device=DEVICE, generator=gen)
    w = torch.rand(hidden, dtype=dtype, device=DEVICE, generator=gen) + 0.5
    y_ref, v_ref = ref_norm(x, res, w, EPS)
    out, new_res = rmsnorm_fp8.fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(new_res, v_ref)
    assert_close(out, y_ref, "out")
    scale = torch.tensor([0.02], device=DEVICE)
    q, _ = rmsnorm_fp8.fused_add_rms_norm_fp8(x, res, w, scale, EPS)
    assert_fp8_close(q, quantize_fp8_ref(y_ref, 1 / scale, q.dtype), scale, scale)


# ---------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument, before anything is written
# ---------------------------------------------------------------------------------------


def _bad_cases():
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=DEVICE)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEVICE)
    s = torch.tensor([0.1], device=DEVICE)
    k = rmsnorm_fp8
    return [
        ("x dtype", lambda: k.rms_norm(x.to(torch.int32), w), TypeError, "x: expected dtype"),
        ("x scalar", lambda: k.rms_norm(x[0, 0], w), ValueError, "x:"),
        ("x last-dim stride", lambda: k.rms_norm(x.t(), torch.ones(4, dtype=x.dtype, device=DEVICE)), ValueError, "x: the last dimension must be contiguous"),
        ("weight shape", lambda: k.rms_norm(x, w[:32]), ValueError, "weight: expected shape (64,)"),
        ("weight dtype", lambda: k.rms_norm(x, w.float()), TypeError, "weight: expected dtype torch.bfloat16"),
        ("weight device", lambda: k.rms_norm(x, w.to("meta")), ValueError, "weight: expected device"),
        ("residual shape", lambda: k.fused_add_rms_norm(x, x[:2], w), ValueError, "residual: expected shape"),
        ("residual dtype", lambda: k.fused_add_rms_norm(x, x.half(), w), TypeError, "residual: expected dtype"),
        ("out dtype", lambda: k.rms_norm(x, w, out=torch.empty_like(x, dtype=torch.float32)), TypeError, "out: expected dtype"),
        ("out shape", lambda: k.rms_norm(x, w, out=x[:2].clone()), ValueError, "out: expected shape"),
        ("scale dtype", lambda: k.rms_norm_fp8(x, w, s.double()), TypeError, "scale: expected dtype torch.float32"),
        ("scale shape", lambda: k.rms_norm_fp8(x, w, torch.ones(2, device=DEVICE)), ValueError, "scale: expected one element"),
        ("scale not a tensor", lambda: k.rms_norm_fp8(x, w, 0.5), TypeError, "scale:"),
        ("scale device", lambda: k.rms_norm_fp8(x, w, s.to("meta")), ValueError, "scale: expected device"),
        ("fp8_dtype", lambda: k.rms_norm_fp8(x, w, s, fp8_dtype=torch.float8_e5m2), TypeError, "fp8_dtype:"),
        ("group_size value", lambda: k.rms_norm_dynamic_fp8(x, w, group_size=32), ValueError, "group_size: expected"),
        ("group_size divides", lambda: k.rms_norm_dynamic_fp8(x[:, :48].contiguous(), w[:48], group_size=64), ValueError, "group_size: hidden size 48"),
        ("scale_ub", lambda: k.rms_norm_dynamic_fp8(x, w, scale_ub=-1.0), ValueError, "scale_ub:"),
        ("eps", lambda: k.rms_norm(x, w, -1.0), ValueError, "eps:"),
    ]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, message = case
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        call()


def test_bad_input_writes_nothing():
    x, res, w = make_inputs(4, 64, torch.bfloat16, seed=1)
    before = res.clone()
    with pytest.raises(TypeError, match="weight"):
        rmsnorm_fp8.fused_add_rms_norm(x, res, w.float(), EPS, inplace=True)
    assert torch.equal(res, before)


def test_raw_op_checks_name_the_argument():
    # Direct torch.ops callers bypass the Python checks; the C++ checks still name arguments.
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(4, 64, dtype=torch.float8_e4m3fn, device=DEVICE)
    with pytest.raises(RuntimeError, match="scale: expected a float32 tensor"):
        rmsnorm_fp8.ops.rms_norm_static_fp8(out, x, torch.ones(64, dtype=x.dtype, device=DEVICE), torch.ones(3, device=DEVICE), EPS)
    # Messages that carry numbers (these crashed a GPU build once: see msg() in the binding).
    w = torch.ones(64, dtype=x.dtype, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"weight: expected shape \[64\]"):
        rmsnorm_fp8.ops.rms_norm(torch.empty_like(x), x, w[:32], EPS)
    with pytest.raises(RuntimeError, match="x: expected a 2-D"):
        rmsnorm_fp8.ops.rms_norm(torch.empty_like(x), x[None], w, EPS)
    with pytest.raises(RuntimeError, match=r"scales: expected shape \[4, 1\]"):
        rmsnorm_fp8.ops.rms_norm_dynamic_fp8(out, torch.empty(4, 2, device=DEVICE), x, w, EPS, 0, None)


# ---------------------------------------------------------------------------------------
# torch.library contract and torch.compile
# ---------------------------------------------------------------------------------------


def _opcheck_cases():
    x = torch.randn(5, 256, dtype=torch.bfloat16, device=DEVICE)
    r = torch.randn_like(x)
    w = torch.rand(256, dtype=torch.bfloat16, device=DEVICE) + 0.5
    s = torch.tensor([0.01], device=DEVICE)
    fp8 = lambda: torch.empty(5, 256, dtype=torch.float8_e4m3fn, device=DEVICE)  # noqa: E731
    ops = rmsnorm_fp8.ops
    return {
        "rms_norm": (ops.rms_norm, (torch.empty_like(x), x, w, EPS)),
        "fused_add_rms_norm": (ops.fused_add_rms_norm, (torch.empty_like(x), torch.empty_like(x), x, r, w, EPS)),
        # the allocating forms behind the Python API's common case ([..., hidden] inputs)
        "rms_norm_alloc": (ops.rms_norm_alloc, (x.view(1, 5, 256), w, EPS)),
        "fused_add_rms_norm_alloc": (ops.fused_add_rms_norm_alloc, (x, r, w, EPS)),
        "rms_norm_static_fp8": (ops.rms_norm_static_fp8, (fp8(), x, w, s, EPS)),
        "fused_add_rms_norm_static_fp8": (ops.fused_add_rms_norm_static_fp8, (fp8(), torch.empty_like(x), x, r, w, s, EPS)),
        "rms_norm_dynamic_fp8": (ops.rms_norm_dynamic_fp8, (fp8(), torch.empty(5, 2, device=DEVICE), x, w, EPS, 128, None)),
        "fused_add_rms_norm_dynamic_fp8": (
            ops.fused_add_rms_norm_dynamic_fp8,
            (fp8(), torch.empty(5, 1, device=DEVICE), torch.empty_like(x), x, r, w, EPS, 0, 3.0),
        ),
    }


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_opcheck(name):
    opcheck(*_opcheck_cases()[name])


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_only_declared_outputs_mutate(name):
    assert_only_declared_outputs_mutate(*_opcheck_cases()[name])


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph():
    x, res, w = make_inputs(9, 512, torch.bfloat16, seed=5)
    scale = torch.tensor([0.02], device=DEVICE)

    def block(x, res, w, scale):
        q, new_res = rmsnorm_fp8.fused_add_rms_norm_fp8(x, res, w, scale, EPS)
        q2, s2 = rmsnorm_fp8.rms_norm_dynamic_fp8(new_res, w, EPS, group_size=128)
        return q.float() * scale, new_res * 2, q2.float(), s2, rmsnorm_fp8.rms_norm(x, w, EPS)

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    eager = block(x, res.clone(), w, scale)
    got = compiled(x, res.clone(), w, scale)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# Layer
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_matches_llama_rmsnorm(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hidden = 768
    host = LlamaRMSNorm(hidden, eps=1e-5).to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        host.weight.copy_(torch.rand(hidden) + 0.5)
    x = torch.randn(2, 7, hidden, dtype=dtype, device=DEVICE)
    expected = host(x)
    got = rmsnorm_fp8.layers.RMSNorm.forward(host, x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, **{"rtol": 2 * 2**-7, "atol": 1e-5} if dtype != torch.float32 else {})


@pytest.mark.kernels_ci
@pytest.mark.parametrize("rows", [7, rmsnorm_fp8.layers.COMPILED_ORIGINAL_MIN_ROWS])
def test_layer_compiled_hands_large_calls_back(rows):
    # Compiled, a call of >= COMPILED_ORIGINAL_MIN_ROWS rows is LlamaRMSNorm's own expression
    # (no custom op in the graph); a smaller one calls the op. Both give LlamaRMSNorm's result.
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    host = LlamaRMSNorm(256, eps=1e-5).to(device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        host.weight.copy_(torch.rand(256) + 0.5)
    x = torch.randn(rows, 256, dtype=torch.bfloat16, device=DEVICE)
    targets: list[str] = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(lambda t: rmsnorm_fp8.layers.RMSNorm.forward(host, t), fullgraph=True, dynamic=False,
                        backend=backend)(x)
    calls_op = any("rms_norm" in t for t in targets)
    assert calls_op == (rows < rmsnorm_fp8.layers.COMPILED_ORIGINAL_MIN_ROWS), targets
    torch.testing.assert_close(got, host(x), rtol=2 * 2**-7, atol=1e-5)


@pytest.mark.kernels_ci
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs and streams")
def test_cuda_graph_capture_and_side_stream():
    # The decode path's calls (the allocating C++ ops) on a non-default stream and inside a
    # captured CUDA graph replayed on new inputs give the bits of the same calls on the default
    # stream (their numerics are tested above).
    x = torch.randn(1, 1, 4096, device=DEVICE, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device=DEVICE, dtype=torch.bfloat16)

    def calls():
        return (rmsnorm_fp8.rms_norm(x, w, EPS), *rmsnorm_fp8.fused_add_rms_norm(x, r, w, EPS))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = calls()
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(on_side, calls()):
        assert torch.equal(a, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = calls()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, calls()):
        assert torch.equal(a, b)
