"""FP8 models end to end (fused_llm.fp8, fused_llm.decoder_fp8): quantize_fp8 on Llama / Mistral
/ Qwen2 / Qwen3 in both schemes, the fused FP8 decoder layer kernelize installs, and load_fp8
on compressed-tensors and fine-grained FP8 checkpoints the tests write themselves.

References are written here from each scheme's / format's definition (explicit per-block
loops on the CPU, the checkpoint's own dequantization), not by calling the code under test.

Exact where the computation is the same: the dynamic quantization (scales and FP8 bytes) of
the plain-torch path and of the fused ops, on CPU and CUDA.

Model logits (``assert_logits_close``). On CPU both sides compute the same bytes with the same
fp32 reference GEMM: observed difference 0; 1% of the logits' scale leaves room for fp32
summation order. Not so under TRITON_INTERPRET=1 (the package conftests set it for a whole
pytest run of the checkout, CI's): rope-triton's rotary then runs its Triton kernel in the
interpreter, whose bf16 roundings differ from transformers' in 53% of the values (measured on
q; on a GPU the kernel matches transformers bit for bit), and the noise floor below applies.
On CUDA the two sides differ below one bf16 ulp (the fused [W_q; W_k; W_v] /
[W_gate; W_up] GEMMs and skinny-gemm against separate torch._scaled_mm calls, cuBLAS against
the fp32 reference, the norm kernels' rsqrt and sum order), and dynamic FP8 re-quantization
amplifies any such difference, layer after layer, to the size of the FP8 rounding noise
itself: measured on CPU with these models (4 families x 2 weight seeds x 3 token sets x 8
seeds per scheme), perturbing every GEMM output of the plain-torch FP8 model by a relative
2^-12 (what two fp32 summation orders differ by) moved the logits by up to 5.5% (block) / 6.0%
(per-token) of their scale at the worst position and 4.5% / 4.3% in relative Frobenius norm;
by 2^-9 (half a bf16 ulp): 6.4% / 6.6% and 4.9% / 5.4%, while the FP8 model is ~7% from the
bf16 one. The H100 run of 2026-11-24 measured 3-5%. NOISE_FLOOR allows ~1.4x the measured
worst case; top-1 agreement is not asserted there (it fell to 0.67 of 18 positions in that
experiment: random weights give flat logits).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import fused_llm
from fused_llm import fp8, packages
from fused_llm_dev.models import build_model
from fused_llm_dev.testing import device

DEVICE = device()
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
             max_position_embeddings=256, head_dim=32, rms_norm_eps=1e-5)  # fmt: skip
MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3"]
# kernelize swaps transformers' rotary function process-wide; conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


def small_model(model_type: str, dtype=torch.bfloat16, seed: int = 0, **overrides):
    extra = {"sliding_window": 16} if model_type == "mistral" else {}
    return build_model(model_type, 2, DEVICE, dtype, seed, **{**SIZES, **extra, **overrides})


def logits(model, tokens) -> torch.Tensor:
    with torch.inference_mode():
        return model(tokens).logits.float()


def tokens(batch=2, seq=13, seed=1):
    return torch.randint(0, SIZES["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# (max |diff| / max |logit|, relative Frobenius norm) per scheme where the two sides are not
# the same bytes; the module docstring gives the measured noise floor (worst: 6.6% / 5.4%
# per-token, 6.4% / 4.9% block).
NOISE_FLOOR = {"per-token": (0.09, 0.075), "block": (0.09, 0.07)}


def _same_bytes() -> bool:
    """Whether the kernelized and the plain-torch model compute the same bytes: on CPU, unless
    rope-triton runs its Triton kernel in Triton's interpreter (module docstring)."""
    return DEVICE == "cpu" and not packages.get_kernel("rope-triton").triton_enabled_for(torch.empty(0))


def assert_logits_close(got, expected, name, scheme, frac=1e-2, top1=None):
    """Within ``frac`` of the logits' scale and ``top1`` agreement where both sides compute the
    same bytes but for fp32 summation order (CPU); within the FP8 noise floor (NOISE_FLOOR)
    otherwise."""
    err = (got - expected).abs().max().item()
    scale = expected.abs().max().item()
    if not _same_bytes():
        frac, frob = NOISE_FLOOR[scheme]
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel <= frob, f"{name}: relative Frobenius difference {rel:.3g} > {frob}"
        top1 = None
    assert err <= frac * scale, f"{name}: max |logit diff| {err:.3g} > {frac:.0%} of {scale:.3g}"
    if top1 is not None:
        agree = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
        assert agree >= top1, f"{name}: top-1 agreement {agree:.3f} < {top1}"


