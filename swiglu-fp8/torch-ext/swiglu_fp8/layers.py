"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

Layer rules (checked by kernelize): no ``__init__``, no members besides ``has_backward`` and
``can_torch_compile``; the host module's attributes are used as they are.

There is deliberately no ``SiLU`` layer (transformers' hub name for the bare activation): a
bare elementwise SiLU has no gate/up pair to fuse, and these ops would need an ``up`` of ones
(an extra read) to compute it. The MLP-level swap belongs to the gated-mlp package.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._ops import ops

__all__ = ["SiluAndMul"]


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
        ops.silu_and_mul(out, x2, 0)
        return out.view(*x.shape[:-1], d)
