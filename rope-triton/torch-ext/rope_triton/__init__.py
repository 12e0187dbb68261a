"""Rotary position embeddings in Triton, and the fused RMSNorm -> matmul -> RoPE projection.

One Triton source serves CUDA (sm80, sm90) and ROCm (gfx942). On CPU the ops run a plain-torch
implementation with the same semantics, unless ``TRITON_INTERPRET=1`` is set before the first
call, in which case CPU tensors go through the Triton kernels in Triton's interpreter (how CI
tests the kernel code without a GPU).

* :func:`apply_rotary_transformers` — transformers' ``apply_rotary_pos_emb`` (same arguments,
  same rounding: ``q * cos + rotate_half(q) * sin`` in q's dtype).
* :func:`apply_rotary` — tables (optionally indexed by ``position_ids``), GQA, ``bhsd`` /
  ``bshd`` layouts, partial rotary, NeoX half rotation or GPT-J interleaved pairs, in place or
  not, strided q / k (views of a fused QKV projection); rotation in fp32, rounded once.
* :func:`apply_rotary_from_positions` — cos / sin computed in the kernel from integer positions
  and ``theta`` (optionally Llama-3 frequency scaling), no tables.
* :func:`rms_norm_matmul_rope` — RMSNorm, the Q/K projection and RoPE in one kernel.
* :func:`decode_attention` — the attention of one decode token over a static cache: grouped K / V
  heads read once per sequence, a boolean mask, the cache split over many programs (split-KV).
"""

from __future__ import annotations

import functools
import math

import torch

from . import _reference, layers
from ._light_ops import define_op
from ._triton_launch import SignatureTable, triton_enabled_for
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "apply_rotary",
    "apply_rotary_from_positions",
    "apply_rotary_transformers",
    "decode_attention",
    "inv_frequencies",
    "layers",
    "rms_norm_matmul_rope",
    "fold_rms_weight",
    "triton_enabled_for",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int32, torch.int64)
_LAYOUTS = ("bhsd", "bshd")


# ---------------------------------------------------------------------------------------------
# Which implementation runs
# ---------------------------------------------------------------------------------------------




def _triton_kernels():
    from . import _kernels

    return _kernels


# ---------------------------------------------------------------------------------------------
# Ops (mutate their declared outputs, return nothing; fake implementations only have to exist)
# ---------------------------------------------------------------------------------------------


def _run_rope_planned(q, k, q_out, k_out, cos, sin, pos, inv_freq, rotary_dim, interleaved, hf_rounding, table_rows):
    """_run_rope, returning the Triton launch plan it used (None on the plain-torch path)."""
    if triton_enabled_for(q):
        return _triton_kernels().launch_rope(q, k, q_out, k_out, cos, sin, pos, inv_freq, rotary_dim, interleaved,
                                             hf_rounding, table_rows)
    _reference.rope(q, k, q_out, k_out, cos, sin, pos, inv_freq, rotary_dim, interleaved, hf_rounding, table_rows)
    return None


def _run_rope(q, k, q_out, k_out, cos, sin, pos, inv_freq, rotary_dim, interleaved, hf_rounding, table_rows) -> None:
    _run_rope_planned(q, k, q_out, k_out, cos, sin, pos, inv_freq, rotary_dim, interleaved, hf_rounding, table_rows)


def _rotary_inplace(q, k, cos, sin, pos, inv_freq, rotary_dim, interleaved, table_rows) -> None:
    """In place: q and k ([B, S, H, D] views) are rotated where they are."""
    _run_rope(q, k, q, k, cos, sin, pos, inv_freq, rotary_dim, interleaved, False, table_rows)


def _rms_norm_matmul_rope(out, x, rms_weight, w, cos, sin, eps, head_dim, impl) -> None:
    """x [M, K], rms_weight [K] (None: folded into w), w [N, K], cos/sin [M, >= head_dim / 2]; writes out [M, N].
    impl: "fused" (one launch) or "unfused" (RMSNorm, cuBLAS, RoPE)."""
    if not triton_enabled_for(x):
        _reference.rms_matmul_rope(x, rms_weight, w, cos, sin, out, eps, head_dim)
    elif impl == "fused":
        _triton_kernels().launch_rms_matmul_rope(x, rms_weight, w, cos, sin, out, eps, head_dim)
    else:
        _triton_kernels().launch_unfused_projection(x, rms_weight, w, cos, sin, out, eps, head_dim)


