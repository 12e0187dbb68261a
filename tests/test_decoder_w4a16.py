"""The fused 4-bit decoder layer (fused_llm.decoder_w4a16) that kernelize installs in models
quantized with quantize_w4a16: against the same 4-bit model not kernelized (transformers'
forward, one W4A16Linear call per projection).

Tolerances. On CPU without TRITON_INTERPRET (``_same_bytes``) both sides run the packages'
plain-torch paths: the same dequantized weights, fp32 GEMMs, the same roundings of the norms,
rotary and SiLU * up; only the fused GEMM's wider N may change the CPU BLAS's summation order.
Measured (the four CASES, 2 x 13 tokens): max |logit diff| 0 in bf16, one fp16 ulp (4.9e-4 of a
scale of 1.2) in fp16; asserted: 1% of the logits' scale for bf16 (about one bf16 ulp), 0.2% for
fp16 (two fp16 ulps). Elsewhere (CUDA, or Triton's interpreter: the GEMMs run the package's
Triton kernels, the fused and the separate ones with their own tiles and K splits, and
rope-triton's interpreted rotary rounds unlike transformers' in half the values,
tests/test_fp8_integration.py) the two differ by 16-bit rounding noise propagated through two
layers; measured under TRITON_INTERPRET=1: up to 0.95% of the scale at the worst logit and
0.90% in relative Frobenius norm in bf16, 0.06% / 0.03% in fp16; asserted: 3% and 2%. No fp32
model: the 4-bit GEMM takes float16 / bfloat16 activations only.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fused_llm
import fused_llm.decoder
from fused_llm import packages
from fused_llm import w4a16 as fw
from fused_llm_dev.models import build_model
from fused_llm_dev.testing import device, op_namespaces_backend

DEVICE = device()
w4 = packages.get_kernel("machete-w4a16")
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
             max_position_embeddings=256, head_dim=32, rms_norm_eps=1e-5)  # fmt: skip
# kernelize swaps transformers' rotary function process-wide where a layer keeps its forward;
# conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


def small_w4_model(model_type: str, dtype=torch.bfloat16, group_size: int = 64, zero_point: bool = False, seed: int = 0):
    extra = {"sliding_window": 16} if model_type == "mistral" else {}
    model = build_model(model_type, 2, DEVICE, dtype, seed, **SIZES, **extra)
    fw.quantize_w4a16(model, group_size=group_size, zero_point=zero_point)
    return model


def tokens(batch=2, seq=13, seed=1):
    return torch.randint(0, SIZES["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits.float()


def _same_bytes() -> bool:
    """Both sides on the packages' plain-torch paths (module docstring)."""
    return DEVICE == "cpu" and not packages.get_kernel("rope-triton").triton_enabled_for(torch.empty(0))


def assert_logits_close(got, expected, name, dtype=torch.bfloat16):
    err = (got - expected).abs().max().item()
    scale = expected.abs().max().item()
    frac = (0.01 if dtype == torch.bfloat16 else 0.002) if _same_bytes() else 0.03
    assert err <= frac * scale, f"{name}: max |logit diff| {err:.3g} > {frac:.1%} of {scale:.3g}"
    if not _same_bytes():
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel <= 0.02, f"{name}: relative Frobenius difference {rel:.3g} > 2%"


CASES = [("llama", torch.float16, 32, False), ("mistral", torch.bfloat16, 64, False),
         ("qwen2", torch.float16, 64, True), ("qwen3", torch.bfloat16, 32, True)]  # fmt: skip


@pytest.mark.parametrize("model_type, dtype, group_size, zero_point", CASES,
                         ids=[f"{m}-{str(d)[6:]}-g{g}{'z' if z else ''}" for m, d, g, z in CASES])  # fmt: skip
