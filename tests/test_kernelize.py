"""End to end: kernelize a tiny random-weight Llama and compare its logits with eager."""

from __future__ import annotations

import copy

import pytest
import torch

import fused_llm
from fused_llm.testing import device

DEVICE = device()
# Float32 logits agree to rounding; bf16 models round every layer, so compare loosely.
DTYPES = [torch.float32, torch.bfloat16]  # bf16 runs the gated-mlp kernel (fp32 keeps the expression)


@pytest.fixture(autouse=True)
def _restore_hub_functions():
    """kernelize swaps transformers' hub functions (apply_rotary_pos_emb) process-wide: put the
    original forwards back so later tests compare against the real eager function."""
    from transformers.models.llama import modeling_llama

    fn = modeling_llama.apply_rotary_pos_emb
    saved = fn.__dict__.get("forward")
    yield
    if saved is None:
        fn.__dict__.pop("forward", None)
    else:
        fn.forward = saved


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens).logits.float()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", ["local", "hub"])
def test_kernelize_tiny_llama(dtype, source):
    eager = fused_llm.tiny_llama(DEVICE, dtype)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)  # before kernelize: its rotary swap is process-wide
    report = fused_llm.kernelize(model, source=source)

    norms = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"]
    acts = [n for n, m in model.named_modules() if type(m).__name__ == "SiLUActivation"]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    assert len(acts) == model.config.num_hidden_layers
    mlps = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaMLP"]
    assert len(mlps) == model.config.num_hidden_layers
    rotary = [n for n, _, layer in report.swapped if layer.endswith("ApplyRotaryPosEmb.forward")]
    assert rotary == ["model.layers.0.self_attn.rotary_pos_emb"], report  # one function, shared
    assert sorted(n for n, _, _ in report.swapped) == sorted(norms + acts + rotary + mlps), report
    assert not report.kept
    layer_of = {n: layer for n, _, layer in report.swapped}
    assert all(layer_of[n].endswith("RMSNorm.forward") for n in norms), report
    assert all(layer_of[n].endswith("SiLU.forward") for n in acts), report
    assert all(layer_of[n].endswith("LlamaMLP.forward") for n in mlps), report

    got = _logits(model, tokens)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    else:
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.97
        torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_training_mode_keeps_the_original_forward():
    from kernels import Mode

    model = fused_llm.tiny_llama(DEVICE)
    report = fused_llm.kernelize(model, mode=Mode.TRAINING)
    assert not report.swapped and report.kept, "our layers have no backward, so training keeps eager"


def test_report_text():
    model = fused_llm.tiny_llama(DEVICE)
    text = str(fused_llm.kernelize(model))
    assert "LlamaRMSNorm -> rmsnorm_fp8" in text or "LlamaRMSNorm -> _rmsnorm_fp8" in text, text
    assert "SiLUActivation -> swiglu_fp8" in text or "SiLUActivation -> _swiglu_fp8" in text, text
    assert "ApplyRotaryPosEmb.forward" in text, text


def test_bad_source():
    with pytest.raises(ValueError, match="source: expected 'local' or 'hub'"):
        fused_llm.kernel_mapping("nowhere")