def _returns_nothing(*args) -> None:
    """The fake implementation of ops that only write their declared outputs."""
    return None


# Low-dispatch-cost ops (see _light_ops): q, k [B, S, H, D] views; the outputs are declared
# with (a!) / (b!) so torch.compile knows what each op writes.
define_op(
    add_op_namespace_prefix("rotary"),
    "(Tensor q, Tensor k, Tensor(a!) q_out, Tensor(b!) k_out, Tensor? cos, Tensor? sin, Tensor? pos, "
    "Tensor? inv_freq, int rotary_dim, bool interleaved, bool hf_rounding, str table_rows) -> ()",
    _run_rope, _returns_nothing,
)
define_op(
    add_op_namespace_prefix("rotary_"),
    "(Tensor(a!) q, Tensor(b!) k, Tensor? cos, Tensor? sin, Tensor? pos, Tensor? inv_freq, int rotary_dim, "
    "bool interleaved, str table_rows) -> ()",
    _rotary_inplace, _returns_nothing,
)
define_op(
    add_op_namespace_prefix("rms_norm_matmul_rope"),
    "(Tensor(a!) out, Tensor x, Tensor? rms_weight, Tensor w, Tensor cos, Tensor sin, float eps, int head_dim, "
    "str impl) -> ()",
    _rms_norm_matmul_rope, _returns_nothing,
)


def _run_decode_attention(out, q, k, v, mask, scale) -> None:
    """q [B, H, 1, D], k / v [B, H_kv, L, D], mask [B, L] bool (a stride-0 batch where shared);
    writes out [B, H, 1, D]."""
    if q.shape[0] * q.shape[1] == 0:
        return
    if triton_enabled_for(q):
        _triton_kernels().launch_decode_attention(q, k, v, mask, out, scale)
    else:
        _reference.decode_attention(q, k, v, mask, out, scale)


define_op(
    add_op_namespace_prefix("decode_attention"),
    "(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> ()",
    _run_decode_attention, _returns_nothing,
)


# The one-launch kernel wins up to this many tokens; above it, impl="auto" runs the unfused
# sequence. H100, Llama-3 8B [W_q; W_k], `fused-llm bench rope-triton` against the unfused
# sequence (`rms_matmul_rope_config`): with rms_weight passed 1.14-1.18x at 1-16 tokens, 1.09x
# at 32, 0.86x at 64; with it folded into W (rms_weight=None; unsplit tiles on Hopper)
# 1.16-1.21x at 1 - 64 tokens, 1.04x at 128, 0.95x - 0.76x at 256 - 1024 (whole-head tiles).
# From FUSED_PROJECTION_MIN_PREFILL_TOKENS_FOLDED tokens on, on Hopper (TMA), the folded form
# runs fused again: the persistent kernel measured 1.05-1.12x at 4096 tokens (0.95x at 2048).
FUSED_PROJECTION_MAX_TOKENS = 32
FUSED_PROJECTION_MAX_TOKENS_FOLDED = 64
FUSED_PROJECTION_MAX_TOKENS_FOLDED_TMA = 128  # Hopper (TMA): the 65 - 128 token tiles were timed there only
FUSED_PROJECTION_MIN_PREFILL_TOKENS_FOLDED = 4096
_PROJECTION_IMPLS = ("auto", "fused", "unfused")


# ---------------------------------------------------------------------------------------------
# Argument checks: every error names the argument, what was expected and what came
# ---------------------------------------------------------------------------------------------


def _check_tensor(t, name: str, dtypes=_FLOAT_DTYPES) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        expected = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name}: expected dtype {expected}, got {t.dtype}")
    return t