def test_kernelize_w4a16(model_type, dtype, group_size, zero_point):
    """Every layer fused (Qwen2: QKV biases; Qwen3: q / k norms; Mistral: sliding window), the
    report names the ops, q / k / v and gate / up read one fused qweight, the state_dict is the
    unkernelized model's, the logits match it at prefill and at one token."""
    model = small_w4_model(model_type, dtype, group_size, zero_point)
    plain = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fused_llm.kernelize(model)
    assert len(report.fused_w4a16_decoders) == 2 and not report.fused_decoders and not report.unfused_decoders, report
    text = str(report)
    for what in ("fused 4-bit decoder layer", "one machete-w4a16 w4a16_gemm of [W_q; W_k; W_v]",
                 "one machete-w4a16 w4a16_gemm of [W_gate; W_up]", "rope-triton apply_rotary_transformers",
                 "rmsnorm-fp8 fused_add_rms_norm", "swiglu-fp8 silu_and_mul", f"group {group_size}"):  # fmt: skip
        assert what in text, text
    # Everything inside the fused layers is theirs: no bare activation / MLP / rotary swap.
    assert all(cls.endswith("RMSNorm") for cls in {c for _, c, _ in report.swapped}), report
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert layer.fused_llm_qkv_unfused is None and layer.fused_llm_gate_up_unfused is None
    for parent, names, fused in ((attn, ("q_proj", "k_proj", "v_proj"), attn.fused_llm_qkv_qweight),
                                 (mlp, ("gate_proj", "up_proj"), mlp.fused_llm_gate_up_qweight)):  # fmt: skip
        assert all(getattr(parent, n).qweight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr() for n in names)
    assert (attn.fused_llm_qkv_bias is not None) == (model_type == "qwen2")
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    for batch, seq in ((2, 13), (1, 1)):
        assert_logits_close(logits(model, tokens(batch, seq)), logits(plain, tokens(batch, seq)), f"{model_type} {batch}x{seq}",
                            dtype)  # fmt: skip


@pytest.mark.kernels_ci
def test_kernelize_w4a16_ci():
    test_kernelize_w4a16("llama", torch.bfloat16, 64, False)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_kernelize_w4a16_generate(cache):
    """Greedy decode through the cache. Where both compute the same bytes the kernelized model
    picks the plain one's tokens; elsewhere flat random logits let greedy paths part, so each
    step's logits (through the cache) are compared with the plain model's full forward over the
    same tokens."""
    model = small_w4_model("llama", zero_point=True)
    plain = copy.deepcopy(model)
    fused_llm.kernelize(model)
    prompt = tokens(1, 7)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.inference_mode():
        out = model.generate(prompt, **kw, output_logits=True, return_dict_in_generate=True)
        if _same_bytes():
            assert torch.equal(out.sequences, plain.generate(prompt, **kw))
        full = plain(out.sequences[:, :-1]).logits.float()[:, prompt.shape[1] - 1:]
    assert_logits_close(torch.stack(out.logits, dim=1).float(), full, f"generate, {cache} cache")


def _act_order(layer, perm: torch.Tensor):
    """``layer`` (a W4A16Linear) re-quantized act-order: packed column k' is input column
    perm[k'] (as from_gptq makes it from a desc_act g_idx); same dequantized weight up to the
    new groups' rounding."""
    w = w4.dequantize(layer.quantized_weight())
    qw = w4.quantize(w[:, perm].contiguous(), group_size=layer.group_size, zero_point=layer.zeros is not None)
    qw = w4.QuantizedWeight(qw.qweight, qw.scales, qw.zeros, perm.to(torch.int32), qw.group_size)
    return w4.layers.W4A16Linear.from_quantized(qw, layer.bias)


def test_unfusable_projections_run_separately():
    """Act order with k_proj's permutation unlike q_proj's (QKV: three GEMMs), gate / up sharing
    one (fused, with the permutation) in layer 0; up_proj of another group size in layer 1
    (gate / up: two GEMMs). Correct, and the report says why."""
    model = small_w4_model("llama", group_size=64)
    g = torch.Generator().manual_seed(7)
    p1, p2 = torch.randperm(256, generator=g).to(DEVICE), torch.randperm(256, generator=g).to(DEVICE)
    layer0, layer1 = model.model.layers
    for parent, name, perm in ((layer0.self_attn, "q_proj", p1), (layer0.self_attn, "k_proj", p2),
                               (layer0.self_attn, "v_proj", p1), (layer0.mlp, "gate_proj", p1),
                               (layer0.mlp, "up_proj", p1)):  # fmt: skip
        setattr(parent, name, _act_order(getattr(parent, name), perm))
    up = layer1.mlp.up_proj
    qw = w4.quantize(w4.dequantize(up.quantized_weight()), group_size=32)
    layer1.mlp.up_proj = w4.layers.W4A16Linear.from_quantized(qw, up.bias)
    plain = copy.deepcopy(model)
    report = fused_llm.kernelize(model)
    assert len(report.fused_w4a16_decoders) == 2, report
    assert layer0.fused_llm_qkv_unfused == "k_proj's act-order permutation differs from q_proj's"
    assert layer0.fused_llm_gate_up_unfused is None and torch.equal(layer0.mlp.fused_llm_gate_up_perm, p1.to(torch.int32))
    assert layer1.fused_llm_qkv_unfused is None and layer1.fused_llm_gate_up_unfused == "up_proj has group size 32, gate_proj 64"
    assert layer0.self_attn.fused_llm_qkv_qweight is None
    text = str(report)
    assert "three machete-w4a16 w4a16_gemm calls (not fused: k_proj's act-order permutation differs" in text, text
    assert "two machete-w4a16 w4a16_gemm calls, concatenated (not fused: up_proj has group size 32" in text, text
    assert "(group 64, symmetric, act-order)" in text, text
    for batch, seq in ((2, 13), (1, 1)):
        assert_logits_close(logits(model, tokens(batch, seq)), logits(plain, tokens(batch, seq)), f"unfusable {batch}x{seq}")


