"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

``ApplyRotaryPosEmb`` is what ``fused_llm.kernelize`` maps to transformers' hub function name
``"rotary_pos_emb"`` (each model's ``apply_rotary_pos_emb``, attached to its attention modules
with ``use_kernelized_func``). Layer rules: no ``__init__``, no members besides
``has_backward`` and ``can_torch_compile``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ApplyRotaryPosEmb"]


class ApplyRotaryPosEmb(nn.Module):
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) -> (q_embed, k_embed)`` with
    transformers' rounding (``q * cos + rotate_half(q) * sin``, each op in q's dtype), so a
    kernelized model matches eager bit for bit in bf16 / fp16. Inference only."""

    has_backward = False
    can_torch_compile = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
        from . import apply_rotary_transformers

        return apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim)
