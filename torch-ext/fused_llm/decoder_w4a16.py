"""The fused 4-bit decoder layer that ``kernelize`` installs in Llama / Mistral / Qwen2 / Qwen3
models whose seven projections are machete-w4a16's ``W4A16Linear`` (``quantize_w4a16`` /
``load_w4a16``).

One forward per layer, four 4-bit GEMMs instead of seven:

    step                        op                                          replaces
    input RMSNorm               rmsnorm-fp8 rms_norm                        input_layernorm
    QKV GEMM                    one w4a16_gemm of [W_q; W_k; W_v]           q_proj, k_proj, v_proj
    rotary                      rope-triton apply_rotary_transformers       apply_rotary_pos_emb
    attention                   the model's (sdpa / eager / flash)          unchanged
    O GEMM                      w4a16_gemm                                  o_proj
    residual add + RMSNorm      rmsnorm-fp8 fused_add_rms_norm              add, post_attention_layernorm
    gate / up GEMM              one w4a16_gemm of [W_gate; W_up] -> [.., 2U] gate_proj, up_proj
    act(gate) * up              swiglu-fp8 silu_and_mul (bf16 / fp16 out)   act_fn, *
    down GEMM + residual        w4a16_gemm (down's bias and the residual    down_proj, + residual
                                inside)

Why fuse: at decode a 4-bit GEMM streams its weight once, and a small one cannot fill the GPU.
H100, 2026-11-24, a 32-layer Llama-3-8B-shaped model (group 128), static-cache ``generate`` at
batch 1 (``fused-llm bench e2e --w4a16 --layers 32 --quick --only decode-static --batches 1``):
6.30 ms per token with transformers' layer and seven GEMMs, 4.87 ms with this one (two runs;
the kernelized bf16 model took 9.66 and 8.29 ms in them). In the first run's profile of a
decode step, gate and up took 20 us each in the CUDA graph and q / k / v 8.6 us on average.

In the package's format a fusion along N is a concatenation: qweight rows ([N, K / 8]), scales
/ zeros columns ([K / G, N]), biases. It needs the same group size, zero-point-ness (zeros or
none), scale dtype, device and act-order permutation (``perm``: the same tensor values, or
none) in every fused projection; where they differ, those projections keep one GEMM each
(their modules' tensors) and the report says why. GPTQ's act order derives ``perm`` from the
Hessian of the projection's input, which q / k / v (and gate / up) share.

Memory: the q / k / v (gate / up) ``qweight`` buffers become row slices (views) of the fused
tensor, no second copy. The scales and zeros cannot: the fused [K / G, N] tensor's column slices
are not contiguous, and ``w4a16_gemm`` (so ``W4A16Linear.forward``) takes contiguous ones; the
modules keep theirs and the fused scales / zeros are a copy: 2.1 MiB a Llama-3-8B layer at
group 128 (QKV 32 x 6144 x 2 B + gate/up 32 x 28672 x 2 B), plus 1.1 MiB of zeros where they
exist, ~2% of the layer's 4-bit weights. The biases are copied too (a few KiB). The fused
tensors are non-persistent buffers of self_attn / mlp (``fused_llm_qkv_*``,
``fused_llm_gate_up_*``): state_dict() keeps its keys and values; ``.to()`` moves them (the views
then become copies, as in the other fused layers). ``load_state_dict`` refreshes them (a
post-hook re-fuses the layer from its modules), so a loaded copy of scales is never stale.

The GEMM: ``w4a16_gemm_raw``, the package's public entry on a QuantizedWeight's tensors (what
``W4A16Linear.forward`` calls; ``w4a16_gemm(x, qw)`` adds only the QuantizedWeight unpacking).
A QuantizedWeight built once at install time would not follow ``.to()``, so the forward reads
the fused buffers and calls the raw entry, bypassing the projection modules' ``__call__``.

Why the MLP is not gated-mlp: its kernels read dense 16-bit W_gate / W_up. The residual add
after the down GEMM is ``w4a16_gemm``'s ``residual``: the same bits as the torch add, inside the
small-M kernel's epilogue at decode (one kernel fewer a layer), a torch add after the GEMM
elsewhere. A machete-w4a16 build from before that keyword gets the separate add.

Under torch.compile a forward of >= ``decoder.COMPILED_ORIGINAL_MIN_TOKENS`` tokens runs the
layer's own forward (transformers', with the seven W4A16Linear GEMMs), as the bf16 fused layer
does: that threshold was measured for the bf16 layer (decoder.py); for the 4-bit one it is not.
"""

