"""Residual add + RMSNorm + FP8 quantization in one pass over memory.

All functions accumulate in fp32 and round like transformers' ``LlamaRMSNorm``::

    v = x + residual                  (in x's dtype; the new residual)
    n = (v.float() * rsqrt(mean(v.float()**2) + eps)).to(x.dtype)
    y = n * weight                    (in x's dtype)
    q = e4m3(clamp(y.float() * (1 / scale), -max, max))          (FP8 variants)

so a kernelized model matches eager, and the FP8 input is exactly the unfused output.
``x`` is ``[..., hidden]`` (float32, float16 or bfloat16) with a unit-stride last dimension
and leading dimensions that flatten to one row stride (row-strided views are read in place).
"""

from __future__ import annotations

import torch

from . import layers
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "rms_norm_fp8",
    "fused_add_rms_norm_fp8",
    "rms_norm_dynamic_fp8",
    "fused_add_rms_norm_dynamic_fp8",
    "default_fp8_dtype",
    "fp8_max",
    "layers",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
_GROUP_SIZES = (64, 128)


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


def _as_rows(t: torch.Tensor, name: str, hidden: int | None = None) -> torch.Tensor:
    """View ``t`` as ``[rows, hidden]`` without copying, or raise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 0:
        raise ValueError(f"{name}: expected a tensor of shape [..., hidden], got a scalar")
    h = t.shape[-1]
    if hidden is not None and h != hidden:
        raise ValueError(f"{name}: expected last dimension {hidden}, got shape {tuple(t.shape)}")
    if h == 0:
        raise ValueError(f"{name}: hidden size must be >= 1, got shape {tuple(t.shape)}")
    if h > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension must be contiguous (stride 1), got strides {t.stride()}; "
            "call .contiguous() first"
        )
    try:
        return t.view(-1, h)
    except RuntimeError:
        raise ValueError(
            f"{name}: leading dimensions of shape {tuple(t.shape)} with strides {t.stride()} do not "
            "flatten to one row stride; call .contiguous() first"
        ) from None


def _check_x(x: torch.Tensor) -> torch.Tensor:
    x2 = _as_rows(x, "x")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    return x2


def _check_like(t: torch.Tensor, name: str, x: torch.Tensor, x2: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` must have x's shape and device (and ``dtype``, default x's)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    want = dtype or x.dtype
    if t.dtype != want:
        raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
    if t.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    if t.shape != x.shape:
        raise ValueError(f"{name}: expected shape {tuple(x.shape)} (x's), got {tuple(t.shape)}")
    return _as_rows(t, name, x2.shape[1])


def _check_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: expected shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: expected dtype {x.dtype} (x's), got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight: expected device {x.device} (x's), got {weight.device}")
    return weight.contiguous()


def _check_eps(eps: float) -> float:
    if not isinstance(eps, (float, int)) or eps < 0:
        raise ValueError(f"eps: expected a float >= 0, got {eps!r}")
    return float(eps)


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


def _check_group(group_size: int | None, scale_ub: float | None, hidden: int) -> int:
    if group_size is not None:
        if group_size not in _GROUP_SIZES:
            raise ValueError(f"group_size: expected None (per token), 64 or 128, got {group_size!r}")
        if hidden % group_size:
            raise ValueError(f"group_size: hidden size {hidden} is not a multiple of {group_size}")
    if scale_ub is not None and not scale_ub > 0:
        raise ValueError(f"scale_ub: expected a float > 0 or None, got {scale_ub!r}")
    return group_size or 0


def _out(out: torch.Tensor | None, x: torch.Tensor, x2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None:
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
    return out, _check_like(out, "out", x, x2, dtype)


def _prologue(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The checks every op starts with: x as rows, the weight, eps."""
    x2 = _check_x(x)
    return x2, _check_weight(weight, x), _check_eps(eps)


def _residual(residual: torch.Tensor, x: torch.Tensor, x2: torch.Tensor, inplace: bool):
    """Returns (residual rows, the tensor receiving x + residual, its rows)."""
    r2 = _check_like(residual, "residual", x, x2)
    if inplace:
        return r2, residual, r2
    new = torch.empty_like(residual, memory_format=torch.contiguous_format)
    return r2, new, new.view(r2.shape)