def _as_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The [B, S, H, D] view the kernels index (a permutation of a bhsd tensor, no copy)."""
    return t.permute(0, 2, 1, 3) if layout == "bhsd" else t


def _check_qk(q, k, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k as [B, S, H, D] views."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
    _check_tensor(q, "q")
    _check_tensor(k, "k")
    for t, name in ((q, "q"), (k, "k")):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D [{', '.join(layout.upper())}] tensor, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}: the head dimension must be contiguous (stride 1), got strides {t.stride()}")
    if k.dtype != q.dtype:
        raise TypeError(f"k: expected dtype {q.dtype} (q's), got {k.dtype}")
    if k.device != q.device:
        raise ValueError(f"k: expected device {q.device} (q's), got {k.device}")
    q4, k4 = _as_bshd(q, layout), _as_bshd(k, layout)
    if k4.shape[0] != q4.shape[0] or k4.shape[1] != q4.shape[1] or k4.shape[3] != q4.shape[3]:
        raise ValueError(
            f"k: expected batch, sequence and head_dim of q ({q4.shape[0]}, {q4.shape[1]}, {q4.shape[3]}) "
            f"in layout {layout!r}, got shape {tuple(k.shape)}"
        )
    return q4, k4


def _check_flag(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_eps(eps) -> float:
    """eps as the other packages' RMSNorms take it (>= 0), and finite."""
    if not _is_number(eps):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    return float(eps)


def _check_theta(theta) -> float:
    if not (_is_number(theta) and math.isfinite(theta) and theta > 1):
        raise ValueError(f"theta: expected a finite number > 1, got {theta!r}")
    return float(theta)


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _check_rope_scaling(rope_scaling) -> None:
    """None, or a dict of transformers' llama3 form (only llama3 is supported)."""
    if rope_scaling is None:
        return
    if not isinstance(rope_scaling, dict):
        raise TypeError(f"rope_scaling: expected a dict or None, got {type(rope_scaling).__name__}")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"rope_scaling: only rope_type 'llama3' is supported, got {kind!r}")
    missing = [key for key in _LLAMA3_KEYS if key not in rope_scaling]
    if missing:
        raise ValueError(f"rope_scaling: expected the llama3 keys {list(_LLAMA3_KEYS)}, missing {missing}")
    bad = {key: rope_scaling[key] for key in _LLAMA3_KEYS
           if not (_is_number(rope_scaling[key]) and math.isfinite(rope_scaling[key]) and rope_scaling[key] > 0)}  # fmt: skip
    if bad:
        raise ValueError(f"rope_scaling: expected finite numbers > 0, got {bad}")
    low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    if not high > low:
        raise ValueError(f"rope_scaling: expected high_freq_factor > low_freq_factor, got {high} and {low}")


def _check_rotary_dim(rotary_dim: int | None, head_dim: int) -> int:
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim: expected an even int in [2, head_dim = {head_dim}], got {rotary_dim!r}")
    return rotary_dim


def _half_table(t: torch.Tensor, name: str, rotary_dim: int, interleaved: bool, q: torch.Tensor) -> torch.Tensor:
    """A cos / sin table whose last dimension is rotary_dim / 2 (the frequencies once) or
    rotary_dim (transformers' duplicated form: halves cat'ed, or pairs repeated when
    interleaved), as a view of rotary_dim / 2 columns."""
    _check_tensor(t, name)
    if t.device != q.device:
        raise ValueError(f"{name}: expected device {q.device} (q's), got {t.device}")
    half = rotary_dim // 2
    width = t.shape[-1] if t.dim() else 0
    if width == half:
        return t
    if width == rotary_dim:
        return t[..., ::2] if interleaved else t[..., :half]
    raise ValueError(
        f"{name}: expected a last dimension of rotary_dim / 2 = {half} or rotary_dim = {rotary_dim}, "
        f"got shape {tuple(t.shape)}"
    )


def _check_positions(p, name: str, B: int, S: int, device) -> torch.Tensor:
    """Positions as [1 or B, S] integers."""
    _check_tensor(p, name, _INT_DTYPES)
    if p.device != device:
        raise ValueError(f"{name}: expected device {device} (q's), got {p.device}")
    if p.dim() == 1:
        p = p[None]
    if p.dim() != 2 or p.shape[1] != S or p.shape[0] not in (1, B):
        raise ValueError(f"{name}: expected shape [{S}] or [{B}, {S}] (sequence length {S}), got {tuple(p.shape)}")
    return p


