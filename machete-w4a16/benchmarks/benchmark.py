"""machete-w4a16 workloads for the Hub runner: ``kernels benchmark ./machete-w4a16``.

Self-contained (Hub users have no ``fused_llm``); its inputs and reference are also used by
``suite.py``, the peer comparison run by ``fused-llm bench machete-w4a16`` (CUDA graphs, L2
rotation, cuBLAS bf16, tinygemm, GemLite). This runner times single calls with a host clock:
a quick look only.

Shapes: the projections of Llama 3 8B and 70B (QKV, O, gate/up fused, down) as [N, K], and the
8B lm_head (128256 x 4096, which ``fused-llm bench e2e --w4a16 --lm-head`` quantizes too), bf16
activations, group-128 symmetric (uint4b8) weights with random
codes and scales.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

# (N, K) of each projection: N outputs, K inputs.
SHAPES = {
    "8B-qkv": (6144, 4096), "8B-o": (4096, 4096), "8B-gate_up": (28672, 4096), "8B-down": (4096, 14336),
    "70B-qkv": (10240, 8192), "70B-o": (8192, 8192), "70B-gate_up": (57344, 8192), "70B-down": (8192, 28672),
    "8B-lm_head": (128256, 4096),
}  # fmt: skip
# On a CPU the package runs its plain-torch path (dequantize + fp32 matmul): a smoke run in
# seconds on the 8B O projection scaled by 1/8 per side.
CPU_SHAPE = (512, 512)
CPU_MAX_TOKENS = 64


def make_weight(kernel, N: int, K: int, device, seed: int = 0, group_size: int = 128, dtype=torch.bfloat16):
    """A QuantizedWeight of random codes and scales (std of the dequantized weight ~ 1/sqrt(K),
    Kaiming-like): no [N, K] bf16 weight is made (70B gate/up would be 0.9 GB per input set)."""
    g = torch.Generator(device=device).manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (N, K // 8), generator=g, device=device, dtype=torch.int32)
    groups = K // group_size
    scales = ((torch.rand(groups, N, generator=g, device=device) + 0.5) * (0.3 / K**0.5)).to(dtype)
    return kernel.QuantizedWeight(qweight, scales, None, None, group_size)


def make_x(tokens: int, K: int, device, seed: int = 0, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed + 1)
    return torch.randn(tokens, K, generator=g, device=device, dtype=dtype)


# Bit offset of column c of a packed word: the package's nibble slot (c // 2) + 4 (c % 2), times 4.
COLUMN_SHIFTS = (0, 16, 4, 20, 8, 24, 12, 28)


def dequant_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """What a user without the kernel writes, in plain torch (the suite's torch.compile peer):
    unpack the codes (``shifts``: ``COLUMN_SHIFTS`` as an int32 tensor), ``(q - 8) * s`` in x's
    dtype (the difference exact, one rounding: dequantize()'s value), ``F.linear``. Symmetric
    weights, groups along K."""
    N, K = qweight.shape[0], qweight.shape[1] * 8
    groups = scales.shape[0]
    q = ((qweight.unsqueeze(-1) >> shifts) & 0xF).reshape(N, groups, K // groups)
    w = ((q - 8).to(x.dtype) * scales.t().unsqueeze(-1)).reshape(N, K)
    return F.linear(x, w)


def reference(kernel, x: torch.Tensor, qw) -> torch.Tensor:
    """cuBLAS on the dequantized weight: ``F.linear(x, dequantize(qw))`` in x's dtype."""
    return F.linear(x, kernel.dequantize(qw))


class W4a16Gemm(Benchmark):
    seed = 0

    def _setup(self, tokens: int, shape: str) -> None:
        N, K = CPU_SHAPE if self.device == "cpu" else SHAPES[shape]
        if self.device == "cpu":
            tokens = min(tokens, CPU_MAX_TOKENS)
        self.qw = make_weight(self.kernel, N, K, self.device)
        self.x = make_x(tokens, K, self.device)

    def _verify(self) -> torch.Tensor:
        ref = reference(self.kernel, self.x, self.qw)
        # The kernel rounds once from fp32; cuBLAS in bf16 may differ by an ulp: 1% of the scale.
        self.out = torch.where((self.out - ref).abs() <= 1e-2 * ref.abs().max(), ref, self.out)
        return ref

    # Llama 3 8B QKV projection, one decode token
    def setup_decode(self) -> None:
        self._setup(1, "8B-qkv")

    def benchmark_decode(self) -> None:
        self.out = self.kernel.w4a16_gemm(self.x, self.qw)

    def verify_decode(self) -> torch.Tensor:
        return self._verify()

    # Llama 3 8B gate/up projection, 16 decode tokens
    def setup_decode16(self) -> None:
        self._setup(16, "8B-gate_up")

    def benchmark_decode16(self) -> None:
        self.out = self.kernel.w4a16_gemm(self.x, self.qw)

    def verify_decode16(self) -> torch.Tensor:
        return self._verify()

    # Llama 3 8B down projection, a 2048-token prompt
    def setup_prefill(self) -> None:
        self._setup(2048, "8B-down")

    def benchmark_prefill(self) -> None:
        self.out = self.kernel.w4a16_gemm(self.x, self.qw)

    def verify_prefill(self) -> torch.Tensor:
        return self._verify()
