"""int4-weight x 16-bit-activation GEMM (W4A16): ``y = x @ dequantize(qw)^T + bias``.

Weights are 4-bit codes with one fp16 / bf16 scale (and optionally a zero point) per group of
input columns, in ONE prepacked layout (:class:`QuantizedWeight`) that every kernel reads; it
is made by :func:`quantize` (round to nearest) or converted from GPTQ, AWQ and
compressed-tensors checkpoints. ``dequantize(qw)`` defines the semantics: ``w = (q - z) * s``,
rounded once to x's dtype.

One Triton source serves CUDA (sm80, sm90) and ROCm (gfx942): a split-K kernel for small M
(decode: the weight stream is the whole cost) and a tiled kernel for large M, and their tiles:
the committed tuning table's entry for the GPU, dtype, shape and M bucket (``_tuning.py``,
written by ``benchmarks/tune.py``; empty until a GPU measures it), else a structural default
picked by M. On
CPU the op runs a plain-torch implementation with the same semantics, unless
``TRITON_INTERPRET=1`` is set before the first call, in which case CPU tensors go through the
Triton kernels in Triton's interpreter (how CI tests the kernel code without a GPU).

* :func:`quantize`, :func:`dequantize`, :func:`from_gptq`, :func:`from_awq`,
  :func:`from_compressed_tensors` — the format (plain torch, any device).
* :func:`w4a16_gemm` — the GEMM.
* ``layers.W4A16Linear`` — an ``nn.Module`` holding a quantized weight.
"""

from __future__ import annotations


import torch

from . import _reference, layers
from ._format import (
    QuantizedWeight,
    dequantize,
    from_awq,
    from_compressed_tensors,
    from_gptq,
    pack_int4,
    quantize,
    unpack_int4,
)
from ._light_ops import define_op
from ._triton_launch import triton_enabled_for, workspace_device, zeroed_buffer
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "QuantizedWeight",
    "dequantize",
    "from_awq",
    "from_compressed_tensors",
    "from_gptq",
    "layers",
    "pack_int4",
    "quantize",
    "reserve_workspaces",
    "triton_enabled_for",
    "unpack_int4",
    "w4a16_gemm",
    "w4a16_gemm_raw",
]

_DTYPES = (torch.float16, torch.bfloat16)




def _triton_kernels():
    from . import _kernels

    return _kernels


def reserve_workspaces(device: torch.device | str, tiles: int = 1 << 14) -> None:
    """Allocate ``device``'s zeroed split-K arrival counters (``tiles`` output tiles) now. The
    kernels otherwise make them on the first call with a K split; inside a torch.compile'd CUDA
    graph (cudagraph trees: transformers' static-cache decode) that allocation comes from the
    graph's pool and outlives it, which cudagraph trees refuses. ``fused_llm.kernelize`` calls
    this for 4-bit layers' device. A no-op off CUDA."""
    dev = workspace_device(device)
    if dev is None:
        return
    kern = _triton_kernels()
    zeroed_buffer(kern._COUNTERS, dev, tiles, torch.int32)


def _run_w4a16(
    out: torch.Tensor,
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    perm: torch.Tensor | None,
    bias: torch.Tensor | None,
    group_size: int,
    early_weights: bool = False,
    residual: torch.Tensor | None = None,
) -> None:
    """x [M, K], the QuantizedWeight's tensors, bias [N] or None, residual [M, N] or None;
    writes out [M, N]. ``early_weights``, ``residual``: :func:`w4a16_gemm_raw`'s."""
    if x.shape[0] == 0 or out.shape[1] == 0:
        return
    if triton_enabled_for(x):
        _triton_kernels().launch_w4a16(x, qweight, scales, zeros, perm, bias, out, group_size,
                                       early_weights=early_weights, residual=residual)
    else:
        _reference.w4a16_gemm(x, qweight, scales, zeros, perm, bias, out, group_size)
        if residual is not None:
            out.add_(residual)


def _returns_nothing(*args) -> None:
    """The fake implementation of an op that only writes its declared output."""
    return


# A low-dispatch-cost op (see _light_ops): an eager w4a16_gemm call runs _run_w4a16 directly.
define_op(
    add_op_namespace_prefix("w4a16_gemm"),
    "(Tensor(a!) out, Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? perm, Tensor? bias, "
    "int group_size, bool early_weights=False, Tensor? residual=None) -> ()",
    _run_w4a16, _returns_nothing,
)


# ---------------------------------------------------------------------------------------------
# Argument checks: every error names the argument, what was expected and what came
# ---------------------------------------------------------------------------------------------


