"""Gated activation (SwiGLU / GeGLU) + FP8 quantization in one pass over memory.

``x`` is ``[..., 2 * d]``: the gate in the first half of the last dimension, the up projection
in the second (the vLLM / kernels-community layout, what a fused ``gate_up_proj`` GEMM
writes). Every function rounds like transformers' ``act_fn(gate) * up``::

    h = act(gate.float()).to(x.dtype)       (silu, gelu with tanh approximation, or gelu)
    y = h * up                              (in x's dtype)
    q = e4m3(clamp(y.float() * (1 / scale), -max, max))          (FP8 variants)

so a kernelized model matches eager, and the FP8 input is exactly the unfused output.
``apply_activation`` (and ``silu`` / ``gelu_tanh`` / ``gelu``) is the bare, ungated activation
``act(x.float()).to(x.dtype)`` that transformers' ``SiLU`` / ``GeluTanh`` / ``GeLU`` modules
compute (the ``layers`` of the same names are their kernelize replacements).
``x`` is float32, float16 or bfloat16 with a unit-stride last dimension and leading
dimensions that flatten to one row stride (row-strided views are read in place).
"""

from __future__ import annotations

import torch

from . import layers
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "apply_activation",
    "silu",
    "gelu_tanh",
    "gelu",
    "silu_and_mul",
    "silu_and_mul_fp8",
    "silu_and_mul_dynamic_fp8",
    "default_fp8_dtype",
    "fp8_max",
    "ACTIVATIONS",
    "layers",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
_GROUP_SIZES = (64, 128)
# Activation name -> the ops' int (fused_llm::swiglu_fp8::Activation).
_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}
ACTIVATIONS = tuple(_ACTIVATIONS)
"""Accepted ``activation=`` names: ``"silu"`` (SwiGLU), ``"gelu_tanh"`` (GeGLU as Gemma's
``gelu_pytorch_tanh``) and ``"gelu"`` (exact, erf-based GeGLU)."""


def default_fp8_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """``float8_e4m3fnuz`` on gfx942-class AMD GPUs (MI300), ``float8_e4m3fn`` elsewhere."""
    if torch.version.hip is not None and torch.cuda.is_available():
        index = torch.device(device).index if device is not None and torch.device(device).type == "cuda" else None
        arch = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).gcnArchName
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 format: 448 (e4m3fn) or 240 (e4m3fnuz)."""
    return _FP8_MAX[fp8_dtype]


# ---------------------------------------------------------------------------------------
# Argument checks: every error names the argument, what was expected and what came.
# ---------------------------------------------------------------------------------------


def _as_rows(t: torch.Tensor, name: str, width: int) -> torch.Tensor:
    """View ``t`` (last dimension ``width``, checked by the caller) as ``[rows, width]``
    without copying, or raise."""
    if width > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension must be contiguous (stride 1), got strides {t.stride()}; "
            "call .contiguous() first"
        )
    try:
        return t.view(-1, width)
    except RuntimeError:
        raise ValueError(
            f"{name}: leading dimensions of shape {tuple(t.shape)} with strides {t.stride()} do not "
            "flatten to one row stride; call .contiguous() first"
        ) from None


def _check_x(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Returns (x as [rows, 2d], d)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x: expected a tensor of shape [..., 2 * d] (gate, up), got a scalar")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    width = x.shape[-1]
    if width == 0 or width % 2:
        raise ValueError(
            f"x: expected an even last dimension 2 * d >= 2 (gate, up), got shape {tuple(x.shape)}"
        )
    return _as_rows(x, "x", width), width // 2


def _check_input(x: torch.Tensor) -> torch.Tensor:
    """The bare activation's input: returns x as [rows, d]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0:
        return x.reshape(1, 1)
    return _as_rows(x, "x", x.shape[-1]) if x.shape[-1] else x.reshape(0, 1)


def _check_activation(activation: str) -> int:
    expected = ", ".join(repr(a) for a in _ACTIVATIONS)
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected a str, one of {expected}, got {type(activation).__name__} {activation!r}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected one of {expected}, got {activation!r}")
    return _ACTIVATIONS[activation]


