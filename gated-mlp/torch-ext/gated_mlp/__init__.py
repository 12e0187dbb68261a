"""The up-projection half of a gated MLP in one GEMM: ``act(x W_gate^T + b_g) * (x W_up^T + b_u)``
with the activation and the multiply in the epilogue, so only the [M, U] product is written
(the unfused GEMM + activation writes and re-reads [M, 2U]).

One Triton source serves CUDA (sm90: TMA + wgmma; sm80: mma.sync) and ROCm (gfx942). On CPU the
op runs a plain-torch implementation with the same semantics, unless ``TRITON_INTERPRET=1`` is
set before the first call, in which case CPU tensors go through the Triton kernel in Triton's
interpreter (how CI tests the kernel code without a GPU).

The CUDA build also carries two compiled CuTe kernels (``csrc/``, ops ``gated_mlp_sm80`` and
``gated_mlp_sm90``): sm80 (mma.sync, cp.async, ldmatrix; built for capability 8.0 + PTX) and
sm90 (TMA + wgmma, warp-specialized and persistent; built for 9.0a). ``impl`` picks the
kernel: ``"auto"`` (default) runs sm80 on capability 8.x GPUs (A100 / A10 / L4 class) when the
inputs meet its preconditions (16-byte aligned rows, D a multiple of 8), and the Triton kernel
everywhere else, Hopper included: on an H100 the sm90 kernel measured 0.84-1.0x the Triton
kernel's speed at 256-16384 tokens (README), so it is not chosen automatically yet;
``"triton"`` never runs the compiled kernels; ``"sm80"`` / ``"sm90"`` always do (sm80 also on
newer GPUs: how it is tested on Hopper) and raise when they cannot. FP8 is Triton-only.

* :func:`gated_mlp` — separate ``w_gate`` / ``w_up`` ([U, D], nn.Linear layout; any row
  stride, so views into one fused tensor work without a copy).
* :func:`gated_mlp_fused` — one ``[2U, D]`` weight, ``"concat"`` (gate rows then up rows, as
  Phi-3's ``gate_up_proj``) or ``"interleaved"`` (gate and up rows alternating).
* :func:`interleave_gate_up` — builds the interleaved weight.
* :func:`gated_mlp_fp8` — FP8 (e4m3) x and weights with per-tensor / per-token / per-channel
  scales; bf16 / fp16 output, or FP8 output with a static scale (the input of an FP8 down
  projection), quantized in the epilogue.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from . import _reference, layers
from ._light_ops import define_op
from ._triton_launch import SignatureTable, triton_enabled_for
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "ACTIVATIONS",
    "IMPLS",
    "gated_mlp",
    "gated_mlp_fp8",
    "gated_mlp_fused",
    "interleave_gate_up",
    "layers",
    "sm80_available",
    "sm90_available",
    "triton_enabled_for",
]

ACTIVATIONS = ("silu", "gelu_tanh")
LAYOUTS = ("concat", "interleaved")
IMPLS = ("auto", "triton", "sm80", "sm90")
COMPILED_IMPLS = ("sm80", "sm90")
_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)




def _triton_kernels():
    from . import _kernels

    return _kernels


# The CuTe kernels' ops, registered by the .so of the CUDA build only (torch_binding.cpp).
_HAS_SM80 = hasattr(ops, "gated_mlp_sm80")
_HAS_SM90 = hasattr(ops, "gated_mlp_sm90")


def sm80_available() -> bool:
    """True when this build has the compiled CuTe sm80 kernel (the CUDA variant)."""
    return _HAS_SM80


def sm90_available() -> bool:
    """True when this build has the compiled CuTe sm90 kernel (the CUDA variant; it runs on
    capability 9.0 GPUs only)."""
    return _HAS_SM90


for _name in ("gated_mlp_sm80", "gated_mlp_sm90"):
    if hasattr(ops, _name):
        torch.library.register_fake(add_op_namespace_prefix(_name))(lambda out, x, w_gate, w_up, bias_gate, bias_up, activation: None)


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _is_sm8x(device_index: int) -> bool:
    return _capability(device_index)[0] == 8


def _is_sm90(device_index: int) -> bool:
    return _capability(device_index) == (9, 0)


def _vector_rows(t: torch.Tensor) -> bool:
    """Rows the compiled kernels read in 16-byte units (cp.async vectors, TMA rows): unit-stride
    rows, a 16-byte aligned start and a row stride that is a multiple of 8 elements."""
    return (
        (t.shape[1] <= 1 or t.stride(1) == 1)
        and t.data_ptr() % 16 == 0
        and (t.shape[0] <= 1 or t.stride(0) % 8 == 0)
    )


def _auto_impl(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> str:
    """impl="auto" on real tensors: "sm80" on capability 8.x GPUs when the inputs suit it, else
    "triton" (which takes any 16-byte multiple row stride and any D). Never "sm90": on an H100
    it measured slower than the Triton kernel (see the module docstring)."""
    if not (x.is_cuda and torch.version.hip is None) or x.shape[0] == 0:
        return "triton"
    D = x.shape[1]
    if _HAS_SM80 and _is_sm8x(x.device.index) and D % 8 == 0 and all(_vector_rows(t) for t in (x, w_gate, w_up)):
        return "sm80"
    return "triton"


def _require_compiled(impl: str, x: torch.Tensor) -> None:
    """impl="sm80" / "sm90": the errors that do not depend on shapes (those are in gated_mlp)."""
    if not (_HAS_SM80 if impl == "sm80" else _HAS_SM90):
        raise ValueError(
            f"impl: {impl!r} needs the compiled CuTe {impl} kernel, which only the CUDA build of this package "
            "has (this build has none); use impl='auto' or 'triton'"
        )
    if not x.is_cuda or torch.version.hip is not None:
        need = "capability >= 8.0" if impl == "sm80" else "capability 9.0"
        raise ValueError(f"impl: {impl!r} runs on CUDA GPUs only ({need}), got x on {x.device}")
    if impl == "sm90" and not _is_sm90(x.device.index):
        major, minor = _capability(x.device.index)
        raise ValueError(f"impl: 'sm90' needs a GPU of capability 9.0 (Hopper; built for sm_90a), got {major}.{minor}")


def _run_gated_mlp_planned(out, x, w_gate, w_up, bias_gate, bias_up, activation, impl="auto"):
    """_run_gated_mlp, returning the Triton launch plan it used (None for any other path)."""
    if impl == "auto":
        impl = _auto_impl(x, w_gate, w_up)
    if impl in COMPILED_IMPLS:
        _require_compiled(impl, x)
        getattr(ops, f"gated_mlp_{impl}")(out, x, w_gate, w_up, bias_gate, bias_up, activation)
    elif impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    elif triton_enabled_for(x):
        return _triton_kernels().launch_gated_mlp(x, w_gate, w_up, bias_gate, bias_up, out, activation)
    else:
        _reference.gated_mlp(x, w_gate, w_up, bias_gate, bias_up, out, activation)
    return None


def _run_gated_mlp(
    out: torch.Tensor,
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    bias_gate: Optional[torch.Tensor],
    bias_up: Optional[torch.Tensor],
    activation: str,
    impl: str = "auto",
) -> None:
    """x [M, D], w_gate / w_up [U, D], biases [U] or None; writes out [M, U]. ``impl``: see
    :data:`IMPLS` (the choice is made here, on real tensors: pointer alignment is known)."""
    _run_gated_mlp_planned(out, x, w_gate, w_up, bias_gate, bias_up, activation, impl)


# Call signatures of gated_mlp (no biases) that reached a Triton launch plan: a repeated one
# (decode: every layer, every token) skips the checks, the impl choice, the reshapes and the
# plan's own key (on the H100 host the call went from 47 us to ~16). The key holds everything
# those depend on: x's shape, strides, dtype, device and 16-byte alignment, each weight's shape,
# strides, dtype, device and address (the plan keeps the weights' descriptors), activation, impl.
_FAST_CALLS = SignatureTable()


def _gated_call_key(x, w_gate, w_up, activation, impl):
    try:
        return (
            x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16,
            w_gate.shape, w_gate.stride(), w_gate.dtype, w_gate.get_device(), w_gate.data_ptr(),
            w_up.shape, w_up.stride(), w_up.dtype, w_up.get_device(), w_up.data_ptr(),
            activation, impl,
        )  # fmt: skip
    except AttributeError:  # not tensors: the full path says what is wrong
        return None


def _gated_mlp_fp8_op(out, x, w_gate, w_up, x_scale, w_gate_scale, w_up_scale, bias_gate, bias_up, out_scale, activation) -> None:
    """FP8 x [M, D], w_gate / w_up [U, D]; fp32 scales x [1] or [M], weights [1] or [U]; writes
    out [M, U] (bf16 / fp16, or FP8 divided by out_scale [1])."""
    scales = (x_scale, w_gate_scale, w_up_scale)
    if triton_enabled_for(x):
        _triton_kernels().launch_gated_mlp(x, w_gate, w_up, bias_gate, bias_up, out, activation, None, scales, out_scale)
    else:
        _reference.gated_mlp(x, w_gate, w_up, bias_gate, bias_up, out, activation, scales, out_scale)


def _returns_nothing(*args) -> None:
    """The fake implementation of ops that only write their declared output."""
    return None


# Low-dispatch-cost ops (see _light_ops; an eager gated_mlp call runs _run_gated_mlp directly).
define_op(
    add_op_namespace_prefix("gated_mlp"),
    "(Tensor(a!) out, Tensor x, Tensor w_gate, Tensor w_up, Tensor? bias_gate, Tensor? bias_up, str activation, "
    "str impl=\"auto\") -> ()",
    _run_gated_mlp, _returns_nothing,
)
define_op(
    add_op_namespace_prefix("gated_mlp_fp8"),
    "(Tensor(a!) out, Tensor x, Tensor w_gate, Tensor w_up, Tensor x_scale, Tensor w_gate_scale, Tensor w_up_scale, "
    "Tensor? bias_gate, Tensor? bias_up, Tensor? out_scale, str activation) -> ()",
    _gated_mlp_fp8_op, _returns_nothing,
)


# ---------------------------------------------------------------------------------------------
# Argument checks: every error names the argument, what was expected and what came
# ---------------------------------------------------------------------------------------------


def _check_tensor(t, name: str, dtype: torch.dtype | None = None, dtypes=_DTYPES) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is None and t.dtype not in dtypes:
        expected = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name}: expected dtype {expected}, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (x's), got {t.dtype}")
    return t


def _check_weight(w, name: str, x: torch.Tensor, rows: int | None) -> None:
    """[rows, D] with D contiguous; the row stride and base 16-byte aligned, because the sm90
    path reads W through the copy engine (TMA), which requires both (a copy would read the
    whole weight on every call)."""
    _check_tensor(w, name, x.dtype)
    D = x.shape[-1]
    if w.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (x's), got {w.device}")
    if w.dim() != 2 or w.shape[1] != D or (rows is not None and w.shape[0] != rows):
        want = f"[{rows if rows is not None else 'U'}, {D}]"
        raise ValueError(f"{name}: expected shape {want} (nn.Linear layout, D = x.shape[-1]), got {tuple(w.shape)}")
    if w.shape[0] == 0 or D == 0:
        return
    if w.stride(1) != 1 and D > 1:
        raise ValueError(f"{name}: the D dimension must be contiguous (stride 1), got strides {w.stride()}")
    if w.shape[0] > 1 and (w.stride(0) * w.element_size()) % 16:
        raise ValueError(
            f"{name}: expected a row stride that is a multiple of 16 bytes ({16 // w.element_size()} elements), "
            f"got {w.stride(0)} elements"
        )
    # The storage offset (torch's allocations are aligned). torch.compile cannot trace it: a
    # compiled call skips this check, and the launcher, which checks the address itself before
    # choosing TMA, reads a misaligned weight with ordinary loads.
    if not torch.compiler.is_compiling() and (w.storage_offset() * w.element_size()) % 16:
        raise ValueError(
            f"{name}: expected a 16-byte aligned start, got a view {w.storage_offset()} elements into its storage"
        )


def _check_bias(b, name: str, x: torch.Tensor, U: int, dtypes: tuple | None = None) -> None:
    if b is None:
        return
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(b).__name__}")
    dtypes = dtypes or (x.dtype, torch.float32)
    if b.dtype not in dtypes:
        expected = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name}: expected dtype {expected}, got {b.dtype}")
    if b.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (x's), got {b.device}")
    if b.shape != (U,):
        raise ValueError(f"{name}: expected shape ({U},), got {tuple(b.shape)}")


def gated_mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    *,
    activation: str = "silu",
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """``act(x @ w_gate.T + bias_gate) * (x @ w_up.T + bias_up)`` in one kernel.

    x ``[..., D]`` (float16 / bfloat16); w_gate, w_up ``[U, D]`` in x's dtype, D contiguous,
    any 16-byte multiple row stride (views into one fused weight work); biases ``[U]`` (x's
    dtype or float32) or None. ``activation``: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU,
    tanh approximation). fp32 accumulation, activation and product; one rounding to x's dtype.
    ``impl``: ``"auto"`` (the CuTe sm80 kernel on 8.x GPUs when its preconditions hold; else
    Triton), ``"triton"``, ``"sm80"`` (the CuTe kernel on any CUDA GPU >= 8.0; needs D % 8 ==
    0) or ``"sm90"`` (capability 9.0 only). The compiled kernels copy x when its rows are not
    16-byte aligned.
    Returns ``[..., U]``."""
    key = None
    if (
        bias_gate is None
        and bias_up is None
        and isinstance(activation, str)
        and isinstance(impl, str)
        and not torch.compiler.is_compiling()
    ):
        key = _gated_call_key(x, w_gate, w_up, activation, impl)
        fast = _FAST_CALLS.get(key) if key is not None else None
        if fast is not None:
            plan, out_shape = fast
            out = x.new_empty(out_shape)
            plan(x, None, None, out, None, None)
            return out
    _check_tensor(x, "x")
    if x.dim() < 1:
        raise ValueError(f"x: expected shape [..., D], got {tuple(x.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    _check_weight(w_gate, "w_gate", x, None)
    U = w_gate.shape[0]
    _check_weight(w_up, "w_up", x, U)
    _check_bias(bias_gate, "bias_gate", x, U)
    _check_bias(bias_up, "bias_up", x, U)
    bias_gate, bias_up = _both_or_neither(bias_gate, bias_up)
    D = x.shape[-1]
    _check_impl(impl, x, D)
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1 and D > 1:
        x2 = x2.contiguous()
    if impl in COMPILED_IMPLS and not _rows_ready(x2):
        x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh, aligned allocation
    out = torch.empty((x2.shape[0], U), dtype=x.dtype, device=x.device)
    if torch.compiler.is_compiling():
        ops.gated_mlp(out, x2, w_gate, w_up, bias_gate, bias_up, activation, impl)
        return out.view(*x.shape[:-1], U)
    plan = _run_gated_mlp_planned(out, x2, w_gate, w_up, bias_gate, bias_up, activation, impl)
    if plan is not None and key is not None and x.is_contiguous():
        # x2 is then a view of x, and x.new_empty(shape) lays the output out as out is.
        _FAST_CALLS.put(key, (plan, (*x.shape[:-1], U)))
    return out.view(*x.shape[:-1], U)


def _check_impl(impl, x: torch.Tensor, D: int) -> None:
    if not isinstance(impl, str) or impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl in COMPILED_IMPLS:
        _require_compiled(impl, x)
    if impl == "sm80":
        if D % 8 or D == 0:
            raise ValueError(
                f"x: impl='sm80' needs D = x.shape[-1] to be a positive multiple of 8 (16-byte vectors), got {D}"
            )


def _rows_ready(x2: torch.Tensor) -> bool:
    """x rows as the compiled kernels read them (a row stride that is a multiple of 8 elements, a
    16-byte aligned start). The start is unknown while torch.compile traces (see _check_weight):
    the kernel's own check then refuses a misaligned x."""
    if x2.shape[0] > 1 and x2.stride(0) % 8:
        return False
    return torch.compiler.is_compiling() or (x2.storage_offset() * x2.element_size()) % 16 == 0


