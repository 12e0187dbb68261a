"""The fused decoder layer that ``kernelize`` installs in Llama / Mistral / Qwen2 / Qwen3 models.

transformers' decoder layer issues ~45 torch ops per token step (RMSNorm alone is 8:
casts, pow, mean, add, rsqrt, two muls); at decode each costs host time while the GPU waits.
This forward computes the same layer in 9 ops and launches:

    rms_norm (rmsnorm-fp8)                       input_layernorm
    one GEMM of [W_q; W_k; W_v]                  q_proj, k_proj, v_proj
    apply_rotary_transformers (rope-triton)      apply_rotary_pos_emb, transformers' rounding
    cache update + the model's attention         unchanged (sdpa / eager / flash: the config's;
                                                 one-token sdpa with grouped K / V heads: see
                                                 one_token_gqa)
    o_proj
    fused_add_rms_norm (rmsnorm-fp8)             residual add + post_attention_layernorm
    gated_mlp (gated-mlp)                        gate_proj, up_proj, act_fn, * (no [.., 2U] tensor)
    addmm (down_proj with the residual add)      down_proj + residual (one rounding instead of two)

The q / k / v weights become views of one fused [W_q; W_k; W_v] tensor (no second copy);
the layer keeps every module, so state_dict(), the original submodules and ``.to()`` work.
Under torch.compile the packages' functions trace as their registered ops.

The QKV, o_proj and down_proj GEMMs run cuBLAS (``F.linear`` / ``addmm``) unless
``fused_llm.skinny`` routed them to skinny-gemm (`use_skinny`: its table lists the weight's
shape for this GPU), which picks its kernel or cuBLAS per token count.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend

# transformers' hidden_act names -> gated-mlp's activations (gelu_new / gelu_pytorch_tanh: tanh form)
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}

# (transformers module, decoder layer class): the families whose layer this forward computes.
DECODER_CLASSES = (
    ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer"),
    ("transformers.models.mistral.modeling_mistral", "MistralDecoderLayer"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer"),
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3DecoderLayer"),
)

STEPS = "rms_norm, QKV GEMM, rope-triton rotary, attention, o_proj, fused_add_rms_norm, gated-mlp, down_proj + residual"

# The projections of these families' decoder layers (attention, MLP), as module attribute names.
ATTN_PROJS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJS = ("gate_proj", "up_proj", "down_proj")

# Under torch.compile, a forward of at least this many tokens runs the layer's own (transformers')
# forward: inductor fuses its RMSNorms, rotary and SiLU * up into neighbouring kernels, which our
# opaque ops prevent. H100, Llama-3-8B shape, 8 layers, compiled prefill of 1 x T tokens
# (2026-11-23): with our ops 0.82x / 1.00x / 0.97x the compiled original at T = 512 / 1024 / 2048,
# still 0.94x / 1.00x / 0.99x with only the MLP handed back; at decode (1-32 tokens, static-cache
# generate) ours 1.01-1.04x. Eager forwards always take the fused path (1.25-1.30x at prefill).
# The layer's own forward calls its norms, which kernels swapped for rmsnorm-fp8's RMSNorm layer:
# that layer hands >= 64 compiled rows back too (its COMPILED_ORIGINAL_MIN_ROWS), so the
# compiled graph holds no custom op (0.89x -> 1.00x at 1 x 512).
COMPILED_ORIGINAL_MIN_TOKENS = 64


@dataclass(frozen=True)
class Kernels:
    """The three packages the fused layer calls (loaded modules)."""

    rmsnorm: types.ModuleType
    rope: types.ModuleType
    gated_mlp: types.ModuleType


def decoder_classes() -> tuple[type, ...]:
    import importlib

    found = []
    for module_name, class_name in DECODER_CLASSES:
        try:
            found.append(getattr(importlib.import_module(module_name), class_name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def projection_names(model: nn.Module) -> list[str]:
    """The attention and MLP projections of the model's decoder layers (the classes of
    DECODER_CLASSES), as ``named_modules`` names."""
    classes = decoder_classes()
    names = []
    for name, layer in model.named_modules():
        if not isinstance(layer, classes):
            continue
        for part, projs in (("self_attn", ATTN_PROJS), ("mlp", MLP_PROJS)):
            parent = getattr(layer, part, None)
            names += [f"{name}.{part}.{p}" for p in projs if parent is not None and hasattr(parent, p)]
    return names


def unsupported_reason(layer: nn.Module) -> str | None:
    """Why this decoder layer keeps its own forward, or None when the fused one computes it."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return "no self_attn / mlp"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not isinstance(getattr(attn, name, None), nn.Linear):
            return f"self_attn.{name} is not an nn.Linear"
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not isinstance(getattr(mlp, name, None), nn.Linear):
            return f"mlp.{name} is not an nn.Linear"
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act not in HIDDEN_ACTS:
        return f"activation {act!r} (gated-mlp has {sorted(set(HIDDEN_ACTS.values()))})"
    weights = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight]
    dtype = weights[0].dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype} (gated-mlp takes float16 / bfloat16)"
    if any(w.dtype != dtype or w.device != weights[0].device for w in weights):
        return "projection weights of different dtypes or devices"
    for norm in ("input_layernorm", "post_attention_layernorm"):
        w = getattr(getattr(layer, norm, None), "weight", None)
        if not isinstance(w, torch.Tensor) or w.dtype != dtype:
            return f"{norm} weight missing or not in {dtype}"
    return None


