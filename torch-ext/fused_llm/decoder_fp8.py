"""The fused FP8 decoder layer that ``kernelize`` installs in Llama / Mistral / Qwen2 / Qwen3
models whose projections are ``fused_llm.fp8.FP8Linear`` (``quantize_fp8`` / ``load_fp8``).

One forward per layer, every activation that enters an FP8 GEMM quantized by the op that
produced it, except the attention output (no op here can quantize it: see below):

    step                              op                                         replaces
    input RMSNorm + quantization      rmsnorm-fp8 rms_norm_dynamic_fp8           input_layernorm, q/k/v input quant
    QKV GEMM                          one FP8 GEMM of [W_q; W_k; W_v]            q_proj, k_proj, v_proj
    rotary                            rope-triton apply_rotary_transformers      apply_rotary_pos_emb
    attention                         the model's (sdpa / eager / flash)         unchanged
    attention output quantization     fused_llm.fp8.quantize_activation (torch)  o_proj's input quant
    O GEMM                            FP8 GEMM                                   o_proj
    residual add + RMSNorm + quant    rmsnorm-fp8 fused_add_rms_norm_dynamic_fp8 add, post_attention_layernorm, quant
    gate / up GEMM                    one FP8 GEMM of [W_gate; W_up], bf16 out   gate_proj, up_proj
    SiLU * up + quantization          swiglu-fp8 silu_and_mul_dynamic_fp8        act_fn, *, down_proj's input quant
    down GEMM                         FP8 GEMM                                   down_proj
    residual add                      torch add                                  + residual

The FP8 GEMM: "per-token" on CUDA, skinny-gemm's ``linear_fp8`` (its skinny kernel where its
tuning table measured it faster than cuBLAS, decode sizes on the H100, ``torch._scaled_mm``
row-wise elsewhere); otherwise ``fused_llm.fp8.fp8_matmul``, what the plain-torch model runs
(block-wise ``torch._scaled_mm`` for "block" on CUDA, the fp32 reference on CPU). Scales are
the scheme's: one per token ("per-token") or one per 1 x 128 group ("block"), and the fused
ops compute them exactly as ``quantize_activation`` does (same bytes;
``tests/test_fp8_integration.py``).

Why the MLP is not gated-mlp's ``gated_mlp_fp8``: its FP8 output takes a *static* per-tensor
``out_scale``, and its mainloop takes per-tensor / per-token x scales and per-tensor /
per-channel weight scales. Both schemes here quantize the down projection's input
dynamically (per token, or per 1 x 128 group), and the block scheme's weights have 128 x 128
block scales, so neither scheme can use it as it stands; its bf16 output would need a
separate quantization pass. The gate / up GEMM therefore writes [M, 2U] bf16 and swiglu-fp8
applies SiLU * up and the dynamic quantization in one pass (the fusion this project's
swiglu-fp8 was written for). A gated-mlp epilogue that writes per-1x128-group dynamic FP8 is
possible (a tile spans whole 128-column groups); per-token dynamic output is not, in one pass
(a row's amax spans every tile of the row).

Why the attention output is quantized by plain torch: the attention is the model's own
(sdpa / flash), whose epilogue cannot quantize, and no package here has a bare dynamic
quantization op (rmsnorm-fp8 always normalizes). On CUDA it is four small elementwise /
reduction kernels eagerly, one under torch.compile.

Why the down projection's residual add is a separate add: transformers' model loop passes
one hidden-state tensor between layers, so the next layer cannot take (down, residual)
apart and fuse the add into its input norm; ``torch._scaled_mm`` takes no residual either.

The layer keeps every module: q / k / v (and gate / up) FP8Linear weights become views of the
fused tensors (no second copy), state_dict() still has them one by one.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn

from . import fp8
from .decoder import attention_step, record_settings

# transformers' hidden_act names -> swiglu-fp8's activations
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


def _gemm_name(scheme: str, device: torch.device | str | None) -> str:
    """The GEMM the fused layer runs for ``scheme`` on ``device`` (see the module docstring)."""
    if device is None:
        return "fused_llm.fp8.fp8_matmul, or skinny-gemm linear_fp8 (per-token on CUDA)"
    device = torch.device(device)
    if scheme == "per-token" and device.type == "cuda":
        return fp8.BACKEND_NAMES["skinny"]
    backend = fp8.gemm_backend(device, scheme)
    if backend == "blockwise":
        return f"{fp8.BACKEND_NAMES[backend]} (others: {fp8.BACKEND_NAMES['blockwise-fallback']})"
    return fp8.BACKEND_NAMES[backend]


def steps(scheme: str, device: torch.device | str | None = None) -> list[tuple[str, str]]:
    """(step, op) of the fused FP8 layer for ``scheme``; the GEMM named for ``device``."""
    scales = "per-token scales" if scheme == "per-token" else "per-1x128-group scales"
    gemm = _gemm_name(scheme, device)
    return [
        ("input RMSNorm + FP8 quant", f"rmsnorm-fp8 rms_norm_dynamic_fp8 ({scales})"),
        ("QKV GEMM", f"one GEMM of [W_q; W_k; W_v]: {gemm}"),
        ("rotary", "rope-triton apply_rotary_transformers"),
        ("attention", attention_step(None)),
        ("attention output FP8 quant", f"plain torch (fused_llm.fp8.quantize_activation, {scales}): no fused op exists"),
        ("O GEMM", gemm),
        ("residual add + RMSNorm + FP8 quant", f"rmsnorm-fp8 fused_add_rms_norm_dynamic_fp8 ({scales})"),
        ("gate/up GEMM", f"one GEMM of [W_gate; W_up] to bf16: {gemm}"),
        ("SiLU*up + FP8 quant", f"swiglu-fp8 silu_and_mul_dynamic_fp8 ({scales}); gated-mlp's FP8 epilogue takes a static scale only"),
        ("down GEMM", gemm),
        ("residual add", "torch add"),
    ]


@dataclass(frozen=True)
class Kernels:
    """The packages the fused FP8 layer calls (loaded modules)."""

    rmsnorm: types.ModuleType
    rope: types.ModuleType
    swiglu: types.ModuleType
    skinny: types.ModuleType


ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def is_fp8_layer(layer: nn.Module) -> bool:
    """Whether any projection of the decoder layer is an FP8Linear."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return any(isinstance(getattr(part, name, None), fp8.FP8Linear) for part, names in ((attn, ATTN), (mlp, MLP))
               for name in names)  # fmt: skip


