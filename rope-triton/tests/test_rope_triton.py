"""rope-triton against plain-PyTorch references (fp64 rotation; transformers' own function).

Loaded the way users load it (kernels.get_kernel; LOCAL_KERNELS points at the fresh build).
On a GPU the ops run the compiled Triton kernels. On CPU (CI) the ops run the same kernels in
Triton's interpreter (conftest sets TRITON_INTERPRET=1), and the plain-torch path (the
torch-cpu variant's default) is checked against the same references.

Tolerances: the rotation is computed in fp32 and rounded once, so results are within one
rounding of the fp64 reference: rtol = the dtype's unit roundoff (2^-8 bf16, 2^-11 fp16,
1e-6 fp32) plus fp32 arithmetic (1e-6 x max |x|). Exceptions: transformers' rounding order is
reproduced bit for bit (compiled kernels and the torch path); Triton's interpreter rounds fp32
to bf16 by truncation, so bf16 there gets one more bf16 ulp.
"""

from __future__ import annotations

import dataclasses
import os

import kernels
import pytest
import torch

from rope_triton_testing import device, opcheck

rt = kernels.get_kernel("fused-llm/rope-triton", version=1)

DEVICE = device()
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
TRUNCATES_BF16 = INTERPRETED  # the interpreter's fp32 -> bf16 conversion truncates


def rtol_of(dtype: torch.dtype) -> float:
    base = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 1e-6}[dtype]
    return base * (3 if dtype == torch.bfloat16 and TRUNCATES_BF16 else 1)


def assert_rotary_close(got: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, name: str) -> None:
    assert got.shape == ref.shape and got.dtype == x.dtype, f"{name}: {got.dtype}{tuple(got.shape)} vs {tuple(ref.shape)}"
    if not got.numel():
        return
    err = (got.double() - ref).abs()
    bound = rtol_of(x.dtype) * ref.abs() + 1e-6 * x.double().abs().max() + 1e-30
    worst = (err / bound).max().item()
    if not worst <= 1.0:
        i = int((err / bound).argmax())
        raise AssertionError(f"{name}: error {worst:.2f}x the tolerance at flat index {i}: {got.flatten()[i].item()} vs {ref.flatten()[i].item()}")


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def ref_rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, rotary_dim: int, interleaved: bool) -> torch.Tensor:
    """fp64 rotation of x [B, S, H, D] with c, s [B, S, rotary_dim / 2] (fp64)."""
    x = x.double()
    out = x.clone()
    half = rotary_dim // 2
    c, s = c[:, :, None, :], s[:, :, None, :]
    if interleaved:
        lo, hi = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = lo * c - hi * s
        out[..., 1:rotary_dim:2] = hi * c + lo * s
    else:
        lo, hi = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = lo * c - hi * s
        out[..., half:rotary_dim] = hi * c + lo * s
    return out


def to_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.permute(0, 2, 1, 3) if layout == "bhsd" else t