def _check_fp8_dtype(fp8_dtype: torch.dtype | None, x: torch.Tensor) -> torch.dtype:
    fp8_dtype = fp8_dtype or default_fp8_dtype(x.device)
    if fp8_dtype not in _FP8_MAX:
        raise TypeError(f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {fp8_dtype}")
    return fp8_dtype


def _check_scale(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale: expected a float32 tensor with one element, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"scale: expected dtype torch.float32, got {scale.dtype}")
    if scale.numel() != 1:
        raise ValueError(f"scale: expected one element (per-tensor scale), got shape {tuple(scale.shape)}")
    if scale.device != x.device:
        raise ValueError(f"scale: expected device {x.device} (x's), got {scale.device}")
    return scale.reshape(1)


def _check_group(group_size: int | None, scale_ub: float | None, d: int) -> int:
    if group_size is not None:
        if group_size not in _GROUP_SIZES:
            raise ValueError(f"group_size: expected None (per token), 64 or 128, got {group_size!r}")
        if d % group_size:
            raise ValueError(f"group_size: output width d = {d} is not a multiple of {group_size}")
    if scale_ub is not None and not scale_ub > 0:
        raise ValueError(f"scale_ub: expected a float > 0 or None, got {scale_ub!r}")
    return group_size or 0


def _out(out: torch.Tensor | None, x: torch.Tensor, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The output ``[..., d]`` (allocated when ``out`` is None) and its ``[rows, d]`` view."""
    shape = (*x.shape[:-1], d)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=x.device)
        return out, out.view(-1, d)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out: expected dtype {dtype}, got {out.dtype}")
    if out.device != x.device:
        raise ValueError(f"out: expected device {x.device} (x's), got {out.device}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out: expected shape {shape} (x's with the last dimension halved), got {tuple(out.shape)}")
    return out, _as_rows(out, "out", d)


def _dynamic_scales(x: torch.Tensor, x2: torch.Tensor, d: int, group_size: int | None, scale_ub: float | None,
                    column_major: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Returns (group size or 0 for per token, the [rows, groups] scales the op writes, the
    tensor handed back: [..., groups], or the [rows, groups] column-major view)."""
    rows = x2.shape[0]
    group = _check_group(group_size, scale_ub, d)
    groups = d // group if group else 1
    if column_major:  # [rows, groups] stored groups-major, the layout DeepGEMM-style GEMMs read
        scales = torch.empty((groups, rows), dtype=torch.float32, device=x.device).t()
        return group, scales, scales
    scales = torch.empty((rows, groups), dtype=torch.float32, device=x.device)
    return group, scales, scales.view(*x.shape[:-1], groups)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def apply_activation(x: torch.Tensor, activation: str = "silu", *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The bare activation ``act(x.float()).to(x.dtype)``, x's shape and dtype (transformers'
    ``SiLU`` / ``GeluTanh`` / ``GeLU`` modules; torch's ``F.silu`` / ``F.gelu``). x: any shape
    whose last dimension is contiguous and whose leading dimensions flatten to one row stride."""
    x2 = _check_input(x)
    act = _check_activation(activation)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        if out.dtype != x.dtype:
            raise TypeError(f"out: expected dtype {x.dtype} (x's), got {out.dtype}")
        if out.device != x.device:
            raise ValueError(f"out: expected device {x.device} (x's), got {out.device}")
        if out.shape != x.shape:
            raise ValueError(f"out: expected shape {tuple(x.shape)} (x's), got {tuple(out.shape)}")
    if x2.numel():
        o2 = out.reshape(1, 1) if out.dim() == 0 else _as_rows(out, "out", x2.shape[1])
        ops.activation(o2, x2, act)
    return out


def silu(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.silu(x)``: ``x / (1 + exp(-x))`` in fp32, rounded to x's dtype."""
    return apply_activation(x, "silu", out=out)


def gelu_tanh(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.gelu(x, approximate="tanh")`` in fp32, rounded to x's dtype."""
    return apply_activation(x, "gelu_tanh", out=out)


def gelu(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``F.gelu(x)`` (erf) in fp32, rounded to x's dtype."""
    return apply_activation(x, "gelu", out=out)


# The allocating C++ op as its bare entry point (see silu_and_mul_alloc in torch_binding.cpp;
# OpOverload.__call__ only forwards to ``_op``). Eager only: torch.compile traces the ops.
_SILU_AND_MUL_ALLOC = getattr(ops.silu_and_mul_alloc.default, "_op", ops.silu_and_mul_alloc.default)


def silu_and_mul(x: torch.Tensor, *, activation: str = "silu", out: torch.Tensor | None = None) -> torch.Tensor:
    """``act(x[..., :d]) * x[..., d:]`` of shape ``[..., d]`` in x's dtype."""
    if out is None and isinstance(activation, str) and not torch.compiler.is_compiling():
        # The common case in one C++ call that checks, allocates and launches (27 -> ~11 us of
        # host time a call on the H100 host); what it refuses gets the checks below, which say why.
        act = _ACTIVATIONS.get(activation)
        if act is not None:
            try:
                return _SILU_AND_MUL_ALLOC(x, act)
            except (RuntimeError, TypeError):
                pass
    x2, d = _check_x(x)
    act = _check_activation(activation)
    out, o2 = _out(out, x, d, x.dtype)
    ops.silu_and_mul(o2, x2, act)
    return out


def silu_and_mul_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    *,
    activation: str = "silu",
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(gate) * up`` quantized to FP8 with a static per-tensor ``scale`` (float32, one
    element): ``q = saturate(y / scale)``, shape ``[..., d]``. ``fp8_dtype`` defaults to the
    platform's e4m3 format."""
    x2, d = _check_x(x)
    act = _check_activation(activation)
    scale = _check_scale(scale, x)
    out, o2 = _out(out, x, d, _check_fp8_dtype(fp8_dtype, x))
    ops.silu_and_mul_static_fp8(o2, x2, scale, act)
    return out


def silu_and_mul_dynamic_fp8(
    x: torch.Tensor,
    *,
    group_size: int | None = None,
    scale_ub: float | None = None,
    activation: str = "silu",
    fp8_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(gate) * up`` with dynamic FP8 quantization. Returns ``(q, scales)``: q ``[..., d]``
    and float32 scales of shape ``[..., 1]`` (per token, ``group_size=None``) or
    ``[..., d // group_size]`` (per group of 64 or 128 columns; ``column_major_scales`` returns
    them as a ``[rows, groups]`` view stored groups-major, as block-FP8 GEMMs read them).
    ``scale = max(min(amax, scale_ub) / fp8_max, 1 / (512 fp8_max))``; ``q = saturate(y / scale)``."""
    x2, d = _check_x(x)
    act = _check_activation(activation)
    fp8_dtype = _check_fp8_dtype(fp8_dtype, x)
    group, scales, scales_out = _dynamic_scales(x, x2, d, group_size, scale_ub, column_major_scales)
    out, o2 = _out(None, x, d, fp8_dtype)
    ops.silu_and_mul_dynamic_fp8(o2, scales, x2, group, scale_ub, act)
    return out, scales_out


# ---------------------------------------------------------------------------------------
# torch.compile: the ops mutate only their outputs and return nothing, so the fake
# implementations only have to exist.
# ---------------------------------------------------------------------------------------


@torch.library.register_fake(add_op_namespace_prefix("activation"))
def _activation_fake(out, x, activation) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("silu_and_mul"))
def _silu_and_mul_fake(out, x, activation) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("silu_and_mul_alloc"))
def _silu_and_mul_alloc_fake(x, activation) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


@torch.library.register_fake(add_op_namespace_prefix("silu_and_mul_static_fp8"))
def _silu_and_mul_static_fp8_fake(out, x, scale, activation) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("silu_and_mul_dynamic_fp8"))
def _silu_and_mul_dynamic_fp8_fake(out, scales, x, group_size, scale_ub, activation) -> None:
    return None