def _fuse_qkv(attn: nn.Module) -> None:
    """Make q / k / v_proj's weights (and biases) views of one [W_q; W_k; W_v] tensor, kept on
    the attention module as ``fused_qkv_weight`` / ``fused_qkv_bias`` (not in state_dict)."""
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    with torch.no_grad():
        weight = torch.cat([p.weight for p in projs], dim=0)
        bias = torch.cat([p.bias for p in projs], dim=0) if attn.q_proj.bias is not None else None
        start = 0
        for p in projs:
            rows = p.weight.shape[0]
            p.weight = nn.Parameter(weight[start:start + rows], requires_grad=False)
            if bias is not None:
                p.bias = nn.Parameter(bias[start:start + rows], requires_grad=False)
            start += rows
    attn.register_buffer("fused_qkv_weight", weight, persistent=False)
    attn.register_buffer("fused_qkv_bias", bias, persistent=False)


def refuse_fused(model: nn.Module, quantizer: str, kind: str) -> None:
    """Raise when a decoder layer of ``model`` already runs a fused forward of another kind than
    ``kind`` ("bf16", "fp8", "w4a16": its ``fused_llm_decoder``): that forward computes from its
    own fused tensors of the old weights, so ``quantizer`` swapping the projections under it
    would leave it computing with those. Quantize first, then kernelize."""
    fused = [n for n, m in model.named_modules() if getattr(m, "fused_llm_decoder", kind) != kind]
    if fused:
        raise ValueError(f"model: {fused[0]} (and {len(fused) - 1} more) was kernelized before {quantizer}; "
                         "quantize the model first, then kernelize it")  # fmt: skip


def record_settings(layer: nn.Module, activations: dict[str, str], rope=None) -> None:
    """What every fused forward (bf16, FP8, 4-bit) reads of the layer's config, read once at
    install rather than on every token step: ``fused_llm_activation`` (the MLP's activation by
    the name its kernel uses, from ``activations``: gated-mlp's or swiglu-fp8's table),
    ``fused_llm_sliding_window`` (what `attend` passes to the attention),
    ``fused_llm_gqa_decode`` (`masked_gqa_sdpa` on the layer's device: a model moved to another
    GPU after kernelize keeps the answer of the first) and ``fused_llm_decode_attention``
    (`split_kv_decode`: rope-triton's ``decode_attention`` from ``rope``, the loaded package, or
    None)."""
    attn = layer.self_attn
    layer.fused_llm_activation = activations[layer.mlp.config.hidden_act]
    window = getattr(attn, "sliding_window", None)  # Qwen2 / Qwen3 keep it per layer
    if window is None and "Mistral" in type(attn).__name__:
        window = getattr(attn.config, "sliding_window", None)
    layer.fused_llm_sliding_window = window
    layer.fused_llm_gqa_decode = masked_gqa_sdpa(layer.input_layernorm.weight.device)
    layer.fused_llm_decode_attention = split_kv_decode(rope, layer.input_layernorm.weight.device, window)


def install(layer: nn.Module, kernels: Kernels) -> None:
    """Give ``layer`` (a supported decoder layer, see `unsupported_reason`) the fused forward."""
    if getattr(layer, "fused_llm_decoder", False):
        return
    _fuse_qkv(layer.self_attn)
    record_settings(layer, HIDDEN_ACTS, kernels.rope)
    # The GEMM functions (use_skinny replaces them): attributes read once per call, so a layer
    # whose projections skinny-gemm does not serve runs exactly F.linear / addmm.
    layer.fused_llm_linear_qkv = F.linear
    layer.fused_llm_linear_o = F.linear
    layer.fused_llm_skinny_down = None
    layer.forward = types.MethodType(_make_forward(kernels), layer)
    layer.fused_llm_decoder = "bf16"  # the kind of fused forward (refuse_fused)


