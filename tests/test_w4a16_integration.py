"""4-bit models end to end (fused_llm.w4a16): quantize_w4a16 on Llama / Mistral / Qwen2 / Qwen3,
composing with kernelize, and load_w4a16 on GPTQ, AWQ and compressed-tensors checkpoints that
the tests write themselves (tiny models, random codes), each checked against the model with
the dequantized weights: for the checkpoints, dequantized by the format's own spec
(machete-w4a16/tests/formats.py), not by the package."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys

import pytest
import torch
from torch import nn

import fused_llm
from fused_llm import packages
from fused_llm import w4a16 as fw
from fused_llm_dev.models import build_model
from fused_llm_dev.testing import device

DEVICE = device()
w4 = packages.get_kernel("machete-w4a16")

_path = packages.package_dir("machete-w4a16") / "tests" / "formats.py"
_spec = importlib.util.spec_from_file_location("w4a16_formats", _path)
fmt = sys.modules.get("w4a16_formats") or importlib.util.module_from_spec(_spec)
if "w4a16_formats" not in sys.modules:
    sys.modules["w4a16_formats"] = fmt
    _spec.loader.exec_module(fmt)

SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
             max_position_embeddings=256, head_dim=32, rms_norm_eps=1e-5)  # fmt: skip


def small_model(model_type: str, dtype=torch.bfloat16, seed: int = 0):
    extra = {"sliding_window": 16} if model_type == "mistral" else {}
    return build_model(model_type, 2, DEVICE, dtype, seed, **SIZES, **extra)


def dequantized_copy(model: nn.Module) -> nn.Module:
    """The model with every W4A16Linear replaced by an nn.Linear holding dequantize(qw)."""
    dense = copy.deepcopy(model)
    for name, module in list(dense.named_modules()):
        if isinstance(module, w4.layers.W4A16Linear):
            lin = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device=DEVICE,
                            dtype=module.scales.dtype)  # fmt: skip
            with torch.no_grad():
                lin.weight.copy_(w4.dequantize(module.quantized_weight()))
                if module.bias is not None:
                    lin.bias.copy_(module.bias)
            fw._set_module(dense, name, lin)
    return dense


def logits(model, tokens) -> torch.Tensor:
    with torch.inference_mode():
        return model(tokens).logits.float()


def assert_logits_close(got, expected, name, frac=2e-2):
    """Both models compute with the same 16-bit weights; they differ only where the GEMMs round
    (fp32 accumulation, one rounding in ours; the dense GEMM's own order), which the two layers
    propagate: 2% of the logits' scale."""
    err = (got - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= frac * scale, f"{name}: max |logit diff| {err:.3g} > {frac:.0%} of {scale:.3g}"


@pytest.fixture(autouse=True)
def _restore_hub_functions():
    """kernelize swaps transformers' hub functions process-wide: restore them (as test_kernelize)."""
    from transformers.models.llama import modeling_llama

    fn = modeling_llama.apply_rotary_pos_emb
    saved = fn.__dict__.get("forward")
    yield
    if saved is None:
        fn.__dict__.pop("forward", None)
    else:
        fn.forward = saved


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_quantize_w4a16(model_type):
    model = small_model(model_type)
    report = fw.quantize_w4a16(model, group_size=64, zero_point=model_type == "qwen2")
    assert len(report.swapped) == 7 * 2, report.swapped
    assert all(isinstance(model.get_submodule(n), w4.layers.W4A16Linear) for n in report.swapped)
    assert 0.25 < report.packed_bytes / report.dense_bytes < 0.29, str(report)
    tokens = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    assert_logits_close(logits(model, tokens), logits(dequantized_copy(model), tokens), model_type)


@pytest.mark.kernels_ci
def test_quantize_then_kernelize():
    """kernelize after quantize_w4a16: every 4-bit layer gets the fused 4-bit decoder layer
    (fused_llm.decoder_w4a16; tests/test_decoder_w4a16.py tests it in detail), the final norm
    is swapped, and the logits match the quantized model's."""
    model = small_model("llama")
    fw.quantize_w4a16(model, group_size=128)
    tokens = torch.randint(0, 512, (1, 7), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    expected = logits(model, tokens)
    report = fused_llm.kernelize(model)
    assert len(report.fused_w4a16_decoders) == 2 and not report.fused_decoders and not report.unfused_decoders, report
    assert any("RMSNorm" in what for what in report.counts()), report
    assert_logits_close(logits(model, tokens), expected, "kernelized 4-bit")


def test_quantize_w4a16_bad_input():
    with pytest.raises(TypeError, match=r"quantize_w4a16 takes float16 / bfloat16 models"):
        fw.quantize_w4a16(small_model("llama", torch.float32))
    with pytest.raises(ValueError, match="no Llama / Mistral / Qwen2 / Qwen3 decoder layers"):
        fw.quantize_w4a16(nn.Sequential(nn.Linear(8, 8)))


# ---------------------------------------------------------------------------------------------
# Checkpoints written here, loaded with load_w4a16
# ---------------------------------------------------------------------------------------------

QUANT_CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": False, "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm", "zero_point": True},
    "compressed-tensors": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "format": "pack-quantized",
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                                  "group_size": 64}}},
    },
}  # fmt: skip