def _check_residual(residual, x, N: int) -> None:
    """``residual`` of w4a16_gemm: the output's shape, x's dtype and device."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual: expected a torch.Tensor or None, got {type(residual).__name__}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual: expected dtype {x.dtype} (x's), got {residual.dtype}")
    if residual.device != x.device:
        raise ValueError(f"residual: expected device {x.device} (x's), got {residual.device}")
    if tuple(residual.shape) != (*x.shape[:-1], N):
        raise ValueError(f"residual: expected shape {(*x.shape[:-1], N)} (the output's), got {tuple(residual.shape)}")


def _check_operands(x, qweight, scales, zeros, perm, bias, group_size) -> None:
    """Everything w4a16_gemm needs, checked before anything is allocated or written. The
    weight's tensors are named as QuantizedWeight's fields (``qw.qweight``, ...)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x: expected dtype float16 or bfloat16, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"x: expected shape [..., K], got {tuple(x.shape)}")
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.int32 or qweight.dim() != 2:
        got = f"{qweight.dtype} {tuple(qweight.shape)}" if isinstance(qweight, torch.Tensor) else type(qweight).__name__
        raise ValueError(f"qw.qweight: expected an int32 tensor [N, K / 8], got {got}")
    N, K = qweight.shape[0], qweight.shape[1] * 8
    if x.shape[-1] != K:
        raise ValueError(f"x: expected shape [..., {K}] (K = qw.K), got {tuple(x.shape)}")
    for name, t in (("qw.qweight", qweight), ("qw.scales", scales), ("qw.zeros", zeros), ("qw.perm", perm), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    if not qweight.is_contiguous():
        raise ValueError(f"qw.qweight: expected a contiguous tensor, got strides {qweight.stride()}")
    if group_size != -1 and (group_size < 16 or group_size & (group_size - 1) or K % group_size):
        raise ValueError(f"qw.group_size: expected -1 or a power of two >= 16 dividing K = {K}, got {group_size}")
    groups = 1 if group_size == -1 else K // group_size
    if scales.dtype != x.dtype:
        raise TypeError(f"qw.scales: expected dtype {x.dtype} (x's; convert with qw.to(dtype=...)), got {scales.dtype}")
    if tuple(scales.shape) != (groups, N) or not scales.is_contiguous():
        raise ValueError(f"qw.scales: expected a contiguous [{groups}, {N}] tensor, got {tuple(scales.shape)}")
    if zeros is not None and (zeros.dtype != torch.uint8 or tuple(zeros.shape) != (groups, N) or not zeros.is_contiguous()):
        raise ValueError(f"qw.zeros: expected a contiguous uint8 [{groups}, {N}] tensor, got {zeros.dtype} {tuple(zeros.shape)}")
    if perm is not None and (perm.dtype != torch.int32 or tuple(perm.shape) != (K,) or not perm.is_contiguous()):
        raise ValueError(f"qw.perm: expected a contiguous int32 [{K}] tensor, got {perm.dtype} {tuple(perm.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"bias: expected dtype {x.dtype} (x's) or float32, got {bias.dtype}")
        if tuple(bias.shape) != (N,):
            raise ValueError(f"bias: expected shape ({N},), got {tuple(bias.shape)}")


def w4a16_gemm_raw(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    perm: torch.Tensor | None,
    bias: torch.Tensor | None,
    group_size: int,
    *,
    residual: torch.Tensor | None = None,
    early_weights: bool = False,
) -> torch.Tensor:
    """:func:`w4a16_gemm` on a QuantizedWeight's tensors (what ``layers.W4A16Linear`` calls:
    no QuantizedWeight is built per call). Same checks, same result, same ``residual`` and
    ``early_weights``."""
    _check_operands(x, qweight, scales, zeros, perm, bias, group_size)
    N, K = qweight.shape[0], x.shape[-1]
    if residual is not None:
        _check_residual(residual, x, N)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    x2 = x.reshape(-1, K)
    r2 = None if residual is None else residual.reshape(-1, N)
    out = torch.empty((x2.shape[0], N), dtype=x.dtype, device=x.device)
    if torch.compiler.is_compiling():
        ops.w4a16_gemm(out, x2, qweight, scales, zeros, perm, bias, group_size, early_weights, r2)
    else:
        _run_w4a16(out, x2, qweight, scales, zeros, perm, bias, group_size, early_weights, r2)
    return out.view(*x.shape[:-1], N)


def w4a16_gemm(
    x: torch.Tensor,
    qw: QuantizedWeight,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    early_weights: bool = False,
) -> torch.Tensor:
    """``x @ dequantize(qw).T + bias`` with fp32 accumulation, rounded once to x's dtype.

    ``residual`` (``[..., N]``, x's dtype, any strides, or None): returns ``residual + (that
    product)`` with exactly the bits of that torch add (the product rounded, the sum in fp32,
    rounded again), as a decoder layer's down projection adds its input back. The small-M
    kernel adds it in its epilogue, one kernel fewer a layer at decode; elsewhere it is a torch
    add after the GEMM.

    x ``[..., K]`` float16 / bfloat16, any strides (the kernels read it strided; a view of
    ``[..., K]`` is taken, which copies only when the leading dimensions cannot be merged);
    ``qw`` a :class:`QuantizedWeight` whose scales have x's dtype (``qw.to(dtype=...)``
    converts); ``bias`` ``[N]`` in x's dtype or float32, or None. Requirements (checked, with a
    ValueError naming the argument): K a multiple of 8, K a multiple of the group size (a
    power of two >= 16, or -1). Any M (0 included) and any N. Returns ``[..., N]``.

    ``early_weights=True`` promises that the GPU work enqueued right before this call (on the
    current stream) does not write ``qw``'s tensors, as with a model's weights between two
    layers. The small-M kernel on Hopper (its register path: where its TMA ring cannot run, or
    a tuning entry keeps the registers) then starts loading them while that work finishes (programmatic
    dependent launch); x is read after it either way. Do not pass it right after
    writing the weights (a quantization, a ``copy_`` into them): the read could see old
    values."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qw: expected a QuantizedWeight (see quantize / from_gptq / from_awq), got {type(qw).__name__}")
    return w4a16_gemm_raw(x, qw.qweight, qw.scales, qw.zeros, qw.perm, bias, qw.group_size, residual=residual,
                          early_weights=early_weights)
