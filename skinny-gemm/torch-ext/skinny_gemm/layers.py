"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

``Linear`` replaces ``nn.Linear``'s forward with :func:`skinny_gemm.linear`: the skinny kernel
where the package's tuning table measured it faster than cuBLAS, ``F.linear`` everywhere else.
Layer rules: no ``__init__``, no members besides ``has_backward`` and ``can_torch_compile``.
``fused_llm.kernelize`` binds its forward to the decode projections the table lists.
"""

from __future__ import annotations

import torch
from torch import nn

from . import linear  # the package imports this module after defining linear

__all__ = ["Linear"]


class Linear(nn.Module):
    """``F.linear(x, self.weight, self.bias)`` through :func:`skinny_gemm.linear`. Inputs that
    need a gradient go to ``F.linear``, so training keeps autograd (``has_backward``)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)
