"""The prepacked format: quantize / dequantize, and the GPTQ, AWQ and compressed-tensors
converters against each format's own dequantization, written from its spec in tests/formats.py
(bit for bit: every format computes (q - z) * s, exact in fp32, rounded once)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import kernels
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

w4 = kernels.get_kernel("fused-llm/machete-w4a16", version=1)

_spec = importlib.util.spec_from_file_location("w4a16_formats", Path(__file__).with_name("formats.py"))
fmt = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("w4a16_formats", fmt)
_spec.loader.exec_module(fmt)

DTYPES = [torch.float16, torch.bfloat16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_bits_equal(got: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape, f"{name}: {got.dtype} {tuple(got.shape)} vs {ref.dtype} {tuple(ref.shape)}"
    diff = got.view(torch.int16) != ref.view(torch.int16)
    if diff.any():
        i = int(diff.flatten().nonzero()[0])
        raise AssertionError(f"{name}: {int(diff.sum())} of {diff.numel()} elements differ; first at flat {i}: "
                             f"{got.flatten()[i].item()} vs {ref.flatten()[i].item()}")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 5), words=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_pack_unpack_round_trip(rows, words, seed):
    q = torch.randint(0, 16, (rows, 8 * words), generator=gen(seed))
    packed = w4.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (rows, words)
    assert torch.equal(packed, fmt.awq_pack(q)), "pack_int4 disagrees with the spec's packing (AWQ's slot order)"
    assert torch.equal(w4.unpack_int4(packed), q.to(torch.int32))


def test_pack_bit_positions():
    """Column 8j + c in nibble slot c // 2 + 4 (c % 2) of word j (slots hold columns 0, 2, 4, 6,
    1, 3, 5, 7): codes 0..7 -> 0x75316420, 15 in column 15 (slot 7) -> a negative int32."""
    q = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 15]])
    assert w4.pack_int4(q).tolist() == [[0x75316420, 0xF0000000 - 2**32]]


# ---------------------------------------------------------------------------------------------
# quantize / dequantize
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("zero_point", [False, True], ids=["uint4b8", "uint4+zeros"])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_error_bound(dtype, group_size, zero_point):
    """Round to nearest: every element within half a step (s / 2) of its group, plus the
    rounding of the dequantized value to the dtype; codes in 0..15; the format's fields."""
    N, K = 48, 256
    w = (torch.randn(N, K, generator=gen(1)) * 0.02 + 0.01 * torch.randn(N, 1, generator=gen(2))).to(dtype)
    w[3, :] = 0  # an all-zero row: s = 1, exact zeros
    qw = w4.quantize(w, group_size, zero_point)
    G = K if group_size == -1 else group_size
    assert qw.N == N and qw.K == K and qw.group_size == group_size and qw.dtype == dtype
    assert qw.qweight.shape == (N, K // 8) and qw.scales.shape == (K // G, N)
    assert (qw.zeros is not None) == zero_point and qw.perm is None
    wd = w4.dequantize(qw)
    assert wd.dtype == dtype and wd.shape == (N, K)
    step = qw.scales.float().t().repeat_interleave(G, dim=1)
    ulp = torch.finfo(dtype).eps * w.float().abs()
    err = (wd.float() - w.float()).abs()
    assert (err <= step / 2 * (1 + 1e-6) + ulp).all(), f"max error / step {(err / step).max().item():.3f}"
    assert torch.equal(wd[3], torch.zeros(K, dtype=dtype))


def test_quantize_symmetric_uses_the_range():
    """uint4b8: the positive extreme maps to code 15 (7 steps up), a dominant negative one to 0."""
    w = torch.tensor([[7.0] + [0.0] * 31, [-8.0] + [1.0] * 31]).half()
    q = w4.unpack_int4(w4.quantize(w, 32).qweight)
    assert q[0, 0] == 15 and q[1, 0] == 0 and q[0, 1] == 8
    assert torch.equal(w4.dequantize(w4.quantize(w, 32)), w)


@pytest.mark.parametrize("zero_point", [False, True])
def test_dequantize_is_the_formula(zero_point):
    """dequantize against (q - z) * s computed here from the unpacked fields."""
    qw = w4.quantize(torch.randn(16, 64, generator=gen(3)).bfloat16(), 32, zero_point)
    q = fmt.awq_unpack(qw.qweight)
    z = qw.zeros.t().long().repeat_interleave(32, dim=1) if zero_point else 8
    s = qw.scales.t().repeat_interleave(32, dim=1)
    assert_bits_equal(w4.dequantize(qw), fmt.dequant(q, z if zero_point else torch.full_like(q, 8), s), "dequantize")


@settings(max_examples=25, deadline=None)
@given(
    N=st.integers(1, 40),
    K8=st.integers(1, 48),
    group=st.sampled_from([32, 64, 128, -1]),
    zero_point=st.booleans(),
    bf16=st.booleans(),
    seed=st.integers(0, 2**31),
)
@example(N=26, K8=24, group=32, zero_point=True, bf16=False, seed=47300479)  # s rounded down once clipped the top code
def test_quantize_shapes_property(N, K8, group, zero_point, bf16, seed):
    """Any N, any K that is a multiple of 8 and of the group size: the bound and the layout."""
    K = 8 * K8
    if group != -1 and K % group:
        with pytest.raises(ValueError, match="group_size: K = .* is not a multiple"):
            w4.quantize(torch.zeros(N, K, dtype=torch.float16), group)
        return
    dtype = torch.bfloat16 if bf16 else torch.float16
    w = torch.randn(N, K, generator=gen(seed)).to(dtype)
    qw = w4.quantize(w, group, zero_point)
    G = K if group == -1 else group
    step = qw.scales.float().t().repeat_interleave(G, dim=1)
    err = (w4.dequantize(qw).float() - w.float()).abs()
    assert (err <= step / 2 * (1 + 1e-6) + torch.finfo(dtype).eps * w.float().abs()).all()


# ---------------------------------------------------------------------------------------------
# Checkpoint formats: the converter's dequantization equals the format's own, bit for bit
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("act_order", [False, True], ids=["g_idx none", "act-order g_idx"])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_gptq(dtype, group_size, act_order):
    N, K = 40, 256
    G = K if group_size == -1 else group_size
    g = gen(10 + G)
    # Random int32 words (every bit pattern, negative ones included) and v1 zeros: stored 0..15.
    qweight = torch.randint(-(2**31), 2**31, (K // 8, N), generator=g, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-(2**31), 2**31, (K // G, N // 8), generator=g, dtype=torch.int64).to(torch.int32)
    scales = (torch.randn(K // G, N, generator=g) * 0.01).to(dtype)
    g_idx = fmt.act_order_g_idx(K, G, g) if act_order else None
    qw = w4.from_gptq(qweight, qzeros, scales, g_idx)
    assert (qw.perm is not None) == (act_order and group_size != -1)
    assert_bits_equal(w4.dequantize(qw), fmt.read_gptq(qweight, qzeros, scales, g_idx), "gptq")


def test_from_gptq_trivial_g_idx_and_symmetric():
    """A g_idx equal to k // G needs no permutation; stored zeros of 7 (zero 8) everywhere are
    the symmetric type (no zeros tensor)."""
    N, K, G = 16, 128, 32
    q, _, s = fmt.random_codes(N, K, K // G, gen(11))
    z = torch.full((K // G, N), 8)
    qweight, qzeros, scales, _ = fmt.write_gptq(q, z, s)
    assert (qzeros == 0x77777777).all()
    qw = w4.from_gptq(qweight, qzeros, scales, (torch.arange(K) // G).to(torch.int32))
    assert qw.perm is None and qw.zeros is None and qw.symmetric
    assert_bits_equal(w4.dequantize(qw), fmt.read_gptq(qweight, qzeros, scales), "gptq symmetric")


def test_from_gptq_zero_16():
    """v1 stores zero - 1 in 4 bits: a stored 15 is zero 16, which the format holds."""
    N, K = 8, 64
    q, _, s = fmt.random_codes(N, K, 2, gen(12))
    z = torch.full((2, N), 16)
    qw = w4.from_gptq(*fmt.write_gptq(q, z, s)[:3])
    assert int(qw.zeros.max()) == 16
    assert_bits_equal(w4.dequantize(qw), fmt.dequant(q, torch.full_like(q, 16), s.t().repeat_interleave(32, dim=1)), "zero 16")


def test_from_gptq_uneven_groups_raise():
    K, G = 64, 32
    g_idx = torch.zeros(K, dtype=torch.int32)
    g_idx[:40] = 1  # 40 and 24 columns: not groups of 32
    with pytest.raises(ValueError, match="g_idx: sorting the columns by group does not give 2 runs of exactly 32"):
        w4.from_gptq(torch.zeros(K // 8, 8, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32),
                     torch.ones(2, 8, dtype=torch.float16), g_idx)  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_awq(dtype, group_size):
    N, K = 48, 256
    G = K if group_size == -1 else group_size
    g = gen(20 + G)
    qweight = torch.randint(-(2**31), 2**31, (K, N // 8), generator=g, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-(2**31), 2**31, (K // G, N // 8), generator=g, dtype=torch.int64).to(torch.int32)
    scales = (torch.randn(K // G, N, generator=g) * 0.01).to(dtype)
    qw = w4.from_awq(qweight, qzeros, scales)
    assert_bits_equal(w4.dequantize(qw), fmt.read_awq(qweight, qzeros, scales), "awq")


def test_awq_nibble_order():
    """Output column 1 sits in nibble slot 4 (AWQ's order 0, 2, 4, 6, 1, 3, 5, 7)."""
    qweight = torch.tensor([[1 << 16]], dtype=torch.int32).expand(8, 1).contiguous()  # slot 4 = 1
    qw = w4.from_awq(qweight, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 8, dtype=torch.float16))
    w = w4.dequantize(qw)
    assert torch.equal(w[1], torch.ones(8, dtype=torch.float16)) and w[[0, 2, 3, 4, 5, 6, 7]].abs().sum() == 0


@pytest.mark.kernels_ci
@pytest.mark.parametrize("act_order", [False, True], ids=["no g_idx", "g_idx"])
@pytest.mark.parametrize("zero_point", ["symmetric", "packed", "int8"])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_compressed_tensors(dtype, group_size, zero_point, act_order):
    N, K = 40, 256
    G = K if group_size == -1 else group_size
    g = gen(30 + G)
    weight_packed = torch.randint(-(2**31), 2**31, (N, K // 8), generator=g, dtype=torch.int64).to(torch.int32)
    weight_scale = (torch.randn(N, K // G, generator=g) * 0.01).to(dtype)
    zp = None
    if zero_point == "packed":
        zp = torch.randint(-(2**31), 2**31, (N // 8, K // G), generator=g, dtype=torch.int64).to(torch.int32)
    elif zero_point == "int8":
        zp = torch.randint(-8, 8, (N, K // G), generator=g).to(torch.int8)
    g_idx = fmt.act_order_g_idx(K, G, g) if act_order else None
    qw = w4.from_compressed_tensors(weight_packed, weight_scale, torch.tensor([N, K]), zp, g_idx)
    if zero_point == "int8":  # the unpacked form: the reference reads the packed one
        zp = fmt.pack_last((zp.long() + 8).t().contiguous()).t().contiguous()
    assert_bits_equal(w4.dequantize(qw), fmt.read_compressed_tensors(weight_packed, weight_scale, (N, K), zp, g_idx), "ct")


def test_compressed_tensors_words_reordered():
    """Without g_idx, qweight holds weight_packed's words, each word's nibbles moved from the
    natural order into the format's slot order (AWQ's): no other change of layout."""
    N, K = 16, 64
    q, z, s = fmt.random_codes(N, K, 2, gen(31), zero_range=(0, 15))
    t = fmt.write_compressed_tensors(q, z, s)
    qw = w4.from_compressed_tensors(**t)
    assert torch.equal(qw.qweight, fmt.awq_pack(fmt.unpack_last(t["weight_packed"])))


@pytest.mark.parametrize("name", ["gptq", "awq", "compressed-tensors"])
def test_round_trip_through_each_format(name):
    """quantize -> write the checkpoint tensors (tests/formats.py) -> from_X: the same weight."""
    N, K, G = 32, 128, 32
    for zero_point in (False, True):
        qw = w4.quantize(torch.randn(N, K, generator=gen(40)).half(), G, zero_point)
        q = w4.unpack_int4(qw.qweight)
        z = qw.zeros.long() if zero_point else torch.full((K // G, N), 8)
        if name == "gptq":
            back = w4.from_gptq(*fmt.write_gptq(q, z, qw.scales)[:3])
        elif name == "awq":
            back = w4.from_awq(*fmt.write_awq(q, z, qw.scales))
        else:
            back = w4.from_compressed_tensors(**fmt.write_compressed_tensors(q, z, qw.scales, symmetric=not zero_point))
        assert torch.equal(back.qweight, qw.qweight) and torch.equal(back.scales, qw.scales)
        assert (back.zeros is None) == (qw.zeros is None) and (qw.zeros is None or torch.equal(back.zeros, qw.zeros))


def test_act_order_round_trip():
    """An act-order GPTQ weight: dequantize in the original column order, and perm holds the
    original column of each packed column."""
    N, K, G = 16, 128, 32
    g = gen(41)
    q, z, s = fmt.random_codes(N, K, K // G, g)
    g_idx = fmt.act_order_g_idx(K, G, g)
    qw = w4.from_gptq(*fmt.write_gptq(q, z, s, g_idx))
    assert qw.perm is not None and torch.equal(g_idx[qw.perm.long()].long(), torch.arange(K) // G)
    assert torch.equal(w4.unpack_int4(qw.qweight), q[:, qw.perm.long()].to(torch.int32))
    assert_bits_equal(w4.dequantize(qw), fmt.read_gptq(*fmt.write_gptq(q, z, s, g_idx)), "act order")


# ---------------------------------------------------------------------------------------------
# Bad input: errors name the argument, what was expected and what came
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    h = torch.zeros(16, 64, dtype=torch.float16)
    qw = w4.quantize(h, 32)
    i32 = torch.zeros(8, 16, dtype=torch.int32)
    return [
        ("w dtype", lambda: w4.quantize(h.float()), TypeError, "w: expected dtype float16 or bfloat16, got torch.float32"),
        ("w dim", lambda: w4.quantize(h[0]), ValueError, r"w: expected shape \[N, K\]"),
        ("w K", lambda: w4.quantize(h[:, :60]), ValueError, r"w: expected K = w.shape\[1\] a positive multiple of 8 \(8 codes per int32\), got 60"),
        ("group 48", lambda: w4.quantize(h, 48), ValueError, r"group_size: expected one of \(32, 64, 128, -1\), got 48"),
        ("group K", lambda: w4.quantize(h[:, :32], 64), ValueError, "group_size: K = 32 is not a multiple of group_size 64"),
        ("zero_point", lambda: w4.quantize(h, 32, "yes"), TypeError, "zero_point: expected a bool"),
        ("qweight dtype", lambda: w4.QuantizedWeight(i32.float(), qw.scales), ValueError, r"qweight: expected an int32 tensor \[N, K / 8\]"),
        ("scales shape", lambda: w4.QuantizedWeight(qw.qweight, qw.scales[:1], group_size=32), ValueError, r"scales: expected a contiguous \[2, 16\] tensor"),
        ("scales dtype", lambda: w4.QuantizedWeight(qw.qweight, qw.scales.float(), group_size=32), TypeError, "scales: expected a float16 or bfloat16"),
        ("zeros dtype", lambda: w4.QuantizedWeight(qw.qweight, qw.scales, qw.scales, group_size=32), TypeError, "zeros: expected a uint8 tensor"),
        ("perm shape", lambda: w4.QuantizedWeight(qw.qweight, qw.scales, None, torch.zeros(3, dtype=torch.int32), 32), ValueError, r"perm: expected a contiguous \[64\] tensor"),
        ("gptq qweight", lambda: w4.from_gptq(i32.long(), i32, qw.scales), TypeError, "qweight: expected dtype int32, got torch.int64"),
        ("gptq qzeros", lambda: w4.from_gptq(i32, i32, torch.ones(2, 16, dtype=torch.float16)), ValueError, r"qzeros: expected shape \[K / G, N / 8\] = \[2, 2\], got \(8, 16\)"),
        ("gptq groups", lambda: w4.from_gptq(i32, i32[:3, :2], torch.ones(3, 16, dtype=torch.float16)), ValueError, "scales: 3 groups do not divide K = 64"),
        ("gptq scales dtype", lambda: w4.from_gptq(i32, i32[:2, :2], torch.ones(2, 16)), TypeError, "scales: expected dtype float16 or bfloat16, got torch.float32"),
        ("awq scales", lambda: w4.from_awq(torch.zeros(64, 2, dtype=torch.int32), i32[:2, :2], torch.ones(2, 15, dtype=torch.float16)), ValueError, r"scales: expected shape \[K / G, N\] = \[2, 16\]"),
        ("ct shape", lambda: w4.from_compressed_tensors(i32, torch.ones(8, 1, dtype=torch.float16), (8, 60)), ValueError, "weight_shape: expected K a positive multiple of 8"),
        ("ct packed", lambda: w4.from_compressed_tensors(i32, torch.ones(8, 1, dtype=torch.float16), (8, 64)), ValueError, r"weight_packed: expected shape \[N, K / 8\] = \[8, 8\]"),
        ("ct zero point", lambda: w4.from_compressed_tensors(i32[:, :8], torch.ones(8, 2, dtype=torch.float16), (8, 64), torch.zeros(3, 3, dtype=torch.int32)), ValueError, "weight_zero_point: expected int32"),
        ("ct g_idx", lambda: w4.from_compressed_tensors(i32[:, :8], torch.ones(8, 2, dtype=torch.float16), (8, 64), None, torch.zeros(5, dtype=torch.int32)), ValueError, r"weight_g_idx: expected an int32 / int64 tensor \[64\]"),
    ]  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()