def fused_gemms(layer: nn.Module) -> dict[str, torch.Tensor]:
    """The GEMMs of a fused layer's forward that `use_skinny` can route, by name, with their
    weights ("self_attn.qkv": the fused [W_q; W_k; W_v]; gate / up run inside gated-mlp)."""
    attn = layer.self_attn
    return {"self_attn.qkv": attn.fused_qkv_weight, "self_attn.o_proj": attn.o_proj.weight,
            "mlp.down_proj": layer.mlp.down_proj.weight}  # fmt: skip


def use_skinny(layer: nn.Module, name: str, skinny: types.ModuleType | None) -> None:
    """Route the fused layer's GEMM ``name`` (of `fused_gemms`) through the skinny-gemm package
    ``skinny``, or back to cuBLAS (None): QKV and o_proj through ``skinny.linear``; down_proj
    through ``skinny.gemm`` where ``skinny.dispatch_config`` picks the skinny kernel for the
    call's tokens, and through the fused residual ``addmm`` where it picks cuBLAS (``linear`` +
    an add would cost the add). The layer keeps functions, not the package module: a module
    attribute would make ``copy.deepcopy`` of the model fail."""
    if name == "self_attn.qkv":
        layer.fused_llm_linear_qkv = F.linear if skinny is None else skinny.linear
    elif name == "self_attn.o_proj":
        layer.fused_llm_linear_o = F.linear if skinny is None else skinny.linear
    elif name == "mlp.down_proj":
        layer.fused_llm_skinny_down = None if skinny is None else (skinny.dispatch_config, skinny.gemm)
    else:
        raise ValueError(f"name: expected self_attn.qkv, self_attn.o_proj or mlp.down_proj, got {name!r}")


_ATTENTION_FUNCTIONS: list = []


def attention_functions():
    """transformers' attention interface registry, imported once (the fused layers' ``_make_forward``
    call this at install time, so ``attend`` never imports per call or under torch.compile)."""
    if not _ATTENTION_FUNCTIONS:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        _ATTENTION_FUNCTIONS.append(ALL_ATTENTION_FUNCTIONS)
    return _ATTENTION_FUNCTIONS[0]


# One query token against grouped K / V heads with a mask (one_token_gqa): per CUDA device,
# whether SDPA's own backend choice for it is cuDNN and cuDNN computes it right (probed once).
_MASKED_GQA: dict[str, bool] = {}
# kwargs that change what transformers' sdpa_attention_forward computes: with any of them set,
# one_token_gqa leaves the call to it.
_SDPA_SPECIAL_KWARGS = ("softcap", "position_bias", "cache", "is_causal", "output_attentions", "s_aux", "sinks")


