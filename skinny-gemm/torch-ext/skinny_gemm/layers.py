"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

``Linear`` replaces ``nn.Linear``'s forward with :func:`skinny_gemm.linear`: the skinny kernel
where the package's tuning table measured it faster than cuBLAS, ``F.linear`` everywhere else
(so with today's empty table it runs exactly ``F.linear``). Layer rules: no ``__init__``, no
members besides ``has_backward`` and ``can_torch_compile``. Routing a model's decode
projections through it (``fused_llm.kernelize``) is not wired yet: it waits for measured
entries in the table.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Linear"]


class Linear(nn.Module):
    """``F.linear(x, self.weight, self.bias)`` through :func:`skinny_gemm.linear`. Inputs that
    need a gradient go to ``F.linear``, so training keeps autograd (``has_backward``)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        from . import linear

        return linear(input, self.weight, self.bias)
