"""transformers integration: which hub layer names our packages serve, and ``kernelize``.

transformers tags its modules with hub layer names (``LlamaRMSNorm`` → ``"RMSNorm"``, …);
``kernels.kernelize`` swaps the ``forward`` of every tagged module for the layer the active
kernel mapping names. This module builds that mapping for the packages that exist and
reports what was swapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from . import packages

# hub layer name -> (package, layer class in <package>.layers)
LAYERS: dict[str, tuple[str, str]] = {
    "RMSNorm": ("rmsnorm-fp8", "RMSNorm"),
    # The bare activation modules (ACT2FN["silu"], ["gelu_pytorch_tanh"], ["gelu"]). transformers
    # has no hook for a gated activation; the MLP-level swap belongs to gated-mlp.
    "SiLU": ("swiglu-fp8", "SiLU"),
    "GeluTanh": ("swiglu-fp8", "GeluTanh"),
    "GeLU": ("swiglu-fp8", "GeLU"),
    # Each model's apply_rotary_pos_emb, a process-wide singleton module that transformers
    # attaches to its attention modules (use_kernelized_func): swapping it swaps it everywhere.
    "rotary_pos_emb": ("rope-triton", "ApplyRotaryPosEmb"),
    # transformers tags no MLP class; kernelize() tags these (MLP_CLASSES) first.
    "LlamaMLP": ("gated-mlp", "LlamaMLP"),
}
# Gated MLPs with gate_proj / up_proj / down_proj / act_fn and config.hidden_act, which the
# "LlamaMLP" layer serves: (transformers module, class).
MLP_CLASSES = (
    ("transformers.models.llama.modeling_llama", "LlamaMLP"),
    ("transformers.models.mistral.modeling_mistral", "MistralMLP"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2MLP"),
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3MLP"),
)
# Every package ships CUDA (sm80, sm90), ROCm (gfx942) and CPU code.
DEVICES = ("cuda", "rocm", "cpu")

Source = Literal["local", "hub"]


def kernel_mapping(source: Source = "local", devices: tuple[str, ...] = DEVICES) -> dict:
    """The mapping for ``kernels.use_kernel_mapping``: ``local`` loads each package's
    ``build/`` (run ``fused-llm build`` first); ``hub`` names ``fused-llm/<pkg>`` version 1
    (branch ``v1``), which ``LOCAL_KERNELS`` can redirect."""
    from kernels import LayerRepository, LocalLayerRepository

    if source not in ("local", "hub"):
        raise ValueError(f"source: expected 'local' or 'hub', got {source!r}")
    available = set(packages.kernel_packages()) if source == "local" else None
    mapping: dict = {}
    for layer_name, (package, layer_class) in LAYERS.items():
        if source == "local":
            if package not in available:
                continue
            path = packages.package_dir(package)
            if not (path / "build").is_dir():
                raise FileNotFoundError(f"{package} has no build/: run `fused-llm build {package}` first")
            repo = LocalLayerRepository(path, layer_name=layer_class)
        else:
            # Version N lives on branch vN. kernels 0.17.2's LayerRepository(version=N) asks
            # the Hub API for that branch before anything else, even when LOCAL_KERNELS
            # overrides the repo (kernels/layer/layer.py, _resolve_revision); naming the
            # branch loads the same kernel and keeps the LOCAL_KERNELS redirect offline.
            repo = LayerRepository(packages.hub_repo_id(package), layer_name=layer_class, revision=f"v{packages.HUB_VERSION}")
        mapping[layer_name] = {device: repo for device in devices}
    return mapping


@dataclass
class KernelizeReport:
    """Which tagged modules now run one of our layers, and which kept their own forward."""

    swapped: list[tuple[str, str, str]] = field(default_factory=list)  # (module, class, layer)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (module, class)
    # Decoder layers running fused_llm.decoder's forward (module, class), and those that kept
    # transformers' forward with the reason (module, class, reason).
    fused_decoders: list[tuple[str, str]] = field(default_factory=list)
    unfused_decoders: list[tuple[str, str, str]] = field(default_factory=list)
    # Decode projections routed through skinny_gemm.linear (fused_llm.skinny.Route: name, (N, K),
    # the token counts at which the table gives them the skinny kernel), those left on cuBLAS
    # (the table lists no skinny configuration for them), and the device and dtype looked up;
    # all empty with skinny=False.
    skinny: list = field(default_factory=list)
    skinny_kept: list = field(default_factory=list)
    skinny_table: str = ""
    # Decoder layers running fused_llm.decoder_fp8's forward: (module, class, FP8 scheme, device).
    fused_fp8_decoders: list[tuple[str, str, str, str]] = field(default_factory=list)
    # Decoder layers running fused_llm.decoder_w4a16's forward: (module, class, weight format,
    # (step, op) pairs: decoder_w4a16.steps, which say where a QKV / gate-up GEMM stays unfused).
    fused_w4a16_decoders: list[tuple[str, str, str, tuple[tuple[str, str], ...]]] = field(default_factory=list)
    # Whether the model's generate now runs inside fused_llm.overlapped_decode (overlap_decode=True
    # and a transformers generation model).
    overlapped_decode: bool = False
    # Whether its static-cache decode steps on CUDA (greedy or sampled) are replayed from a CUDA graph
    # (capture_decode=True with overlapped_decode: fused_llm.captured_decode).
    captured_decode: bool = False
    # Fused decoder layers whose one-token sdpa attention runs rope-triton's split-KV
    # decode_attention (on a GPU, split_kv_decode=True; decoder.split_kv_decode says where not).
    split_kv_decode: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, cls, layer in self.swapped:
            key = f"{cls} -> {layer}"
            out[key] = out.get(key, 0) + 1
        return out

    def __str__(self) -> str:
        from .decoder import STEPS

        lines = []
        if self.fused_decoders:
            classes = sorted({cls for _, cls in self.fused_decoders})
            lines.append(f"  {len(self.fused_decoders):3d} x {', '.join(classes)} -> fused decoder layer ({STEPS})")
        for scheme, device in sorted({(s, d) for _, _, s, d in self.fused_fp8_decoders}):
            from .decoder_fp8 import steps

            group = [(n, c) for n, c, s, d in self.fused_fp8_decoders if (s, d) == (scheme, device)]
            classes = sorted({cls for _, cls in group})
            lines.append(f"  {len(group):3d} x {', '.join(classes)} -> fused FP8 decoder layer ({scheme}), step by step:")
            lines += [f"        {step}: {op}" for step, op in steps(scheme, device)]
        for fmt, w4_steps in dict.fromkeys((f, s) for _, _, f, s in self.fused_w4a16_decoders):
            group = [cls for _, cls, f, s in self.fused_w4a16_decoders if (f, s) == (fmt, w4_steps)]
            lines.append(f"  {len(group):3d} x {', '.join(sorted(set(group)))} -> fused 4-bit decoder layer ({fmt}), step by step:")
            lines += [f"        {step}: {op}" for step, op in w4_steps]
        for name, cls, reason in self.unfused_decoders:
            lines.append(f"  {name} ({cls}) keeps its forward: {reason}")
        lines += [f"  {n:3d} x {what}" for what, n in self.counts().items()]
        kept = {cls for _, cls in self.kept}
        if kept:
            lines.append(f"  kept their own forward: {len(self.kept)} ({', '.join(sorted(kept))})")
        if self.skinny or self.skinny_kept:
            from .skinny import summary

            lines.append(f"  decode projections (skinny-gemm's table for {self.skinny_table}):")
            lines += [f"  {n:3d} x {name} [{N} x {K}] -> skinny_gemm.linear (skinny kernel at {tokens} tokens, F.linear at others)"
                      for n, name, (N, K), tokens in summary(self.skinny)]  # fmt: skip
            lines += [f"  {n:3d} x {name} [{N} x {K}] keeps F.linear (no skinny entry in the table)"
                      for n, name, (N, K), _ in summary(self.skinny_kept)]  # fmt: skip
        if self.split_kv_decode:
            lines.append(f"  one-token attention: rope-triton decode_attention (split-KV) in {len(self.split_kv_decode)} fused layers")
        if self.overlapped_decode:
            lines.append("  generate: the stop check deferred a step on CUDA (fused_llm.overlapped_decode)")
        if self.captured_decode:
            lines.append("  generate: static-cache decode steps replayed from one CUDA graph (fused_llm.captured_decode)")
        return "kernelized:\n" + ("\n".join(lines) if lines else "  nothing")


def _report(model: nn.Module, fused: list[str]) -> KernelizeReport:
    """What runs where. Modules inside fused decoder layers are not listed one by one: the
    fused forward calls the kernels itself (their swapped forwards would run only if called
    directly)."""
    report = KernelizeReport()
    seen_funcs: set[int] = set()
    inside = tuple(f"{name}." for name in fused)

    def visit(name: str, module: nn.Module, label: str | None = None) -> None:
        if name.startswith(inside):
            return
        cls = type(module)
        layer_name = getattr(cls, "kernel_layer_name", None)
        if layer_name not in LAYERS:
            return
        label = label or cls.__name__
        forward = getattr(module.forward, "__func__", None)
        if forward is not None and forward is not cls.forward:
            report.swapped.append((name, label, f"{forward.__module__.split('.')[0]}.{forward.__qualname__}"))
        else:
            report.kept.append((name, label))

    for name, module in model.named_modules():
        visit(name, module)
        # Hub functions (e.g. "rotary_pos_emb") hang off their users as plain attributes: one
        # shared module per function, reported once, under its first user outside the fused
        # layers (the fused layers call the kernels themselves; a layer that kept its forward
        # runs the swapped function).
        if name.startswith(inside):
            continue
        for fn_name, fn in getattr(module, "_kernel_funcs", {}).items():
            if isinstance(fn, nn.Module) and id(fn) not in seen_funcs:
                seen_funcs.add(id(fn))
                visit(f"{name}.{fn_name}" if name else fn_name, fn, f"{fn_name} (function)")
    return report


def tag_mlp_classes() -> list[type]:
    """Give transformers' gated MLP classes the hub layer name "LlamaMLP"
    (``kernels.replace_kernel_forward_from_hub``), so kernelize can swap their forward.
    Class-level and idempotent; returns the classes tagged."""
    import importlib

    from kernels import replace_kernel_forward_from_hub

    tagged = []
    for module_name, class_name in MLP_CLASSES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        if getattr(cls, "kernel_layer_name", None) is None:
            replace_kernel_forward_from_hub(cls, "LlamaMLP")
        tagged.append(cls)
    return tagged


def kernelize(
    model: nn.Module,
    mode=None,
    *,
    source: Source = "local",
    device: str | None = None,
    use_fallback: bool = True,
    fuse_decoder_layers: bool = True,
    skinny: bool = True,
    overlap_decode: bool = True,
    split_kv_decode: bool = True,
    capture_decode: bool = True,
) -> KernelizeReport:
    """Swap our kernels into ``model`` (in place) and report what was swapped.

    ``mode`` defaults to ``kernels.Mode.INFERENCE``; ``device`` to the model's (``cuda``,
    ``rocm`` or ``cpu``). Only our mapping is active inside the call. With
    ``fuse_decoder_layers`` (default), Llama / Mistral / Qwen2 / Qwen3 decoder layers in
    float16 / bfloat16 get `fused_llm.decoder`'s forward (fused residual add + RMSNorm, one QKV
    GEMM, rope-triton, gated-mlp); layers whose seven projections are ``fused_llm.fp8.FP8Linear``
    of one scheme (``quantize_fp8`` / ``load_fp8``) get `fused_llm.decoder_fp8`'s forward (fused
    norm + dynamic FP8 quantization, FP8 GEMMs, swiglu-fp8); layers whose seven projections are
    machete-w4a16 ``W4A16Linear`` (``quantize_w4a16`` / ``load_w4a16``) get
    `fused_llm.decoder_w4a16`'s forward (one 4-bit GEMM for QKV and one for gate / up,
    rmsnorm-fp8, rope-triton, swiglu-fp8); the others keep theirs with the module-level swaps.
    With ``skinny`` (default, inference modes), the projection GEMMs left on cuBLAS after that
    (QKV, o_proj, down_proj, gate / up where gated-mlp does not take them, lm_head) whose
    shapes skinny-gemm's tuning table lists for this GPU and dtype run through
    ``skinny_gemm.linear`` (`fused_llm.skinny`); ``skinny=False`` leaves them all on cuBLAS (it
    does not undo an earlier call's routing, as ``fuse_decoder_layers=False`` does not unfuse
    layers).
    With ``split_kv_decode`` (default), the fused layers on a GPU run the attention of one decode
    token with a boolean mask (a static cache's) through rope-triton's ``decode_attention``
    (split-KV: the cache cut over many programs, grouped K / V heads read once);
    ``split_kv_decode=False`` leaves it to SDPA (cuDNN with grouped heads, `one_token_gqa`).
    With ``overlap_decode`` (default, inference modes), the model's ``generate`` reads its stop
    flag a step late on CUDA (`fused_llm.generation`: transformers' own deferred stop check, which
    it enables only on MPS), so its host work per token overlaps the GPU's (the same tokens).
    With ``capture_decode`` as well (default), its decode steps (greedy or sampled) on CUDA with a static
    cache are replayed from one CUDA graph (`fused_llm.captured_decode`: the same tokens, the
    host's per-step work reduced to a replay); other calls keep transformers' loop.
    Kernelize after loading the weights and moving the model: the fused layer makes the q / k
    / v weights views of one fused tensor at this point, and the skinny routing looks up the
    GPU the weights are on."""
    from kernels import Mode, use_kernel_mapping
    from kernels import kernelize as hub_kernelize

    from . import decoder_w4a16

    mode = Mode.INFERENCE if mode is None else mode
    mapping = kernel_mapping(source)
    if "LlamaMLP" in mapping:
        tag_mlp_classes()
    # Training keeps transformers' forward: the fused layer has no backward.
    layers = _decoder_layers(model) if fuse_decoder_layers and not (mode & Mode.TRAINING) else []
    fusable = [(name, layer) for name, layer, _, reason in layers if reason is None]
    if fusable and _all_inside(model, [name for name, _ in fusable], ("SiLU", "GeluTanh", "GeLU", "LlamaMLP")):
        # Every activation and MLP is inside a fused layer: no bare swaps that would never run.
        for layer_name in ("SiLU", "GeluTanh", "GeLU", "LlamaMLP"):
            mapping.pop(layer_name, None)
    if fusable and len(fusable) == len(layers):
        # The rotary swap is process-wide (one function object shared by every model of the
        # family, an eager copy included); the fused layers call rope-triton themselves.
        mapping.pop("rotary_pos_emb", None)
    import logging

    # kernels warns for every tagged module the mapping leaves out (the dropped activations).
    kernels_log = logging.getLogger("kernels.layer.layer")
    level = kernels_log.level
    if fusable:
        kernels_log.setLevel(logging.ERROR)
    try:
        with use_kernel_mapping(mapping, inherit_mapping=False):
            hub_kernelize(model, mode=mode, device=device, use_fallback=use_fallback)
    finally:
        kernels_log.setLevel(level)
    kinds = _fused_kinds()
    by_kind = {kind: [(name, layer) for name, layer, k, reason in layers if reason is None and k == kind] for kind in kinds}
    for kind, (module, pkgs) in kinds.items():
        if by_kind[kind]:
            kernels = module.Kernels(*(_load(pkg, source) for pkg in pkgs))
            for _, layer in by_kind[kind]:
                module.install(layer, kernels)
    bf16_fusable, fp8_fusable, w4_fusable = by_kind["bf16"], by_kind["fp8"], by_kind["w4a16"]
    report = _report(model, [name for name, _ in fusable])
    report.fused_decoders = [(name, type(layer).__name__) for name, layer in bf16_fusable]
    report.fused_fp8_decoders = [(name, type(layer).__name__, layer.fused_llm_fp8_scheme, layer.self_attn.q_proj.weight.device.type)
                                 for name, layer in fp8_fusable]  # fmt: skip
    report.fused_w4a16_decoders = [(name, type(layer).__name__, decoder_w4a16.describe(layer), tuple(decoder_w4a16.steps(layer)))
                                   for name, layer in w4_fusable]  # fmt: skip
    report.unfused_decoders = [(name, type(layer).__name__, reason) for name, layer, _, reason in layers if reason is not None]
    for name, layer in fusable:
        if not split_kv_decode:
            layer.fused_llm_decode_attention = None
        if getattr(layer, "fused_llm_decode_attention", None) is not None:
            report.split_kv_decode.append(name)
    if skinny and not (mode & Mode.TRAINING):
        from . import skinny as routing

        # The FP8 layers' GEMMs are FP8Linear (decoder_fp8 gives them skinny-gemm's linear_fp8),
        # the 4-bit layers' W4A16Linear (machete-w4a16): neither is an nn.Linear skinny-gemm takes.
        report.skinny, report.skinny_kept = routing.route(model, _load("skinny-gemm", source), dict(bf16_fusable))
        report.skinny_table = routing.table_key(model)
    if overlap_decode and not (mode & Mode.TRAINING):
        from . import generation

        report.overlapped_decode = generation.overlap_generate(model)
    if not (mode & Mode.TRAINING):
        from . import captured_decode

        if capture_decode and report.overlapped_decode:
            report.captured_decode = captured_decode.enable(model)
        else:  # an earlier call's marking is undone, as split_kv_decode=False undoes its attention
            captured_decode.disable(model)
    return report


def _fused_kinds() -> dict:
    """Each kind of fused decoder layer: its module (``Kernels``, ``install``,
    ``unsupported_reason``) and the packages its ``Kernels`` holds, in the order kernelize
    installs them."""
    from . import decoder, decoder_fp8, decoder_w4a16

    return {"bf16": (decoder, ("rmsnorm-fp8", "rope-triton", "gated-mlp")),
            "fp8": (decoder_fp8, ("rmsnorm-fp8", "rope-triton", "swiglu-fp8", "skinny-gemm")),
            "w4a16": (decoder_w4a16, ("rmsnorm-fp8", "rope-triton", "swiglu-fp8", "machete-w4a16"))}  # fmt: skip


def _kind(layer: nn.Module) -> str:
    """Which fused layer serves this decoder layer: "fp8" (FP8Linear projections,
    fused_llm.decoder_fp8), "w4a16" (W4A16Linear projections, fused_llm.decoder_w4a16) or
    "bf16" (fused_llm.decoder)."""
    from . import decoder_fp8, decoder_w4a16

    if decoder_fp8.is_fp8_layer(layer):
        return "fp8"
    return "w4a16" if decoder_w4a16.is_w4a16_layer(layer) else "bf16"


def _decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module, str, str | None]]:
    """(name, layer, kind (`_kind`), why it keeps its forward or None: the reasons of the fused
    layer of that kind)."""
    from . import decoder

    kinds, classes = _fused_kinds(), decoder.decoder_classes()
    out = []
    for name, m in model.named_modules():
        if isinstance(m, classes):
            kind = _kind(m)
            out.append((name, m, kind, kinds[kind][0].unsupported_reason(m)))
    return out


def _all_inside(model: nn.Module, prefixes: list[str], layer_names: tuple[str, ...]) -> bool:
    """Whether every module tagged with one of ``layer_names`` lies inside one of ``prefixes``."""
    inside = tuple(f"{p}." for p in prefixes)
    return all(
        name.startswith(inside)
        for name, m in model.named_modules()
        if getattr(type(m), "kernel_layer_name", None) in layer_names
    )


def _load(package: str, source: Source):
    """A kernel package as kernelize's mapping loads it: the local build, or the Hub's ``v1``."""
    if source == "local":
        return packages.get_kernel(package)
    import kernels

    return kernels.get_kernel(packages.hub_repo_id(package), revision=f"v{packages.HUB_VERSION}")
