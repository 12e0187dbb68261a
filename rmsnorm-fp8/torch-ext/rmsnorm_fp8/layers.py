"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

Layer rules (checked by kernelize): no ``__init__``, no members besides ``has_backward`` and
``can_torch_compile``; the host module's attributes are used as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from ._ops import ops

__all__ = ["RMSNorm"]

# Under torch.compile, a call on at least this many rows runs the original expression: inductor
# fuses it with the residual add before it and the cast after, and a compiled graph pays host
# time for every custom-op call it makes (the compiled prefill of 1 x 512 tokens is partly
# host-bound). H100, Llama-3-8B shape, 8 layers, torch.compile(dynamic=False) prefill of 1 x 512
# (2026-11-23): this op in 17 places 0.89x the compiled original, the final norm handed back
# 0.94x. At decode sizes (CUDA-graph replay, no host cost) the op stays.
COMPILED_ORIGINAL_MIN_ROWS = 64


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
        if (
            weight.dtype != hidden_states.dtype
            or hidden_states.dtype not in (torch.float32, torch.float16, torch.bfloat16)
            or (torch.compiler.is_compiling() and hidden_states.shape[:-1].numel() >= COMPILED_ORIGINAL_MIN_ROWS)
        ):
            # Mixed precision (e.g. fp32 weight on bf16 activations) promotes the output in
            # the original module; keep its exact semantics rather than guess. Large compiled
            # calls: see COMPILED_ORIGINAL_MIN_ROWS.
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
