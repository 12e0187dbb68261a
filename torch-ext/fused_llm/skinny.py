"""Decode-time projections through skinny-gemm: what ``kernelize`` routes (``skinny=True``).

After the other swaps a Llama / Mistral / Qwen2 / Qwen3 model still runs these GEMMs on cuBLAS:

* in a fused decoder layer (``fused_llm.decoder``): the QKV GEMM, o_proj and down_proj (an
  ``addmm`` with the residual); gate_proj / up_proj run inside gated-mlp;
* in a decoder layer that keeps transformers' forward (float32, ``fuse_decoder_layers=False``,
  an activation gated-mlp lacks): each q / k / v / o / down_proj ``nn.Linear``, and gate_proj /
  up_proj where gated-mlp does not take the MLP (4-bit and FP8 projections are not
  ``nn.Linear``: their own fused layers run them);
* the model's ``lm_head``.

``skinny_gemm.linear`` runs a GEMM through the skinny kernel where the package's tuning table
measured it faster than cuBLAS for this GPU, dtype, (N, K) and token count, and through
``F.linear`` everywhere else. The routing is decided here once per weight: a projection for
which the table holds no skinny configuration (this GPU, dtype, N, K) at any token count keeps
its cuBLAS call as it was, with no dispatch per call. The others pay ``linear``'s dispatch on each
eager call (argument checks and a dictionary lookup: 3.4 us on top of ``F.linear``'s 5.2 us on
the CPU host where it was measured); under ``torch.compile`` the lookup is a graph constant,
and a CUDA-graph replay (static-cache ``generate``) replays only the kernel it picked.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass

import torch
from torch import nn

from . import decoder

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Route:
    """One projection GEMM: its name (a module, or ``<layer>.self_attn.qkv`` for a fused layer's
    [W_q; W_k; W_v]), its weight's (N, K), and the token counts at which the table gives it the
    skinny kernel ("" where it never does: cuBLAS at every count)."""

    name: str
    shape: tuple[int, int]
    tokens: str


def skinny_tokens(buckets) -> str:
    """The token counts at which ``skinny_gemm.dispatch_buckets``'s ``[(m_max, config or None)]``
    picks the skinny kernel, as ranges ("1-4, 9-16"); "" for none."""
    spans: list[list[int]] = []
    low = 1
    for m_max, cfg in buckets:
        if cfg is not None and low <= m_max:
            if spans and spans[-1][1] == low - 1:
                spans[-1][1] = m_max
            else:
                spans.append([low, m_max])
        low = max(low, m_max + 1)
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def table_key(model: nn.Module) -> str:
    """The device and dtype the routing looked up (the model's first weight's), for the report."""
    w = next(model.parameters(), None)
    if w is None:
        return "no weights"
    where = torch.cuda.get_device_name(w.device) if w.device.type == "cuda" else w.device.type
    return f"{where}, {str(w.dtype).removeprefix('torch.')}"


def _gated_mlp_takes(mlp: nn.Module) -> bool:
    """Whether gated-mlp's MLP layer (kernelize's swap) computes this MLP's gate / up GEMMs: its
    forward swapped and an activation and dtype the kernel has (its layer's own conditions)."""
    swapped = getattr(mlp.forward, "__func__", None) is not type(mlp).forward
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    gate = getattr(mlp, "gate_proj", None)
    return swapped and act in decoder.HIDDEN_ACTS and isinstance(gate, nn.Linear) and gate.weight.dtype in _HALF


def module_projections(model: nn.Module, fused: list[str]) -> list[str]:
    """The projection modules that run as modules (``nn.Linear`` forwards): those of the decoder
    layers outside ``fused`` (gate / up only where gated-mlp does not take them) and lm_head."""
    inside = tuple(f"{n}." for n in fused)
    names = []
    for name in decoder.projection_names(model):
        if name.startswith(inside):
            continue
        parent, _, proj = name.rpartition(".")
        if proj in ("gate_proj", "up_proj") and _gated_mlp_takes(model.get_submodule(parent)):
            continue
        names.append(name)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names += [n for n, m in model.named_modules() if head is not None and m is head]
    return [n for n in names if type(model.get_submodule(n)) is nn.Linear]


def route(model: nn.Module, skinny: types.ModuleType, fused: dict[str, nn.Module]) -> tuple[list[Route], list[Route]]:
    """Route the model's decode projections through the skinny-gemm package ``skinny`` where its
    table lists their weights: the GEMMs of the ``fused`` decoder layers (name -> layer) through
    ``decoder.use_skinny``, projection modules through ``skinny.layers.Linear``'s forward.
    Returns (routed, left on cuBLAS)."""
    routed: list[Route] = []
    kept: list[Route] = []

    def served(name: str, w: torch.Tensor) -> bool:
        entry = Route(name, (w.shape[0], w.shape[1]), skinny_tokens(skinny.dispatch_buckets(w)))
        (routed if entry.tokens else kept).append(entry)
        return bool(entry.tokens)

    for layer_name, layer in fused.items():
        for gemm, w in decoder.fused_gemms(layer).items():
            decoder.use_skinny(layer, gemm, skinny if served(f"{layer_name}.{gemm}", w) else None)
    for name in module_projections(model, list(fused)):
        module = model.get_submodule(name)
        if served(name, module.weight):
            # What kernels.kernelize does with a hub layer: the instance's forward, bound.
            module.forward = types.MethodType(skinny.layers.Linear.forward, module)
    # The split-K buffers made now, not on a first call inside a compiled CUDA graph.
    for device in {weight_of(model, r.name).device for r in routed}:
        skinny.reserve_workspaces(device)
    return routed, kept


def weight_of(model: nn.Module, name: str) -> torch.Tensor:
    """The weight of a Route's GEMM in ``model`` (a fused layer's ``.self_attn.qkv``: its fused
    [W_q; W_k; W_v])."""
    if name.endswith(".self_attn.qkv"):
        return model.get_submodule(name.removesuffix(".qkv")).fused_qkv_weight
    return model.get_submodule(name).weight


def summary(routes: list[Route]) -> list[tuple[int, str, tuple[int, int], str]]:
    """Routes grouped over the decoder layers: (count, name with layer indices as ``*``, shape,
    tokens), in first-seen order."""
    groups: dict[tuple, int] = {}
    for r in routes:
        key = (re.sub(r"\.\d+\.", ".*.", r.name), r.shape, r.tokens)
        groups[key] = groups.get(key, 0) + 1
    return [(n, *key) for key, n in groups.items()]