from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass

import torch
from torch import nn

from .decoder import COMPILED_ORIGINAL_MIN_TOKENS, attention_step, record_settings
from .decoder_fp8 import HIDDEN_ACTS  # swiglu-fp8's activations

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
# The fused tensors of a QuantizedWeight, as buffer suffixes of fused_llm_<qkv|gate_up>_*.
_FIELDS = ("qweight", "scales", "zeros", "perm", "bias")


@dataclass(frozen=True)
class Kernels:
    """The packages the fused 4-bit layer calls (loaded modules)."""

    rmsnorm: types.ModuleType
    rope: types.ModuleType
    swiglu: types.ModuleType
    machete: types.ModuleType


def _is_w4(module) -> bool:
    """machete-w4a16's W4A16Linear, from whichever build loaded it (local, Hub): by name and
    its tensors, since each load of the package is a module of its own."""
    return type(module).__name__ == "W4A16Linear" and all(hasattr(module, a) for a in ("qweight", "scales", "group_size"))


def is_w4a16_layer(layer: nn.Module) -> bool:
    """Whether any projection of the decoder layer is a W4A16Linear."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return any(_is_w4(getattr(part, name, None)) for part, names in ((attn, ATTN), (mlp, MLP)) for name in names)


def unsupported_reason(layer: nn.Module) -> str | None:
    """Why this decoder layer keeps its own forward, or None when the fused 4-bit one computes it."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return "no self_attn / mlp"
    if getattr(layer, "fused_llm_decoder", "w4a16") != "w4a16":
        # kernelize ran on the 16-bit / FP8 layer before quantize_w4a16 swapped its projections:
        # its fused forward still reads the fused tensors of the old weights.
        return "the layer was kernelized before quantize_w4a16 (quantize first, then kernelize)"
    projs = [(f"self_attn.{n}", getattr(attn, n, None)) for n in ATTN] + [(f"mlp.{n}", getattr(mlp, n, None)) for n in MLP]
    for name, p in projs:
        if not _is_w4(p):
            return f"{name} is not a W4A16Linear (the fused 4-bit layer needs all seven projections in 4 bits)"
    if len({p.qweight.device for _, p in projs}) > 1:
        return "projections on different devices"
    dtypes = {p.scales.dtype for _, p in projs}
    if len(dtypes) > 1:
        return f"projections with scales of different dtypes {sorted(str(d) for d in dtypes)}"
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act not in HIDDEN_ACTS:
        return f"activation {act!r} (swiglu-fp8 has {sorted(set(HIDDEN_ACTS.values()))})"
    (dtype,) = dtypes
    for norm in ("input_layernorm", "post_attention_layernorm"):
        w = getattr(getattr(layer, norm, None), "weight", None)
        if not isinstance(w, torch.Tensor) or w.dtype != dtype:
            return f"{norm} weight missing or not in {dtype} (the 4-bit scales' dtype)"
    return None


def _fuse_reason(projs: list[tuple[str, nn.Module]]) -> str | None:
    """Why these projections cannot share one GEMM, or None."""
    (n0, p0), rest = projs[0], projs[1:]
    for name, p in rest:
        if p.group_size != p0.group_size:
            return f"{name} has group size {p.group_size}, {n0} {p0.group_size}"
        if (p.zeros is None) != (p0.zeros is None):
            return f"{name} is {'symmetric' if p.zeros is None else 'zero-point'}, {n0} is not"
        if p.scales.dtype != p0.scales.dtype or p.qweight.device != p0.qweight.device:
            return f"{name} and {n0} differ in scale dtype or device"
        if (p.perm is None) != (p0.perm is None) or (p.perm is not None and not torch.equal(p.perm, p0.perm)):
            return f"{name}'s act-order permutation differs from {n0}'s"
    biases = [p.bias for _, p in projs if p.bias is not None]
    if len({b.dtype for b in biases}) > 1:
        return "biases of different dtypes"
    return None


