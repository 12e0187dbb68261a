"""Plain-torch implementation: what the op runs on CPU (the torch-cpu variant), with the
kernel's semantics: fp32 products and sums, the activation and the multiply in fp32, one
rounding to the output dtype. Arguments are already checked by the public functions."""

from __future__ import annotations

import torch


def gate_act(g: torch.Tensor, activation: str) -> torch.Tensor:
    """The gate activation on fp32 (tanh-approximated GELU for "gelu_tanh")."""
    if activation == "silu":
        return torch.nn.functional.silu(g)
    return torch.nn.functional.gelu(g, approximate="tanh")


def gated_mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    bias_gate: torch.Tensor | None,
    bias_up: torch.Tensor | None,
    out: torch.Tensor,
    activation: str,
) -> None:
    """out [M, N] = act(x w_gate^T + b_g) * (x w_up^T + b_u), computed in fp32."""
    xf = x.float()
    g = xf @ w_gate.float().T
    u = xf @ w_up.float().T
    if bias_gate is not None:
        g += bias_gate.float()
    if bias_up is not None:
        u += bias_up.float()
    out.copy_(gate_act(g, activation) * u)
