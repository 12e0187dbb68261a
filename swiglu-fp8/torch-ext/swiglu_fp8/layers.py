"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

Layer rules (checked by kernelize): no ``__init__``, no members besides ``has_backward`` and
``can_torch_compile``; the host module's attributes are used as they are.

``SiLU``, ``GeluTanh`` and ``GeLU`` carry transformers' hub names for the bare activation
modules (``SiLUActivation``, ``GELUTanh``, ``GELUActivation``: ``ACT2FN["silu"]``,
``["gelu_pytorch_tanh"]``, ``["gelu"]``). In a Llama MLP the activation sits between two GEMMs,
so swapping it alone saves no memory traffic; the MLP-level fusion belongs to gated-mlp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._ops import ops

__all__ = ["SiluAndMul", "SiLU", "GeluTanh", "GeLU"]

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The ops' activation ints (fused_llm::swiglu_fp8::Activation).
_SILU, _GELU_TANH, _GELU = 0, 1, 2


def _bare_activation(x: torch.Tensor, act: int) -> torch.Tensor | None:
    """act(x) through the kernel, or None where the kernel does not take x (another dtype, a
    non-unit-stride last dimension): the caller then keeps torch's own function."""
    if x.dtype not in _KERNEL_DTYPES or x.dim() == 0 or x.numel() == 0 or (x.shape[-1] > 1 and x.stride(-1) != 1):
        return None
    try:
        x2 = x.view(-1, x.shape[-1])
    except RuntimeError:  # leading dims that do not flatten to one stride
        x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    ops.activation(out, x2, act)
    return out.view(x.shape)


class SiluAndMul(nn.Module):
    """``F.silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2 * d]`` (the
    kernels-community ``SiluAndMul``), rounding like the eager expression: the SiLU is
    computed in fp32 and rounded to x's dtype, then multiplied in x's dtype. Inference only
    (no backward)."""

    has_backward = False
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] % 2 or x.shape[-1] == 0 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            # Outside what the kernel takes: keep the eager expression's exact semantics.
            d = x.shape[-1] // 2 if x.dim() else 0
            return F.silu(x[..., :d]) * x[..., d:]
        d = x.shape[-1] // 2
        x2 = x if x.stride(-1) == 1 else x.contiguous()
        x2 = x2.reshape(-1, x.shape[-1])
        out = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x2, _SILU)
        return out.view(*x.shape[:-1], d)


class SiLU(nn.Module):
    """``F.silu(input)`` (transformers' ``SiLUActivation``, hub name ``"SiLU"``): computed in
    fp32, rounded to the input dtype. Inference only."""

    has_backward = False
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _bare_activation(input, _SILU)
        return F.silu(input) if out is None else out


class GeluTanh(nn.Module):
    """``F.gelu(input, approximate="tanh")`` (transformers' ``GELUTanh``, hub name
    ``"GeluTanh"``, Gemma's ``gelu_pytorch_tanh``). The kernel's 16-bit path evaluates it as
    ``g * sigmoid(2u)``, which does not cancel for negative inputs the way torch's fp32
    ``0.5 g (1 + tanh(u))`` does: it is closer to the exact value, and differs from torch by one
    ulp where torch is not correctly rounded. Inference only."""

    has_backward = False
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _bare_activation(input, _GELU_TANH)
        return F.gelu(input, approximate="tanh") if out is None else out


class GeLU(nn.Module):
    """``F.gelu(input)`` with erf (transformers' ``GELUActivation``, hub name ``"GeLU"``).
    Inference only."""

    has_backward = False
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _bare_activation(input, _GELU)
        return F.gelu(input) if out is None else out