def test_declined_layer_keeps_its_forward():
    """A layer with one 16-bit projection keeps transformers' forward (the module-level swaps
    apply, the report says why); the other is fused."""
    model = small_w4_model("llama")
    model.model.layers[1].mlp.up_proj = nn.Linear(256, 512, bias=False, device=DEVICE, dtype=torch.bfloat16)
    expected = logits(model, tokens())
    report = fused_llm.kernelize(model)
    assert [n for n, *_ in report.fused_w4a16_decoders] == ["model.layers.0"], report
    assert report.unfused_decoders == [("model.layers.1", "LlamaDecoderLayer", "mlp.up_proj is not a W4A16Linear (the fused "
                                        "4-bit layer needs all seven projections in 4 bits)")], report  # fmt: skip
    assert any(layer.endswith("ApplyRotaryPosEmb.forward") for _, _, layer in report.swapped), report
    assert_logits_close(logits(model, tokens()), expected, "declined layer")


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_refreshes_the_fused_tensors(assign):
    """The fused scales / zeros are copies and assign=True replaces the qweight views: after a
    load_state_dict the fused layer computes the loaded weights."""
    model = small_w4_model("qwen2", zero_point=True)
    fused_llm.kernelize(model)
    other = small_w4_model("qwen2", zero_point=True, seed=5)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    model.load_state_dict(state, assign=assign)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.qweight.untyped_storage().data_ptr() == attn.fused_llm_qkv_qweight.untyped_storage().data_ptr()
    assert torch.equal(attn.fused_llm_qkv_scales[:, :256], other.model.layers[0].self_attn.q_proj.scales)
    assert_logits_close(logits(model, tokens()), logits(other, tokens()), f"loaded (assign={assign})")


@pytest.mark.parametrize("batch, length", [(2, 11), (1, 80)], ids=["fused layers", "layer's own forward"])
def test_compiles_fullgraph(batch, length):
    """torch.compile(fullgraph=True) of a kernelized 4-bit model: no graph break, the plain
    model's logits, with and without inductor. Below decoder.COMPILED_ORIGINAL_MIN_TOKENS the graph calls the fused
    layer's ops (rmsnorm-fp8, rope-triton, swiglu-fp8, machete-w4a16); at or above it the layers
    are transformers' own, whose W4A16Linear GEMMs are the only custom op."""
    assert 2 * 11 < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS <= 80
    model = small_w4_model("llama")
    ids = tokens(batch, length)
    expected = logits(model, ids)
    fused_llm.kernelize(model)
    torch._dynamo.reset()
    namespaces, backend = op_namespaces_backend()

    got = logits(torch.compile(model, fullgraph=True, dynamic=False, backend=backend), ids)
    ours = {pkg for pkg in ("rmsnorm_fp8", "rope_triton", "swiglu_fp8", "machete_w4a16") if any(pkg in ns for ns in namespaces)}
    fused = batch * length < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS
    assert ours == ({"rmsnorm_fp8", "rope_triton", "swiglu_fp8", "machete_w4a16"} if fused else {"machete_w4a16"}), namespaces
    assert_logits_close(got, expected, f"compiled {batch}x{length}")
    torch._dynamo.reset()  # and through inductor (its fusions around the custom ops)
    assert_logits_close(logits(torch.compile(model, fullgraph=True, dynamic=False), ids), expected, f"inductor {batch}x{length}")


def test_quantize_after_kernelize_is_refused():
    """quantize_w4a16 on a model whose layers kernelize already fused (16-bit) raises, naming
    the order, instead of leaving fused layers that compute with the old dense weights."""
    model = build_model("llama", 2, DEVICE, torch.bfloat16, 0, **SIZES)
    fused_llm.kernelize(model)
    with pytest.raises(ValueError, match="kernelized before quantize_w4a16"):
        fused_llm.quantize_w4a16(model, group_size=32)
    w4_model = small_w4_model("llama", group_size=32)
    fused_llm.kernelize(w4_model)
    assert fused_llm.quantize_w4a16(w4_model, group_size=32).swapped == []