def unsupported_reason(layer: nn.Module) -> str | None:
    """Why this decoder layer keeps its own forward, or None when the fused FP8 one computes it."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return "no self_attn / mlp"
    projs = [(f"self_attn.{n}", getattr(attn, n, None)) for n in ATTN] + [(f"mlp.{n}", getattr(mlp, n, None)) for n in MLP]
    for name, p in projs:
        if not isinstance(p, fp8.FP8Linear):
            return f"{name} is not an FP8Linear (the fused FP8 layer needs all seven projections in FP8)"
    schemes = {p.scheme for _, p in projs}
    if len(schemes) > 1:
        return f"projections of different FP8 schemes {sorted(schemes)}"
    if len({p.weight.device for _, p in projs}) > 1:
        return "projections on different devices"
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act not in HIDDEN_ACTS:
        return f"activation {act!r} (swiglu-fp8 has {sorted(set(HIDDEN_ACTS.values()))})"
    dtype = None
    for norm in ("input_layernorm", "post_attention_layernorm"):
        w = getattr(getattr(layer, norm, None), "weight", None)
        if not isinstance(w, torch.Tensor) or w.dtype not in (torch.float16, torch.bfloat16):
            return f"{norm} weight missing or not float16 / bfloat16"
        if dtype is not None and w.dtype != dtype:
            return "norm weights of different dtypes"
        dtype = w.dtype
    return None


def _fuse(parent: nn.Module, names: tuple[str, ...], attr: str) -> bool:
    """Make the FP8Linear weights / scales / biases of ``names`` views of one tensor each, kept
    on ``parent`` as the non-persistent buffers ``<attr>_weight`` / ``_scale`` / ``_bias`` (not
    in state_dict; they move with ``.to()``, as copies then). Block scheme: only when every part's out_features is a multiple of 128 (a block must not
    straddle two projections); returns whether it fused."""
    projs = [getattr(parent, n) for n in names]
    scheme = projs[0].scheme
    if scheme == "block" and any(p.out_features % fp8.BLOCK for p in projs):
        return False
    with torch.no_grad():
        weight = torch.cat([p.weight for p in projs], dim=0)
        scale = torch.cat([p.weight_scale for p in projs], dim=0)
        has_bias = [p.bias is not None for p in projs]
        bias = None
        if any(has_bias):
            bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=next(
                b.dtype for b in (q.bias for q in projs) if b is not None), device=p.weight.device) for p in projs])  # fmt: skip
        fused = fp8.FP8Linear(weight, scale, scheme, bias)
        w0 = s0 = 0
        for p, hb in zip(projs, has_bias):
            rows, srows = p.weight.shape[0], p.weight_scale.shape[0]
            p._buffers["weight"] = fused.weight[w0:w0 + rows]
            p._buffers["weight_scale"] = fused.weight_scale[s0:s0 + srows]
            if hb:
                p._buffers["bias"] = fused.bias[w0:w0 + rows]
            w0, s0 = w0 + rows, s0 + srows
    parent.register_buffer(f"{attr}_weight", fused.weight, persistent=False)
    parent.register_buffer(f"{attr}_scale", fused.weight_scale, persistent=False)
    parent.register_buffer(f"{attr}_bias", fused.bias, persistent=False)
    return True


def install(layer: nn.Module, kernels: Kernels) -> None:
    """Give ``layer`` (see `unsupported_reason`) the fused FP8 forward."""
    if getattr(layer, "fused_llm_decoder", False):
        return
    attn, mlp = layer.self_attn, layer.mlp
    layer.fused_llm_fp8_scheme = attn.q_proj.scheme
    layer.fused_llm_qkv_fused = _fuse(attn, ("q_proj", "k_proj", "v_proj"), "fused_llm_qkv")
    layer.fused_llm_gate_up_fused = _fuse(mlp, ("gate_proj", "up_proj"), "fused_llm_gate_up")
    record_settings(layer, HIDDEN_ACTS, kernels.rope)
    if layer.fused_llm_fp8_scheme == "block" and attn.q_proj.weight.is_cuda:
        fp8.gemm_backend(attn.q_proj.weight.device, "block")  # the GPU probed now, not under torch.compile
    if attn.q_proj.weight.is_cuda:  # linear_fp8's split-K buffers made now, not inside a compiled CUDA graph
        kernels.skinny.reserve_workspaces(attn.q_proj.weight.device)
    layer.forward = types.MethodType(_make_forward(kernels), layer)
    layer.fused_llm_decoder = "fp8"


def _make_forward(k: Kernels):
    from .decoder import attend, attention_functions

    attention_functions()
    norm_quant, add_norm_quant = k.rmsnorm.rms_norm_dynamic_fp8, k.rmsnorm.fused_add_rms_norm_dynamic_fp8
    apply_rotary, act_quant = k.rope.apply_rotary_transformers, k.swiglu.silu_and_mul_dynamic_fp8
    quantize, fp8_matmul, skinny_fp8 = fp8.quantize_activation, fp8.fp8_matmul, k.skinny.linear_fp8

    def mm(xq, x_scale, weight, weight_scale, scheme, out_dtype, bias):
        if scheme == "per-token" and xq.is_cuda:
            if not torch.compiler.is_compiling():
                fp8.BACKENDS_USED.add("skinny")
            return skinny_fp8(xq, weight, x_scale, weight_scale, bias, out_dtype)
        return fp8_matmul(xq, x_scale, weight, weight_scale, scheme, out_dtype, bias)

    def proj(p, xq, x_scale, scheme, out_dtype):
        return mm(xq, x_scale, p.weight, p.weight_scale, scheme, out_dtype, p.bias)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None, **kwargs):
        attn, mlp = self.self_attn, self.mlp
        in_norm, post_norm = self.input_layernorm, self.post_attention_layernorm
        scheme = self.fused_llm_fp8_scheme
        group = fp8.BLOCK if scheme == "block" else None
        # _scaled_mm's 1x128 scales are read groups-major: the ops write them so on CUDA.
        col_major = group is not None and hidden_states.device.type == "cuda"
        input_shape = hidden_states.shape[:-1]
        hidden = hidden_states.shape[-1]
        dtype = hidden_states.dtype
        head_dim = attn.head_dim

        hq, hs = norm_quant(hidden_states, in_norm.weight, in_norm.variance_epsilon, group_size=group,
                            column_major_scales=col_major)  # fmt: skip
        hq, hs = hq.view(-1, hidden), hs.reshape(-1, hs.shape[-1])
        if self.fused_llm_qkv_fused:
            qkv = mm(hq, hs, attn.fused_llm_qkv_weight, attn.fused_llm_qkv_scale, scheme, dtype, attn.fused_llm_qkv_bias)
        else:
            qkv = torch.cat([proj(attn.q_proj, hq, hs, scheme, dtype), proj(attn.k_proj, hq, hs, scheme, dtype),
                             proj(attn.v_proj, hq, hs, scheme, dtype)], dim=-1)  # fmt: skip
        n_q, n_kv = attn.q_proj.out_features, attn.k_proj.out_features
        heads = qkv.view(*input_shape, -1, head_dim).transpose(1, 2)
        q, key, value = heads.split((n_q // head_dim, n_kv // head_dim, n_kv // head_dim), dim=1)
        out = attend(self, q, key, value, position_embeddings, attention_mask, past_key_values, apply_rotary, kwargs)
        oq, os_ = quantize(out.reshape(-1, n_q), scheme)
        o = proj(attn.o_proj, oq, os_, scheme, dtype).view(*input_shape, hidden)

        hq, hs, residual = add_norm_quant(o, hidden_states, post_norm.weight, post_norm.variance_epsilon,
                                          group_size=group, column_major_scales=col_major)  # fmt: skip
        hq, hs = hq.view(-1, hidden), hs.reshape(-1, hs.shape[-1])
        if self.fused_llm_gate_up_fused:
            gu = mm(hq, hs, mlp.fused_llm_gate_up_weight, mlp.fused_llm_gate_up_scale, scheme, dtype,
                    mlp.fused_llm_gate_up_bias)  # fmt: skip
        else:
            gu = torch.cat([proj(mlp.gate_proj, hq, hs, scheme, dtype), proj(mlp.up_proj, hq, hs, scheme, dtype)], dim=-1)
        aq, as_ = act_quant(gu, group_size=group, activation=self.fused_llm_activation, column_major_scales=col_major)
        down = proj(mlp.down_proj, aq, as_.reshape(-1, as_.shape[-1]), scheme, dtype)
        return residual + down.view(residual.shape)

    return forward