def _both_or_neither(bias_gate, bias_up):
    """The kernel adds both biases or neither: a missing one becomes zeros ([U]: negligible)."""
    if (bias_gate is None) != (bias_up is None):
        if bias_gate is None:
            bias_gate = torch.zeros_like(bias_up)
        else:
            bias_up = torch.zeros_like(bias_gate)
    return bias_gate, bias_up


def _check_scale(s, name: str, x: torch.Tensor, sizes: tuple[int, ...], what: str) -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"{name}: expected dtype float32, got {s.dtype}")
    if s.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (x's), got {s.device}")
    if s.numel() not in sizes or (s.numel() > 1 and s.dim() != 1 and s.shape[-1] != 1):
        raise ValueError(f"{name}: expected {what}, got shape {tuple(s.shape)}")
    return s.reshape(-1).contiguous()


def gated_mlp_fp8(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    x_scale: torch.Tensor,
    w_gate_scale: torch.Tensor,
    w_up_scale: torch.Tensor,
    *,
    activation: str = "silu",
    bias_gate: torch.Tensor | None = None,
    bias_up: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`gated_mlp` on FP8 operands: ``g = (x @ w_gate.T) * x_scale * w_gate_scale``
    (likewise ``u``), then ``act(g + b_g) * (u + b_u)`` in fp32.

    x ``[..., D]`` and the weights ``[U, D]`` in one FP8 format (e4m3fn, or e4m3fnuz on ROCm),
    D contiguous, row strides multiples of 16 bytes; ``x_scale`` fp32, one per tensor or one
    per token (``[...]`` / ``[..., 1]``); weight scales fp32, one per tensor or one per output
    channel ``[U]``; biases ``[U]`` bf16 / fp16 / fp32 or None. ``out_dtype``: bfloat16 /
    float16 (dequantized), or x's FP8 format with ``out_scale`` (fp32, one value): the result
    ``clamp(y / out_scale)`` rounded to FP8, for an FP8 down projection. Returns ``[..., U]``."""
    _check_tensor(x, "x", dtypes=FP8_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x: expected shape [..., D], got {tuple(x.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    _check_weight(w_gate, "w_gate", x, None)
    U = w_gate.shape[0]
    _check_weight(w_up, "w_up", x, U)
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    M = x2.shape[0]
    xs = _check_scale(x_scale, "x_scale", x, (1, M), f"one value or one per token ({M})")
    gs = _check_scale(w_gate_scale, "w_gate_scale", x, (1, U), f"one value or one per output channel ({U})")
    us = _check_scale(w_up_scale, "w_up_scale", x, (1, U), f"one value or one per output channel ({U})")
    if gs.numel() != us.numel():
        raise ValueError(f"w_up_scale: expected as many values as w_gate_scale ({gs.numel()}), got {us.numel()}")
    bias_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    _check_bias(bias_gate, "bias_gate", x, U, bias_dtypes)
    _check_bias(bias_up, "bias_up", x, U, bias_dtypes)
    bias_gate, bias_up = _both_or_neither(bias_gate, bias_up)
    if out_dtype in _DTYPES:
        if out_scale is not None:
            raise ValueError(f"out_scale: only for an FP8 out_dtype, got one with out_dtype {out_dtype}")
    elif out_dtype == x.dtype:
        if out_scale is None:
            raise ValueError(f"out_scale: required for out_dtype {out_dtype} (the static output scale)")
        out_scale = _check_scale(out_scale, "out_scale", x, (1,), "one value")
    else:
        raise ValueError(f"out_dtype: expected bfloat16, float16 or x's {x.dtype}, got {out_dtype}")
    if x2.stride(-1) != 1 and D > 1:
        x2 = x2.contiguous()
    out = torch.empty((M, U), dtype=out_dtype, device=x.device)
    ops.gated_mlp_fp8(out, x2, w_gate, w_up, xs, gs, us, bias_gate, bias_up, out_scale, activation)
    return out.view(*x.shape[:-1], U)


def _split_fused(w: torch.Tensor, name: str, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'concat' or 'interleaved', got {layout!r}")
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(w).__name__}")
    if w.dim() < 1 or w.shape[0] % 2:
        raise ValueError(f"{name}: expected an even number of rows (gate and up), got shape {tuple(w.shape)}")
    U = w.shape[0] // 2
    return (w[:U], w[U:]) if layout == "concat" else (w[0::2], w[1::2])


def gated_mlp_fused(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    *,
    layout: str = "concat",
    activation: str = "silu",
    bias: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """:func:`gated_mlp` with one ``[2U, D]`` weight (and optional ``[2U]`` bias) holding the gate
    and up projections: ``"concat"`` = gate rows then up rows (Phi-3's ``gate_up_proj``),
    ``"interleaved"`` = rows alternate gate, up (see :func:`interleave_gate_up`). No copy: the
    kernel reads the two halves as row-strided views. ``impl``: as in :func:`gated_mlp`."""
    w_gate, w_up = _split_fused(w_gate_up, "w_gate_up", layout)
    b_gate = b_up = None
    if bias is not None:
        _check_tensor(x, "x")
        _check_bias(bias, "bias", x, w_gate_up.shape[0])
        b_gate, b_up = _split_fused(bias, "bias", layout)
        b_gate, b_up = b_gate.contiguous(), b_up.contiguous()  # [U]: negligible
    return gated_mlp(x, w_gate, w_up, activation=activation, bias_gate=b_gate, bias_up=b_up, impl=impl)


def interleave_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``[2U, ...]`` with row ``2i`` = ``w_gate[i]`` and row ``2i + 1`` = ``w_up[i]`` (works for
    weights ``[U, D]`` and biases ``[U]``)."""
    for t, name in ((w_gate, "w_gate"), (w_up, "w_up")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if w_gate.dim() < 1:
        raise ValueError("w_gate: expected shape [U, ...], got a scalar")
    if w_up.shape != w_gate.shape:
        raise ValueError(f"w_up: expected w_gate's shape {tuple(w_gate.shape)}, got {tuple(w_up.shape)}")
    if w_up.dtype != w_gate.dtype:
        raise TypeError(f"w_up: expected dtype {w_gate.dtype} (w_gate's), got {w_up.dtype}")
    if w_up.device != w_gate.device:
        raise ValueError(f"w_up: expected device {w_gate.device} (w_gate's), got {w_up.device}")
    return torch.stack((w_gate, w_up), dim=1).reshape(2 * w_gate.shape[0], *w_gate.shape[1:])
