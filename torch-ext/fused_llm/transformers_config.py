"""transformers' own way in: a ``KernelConfig`` that names our layers.

``AutoModelForCausalLM.from_pretrained(path, use_kernels=True, kernel_config=kernel_config(path))``
and ``model.set_use_kernels(True, kernel_config(model))`` then swap the same modules as
``fused_llm.kernelize`` (the same ``LAYERS`` mapping), through transformers' code path: it
validates the mapping against the names the model registers, builds ``kernels`` repositories
from it and calls ``kernels.kernelize`` with the mode the model's ``training`` flag implies.
What a KernelConfig cannot carry is ``fused_llm.kernelize``'s own steps: for fp16 / bf16
models the fused decoder layer (``fused_llm.decoder``: not a hub layer of a kernel package),
and the routing of projection GEMMs through skinny-gemm (``fused_llm.skinny``: transformers
tags no ``nn.Linear``), so on those models the two paths differ by exactly that; in float32 they
swap the same modules.

transformers 5.22.2 accepts a KernelConfig only for the devices in its
``KERNELS_SUPPORTED_DEVICE_TYPES`` (cuda, rocm, xpu, npu, neuron, tpu, mps): on a CPU model it
raises ``Only devices in [...] are supported, got: cpu``, although ``kernels`` itself swaps CPU
layers (``fused_llm.kernelize`` does); tests/test_hub.py widens that list to run the path on CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import nn

from . import packages
from .integration import LAYERS, KernelizeReport, _report, tag_mlp_classes


def registered_layer_names(model: nn.Module) -> set[str]:
    """The hub layer names ``model`` registers, as transformers' KernelConfig collects them:
    modules tagged with ``kernel_layer_name`` and the hub functions in ``_kernel_funcs``."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_kernel_funcs", None) or {})
        if hasattr(module, "kernel_layer_name"):
            names.add(module.kernel_layer_name)
    return names


def _meta_model(model) -> nn.Module:
    """A model (or a config, or a saved model's directory) as a module; a config is
    instantiated on the meta device, which allocates nothing."""
    if isinstance(model, nn.Module):
        return model
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig

    config = model if isinstance(model, PretrainedConfig) else AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config)
        except ValueError:  # not a causal LM: the base model registers the same layers
            return AutoModel.from_config(config)


def kernel_config(
    model: nn.Module | str | Path | object | None = None,
    *,
    source: Literal["hub", "local"] = "hub",
    revision: str | None = None,
):
    """A ``transformers.KernelConfig`` mapping the hub layer names ``model`` registers to our
    layers (every name in ``LAYERS`` when ``model`` is None).

    ``model``: a model, its config, or the directory of a saved model. transformers rejects a
    mapping that names a layer the model does not register (Llama registers no ``GeluTanh``),
    so the mapping holds only the model's names.

    ``source="hub"``: ``"fused-llm/<pkg>:<Layer>"``, which transformers loads as version 1
    (branch ``v1``); ``revision="v1"`` (or a commit) pins a revision instead, which needs no
    Hub call to resolve the version when ``HF_HUB_OFFLINE`` is unset. ``source="local"``: each
    package's directory in this checkout (its ``build/``), ``use_local_kernel=True``.

    ``inherit_mapping=False``: only our layers, as in ``fused_llm.kernelize`` (transformers'
    default mapping would otherwise add kernels-community layers for other names)."""
    from transformers import KernelConfig

    if source not in ("hub", "local"):
        raise ValueError(f"source: expected 'hub' or 'local', got {source!r}")
    if revision is not None and source != "hub":
        raise ValueError("revision applies to source='hub' only")
    if "LlamaMLP" in LAYERS:
        tag_mlp_classes()  # transformers tags no MLP class itself; needed before the model is made
    names = set(LAYERS) if model is None else registered_layer_names(_meta_model(model)) & set(LAYERS)
    mapping: dict[str, str | tuple[str, dict]] = {}
    for layer_name, (package, layer_class) in LAYERS.items():
        if layer_name not in names:
            continue
        if source == "hub":
            ref = f"{packages.hub_repo_id(package)}:{layer_class}"
            mapping[layer_name] = ref if revision is None else (ref, {"revision": revision})
        else:
            path = packages.package_dir(package)
            if not (path / "build").is_dir():
                raise FileNotFoundError(f"{package} has no build/: run `fused-llm build {package}` first")
            mapping[layer_name] = f"{path}:{layer_class}"
    if not mapping:
        raise ValueError(f"the model registers none of our layer names {sorted(LAYERS)}")
    return KernelConfig(mapping, use_local_kernel=source == "local", inherit_mapping=False)


def kernelized_report(model: nn.Module) -> KernelizeReport:
    """What runs where after transformers' kernelize (``from_pretrained(use_kernels=True)``,
    ``set_use_kernels``): the report ``fused_llm.kernelize`` returns, with no fused decoder."""
    return _report(model, [])