def _fuse(parent: nn.Module, names: tuple[str, ...], attr: str) -> str | None:
    """Fuse the W4A16Linear projections ``names`` of ``parent`` along N (module docstring):
    their qweights become row views of ``parent.<attr>_qweight``; the concatenated scales,
    zeros and bias, and the shared perm, become ``<attr>_*`` non-persistent buffers and the
    group size ``<attr>_group_size``. Returns None, or why they stay separate (then the
    ``<attr>_*`` buffers are None)."""
    projs = [(n, getattr(parent, n)) for n in names]
    reason = _fuse_reason(projs)
    fused = dict.fromkeys(_FIELDS)
    if reason is None:
        modules = [p for _, p in projs]
        p0 = modules[0]
        with torch.no_grad():
            fused["qweight"] = torch.cat([p.qweight for p in modules], dim=0)
            fused["scales"] = torch.cat([p.scales for p in modules], dim=1)
            if p0.zeros is not None:
                fused["zeros"] = torch.cat([p.zeros for p in modules], dim=1)
            fused["perm"] = p0.perm
            biases = [p.bias for p in modules if p.bias is not None]
            if biases:  # zeros for a projection without one (_fuse_reason: one dtype)
                fused["bias"] = torch.cat([p.bias if p.bias is not None else biases[0].new_zeros(p.out_features)
                                           for p in modules])  # fmt: skip
            start = 0
            for p in modules:
                rows = p.qweight.shape[0]
                p._buffers["qweight"] = fused["qweight"][start:start + rows]
                start += rows
    for field in _FIELDS:
        parent.register_buffer(f"{attr}_{field}", fused[field], persistent=False)
    setattr(parent, f"{attr}_group_size", projs[0][1].group_size)
    return reason


def _fuse_layer(layer: nn.Module) -> None:
    """(Re-)fuse the layer's QKV and gate / up projections; the reasons where they stay separate
    go to ``fused_llm_qkv_unfused`` / ``fused_llm_gate_up_unfused`` (None: fused)."""
    layer.fused_llm_qkv_unfused = _fuse(layer.self_attn, QKV, "fused_llm_qkv")
    layer.fused_llm_gate_up_unfused = _fuse(layer.mlp, GATE_UP, "fused_llm_gate_up")


def _refuse_after_load(layer: nn.Module, incompatible_keys) -> None:
    """load_state_dict post-hook: the fused scales / zeros / biases are copies, and
    ``assign=True`` replaces the qweight views: fuse again from the loaded modules."""
    _fuse_layer(layer)


def describe(layer: nn.Module) -> str:
    """The weight format of a fused 4-bit layer (its q_proj's), for the report."""
    p = layer.self_attn.q_proj
    group = "per channel" if p.group_size == -1 else f"group {p.group_size}"
    return f"{group}, {'symmetric' if p.zeros is None else 'zero-point'}{', act-order' if p.perm is not None else ''}"


def steps(layer: nn.Module) -> list[tuple[str, str]]:
    """(step, op) of a fused 4-bit layer's forward (module docstring), with the reasons where its
    QKV or gate / up GEMMs stay separate."""
    act = layer.fused_llm_activation
    qkv, gate_up = layer.fused_llm_qkv_unfused, layer.fused_llm_gate_up_unfused
    return [
        ("input RMSNorm", "rmsnorm-fp8 rms_norm"),
        ("QKV GEMM", "one machete-w4a16 w4a16_gemm of [W_q; W_k; W_v]" if qkv is None else
         f"three machete-w4a16 w4a16_gemm calls (not fused: {qkv})"),
        ("rotary", "rope-triton apply_rotary_transformers"),
        ("attention", attention_step(layer.fused_llm_gqa_decode, layer.fused_llm_decode_attention is not None)),
        ("O GEMM", "machete-w4a16 w4a16_gemm"),
        ("residual add + RMSNorm", "rmsnorm-fp8 fused_add_rms_norm"),
        ("gate/up GEMM", "one machete-w4a16 w4a16_gemm of [W_gate; W_up] to [.., 2U]" if gate_up is None else
         f"two machete-w4a16 w4a16_gemm calls, concatenated (not fused: {gate_up})"),
        (f"{act}(gate) * up", "swiglu-fp8 silu_and_mul (gated-mlp reads dense weights only)"),
        ("down GEMM + residual", "machete-w4a16 w4a16_gemm(residual=...) (the small-M kernel adds it in its "
         "epilogue)" if layer.fused_llm_residual_in_gemm else "machete-w4a16 w4a16_gemm, then a torch add (a build "
         "without w4a16_gemm's residual)"),
    ]  # fmt: skip