# ---------------------------------------------------------------------------------------------
# The schemes, written out here
# ---------------------------------------------------------------------------------------------

MIN_SCALE = (torch.tensor(1 / 512, dtype=torch.float32) / 448).item()


def ref_act_quant(x: torch.Tensor, group: int | None) -> torch.Tensor:
    """x [M, K] fake-quantized by the dynamic scheme, row by row and group by group, in fp32 on
    the CPU (whose ``t / 448`` is the correctly rounded quotient); returned on x's device."""
    device, x = x.device, x.float().cpu()
    out = torch.empty_like(x)
    width = group or x.shape[1]
    for r in range(x.shape[0]):
        for c in range(0, x.shape[1], width):
            seg = x[r, c:c + width]
            scale = torch.clamp(seg.abs().max() / 448, min=MIN_SCALE)
            q = (seg * (1 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)
            out[r, c:c + width] = q.float() * scale
    return out.to(device)


class FakeQuantLinear(nn.Module):
    """The reference FP8 projection: a dense weight (already dequantized) and the activation
    fake-quantized per token or per 1 x 128 group; fp32 matmul, one rounding."""

    def __init__(self, weight: torch.Tensor, bias, group):
        super().__init__()
        self.weight, self.bias, self.group = weight.float(), bias, group

    def forward(self, x):
        x2 = ref_act_quant(x.reshape(-1, x.shape[-1]), self.group)
        y = x2 @ self.weight.T
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], -1)


def reference_of(model: nn.Module, dequantized: dict[str, torch.Tensor], scheme: str) -> nn.Module:
    """The model with each named projection a FakeQuantLinear over the given dense weight."""
    ref = copy.deepcopy(model)
    for name, w in dequantized.items():
        old = ref.get_submodule(name)
        fp8._set_module(ref, name, FakeQuantLinear(w, getattr(old, "bias", None), 128 if scheme == "block" else None))
    return ref


def ref_block_dequant(q: torch.Tensor, scale: torch.Tensor, block=128) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * block:(i + 1) * block, j * block:(j + 1) * block] = (
                q[i * block:(i + 1) * block, j * block:(j + 1) * block].float() * scale[i, j].float())
    return out


