"""gated-mlp workloads for the Hub runner: ``kernels benchmark ./gated-mlp``.

Self-contained (Hub users have no ``fused_llm``); its inputs and reference are also used by
``suite.py``, the peer comparison run by ``fused-llm bench gated-mlp`` (CUDA graphs, L2
rotation, cuBLAS, cuBLAS + Liger, torch.compile). This runner times single calls with a host
clock: a quick look only.

Shapes: the MLPs of Llama 3 8B (D 4096, U 14336), 70B (8192, 28672) and 405B (16384, 53248),
bf16, one fused [2U, D] weight (gate rows, then up rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

MODELS = {"8B": (4096, 14336), "70B": (8192, 28672), "405B": (16384, 53248)}
# On a CPU the package runs its plain-torch path, where one 4096-token 8B prefill took 7.3 s
# and its eager reference 93 s, and making the 8B weight alone ~2 s (2-core CI machine): CPU
# runs take the 8B MLP scaled by 1/4 per side and at most 64 tokens, a smoke run in seconds.
CPU_MODEL = (1024, 3584)
CPU_MAX_TOKENS = 64


def make_inputs(tokens: int, hidden: int, inter: int, device, seed: int = 0):
    """x [T, D] and W = [W_gate; W_up] [2U, D] (std 1/sqrt(D), Kaiming-like), bf16."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device=device, dtype=torch.bfloat16)
    w = torch.randn(2 * inter, hidden, generator=g, device=device, dtype=torch.bfloat16) * hidden**-0.5
    return x, w


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def make_fp8_inputs(tokens: int, hidden: int, inter: int, device, seed: int = 0):
    """make_inputs quantized to e4m3 with per-tensor scales (amax / 448), and the static output
    scale that maps the result's amax to 448: (xq, wq, x_scale, w_scale, out_scale)."""
    x, w = make_inputs(tokens, hidden, inter, device, seed)
    xs = (x.abs().amax().float() / FP8_MAX).reshape(1)
    ws = (w.abs().amax().float() / FP8_MAX).reshape(1)
    xq, wq = (x / xs).to(FP8), (w / ws).to(FP8)
    y = gated_fp8_ref(xq, wq, xs, ws)
    return xq, wq, xs, ws, (y.abs().amax().float() / FP8_MAX).clamp(min=1e-12).reshape(1)


def gated_fp8_ref(xq, wq, xs, ws, out_scale=None):
    """cuBLAS FP8 GEMM (torch._scaled_mm, bf16 out) -> silu(g) * u -> (y / out_scale) to e4m3
    (bf16 y when out_scale is None)."""
    inter = wq.shape[0] // 2
    gu = torch._scaled_mm(xq, wq.T, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
    y = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    if out_scale is None:
        return y.bfloat16()
    return (y / out_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def gated_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaMLP up half: silu(gate_proj(x)) * up_proj(x), eager bf16."""
    inter = w.shape[0] // 2
    return F.silu(F.linear(x, w[:inter])) * F.linear(x, w[inter:])


class GatedMlp(Benchmark):
    seed = 0

    def _setup(self, tokens: int) -> None:
        if self.device == "cpu":
            self.x, self.w = make_inputs(min(tokens, CPU_MAX_TOKENS), *CPU_MODEL, self.device)
            return
        self.x, self.w = make_inputs(tokens, *MODELS["8B"], self.device)

    def _verify(self) -> torch.Tensor:
        ref = gated_ref(self.x, self.w)
        # eager rounds gate, up, silu and the product to bf16; the kernel rounds once: 2%.
        self.out = torch.where((self.out - ref).abs() <= 2e-2 * ref.abs().max(), ref, self.out)
        return ref

    # Llama 3 8B MLP, 16 decode tokens
    def setup_decode(self) -> None:
        self._setup(16)

    def benchmark_decode(self) -> None:
        self.out = self.kernel.gated_mlp_fused(self.x, self.w)

    def verify_decode(self) -> torch.Tensor:
        return self._verify()

    # Llama 3 8B MLP, a 4096-token prompt
    def setup_prefill(self) -> None:
        self._setup(4096)

    def benchmark_prefill(self) -> None:
        self.out = self.kernel.gated_mlp_fused(self.x, self.w)

    def verify_prefill(self) -> torch.Tensor:
        return self._verify()