def _dynamic_scales(x: torch.Tensor, x2: torch.Tensor, group_size: int | None, scale_ub: float | None,
                    column_major: bool, given: torch.Tensor | None) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Returns (group size or 0 for per token, the [rows, groups] scales the op writes, the
    tensor handed back: [..., groups], the [rows, groups] column-major view, or ``given``)."""
    rows, hidden = x2.shape
    group = _check_group(group_size, scale_ub, hidden)
    groups = hidden // group if group else 1
    if given is not None:
        if not isinstance(given, torch.Tensor) or given.dtype != torch.float32:
            raise TypeError(f"scales: expected a float32 tensor, got {getattr(given, 'dtype', type(given).__name__)}")
        if given.shape != (rows, groups):
            raise ValueError(f"scales: expected shape ({rows}, {groups}) (rows, groups), got {tuple(given.shape)}")
        if given.device != x.device:
            raise ValueError(f"scales: expected device {x.device} (x's), got {given.device}")
        return group, given, given
    if column_major:  # [rows, groups] stored groups-major, the layout DeepGEMM-style GEMMs read
        scales = torch.empty((groups, rows), dtype=torch.float32, device=x.device).t()
        return group, scales, scales
    scales = torch.empty((rows, groups), dtype=torch.float32, device=x.device)
    return group, scales, scales.view(*x.shape[:-1], groups)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


# The allocating C++ ops as their bare C++ entry points: OpOverload.__call__ only forwards to
# ``_op``, and the extra Python frame cost 1.5 us a call on the H100 host (a decode step makes
# two such calls per layer). Eager only: torch.compile traces the ops themselves.
_RMS_NORM_ALLOC = getattr(ops.rms_norm_alloc.default, "_op", ops.rms_norm_alloc.default)
_FUSED_ADD_RMS_NORM_ALLOC = getattr(ops.fused_add_rms_norm_alloc.default, "_op", ops.fused_add_rms_norm_alloc.default)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x`` scaled by ``weight``; output in x's dtype (``out`` may be ``x``)."""
    if out is None and not torch.compiler.is_compiling():
        # The common case in one C++ call that checks and allocates (24 -> ~13 us of host
        # time a call on the H100 host); what it refuses gets the checks below, which say why.
        try:
            return _RMS_NORM_ALLOC(x, weight, eps)
        except (RuntimeError, TypeError):
            pass
    x2, weight, eps = _prologue(x, weight, eps)
    out, o2 = _out(out, x, x2, x.dtype)
    ops.rms_norm(o2, x2, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``v = x + residual``; returns ``(rms_norm(v), v)``. With ``inplace=True`` ``v`` is
    written into ``residual`` (as inference engines do); ``out`` may be a given tensor,
    ``x`` included."""
    if out is None and not inplace and not torch.compiler.is_compiling():
        try:  # the common case in one C++ call, as in rms_norm
            return _FUSED_ADD_RMS_NORM_ALLOC(x, residual, weight, eps)
        except (RuntimeError, TypeError):
            pass
    x2, weight, eps = _prologue(x, weight, eps)
    r2, res_out, ro2 = _residual(residual, x, x2, inplace)
    out, o2 = _out(out, x, x2, x.dtype)
    ops.fused_add_rms_norm(o2, ro2, x2, r2, weight, eps)
    return out, res_out


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    eps: float = 1e-6,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm quantized to FP8 with a static per-tensor ``scale`` (float32, one element):
    ``q = saturate(y * (1 / scale))`` (a zero scale gives NaN/inf, as the division would). ``fp8_dtype`` defaults to the platform's e4m3 format."""
    x2, weight, eps = _prologue(x, weight, eps)
    scale = _check_scale(scale, x)
    out, o2 = _out(out, x, x2, _check_fp8_dtype(fp8_dtype, x))
    ops.rms_norm_static_fp8(o2, x2, weight, scale, eps)
    return out


def fused_add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    eps: float = 1e-6,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, RMSNorm and static FP8 quantization; returns ``(q, x + residual)``."""
    x2, weight, eps = _prologue(x, weight, eps)
    r2, res_out, ro2 = _residual(residual, x, x2, inplace)
    scale = _check_scale(scale, x)
    out, o2 = _out(out, x, x2, _check_fp8_dtype(fp8_dtype, x))
    ops.fused_add_rms_norm_static_fp8(o2, ro2, x2, r2, weight, scale, eps)
    return out, res_out


def rms_norm_dynamic_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    group_size: int | None = None,
    scale_ub: float | None = None,
    fp8_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with dynamic FP8 quantization. Returns ``(q, scales)``: float32 scales of shape
    ``[rows, 1]`` (per token, ``group_size=None``) or ``[rows, hidden // group_size]``
    (per group of 64 or 128 columns; ``column_major_scales`` stores them groups-major, as
    block-FP8 GEMMs read them). ``scale = max(min(amax, scale_ub) / fp8_max, 1 / (512 fp8_max))``;
    ``q = saturate(y * (1 / scale))``. ``out`` / ``scales`` ([rows, groups] float32, any
    strides) take preallocated outputs."""
    x2, weight, eps = _prologue(x, weight, eps)
    group, scales, scales_out = _dynamic_scales(x, x2, group_size, scale_ub, column_major_scales, scales)
    out, o2 = _out(out, x, x2, _check_fp8_dtype(fp8_dtype, x))
    ops.rms_norm_dynamic_fp8(o2, scales, x2, weight, eps, group, scale_ub)
    return out, scales_out


def fused_add_rms_norm_dynamic_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    group_size: int | None = None,
    scale_ub: float | None = None,
    fp8_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    inplace: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual add, RMSNorm and dynamic FP8 quantization; returns ``(q, scales, x + residual)``
    (scales, ``out`` and ``scales`` as in :func:`rms_norm_dynamic_fp8`)."""
    x2, weight, eps = _prologue(x, weight, eps)
    group, scales, scales_out = _dynamic_scales(x, x2, group_size, scale_ub, column_major_scales, scales)
    out, o2 = _out(out, x, x2, _check_fp8_dtype(fp8_dtype, x))
    r2, res_out, ro2 = _residual(residual, x, x2, inplace)
    ops.fused_add_rms_norm_dynamic_fp8(o2, scales, ro2, x2, r2, weight, eps, group, scale_ub)
    return out, scales_out, res_out


# ---------------------------------------------------------------------------------------
# torch.compile: the ops mutate only their outputs and return nothing, so the fake
# implementations only have to exist.
# ---------------------------------------------------------------------------------------


@torch.library.register_fake(add_op_namespace_prefix("rms_norm"))
def _rms_norm_fake(out, x, weight, eps) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("fused_add_rms_norm"))
def _fused_add_rms_norm_fake(out, residual_out, x, residual, weight, eps) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_alloc"))
def _rms_norm_alloc_fake(x, weight, eps) -> torch.Tensor:
    _same_device(x, weight)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake(add_op_namespace_prefix("fused_add_rms_norm_alloc"))
def _fused_add_rms_norm_alloc_fake(x, residual, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    _same_device(x, residual, weight)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _same_device(*tensors: torch.Tensor) -> None:
    # A meta tensor among real ones sends the call here (the Meta key outranks CPU / CUDA):
    # refuse, so the Python API falls back to its checks and names the argument.
    if len({t.device for t in tensors}) > 1:
        raise RuntimeError("arguments on different devices")


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_static_fp8"))
def _rms_norm_static_fp8_fake(out, x, weight, scale, eps) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("fused_add_rms_norm_static_fp8"))
def _fused_add_rms_norm_static_fp8_fake(out, residual_out, x, residual, weight, scale, eps) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_dynamic_fp8"))
def _rms_norm_dynamic_fp8_fake(out, scales, x, weight, eps, group_size, scale_ub) -> None:
    return None


@torch.library.register_fake(add_op_namespace_prefix("fused_add_rms_norm_dynamic_fp8"))
def _fused_add_rms_norm_dynamic_fp8_fake(out, scales, residual_out, x, residual, weight, eps, group_size, scale_ub) -> None:
    return None