def _outputs(q, k, q4, k4, layout: str, inplace: bool):
    if inplace:
        return q, k, q4, k4
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    return q_out, k_out, _as_bshd(q_out, layout), _as_bshd(k_out, layout)


def _call(q, k, q4, k4, layout, inplace, cos, sin, pos, inv_freq, rotary_dim, interleaved, table_rows):
    q_out, k_out, qo4, ko4 = _outputs(q, k, q4, k4, layout, inplace)
    if not torch.compiler.is_compiling():
        # Eager: the implementation itself. The custom-op dispatch around it cost ~100 us a
        # call on the H100 host (the launch 10 us); torch.compile needs the op.
        _run_rope(q4, k4, qo4 if not inplace else q4, ko4 if not inplace else k4, cos, sin, pos, inv_freq,
                  rotary_dim, interleaved, False, table_rows)
    elif inplace:
        ops.rotary_(q4, k4, cos, sin, pos, inv_freq, rotary_dim, interleaved, table_rows)
    else:
        ops.rotary(q4, k4, qo4, ko4, cos, sin, pos, inv_freq, rotary_dim, interleaved, False, table_rows)
    return q_out, k_out


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    layout: str = "bhsd",
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` (``layout="bshd"``: ``[B, S, H, D]``).

    * ``cos`` / ``sin``: without ``position_ids``, per token: ``[S, W]`` or ``[B, S, W]``; with
      ``position_ids`` (``[S]`` or ``[B, S]`` integers), tables ``[max_position, W]`` read at those
      rows. ``W`` is ``rotary_dim / 2`` or ``rotary_dim`` (transformers' duplicated tables).
    * ``rotary_dim`` (default ``D``): the first ``rotary_dim`` columns rotate, the rest pass
      through. ``interleaved``: pairs ``(2i, 2i + 1)`` (GPT-J / original Llama complex form);
      else ``(i, i + rotary_dim / 2)`` (NeoX / transformers).
    * The rotation is computed in fp32 and rounded once to q's dtype. q and k may be strided
      views (e.g. of a fused QKV output) with a unit-stride head dimension; ``inplace`` writes
      into them. Returns ``(q_out, k_out)`` in the input layout.
    """
    q4, k4 = _check_qk(q, k, layout)
    B, S, _, D = q4.shape
    rotary_dim = _check_rotary_dim(rotary_dim, D)
    _check_flag(interleaved, "interleaved")
    _check_flag(inplace, "inplace")
    cos = _half_table(cos, "cos", rotary_dim, interleaved, q)
    sin = _half_table(sin, "sin", rotary_dim, interleaved, q)
    if sin.shape != cos.shape:
        raise ValueError(f"sin: expected the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    if position_ids is not None:
        pos = _check_positions(position_ids, "position_ids", B, S, q.device)
        if cos.dim() != 2:
            raise ValueError(f"cos: with position_ids, expected a 2-D [max_position, width] table, got shape {tuple(cos.shape)}")
        table_rows = "pos"
    else:
        pos = None
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        if cos.dim() != 3 or cos.shape[1] != S or cos.shape[0] not in (1, B):
            raise ValueError(f"cos: expected shape [{S}, W] or [{B}, {S}, W] (one row per token), got {tuple(cos.shape)}")
        table_rows = "bs"
    return _call(q, k, q4, k4, layout, inplace, cos, sin, pos, None, rotary_dim, interleaved, table_rows)


def inv_frequencies(
    rotary_dim: int, theta: float = 10000.0, rope_scaling: dict | None = None, device=None
) -> torch.Tensor:
    """fp32 ``[rotary_dim / 2]`` inverse frequencies ``theta ** (-2i / rotary_dim)``, as
    transformers computes them; ``rope_scaling`` with ``rope_type`` ``"llama3"`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) applies
    Llama 3's frequency scaling: wavelengths past ``original / low_freq_factor`` are divided
    by ``factor``, those below ``original / high_freq_factor`` kept, and the band between
    interpolated."""
    if not (isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool) and rotary_dim >= 2 and rotary_dim % 2 == 0):
        raise ValueError(f"rotary_dim: expected an even int >= 2, got {rotary_dim!r}")
    theta = _check_theta(theta)
    _check_rope_scaling(rope_scaling)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / rotary_dim
    inv_freq = 1.0 / (theta**exponents)
    if rope_scaling is None:
        return inv_freq
    factor = float(rope_scaling["factor"])
    low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
    original = float(rope_scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    long_waves = wavelength > original / low
    short_waves = wavelength < original / high
    blend = (original / wavelength - low) / (high - low)  # 0 at the long end of the band, 1 at the short
    in_band = (1 - blend) * inv_freq / factor + blend * inv_freq
    return torch.where(long_waves, inv_freq / factor, torch.where(short_waves, inv_freq, in_band))


@torch.compiler.assume_constant_result
@functools.lru_cache(maxsize=64)
def _cached_inv_freq(rotary_dim: int, theta: float, scaling: tuple | None, device: torch.device) -> torch.Tensor:
    # Computed on the CPU, as transformers computes its inv_freq buffer at model init: the
    # GPU's pow can round differently by an ulp, which at position 1e5 moves the angle by
    # ~6e-3 rad. A constant for torch.compile (not re-traced, so compiled == eager).
    return inv_frequencies(rotary_dim, theta, dict(scaling) if scaling else None).to(device)


def apply_rotary_from_positions(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    *,
    rope_scaling: dict | None = None,
    layout: str = "bhsd",
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`apply_rotary`, with cos / sin computed in the kernel (fp32, accurate cos / sin)
    from integer ``positions`` (``[S]`` or ``[B, S]``) and the inverse frequencies of ``theta``
    (and ``rope_scaling``, see :func:`inv_frequencies`): no tables are read."""
    q4, k4 = _check_qk(q, k, layout)
    B, S, _, D = q4.shape
    rotary_dim = _check_rotary_dim(rotary_dim, D)
    pos = _check_positions(positions, "positions", B, S, q.device)
    _check_flag(interleaved, "interleaved")
    _check_flag(inplace, "inplace")
    theta = _check_theta(theta)
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise TypeError(f"rope_scaling: expected a dict or None, got {type(rope_scaling).__name__}")
    scaling = tuple(sorted(rope_scaling.items())) if rope_scaling else None
    # (rope_scaling's contents are checked by inv_frequencies, on a miss of this cache)
    inv_freq = _cached_inv_freq(rotary_dim, theta, scaling, q.device)
    return _call(q, k, q4, k4, layout, inplace, None, None, pos, inv_freq, rotary_dim, interleaved, "positions")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _transformers_eager(q, k, cos, sin, unsqueeze_dim):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def apply_rotary_transformers(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, same results:
    ``q * cos + rotate_half(q) * sin`` with each op rounded to q's dtype. ``unsqueeze_dim`` 1:
    q ``[B, H, S, D]``, cos ``[B, S, D]``; 2: q ``[B, S, H, D]``. Inputs outside what the kernel
    takes (cos in another dtype, other broadcasts) run transformers' expression itself."""
    key = None
    if not torch.compiler.is_compiling() and isinstance(unsqueeze_dim, int):
        key = _rotary_call_key(q, k, cos, sin, unsqueeze_dim)
        plan = _FAST_ROTARY.get(key) if key is not None else None
        if plan is not None:
            q_out, k_out = torch.empty_like(q), torch.empty_like(k)
            plan(q, k, q_out, k_out, cos, sin, q, q)
            return q_out, k_out
    fits = (
        isinstance(q, torch.Tensor)
        and isinstance(k, torch.Tensor)
        and isinstance(cos, torch.Tensor)
        and isinstance(sin, torch.Tensor)
        and unsqueeze_dim in (1, 2)
        and q.dim() == 4
        and k.dim() == 4
        and q.dtype in _FLOAT_DTYPES
        and q.dtype == k.dtype == cos.dtype == sin.dtype
        and q.device == k.device == cos.device == sin.device
        and q.shape[-1] % 2 == 0
        and q.shape[-1] >= 2
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and cos.dim() == 3
        and cos.shape == sin.shape
        and cos.shape[-1] == q.shape[-1]
    )
    if fits:
        layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
        q4, k4 = _as_bshd(q, layout), _as_bshd(k, layout)
        B, S = q4.shape[:2]
        fits = (
            k4.shape[:2] == (B, S)
            and k4.shape[3] == q4.shape[3]
            and cos.shape[1] == S
            and cos.shape[0] in (1, B)
        )
    if not fits:
        return _transformers_eager(q, k, cos, sin, unsqueeze_dim)
    # Outputs laid out as q and k are when those are dense (transformers' [B, S, H, D] memory
    # seen as [B, H, S, D]), as its own expression's results are; contiguous otherwise.
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    qo4, ko4 = _as_bshd(q_out, layout), _as_bshd(k_out, layout)
    if torch.compiler.is_compiling():  # see _call
        ops.rotary(q4, k4, qo4, ko4, cos, sin, None, None, q4.shape[3], False, True, "bs")
        return q_out, k_out
    plan = _run_rope_planned(q4, k4, qo4, ko4, cos, sin, None, None, q4.shape[3], False, True, "bs")
    if plan is not None and key is not None:
        _FAST_ROTARY.put(key, plan)
    return q_out, k_out


# Call signatures of apply_rotary_transformers that reached a launch plan: a repeated one (decode:
# every layer, every token) skips the checks, the views and the plan's own key (on the H100 host
# the call went from 31-42 us to ~16). The key holds everything those depend on: each tensor's
# shape, strides, dtype, device and 16-byte alignment (Triton specializes pointers on it).
_FAST_ROTARY = SignatureTable()


def _rotary_call_key(q, k, cos, sin, unsqueeze_dim):
    try:
        return (
            q.shape, q.stride(), q.dtype, q.get_device(), q.data_ptr() % 16,
            k.shape, k.stride(), k.dtype, k.get_device(), k.data_ptr() % 16,
            cos.shape, cos.stride(), cos.dtype, cos.get_device(), cos.data_ptr() % 16,
            sin.shape, sin.stride(), sin.dtype, sin.get_device(), sin.data_ptr() % 16,
            unsqueeze_dim,
        )  # fmt: skip
    except AttributeError:  # not tensors: the full path says what is wrong
        return None


def fold_rms_weight(w: torch.Tensor, rms_weight: torch.Tensor) -> torch.Tensor:
    """``w * rms_weight`` column by column (``[N, K]``, w's dtype, computed in fp32 and rounded
    once): the RMSNorm weight folded into the projection that follows it, since
    ``linear(rms_norm(x) * g, w) == linear(rms_norm(x), w * g)``. Pass the result to
    `rms_norm_matmul_rope` with ``rms_weight=None``: the fused kernel then feeds x tiles to
    the tensor cores unmodified. Both are parameters, so fold once (at load) and keep it."""
    _check_tensor(w, "w")
    _check_tensor(rms_weight, "rms_weight")
    if w.dim() != 2:
        raise ValueError(f"w: expected shape [N, K] (nn.Linear layout), got {tuple(w.shape)}")
    if rms_weight.shape != (w.shape[1],):
        raise ValueError(f"rms_weight: expected shape ({w.shape[1]},) (w's K), got {tuple(rms_weight.shape)}")
    if rms_weight.device != w.device:
        raise ValueError(f"rms_weight: expected device {w.device} (w's), got {rms_weight.device}")
    return (w.float() * rms_weight.float()[None, :]).to(w.dtype)


def _persistent_prefill(x: torch.Tensor, w: torch.Tensor, head_dim: int) -> bool:
    """Whether the fused projection's configuration picks the persistent prefill kernel here (the
    RMSNorm weight folded; Hopper's TMA; a head_dim its whole-head tiles can split): the only
    prefill form faster than the unfused one."""
    if not triton_enabled_for(x):
        return False
    kernels = _triton_kernels()
    cfg = kernels.rms_matmul_rope_config(x.shape[0], x.shape[1], head_dim, folded=True, tma=kernels._use_tma(x, w))
    return isinstance(cfg, kernels.RmsMatmulRopePersistentConfig)


def rms_norm_matmul_rope(
    x: torch.Tensor,
    rms_weight: torch.Tensor | None,
    w: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    head_dim: int | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """``rope(linear(rms_norm(x, rms_weight, eps), w))`` for a Q or K (or Q and K concatenated)
    projection: x ``[..., K]``, rms_weight ``[K]``, w ``[N, K]`` (nn.Linear layout, N = heads x
    head_dim); every head gets the NeoX half rotation. cos / sin: one row per token,
    ``[..., head_dim]`` (transformers' tables, first half used) or ``[..., head_dim / 2]``;
    ``head_dim`` defaults to the table width. Returns ``[..., N]`` in x's dtype.

    ``rms_weight=None``: no RMSNorm weight, or one already folded into w by
    `fold_rms_weight(w, rms_weight)` (do that once, at load: both are parameters). The fused
    kernel is faster that way (its x tiles feed the tensor cores unmodified); the result
    differs from the unfolded one by w * rms_weight's rounding to w's dtype.

    ``impl``: ``"fused"`` is one kernel: the RMS statistics accumulated while x streams through
    the matmul, the RMS scale applied to the fp32 accumulator, RoPE in the epilogue.
    ``"unfused"`` is RMSNorm (rounded to x's dtype) -> cuBLAS -> RoPE in place, three launches.
    ``"auto"`` (default) picks fused up to ``FUSED_PROJECTION_MAX_TOKENS`` tokens
    (``FUSED_PROJECTION_MAX_TOKENS_FOLDED`` with rms_weight=None, ``..._TMA`` on Hopper), where it measured faster,
    and unfused above, except that with rms_weight=None on Hopper it picks fused again from
    ``FUSED_PROJECTION_MIN_PREFILL_TOKENS_FOLDED`` tokens (the persistent prefill kernel). Off
    the GPU (no Triton) both run the torch reference."""
    _check_tensor(x, "x", (torch.float16, torch.bfloat16))
    eps = _check_eps(eps)
    if impl not in _PROJECTION_IMPLS:
        raise ValueError(f"impl: expected one of {_PROJECTION_IMPLS}, got {impl!r}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x: expected shape [..., K] with K >= 1, got {tuple(x.shape)}")
    K = x.shape[-1]
    named = [(w, "w"), (cos, "cos"), (sin, "sin")]
    if rms_weight is not None:
        named.insert(0, (rms_weight, "rms_weight"))
    for t, name in named:
        _check_tensor(t, name)
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    for t, name in named[:-2]:
        if t.dtype != x.dtype:
            raise TypeError(f"{name}: expected dtype {x.dtype} (x's), got {t.dtype}")
    if rms_weight is not None and rms_weight.shape != (K,):
        raise ValueError(f"rms_weight: expected shape ({K},), got {tuple(rms_weight.shape)}")
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w: expected shape [N, {K}] (nn.Linear layout), got {tuple(w.shape)}")
    if w.stride(1) != 1:
        raise ValueError(f"w: the K dimension must be contiguous (stride 1), got strides {w.stride()}")
    head_dim = cos.shape[-1] if head_dim is None else head_dim
    if not isinstance(head_dim, int) or head_dim < 32 or head_dim % 32:
        raise ValueError(f"head_dim: expected a multiple of 32 (the kernel's 16-column half tiles), got {head_dim!r}")
    if w.shape[0] % head_dim:
        raise ValueError(f"w: expected N = {w.shape[0]} to be a multiple of head_dim = {head_dim}")
    if cos.shape[-1] not in (head_dim, head_dim // 2) or sin.shape != cos.shape:
        raise ValueError(
            f"cos, sin: expected equal shapes [..., {head_dim}] or [..., {head_dim // 2}], got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if rms_weight is not None:  # K elements: the kernels read it with unit stride (as one TMA row on sm90)
        rms_weight = rms_weight.contiguous()
    M = x2.shape[0]
    if cos.numel() // cos.shape[-1] != M:
        raise ValueError(f"cos: expected one row per token ({M} rows, x's leading dims), got shape {tuple(cos.shape)}")
    c2 = cos.reshape(M, cos.shape[-1])
    s2 = sin.reshape(M, sin.shape[-1])
    out = torch.empty((M, w.shape[0]), dtype=x.dtype, device=x.device)
    if impl == "auto":
        if rms_weight is not None:
            impl = "fused" if M <= FUSED_PROJECTION_MAX_TOKENS else "unfused"
        else:
            tma = triton_enabled_for(x2) and _triton_kernels()._use_tma(x2, w)
            decode = M <= (FUSED_PROJECTION_MAX_TOKENS_FOLDED_TMA if tma else FUSED_PROJECTION_MAX_TOKENS_FOLDED)
            prefill = M >= FUSED_PROJECTION_MIN_PREFILL_TOKENS_FOLDED and _persistent_prefill(x2, w, head_dim)
            impl = "fused" if decode or prefill else "unfused"
    ops.rms_norm_matmul_rope(out, x2, rms_weight, w, c2, s2, eps, head_dim, impl)
    return out.view(*x.shape[:-1], w.shape[0])


_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)


def _check_decode_attention(q, k, v, mask, scale) -> tuple[torch.Tensor, float]:
    """The mask as a [B, L] bool view, and the scale, after checking every argument."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(t, name, _ATTENTION_DTYPES)
        if t.dim() != 4:
            shape = "[B, H, 1, D]" if name == "q" else "[B, H_kv, L, D]"
            raise ValueError(f"{name}: expected a 4-D {shape} tensor, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name}: the head dimension must be contiguous (stride 1), got strides {t.stride()}")
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (q's), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (q's), got {t.device}")
    B, H, S, D = q.shape
    if S != 1:
        raise ValueError(f"q: expected one query token ([B, H, 1, D]), got shape {tuple(q.shape)}")
    if D < 16 or D > 256 or D & (D - 1):
        raise ValueError(f"q: expected a head size that is a power of two in [16, 256], got {D}")
    if k.shape[0] != B or k.shape[3] != D or k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"k: expected [{B}, H_kv, L, {D}] with H_kv dividing q's {H} heads, got shape {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v: expected k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    L = k.shape[2]
    if L == 0:
        raise ValueError("k: expected at least one cache slot (L >= 1), got L = 0")
    _check_tensor(mask, "mask", (torch.bool,))
    if mask.device != q.device:
        raise ValueError(f"mask: expected device {q.device} (q's), got {mask.device}")
    four_d = mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1
    if not ((four_d or mask.dim() == 2) and mask.shape[0] in (1, B) and mask.shape[-1] == L):
        raise ValueError(f"mask: expected [B or 1, 1, 1, {L}] or [B or 1, {L}] (B = {B}), got shape {tuple(mask.shape)}")
    mask2 = mask[:, 0, 0, :] if mask.dim() == 4 else mask
    if scale is None:
        scale = D**-0.5
    elif not (_is_number(scale) and math.isfinite(scale)):
        raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
    return mask2.expand(B, L), float(scale)


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """The attention of one query token per sequence over a cache: ``F.scaled_dot_product_attention(q,
    k, v, attn_mask=mask, scale=scale, enable_gqa=True)`` for these shapes.

    * ``q`` ``[B, H, 1, D]`` (any strides with a contiguous head dimension, e.g. a transposed
      ``[B, 1, H, D]``), ``k`` / ``v`` ``[B, H_kv, L, D]`` with ``H_kv`` dividing ``H`` (query head
      ``h`` reads K / V head ``h // (H / H_kv)``), fp16 or bf16, ``D`` a power of two in 16-256.
    * ``mask`` bool, ``[B or 1, 1, 1, L]`` (transformers' static-cache mask) or ``[B or 1, L]``:
      True attends. A query head with no slot to attend gets NaN, as SDPA's math kernel gives.
    * ``scale`` defaults to ``D ** -0.5``.

    Returns ``[B, H, 1, D]`` in q's dtype: softmax in fp32, the output rounded once. On CUDA /
    ROCm the cache is cut into slices read by separate programs (each holds the ``H / H_kv``
    query heads of one K / V head, so a slot is read once per sequence), and a second kernel
    combines the slices by their log-sum-exp."""
    mask2, scale = _check_decode_attention(q, k, v, mask, scale)
    B, H, _, D = q.shape
    out = torch.empty((B, H, 1, D), dtype=q.dtype, device=q.device)
    if not torch.compiler.is_compiling():  # eager: the implementation itself (see _call)
        _run_decode_attention(out, q, k, v, mask2, scale)
    else:
        ops.decode_attention(out, q, k, v, mask2, scale)
    return out