def install(layer: nn.Module, kernels: Kernels) -> None:
    """Give ``layer`` (see `unsupported_reason`) the fused 4-bit forward."""
    if getattr(layer, "fused_llm_decoder", False):
        return
    attn = layer.self_attn
    _fuse_layer(layer)
    layer.register_load_state_dict_post_hook(_refuse_after_load)
    record_settings(layer, HIDDEN_ACTS, kernels.rope)
    layer.fused_llm_residual_in_gemm = _takes_residual(kernels.machete.w4a16_gemm_raw)
    layer.forward = types.MethodType(_make_forward(kernels, layer.fused_llm_residual_in_gemm), layer)
    # The split-K counters now, not on a first call inside a captured graph (skinny-gemm's
    # reserve_workspaces says why): M 33-64 runs the Triton split-K kernel, K split per table.
    kernels.machete.reserve_workspaces(attn.q_proj.qweight.device)
    layer.fused_llm_decoder = "w4a16"


def _takes_residual(gemm) -> bool:
    """Whether this machete-w4a16 build's GEMM adds a residual (a Hub version-1 build from
    before the keyword does not)."""
    return "residual" in inspect.signature(gemm).parameters


def _make_forward(k: Kernels, residual_in_gemm: bool):
    from .decoder import attend, attention_functions

    attention_functions()
    rms_norm, fused_add_rms_norm = k.rmsnorm.rms_norm, k.rmsnorm.fused_add_rms_norm
    apply_rotary, act_and_mul = k.rope.apply_rotary_transformers, k.swiglu.silu_and_mul
    # early_weights: the kernel before each GEMM of this forward is the layer's own norm,
    # attention, activation or previous projection's GEMM, never a write of its weights, so each
    # GEMM may read them while that kernel finishes (machete_w4a16.w4a16_gemm). A machete-w4a16
    # build from before the keyword (a Hub version-1 build) gets the plain call.
    gemm = k.machete.w4a16_gemm_raw
    if "early_weights" in inspect.signature(gemm).parameters:
        gemm = functools.partial(gemm, early_weights=True)

    def proj(p, x):  # a W4A16Linear's GEMM without its module call
        return gemm(x, p.qweight, p.scales, p.zeros, p.perm, p.bias, p.group_size)

    if residual_in_gemm:
        def proj_plus(p, x, residual):  # residual + proj(p, x), in the GEMM's epilogue at decode
            return gemm(x, p.qweight, p.scales, p.zeros, p.perm, p.bias, p.group_size, residual=residual)
    else:
        def proj_plus(p, x, residual):
            return residual + proj(p, x)

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

        h = rms_norm(hidden_states, in_norm.weight, in_norm.variance_epsilon)
        if self.fused_llm_qkv_unfused is None:
            qkv = gemm(h, attn.fused_llm_qkv_qweight, attn.fused_llm_qkv_scales, attn.fused_llm_qkv_zeros,
                       attn.fused_llm_qkv_perm, attn.fused_llm_qkv_bias, attn.fused_llm_qkv_group_size)  # fmt: skip
            # q, k, v as [B, H, S, D] views of qkv in three view ops (decoder.py: host time)
            heads = qkv.view(*input_shape, -1, head_dim).transpose(1, 2)
            n_q, n_kv = attn.q_proj.out_features // head_dim, attn.k_proj.out_features // head_dim
            q, key, value = heads.split((n_q, n_kv, n_kv), dim=1)
        else:
            q, key, value = (proj(p, h).view(*input_shape, -1, head_dim).transpose(1, 2)
                             for p in (attn.q_proj, attn.k_proj, attn.v_proj))  # fmt: skip
        out = attend(self, q, key, value, position_embeddings, attention_mask, past_key_values, apply_rotary, kwargs)
        out = proj(attn.o_proj, out.reshape(*input_shape, -1))

        h, residual = fused_add_rms_norm(out, hidden_states, post_norm.weight, post_norm.variance_epsilon)
        if self.fused_llm_gate_up_unfused is None:
            gu = gemm(h, mlp.fused_llm_gate_up_qweight, mlp.fused_llm_gate_up_scales, mlp.fused_llm_gate_up_zeros,
                      mlp.fused_llm_gate_up_perm, mlp.fused_llm_gate_up_bias, mlp.fused_llm_gate_up_group_size)  # fmt: skip
        else:
            gu = torch.cat([proj(mlp.gate_proj, h), proj(mlp.up_proj, h)], dim=-1)
        return proj_plus(mlp.down_proj, act_and_mul(gu, activation=self.fused_llm_activation), residual)

    return forward