def masked_gqa_sdpa(device: torch.device | str) -> bool:
    """Whether `one_token_gqa` runs on ``device``: a CUDA device where SDPA, left to choose,
    picks cuDNN for one query token against grouped K / V heads (``enable_gqa``) with a boolean
    mask, and cuDNN's result matches an fp32 reference (one tiny call, once per device, at
    kernelize). Elsewhere SDPA would run its math kernel there (with repeat_kv's copies 72 us a
    layer at Llama-3-8B shapes and 544 cached positions, against 28 for repeat_kv + cuDNN; H100,
    ``benchmarks/results/decode_attention_sdpa_*``), or cuDNN SDPA is switched off. False off
    CUDA: on CPU, a test target, transformers' path keeps the kernelized model's attention bytes
    those of the plain model."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    name = f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    if name not in _MASKED_GQA:
        _MASKED_GQA[name] = _cudnn_takes_masked_gqa(name)
    return _MASKED_GQA[name]


def _cudnn_takes_masked_gqa(device: str) -> bool:
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, n, s, 64, dtype=torch.bfloat16, device=device, generator=gen)
               for n, s in ((4, 1), (1, 16), (1, 16)))  # fmt: skip
    mask = (torch.arange(16, device=device) < 11).view(1, 1, 1, 16)
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=True)
        if choice != int(SDPBackend.CUDNN_ATTENTION):
            return False
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).float()
        ref = F.scaled_dot_product_attention(q.float(), k.float().expand(1, 4, 16, 64), v.float().expand(1, 4, 16, 64),
                                             attn_mask=mask)  # fmt: skip
        torch.cuda.synchronize(device)
        return bool(torch.allclose(got, ref, rtol=2e-2, atol=2e-2))
    except (RuntimeError, AttributeError, TypeError):  # refused, or a torch without _fused_sdp_choice
        return False


def one_token_gqa(attn, q, key, value, attention_mask, kwargs):
    """transformers' ``sdpa_attention_forward`` for one query token per sequence (decode) with
    grouped K / V heads and a boolean mask, without ``repeat_kv``: SDPA with ``enable_gqa=True``
    reads the cache's ``[B, H_kv, L, D]`` K / V as they are. Same math (query head h reads K / V
    head h // (H / H_kv), as repeat_kv's copies do), same mask, scale and output layout ``[B, 1,
    H, D]``. None where transformers' call is not that or gains nothing from it (no grouped
    heads; no mask, where transformers passes ``enable_gqa`` itself; an additive mask, which
    cuDNN refuses with grouped heads; head sizes above 128 or not a multiple of 8; kwargs that
    change the attention): the caller then runs transformers' function.

    Why: with a mask (always, under torch.compile) transformers repeats K and V to H heads,
    a copy of the whole cache per layer and step: on the H100 (Llama-3-8B shape, 32 / 8 heads,
    D 128, one query, a CUDA graph of 32 layers' caches) repeat_kv + SDPA took 28.2 / 62.6 /
    111.8 us a layer at 544 / 2080 / 4128 cached positions and enable_gqa 14.0 / 16.0 / 20.2
    (cuDNN, SDPA's own choice; benchmarks/results/decode_attention_sdpa_*). Viewing the G
    grouped query heads as G query rows instead (tried before) took 24.8 us at 544."""
    if attention_mask is None or attention_mask.dtype != torch.bool:
        return None
    H, H_kv, D = q.shape[1], key.shape[1], q.shape[-1]
    if H == H_kv or H % H_kv or value.shape[-1] != D or D > 128 or D % 8:
        return None
    for name in _SDPA_SPECIAL_KWARGS:
        v = kwargs.get(name)
        if v is not None and v is not False:
            return None
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=attn.scaling,
                                         enable_gqa=True)  # fmt: skip
    return out.transpose(1, 2).contiguous()


def split_kv_decode(rope, device: torch.device | str, sliding_window: int | None):
    """rope-triton's ``decode_attention`` (split-KV, grouped heads read once, a boolean mask)
    where the fused layers run it for one decode token: on a GPU, with a rope-triton build that
    has it (a Hub build from before keeps SDPA), for layers without a sliding window (their
    static cache wraps around). None elsewhere: on CPU the kernelized model's attention stays
    transformers' (its bytes those of the plain model, which the tests compare)."""
    if rope is None or sliding_window is not None or torch.device(device).type != "cuda":
        return None
    return getattr(rope, "decode_attention", None)


def split_kv_attention(decode_attention, attn, q, key, value, attention_mask, kwargs):
    """transformers' ``sdpa_attention_forward`` for one query token per sequence through
    ``decode_attention`` (`split_kv_decode`): the same math over the same mask, scale and output
    layout ``[B, 1, H, D]``. None where the call is not one it takes (no boolean mask of the
    static cache's ``[B or 1, 1, 1, L]`` form, a dtype other than fp16 / bf16, a head size that
    is not a power of two in 16-256, kwargs that change the attention): the caller goes on."""
    m = attention_mask
    if m is None or m.dtype != torch.bool or m.dim() != 4 or m.shape[1] != 1 or m.shape[2] != 1:
        return None
    D = q.shape[-1]
    if q.dtype not in (torch.float16, torch.bfloat16) or D < 16 or D > 256 or D & (D - 1):
        return None
    if value.shape != key.shape or q.shape[1] % key.shape[1] or m.shape[-1] != key.shape[2]:
        return None
    for name in _SDPA_SPECIAL_KWARGS:
        v = kwargs.get(name)
        if v is not None and v is not False:
            return None
    return decode_attention(q, key, value, m, scale=attn.scaling).transpose(1, 2).contiguous()


def attention_step(gqa_decode: bool | None, split_kv: bool = False) -> str:
    """The attention step as the kernelize reports name it: with the layer's
    ``fused_llm_gqa_decode`` (None: the device is not known here) and whether it has
    ``fused_llm_decode_attention``."""
    base = "the model's attention interface"
    if split_kv:
        return base + "; one-token sdpa with a boolean mask: rope-triton decode_attention (split-KV, split_kv_attention)"
    if gqa_decode is None:
        return base + "; one-token sdpa with a mask: SDPA's grouped heads where cuDNN takes them (one_token_gqa)"
    return base + ("; one-token sdpa with a mask: SDPA's grouped heads, no repeat_kv (one_token_gqa)" if gqa_decode else "")


def attend(layer, q, key, value, position_embeddings, attention_mask, past_key_values, apply_rotary, kwargs):
    """The attention step every fused layer (bf16, FP8, 4-bit) shares: Qwen3's per-head q / k
    norms, rope-triton's rotary on [B, H, S, D] q / k, the cache update, then the model's
    attention interface (sdpa / eager / flash, the config's) with the layer's sliding window;
    one query token with sdpa and a boolean mask goes to rope-triton's split-KV
    ``decode_attention`` on a GPU (`split_kv_attention`, ``fused_llm_decode_attention``), else,
    with grouped K / V heads, to `one_token_gqa` where the layer's device takes it
    (``fused_llm_gqa_decode``). Returns the attention output [B, S, H, D]."""
    attn = layer.self_attn
    if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm (over D) before the rotary
        q, key = attn.q_norm(q), attn.k_norm(key)
    cos, sin = position_embeddings
    q, key = apply_rotary(q, key, cos, sin, 1)  # [B, H, S, D] (unsqueeze_dim 1)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attn.layer_idx)
    implementation = attn.config._attn_implementation
    if q.shape[2] == 1 and implementation == "sdpa" and layer.fused_llm_decode_attention is not None:
        out = split_kv_attention(layer.fused_llm_decode_attention, attn, q, key, value, attention_mask, kwargs)
        if out is not None:
            return out
    if q.shape[2] == 1 and implementation == "sdpa" and layer.fused_llm_gqa_decode:
        out = one_token_gqa(attn, q, key, value, attention_mask, kwargs)
        if out is not None:
            return out
    interface = _ATTENTION_FUNCTIONS[0].get_interface(implementation, _eager_attention)
    if layer.fused_llm_sliding_window is not None:
        kwargs.setdefault("sliding_window", layer.fused_llm_sliding_window)
    out, _ = interface(attn, q, key, value, attention_mask, dropout=0.0, scaling=attn.scaling, **kwargs)
    return out


def _make_forward(k: Kernels):
    attention_functions()
    rms_norm, fused_add_rms_norm = k.rmsnorm.rms_norm, k.rmsnorm.fused_add_rms_norm
    apply_rotary, gated_mlp = k.rope.apply_rotary_transformers, k.gated_mlp.gated_mlp

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        if torch.compiler.is_compiling() and input_shape.numel() >= COMPILED_ORIGINAL_MIN_TOKENS:
            return type(self).forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                      past_key_values=past_key_values, use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
        attn, mlp = self.self_attn, self.mlp
        in_norm, post_norm = self.input_layernorm, self.post_attention_layernorm
        head_dim = attn.head_dim
        n_q = attn.q_proj.out_features
        n_kv = attn.k_proj.out_features

        h = rms_norm(hidden_states, in_norm.weight, in_norm.variance_epsilon)
        qkv = self.fused_llm_linear_qkv(h, attn.fused_qkv_weight, attn.fused_qkv_bias)
        # q, k, v as [B, H, S, D] views of qkv in three view ops (a view costs ~2.4 us of host
        # time on the H100 host; slicing, viewing and transposing each of the three took nine).
        heads = qkv.view(*input_shape, -1, head_dim).transpose(1, 2)
        q, key, value = heads.split((n_q // head_dim, n_kv // head_dim, n_kv // head_dim), dim=1)
        out = attend(self, q, key, value, position_embeddings, attention_mask, past_key_values, apply_rotary, kwargs)
        out = self.fused_llm_linear_o(out.reshape(*input_shape, -1), attn.o_proj.weight, attn.o_proj.bias)

        h, residual = fused_add_rms_norm(out, hidden_states, post_norm.weight, post_norm.variance_epsilon)
        h = gated_mlp(h, mlp.gate_proj.weight, mlp.up_proj.weight, activation=self.fused_llm_activation,
                      bias_gate=mlp.gate_proj.bias, bias_up=mlp.up_proj.bias)
        down = mlp.down_proj
        skinny = self.fused_llm_skinny_down  # (dispatch_config, gemm) of skinny-gemm, or None
        cfg = skinny[0](h, down.weight) if skinny is not None else None
        if cfg is not None:
            return residual + skinny[1](h, down.weight, down.bias, config=cfg)
        if down.bias is not None:
            return residual + F.linear(h, down.weight, down.bias)
        hidden = residual.shape[-1]
        return torch.addmm(residual.view(-1, hidden), h.view(-1, h.shape[-1]), down.weight.t()).view(residual.shape)

    return forward


def _eager_attention(*args, **kwargs):
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward(*args, **kwargs)
