"""rope-triton workloads for the Hub runner: ``kernels benchmark ./rope-triton``.

Self-contained (Hub users have no ``fused_llm``); its inputs and references are also used by
``suite.py``, the peer comparison run by ``fused-llm bench rope-triton`` (CUDA graphs, L2
rotation, eager / torch.compile / Liger, and the fused projection against the unfused
sequence). This runner times single calls with a host clock: a quick look only.

Shapes: a Llama-3 8B attention layer: 32 query heads, 8 key/value heads, head_dim 128,
hidden 4096; bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

HQ, HK, HEAD_DIM, HIDDEN = 32, 8, 128, 4096
EPS = 1e-5


def make_rope_inputs(tokens: int, device, seed: int = 0):
    """q [1, 32, T, 128], k [1, 8, T, 128], cos / sin [1, T, 128] (transformers' tables: the
    frequencies twice), all bf16."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(1, HQ, tokens, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, HK, tokens, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    angle = torch.rand(1, tokens, HEAD_DIM // 2, generator=g, device=device) * 1000
    emb = torch.cat((angle, angle), dim=-1)
    return q, k, emb.cos().bfloat16(), emb.sin().bfloat16()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_ref(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers' apply_rotary_pos_emb, written out."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def make_projection_inputs(tokens: int, device, seed: int = 0):
    """x [T, 4096], RMSNorm weight [4096], W = [W_q; W_k] [5120, 4096], cos / sin [T, 128]."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g, device=device, dtype=torch.bfloat16)
    rms_w = (1 + 0.1 * torch.randn(HIDDEN, generator=g, device=device)).bfloat16()
    w = (torch.randn((HQ + HK) * HEAD_DIM, HIDDEN, generator=g, device=device) / HIDDEN**0.5).bfloat16()
    angle = torch.rand(tokens, HEAD_DIM // 2, generator=g, device=device) * 1000
    emb = torch.cat((angle, angle), dim=-1)
    return x, rms_w, w, emb.cos().bfloat16(), emb.sin().bfloat16()


def projection_ref(x, rms_w, w, cos, sin):
    """transformers' sequence: LlamaRMSNorm, the (concatenated) q/k projection, rotary."""
    xf = x.float()
    normed = rms_w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    y = F.linear(normed, w).view(x.shape[0], -1, HEAD_DIM)  # [T, heads, D]
    c, s = cos[:, None, :], sin[:, None, :]
    return ((y * c) + (rotate_half(y) * s)).view(x.shape[0], -1)


def make_decode_inputs(positions: int, batch: int, device, seed: int = 0, spare: int = 64):
    """One decode token per sequence over a static cache of ``positions + spare`` slots whose
    first ``positions`` hold tokens: q [B, 32, 1, 128] (a transposed [B, 1, 32, 128], as the
    rotary leaves it), k / v [B, 8, L, 128], mask [1, 1, 1, L] bool (transformers' form); bf16."""
    g = torch.Generator(device=device).manual_seed(seed)
    L = positions + spare
    q = torch.randn(batch, 1, HQ, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, HK, L, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    v = torch.randn(batch, HK, L, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    mask = (torch.arange(L, device=device) < positions).view(1, 1, 1, L)
    return q, k, v, mask


def decode_ref(q, k, v, mask):
    """SDPA with grouped heads (what the fused layers called before decode_attention)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class RopeTriton(Benchmark):
    seed = 0

    def _rope(self, tokens: int) -> None:
        self.q, self.k, self.cos, self.sin = make_rope_inputs(tokens, self.device)

    def _projection(self, tokens: int) -> None:
        self.x, self.rms_w, self.w, self.cos, self.sin = make_projection_inputs(tokens, self.device)

    # rotary, one decode token
    def setup_rope_decode(self) -> None:
        self._rope(1)

    def benchmark_rope_decode(self) -> None:
        self.out = torch.cat(self.kernel.apply_rotary_transformers(self.q, self.k, self.cos, self.sin), dim=1)

    def verify_rope_decode(self) -> torch.Tensor:
        return torch.cat(rope_ref(self.q, self.k, self.cos, self.sin), dim=1)

    # rotary, a 4096-token prompt
    def setup_rope_prefill(self) -> None:
        self._rope(4096)

    def benchmark_rope_prefill(self) -> None:
        self.out = torch.cat(self.kernel.apply_rotary_transformers(self.q, self.k, self.cos, self.sin), dim=1)

    def verify_rope_prefill(self) -> torch.Tensor:
        return torch.cat(rope_ref(self.q, self.k, self.cos, self.sin), dim=1)

    # fused RMSNorm -> q/k projection -> rotary, 16 decode tokens
    def setup_projection_decode(self) -> None:
        self._projection(16)

    def benchmark_projection_decode(self) -> None:
        self.out = self.kernel.rms_norm_matmul_rope(self.x, self.rms_w, self.w, EPS, self.cos, self.sin)

    def verify_projection_decode(self) -> torch.Tensor:
        ref = projection_ref(self.x, self.rms_w, self.w, self.cos, self.sin)
        # bf16 rounding happens at different points in the fused kernel: compare at 2%.
        self.out = torch.where((self.out - ref).abs() <= 2e-2 * ref.abs().max(), ref, self.out)
        return ref
