"""Models with random weights built in code, for the tests, the demo and the end-to-end
benchmark: no download, Llama-3-8B-like sizes by default."""

from __future__ import annotations

import torch

# Architecture presets: (config class, sizes and extra config), Llama-3-8B-like sizes.
MODEL_PRESETS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                  num_key_value_heads=8, vocab_size=128256, rope_theta=5e5)),
    "mistral": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                      num_key_value_heads=8, vocab_size=32768, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                                  num_key_value_heads=4, vocab_size=152064)),
    "qwen3": ("Qwen3Config", dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                                  num_key_value_heads=8, vocab_size=151936, head_dim=128)),
}


def build_model(model_type: str, layers: int, device="cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """A causal LM of ``model_type`` (see MODEL_PRESETS) with random weights, ``.eval()``."""
    import transformers

    if model_type not in MODEL_PRESETS:
        raise ValueError(f"model_type: expected one of {sorted(MODEL_PRESETS)}, got {model_type!r}")
    config_name, sizes = MODEL_PRESETS[model_type]
    config = getattr(transformers, config_name)(**{**sizes, "num_hidden_layers": layers, **overrides})
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tiny_model(model_type: str, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A 2-layer, hidden-256 model of ``model_type`` for tests and the demo."""
    return build_model(
        model_type, 2, device, dtype, seed, hidden_size=256, intermediate_size=688, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=512, max_position_embeddings=256, head_dim=32, rms_norm_eps=1e-5,
        **({"sliding_window": 16} if model_type == "mistral" else {}),
    )


def tiny_llama(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A small Llama-architecture model with random weights, defined here so the demo and the
    tests need no download: 2 layers, hidden 256, GQA 8/4 heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
