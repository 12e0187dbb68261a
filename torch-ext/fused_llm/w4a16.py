"""4-bit weights under a transformers model: machete-w4a16's ``W4A16Linear`` in place of the
attention and MLP projections of Llama / Mistral / Qwen2 / Qwen3 models.

* :func:`quantize_w4a16` — round-to-nearest quantization of a loaded fp16 / bf16 model, in
  place.
* :func:`load_w4a16` — a model from a GPTQ (v1), AWQ (GEMM) or compressed-tensors
  (``pack-quantized``) safetensors checkpoint on disk (``config.json`` with a
  ``quantization_config``), with ``W4A16Linear`` layers built from the stored tensors: no
  gptqmodel / autoawq / compressed-tensors needed.

Composing with ``fused_llm.kernelize``: a decoder layer whose seven projections are all
``W4A16Linear`` gets the fused 4-bit decoder layer (``fused_llm.decoder_w4a16``): one 4-bit
GEMM of [W_q; W_k; W_v] and one of [W_gate; W_up] (a concatenation along N in this format:
qweight rows, scales / zeros columns) with rmsnorm-fp8, rope-triton and swiglu-fp8 around them;
projections whose group size, zero points or act-order permutation differ keep a GEMM each,
and the report says why. A layer it declines (a 16-bit projection among the 4-bit ones, an
activation swiglu-fp8 lacks: the report says why) keeps transformers' forward, every
projection through its own module, with the module-level swaps (RMSNorm, rotary, SiLU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from . import packages
from .decoder import projection_names, refuse_fused  # projection_names: q/k/v/o_proj, gate/up/down_proj

PACKAGE = "machete-w4a16"
FORMATS = ("gptq", "awq", "compressed-tensors")

Source = Literal["local", "hub"]


def _package(source: Source):
    if source == "local":
        return packages.get_kernel(PACKAGE)
    if source != "hub":
        raise ValueError(f"source: expected 'local' or 'hub', got {source!r}")
    import kernels

    return kernels.get_kernel(packages.hub_repo_id(PACKAGE), revision=f"v{packages.HUB_VERSION}")


@dataclass
class W4A16Report:
    """What was swapped: module names, and the bytes of the swapped weights before and after."""

    swapped: list[str] = field(default_factory=list)
    dense_bytes: int = 0
    packed_bytes: int = 0
    format: str = "rtn"

    def __str__(self) -> str:
        ratio = self.packed_bytes / self.dense_bytes if self.dense_bytes else float("nan")
        return (f"w4a16 ({self.format}): {len(self.swapped)} projections -> W4A16Linear, their weights "
                f"{self.dense_bytes / 2**20:.1f} MiB -> {self.packed_bytes / 2**20:.1f} MiB ({ratio:.3f}x)")  # fmt: skip


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def quantize_w4a16(model: nn.Module, group_size: int = 128, zero_point: bool = False, *, source: Source = "local") -> W4A16Report:
    """Replace every attention and MLP projection (``q/k/v/o_proj``, ``gate/up/down_proj``) of
    the model's Llama / Mistral / Qwen2 / Qwen3 decoder layers by
    ``W4A16Linear.from_linear(linear, group_size, zero_point)`` (round to nearest; see
    machete-w4a16's ``quantize``), in place. The weights must be float16 / bfloat16 (the
    scales keep that dtype). Embeddings, norms and ``lm_head`` stay as they are. Call before
    ``fused_llm.kernelize`` (which then gives these layers the fused 4-bit forward: module
    docstring)."""
    w4 = _package(source)
    names = projection_names(model)
    if not names:
        raise ValueError(f"model: no Llama / Mistral / Qwen2 / Qwen3 decoder layers found in {type(model).__name__}")
    refuse_fused(model, "quantize_w4a16", "w4a16")
    report = W4A16Report()
    for name in names:
        linear = model.get_submodule(name)
        if isinstance(linear, w4.layers.W4A16Linear):
            continue
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"model: {name} is a {type(linear).__name__}, expected an nn.Linear to quantize")
        if linear.weight.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"model: {name}.weight is {linear.weight.dtype}; quantize_w4a16 takes float16 / bfloat16 models "
                            "(model.to(torch.bfloat16) first)")  # fmt: skip
        layer = w4.layers.W4A16Linear.from_linear(linear, group_size=group_size, zero_point=zero_point)
        report.dense_bytes += linear.weight.numel() * linear.weight.element_size()
        report.packed_bytes += layer.quantized_weight().nbytes()
        _set_module(model, name, layer)
        report.swapped.append(name)
    return report


# ---------------------------------------------------------------------------------------------
# Checkpoints on disk
# ---------------------------------------------------------------------------------------------


def checkpoint_format(quant_config: dict) -> str:
    """Which of FORMATS a ``quantization_config`` describes; raises naming what is unsupported
    (bit widths other than 4, GPTQ v2 zero points, AWQ kernels other than GEMM, compressed-
    tensors formats other than pack-quantized or with activation quantization)."""
    method = str(quant_config.get("quant_method", "")).lower()
    if method == "gptq":
        if quant_config.get("bits", 4) != 4:
            raise ValueError(f"quantization_config: gptq with bits={quant_config.get('bits')}; only 4-bit weights are supported")
        fmt = str(quant_config.get("checkpoint_format", "gptq")).lower()
        if fmt != "gptq":
            raise ValueError(f"quantization_config: gptq checkpoint_format {fmt!r}; only 'gptq' (v1 zero points) is supported")
        return "gptq"
    if method == "awq":
        if quant_config.get("bits", quant_config.get("w_bit", 4)) != 4:
            raise ValueError("quantization_config: awq with bits != 4; only 4-bit weights are supported")
        version = str(quant_config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config: awq version {version!r}; only the GEMM packing is supported")
        return "awq"
    if method == "compressed-tensors":
        groups = quant_config.get("config_groups", {})
        for name, group in groups.items():
            weights, acts = group.get("weights") or {}, group.get("input_activations")
            fmt = group.get("format") or quant_config.get("format")
            if weights.get("num_bits") != 4 or weights.get("type", "int") != "int" or acts:
                raise ValueError(f"quantization_config: compressed-tensors group {name!r} is not 4-bit int weight-only: {group}")
            if fmt != "pack-quantized":
                raise ValueError(f"quantization_config: compressed-tensors format {fmt!r}; only 'pack-quantized' is supported")
            if weights.get("strategy") not in ("group", "channel"):
                raise ValueError(f"quantization_config: compressed-tensors strategy {weights.get('strategy')!r}; "
                                 "only 'group' and 'channel' are supported")  # fmt: skip
        return "compressed-tensors"
    raise ValueError(f"quantization_config: quant_method {method!r}; supported: gptq, awq, compressed-tensors")


def _read_safetensors(directory: Path, device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint_dir: no *.safetensors file in {directory}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f), device=str(device)))
    return tensors


def _quantized_weight(w4, fmt: str, t: dict[str, torch.Tensor], prefix: str):
    """The layer ``prefix``'s QuantizedWeight from its stored tensors (popped from ``t``), or
    None when the checkpoint holds it unquantized."""
    def pop(name):
        return t.pop(f"{prefix}.{name}", None)

    if fmt in ("gptq", "awq"):
        if f"{prefix}.qweight" not in t:
            return None
        qweight, qzeros, scales = pop("qweight"), pop("qzeros"), pop("scales")
        if fmt == "gptq":
            return w4.from_gptq(qweight, qzeros, scales, pop("g_idx"))
        return w4.from_awq(qweight, qzeros, scales)
    if f"{prefix}.weight_packed" not in t:
        return None
    return w4.from_compressed_tensors(pop("weight_packed"), pop("weight_scale"), pop("weight_shape"),
                                      pop("weight_zero_point"), pop("weight_g_idx"))  # fmt: skip


def load_w4a16(checkpoint_dir, *, dtype: torch.dtype | None = None, device="cpu", source: Source = "local"):
    """A transformers causal LM from a 4-bit checkpoint directory (``config.json`` with a
    ``quantization_config`` of quant_method gptq (v1), awq (GEMM) or compressed-tensors
    (pack-quantized), and ``*.safetensors``), ``.eval()``, on ``device``.

    Every linear layer stored quantized becomes a ``W4A16Linear`` holding the converted tensors
    (machete-w4a16's ``from_gptq`` / ``from_awq`` / ``from_compressed_tensors``, which check
    them); the other tensors load as usual. ``dtype``: the activation dtype (default: the
    config's ``torch_dtype``, else the scales'); scales stored in another 16-bit dtype are
    converted (rounded) to it. Returns ``(model, report)``."""
    directory, quant_config = read_quantization_config(checkpoint_dir)
    fmt = checkpoint_format(quant_config)
    w4 = _package(source)
    config, dtype, model = meta_model(directory, dtype, torch.float16)
    tensors = _read_safetensors(directory, device)
    report = W4A16Report(format=fmt)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        qw = _quantized_weight(w4, fmt, tensors, name)
        if qw is None:
            continue
        if (qw.N, qw.K) != (module.out_features, module.in_features):
            raise ValueError(f"checkpoint: {name} holds a [{qw.N}, {qw.K}] weight, the model's layer is "
                             f"[{module.out_features}, {module.in_features}]")  # fmt: skip
        bias = tensors.pop(f"{name}.bias", None)
        layer = w4.layers.W4A16Linear.from_quantized(qw.to(dtype=dtype), None if bias is None else bias.to(dtype))
        _set_module(model, name, layer)
        report.swapped.append(name)
        report.dense_bytes += module.in_features * module.out_features * torch.finfo(dtype).bits // 8
        report.packed_bytes += layer.quantized_weight().nbytes()
    if not report.swapped:
        raise ValueError(f"checkpoint_dir: no {fmt} quantized layer found in {directory}")
    return finish_load(model, config, tensors, dtype, device), report


def read_quantization_config(checkpoint_dir) -> tuple[Path, dict]:
    """The first step of a loader of a quantized checkpoint directory: the directory and its
    config.json's ``quantization_config`` (raises naming what is missing; load_w4a16,
    fused_llm.fp8.load_fp8)."""
    directory = Path(checkpoint_dir)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"checkpoint_dir: expected {config_path}")
    quant_config = json.loads(config_path.read_text()).get("quantization_config")
    if quant_config is None:
        raise ValueError(f"checkpoint_dir: {config_path} has no quantization_config (not a quantized checkpoint)")
    return directory, quant_config


def meta_model(directory: Path, dtype: torch.dtype | None, default_dtype: torch.dtype) -> tuple[object, torch.dtype, nn.Module]:
    """The checkpoint's transformers config without its quantization_config (the quantized
    layers are built here, not by transformers' quantizers), the activation dtype (``dtype``,
    else the config's, else ``default_dtype``; float16 or bfloat16) and the causal LM built on
    the meta device (load_w4a16, fused_llm.fp8.load_fp8)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(directory))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if dtype is None:
        dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or default_dtype
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: expected float16 or bfloat16, got {dtype}")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return config, dtype, model


def finish_load(model: nn.Module, config, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device) -> nn.Module:
    """The last steps of a loader that built ``model`` on the meta device and swapped its
    quantized layers in: load the remaining (dense) ``tensors`` in ``dtype``, tie the
    embeddings, rebuild the modules whose non-persistent buffers are still on meta (the rotary
    inv_freq), check that nothing is missing or left over; returns the model ``.eval()`` on
    ``device`` (load_w4a16, fused_llm.fp8.load_fp8)."""
    rest = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(rest, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    # Non-persistent buffers (the rotary inv_freq) were made on meta: rebuild those modules.
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding") and any(b.is_meta for b in module.buffers()):
            with torch.device(device):
                _set_module(model, name, type(module)(config=module.config))
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.device.type == "meta"]
    if left or unexpected:
        raise ValueError(f"checkpoint: tensors missing from the checkpoint {left[:8]}, or unknown to the model {unexpected[:8]}")
    return model.to(device).eval()
