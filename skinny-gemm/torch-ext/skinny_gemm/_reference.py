"""Plain-torch implementation: what the ops run on CPU (the torch-cpu variant), with the
kernel's semantics: products and sums in fp32 (FP8 and 16-bit values are exact in fp32), then
``* x_scale * w_scale`` (FP8), the bias in fp32, one rounding to out's dtype. Arguments are
already checked by the public functions."""

from __future__ import annotations


def skinny_gemm(x, w, bias, out, x_scale=None, w_scale=None) -> None:
    """out [M, N] = x [M, K] @ w [N, K]^T (* x_scale[m] * w_scale[n]) (+ bias), in fp32."""
    y = x.float() @ w.float().T
    if x_scale is not None:
        y = y * x_scale.float().reshape(-1, 1)
        y = y * w_scale.float().reshape(1, -1)
    if bias is not None:
        y += bias.float()
    out.copy_(y)
