"""FP8 weights and activations under a transformers model: ``FP8Linear`` in place of the
attention and MLP projections of Llama / Mistral / Qwen2 / Qwen3 models.

Two schemes, the two that checkpoints on the Hub use:

* ``"per-token"``: e4m3 weights with one scale per output channel, activations quantized
  dynamically with one scale per token (FBGEMM / vLLM's dynamic FP8, llm-compressor's
  ``FP8_DYNAMIC``). The GEMM is ``torch._scaled_mm`` with row-wise scales.
* ``"block"``: e4m3 weights with one scale per 128 x 128 block, activations quantized
  dynamically with one scale per 1 x 128 group of each row (transformers' fine-grained FP8,
  DeepSeek-V3 style, llm-compressor's ``FP8_BLOCK``). The GEMM is ``torch._scaled_mm`` with
  block-wise scales (``BlockWise1x128`` x ``BlockWise128x128``, cuBLAS on sm90) for layers
  whose in_features is a multiple of 512; see :func:`gemm_backend` for the others.

Every dynamic scale is the kernels' (rmsnorm-fp8, swiglu-fp8): ``scale = max(amax / 448,
1 / (512 * 448))`` in fp32, the quotient correctly rounded (the kernels' ``__fdiv_rn``), and
``q = e4m3(clamp(y * (1 / scale), -448, 448))`` with ``y`` the activation in its own dtype, so
the fused ops of the kernelized layer (``fused_llm.decoder_fp8``) produce the very bytes this
module's plain-torch quantization produces.

* :func:`quantize_fp8` — quantizes a loaded fp16 / bf16 model in place.
* :func:`load_fp8` — a model from a compressed-tensors (``float-quantized`` /
  ``naive-quantized``) or transformers fine-grained FP8 (``quant_method: fp8``) safetensors
  checkpoint on disk, without compressed-tensors installed.
* ``FP8Linear.forward`` quantizes its input and runs the scheme's GEMM (:func:`fp8_matmul`):
  the plain-torch model, what a user would otherwise run (eager or ``torch.compile``d). The
  kernelized layer calls the GEMM on input its fused ops quantized, without another pass.

On CPU the GEMM is the reference: both operands dequantized to fp32 (``q * scale``), one fp32
matmul, one rounding to the output dtype. ``fused_llm.kernelize`` gives decoder layers whose
projections are all ``FP8Linear`` of one scheme the fused FP8 forward (``decoder_fp8``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from .decoder import refuse_fused
from .w4a16 import _read_safetensors, _set_module, finish_load, meta_model, projection_names, read_quantization_config

SCHEMES = ("per-token", "block")
BLOCK = 128  # the block scheme's weight block (128 x 128) and activation group (1 x 128)
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# The kernels' dynamic-scale floor, computed in fp32 as they do: (1 / 512) / 448.
MIN_SCALE = (torch.tensor(1.0 / 512.0, dtype=torch.float32) / FP8_MAX).item()

Scheme = Literal["per-token", "block"]
Source = Literal["local", "hub"]

log = logging.getLogger(__name__)


def _check_scheme(scheme) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    return scheme


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Quantization (plain torch)
# ---------------------------------------------------------------------------------------------


def quantize_weight(w: torch.Tensor, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` with ``w ~ q * scale``: e4m3 ``q`` of w's shape [N, K] and fp32 scales,
    ``[N]`` (per-token scheme: one per output channel) or ``[ceil(N / 128), ceil(K / 128)]``
    (block scheme; the last blocks may be partial). ``scale = amax / 448`` (1 for an all-zero
    channel or block), ``q = e4m3(w / scale)``, as transformers' and llm-compressor's
    quantizers write checkpoints."""
    _check_scheme(scheme)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w: expected a floating-point [N, K] tensor, got {getattr(w, 'shape', type(w).__name__)}")
    wf = w.float()
    N, K = wf.shape
    if scheme == "per-token":
        amax = wf.abs().amax(dim=1)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        return q, scale
    nb, kb = _cdiv(N, BLOCK), _cdiv(K, BLOCK)
    padded = torch.zeros(nb * BLOCK, kb * BLOCK, dtype=torch.float32, device=w.device)
    padded[:N, :K] = wf
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view_as(padded)[:N, :K]
    return q.to(FP8_DTYPE).contiguous(), scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, scheme: Scheme, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` as a dense [N, K] tensor (computed in fp32, then cast to ``dtype``)."""
    _check_scheme(scheme)
    qf = q.float()
    if scheme == "per-token":
        return (qf * scale.float().reshape(-1, 1)).to(dtype)
    N, K = q.shape
    s = scale.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:N, :K]
    return (qf * s).to(dtype)


def _dynamic_scale(amax: torch.Tensor) -> torch.Tensor:
    """``max(amax / 448, MIN_SCALE)`` in fp32, the quotient correctly rounded, as the kernels'
    ``__fdiv_rn`` computes it. Divided in fp64 because torch's CUDA ``t / 448.0`` multiplies
    by the fp32 ``1 / 448`` instead (``div_true_kernel_cuda`` with a CPU-scalar divisor), which
    misrounds 55% of fp32 mantissas (every one of [1, 2) checked on CPU; 2291837 of 4194304
    random values on an H100, torch 2.11); the fp64 quotient rounded to fp32 is exact for all
    of them, under inductor too (which multiplies by the reciprocal, here in fp64)."""
    return torch.clamp((amax.double() / FP8_MAX).float(), min=MIN_SCALE)


def quantize_activation(x: torch.Tensor, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic quantization of ``x`` [M, K] (fp32 / fp16 / bf16): ``(q, scales)``, fp32 scales
    ``[M, 1]`` (per token) or ``[M, K / 128]`` (per 1 x 128 group, K a multiple of 128; stored
    groups-major, stride (1, M), the layout block-wise ``_scaled_mm`` reads).
    ``scale = max(amax / 448, 1 / (512 * 448))``, ``q = e4m3(clamp(x * (1 / scale)))``: the
    rmsnorm-fp8 / swiglu-fp8 dynamic quantization, bit for bit, on CPU and CUDA."""
    M, K = x.shape
    xf = x.float()
    if scheme == "per-token":
        scales = _dynamic_scale(xf.abs().amax(dim=1, keepdim=True))
        q = (xf * scales.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        return q, scales
    if scheme != "block":
        _check_scheme(scheme)
    if K % BLOCK:
        raise ValueError(f"x: the block scheme quantizes activations in groups of {BLOCK}; got K = {K}")
    groups = xf.view(M, K // BLOCK, BLOCK)
    scales = _dynamic_scale(groups.transpose(0, 1).abs().amax(dim=2)).t()  # [G, M] contiguous -> [M, G]
    q = (groups * scales.reciprocal()[:, :, None]).clamp(-FP8_MAX, FP8_MAX).view(M, K).to(FP8_DTYPE)
    return q, scales


def dequantize_activation(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``q * scales`` in fp32; scales ``[M, 1]`` or ``[M, K / 128]`` (any strides)."""
    M, K = q.shape
    qf = q.float()
    if scales.shape[1] == 1:
        return qf * scales.float()
    return (qf.view(M, -1, BLOCK) * scales.float()[:, :, None]).view(M, K)


# ---------------------------------------------------------------------------------------------
# The GEMM: torch._scaled_mm on CUDA, the fp32 reference elsewhere
# ---------------------------------------------------------------------------------------------

# Block-wise torch._scaled_mm (cuBLAS >= 12.9 on sm90), as torch 2.11 hands it to cuBLAS, is
# right only where (measured on an H100, torch 2.11.0+cu130: max |error| / max |product|
# against the fp32 product of the dequantized operands, distinct scales per group and block):
# * K / 128 is a multiple of 4. cuBLAS reads the 128 x 128 weight scales K-block-major with
#   the row stride rounded up to a multiple of 4 (L4 = round_up(ceil(K / 128), 4), the layout
#   torch's test_matmul_cuda.py pads to in _pad_128x128_scales), while torch 2.11 accepts only
#   the unpadded stride (is_blockwise_128x128_scaling, aten/src/ATen/native/cuda/ScaledBlas.cpp:
#   stride(0) == ceil(K / 128)) and refuses the padded one ("Invalid scaling configuration").
#   K = 512 and 1024: 0.002 (bf16 rounding); K = 256: 0.24-0.58; K = 640: 0.26-0.45 (wrong).
# * M is a multiple of 4 (the columns of the [M, K / 128] groups-major x scales 16-byte
#   aligned): M = 1, 2, 3, 5, 6, 13, 26 fail with CUBLAS_STATUS_NOT_SUPPORTED; M = 4, 8, 12, 16,
#   20, 128, 200, and every M padded with zero rows to a multiple of 4, give 0.002-0.0035 (also
#   with a bias, and N = 208, a partial last weight block). Rows are padded.
BLOCKWISE_K = 4 * BLOCK
BLOCKWISE_ROWS = 4
# Per CUDA device index: whether block-wise torch._scaled_mm, called as _blockwise_scaled_mm
# calls it, gives the right product there (_probe_blockwise).
_BLOCKWISE_OK: dict[int, bool] = {}
# The GEMM paths that ran (eager calls only): what the report and the benchmark name.
BACKENDS_USED: set[str] = set()

BACKEND_NAMES = {
    "reference": "fp32 reference (operands dequantized, one fp32 matmul; CPU)",
    "rowwise": "torch._scaled_mm, row-wise scales (per-token x, per-channel w)",
    "skinny": "skinny-gemm linear_fp8 (per-token x, per-channel w): its skinny kernel where its tuning table "
              "measured it faster than cuBLAS, torch._scaled_mm row-wise elsewhere",
    "blockwise": f"torch._scaled_mm, block-wise scales (1x128 x, 128x128 w) for in_features % {BLOCKWISE_K} == 0",
    "blockwise-fallback": f"bf16 matmul of the dequantized operands (slow): in_features % {BLOCKWISE_K} != 0, or "
                          "no right block-wise torch._scaled_mm on this GPU",
}  # fmt: skip


def _blockwise_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Block-wise torch._scaled_mm to bf16 [M, N] (+ bias, bf16): xq [M, K] e4m3 with x_scale
    [M, K / 128] (any strides), wq [N, K] with w_scale [N / 128, K / 128] contiguous, K a
    multiple of 512. Rows are padded to a multiple of 4 (zero rows, unit scales) and the scales
    passed groups-major, as cuBLAS reads them (see BLOCKWISE_K)."""
    M = xq.shape[0]
    pad = -M % BLOCKWISE_ROWS
    if pad:
        xq = torch.nn.functional.pad(xq.view(torch.uint8), (0, 0, 0, pad)).view(FP8_DTYPE)
        x_scale = torch.nn.functional.pad(x_scale.t(), (0, pad), value=1.0).t()  # [G, M + pad] -> groups-major
    elif x_scale.stride(0) != 1 and x_scale.shape[1] > 1:
        x_scale = x_scale.t().contiguous().t()
    y = torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale.t(), bias=bias, out_dtype=torch.bfloat16)
    return y[:M] if pad else y


@torch.compiler.disable
def _probe_blockwise(device: torch.device) -> bool:
    """Whether block-wise torch._scaled_mm runs on ``device`` *and* computes the right product
    as :func:`_blockwise_scaled_mm` calls it: 13 x 512 x 384 (rows padded, three weight block
    rows) with distinct scales per group and block and a bias, against the fp32 reference (a
    layout read wrongly gives a wrong result: 0.24-0.58 relative, see BLOCKWISE_K). Cached per
    device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _BLOCKWISE_OK:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(13, BLOCKWISE_K, generator=g) * torch.tensor([1.0, 8.0, 0.5, 3.0]).repeat_interleave(BLOCK)
        w = torch.randn(3 * BLOCK, BLOCKWISE_K, generator=g) * torch.tensor([1.0, 8.0, 0.25]).repeat_interleave(BLOCK)[:, None]
        xq, xs = quantize_activation(x.to(device), "block")
        wq, ws = quantize_weight((w * torch.linspace(0.5, 4.0, BLOCKWISE_K)).to(device), "block")
        bias = torch.randn(3 * BLOCK, generator=g).to(device, torch.bfloat16)
        try:
            y = _blockwise_scaled_mm(xq, xs, wq, ws, bias).float()
            ref = dequantize_activation(xq, xs) @ dequantize_weight(wq, ws, "block").T + bias.float()
            ok = bool(((y - ref).abs().max() <= 2e-2 * ref.abs().max()).item())
            if not ok:
                log.warning("block-wise torch._scaled_mm on %s gave a wrong result: the block scheme's GEMMs run as "
                            "bf16 matmuls of the dequantized operands", device)  # fmt: skip
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as err:
            log.warning("torch._scaled_mm has no block-wise FP8 scaling on %s (%s): the block scheme's GEMMs "
                        "run as bf16 matmuls of the dequantized operands", device, str(err).splitlines()[0])
            ok = False
        _BLOCKWISE_OK[index] = ok
    return _BLOCKWISE_OK[index]


def _use_blockwise(xq: torch.Tensor, wq: torch.Tensor) -> bool:
    """Whether the block GEMM of xq [M, K] and wq [N, K] (CUDA) is block-wise torch._scaled_mm.
    The probe's cached answer is read directly: under torch.compile the probe (compiler-
    disabled) would break the graph, so quantize_fp8 / load_fp8 / kernelize probe first."""
    N, K = wq.shape
    if K % BLOCKWISE_K or N % 16:
        return False
    ok = _BLOCKWISE_OK.get(xq.device.index)
    if ok is None and not torch.compiler.is_compiling():
        ok = _probe_blockwise(xq.device)
    return bool(ok)


def gemm_backend(device: torch.device | str, scheme: Scheme, in_features: int | None = None) -> str:
    """Which GEMM :func:`fp8_matmul` runs for ``scheme`` on ``device``: ``"reference"`` (not
    CUDA), ``"rowwise"`` (per-token), ``"blockwise"`` or ``"blockwise-fallback"`` (block; the
    fallback for ``in_features`` not a multiple of 512, or where the probe found block-wise
    torch._scaled_mm wrong or missing; ``in_features`` None: what a multiple of 512 gets).
    Probes the GPU once."""
    device = torch.device(device)
    _check_scheme(scheme)
    if device.type != "cuda":
        return "reference"
    if scheme == "per-token":
        return "rowwise"
    fits = in_features is None or in_features % BLOCKWISE_K == 0
    return "blockwise" if fits and _probe_blockwise(device) else "blockwise-fallback"


def fp8_matmul(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, scheme: Scheme,
               out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(xq * x_scale) @ (wq * w_scale).T (+ bias)`` in ``out_dtype``: xq [M, K] e4m3 with
    x_scale [M, 1] (per-token) or [M, K / 128] (block; any strides), wq [N, K] e4m3 with w_scale
    [N] or [N / 128, K / 128]. Inputs are not checked (FP8Linear checks them once)."""
    if xq.device.type != "cuda":
        if not torch.compiler.is_compiling():
            BACKENDS_USED.add("reference")
        y = dequantize_activation(xq, x_scale) @ dequantize_weight(wq, w_scale, scheme).T
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype)
    return _scaled_mm_gemm(xq, x_scale, wq, w_scale, scheme, out_dtype, bias,
                           blockwise=scheme == "block" and _use_blockwise(xq, wq))  # fmt: skip


def _scaled_mm_gemm(xq, x_scale, wq, w_scale, scheme, out_dtype, bias, blockwise: bool):
    """fp8_matmul's GPU path; ``blockwise``: the block scheme through block-wise _scaled_mm, else
    its bf16 fallback. CPU tensors work too where torch's CPU build has row-wise _scaled_mm
    (2.13 has; 2.11's takes per-tensor scales only), which is how the tests check the call
    without a GPU."""
    # _scaled_mm writes bf16 with row-wise / block-wise scales; another dtype is one cast more,
    # and the bias (in out_dtype) added after.
    mm_bias = bias if out_dtype == torch.bfloat16 else None
    if scheme == "per-token":
        if not torch.compiler.is_compiling():
            BACKENDS_USED.add("rowwise")
        y = torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), bias=mm_bias,
                             out_dtype=torch.bfloat16)  # fmt: skip
    elif blockwise:
        if not torch.compiler.is_compiling():
            BACKENDS_USED.add("blockwise")
        y = _blockwise_scaled_mm(xq, x_scale, wq, w_scale, mm_bias)
    else:
        if not torch.compiler.is_compiling():
            BACKENDS_USED.add("blockwise-fallback")
        x = dequantize_activation(xq, x_scale).to(torch.bfloat16)
        y = torch.nn.functional.linear(x, dequantize_weight(wq, w_scale, scheme, torch.bfloat16), mm_bias)
    y = y.to(out_dtype)
    return y + bias.to(out_dtype) if bias is not None and mm_bias is None else y


# ---------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------


class FP8Linear(nn.Module):
    """``nn.Linear`` with e4m3 weights and dynamically quantized activations (``scheme``).

    Buffers: ``weight`` [N, K] e4m3, ``weight_scale`` fp32 ([N] per-token, or [N / 128,
    K / 128] block), ``bias`` [N] in the activation dtype or None. ``forward(x)`` takes x
    ``[..., K]`` (the model's fp16 / bf16), quantizes it per token or per 1 x 128 group
    (:func:`quantize_activation`) and runs :func:`fp8_matmul`. Inference only."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, scheme: Scheme, bias: torch.Tensor | None = None):
        super().__init__()
        _check_scheme(scheme)
        if not isinstance(weight, torch.Tensor) or weight.dtype != FP8_DTYPE or weight.dim() != 2:
            raise TypeError(f"weight: expected a 2-D {FP8_DTYPE} tensor [N, K], got "
                            f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")  # fmt: skip
        N, K = weight.shape
        want = (N,) if scheme == "per-token" else (_cdiv(N, BLOCK), _cdiv(K, BLOCK))
        if not isinstance(weight_scale, torch.Tensor) or not weight_scale.is_floating_point():
            raise TypeError(f"weight_scale: expected a float tensor, got {type(weight_scale).__name__}")
        if scheme == "per-token" and weight_scale.numel() in (1, N) and weight_scale.dim() <= 2:
            weight_scale = weight_scale.reshape(-1).expand(N)  # one per tensor -> one per channel
        if tuple(weight_scale.shape) != want:
            raise ValueError(f"weight_scale: expected shape {want} for the {scheme} scheme and a [{N}, {K}] weight, "
                             f"got {tuple(weight_scale.shape)}")  # fmt: skip
        if scheme == "block" and K % BLOCK:
            raise ValueError(f"weight: the block scheme needs in_features a multiple of {BLOCK} (activation groups), got {K}")
        if weight_scale.device != weight.device:
            raise ValueError(f"weight_scale: expected device {weight.device} (weight's), got {weight_scale.device}")
        if bias is not None and (bias.shape != (N,) or not bias.is_floating_point()):
            raise ValueError(f"bias: expected a float tensor of shape ({N},), got {tuple(bias.shape)} {bias.dtype}")
        self.in_features, self.out_features, self.scheme = K, N, scheme
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.to(torch.float32).contiguous())
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: Scheme) -> "FP8Linear":
        """Quantize an ``nn.Linear`` (:func:`quantize_weight`); the bias keeps its dtype."""
        q, scale = quantize_weight(linear.weight.detach(), scheme)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, scheme, bias)

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) / .half() would cast every floating buffer, the e4m3 weight
        # (float8 is floating point to torch) and the fp32 scales included: those only move.
        probe = fn(torch.zeros((), dtype=torch.float32, device=self.weight.device))
        if probe.dtype == torch.float32:
            return super()._apply(fn, recurse)
        keep = {name: self._buffers[name] for name in ("weight", "weight_scale")}
        super()._apply(fn, recurse)
        for name, t in keep.items():
            self._buffers[name] = t.to(probe.device)
        return self

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_weight(self.weight, self.weight_scale, self.scheme, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme!r}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dimension {self.in_features}, got shape {tuple(x.shape)}")
        x2 = x.reshape(-1, self.in_features)
        xq, xs = quantize_activation(x2, self.scheme)
        y = fp8_matmul(xq, xs, self.weight, self.weight_scale, self.scheme, x.dtype, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


# ---------------------------------------------------------------------------------------------
# quantize_fp8
# ---------------------------------------------------------------------------------------------


@dataclass
class FP8Report:
    """What was swapped: module names, the scheme, the checkpoint format, bytes before and after."""

    scheme: str
    format: str = "quantize_fp8"
    swapped: list[str] = field(default_factory=list)
    dense_bytes: int = 0
    fp8_bytes: int = 0  # weights + scales
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        ratio = self.fp8_bytes / self.dense_bytes if self.dense_bytes else float("nan")
        lines = [f"fp8 {self.scheme} ({self.format}): {len(self.swapped)} projections -> FP8Linear, their weights "
                 f"{self.dense_bytes / 2**20:.1f} MiB -> {self.fp8_bytes / 2**20:.1f} MiB ({ratio:.3f}x)"]  # fmt: skip
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _bytes(layer: FP8Linear) -> int:
    return layer.weight.numel() + layer.weight_scale.numel() * 4


def _gemm_note(model: nn.Module, names: list[str], scheme: Scheme) -> str:
    """Which GEMM the swapped layers run in the plain-torch model (probes the GPU once)."""
    layers = [model.get_submodule(n) for n in names]
    device = layers[0].weight.device
    counts: dict[str, int] = {}
    for layer in layers:
        backend = gemm_backend(device, scheme, layer.in_features)
        counts[backend] = counts.get(backend, 0) + 1
    return f"GEMM on {device}: " + "; ".join(f"{n} x {BACKEND_NAMES[b]}" for b, n in counts.items())


def quantize_fp8(model: nn.Module, scheme: Scheme = "per-token", *, source: Source = "local") -> FP8Report:
    """Replace every attention and MLP projection (``q/k/v/o_proj``, ``gate/up/down_proj``) of
    the model's Llama / Mistral / Qwen2 / Qwen3 decoder layers by
    ``FP8Linear.from_linear(linear, scheme)``, in place. ``scheme``: ``"per-token"`` or
    ``"block"`` (module docstring). The weights must be float16 / bfloat16; embeddings, norms
    and ``lm_head`` stay as they are. Then ``fused_llm.kernelize(model)`` gives the decoder
    layers the fused FP8 forward (``fused_llm.decoder_fp8``). ``source`` is accepted for
    symmetry with kernelize (quantization itself loads no kernel package)."""
    _check_scheme(scheme)
    if source not in ("local", "hub"):
        raise ValueError(f"source: expected 'local' or 'hub', got {source!r}")
    names = projection_names(model)
    if not names:
        raise ValueError(f"model: no Llama / Mistral / Qwen2 / Qwen3 decoder layers found in {type(model).__name__}")
    refuse_fused(model, "quantize_fp8", "fp8")
    report = FP8Report(scheme=scheme)
    for name in names:
        linear = model.get_submodule(name)
        if isinstance(linear, FP8Linear):
            if linear.scheme != scheme:
                raise ValueError(f"model: {name} is already an FP8Linear of scheme {linear.scheme!r}, asked for {scheme!r}")
            continue
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"model: {name} is a {type(linear).__name__}, expected an nn.Linear to quantize")
        if linear.weight.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"model: {name}.weight is {linear.weight.dtype}; quantize_fp8 takes float16 / bfloat16 models "
                            "(model.to(torch.bfloat16) first)")  # fmt: skip
        if scheme == "block" and linear.in_features % BLOCK:
            raise ValueError(f"model: {name} has in_features {linear.in_features}, not a multiple of {BLOCK}: the block "
                             "scheme quantizes activations in 1 x 128 groups")  # fmt: skip
        layer = FP8Linear.from_linear(linear, scheme)
        report.dense_bytes += linear.weight.numel() * linear.weight.element_size()
        report.fp8_bytes += _bytes(layer)
        _set_module(model, name, layer)
        report.swapped.append(name)
    if report.swapped:
        report.notes.append(_gemm_note(model, report.swapped, scheme))
    return report


# ---------------------------------------------------------------------------------------------
# Checkpoints on disk
# ---------------------------------------------------------------------------------------------

CHECKPOINT_FORMATS = ("compressed-tensors", "fp8")


def checkpoint_scheme(quant_config: dict) -> tuple[str, str, list[str]]:
    """``(format, scheme, notes)`` of a ``quantization_config``: compressed-tensors float-quantized
    FP8 (weights per channel / per tensor with dynamic per-token activations -> "per-token";
    128 x 128 blocks with dynamic 1 x 128 groups -> "block") or transformers' fine-grained FP8
    (``quant_method: fp8``, ``weight_block_size [128, 128]``, dynamic activations -> "block").
    Raises naming what is not supported."""
    if not isinstance(quant_config, dict):
        raise TypeError(f"quantization_config: expected a dict, got {type(quant_config).__name__}")
    method = str(quant_config.get("quant_method", "")).lower()
    notes: list[str] = []
    if method == "fp8":
        block = quant_config.get("weight_block_size")
        if block is None or list(block) != [BLOCK, BLOCK]:
            raise ValueError(f"quantization_config: fp8 weight_block_size {block!r}; only [128, 128] is supported")
        act = str(quant_config.get("activation_scheme", "dynamic")).lower()
        if act != "dynamic":
            raise ValueError(f"quantization_config: fp8 activation_scheme {act!r}; only 'dynamic' is supported")
        fmt = str(quant_config.get("scale_fmt", "float"))
        if fmt not in ("float", "ue8m0"):
            raise ValueError(f"quantization_config: fp8 scale_fmt {fmt!r}; supported: 'float', 'ue8m0'")
        return "fp8", "block", notes
    if method != "compressed-tensors":
        raise ValueError(f"quantization_config: quant_method {method!r}; supported: compressed-tensors (float-quantized), fp8")
    groups = quant_config.get("config_groups") or {}
    if not groups:
        raise ValueError("quantization_config: compressed-tensors without config_groups")
    schemes = set()
    for name, group in groups.items():
        weights, acts = group.get("weights") or {}, group.get("input_activations")
        fmt = group.get("format") or quant_config.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise ValueError(f"quantization_config: compressed-tensors format {fmt!r} in group {name!r}; "
                             "supported: 'float-quantized', 'naive-quantized'")  # fmt: skip
        if weights.get("num_bits") != 8 or weights.get("type") != "float":
            raise ValueError(f"quantization_config: compressed-tensors group {name!r} does not hold 8-bit float weights: {weights}")
        if weights.get("symmetric", True) is False:
            raise ValueError(f"quantization_config: compressed-tensors group {name!r} has asymmetric FP8 weights")
        strategy = weights.get("strategy")
        if strategy in ("channel", "tensor"):
            scheme = "per-token"
        elif strategy == "block":
            if list(weights.get("block_structure") or []) != [BLOCK, BLOCK]:
                raise ValueError(f"quantization_config: compressed-tensors block_structure {weights.get('block_structure')!r}; "
                                 "only [128, 128] is supported")  # fmt: skip
            scheme = "block"
        else:
            raise ValueError(f"quantization_config: compressed-tensors weight strategy {strategy!r}; "
                             "supported: 'channel', 'tensor', 'block'")  # fmt: skip
        if not acts:
            raise ValueError(f"quantization_config: compressed-tensors group {name!r} quantizes weights only (FP8 W8A16); "
                             "supported: FP8 activations (dynamic per token, or per 1 x 128 group with block weights)")  # fmt: skip
        if acts.get("num_bits") != 8 or acts.get("type") != "float":
            raise ValueError(f"quantization_config: compressed-tensors group {name!r} input_activations are not 8-bit float: {acts}")
        a_strategy, dynamic = acts.get("strategy"), acts.get("dynamic")
        if scheme == "block":
            if a_strategy != "group" or acts.get("group_size") != BLOCK or dynamic is not True:
                raise ValueError(f"quantization_config: compressed-tensors block weights with input_activations {acts}; "
                                 "supported: dynamic, strategy 'group', group_size 128")  # fmt: skip
        elif dynamic is True:
            if a_strategy != "token":
                raise ValueError(f"quantization_config: compressed-tensors dynamic activations with strategy {a_strategy!r}; "
                                 "supported: 'token'")  # fmt: skip
        elif a_strategy == "tensor":
            notes.append("the checkpoint's static per-tensor input scales are not used: activations are quantized "
                         "dynamically per token (as transformers' CompressedTensorsFP8Linear does)")
        else:
            raise ValueError(f"quantization_config: compressed-tensors input_activations {acts} not supported")
        if strategy == "tensor":
            notes.append("per-tensor weight scales are expanded to one per output channel")
        schemes.add(scheme)
    if len(schemes) > 1:
        raise ValueError(f"quantization_config: compressed-tensors groups of different schemes {sorted(schemes)}; one per model is supported")
    return "compressed-tensors", schemes.pop(), sorted(set(notes))


def _stored_fp8(fmt: str, tensors: dict[str, torch.Tensor], prefix: str):
    """(weight, scale) of layer ``prefix`` popped from ``tensors``, or None when it is stored dense."""
    w = tensors.get(f"{prefix}.weight")
    if w is None or w.dtype != FP8_DTYPE:
        if w is not None and w.element_size() == 1 and w.is_floating_point():
            raise ValueError(f"checkpoint: {prefix}.weight is {w.dtype}; supported: {FP8_DTYPE}")
        return None
    scale_name = "weight_scale_inv" if fmt == "fp8" else "weight_scale"
    scale = tensors.pop(f"{prefix}.{scale_name}", None)
    if scale is None:
        raise ValueError(f"checkpoint: {prefix}.weight is {FP8_DTYPE} but {prefix}.{scale_name} is missing")
    if f"{prefix}.weight_zero_point" in tensors:
        raise ValueError(f"checkpoint: {prefix}.weight_zero_point present: asymmetric FP8 is not supported")
    tensors.pop(f"{prefix}.input_scale", None)  # static activation scale: not used (see checkpoint_scheme)
    tensors.pop(f"{prefix}.activation_scale", None)
    return tensors.pop(f"{prefix}.weight"), scale.to(torch.float32)


def load_fp8(checkpoint_dir, *, dtype: torch.dtype | None = None, device="cpu", source: Source = "local"):
    """A transformers causal LM from an FP8 checkpoint directory (``config.json`` with a
    ``quantization_config``, ``*.safetensors``), ``.eval()``, on ``device``. Formats (see
    :func:`checkpoint_scheme`): compressed-tensors ``float-quantized`` / ``naive-quantized``
    (``weight`` e4m3 + ``weight_scale`` [N, 1] per channel, [1] per tensor or [N / 128, K / 128]
    per block; dequantization ``weight * weight_scale``) and transformers' fine-grained FP8
    (``weight`` e4m3 + ``weight_scale_inv`` [ceil(N / 128), ceil(K / 128)] fp32 or ue8m0,
    dequantization ``weight * weight_scale_inv`` per block). Every linear layer stored in FP8
    becomes an ``FP8Linear``; the others load as usual. ``dtype``: the activation dtype
    (default: the config's, else bfloat16). Returns ``(model, report)``."""
    if source not in ("local", "hub"):
        raise ValueError(f"source: expected 'local' or 'hub', got {source!r}")
    directory, quant_config = read_quantization_config(checkpoint_dir)
    fmt, scheme, notes = checkpoint_scheme(quant_config)
    config, dtype, model = meta_model(directory, dtype, torch.bfloat16)
    tensors = _read_safetensors(directory, device)
    report = FP8Report(scheme=scheme, format=fmt, notes=list(notes))
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        stored = _stored_fp8(fmt, tensors, name)
        if stored is None:
            continue
        weight, scale = stored
        if tuple(weight.shape) != (module.out_features, module.in_features):
            raise ValueError(f"checkpoint: {name}.weight is {list(weight.shape)}, the model's layer is "
                             f"[{module.out_features}, {module.in_features}]")  # fmt: skip
        if scheme == "per-token" and scale.dim() == 2 and scale.shape[1] == 1:
            scale = scale[:, 0]  # compressed-tensors' [N, 1] channel scales
        bias = tensors.pop(f"{name}.bias", None)
        try:
            layer = FP8Linear(weight, scale, scheme, None if bias is None else bias.to(dtype))
        except (TypeError, ValueError) as err:
            raise ValueError(f"checkpoint: {name}: {err}") from None
        _set_module(model, name, layer)
        report.swapped.append(name)
        report.dense_bytes += module.in_features * module.out_features * torch.finfo(dtype).bits // 8
        report.fp8_bytes += _bytes(layer)
    if not report.swapped:
        raise ValueError(f"checkpoint_dir: no FP8 ({FP8_DTYPE}) linear layer found in {directory}")
    model = finish_load(model, config, tensors, dtype, device)
    report.notes.append(_gemm_note(model, report.swapped, scheme))
    return model, report
