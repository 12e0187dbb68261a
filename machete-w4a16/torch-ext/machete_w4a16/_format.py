"""The one prepacked int4 weight format of the package, and conversions into it (plain torch).

``QuantizedWeight`` holds, for an ``nn.Linear`` weight ``W [N, K]`` (N outputs, K inputs):

* ``qweight`` int32 ``[N, K / 8]``, contiguous: row n holds W's row n, K contiguous; int32 j
  of a row holds the 4-bit codes of columns ``8j .. 8j + 7``, column ``8j + c`` in nibble slot
  ``c // 2 + 4 (c % 2)`` (bits ``4 slot .. 4 slot + 3``): the slots hold columns 0, 2, 4, 6,
  1, 3, 5, 7 (AWQ's order), so that shifting a word by ``4i`` and one AND-OR with
  ``0x000F000F`` give the codes of columns ``8j + 2i`` and ``8j + 2i + 1`` in the two halves
  of a register: one tensor-core fragment register of the CUDA kernel, no shuffles;
* ``scales`` ``[K / G, N]`` in the activation dtype (float16 / bfloat16), contiguous;
* ``zeros`` uint8 ``[K / G, N]`` (values 0..16) or None: None is the symmetric ``uint4b8``
  type, whose zero point is 8 everywhere;
* ``perm`` int32 ``[K]`` or None: act-order checkpoints. The packed column ``k'`` is the
  original input column ``perm[k']``, so that the groups are contiguous runs of G packed
  columns; the kernels read ``x[:, perm[k']]`` for packed column ``k'``;
* ``group_size`` G: 32, 64, 128 (any power of two >= 16 from a checkpoint), or -1 (one group
  per output channel, G = K).

Semantics, which every kernel of the package matches: ``dequantize(qw)[n, k] = (q - z) * s``
with the code q, zero z and scale s of that element, the product rounded once to the scales'
dtype (it is exact in fp32: a 5-bit integer times an 8- or 11-bit significand), columns in the
original order. Why this layout: docs/machete-w4a16-format.md.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = [
    "QuantizedWeight",
    "dequantize",
    "from_awq",
    "from_compressed_tensors",
    "from_gptq",
    "pack_int4",
    "quantize",
    "unpack_int4",
]

ACT_DTYPES = (torch.float16, torch.bfloat16)
QUANTIZE_GROUP_SIZES = (32, 64, 128, -1)
SYMMETRIC_ZERO = 8
# Nibble slot i of a packed int32 holds column 8j + SLOT_COLUMNS[i]: the package's order, which
# is also AWQ's GEMM packing (AutoAWQ's order_map) and for the same reason: slots i and i + 4
# are two adjacent columns, made into two 16-bit halves of one register by one AND-OR.
SLOT_COLUMNS = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------
# Packing: 8 codes per int32 along the last dimension
# ---------------------------------------------------------------------------------------------


def _pack_slots(q: torch.Tensor) -> torch.Tensor:
    """Codes ``[..., 8m]`` (0..15) -> int32 ``[..., m]``, code ``8j + i`` in slot i (bits ``4i``)."""
    v = q.to(torch.int64).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    words = (v << _SHIFTS.to(device=q.device, dtype=torch.int64)).sum(-1)  # 0 .. 2^32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _unpack_slots(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., m]`` -> ``[..., 8m]`` int32: slot i of word j at position ``8j + i`` (the
    natural order of GPTQ and compressed-tensors checkpoints)."""
    q = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF
    return q.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes ``[..., 8m]`` (integers 0..15, any integer dtype) -> int32 ``[..., m]`` in the
    format's order: column ``8j + c`` of the last dimension in nibble slot ``c // 2 + 4 (c % 2)``
    of int32 j (slot i holds column ``8j + SLOT_COLUMNS[i]``)."""
    if q.shape[-1] % 8:
        raise ValueError(f"q: expected a last dimension that is a multiple of 8, got {tuple(q.shape)}")
    cols = q.reshape(*q.shape[:-1], q.shape[-1] // 8, 8)[..., list(SLOT_COLUMNS)]
    return _pack_slots(cols.reshape(q.shape))


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., m]`` -> codes ``[..., 8m]`` (int32, 0..15) in column order: the inverse of
    :func:`pack_int4`."""
    slots = _unpack_slots(packed).reshape(*packed.shape, 8)
    cols = torch.empty_like(slots)
    cols[..., list(SLOT_COLUMNS)] = slots
    return cols.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


# ---------------------------------------------------------------------------------------------
# The format
# ---------------------------------------------------------------------------------------------