def write_checkpoint(directory, model_type: str, fmt_name: str, symmetric: bool = False):
    """A small fp16 model saved as ``fmt_name`` with random codes, zeros and scales (GPTQ with
    act-order g_idx); returns the reference model: the same model with every projection's
    weight dequantized by the format's own spec."""
    from safetensors.torch import save_file

    model = small_model(model_type, torch.float16, seed=3).cpu()
    g = torch.Generator().manual_seed(4)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    reference = copy.deepcopy(model)
    G = 64
    for name in fw.projection_names(model):
        lin = model.get_submodule(name)
        N, K = lin.out_features, lin.in_features
        zero_range = {"gptq": (1, 16), "awq": (0, 15), "compressed-tensors": (0, 15)}[fmt_name]
        q, z, s = fmt.random_codes(N, K, K // G, g, torch.float16, zero_range)
        s = s.abs() * (8.0 / K**0.5)  # dequantized weights of order 1 / sqrt(K)
        if symmetric:
            z = torch.full_like(z, 8)
        del state[f"{name}.weight"]
        if fmt_name == "gptq":
            g_idx = fmt.act_order_g_idx(K, G, g)
            qweight, qzeros, scales, g_idx = fmt.write_gptq(q, z, s, g_idx)
            parts = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
            w = fmt.read_gptq(qweight, qzeros, scales, g_idx)
        elif fmt_name == "awq":
            qweight, qzeros, scales = fmt.write_awq(q, z, s)
            parts = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
            w = fmt.read_awq(qweight, qzeros, scales)
        else:
            parts = fmt.write_compressed_tensors(q, z, s, symmetric=symmetric)
            w = fmt.read_compressed_tensors(**parts)
        state.update({f"{name}.{k}": v for k, v in parts.items()})
        with torch.no_grad():
            reference.get_submodule(name).weight.copy_(w)
    save_file(state, str(directory / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = copy.deepcopy(QUANT_CONFIGS[fmt_name])
    if symmetric:
        config["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = True
    config["torch_dtype"] = "float16"
    (directory / "config.json").write_text(json.dumps(config, default=str))
    return reference.to(DEVICE)


@pytest.mark.parametrize(
    "fmt_name, model_type, symmetric",
    [("gptq", "llama", False), ("awq", "llama", False), ("compressed-tensors", "llama", False),
     ("compressed-tensors", "qwen2", True), ("gptq", "qwen3", False)],
)  # fmt: skip
def test_load_w4a16(tmp_path, fmt_name, model_type, symmetric):
    reference = write_checkpoint(tmp_path, model_type, fmt_name, symmetric)
    model, report = fw.load_w4a16(tmp_path, device=DEVICE)
    assert report.format == fmt_name and len(report.swapped) == 14, report
    layer = model.get_submodule(report.swapped[0])
    assert isinstance(layer, w4.layers.W4A16Linear) and layer.scales.dtype == torch.float16
    assert (layer.perm is not None) == (fmt_name == "gptq") and (layer.zeros is None) == symmetric
    tokens = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    assert_logits_close(logits(model, tokens), logits(reference, tokens), f"{fmt_name} {model_type}")
    # The loaded weights are the format's own dequantization, bit for bit.
    for name in report.swapped:
        assert torch.equal(w4.dequantize(model.get_submodule(name).quantized_weight()), reference.get_submodule(name).weight), name


@pytest.mark.kernels_ci
def test_load_w4a16_ci(tmp_path):
    test_load_w4a16(tmp_path, "awq", "llama", False)


@pytest.mark.parametrize(
    "change, match",
    [({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
     ({"quant_method": "gptq", "bits": 8}, "gptq with bits=8"),
     ({"quant_method": "gptq", "checkpoint_format": "gptq_v2"}, "checkpoint_format 'gptq_v2'"),
     ({"quant_method": "awq", "version": "gemv"}, "awq version 'gemv'")],
)  # fmt: skip
def test_load_w4a16_unsupported(tmp_path, change, match):
    write_checkpoint(tmp_path, "llama", "awq")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"].update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        fw.load_w4a16(tmp_path)
