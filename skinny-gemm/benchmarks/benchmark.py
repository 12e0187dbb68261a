"""skinny-gemm workloads for the Hub runner: ``kernels benchmark ./skinny-gemm``.

Self-contained (Hub users have no ``fused_llm``); its shapes, inputs and reference are also
used by ``suite.py``, the peer comparison run by ``fused-llm bench skinny-gemm`` (CUDA graphs,
L2 rotation, cuBLAS, torch.compile max-autotune, the read-bandwidth floor). This runner times
single calls with a host clock: a quick look only.

Shapes [N, K] (N outputs, K inputs): the issue's Llama-405B TP8 set, Llama-3 8B and 70B (TP1)
projections.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

SHAPES = {
    "405B-tp8-qkv": (2304, 16384), "405B-tp8-gate_up": (13312, 16384), "405B-tp8-down": (16384, 6656),
    "8B-qkv": (6144, 4096), "8B-o": (4096, 4096), "8B-gate_up": (28672, 4096), "8B-down": (4096, 14336),
    "70B-qkv": (10240, 8192), "70B-o": (8192, 8192), "70B-gate_up": (57344, 8192), "70B-down": (8192, 28672),
    "8B-lm_head": (128256, 4096),  # the vocabulary projection kernelize also routes (1 GB of bf16)
}  # fmt: skip
TOKENS = (1, 2, 4, 8, 16, 32, 64)
# On a CPU the package runs its plain-torch path: a smoke run on the 8B O projection / 8.
CPU_SHAPE = (512, 512)


def make_weight(N: int, K: int, device, seed: int = 0, dtype=torch.bfloat16) -> torch.Tensor:
    """w [N, K], std 1/sqrt(K) (outputs of order one)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(N, K, generator=g, device=device) / K**0.5).to(dtype)


def make_x(tokens: int, K: int, device, seed: int = 0, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed + 1)
    return torch.randn(tokens, K, generator=g, device=device).to(dtype)


def fp8_dtype(device) -> torch.dtype:
    """The FP8 format of the device: e4m3fnuz on MI300 (gfx94x), e4m3fn elsewhere."""
    if torch.version.hip is not None and "gfx94" in torch.cuda.get_device_properties(device).gcnArchName:
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def make_fp8(tokens: int, N: int, K: int, device, seed: int = 0, per_tensor: bool = False):
    """Per-token x and per-channel w FP8 quantization of unit-variance inputs (amax / fp8 max):
    (xq [M, K], wq [N, K], x_scale [M, 1], w_scale [N, 1]); ``per_tensor``: the same FP8 values
    with one scale each, the first row's (x_scale [1], w_scale [1])."""
    fp8 = fp8_dtype(device)
    fmax = torch.finfo(fp8).max
    x = make_x(tokens, K, device, seed, torch.float32)
    w = make_weight(N, K, device, seed, torch.float32)
    xs = x.abs().amax(1, keepdim=True).clamp(min=1e-6) / fmax
    ws = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / fmax
    xq, wq = (x / xs).to(fp8), (w / ws).to(fp8)
    if per_tensor:
        return xq, wq, xs[:1, 0].contiguous(), ws[:1, 0].contiguous()
    return xq, wq, xs, ws


def scaled_mm_scales(x_scale: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """make_fp8's scales in the forms ``torch._scaled_mm`` takes: scalars (per tensor), or
    [M, 1] and [1, N] (rowwise)."""
    if x_scale.numel() == 1 and w_scale.numel() == 1 and x_scale.dim() == 1:
        return x_scale.reshape(()), w_scale.reshape(())
    return x_scale, w_scale.reshape(1, -1).contiguous()


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """cuBLAS: ``F.linear(x, w)`` in x's dtype."""
    return F.linear(x, w)


def reference_fp8(xq, wq, xs, ws, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``(xq @ wq^T) * xs * ws`` in fp32, then out_dtype (no FP8 GEMM needed)."""
    return ((xq.float() @ wq.float().T) * xs * ws.T).to(out_dtype)


class SkinnyGemm(Benchmark):
    seed = 0

    def _setup(self, tokens: int, shape: str) -> None:
        N, K = CPU_SHAPE if self.device == "cpu" else SHAPES[shape]
        self.w = make_weight(N, K, self.device)
        self.x = make_x(tokens, K, self.device)

    def _verify(self) -> torch.Tensor:
        ref = reference(self.x, self.w)
        # The kernel rounds once from fp32; cuBLAS in bf16 may differ by an ulp: 1% of the scale.
        self.out = torch.where((self.out - ref).abs() <= 1e-2 * ref.abs().max(), ref, self.out)
        return ref

    # Llama-405B TP8 QKV projection, one decode token
    def setup_decode(self) -> None:
        self._setup(1, "405B-tp8-qkv")

    def benchmark_decode(self) -> None:
        self.out = self.kernel.gemm(self.x, self.w)

    def verify_decode(self) -> torch.Tensor:
        return self._verify()

    # Llama-405B TP8 QKV projection, 16 decode tokens
    def setup_decode16(self) -> None:
        self._setup(16, "405B-tp8-qkv")

    def benchmark_decode16(self) -> None:
        self.out = self.kernel.gemm(self.x, self.w)

    def verify_decode16(self) -> torch.Tensor:
        return self._verify()

    # Llama-3 8B down projection, 8 decode tokens
    def setup_decode8_down(self) -> None:
        self._setup(8, "8B-down")

    def benchmark_decode8_down(self) -> None:
        self.out = self.kernel.gemm(self.x, self.w)

    def verify_decode8_down(self) -> torch.Tensor:
        return self._verify()
