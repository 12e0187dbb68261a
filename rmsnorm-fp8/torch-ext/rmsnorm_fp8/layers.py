"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

Layer rules (checked by kernelize): no ``__init__``, no members besides ``has_backward`` and
``can_torch_compile``; the host module's attributes are used as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from ._ops import ops

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """Drop-in forward for ``LlamaRMSNorm`` (and the Qwen2/Qwen3/Mistral copies): reads
    ``self.weight`` and ``self.variance_epsilon`` and rounds exactly like the original, so a
    kernelized model's logits match eager. Inference only (no backward)."""

    weight: torch.Tensor
    variance_epsilon: float

    has_backward = False
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.dtype != hidden_states.dtype or hidden_states.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            # Mixed precision (e.g. fp32 weight on bf16 activations) promotes the output in
            # the original module; keep its exact semantics rather than guess.
            variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
            normed = hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)
            return weight * normed.to(hidden_states.dtype)
        if not torch.compiler.is_compiling():
            try:  # one C++ call that checks and allocates (the package's rms_norm fast path)
                return ops.rms_norm_alloc.default(hidden_states, weight, float(self.variance_epsilon))
            except RuntimeError:
                pass
        x = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        ops.rms_norm(out, x2, weight.contiguous(), float(self.variance_epsilon))
        return out.view(hidden_states.shape)
