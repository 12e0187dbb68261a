"""The three checkpoint formats written and read independently of the package, from their specs
(AutoGPTQ v1, AutoAWQ GEMM, compressed-tensors pack-quantized), for the tests here and for the
integration tests that write small checkpoints (tests/test_w4a16_integration.py).

Bit manipulation here uses int64 arithmetic (multiplies and floor divisions by powers of 16),
not the package's shift-based pack_int4 / unpack_int4, so a shared mistake cannot cancel out.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble slot i of an AWQ int32 holds column 8c + AWQ_ORDER[i]


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> the int32 with the same 32 bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [...] -> int64 [..., 8]: nibble i = bits 4i .. 4i + 3."""
    u = words.to(torch.int64) % 2**32
    return torch.stack([(u // 16**i) % 16 for i in range(8)], dim=-1)


def pack_last(codes: torch.Tensor) -> torch.Tensor:
    """[..., 8m] codes -> int32 [..., m], code 8j + i in nibble i of word j."""
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)
    return _to_int32(sum(c[..., i] * 16**i for i in range(8)))


def unpack_last(words: torch.Tensor) -> torch.Tensor:
    return _nibbles(words).reshape(*words.shape[:-1], words.shape[-1] * 8)


def dequant(q_nk: torch.Tensor, z_nk: torch.Tensor, s_nk: torch.Tensor) -> torch.Tensor:
    """(q - z) * s per element, exact in fp64, rounded once to s's dtype (what every format's
    own dequantization computes: its products are exact in fp32)."""
    return ((q_nk.double() - z_nk.double()) * s_nk.double()).to(s_nk.dtype)


# --- GPTQ (AutoGPTQ v1): qweight [K/8, N] packed along K; qzeros [K/G, N/8] along N, zero - 1 ---


def write_gptq(q_nk, z_gn, s_gn, g_idx=None):
    """codes [N, K] (original column order), zeros [groups, N], scales [groups, N], g_idx [K]
    -> (qweight, qzeros, scales, g_idx) as a v1 checkpoint stores them."""
    qweight = pack_last(q_nk).t().contiguous()  # word i of column n: inputs 8i .. 8i + 7 of output n
    qzeros = pack_last((z_gn.to(torch.int64) - 1) % 16)
    return qweight, qzeros, s_gn.contiguous(), g_idx


def read_gptq(qweight, qzeros, scales, g_idx=None) -> torch.Tensor:
    """[N, K] from the v1 spec: w[n, k] = (q[k, n] - (zs[g, n] + 1)) * scales[g, n], g = g_idx[k]."""
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    q = _nibbles(qweight).permute(0, 2, 1).reshape(K, N)  # row 8i + j = nibble j of row i
    z = _nibbles(qzeros).reshape(qzeros.shape[0], -1)[:, :N] + 1
    groups = scales.shape[0]
    g = g_idx.long() if g_idx is not None else torch.arange(K) // (K // groups)
    return dequant(q.t(), z[g].t(), scales[g].t())


# --- AWQ (GEMM): qweight [K, N/8] packed along N in order 0,2,4,6,1,3,5,7; qzeros the same ------


def awq_pack(cols: torch.Tensor) -> torch.Tensor:
    """[R, 8m] codes -> int32 [R, m] with slot i of word c = column 8c + AWQ_ORDER[i] (also
    machete-w4a16's own slot order, along K)."""
    c = cols.to(torch.int64).reshape(*cols.shape[:-1], cols.shape[-1] // 8, 8)
    return _to_int32(sum(c[..., AWQ_ORDER[i]] * 16**i for i in range(8)))


def awq_unpack(words: torch.Tensor) -> torch.Tensor:
    slots = _nibbles(words)  # [R, m, 8]
    cols = torch.empty_like(slots)
    for i in range(8):
        cols[..., AWQ_ORDER[i]] = slots[..., i]
    return cols.reshape(*words.shape[:-1], words.shape[-1] * 8)


def write_awq(q_nk, z_gn, s_gn):
    return awq_pack(q_nk.t()).contiguous(), awq_pack(z_gn).contiguous(), s_gn.contiguous()


def read_awq(qweight, qzeros, scales) -> torch.Tensor:
    """[N, K]: w[n, k] = (q[k, n] - z[k // G, n]) * scales[k // G, n]."""
    K = qweight.shape[0]
    q = awq_unpack(qweight)  # [K, N]
    z = awq_unpack(qzeros)
    g = torch.arange(K) // (K // scales.shape[0])
    return dequant(q.t(), z[g].t(), scales[g].t())


# --- compressed-tensors pack-quantized: weight_packed [N, K/8] along K (signed + 8); scale [N, K/G];
# --- zero point (asymmetric) int32 [N/8, K/G] packed along N (signed + 8) -----------------------


def write_compressed_tensors(q_nk, z_gn, s_gn, g_idx=None, symmetric=False):
    """-> dict of the layer's tensors as the pack-quantized compressor stores them."""
    out = {
        "weight_packed": pack_last(q_nk),
        "weight_scale": s_gn.t().contiguous(),
        "weight_shape": torch.tensor(list(q_nk.shape), dtype=torch.int32),
    }
    if not symmetric:
        out["weight_zero_point"] = pack_last(z_gn).t().contiguous()  # z [groups, N] packed along N
    if g_idx is not None:
        out["weight_g_idx"] = g_idx.to(torch.int32)
    return out


def read_compressed_tensors(weight_packed, weight_scale, weight_shape, weight_zero_point=None, weight_g_idx=None):
    """[N, K]: compressed-tensors' dequantize, ``(x_q - zp) * scale`` on the signed values
    (stored codes minus 8), scale column g_idx[k] (k // G without g_idx)."""
    N, K = (int(v) for v in weight_shape)
    xq = unpack_last(weight_packed)[:, :K] - 8
    groups = weight_scale.shape[1]
    if weight_zero_point is None:
        zp = torch.zeros(N, groups, dtype=torch.int64)
    else:
        zp = unpack_last(weight_zero_point.t().contiguous()).t()[:N] - 8  # [N, groups]
    g = weight_g_idx.long() if weight_g_idx is not None else torch.arange(K) // (K // groups)
    return dequant(xq, zp[:, g], weight_scale[:, g])


def random_codes(N: int, K: int, groups: int, gen: torch.Generator, dtype=torch.float16, zero_range=(0, 16)):
    """Random codes [N, K], zeros [groups, N] in zero_range (inclusive), positive and negative
    scales [groups, N] spanning several binades."""
    q = torch.randint(0, 16, (N, K), generator=gen)
    z = torch.randint(zero_range[0], zero_range[1] + 1, (groups, N), generator=gen)
    s = (torch.randn(groups, N, generator=gen) * 0.01 * 4.0 ** torch.randint(-3, 3, (groups, N), generator=gen)).to(dtype)
    return q, z, s


def act_order_g_idx(K: int, G: int, gen: torch.Generator) -> torch.Tensor:
    """GPTQ's desc_act assignment: columns taken in a random order, G at a time per group."""
    order = torch.randperm(K, generator=gen)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[order] = (torch.arange(K) // G).to(torch.int32)
    return g_idx
