"""Plain-torch implementation: what the ops run on CPU (the torch-cpu variant), with the
kernel's semantics: fp32 products and sums, scales, bias, the activation and the multiply in
fp32, one rounding (or FP8 quantization) to the output dtype. Arguments are already checked by
the public functions."""

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
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    out_scale: torch.Tensor | None = None,
) -> None:
    """out [M, N] = act(x w_gate^T + b_g) * (x w_up^T + b_u), computed in fp32; FP8 inputs are
    dequantized by ``scales`` (x: [1] or [M]; weights: [1] or [N]); an FP8 out is
    ``(y / out_scale)`` clamped to the format's range."""
    xf = x.float()
    g = xf @ w_gate.float().T
    u = xf @ w_up.float().T
    if scales is not None:
        xs, gs, us = (s.float().reshape(-1) for s in scales)
        g = g * xs[:, None] * gs[None, :]
        u = u * xs[:, None] * us[None, :]
    if bias_gate is not None:
        g += bias_gate.float()
    if bias_up is not None:
        u += bias_up.float()
    y = gate_act(g, activation) * u
    if out.element_size() == 1:
        fp8_max = torch.finfo(out.dtype).max
        y = (y / out_scale.float()).clamp(-fp8_max, fp8_max)
    out.copy_(y)
