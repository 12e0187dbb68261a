"""Plain-torch implementation: what the op runs on CPU (the torch-cpu variant), with the kernels'
semantics: the weight dequantized exactly as ``dequantize()`` does (x's dtype), products and
sums in fp32, the bias added in fp32, one rounding to x's dtype. Arguments are already checked
by the public function."""

from __future__ import annotations

from ._format import QuantizedWeight, dequantize


def w4a16_gemm(x, qweight, scales, zeros, perm, bias, out, group_size: int) -> None:
    """out [M, N] = x [M, K] @ dequantize(qw)^T (+ bias), in fp32."""
    w = dequantize(QuantizedWeight(qweight, scales, zeros, perm, group_size))
    y = x.float() @ w.float().T
    if bias is not None:
        y += bias.float()
    out.copy_(y)