def make_qk(B, S, HQ, HK, D, dtype, layout, seed):
    g = gen(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    q = torch.randn(shape(HQ), dtype=dtype, device=DEVICE, generator=g)
    k = torch.randn(shape(HK), dtype=dtype, device=DEVICE, generator=g)
    return q, k


# ---------------------------------------------------------------------------------------------
# apply_rotary: tables, layouts, GQA, partial rotary, interleaved, in place
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_rotary(head_dim, layout, interleaved, inplace, dtype):
    B, S, HQ, HK = 2, 5, 4, 2
    q, k = make_qk(B, S, HQ, HK, head_dim, dtype, layout, seed=head_dim)
    rotary_dim = head_dim if head_dim != 128 else 96  # partial rotary at 128
    angle = torch.rand(B, S, rotary_dim // 2, device=DEVICE, generator=gen(1)) * 40
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    ref_q = ref_rotate(to_bshd(q, layout), cos.double(), sin.double(), rotary_dim, interleaved)
    ref_k = ref_rotate(to_bshd(k, layout), cos.double(), sin.double(), rotary_dim, interleaved)
    qi, ki = q.clone(), k.clone()
    q_out, k_out = rt.apply_rotary(qi, ki, cos, sin, layout=layout, rotary_dim=rotary_dim, interleaved=interleaved, inplace=inplace)
    assert (q_out is qi) == inplace and (k_out is ki) == inplace
    if not inplace:
        assert torch.equal(qi, q) and torch.equal(ki, k), "inputs must not change"
    assert_rotary_close(to_bshd(q_out, layout), ref_q, q, "q")
    assert_rotary_close(to_bshd(k_out, layout), ref_k, k, "k")
    if rotary_dim < head_dim:  # the tail passes through bit for bit
        assert torch.equal(q_out[..., rotary_dim:], q[..., rotary_dim:])


@pytest.mark.parametrize("tokens", [1, 7, 64, 1024, 4096])
def test_gqa_32_8_tokens(tokens):
    if INTERPRETED and tokens > 64:
        pytest.skip("large token counts on the GPU only (the interpreter takes ~1 ms per program)")
    q, k = make_qk(1, tokens, 32, 8, 128, torch.bfloat16, "bhsd", seed=tokens)
    angle = torch.rand(tokens, 64, device=DEVICE, generator=gen(2)) * 100
    cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
    q_out, k_out = rt.apply_rotary(q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))  # full-width tables
    c, s = cos.double()[None], sin.double()[None]
    assert_rotary_close(to_bshd(q_out, "bhsd"), ref_rotate(to_bshd(q, "bhsd"), c, s, 128, False), q, "q")
    assert_rotary_close(to_bshd(k_out, "bhsd"), ref_rotate(to_bshd(k, "bhsd"), c, s, 128, False), k, "k")


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize(
    "block_s, block_hq, block_hk",
    [(1, 1, 1), (4, 2, 1), (8, 4, 2), (2, 8, 4), (16, 1, 2)],
)
def test_rotary_tile_configs(layout, block_s, block_hq, block_hk):
    """Token and head blocks the launcher can pick, on sizes none of them divide: token blocks
    that straddle two sequences of the batch, head blocks past the last q / kv head, a partial
    rotary tail and half-width position-indexed tables; output poisoned first."""
    _kernels = rt._triton_kernels()  # imported only where Triton runs

    B, S, HQ, HK, D, rotary_dim = 3, 7, 5, 3, 64, 48
    q, k = make_qk(B, S, HQ, HK, D, torch.bfloat16, layout, seed=block_s * 10 + block_hq)
    table = torch.rand(40, rotary_dim // 2, device=DEVICE, generator=gen(7)) * 30
    cos, sin = table.cos().bfloat16(), table.sin().bfloat16()
    pos = torch.randint(0, 40, (B, S), device=DEVICE, generator=gen(8))
    q4, k4 = to_bshd(q, layout), to_bshd(k, layout)
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    cfg = _kernels.RopeConfig(BLOCK_S=block_s, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, num_warps=2)
    _kernels.launch_rope(q4, k4, to_bshd(q_out, layout), to_bshd(k_out, layout), cos, sin, pos, None,
                         rotary_dim, False, False, "pos", cfg=cfg)  # fmt: skip
    c, s = cos.double()[pos], sin.double()[pos]
    assert_rotary_close(to_bshd(q_out, layout), ref_rotate(q4, c, s, rotary_dim, False), q, f"q {cfg}")
    assert_rotary_close(to_bshd(k_out, layout), ref_rotate(k4, c, s, rotary_dim, False), k, f"k {cfg}")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_position_ids_and_strided_qkv(interleaved):
    # q, k as views of a fused QKV projection output [B, S, (HQ + 2 HK) * D] (bshd, strided),
    # cos / sin tables [max_pos, D / 2] read at position_ids [B, S].
    B, S, HQ, HK, D = 2, 9, 4, 2, 64
    qkv = torch.randn(B, S, (HQ + 2 * HK) * D, dtype=torch.bfloat16, device=DEVICE, generator=gen(3))
    q = qkv[..., : HQ * D].view(B, S, HQ, D)
    k = qkv[..., HQ * D : (HQ + HK) * D].view(B, S, HK, D)
    assert not q.is_contiguous()
    table = torch.rand(100, D // 2, device=DEVICE, generator=gen(4)) * 50
    pos = torch.randint(0, 100, (B, S), device=DEVICE, generator=gen(5))
    q_out, k_out = rt.apply_rotary(q, k, table.cos(), table.sin(), position_ids=pos, layout="bshd", interleaved=interleaved)
    c, s = table.cos().double()[pos], table.sin().double()[pos]
    assert_rotary_close(q_out, ref_rotate(q, c, s, D, interleaved), q, "q")
    assert_rotary_close(k_out, ref_rotate(k, c, s, D, interleaved), k, "k")
    # In place into the fused buffer: v and everything else untouched.
    before = qkv.clone()
    rt.apply_rotary(q, k, table.cos(), table.sin(), position_ids=pos, layout="bshd", interleaved=interleaved, inplace=True)
    assert torch.equal(q, q_out) and torch.equal(k, k_out)
    assert torch.equal(qkv[..., (HQ + HK) * D :], before[..., (HQ + HK) * D :]), "v was written"


def test_zero_tokens():
    q, k = make_qk(2, 0, 4, 2, 64, torch.bfloat16, "bhsd", seed=6)
    q_out, k_out = rt.apply_rotary(q, k, torch.ones(0, 32, device=DEVICE), torch.ones(0, 32, device=DEVICE))
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("HQ, HK", [(0, 2), (4, 0), (0, 0)])
def test_zero_heads(HQ, HK):
    """q or k (or both) without heads: the other is rotated, nothing fails."""
    q, k = make_qk(2, 5, HQ, HK, 64, torch.bfloat16, "bhsd", seed=33)
    angle = torch.rand(2, 5, 32, device=DEVICE, generator=gen(34)) * 10
    cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
    q_out, k_out = rt.apply_rotary(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    c, s = cos.double(), sin.double()
    assert_rotary_close(to_bshd(q_out, "bhsd"), ref_rotate(to_bshd(q, "bhsd"), c, s, 64, False), q, "q")
    assert_rotary_close(to_bshd(k_out, "bhsd"), ref_rotate(to_bshd(k, "bhsd"), c, s, 64, False), k, "k")


def test_torch_path_matches_reference():
    # The plain-torch implementation (what the CPU variant runs without the interpreter).
    q, k = make_qk(2, 5, 4, 2, 64, torch.float32, "bhsd", seed=7)
    angle = torch.rand(2, 5, 32, device=DEVICE, generator=gen(8)) * 10
    q4, k4 = to_bshd(q, "bhsd"), to_bshd(k, "bhsd")
    qo, ko = torch.empty_like(q4), torch.empty_like(k4)
    rt._reference.rope(q4, k4, qo, ko, angle.cos(), angle.sin(), None, None, 64, False, False, "bs")
    assert_rotary_close(qo, ref_rotate(q4, angle.cos().double(), angle.sin().double(), 64, False), q, "q")


# ---------------------------------------------------------------------------------------------
# From positions (cos / sin computed in the kernel)
# ---------------------------------------------------------------------------------------------


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("scaling", [None, LLAMA3_SCALING], ids=["plain", "llama3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_positions(scaling, dtype):
    B, S, D = 2, 6, 128
    q, k = make_qk(B, S, 4, 2, D, dtype, "bhsd", seed=9)
    positions = torch.randint(0, 100_000, (B, S), device=DEVICE, generator=gen(10))
    q_out, k_out = rt.apply_rotary_from_positions(q, k, positions, 500_000.0, rope_scaling=scaling)
    inv = rt.inv_frequencies(D, 500_000.0, scaling).double().to(DEVICE)
    angle = positions.double()[..., None] * inv.float().double()  # the kernel multiplies in fp32
    angle = angle.float().double()
    c, s = angle.cos(), angle.sin()
    # cos / sin of fp32 angles up to 1e5 rad: libdevice is accurate to ~1 ulp of the result.
    assert_rotary_close(to_bshd(q_out, "bhsd"), ref_rotate(to_bshd(q, "bhsd"), c, s, D, False), q, "q")
    assert_rotary_close(to_bshd(k_out, "bhsd"), ref_rotate(to_bshd(k, "bhsd"), c, s, D, False), k, "k")


def test_inv_frequencies_match_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500_000.0, rope_scaling=dict(LLAMA3_SCALING))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    torch.testing.assert_close(rt.inv_frequencies(128, 500_000.0, LLAMA3_SCALING), expected, rtol=0, atol=0)
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=10_000.0)
    rope_init = ROPE_INIT_FUNCTIONS.get("default") or (lambda c, d: (1.0 / (10_000.0 ** (torch.arange(0, 128, 2).float() / 128)), 1.0))
    expected, _ = rope_init(config, "cpu")
    torch.testing.assert_close(rt.inv_frequencies(128, 10_000.0), expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# transformers' apply_rotary_pos_emb
# ---------------------------------------------------------------------------------------------


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' Llama apply_rotary_pos_emb, written out: the module-level function may have
    been swapped for ours by a kernelize call elsewhere in the process."""

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def _hf_tables(B, S, D, dtype, seed):
    angle = torch.rand(B, S, D // 2, device=DEVICE, generator=gen(seed)) * 200
    emb = torch.cat((angle, angle), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transformers_drop_in(unsqueeze_dim, dtype):
    layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
    q, k = make_qk(2, 11, 8, 2, 128, dtype, layout, seed=11)
    cos, sin = _hf_tables(2, 11, 128, dtype, seed=12)
    expected = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = rt.apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim)
    for g, e, name in zip(got, expected, ("q", "k")):
        assert g.shape == e.shape and g.dtype == e.dtype
        if dtype == torch.float32 or (dtype == torch.bfloat16 and TRUNCATES_BF16):
            # fp32: the GPU may fuse a multiply-add (one rounding fewer); the interpreter truncates bf16.
            torch.testing.assert_close(g, e, rtol=rtol_of(dtype) * 2, atol=rtol_of(dtype) * 4, msg=name)
        else:
            assert torch.equal(g, e), f"{name}: {(g != e).float().mean().item():.2%} differ from transformers"


def test_transformers_fallback_keeps_semantics():
    q, k = make_qk(1, 3, 2, 2, 64, torch.bfloat16, "bhsd", seed=13)
    cos, sin = _hf_tables(1, 3, 64, torch.float32, seed=14)  # fp32 tables: torch promotes to fp32
    got = rt.apply_rotary_transformers(q, k, cos, sin)
    expected = apply_rotary_pos_emb(q, k, cos, sin)
    assert got[0].dtype == expected[0].dtype == torch.float32
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.kernels_ci
def test_layer_matches_transformers():
    q, k = make_qk(2, 7, 4, 2, 64, torch.float16, "bhsd", seed=15)
    cos, sin = _hf_tables(2, 7, 64, torch.float16, seed=16)
    got = rt.layers.ApplyRotaryPosEmb()(q, k, cos, sin)
    expected = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


# ---------------------------------------------------------------------------------------------
# rms_norm_matmul_rope
# ---------------------------------------------------------------------------------------------


def ref_projection(x, g, w, eps, cos, sin, head_dim):
    """fp64: rope(linear(rms_norm(x)))."""
    xd = x.double().reshape(-1, x.shape[-1])
    y = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * g.double()) @ w.double().T
    y = y.view(y.shape[0], -1, head_dim)
    half = head_dim // 2
    c = cos.double().reshape(y.shape[0], -1)[:, None, :half]
    s = sin.double().reshape(y.shape[0], -1)[:, None, :half]
    lo, hi = y[..., :half], y[..., half:]
    return torch.cat((lo * c - hi * s, hi * c + lo * s), -1).view(*x.shape[:-1], -1)


def assert_projection_close(got, ref, name):
    # bf16 operands with fp32 accumulation: errors of a few bf16 ulps of the output scale.
    scale = ref.abs().max().item()
    err = (got.double() - ref).abs().max().item()
    assert err <= 2e-2 * scale, f"{name}: max |error| {err:.3g} > 2% of max |ref| {scale:.3g}"


PROJ_M = [1, 7, 64, 100] + ([1000, 4096] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("M", PROJ_M)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("impl", ["auto", "fused", "unfused"])
def test_rms_norm_matmul_rope(M, head_dim, dtype, impl):
    K = 512 if DEVICE == "cpu" else 4096
    heads = 4 if DEVICE == "cpu" else 40  # 32 q + 8 k heads of a Llama-3 8B layer
    g = gen(M + head_dim)
    x = torch.randn(M, K, dtype=dtype, device=DEVICE, generator=g)
    rms_w = (1 + 0.1 * torch.randn(K, device=DEVICE, generator=g)).to(dtype)
    w = (torch.randn(heads * head_dim, K, device=DEVICE, generator=g) / K**0.5).to(dtype)
    cos, sin = _hf_tables(1, M, head_dim, dtype, seed=M)
    cos, sin = cos[0], sin[0]
    got = rt.rms_norm_matmul_rope(x, rms_w, w, 1e-5, cos, sin, impl=impl)
    ref = ref_projection(x, rms_w, w, 1e-5, cos, sin, head_dim)
    assert got.shape == (M, heads * head_dim) and got.dtype == dtype
    assert_projection_close(got, ref, impl)
    # The unfused plain-torch sequence is held to the same bound (it is the CPU variant's path).
    out = torch.empty_like(got)
    rt._reference.rms_matmul_rope(x, rms_w, w, cos, sin, out, 1e-5, head_dim)
    assert_projection_close(out, ref, "unfused torch")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("impl", ["fused", "unfused"])
def test_rms_norm_matmul_rope_ci(impl):
    test_rms_norm_matmul_rope(7, 128, torch.bfloat16, impl)


@pytest.mark.parametrize("M", PROJ_M)
@pytest.mark.parametrize("impl", ["auto", "fused", "unfused"])
def test_rms_norm_matmul_rope_folded_weight(M, impl):
    """rms_weight=None with fold_rms_weight(w, rms_weight) as w: the same projection (held to
    the fp64 result of the unfolded weights), through the folded kernel configurations."""
    K = 512 if DEVICE == "cpu" else 4096
    heads, head_dim, dtype = (4 if DEVICE == "cpu" else 40), 128, torch.bfloat16
    g = gen(M + 7)
    x = torch.randn(M, K, dtype=dtype, device=DEVICE, generator=g)
    rms_w = (1 + 0.1 * torch.randn(K, device=DEVICE, generator=g)).to(dtype)
    w = (torch.randn(heads * head_dim, K, device=DEVICE, generator=g) / K**0.5).to(dtype)
    cos, sin = _hf_tables(1, M, head_dim, dtype, seed=M + 1)
    cos, sin = cos[0], sin[0]
    w_folded = rt.fold_rms_weight(w, rms_w)
    assert w_folded.dtype == dtype and w_folded.shape == w.shape
    torch.testing.assert_close(w_folded.double(), w.double() * rms_w.double(), rtol=2**-8, atol=0)
    got = rt.rms_norm_matmul_rope(x, None, w_folded, 1e-5, cos, sin, impl=impl)
    assert_projection_close(got, ref_projection(x, rms_w, w, 1e-5, cos, sin, head_dim), f"folded {impl}")


@pytest.mark.kernels_ci
def test_rms_norm_matmul_rope_folded_ci():
    test_rms_norm_matmul_rope_folded_weight(7, "fused")


def _launch_twice(x, g, w, cos, sin, head_dim: int, cfg, ref) -> None:
    """The projection kernel under ``cfg`` twice into NaN-poisoned outputs, each checked against
    ``ref``: the split-K and share counters must be left at zero for the next call."""
    _kernels = rt._triton_kernels()  # imported only where Triton runs
    for _ in range(2):
        out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        _kernels.launch_rms_matmul_rope(x, g, w, cos, sin, out, 1e-5, head_dim, cfg=cfg)
        assert_projection_close(out, ref, f"config {cfg}")
    counters = _kernels._COUNTERS.get(x.device)
    assert counters is None or int(counters.abs().sum()) == 0


def _projection_case(M: int, K: int, n_heads: int, head_dim: int, seed: int):
    """Projection inputs (bf16 x, an RMSNorm weight near 1, W scaled to unit-variance outputs,
    transformers' cos / sin rows) and the fp64 reference of the unfolded weights."""
    x = torch.randn(M, K, dtype=torch.bfloat16, device=DEVICE)
    rms_w = (1 + 0.1 * torch.randn(K, device=DEVICE)).bfloat16()
    w = (torch.randn(n_heads * head_dim, K, device=DEVICE) / K**0.5).bfloat16()
    cos, sin = _hf_tables(1, M, head_dim, torch.bfloat16, seed=seed)
    cos, sin = cos[0], sin[0]
    return x, rms_w, w, cos, sin, ref_projection(x, rms_w, w, 1e-5, cos, sin, head_dim)


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize(
    "block_m, block_nh, block_k, split, group, folded, squares_mma",
    [(16, 16, 64, 1, 1, False, False), (16, 16, 64, 3, 1, False, False), (16, 32, 128, 2, 1, False, False),
     (32, 64, 64, 1, 1, False, False), (64, 16, 128, 8, 1, False, False), (16, 64, 64, 1, 2, False, False),
     (16, 16, 64, 3, 1, True, False), (64, 64, 128, 2, 1, True, True), (32, 32, 64, 1, 2, True, True),
     (16, 32, 64, 2, 1, False, True), (16, 32, 256, 1, 1, True, True), (64, 32, 128, 1, 2, True, True)],
)  # fmt: skip
def test_rms_norm_matmul_rope_tile_configs(block_m, block_nh, block_k, split, group, folded, squares_mma):
    """Every tile shape and K split the launcher can pick (narrow half-head tiles, whole heads,
    uneven splits, grouped tile order with a partial last group; the RMSNorm weight folded
    into W or not; x^2 summed in registers or on the MMA as diag(x x^T)), each called twice:
    the split-K arrival counters must be left reset for the next call."""
    M, K, head_dim, n_heads = 37, 448, 128, 4
    x, rms_w, w, cos, sin, ref = _projection_case(M, K, n_heads, head_dim, seed=3)
    cfg = rt._triton_kernels().RmsMatmulRopeConfig(BLOCK_M=block_m, BLOCK_NH=block_nh, BLOCK_K=block_k, SPLIT_K=split,
                                                   GROUP_M=group, SQUARES_MMA=squares_mma, num_warps=4, num_stages=2)  # fmt: skip
    g_arg, w_arg = (None, rt.fold_rms_weight(w, rms_w)) if folded else (rms_w, w)
    _launch_twice(x, g_arg, w_arg, cos, sin, head_dim, cfg, ref)


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize(
    "block_m, heads, head_dim, n_heads, block_k, group, folded, squares_mma",
    [(16, 1, 128, 4, 64, 1, False, False), (32, 2, 128, 5, 64, 2, True, False), (16, 2, 64, 3, 128, 1, True, True),
     (64, 4, 64, 6, 64, 8, False, True), (16, 1, 256, 2, 64, 1, True, False)],
)  # fmt: skip
def test_rms_norm_matmul_rope_whole_head_tiles(block_m, heads, head_dim, n_heads, block_k, group, folded, squares_mma):
    """The prefill kernel's whole-head tiles (`_rms_matmul_rope_heads_kernel`): 1, 2 or 4 heads
    a tile, a partial last column tile (5 heads in tiles of 2), rows and K not multiples of the
    tile (37 tokens, K 448), grouped order with a partial last group, the RMSNorm weight folded
    or not, x^2 in registers or on the MMA."""
    x, rms_w, w, cos, sin, ref = _projection_case(37, 448, n_heads, head_dim, seed=5)
    cfg = rt._triton_kernels().RmsMatmulRopeHeadsConfig(BLOCK_M=block_m, HEADS=heads, BLOCK_K=block_k, GROUP_M=group,
                                                        SQUARES_MMA=squares_mma, num_warps=4, num_stages=2)  # fmt: skip
    g_arg, w_arg = (None, rt.fold_rms_weight(w, rms_w)) if folded else (rms_w, w)
    _launch_twice(x, g_arg, w_arg, cos, sin, head_dim, cfg, ref)


@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernel's tile configurations")
@pytest.mark.parametrize(
    "M, K, block_m, heads, head_dim, n_heads, programs",
    [(37, 448, 16, 2, 64, 5, None), (37, 448, 16, 2, 64, 5, 4), (37, 448, 16, 2, 64, 5, 7),
     (70, 320, 32, 1, 128, 3, 7), (300, 1024, 64, 2, 128, 10, 11), (64, 256, 16, 4, 32, 4, 2)],
)  # fmt: skip
def test_rms_norm_matmul_rope_persistent(M, K, block_m, heads, head_dim, n_heads, programs):
    """The persistent prefill kernel (`_rms_matmul_rope_persistent_kernel`): x^2 shared out over
    the first round's tiles (1 to 3 shares a row block), programs that do not divide the tiles,
    rows and K not multiples of the tile, a partial last column tile; and more row blocks than
    programs (the launcher falls back to per-tile x^2). Programs are not all resident in the
    interpreter (one at a time): there the waits give up and sum the rows from x, so both ways
    to the RMS statistics run. Each config twice: every counter must be left at zero."""
    x, rms_w, w, cos, sin, ref = _projection_case(M, K, n_heads, head_dim, seed=7)
    cfg = rt._triton_kernels().RmsMatmulRopePersistentConfig(BLOCK_M=block_m, HEADS=heads, BLOCK_K=64, num_warps=4,
                                                             num_stages=2, PROGRAMS=programs)  # fmt: skip
    _launch_twice(x, None, rt.fold_rms_weight(w, rms_w), cos, sin, head_dim, cfg, ref)


# ---------------------------------------------------------------------------------------------
# Launch configurations: representative picks, the override rule, bad configurations
# ---------------------------------------------------------------------------------------------

NEEDS_TRITON = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton launchers' configurations")


@NEEDS_TRITON
@pytest.mark.kernels_ci
def test_picked_configs():
    """A few picks pinned (the tuned H100 choices of `rope_config` / `rms_matmul_rope_config`;
    tma=False is sm80's and gfx942's choice): a change here changes what runs on the GPU."""
    kern = rt._triton_kernels()
    Rope, Tiles = kern.RopeConfig, kern.RmsMatmulRopeConfig
    Heads, Persistent = kern.RmsMatmulRopeHeadsConfig, kern.RmsMatmulRopePersistentConfig
    assert kern.rope_config(1, 32, 64) == Rope(BLOCK_S=1, BLOCK_HQ=1, BLOCK_HK=1, num_warps=1, COS_FIRST=False)
    assert kern.rope_config(8, 32, 64) == Rope(BLOCK_S=8, BLOCK_HQ=2, BLOCK_HK=1, num_warps=2, COS_FIRST=True)
    assert kern.rope_config(4096, 32, 64) == Rope(BLOCK_S=32, BLOCK_HQ=2, BLOCK_HK=1, num_warps=8, COS_FIRST=True)
    pick = kern.rms_matmul_rope_config
    assert pick(1, 4096, 128, folded=True, tma=True) == Tiles(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=256, SQUARES_MMA=True,
                                                             USE_TMA=True)  # fmt: skip
    assert pick(64, 4096, 128, folded=True, tma=True) == Tiles(BLOCK_M=64, BLOCK_NH=32, BLOCK_K=128, SQUARES_MMA=True,
                                                              USE_TMA=True, num_stages=6)  # fmt: skip
    assert pick(1024, 4096, 128, folded=True, tma=True) == Heads(BLOCK_M=64, HEADS=2, BLOCK_K=64, GROUP_M=16,
                                                                SQUARES_MMA=True, USE_TMA=True, num_stages=5)  # fmt: skip
    assert pick(4096, 4096, 128, folded=True, tma=True) == Persistent(BLOCK_M=128, HEADS=2, BLOCK_K=64, USE_TMA=True,
                                                                     num_warps=8, num_stages=3)  # fmt: skip
    assert pick(1, 4096, 128, folded=False, tma=False) == Tiles(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=128, SPLIT_K=4,
                                                               USE_TMA=False)  # fmt: skip
    # head_dim 64: half-head tiles narrowed to 32 columns; K 256: the split capped at half the K steps
    assert pick(1, 256, 64, folded=True, tma=False) == Tiles(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=128, USE_TMA=False)
    # head_dim 96 (not a power of two): no whole-head tiles, even on sm90
    assert pick(1024, 4096, 96, folded=True, tma=True) == Tiles(BLOCK_M=64, BLOCK_NH=16, BLOCK_K=64, GROUP_M=8,
                                                               SQUARES_MMA=True, USE_TMA=True, num_stages=3)  # fmt: skip


@NEEDS_TRITON
@pytest.mark.kernels_ci
def test_config_override_replaces_the_pick_whole(monkeypatch):
    """The rotary launcher launches a caller's configuration as it is, nothing of the pick merged
    in; one made with dataclasses.replace from the pick differs only in the fields it names."""
    kern = rt._triton_kernels()
    kern._ROPE_PLANS.entries.clear()  # no launch plan of an earlier test: every call goes through the JIT
    launched = []
    launch_and_plan = type(kern._ROPE_PLANS).launch_and_plan

    def spy(self, key, grid, varying, args, kwargs):
        launched.append(kwargs)
        return launch_and_plan(self, key, grid, varying, args, kwargs)

    monkeypatch.setattr(type(kern._ROPE_PLANS), "launch_and_plan", spy)
    B, S, HQ, HK, D = 1, 9, 4, 2, 64
    q, k = make_qk(B, S, HQ, HK, D, torch.bfloat16, "bshd", seed=30)
    angle = torch.rand(1, S, D // 2, device=DEVICE, generator=gen(31)) * 10
    cos, sin = angle.cos(), angle.sin()
    picked = kern.rope_config(B * S, HQ, D // 2)
    mine = dataclasses.replace(picked, BLOCK_S=2, BLOCK_HQ=4, num_warps=1, COS_FIRST=not picked.COS_FIRST)
    assert mine.BLOCK_HK == picked.BLOCK_HK
    for cfg in (None, mine):
        q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
        kern.launch_rope(q, k, q_out, k_out, cos, sin, None, None, D, False, False, "bs", cfg=cfg)
        assert_rotary_close(q_out, ref_rotate(q, cos.double(), sin.double(), D, False), q, f"q {cfg}")
        assert_rotary_close(k_out, ref_rotate(k, cos.double(), sin.double(), D, False), k, f"k {cfg}")
    assert len(launched) == 2
    for kwargs, cfg in zip(launched, (picked, mine)):
        assert {name: kwargs[name] for name in cfg.launch_kwargs()} == cfg.launch_kwargs()


def _bad_config_cases():
    kern = rt._triton_kernels()
    x, rms_w, w, cos, sin, _ = _projection_case(5, 256, 2, 64, seed=9)
    tiles = kern.RmsMatmulRopeConfig(BLOCK_M=16, BLOCK_NH=32, BLOCK_K=64)

    def project(cfg, g=rms_w, ww=w, head_dim=64):
        out = torch.full((x.shape[0], ww.shape[0]), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        try:
            kern.launch_rms_matmul_rope(x, g, ww, cos, sin, out, 1e-5, head_dim, cfg=cfg)
        finally:
            assert out.isnan().all(), "a rejected configuration wrote the output"

    def rotary(cfg):
        q, k = make_qk(1, 4, 2, 2, 64, torch.bfloat16, "bshd", seed=32)
        kern.launch_rope(q, k, q.clone(), k.clone(), cos[None, :4, :32], sin[None, :4, :32], None, None, 64, False,
                         False, "bs", cfg=cfg)  # fmt: skip

    return [
        ("BLOCK_S not a power of two", lambda: kern.RopeConfig(BLOCK_S=3, BLOCK_HQ=1, BLOCK_HK=1), ValueError,
         r"RopeConfig.BLOCK_S: expected a power of two >= 1, got 3"),
        ("COS_FIRST not a bool", lambda: kern.RopeConfig(BLOCK_S=4, BLOCK_HQ=1, BLOCK_HK=1, COS_FIRST=1), TypeError,
         "RopeConfig.COS_FIRST: expected True or False, got 1"),
        ("BLOCK_M below a dot's 16", lambda: kern.RmsMatmulRopeConfig(BLOCK_M=8, BLOCK_NH=16, BLOCK_K=64), ValueError,
         "RmsMatmulRopeConfig.BLOCK_M: expected a power of two >= 16, got 8"),
        ("SPLIT_K 0", lambda: dataclasses.replace(tiles, SPLIT_K=0), ValueError,
         "RmsMatmulRopeConfig.SPLIT_K: expected an int >= 1, got 0"),
        ("num_stages float", lambda: dataclasses.replace(tiles, num_stages=2.0), TypeError,
         "RmsMatmulRopeConfig.num_stages: expected an int, got 2.0"),
        ("USE_TMA string", lambda: dataclasses.replace(tiles, USE_TMA="no"), TypeError,
         "RmsMatmulRopeConfig.USE_TMA: expected True, False or None"),
        ("PROGRAMS 0", lambda: kern.RmsMatmulRopePersistentConfig(BLOCK_M=16, HEADS=1, BLOCK_K=64, PROGRAMS=0),
         ValueError, "RmsMatmulRopePersistentConfig.PROGRAMS: expected an int >= 1, got 0"),
        ("frozen", lambda: setattr(tiles, "BLOCK_M", 32), dataclasses.FrozenInstanceError, "BLOCK_M"),
        ("rotary cfg a dict", lambda: rotary({"BLOCK_S": 4}), TypeError,
         r"cfg: expected a RopeConfig \(it replaces the picked configuration whole.*got dict"),
        ("projection cfg a dict", lambda: project({"BLOCK_M": 16}), TypeError,
         "cfg: expected a RmsMatmulRopeConfig or RmsMatmulRopeHeadsConfig or RmsMatmulRopePersistentConfig"),
        ("projection cfg of the rotary kernel", lambda: project(kern.RopeConfig(BLOCK_S=1, BLOCK_HQ=1, BLOCK_HK=1)),
         TypeError, "cfg: expected a RmsMatmulRopeConfig.*got RopeConfig"),
        ("BLOCK_NH past half a head", lambda: project(dataclasses.replace(tiles, BLOCK_NH=64)), ValueError,
         r"cfg: RmsMatmulRopeConfig.BLOCK_NH must divide head_dim / 2 = 32, got 64"),
        ("whole heads of 96", lambda: project(kern.RmsMatmulRopeHeadsConfig(BLOCK_M=16, HEADS=1, BLOCK_K=64),
                                              ww=w[:96], head_dim=96), ValueError,
         "cfg: RmsMatmulRopeHeadsConfig \\(whole-head tiles\\) needs a power-of-two head_dim, got 96"),
        ("persistent with g", lambda: project(kern.RmsMatmulRopePersistentConfig(BLOCK_M=16, HEADS=1, BLOCK_K=64)),
         ValueError, "cfg: RmsMatmulRopePersistentConfig takes the RMSNorm weight folded into w"),
    ]  # fmt: skip


BAD_CONFIGS = [
    "BLOCK_S not a power of two", "COS_FIRST not a bool", "BLOCK_M below a dot's 16", "SPLIT_K 0", "num_stages float",
    "USE_TMA string", "PROGRAMS 0", "frozen", "rotary cfg a dict", "projection cfg a dict",
    "projection cfg of the rotary kernel", "BLOCK_NH past half a head", "whole heads of 96", "persistent with g",
]  # fmt: skip


@NEEDS_TRITON
@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_config(name):
    cases = {case[0]: case[1:] for case in _bad_config_cases()}
    assert sorted(cases) == sorted(BAD_CONFIGS)
    call, exc, match = cases[name]
    with pytest.raises(exc, match=match):
        call()


# Triton's interpreter (numpy) warns where a tile's padding rows (x all zero there) divide by
# sqrt(0): those rows are never stored.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_rms_norm_matmul_rope_eps_zero():
    """eps = 0 is accepted, as the other packages' RMSNorms accept it (rows of x not all zero)."""
    x, rms_w, w, cos, sin, _ = _projection_case(3, 256, 2, 64, seed=11)
    ref = ref_projection(x, rms_w, w, 0.0, cos, sin, 64)
    for impl in ("fused", "unfused"):
        assert_projection_close(rt.rms_norm_matmul_rope(x, rms_w, w, 0.0, cos, sin, impl=impl), ref, f"eps 0 {impl}")


def test_rms_norm_matmul_rope_leading_dims_and_half_tables():
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16, device=DEVICE)
    rms_w = torch.ones(256, dtype=torch.bfloat16, device=DEVICE)
    w = (torch.randn(2 * 64, 256, device=DEVICE) / 16).bfloat16()
    angle = torch.rand(2, 3, 32, device=DEVICE) * 5
    got = rt.rms_norm_matmul_rope(x, rms_w, w, 1e-6, angle.cos(), angle.sin(), head_dim=64)
    assert got.shape == (2, 3, 128)
    full = torch.cat([angle, angle], -1)
    assert_projection_close(got, ref_projection(x, rms_w, w, 1e-6, full.cos(), full.sin(), 64), "fused")
    assert rt.rms_norm_matmul_rope(x[:, :0], rms_w, w, 1e-6, angle[:, :0].cos(), angle[:, :0].sin(), head_dim=64).shape == (2, 0, 128)


@pytest.mark.parametrize("impl", ["fused", "unfused"])
def test_rms_norm_matmul_rope_strided_rms_weight(impl):
    """An RMSNorm weight that is a strided view (every other element of a buffer) is read by
    its values, not as if it were contiguous."""
    x, rms_w, w, cos, sin, ref = _projection_case(5, 256, 2, 64, seed=5)
    buf = torch.stack([rms_w, torch.full_like(rms_w, 7.0)], dim=1).reshape(-1)  # rms_w at even offsets
    strided = buf[::2]
    assert strided.stride() == (2,) and torch.equal(strided, rms_w)
    out = rt.rms_norm_matmul_rope(x, strided, w, 1e-5, cos, sin, head_dim=64, impl=impl)
    assert_projection_close(out, ref, impl)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the argument, before anything is written
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    q, k = make_qk(1, 4, 2, 2, 64, torch.bfloat16, "bhsd", seed=17)
    c = torch.ones(4, 32, dtype=torch.bfloat16, device=DEVICE)
    x = torch.randn(4, 256, dtype=torch.bfloat16, device=DEVICE)
    g = torch.ones(256, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(128, 256, dtype=torch.bfloat16, device=DEVICE)
    fc = torch.ones(4, 64, dtype=torch.bfloat16, device=DEVICE)
    pos = torch.zeros(4, dtype=torch.long, device=DEVICE)
    return [
        ("q dtype", lambda: rt.apply_rotary(q.int(), k, c, c), TypeError, "q: expected dtype"),
        ("q dims", lambda: rt.apply_rotary(q[0], k, c, c), ValueError, "q: expected a 4-D"),
        ("k head_dim", lambda: rt.apply_rotary(q, k[..., :32], c, c), ValueError, "k: expected batch, sequence and head_dim"),
        ("k dtype", lambda: rt.apply_rotary(q, k.half(), c, c), TypeError, "k: expected dtype"),
        ("head dim stride", lambda: rt.apply_rotary(q.transpose(2, 3), k.transpose(2, 3), c, c), ValueError, "q: the head dimension must be contiguous"),
        ("layout", lambda: rt.apply_rotary(q, k, c, c, layout="sbhd"), ValueError, "layout: expected"),
        ("rotary_dim odd", lambda: rt.apply_rotary(q, k, c, c, rotary_dim=33), ValueError, "rotary_dim: expected an even int"),
        ("rotary_dim too big", lambda: rt.apply_rotary(q, k, c, c, rotary_dim=128), ValueError, "rotary_dim"),
        ("cos width", lambda: rt.apply_rotary(q, k, c[:, :10], c, rotary_dim=64), ValueError, "cos: expected a last dimension"),
        ("cos rows", lambda: rt.apply_rotary(q, k, c[:3], c[:3]), ValueError, "cos: expected shape"),
        ("sin shape", lambda: rt.apply_rotary(q, k, c, c[:3]), ValueError, "sin: expected the shape of cos"),
        ("position_ids dtype", lambda: rt.apply_rotary(q, k, c, c, position_ids=torch.zeros(4, device=DEVICE)), TypeError, "position_ids: expected dtype"),
        ("position_ids shape", lambda: rt.apply_rotary(q, k, c, c, position_ids=torch.zeros(5, dtype=torch.long, device=DEVICE)), ValueError, "position_ids: expected shape"),
        ("positions shape", lambda: rt.apply_rotary_from_positions(q, k, torch.zeros(3, dtype=torch.long, device=DEVICE)), ValueError, "positions: expected shape"),
        ("theta", lambda: rt.apply_rotary_from_positions(q, k, torch.zeros(4, dtype=torch.long, device=DEVICE), 0.5), ValueError, "theta: expected"),
        ("scaling kind", lambda: rt.apply_rotary_from_positions(q, k, torch.zeros(4, dtype=torch.long, device=DEVICE), rope_scaling={"rope_type": "yarn"}), ValueError, "rope_scaling: only"),
        ("x dtype", lambda: rt.rms_norm_matmul_rope(x.float(), g, w, 1e-6, fc, fc), TypeError, "x: expected dtype"),
        ("rms_weight shape", lambda: rt.rms_norm_matmul_rope(x, g[:100], w, 1e-6, fc, fc), ValueError, "rms_weight: expected shape"),
        ("w shape", lambda: rt.rms_norm_matmul_rope(x, g, w[:, :100], 1e-6, fc, fc), ValueError, "w: expected shape"),
        ("w dtype", lambda: rt.rms_norm_matmul_rope(x, g, w.half(), 1e-6, fc, fc), TypeError, "w: expected dtype"),
        ("w heads", lambda: rt.rms_norm_matmul_rope(x, g, w[:100], 1e-6, fc, fc), ValueError, "w: expected N = 100"),
        ("head_dim", lambda: rt.rms_norm_matmul_rope(x, g, w, 1e-6, fc, fc, head_dim=48), ValueError, "head_dim: expected a multiple of 32"),
        ("impl", lambda: rt.rms_norm_matmul_rope(x, g, w, 1e-6, fc, fc, impl="cublas"), ValueError, "impl: expected one of"),
        ("cos rows fused", lambda: rt.rms_norm_matmul_rope(x, g, w, 1e-6, fc[:3], fc[:3]), ValueError, "cos: expected one row per token"),
        ("cos width fused", lambda: rt.rms_norm_matmul_rope(x, g, w, 1e-6, fc[:, :40], fc[:, :40], head_dim=64), ValueError, "cos, sin: expected equal shapes"),
        ("w dtype folded", lambda: rt.rms_norm_matmul_rope(x, None, w.half(), 1e-6, fc, fc), TypeError, "w: expected dtype"),
        ("fold w dims", lambda: rt.fold_rms_weight(w[0], g), ValueError, "w: expected shape"),
        ("fold rms_weight shape", lambda: rt.fold_rms_weight(w, g[:100]), ValueError, r"rms_weight: expected shape \(256,\)"),
        ("fold rms_weight dtype", lambda: rt.fold_rms_weight(w, g.int()), TypeError, "rms_weight: expected dtype"),
        ("eps negative", lambda: rt.rms_norm_matmul_rope(x, g, w, -1e-6, fc, fc), ValueError, "eps: expected a finite float >= 0, got -1e-06"),
        ("eps nan", lambda: rt.rms_norm_matmul_rope(x, g, w, float("nan"), fc, fc), ValueError, "eps: expected a finite float >= 0, got nan"),
        ("eps inf", lambda: rt.rms_norm_matmul_rope(x, None, w, float("inf"), fc, fc, impl="unfused"), ValueError, "eps: expected a finite float >= 0"),
        ("eps type", lambda: rt.rms_norm_matmul_rope(x, g, w, "1e-6", fc, fc), TypeError, "eps: expected a float, got str"),
        ("eps tensor", lambda: rt.rms_norm_matmul_rope(x, g, w, torch.tensor(1e-6), fc, fc), TypeError, "eps: expected a float, got Tensor"),
        ("interleaved type", lambda: rt.apply_rotary(q, k, c, c, interleaved=1), TypeError, "interleaved: expected True or False, got 1"),
        ("inplace type", lambda: rt.apply_rotary(q, k, c, c, inplace="yes"), TypeError, "inplace: expected True or False, got 'yes'"),
        ("positions interleaved type", lambda: rt.apply_rotary_from_positions(q, k, pos, interleaved=None), TypeError, "interleaved: expected True or False"),
        ("theta inf", lambda: rt.apply_rotary_from_positions(q, k, pos, float("inf")), ValueError, "theta: expected a finite number > 1, got inf"),
        ("scaling type", lambda: rt.apply_rotary_from_positions(q, k, pos, rope_scaling=[("rope_type", "llama3")]), TypeError, "rope_scaling: expected a dict or None, got list"),
        ("scaling keys", lambda: rt.apply_rotary_from_positions(q, k, pos, rope_scaling={"rope_type": "llama3", "factor": 8.0}), ValueError, r"rope_scaling: expected the llama3 keys .*missing \['low_freq_factor'"),
        ("scaling values", lambda: rt.apply_rotary_from_positions(q, k, pos, rope_scaling={**LLAMA3_SCALING, "factor": -8.0}), ValueError, "rope_scaling: expected finite numbers > 0, got {'factor': -8.0}"),
        ("scaling band", lambda: rt.apply_rotary_from_positions(q, k, pos, rope_scaling={**LLAMA3_SCALING, "high_freq_factor": 1.0}), ValueError, "rope_scaling: expected high_freq_factor > low_freq_factor"),
        ("inv_frequencies rotary_dim", lambda: rt.inv_frequencies(63), ValueError, "rotary_dim: expected an even int >= 2, got 63"),
        ("inv_frequencies theta", lambda: rt.inv_frequencies(64, 0.5), ValueError, "theta: expected a finite number > 1, got 0.5"),
        ("inv_frequencies scaling", lambda: rt.inv_frequencies(64, rope_scaling={"rope_type": "yarn"}), ValueError, "rope_scaling: only rope_type 'llama3'"),
        ("triton_enabled_for", lambda: rt.triton_enabled_for([1.0]), TypeError, "t: expected a torch.Tensor, got list"),
    ]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


def test_rejected_inplace_call_writes_nothing():
    q, k = make_qk(1, 4, 2, 2, 64, torch.bfloat16, "bhsd", seed=18)
    before = q.clone()
    with pytest.raises(ValueError, match="cos: expected shape"):
        rt.apply_rotary(q, k, torch.ones(3, 32, device=DEVICE), torch.ones(3, 32, device=DEVICE), inplace=True)
    assert torch.equal(q, before)


# ---------------------------------------------------------------------------------------------
# torch.library contract and torch.compile
# ---------------------------------------------------------------------------------------------


def _opcheck_cases():
    q = torch.randn(2, 3, 4, 64, device=DEVICE)
    k = torch.randn(2, 3, 2, 64, device=DEVICE)
    c = torch.rand(1, 3, 32, device=DEVICE)
    x = torch.randn(5, 128, dtype=torch.bfloat16, device=DEVICE)
    cases = {
        "rotary": (rt.ops.rotary, (q, k, torch.empty_like(q), torch.empty_like(k), c.cos(), c.sin(), None, None, 64, False, False, "bs")),
        "rotary_": (rt.ops.rotary_, (q.clone(), k.clone(), c.cos(), c.sin(), None, None, 64, True, "bs")),
    }
    for impl in ("fused", "unfused"):
        for folded in (False, True):
            rms_w = None if folded else torch.ones(128, dtype=torch.bfloat16, device=DEVICE)
            cases[f"rms_norm_matmul_rope_{impl}{'_folded' if folded else ''}"] = (
                rt.ops.rms_norm_matmul_rope,
                (torch.empty(5, 128, dtype=torch.bfloat16, device=DEVICE), x, rms_w,
                 torch.randn(128, 128, dtype=torch.bfloat16, device=DEVICE) / 12, torch.ones(5, 64, device=DEVICE),
                 torch.zeros(5, 64, device=DEVICE), 1e-6, 64, impl),
            )  # fmt: skip
    return cases


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_opcheck(name):
    opcheck(*_opcheck_cases()[name])


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph():
    q, k = make_qk(2, 5, 4, 2, 64, torch.float32, "bhsd", seed=19)
    cos, sin = _hf_tables(2, 5, 64, torch.float32, seed=20)
    positions = torch.arange(5, device=DEVICE)

    def block(q, k, cos, sin, positions):
        a = rt.apply_rotary_transformers(q, k, cos, sin)
        b = rt.apply_rotary(q, k, cos, sin)
        c = rt.apply_rotary_from_positions(q, k, positions)
        return a[0] + 1, b[1] * 2, c[0], rt.layers.ApplyRotaryPosEmb()(q, k, cos, sin)[1]

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    # Same kernels either way; Triton may specialize them differently for the buffers the
    # compiled graph allocates (alignment), and an fp32 multiply-add may then contract: 1 ulp.
    for got, expected in zip(compiled(q, k, cos, sin, positions), block(q, k, cos, sin, positions)):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph_projection():
    """The fused projection, with the RMSNorm weight passed and folded, traced without breaks."""
    M, K, head_dim = 6, 256, 64
    x = torch.randn(M, K, dtype=torch.bfloat16, device=DEVICE)
    rms_w = (1 + 0.1 * torch.randn(K, device=DEVICE)).bfloat16()
    w = (torch.randn(2 * head_dim, K, device=DEVICE) / 16).bfloat16()
    w_folded = rt.fold_rms_weight(w, rms_w)
    cos, sin = _hf_tables(1, M, head_dim, torch.bfloat16, seed=21)
    cos, sin = cos[0], sin[0]

    def block(x, cos, sin):
        a = rt.rms_norm_matmul_rope(x, rms_w, w, 1e-6, cos, sin)
        b = rt.rms_norm_matmul_rope(x, None, w_folded, 1e-6, cos, sin, impl="fused")
        return a * 2, b + 1

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for got, expected in zip(compiled(x, cos, sin), block(x, cos, sin)):
        torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# Repeated call signatures: launch plans, the fast path of apply_rotary_transformers, CUDA graphs
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_repeated_calls_match_transformers(unsqueeze_dim):
    # The first call of a signature goes through the checks and the JIT and makes a plan; the
    # later ones (fresh tensors, same shapes) reuse it. An unaligned view (another signature:
    # Triton specializes pointers on 16-byte alignment) and a decode-shaped call interleave.
    layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
    dtype = torch.bfloat16
    for seed in range(4):
        for B, S in ((1, 1), (2, 5)):
            q, k = make_qk(B, S, 8, 2, 128, dtype, layout, seed=100 + seed)
            if seed % 2:  # q, k start 2 bytes into a buffer: not 16-byte aligned
                q = torch.cat([q.new_zeros(1), q.flatten()])[1:].view(q.shape)
            cos, sin = _hf_tables(B, S, 128, dtype, seed=200 + seed)
            expected = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
            got = rt.apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim)
            for g, e in zip(got, expected):
                if TRUNCATES_BF16:
                    torch.testing.assert_close(g, e, rtol=rtol_of(dtype) * 2, atol=rtol_of(dtype) * 4)
                else:
                    assert torch.equal(g, e)


@pytest.mark.kernels_ci
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs and streams")
def test_cuda_graph_capture_and_side_stream():
    dtype = torch.bfloat16
    q, k = make_qk(1, 1, 32, 8, 128, dtype, "bshd", seed=300)
    cos, sin = _hf_tables(1, 1, 128, dtype, seed=301)
    expected = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (makes the plan) on a non-default stream
        for _ in range(3):
            got = rt.apply_rotary_transformers(q, k, cos, sin, 2)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rt.apply_rotary_transformers(q, k, cos, sin, 2)
    new_q, new_k = make_qk(1, 1, 32, 8, 128, dtype, "bshd", seed=302)
    q.copy_(new_q)
    k.copy_(new_k)
    graph.replay()
    torch.cuda.synchronize()
    expected = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    assert torch.equal(captured[0], expected[0]) and torch.equal(captured[1], expected[1])
