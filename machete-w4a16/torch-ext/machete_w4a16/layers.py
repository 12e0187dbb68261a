"""``W4A16Linear``: an ``nn.Module`` holding a 4-bit weight in the package's prepacked layout,
whose forward runs ``w4a16_gemm``.

Not a hub layer for ``kernels.kernelize`` (those replace a forward and may hold no state of
their own): it replaces an ``nn.Linear`` module, which ``fused_llm.quantize_w4a16`` and
``fused_llm.load_w4a16`` do for a model's projections. Its state_dict holds the packed tensors
(``qweight``, ``scales``, ``zeros`` / ``perm`` when present, ``bias``), and
``group_size`` / ``in_features`` / ``out_features`` are attributes (``extra_repr``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["W4A16Linear"]


class W4A16Linear(nn.Module):
    """``y = x @ dequantize(qw)^T + bias``; inference only (no gradient for the weight).

    Build it with :meth:`from_linear` (round-to-nearest from an ``nn.Linear``) or
    :meth:`from_quantized` (a :class:`QuantizedWeight`, e.g. from a checkpoint), or with the
    constructor (zero-filled buffers of the right shapes, for ``load_state_dict``)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group_size: int = 128,
        zero_point: bool = False,
        act_order: bool = False,
        dtype: torch.dtype = torch.float16,
        device=None,
    ):
        super().__init__()
        from ._format import _check_group_size

        if in_features % 8 or in_features <= 0:
            raise ValueError(f"in_features: expected a positive multiple of 8, got {in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size = _check_group_size(group_size, in_features)
        groups = 1 if self.group_size == -1 else in_features // self.group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 8, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(groups, out_features, dtype=dtype, device=device))
        self.register_buffer("zeros", torch.zeros(groups, out_features, dtype=torch.uint8, device=device) if zero_point else None)
        self.register_buffer("perm", torch.arange(in_features, dtype=torch.int32, device=device) if act_order else None)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None

    @classmethod
    def from_quantized(cls, qw, bias: torch.Tensor | None = None) -> W4A16Linear:
        """A layer holding ``qw`` (its tensors, not copies) and ``bias`` ([N] or None)."""
        from ._format import QuantizedWeight

        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"qw: expected a QuantizedWeight, got {type(qw).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features, layer.group_size = qw.K, qw.N, qw.group_size
        for name in ("qweight", "scales", "zeros", "perm"):
            layer.register_buffer(name, getattr(qw, name))
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (qw.N,):
                raise ValueError(f"bias: expected a [{qw.N}] tensor or None, got {getattr(bias, 'shape', type(bias).__name__)}")
            bias = nn.Parameter(bias.detach(), requires_grad=False)
        layer.bias = bias
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, zero_point: bool = False) -> W4A16Linear:
        """Round-to-nearest quantization of ``linear``'s weight (float16 / bfloat16; see
        ``quantize``); the bias is kept in the weight's dtype."""
        from ._format import quantize

        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        qw = quantize(linear.weight.detach(), group_size=group_size, zero_point=zero_point)
        bias = None if linear.bias is None else linear.bias.detach().to(linear.weight.dtype)
        return cls.from_quantized(qw, bias)

    def quantized_weight(self):
        """The layer's weight as a :class:`QuantizedWeight` (sharing the buffers)."""
        from ._format import QuantizedWeight

        return QuantizedWeight(self.qweight, self.scales, self.zeros, self.perm, self.group_size)

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.scales.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from . import w4a16_gemm_raw

        return w4a16_gemm_raw(x, self.qweight, self.scales, self.zeros, self.perm, self.bias, self.group_size)

    def extra_repr(self) -> str:
        kind = "uint4b8" if self.zeros is None else "uint4+zeros"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"group_size={self.group_size}, {kind}, act_order={self.perm is not None}")  # fmt: skip