def _check_group_size(group_size, K: int, allowed: tuple | None = None) -> int:
    """The group size as stored (-1 for one group per channel); raises on an unusable one."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if allowed is not None and group_size not in allowed:
        raise ValueError(f"group_size: expected one of {allowed}, got {group_size}")
    if group_size == -1 or group_size == K:
        return -1
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size: expected -1, K ({K}) or a power of two >= 16, got {group_size}")
    if K % group_size:
        raise ValueError(f"group_size: K = {K} is not a multiple of group_size {group_size}")
    return group_size


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A 4-bit weight in the package's one prepacked layout (see the module docstring).
    Construct it with :func:`quantize` or a ``from_*`` converter; the constructor checks the
    tensors against each other and raises naming the field."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    perm: torch.Tensor | None = None
    group_size: int = 128

    def __post_init__(self) -> None:
        q = self.qweight
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int32 or q.dim() != 2:
            got = f"{q.dtype} {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__
            raise ValueError(f"qweight: expected an int32 tensor [N, K / 8], got {got}")
        if not q.is_contiguous():
            raise ValueError(f"qweight: expected a contiguous tensor, got strides {q.stride()}")
        N, K = self.N, self.K
        G = _check_group_size(self.group_size, K) if K else self.group_size
        object.__setattr__(self, "group_size", G)
        groups = 1 if G == -1 else K // G
        s = self.scales
        if not isinstance(s, torch.Tensor) or s.dtype not in ACT_DTYPES:
            got = _dtype_name(s.dtype) if isinstance(s, torch.Tensor) else type(s).__name__
            raise TypeError(f"scales: expected a float16 or bfloat16 tensor, got {got}")
        if tuple(s.shape) != (groups, N) or not s.is_contiguous():
            raise ValueError(f"scales: expected a contiguous [{groups}, {N}] tensor ([K / G, N]), got {tuple(s.shape)} strides {s.stride()}")
        for name, t, dtype, shape in (("zeros", self.zeros, torch.uint8, (groups, N)), ("perm", self.perm, torch.int32, (K,))):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != dtype:
                got = _dtype_name(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"{name}: expected a {_dtype_name(dtype)} tensor or None, got {got}")
            if tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous {list(shape)} tensor, got {tuple(t.shape)}")
            if t.device != q.device:
                raise ValueError(f"{name}: expected device {q.device} (qweight's), got {t.device}")
        if s.device != q.device:
            raise ValueError(f"scales: expected device {q.device} (qweight's), got {s.device}")

    @property
    def N(self) -> int:
        """Output features."""
        return self.qweight.shape[0]

    @property
    def K(self) -> int:
        """Input features."""
        return self.qweight.shape[1] * 8

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (the scales')."""
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def symmetric(self) -> bool:
        """uint4b8: no zeros tensor, zero point 8."""
        return self.zeros is None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The non-None tensors by field name (what a state_dict holds)."""
        return {k: v for k, v in (("qweight", self.qweight), ("scales", self.scales), ("zeros", self.zeros), ("perm", self.perm)) if v is not None}

    def to(self, device=None, dtype: torch.dtype | None = None) -> QuantizedWeight:
        """Moved to ``device``; ``dtype`` converts the scales (rounding them: the dequantized
        weights change by at most that rounding)."""
        def move(t):
            return None if t is None else t.to(device) if device is not None else t

        scales = move(self.scales)
        if dtype is not None:
            scales = scales.to(dtype)
        return QuantizedWeight(move(self.qweight), scales, move(self.zeros), move(self.perm), self.group_size)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def __repr__(self) -> str:
        kind = "uint4b8 (symmetric)" if self.symmetric else "uint4 + zeros"
        return (f"QuantizedWeight(N={self.N}, K={self.K}, group_size={self.group_size}, {kind}, "
                f"dtype={_dtype_name(self.dtype)}, act_order={self.perm is not None}, device={self.device})")  # fmt: skip


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """``[N, K]`` in the scales' dtype: ``(q - z) * s`` per element, rounded once, columns in
    the original (un-permuted) order."""
    G = qw.K if qw.group_size == -1 else qw.group_size
    q = unpack_int4(qw.qweight)  # [N, K], packed column order
    s = qw.scales.float().t().repeat_interleave(G, dim=1)  # [N, K]
    z = SYMMETRIC_ZERO if qw.zeros is None else qw.zeros.t().to(torch.int32).repeat_interleave(G, dim=1)
    w = ((q - z).float() * s).to(qw.dtype)
    if qw.perm is not None:
        out = torch.empty_like(w)
        out[:, qw.perm.long()] = w
        w = out
    return w


# ---------------------------------------------------------------------------------------------
# Round-to-nearest quantization
# ---------------------------------------------------------------------------------------------


def quantize(w: torch.Tensor, group_size: int = 128, zero_point: bool = False) -> QuantizedWeight:
    """Round-to-nearest 4-bit quantization of an ``nn.Linear`` weight ``w [N, K]`` (float16 /
    bfloat16; the scales keep that dtype), per group of ``group_size`` consecutive inputs of one
    output row (32, 64, 128, or -1: one group per row).

    * symmetric (``zero_point=False``, ``uint4b8``): ``s = max(max(w) / 7, -min(w) / 8)``,
      ``q = clamp(round(w / s) + 8, 0, 15)``;
    * asymmetric (``zero_point=True``, ``uint4`` + zeros): with ``lo = min(w, 0)`` and
      ``hi = max(w, 0)``, ``s = (hi - lo) / 15`` rounded up to w's dtype (rounded down, the
      range would need a 16th step and the top code would clip), ``z = clamp(round(-lo / s),
      0, 15)``, ``q = clamp(round(w / s) + z, 0, 15)``.

    s is rounded to w's dtype first (to nearest; up for the asymmetric one), and q computed
    with the rounded s (so dequantization
    uses the s that chose q). An all-zero group gets s = 1."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w: expected a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in ACT_DTYPES:
        raise TypeError(f"w: expected dtype float16 or bfloat16, got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"w: expected shape [N, K] (nn.Linear's weight), got {tuple(w.shape)}")
    N, K = w.shape
    if K % 8 or K == 0:
        raise ValueError(f"w: expected K = w.shape[1] a positive multiple of 8 (8 codes per int32), got {K}")
    G = _check_group_size(group_size, K, QUANTIZE_GROUP_SIZES)
    if not isinstance(zero_point, bool):
        raise TypeError(f"zero_point: expected a bool, got {type(zero_point).__name__}")
    Ge = K if G == -1 else G
    wg = w.detach().float().reshape(N, K // Ge, Ge)
    if zero_point:
        lo = wg.amin(-1).clamp(max=0)
        hi = wg.amax(-1).clamp(min=0)
        s32 = (hi - lo) / 15
        s = s32.to(w.dtype).float()
        # s rounded down would stretch [lo, hi] over more than 15 steps and clip the top code:
        # round up instead (x (1 + eps) rounds to a value >= x: eps is the dtype's widest spacing).
        s = torch.where(s < s32, (s32 * (1 + torch.finfo(w.dtype).eps)).to(w.dtype).float(), s)
    else:
        s = torch.maximum(wg.amax(-1) / 7, -wg.amin(-1) / 8).to(w.dtype).float()
    s = torch.where(s > 0, s, torch.ones_like(s))  # all-zero groups (and fp16 underflow)
    if zero_point:
        z = torch.round(-lo / s).clamp(0, 15)
    else:
        z = torch.full_like(s, SYMMETRIC_ZERO)
    q = (torch.round(wg / s[..., None]) + z[..., None]).clamp(0, 15).to(torch.int32).reshape(N, K)
    zeros = z.to(torch.uint8).t().contiguous() if zero_point else None
    return QuantizedWeight(pack_int4(q), s.to(w.dtype).t().contiguous(), zeros, None, G)


# ---------------------------------------------------------------------------------------------
# Checkpoint formats
# ---------------------------------------------------------------------------------------------


def _check_int32(t, name: str, shape: tuple | None = None, what: str = "") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype int32, got {t.dtype}")
    if t.dim() != 2 or (shape is not None and tuple(t.shape) != shape):
        raise ValueError(f"{name}: expected shape {what or shape}, got {tuple(t.shape)}")
    return t


def _check_scales(scales, name: str, shape: tuple, what: str) -> torch.Tensor:
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}: expected dtype float16 or bfloat16, got {scales.dtype}")
    if tuple(scales.shape) != shape:
        raise ValueError(f"{name}: expected shape {what} = {list(shape)}, got {tuple(scales.shape)}")
    return scales


def _group_size_of(K: int, groups: int, name: str) -> int:
    if groups <= 0 or K % groups:
        raise ValueError(f"{name}: {groups} groups do not divide K = {K}")
    return _check_group_size(K // groups, K)


def _act_order(g_idx, K: int, G: int, name: str) -> torch.Tensor | None:
    """None when ``g_idx`` (the group of each input column) is absent or the trivial
    ``k // G``; else the permutation that sorts the columns by group (stable), which must
    give contiguous runs of exactly G columns per group (what GPTQ's act-order produces).
    Any other assignment raises: the format has no per-column group index."""
    if g_idx is None:
        return None
    if not isinstance(g_idx, torch.Tensor) or g_idx.dtype not in (torch.int32, torch.int64) or tuple(g_idx.shape) != (K,):
        got = f"{g_idx.dtype} {tuple(g_idx.shape)}" if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ValueError(f"{name}: expected an int32 / int64 tensor [{K}] (the group of each input column), got {got}")
    Ge = K if G == -1 else G
    g = g_idx.long()
    expected = torch.arange(K, device=g.device) // Ge
    if torch.equal(g, expected):
        return None
    perm = torch.sort(g, stable=True).indices
    if not torch.equal(g[perm], expected):
        raise ValueError(
            f"{name}: sorting the columns by group does not give {K // Ge} runs of exactly {Ge} columns "
            "(each group must hold group_size columns, as GPTQ's act-order assigns them)"
        )
    return perm.to(torch.int32)


def _from_codes(q_nk: torch.Tensor, z_gn: torch.Tensor, scales_gn: torch.Tensor, G: int, perm) -> QuantizedWeight:
    """codes [N, K] (original column order), zeros [K/G, N] (0..16), scales [K/G, N]."""
    if perm is not None:
        q_nk = q_nk[:, perm.long()]
    symmetric = bool((z_gn == SYMMETRIC_ZERO).all())
    zeros = None if symmetric else z_gn.to(torch.uint8).contiguous()
    return QuantizedWeight(pack_int4(q_nk).contiguous(), scales_gn.contiguous(), zeros, perm, G)


def _unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] packed along dim 0 (8 rows per int32, natural order) -> codes [8R, C]."""
    return _unpack_slots(packed.t().contiguous()).t()


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None = None) -> QuantizedWeight:
    """AutoGPTQ / GPTQModel ``gptq`` (v1) tensors of a 4-bit layer:

    * ``qweight`` int32 ``[K / 8, N]``, packed along K: code of input k in bits ``4 (k % 8)``
      of ``qweight[k // 8, n]``;
    * ``qzeros`` int32 ``[K / G, N / 8]``, packed along N the same way, holding **zero − 1**
      (the v1 convention: the stored nibble is one less than the zero point, so a stored 15
      means zero 16; symmetric checkpoints store 7, i.e. 0x77777777);
    * ``scales`` float16 / bfloat16 ``[K / G, N]``;
    * ``g_idx`` int32 ``[K]`` or None: the group of each input (act-order / desc_act).

    Dequantized: ``w[n, k] = (q[k, n] - (zs[g, n] + 1)) * scales[g, n]`` with ``g = g_idx[k]``
    (``k // G`` without g_idx). Act-order: the inputs are permuted so each group is
    contiguous (see :func:`QuantizedWeight`). ``gptq_v2`` checkpoints (exact zeros) are not
    this format."""
    qweight = _check_int32(qweight, "qweight", what="[K / 8, N]")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2:
        raise ValueError(f"scales: expected a [K / G, N] tensor, got {getattr(scales, 'shape', type(scales).__name__)}")
    groups = scales.shape[0]
    scales = _check_scales(scales, "scales", (groups, N), "[K / G, N]")
    G = _group_size_of(K, groups, "scales")
    qzeros = _check_int32(qzeros, "qzeros", (groups, (N + 7) // 8), f"[K / G, N / 8] = [{groups}, {(N + 7) // 8}]")
    q = _unpack_slots(qweight.t().contiguous())  # [N, K]: qweight^T is packed along its last dim
    z = _unpack_slots(qzeros)[:, :N] + 1  # v1: stored zero - 1
    return _from_codes(q, z, scales, G, _act_order(g_idx, K, G, "g_idx"))


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> QuantizedWeight:
    """AutoAWQ ``gemm`` tensors of a 4-bit layer:

    * ``qweight`` int32 ``[K, N / 8]``, packed along N: nibble slot i (bits ``4i``) of
      ``qweight[k, c]`` holds output ``8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]``;
    * ``qzeros`` int32 ``[K / G, N / 8]``, the same packing, the zero point itself;
    * ``scales`` float16 / bfloat16 ``[K / G, N]``.

    Dequantized: ``w[n, k] = (q[k, n] - z[k // G, n]) * scales[k // G, n]``."""
    qweight = _check_int32(qweight, "qweight", what="[K, N / 8]")
    K, N = qweight.shape[0], qweight.shape[1] * 8
    if K % 8:
        raise ValueError(f"qweight: expected K = qweight.shape[0] a multiple of 8, got {K}")
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2:
        raise ValueError(f"scales: expected a [K / G, N] tensor, got {getattr(scales, 'shape', type(scales).__name__)}")
    groups = scales.shape[0]
    scales = _check_scales(scales, "scales", (groups, N), "[K / G, N]")
    G = _group_size_of(K, groups, "scales")
    qzeros = _check_int32(qzeros, "qzeros", (groups, N // 8), f"[K / G, N / 8] = [{groups}, {N // 8}]")
    q = unpack_int4(qweight).t()  # [N, K]: AWQ's slot order is the format's, along N
    return _from_codes(q, unpack_int4(qzeros), scales, G, None)


def from_compressed_tensors(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_shape,
    weight_zero_point: torch.Tensor | None = None,
    weight_g_idx: torch.Tensor | None = None,
) -> QuantizedWeight:
    """compressed-tensors ``pack-quantized`` 4-bit tensors (group or channel strategy):

    * ``weight_packed`` int32 ``[N, ceil(K / 8)]``, packed along K: the code of input k in
      bits ``4 (k % 8)`` of ``weight_packed[n, k // 8]``, stored as the signed value + 8;
    * ``weight_scale`` ``[N, K / G]`` (``[N, 1]``: per channel);
    * ``weight_shape`` ``(N, K)`` (a tensor or a sequence);
    * ``weight_zero_point`` (asymmetric only): int32 ``[ceil(N / 8), K / G]`` packed along N
      (signed value + 8, like the weights), or the unpacked signed int8 / int32 ``[N, K / G]``;
    * ``weight_g_idx`` ``[K]`` or None (act-order).

    Dequantized (compressed-tensors: ``(x_q - zp) * scale`` on the signed values): with the
    stored codes q and z, ``w = ((q - 8) - (z - 8)) * s = (q - z) * s``; z = 8 when
    symmetric. K must be a multiple of 8 here (the format pads K; this one does not)."""
    if isinstance(weight_shape, torch.Tensor):
        weight_shape = weight_shape.tolist()
    try:
        N, K = (int(v) for v in weight_shape)
    except (TypeError, ValueError):
        raise ValueError(f"weight_shape: expected (N, K), got {weight_shape!r}") from None
    if K % 8 or K <= 0:
        raise ValueError(f"weight_shape: expected K a positive multiple of 8 (this format does not pad K), got K = {K}")
    weight_packed = _check_int32(weight_packed, "weight_packed", (N, K // 8), f"[N, K / 8] = [{N}, {K // 8}]")
    if not isinstance(weight_scale, torch.Tensor) or weight_scale.dim() != 2:
        raise ValueError(f"weight_scale: expected a [N, K / G] tensor, got {getattr(weight_scale, 'shape', type(weight_scale).__name__)}")
    groups = weight_scale.shape[1]
    weight_scale = _check_scales(weight_scale, "weight_scale", (N, groups), "[N, K / G]")
    G = _group_size_of(K, groups, "weight_scale")
    q = _unpack_slots(weight_packed)  # [N, K]
    if weight_zero_point is None:
        z = torch.full((groups, N), SYMMETRIC_ZERO, dtype=torch.int32, device=q.device)
    elif not isinstance(weight_zero_point, torch.Tensor):
        raise TypeError(f"weight_zero_point: expected a torch.Tensor or None, got {type(weight_zero_point).__name__}")
    elif weight_zero_point.dtype == torch.int32 and tuple(weight_zero_point.shape) == ((N + 7) // 8, groups):
        z = _unpack_rows(weight_zero_point)[:N].t()  # stored = zp + 8 = our zero
    elif weight_zero_point.dtype in (torch.int8, torch.int32) and tuple(weight_zero_point.shape) == (N, groups):
        z = (weight_zero_point.to(torch.int32) + 8).t()
    else:
        raise ValueError(
            f"weight_zero_point: expected int32 [ceil(N / 8), K / G] = [{(N + 7) // 8}, {groups}] (packed) or "
            f"int8 [N, K / G] = [{N}, {groups}], got {weight_zero_point.dtype} {tuple(weight_zero_point.shape)}"
        )
    if ((z < 0) | (z > 15)).any():
        raise ValueError("weight_zero_point: values outside the 4-bit range [-8, 7]")
    return _from_codes(q, z, weight_scale.t(), G, _act_order(weight_g_idx, K, G, "weight_g_idx"))
