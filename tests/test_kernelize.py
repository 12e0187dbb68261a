"""End to end: kernelize a tiny random-weight Llama and compare its logits with eager."""

from __future__ import annotations

import copy

import pytest
import torch

import fused_llm
import fused_llm.decoder
from fused_llm_dev.models import tiny_llama, tiny_model
from fused_llm_dev.testing import device, op_namespaces_backend

DEVICE = device()
# Float32 logits agree to rounding; bf16 models round every layer, so compare loosely.
DTYPES = [torch.float32, torch.bfloat16]  # bf16 runs the gated-mlp kernel (fp32 keeps the expression)
# kernelize swaps transformers' rotary function process-wide; conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens).logits.float()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", ["local", "hub"])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused-decoder", "module-swaps"])
def test_kernelize_tiny_llama(dtype, source, fuse):
    eager = tiny_llama(DEVICE, dtype)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)  # before kernelize: its rotary swap is process-wide
    report = fused_llm.kernelize(model, source=source, fuse_decoder_layers=fuse)

    layers = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaDecoderLayer"]
    norms = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"]
    acts = [n for n, m in model.named_modules() if type(m).__name__ == "SiLUActivation"]
    mlps = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaMLP"]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    assert len(acts) == len(mlps) == len(layers) == model.config.num_hidden_layers
    rotary = [n for n, _, layer in report.swapped if layer.endswith("ApplyRotaryPosEmb.forward")]
    layer_of = {n: layer for n, _, layer in report.swapped}
    if fuse and dtype != torch.float32:
        # The decoder layers compute everything inside them (the report lists them as such);
        # only the final norm is swapped on its own; no bare SiLU or MLP swap.
        assert [n for n, _ in report.fused_decoders] == layers, report
        assert sorted(layer_of) == ["model.norm"], report
        assert all(getattr(model.get_submodule(n).forward, "__func__", None) is type(model.get_submodule(n)).forward for n in acts + mlps)
    else:
        assert rotary == ["model.layers.0.self_attn.rotary_pos_emb"], report  # one function, shared
        assert not report.fused_decoders
        if fuse:  # fp32: gated-mlp has no fp32 kernel, so the layers say why they keep their forward
            assert [n for n, _, _ in report.unfused_decoders] == layers and "dtype" in report.unfused_decoders[0][2]
        assert sorted(layer_of) == sorted(norms + acts + rotary + mlps), report
        assert all(layer_of[n].endswith("SiLU.forward") for n in acts), report
        assert all(layer_of[n].endswith("LlamaMLP.forward") for n in mlps), report
    assert not report.kept
    assert all(layer_of[n].endswith("RMSNorm.forward") for n in norms if n in layer_of), report

    got = _logits(model, tokens)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    else:
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.97
        torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


@pytest.mark.kernels_ci
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_fused_decoder_families(model_type):
    """Each family's fused layer against its eager logits (Qwen2: QKV biases; Qwen3: q / k
    norms; Mistral: sliding window), and a greedy generate with the dynamic cache."""
    eager = tiny_model(model_type, DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)
    report = fused_llm.kernelize(model)
    assert len(report.fused_decoders) == model.config.num_hidden_layers, report
    got = _logits(model, tokens)
    # bf16 with random weights: near-flat logits flip a few of 38 top-1s either way.
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())
    with torch.inference_mode():
        out = model.generate(tokens[:1, :5], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 8)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("batch, length", [(2, 11), (1, 80)], ids=["fused layers", "layer's own forward"])
def test_fused_decoder_compiles_fullgraph(batch, length):
    """torch.compile(fullgraph=True) of a kernelized model: no graph break, eager's logits. At
    >= decoder.COMPILED_ORIGINAL_MIN_TOKENS tokens the compiled layer is transformers' own."""
    assert 2 * 11 < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS <= 80
    eager = tiny_llama(DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (batch, length), device=DEVICE)
    ref = _logits(eager, tokens)
    fused_llm.kernelize(model)
    torch._dynamo.reset()
    namespaces, backend = op_namespaces_backend()

    got = _logits(torch.compile(model, fullgraph=True, dynamic=False, backend=backend), tokens)
    ours = {ns for ns in namespaces if ns not in ("aten", "prims")}
    # Large compiled forwards are transformers' own down to the norms (the layer and the
    # RMSNorm swap both hand back): no custom-op call for inductor to stop at.
    assert bool(ours) == (batch * length < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS), ours
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    torch.testing.assert_close(_logits(compiled, tokens), got, rtol=0.02, atol=0.02 * ref.abs().max().item())


def test_fused_decoder_keeps_weights_shared():
    """q / k / v weights are views of the fused tensor: state_dict keeps its keys and shapes."""
    model = tiny_llama(DEVICE, torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused_llm.kernelize(model)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.fused_qkv_weight.data_ptr()


def test_training_mode_keeps_the_original_forward():
    from kernels import Mode

    model = tiny_llama(DEVICE)
    report = fused_llm.kernelize(model, mode=Mode.TRAINING)
    assert not report.swapped and report.kept, "our layers have no backward, so training keeps eager"


def test_report_text():
    model = tiny_llama(DEVICE)
    text = str(fused_llm.kernelize(model))
    assert "LlamaRMSNorm -> rmsnorm_fp8" in text or "LlamaRMSNorm -> _rmsnorm_fp8" in text, text
    assert "SiLUActivation -> swiglu_fp8" in text or "SiLUActivation -> _swiglu_fp8" in text, text
    assert "ApplyRotaryPosEmb.forward" in text, text


def test_bad_source():
    with pytest.raises(ValueError, match="source: expected 'local' or 'hub'"):
        fused_llm.kernel_mapping("nowhere")
