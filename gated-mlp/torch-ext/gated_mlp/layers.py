"""Hub layers: drop-in ``forward`` replacements that ``kernels.kernelize`` swaps in.

``LlamaMLP`` replaces the forward of transformers' gated MLPs (``LlamaMLP``, ``Qwen2MLP``,
``Qwen3MLP``, ``MistralMLP``, ...: ``gate_proj``, ``up_proj``, ``down_proj`` and
``config.hidden_act``), which ``fused_llm.kernelize`` registers with
``kernels.replace_kernel_forward_from_hub(cls, "LlamaMLP")``. Layer rules: no ``__init__``,
no members besides ``has_backward`` and ``can_torch_compile``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LlamaMLP"]

# transformers' hidden_act names -> the kernel's activations ("gelu_new" and
# "gelu_pytorch_tanh" are both the tanh approximation)
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


class LlamaMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the gate and up projections and the
    activation in one kernel (the [.., 2U] intermediate is never written). Activations the
    kernel does not have, fp32 models, and gate / up projections that are not nn.Linear (machete-w4a16's
    W4A16Linear) keep transformers' expression. Inference only."""

    has_backward = False
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from . import gated_mlp

        activation = HIDDEN_ACTS.get(getattr(self.config, "hidden_act", None))
        dense = isinstance(self.gate_proj, nn.Linear) and isinstance(self.up_proj, nn.Linear)  # not e.g. 4-bit layers
        if activation is None or not dense or x.dtype not in (torch.float16, torch.bfloat16) or self.gate_proj.weight.dtype != x.dtype:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        h = gated_mlp(
            x,
            self.gate_proj.weight,
            self.up_proj.weight,
            activation=activation,
            bias_gate=self.gate_proj.bias,
            bias_up=self.up_proj.bias,
        )
        return self.down_proj(h)