# ---------------------------------------------------------------------------------------------
# Weights, activations, the layer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("shape", [(384, 256), (200, 256), (1, 128)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_quantize_weight(scheme, shape):
    g = torch.Generator().manual_seed(shape[0])
    w = torch.randn(shape, generator=g).to(torch.bfloat16)
    w[0] = 0  # an all-zero channel / block row stays zero, with a finite scale
    q, s = fp8.quantize_weight(w, scheme)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and s.dtype == torch.float32
    if scheme == "per-token":
        assert s.shape == (shape[0],)
        deq = q.float() * s[:, None]
        amax = w.float().abs().amax(1)
        torch.testing.assert_close(s, torch.where(amax > 0, amax / 448, torch.ones_like(amax)))
    else:
        assert s.shape == (-(-shape[0] // 128), shape[1] // 128)
        deq = ref_block_dequant(q, s)
    assert torch.equal(fp8.dequantize_weight(q, s, scheme), deq)
    assert torch.isfinite(s).all() and (deq[0] == 0).all()
    # e4m3 keeps 3 mantissa bits: at most half a step (2^-4 relative) of each value's binade
    # off, and no worse than 2^-4 of the block / channel maximum below e4m3's normal range.
    err = (deq - w.float()).abs()
    assert (err <= w.float().abs() * 2**-4 + 448 * 2**-9 * (s.max() if scheme == "block" else s[:, None])).all()


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
def test_quantize_activation_matches_the_scheme(scheme):
    x = (torch.randn(9, 384, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16).to(DEVICE)
    x[2] = 0  # the scale floor
    x[3, :128] = 1e-30  # the scale floor for one group
    q, s = fp8.quantize_activation(x, scheme)
    group = 128 if scheme == "block" else None
    assert s.shape == (9, 3 if group else 1)
    if group:
        assert s.stride() == (1, 9), "1 x 128 scales stored groups-major, as block-wise _scaled_mm reads them"
    torch.testing.assert_close(fp8.dequantize_activation(q, s), ref_act_quant(x, group), rtol=0, atol=0)


def test_dynamic_scale_is_the_exact_quotient():
    """amax / 448 correctly rounded, as the kernels' __fdiv_rn gives it, on every device: torch's
    CUDA ``t / 448.0`` multiplies by the fp32 1 / 448 instead, which misrounds about half of
    all values (2291837 of 4194304 on an H100, torch 2.11)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(1 << 16, 8, generator=g) * torch.logspace(-3, 3, 1 << 16)[:, None]).to(DEVICE)
    _, s = fp8.quantize_activation(x, "per-token")
    expected = torch.clamp(x.cpu().abs().amax(1, keepdim=True) / 448, min=MIN_SCALE)
    assert torch.equal(s.cpu(), expected)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("scheme", fp8.SCHEMES)
def test_fused_ops_quantize_like_the_scheme(scheme):
    """The ops the kernelized layer calls quantize exactly like quantize_activation: the FP8
    bytes and scales of rms_norm_dynamic_fp8 / fused_add_rms_norm_dynamic_fp8 /
    silu_and_mul_dynamic_fp8 equal quantize_activation of the same package's unquantized op
    (the same kernel arithmetic up to the quantization), and that is transformers' computation
    (RMSNorm, SiLU * up) within the packages' tolerance of 2 bf16 ulps (on the GPU the norm's
    rsqrt and fp32 sum order differ from torch's; on CPU they agree bit for bit)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    rms, swiglu = packages.get_kernel("rmsnorm-fp8"), packages.get_kernel("swiglu-fp8")
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(2, 5, 512, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    r = torch.randn(2, 5, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    gu = torch.randn(2, 5, 1024, generator=g).to(torch.bfloat16).to(DEVICE)
    norm = LlamaRMSNorm(512, eps=1e-5).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(512, generator=g).to(torch.bfloat16))
    group = 128 if scheme == "block" else None
    # the kernelized layer asks for groups-major scales on CUDA (what block-wise _scaled_mm reads)
    col_major = dict(column_major_scales=True) if group and DEVICE != "cpu" else {}

    def same(got, unquantized, torch_reference, what):
        q, s = got
        eq, es = fp8.quantize_activation(unquantized.reshape(-1, unquantized.shape[-1]), scheme)
        assert torch.equal(s.reshape(es.shape), es), f"{what}: scales differ"
        assert torch.equal(q.reshape(eq.shape).view(torch.uint8), eq.view(torch.uint8)), f"{what}: FP8 bytes differ"
        torch.testing.assert_close(unquantized, torch_reference, rtol=2 * 2**-7, atol=1e-5, msg=what)

    with torch.inference_mode():
        same(rms.rms_norm_dynamic_fp8(x, norm.weight, 1e-5, group_size=group, **col_major), rms.rms_norm(x, norm.weight, 1e-5),
             norm(x), "rms_norm_dynamic_fp8")  # fmt: skip
        q, s, res = rms.fused_add_rms_norm_dynamic_fp8(x, r, norm.weight, 1e-5, group_size=group, **col_major)
        same((q, s), rms.fused_add_rms_norm(x, r, norm.weight, 1e-5)[0], norm(x + r), "fused_add_rms_norm_dynamic_fp8")
        assert torch.equal(res, x + r)
        h = nn.functional.silu(gu[..., :512]) * gu[..., 512:]
        same(swiglu.silu_and_mul_dynamic_fp8(gu, group_size=group, **col_major), swiglu.silu_and_mul(gu), h,
             "silu_and_mul_dynamic_fp8")  # fmt: skip


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("in_features", [256, 512])
def test_fp8_linear(scheme, in_features):
    """FP8Linear against the fake-quantized reference. On CUDA K = 512 runs block-wise
    _scaled_mm, K = 256 its bf16 fallback (fp8.BLOCKWISE_K): within a bf16 rounding plus the
    GPU's fp32 summation order (2%); on CPU the same fp32 reference GEMM (one bf16 ulp)."""
    g = torch.Generator().manual_seed(11)
    lin = nn.Linear(in_features, 384, bias=True).to(DEVICE, torch.bfloat16)
    layer = fp8.FP8Linear.from_linear(lin, scheme)
    x = torch.randn(3, 4, in_features, generator=g).to(torch.bfloat16).to(DEVICE)
    ref = FakeQuantLinear(layer.dequantized_weight(), layer.bias, 128 if scheme == "block" else None)
    with torch.inference_mode():
        y = layer(x)
        expected = ref(x)
        xq, xs = fp8.quantize_activation(x.reshape(-1, in_features), scheme)
        y2 = fp8.fp8_matmul(xq, xs, layer.weight, layer.weight_scale, scheme, torch.bfloat16, layer.bias)
    assert y.shape == (3, 4, 384) and y.dtype == torch.bfloat16
    tol = dict(rtol=2**-7, atol=1e-3) if DEVICE == "cpu" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), expected.float(), **tol)
    assert torch.equal(y2.view(3, 4, 384), y)
    # .to(dtype) moves the layer but keeps the FP8 weight and the fp32 scales
    layer.to(torch.float16)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert layer.bias.dtype == torch.float16


def test_fp8_linear_bad_input():
    q = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scheme: expected one of \('per-token', 'block'\), got 'tensor'"):
        fp8.FP8Linear(q, torch.ones(256), "tensor")
    with pytest.raises(TypeError, match="weight: expected a 2-D torch.float8_e4m3fn tensor"):
        fp8.FP8Linear(q.float(), torch.ones(256), "per-token")
    with pytest.raises(ValueError, match=r"weight_scale: expected shape \(2, 2\) for the block scheme"):
        fp8.FP8Linear(q, torch.ones(256), "block")
    with pytest.raises(ValueError, match=r"weight_scale: expected shape \(256,\) for the per-token scheme"):
        fp8.FP8Linear(q, torch.ones(2, 2), "per-token")
    with pytest.raises(ValueError, match="in_features a multiple of 128"):
        fp8.FP8Linear(torch.zeros(128, 200, dtype=torch.float8_e4m3fn), torch.ones(1, 2), "block")
    layer = fp8.FP8Linear(q, torch.ones(1), "per-token")  # a per-tensor scale becomes one per channel
    assert layer.weight_scale.shape == (256,)
    with pytest.raises(ValueError, match=r"x: expected last dimension 256, got shape \(2, 128\)"):
        layer(torch.zeros(2, 128))


# ---------------------------------------------------------------------------------------------
# quantize_fp8 and the kernelized FP8 layer
# ---------------------------------------------------------------------------------------------


def _dequantized(model) -> dict[str, torch.Tensor]:
    return {n: m.dequantized_weight() for n, m in model.named_modules() if isinstance(m, fp8.FP8Linear)}


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_quantize_fp8(model_type, scheme):
    model = small_model(model_type)
    dense_logits = logits(model, tokens())
    report = fused_llm.quantize_fp8(model, scheme)
    assert report.scheme == scheme and len(report.swapped) == 7 * 2, report
    assert all(isinstance(model.get_submodule(n), fp8.FP8Linear) for n in report.swapped)
    assert 0.5 <= report.fp8_bytes / report.dense_bytes < 0.51, str(report)
    got = logits(model, tokens())
    assert_logits_close(got, logits(reference_of(model, _dequantized(model), scheme), tokens()), model_type, scheme,
                        top1=0.97)  # fmt: skip
    # FP8 stays near the bf16 model (random weights: a loose bound, the benchmark measures agreement)
    assert ((got - dense_logits).norm() / dense_logits.norm()).item() < 0.15


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_kernelize_fp8(model_type, scheme):
    model = small_model(model_type)
    fused_llm.quantize_fp8(model, scheme)
    plain = copy.deepcopy(model)
    report = fused_llm.kernelize(model)
    assert len(report.fused_fp8_decoders) == 2 and not report.fused_decoders and not report.unfused_decoders, report
    assert all(s == scheme for _, _, s, _ in report.fused_fp8_decoders)
    text = str(report)
    for op in ("rms_norm_dynamic_fp8", "fused_add_rms_norm_dynamic_fp8", "silu_and_mul_dynamic_fp8",
               "apply_rotary_transformers", "no fused op exists"):
        assert op in text, text
    layer = model.model.layers[0]
    assert layer.fused_llm_qkv_fused and layer.fused_llm_gate_up_fused
    # q / k / v weights are views of the fused tensor; state_dict is the unfused model's
    assert layer.self_attn.q_proj.weight.untyped_storage().data_ptr() == layer.self_attn.fused_llm_qkv_weight.untyped_storage().data_ptr()
    assert model.state_dict().keys() == plain.state_dict().keys()
    for batch, seq in ((2, 13), (1, 1)):
        fp8.BACKENDS_USED.clear()
        got = logits(model, tokens(batch, seq))
        assert fp8.BACKENDS_USED == _kernelized_gemms(scheme), fp8.BACKENDS_USED
        assert_logits_close(got, logits(plain, tokens(batch, seq)), f"{model_type} {scheme}", scheme, top1=0.99)


def _kernelized_gemms(scheme: str) -> set[str]:
    """The GEMM paths the kernelized test model runs (fp8.BACKENDS_USED): the fp32 reference on
    CPU; on CUDA skinny-gemm (per-token), or for the block scheme block-wise _scaled_mm for the
    down projection (K = 512) where the probe found it right, and the bf16 fallback for the
    K = 256 GEMMs (fp8.BLOCKWISE_K)."""
    if DEVICE == "cpu":
        return {"reference"}
    if scheme == "per-token":
        return {"skinny"}
    return {"blockwise-fallback"} | ({"blockwise"} if fp8.gemm_backend(DEVICE, "block") == "blockwise" else set())


@pytest.mark.kernels_ci
def test_kernelize_fp8_ci():
    test_kernelize_fp8("llama", "block")


@pytest.mark.parametrize("scheme", fp8.SCHEMES)
def test_kernelize_fp8_generate(scheme):
    """A few greedy decode steps through the cache. Where both compute the same bytes (CPU) the
    kernelized model picks the plain one's tokens. Elsewhere, where the two differ by the FP8
    noise floor (module docstring) and flat logits let greedy paths part: the logits of each
    step, computed through the cache, against the plain model's full forward over the same
    tokens."""
    model = small_model("llama")
    fused_llm.quantize_fp8(model, scheme)
    plain = copy.deepcopy(model)
    fused_llm.kernelize(model)
    prompt = tokens(1, 7)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(prompt, **kw, output_logits=True, return_dict_in_generate=True)
        if _same_bytes():
            assert torch.equal(out.sequences, plain.generate(prompt, **kw))
            return
        full = plain(out.sequences[:, :-1]).logits.float()[:, prompt.shape[1] - 1:]
    assert_logits_close(torch.stack(out.logits, dim=1).float(), full, f"generate {scheme}", scheme)


def test_block_scheme_unfusable_projections():
    """k / v of 2 x 32 = 64 rows cannot share 128-row blocks with q: the layer runs three GEMMs
    on the one quantized input instead of one."""
    model = small_model("llama", num_key_value_heads=2)
    fused_llm.quantize_fp8(model, "block")
    plain = copy.deepcopy(model)
    fused_llm.kernelize(model)
    layer = model.model.layers[0]
    assert not layer.fused_llm_qkv_fused and layer.fused_llm_gate_up_fused
    assert_logits_close(logits(model, tokens()), logits(plain, tokens()), "unfused qkv", "block", top1=0.99)


def test_kernelize_mixed_layers_keep_their_forward():
    model = small_model("llama")
    fused_llm.quantize_fp8(model, "per-token")
    layer = model.model.layers[1]
    dense = nn.Linear(256, 512, bias=False, device=DEVICE, dtype=torch.bfloat16)
    layer.mlp.up_proj = dense
    expected = logits(model, tokens())
    report = fused_llm.kernelize(model)
    assert [n for n, *_ in report.fused_fp8_decoders] == ["model.layers.0"]
    assert report.unfused_decoders[0][0] == "model.layers.1" and "mlp.up_proj is not an FP8Linear" in report.unfused_decoders[0][2]
    assert_logits_close(logits(model, tokens()), expected, "mixed", "per-token", top1=0.99)


def test_quantize_fp8_bad_input():
    with pytest.raises(ValueError, match=r"scheme: expected one of \('per-token', 'block'\), got 'static'"):
        fused_llm.quantize_fp8(small_model("llama"), "static")
    with pytest.raises(TypeError, match="quantize_fp8 takes float16 / bfloat16 models"):
        fused_llm.quantize_fp8(small_model("llama", torch.float32))
    with pytest.raises(ValueError, match="no Llama / Mistral / Qwen2 / Qwen3 decoder layers"):
        fused_llm.quantize_fp8(nn.Sequential(nn.Linear(8, 8)))
    with pytest.raises(ValueError, match="in_features 688, not a multiple of 128"):
        fused_llm.quantize_fp8(small_model("llama", intermediate_size=688), "block")
    model = small_model("llama")
    fused_llm.quantize_fp8(model, "block")
    with pytest.raises(ValueError, match="already an FP8Linear of scheme 'block', asked for 'per-token'"):
        fused_llm.quantize_fp8(model, "per-token")


# ---------------------------------------------------------------------------------------------
# Checkpoints written here, loaded with load_fp8
# ---------------------------------------------------------------------------------------------

CT_GROUP = {"targets": ["Linear"], "format": "float-quantized", "output_activations": None}
QUANT_CONFIGS = {
    "ct-channel": {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                   "quantization_status": "compressed",
                   "config_groups": {"group_0": {**CT_GROUP,
                       "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False},
                       "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                             "dynamic": True}}}},
    "ct-tensor-static": {"quant_method": "compressed-tensors", "format": "naive-quantized", "ignore": ["lm_head"],
                         "config_groups": {"group_0": {**CT_GROUP, "format": "naive-quantized",
                             "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"},
                             "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
                                                   "dynamic": False}}}},
    "ct-block": {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                 "config_groups": {"group_0": {**CT_GROUP,
                     "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                                 "block_structure": [128, 128]},
                     "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
                                           "group_size": 128, "dynamic": True}}}},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head"]},
    "fp8-ue8m0": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
}  # fmt: skip
SCHEME_OF = {"ct-channel": "per-token", "ct-tensor-static": "per-token", "ct-block": "block", "fp8": "block", "fp8-ue8m0": "block"}


def write_checkpoint(directory, model_type: str, kind: str):
    """A small bf16 model saved in format ``kind``: its projections quantized as the format
    stores them (scale = amax / 448 per channel, tensor or 128 x 128 block; ue8m0: the scale
    rounded up to a power of two) with the format's tensor names. Returns (the dense model,
    the projections' weights dequantized by the format's rule)."""
    from safetensors.torch import save_file

    model = small_model(model_type, seed=3).cpu()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    dequantized = {}
    for name in fp8.projection_names(model):
        w = state.pop(f"{name}.weight").float()
        N, K = w.shape
        if kind == "ct-channel":
            s = w.abs().amax(1, keepdim=True) / 448  # [N, 1]
            q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            dequantized[name] = q.float() * s
            state[f"{name}.weight_scale"] = s
        elif kind == "ct-tensor-static":
            s = (w.abs().max() / 448).reshape(1)
            q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            dequantized[name] = q.float() * s
            state[f"{name}.weight_scale"] = s.to(torch.bfloat16).float().to(torch.bfloat16)  # stored in bf16
            dequantized[name] = q.float() * state[f"{name}.weight_scale"].float()
            state[f"{name}.input_scale"] = torch.tensor([0.05])
        else:
            s = w.view(N // 128, 128, K // 128, 128).abs().amax(dim=(1, 3)) / 448
            if kind == "fp8-ue8m0":
                s = torch.pow(2.0, torch.ceil(torch.log2(s)))
            q = (w.view(N // 128, 128, K // 128, 128) / s[:, None, :, None]).clamp(-448, 448).view(N, K)
            q = q.to(torch.float8_e4m3fn)
            dequantized[name] = ref_block_dequant(q, s)
            key = "weight_scale" if kind == "ct-block" else "weight_scale_inv"
            state[f"{name}.{key}"] = s.to(torch.float8_e8m0fnu) if kind == "fp8-ue8m0" else s
        state[f"{name}.weight"] = q
    save_file(state, str(directory / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = copy.deepcopy(QUANT_CONFIGS[kind])
    config["torch_dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(config, default=str))
    return model.to(DEVICE), {k: v.to(DEVICE) for k, v in dequantized.items()}


@pytest.mark.parametrize("kind, model_type", [("ct-channel", "llama"), ("ct-tensor-static", "qwen2"), ("ct-block", "qwen3"),
                                              ("fp8", "llama"), ("fp8-ue8m0", "mistral")])  # fmt: skip
def test_load_fp8(tmp_path, kind, model_type):
    dense, dequantized = write_checkpoint(tmp_path, model_type, kind)
    model, report = fused_llm.load_fp8(tmp_path, device=DEVICE)
    scheme = SCHEME_OF[kind]
    assert report.scheme == scheme and report.format == ("fp8" if kind.startswith("fp8") else "compressed-tensors")
    assert len(report.swapped) == 14, report
    if kind == "ct-tensor-static":
        assert any("static per-tensor input scales are not used" in n for n in report.notes), report
    # The loaded weights are the format's own dequantization, bit for bit.
    for name, w in dequantized.items():
        assert torch.equal(model.get_submodule(name).dequantized_weight(), w), name
    t = tokens(2, 9, seed=5)
    assert_logits_close(logits(model, t), logits(reference_of(dense, dequantized, scheme), t), kind, scheme, top1=0.97)
    # ... and kernelized, the fused FP8 layer computes the same model.
    expected = logits(model, t)
    report = fused_llm.kernelize(model)
    assert len(report.fused_fp8_decoders) == 2, report
    assert_logits_close(logits(model, t), expected, f"{kind} kernelized", scheme, top1=0.98)


@pytest.mark.kernels_ci
def test_load_fp8_ci(tmp_path):
    test_load_fp8(tmp_path, "ct-channel", "llama")


@pytest.mark.parametrize(
    "kind, change, match",
    [("fp8", {"weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\]; only \[128, 128\]"),
     ("fp8", {"activation_scheme": "static"}, "activation_scheme 'static'; only 'dynamic'"),
     ("fp8", {"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
     ("ct-channel", {"format": "pack-quantized"}, "format 'pack-quantized'"),
     ("ct-channel", {"config_groups": {"g": {"format": "float-quantized", "weights": {"num_bits": 8, "type": "float",
                                              "strategy": "channel"}, "input_activations": None}}},
      r"quantizes weights only \(FP8 W8A16\)"),
     ("ct-channel", {"config_groups": {"g": {"format": "float-quantized", "weights": {"num_bits": 4, "type": "int",
                                              "strategy": "group"}, "input_activations": None}}},
      "does not hold 8-bit float weights")],
)  # fmt: skip
def test_load_fp8_unsupported(tmp_path, kind, change, match):
    write_checkpoint(tmp_path, "llama", kind)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"].update(change)
    if "format" in change:  # a group's own format overrides the top-level one
        for group in config["quantization_config"]["config_groups"].values():
            group.pop("format", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        fused_llm.load_fp8(tmp_path)


def test_load_fp8_missing_scale(tmp_path):
    from safetensors.torch import load_file, save_file

    write_checkpoint(tmp_path, "llama", "fp8")
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="q_proj.weight is torch.float8_e4m3fn but model.layers.0.self_attn.q_proj.weight_scale_inv is missing"):
        fused_llm.load_fp8(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="has no quantization_config"):
        fused_llm.load_fp8(tmp_path)
    with pytest.raises(FileNotFoundError, match="checkpoint_dir: expected"):
        fused_llm.load_fp8(tmp_path / "nowhere")


def _rowwise_scaled_mm_missing() -> str | None:
    """Why this torch cannot run row-wise torch._scaled_mm on CPU tensors, or None: torch
    2.11's CPU build takes per-tensor scales only (an internal assert in mkldnn's Linear.cpp,
    seen on the GPU machine); 2.13's has row-wise."""
    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as err:
        return f"torch {torch.__version__}'s CPU _scaled_mm has no row-wise scales: {str(err).splitlines()[0][:120]}"
    return None


@pytest.mark.parametrize("scheme, blockwise", [("per-token", False), ("block", False), ("block", True)],
                         ids=["rowwise", "block-fallback", "blockwise"])  # fmt: skip
@pytest.mark.parametrize("bias", [False, True])
def test_scaled_mm_gemm_path(scheme, blockwise, bias):
    """The GPU GEMM path (fp8._scaled_mm_gemm) against the fp32 reference: row-wise
    torch._scaled_mm with the scales as the path lays them out, the block scheme's bf16
    fallback and block-wise _scaled_mm (rows padded: M = 37), with bias and fp16 output. On
    the GPU; without one on CPU tensors where torch's CPU build has the call (row-wise: 2.13,
    not 2.11; block-wise: none)."""
    if DEVICE == "cpu" and scheme == "per-token" and (reason := _rowwise_scaled_mm_missing()):
        pytest.skip(reason)
    if blockwise and fp8.gemm_backend(DEVICE, "block") != "blockwise":
        pytest.skip(f"no right block-wise torch._scaled_mm on {DEVICE} (fp8.gemm_backend)")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(384, 512, generator=g) * torch.linspace(0.5, 4, 512)).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(384, generator=g).to(torch.bfloat16).to(DEVICE) if bias else None
    xq, xs = fp8.quantize_activation(x, scheme)
    wq, ws = fp8.quantize_weight(w, scheme)
    ref = (fp8.dequantize_activation(xq, xs) @ fp8.dequantize_weight(wq, ws, scheme).T).cpu()
    if bias:
        ref = ref + b.float().cpu()
    for out_dtype in (torch.bfloat16, torch.float16):  # fp16: a cast after the bf16 GEMM
        y = fp8._scaled_mm_gemm(xq, xs, wq, ws, scheme, out_dtype, b, blockwise)
        assert y.dtype == out_dtype and y.shape == (37, 384)
        # one bf16 rounding (2^-8 relative) and fp32 summation order; bias added after: two
        torch.testing.assert_close(y.float().cpu(), ref, rtol=2**-7, atol=2e-2 * ref.abs().max().item())


@pytest.mark.parametrize("rows", [1, 4, 13, 16, 37])
def test_blockwise_scaled_mm_rows(rows):
    """Block-wise torch._scaled_mm as fp8._blockwise_scaled_mm calls it (rows padded to a
    multiple of 4, scales groups-major) for the row counts of decode and prefill, against the
    fp32 reference, with distinct scales per group and per weight block. GPU only (no CPU
    build has block-wise _scaled_mm)."""
    if fp8.gemm_backend(DEVICE, "block") != "blockwise":
        pytest.skip(f"no right block-wise torch._scaled_mm on {DEVICE} (fp8.gemm_backend)")
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 1024, generator=g) * torch.rand(1024, generator=g) * 8).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(640, 1024, generator=g) * torch.rand(640, 1, generator=g) * 4).to(torch.bfloat16).to(DEVICE)
    xq, xs = fp8.quantize_activation(x, "block")
    wq, ws = fp8.quantize_weight(w, "block")
    y = fp8._blockwise_scaled_mm(xq, xs, wq, ws).float().cpu()
    ref = (fp8.dequantize_activation(xq, xs) @ fp8.dequantize_weight(wq, ws, "block").T).cpu()
    assert y.shape == (rows, 640)
    torch.testing.assert_close(y, ref, rtol=2**-7, atol=1e-2 * ref.abs().max().item())


def test_blockwise_probe_refuses_where_scaled_mm_cannot(monkeypatch):
    """The probe answers False (and the block GEMM falls back) where _scaled_mm refuses
    block-wise scales: torch's CPU build stands in for a GPU without them."""
    monkeypatch.setattr(fp8, "_BLOCKWISE_OK", {})
    assert fp8._probe_blockwise(torch.device("cpu", 0)) is False
    assert fp8._BLOCKWISE_OK == {0: False}


@pytest.mark.parametrize("rows", [1, 5])
def test_skinny_gemm_call(rows):
    """The per-token GEMM the kernelized layer runs on CUDA, skinny-gemm's linear_fp8, takes
    the scales as the fused ops give them (x [M, 1], w [N]) and the bias, and computes the
    scheme's product: against fp8_matmul within a bf16 rounding (on CPU its plain-torch path,
    or its Triton kernel under TRITON_INTERPRET=1)."""
    skinny = packages.get_kernel("skinny-gemm")
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    w = torch.randn(384, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(384, generator=g).to(torch.bfloat16).to(DEVICE)
    xq, xs = fp8.quantize_activation(x, "per-token")
    wq, ws = fp8.quantize_weight(w, "per-token")
    with torch.inference_mode():
        y = skinny.linear_fp8(xq, wq, xs, ws, b, torch.bfloat16)
        ref = fp8.fp8_matmul(xq, xs, wq, ws, "per-token", torch.float32, b)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 384)
    torch.testing.assert_close(y.float(), ref, rtol=2**-7, atol=1e-2 * ref.abs().max().item())


def test_quantize_after_kernelize_is_refused():
    """quantize_fp8 on a model whose layers kernelize already fused (16-bit) raises, naming the
    order (decoder.refuse_fused), instead of leaving fused layers on the old dense weights; on a
    kernelized FP8 model of the same scheme it changes nothing."""
    model = small_model("llama")
    fused_llm.kernelize(model)
    with pytest.raises(ValueError, match="kernelized before quantize_fp8"):
        fused_llm.quantize_fp8(model, "per-token")
    fp8_model = small_model("llama")
    fused_llm.quantize_fp8(fp8_model, "per-token")
    fused_llm.kernelize(fp8_model)
    assert fused_llm.quantize_fp8(fp8_model, "per-token").swapped == []
