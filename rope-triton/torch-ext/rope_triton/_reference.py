"""Plain-torch implementations: what the ops run on CPU (the torch-cpu variant), with the same
semantics and rounding as the Triton kernels. Arguments are already checked and normalized by
the public functions (see ``launch_rope`` in ``_kernels`` for the shapes)."""

from __future__ import annotations

import torch


def _cos_sin(
    B: int,
    S: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    pos: torch.Tensor | None,
    inv_freq: torch.Tensor | None,
    table_rows: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as fp32 [B, S, width]."""
    if inv_freq is not None:
        angle = pos.to(torch.float32).expand(B, S)[..., None] * inv_freq
        return torch.cos(angle), torch.sin(angle)
    if table_rows == "pos":
        p = pos.expand(B, S).long()
        return cos[p].float(), sin[p].float()
    return cos.float().expand(B, S, -1), sin.float().expand(B, S, -1)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    pos: torch.Tensor | None,
    inv_freq: torch.Tensor | None,
    rotary_dim: int,
    interleaved: bool,
    hf_rounding: bool,
    table_rows: str,
) -> None:
    B, S = q.shape[:2]
    if B * S == 0:
        return
    half = rotary_dim // 2
    c, s = _cos_sin(B, S, cos, sin, pos, inv_freq, table_rows)
    c, s = c[:, :, None, :], s[:, :, None, :]  # broadcast over heads
    for x, out in ((q, q_out), (k, k_out)):
        if interleaved:
            lo, hi = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
            o_lo, o_hi = out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2]
        else:
            lo, hi = x[..., :half], x[..., half:rotary_dim]
            o_lo, o_hi = out[..., :half], out[..., half:rotary_dim]
        if hf_rounding:  # transformers: q * cos + rotate_half(q) * sin in the dtype, full tables
            cl, ch = c[..., :half].to(x.dtype), c[..., half:rotary_dim].to(x.dtype)
            sl, sh = s[..., :half].to(x.dtype), s[..., half:rotary_dim].to(x.dtype)
            r_lo = lo * cl + (-hi) * sl
            r_hi = hi * ch + lo * sh
        else:
            cl, sl = c[..., :half], s[..., :half]
            lf, hf = lo.float(), hi.float()
            r_lo = (lf * cl - hf * sl).to(x.dtype)
            r_hi = (hf * cl + lf * sl).to(x.dtype)
        # Both halves computed before either is written: safe in place.
        o_lo.copy_(r_lo)
        o_hi.copy_(r_hi)
        if rotary_dim < x.shape[-1] and out.data_ptr() != x.data_ptr():
            out[..., rotary_dim:].copy_(x[..., rotary_dim:])


def rms_matmul_rope(
    x: torch.Tensor,
    g: torch.Tensor | None,
    w: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    head_dim: int,
) -> None:
    """The unfused sequence in plain torch: RMSNorm (transformers' rounding; g None: no
    weight, it is folded into w), linear, RoPE."""
    M = x.shape[0]
    if M == 0 or w.shape[0] == 0:
        return
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    if g is not None:
        normed = normed * g
    y = torch.nn.functional.linear(normed, w).float().view(M, -1, head_dim)
    half = head_dim // 2
    c = cos[:, None, :half].float()
    s = sin[:, None, :half].float()
    lo, hi = y[..., :half], y[..., half:]
    out.view(M, -1, head_dim).copy_(torch.cat((lo * c - hi * s, hi * c + lo * s), dim=-1))


def decode_attention(q, k, v, mask, out, scale: float) -> None:
    """q [B, H, 1, D], k / v [B, H_kv, L, D], mask [B, L] bool (True: attend), out [B, H, 1, D]:
    softmax(q k^T * scale, masked) v in fp32 per query head h over K / V head h // (H / H_kv),
    rounded once. A head with no slot to attend gets NaN (SDPA's math kernel does the same)."""
    B, H, _, D = q.shape
    H_kv = k.shape[1]
    if B * H == 0:
        return
    qg = q[:, :, 0].float().reshape(B, H_kv, H // H_kv, D)
    scores = torch.einsum("bkgd,bkld->bkgl", qg, k.float()) * scale
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    o = torch.einsum("bkgl,bkld->bkgd", scores.softmax(-1), v.float())
    out.copy_(o.reshape(B, H, 1, D))
