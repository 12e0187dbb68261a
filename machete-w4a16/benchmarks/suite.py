"""machete-w4a16 suite for the shared harness: ``fused-llm bench machete-w4a16``.

``y = x @ dequantize(qw)^T`` for the projections of Llama 3 8B and 70B (QKV, O, gate/up fused,
down) at 1..4096 tokens, bf16 activations, group-128 symmetric int4 weights (uint4b8: what
GPTQ checkpoints hold). ``ours`` is w4a16_gemm as users call it (the kernel picked by M);
``ours_splitk`` / ``ours_tiled`` force one kernel at every M, to measure the crossover that
``_kernels.SMALL_M_MAX`` should be set to. Peers in the same run:
* ``cublas_bf16``: ``F.linear(x, W)`` on the dequantized bf16 weight (the reference: the issue's
  targets are ratios to it);
* ``tinygemm``: ``torch.ops.aten._weight_int4pack_mm`` (torch's built-in int4 GEMM, bf16,
  ``_convert_weight_to_int4pack`` layout, ``w = (q - 8) * scale + zero`` with zero 0 here);
* ``gemlite``: GemLite's Triton W4A16 layer (``GemLiteLinearTriton``), when importable;
* ``torch_compile``: ``torch.compile(dynamic=False, fullgraph=True)`` of the plain-torch
  unpack, dequantize and ``F.linear`` (``benchmark.dequant_linear``): what Inductor makes of the
  code a user would write without a kernel.
* ``read_floor``: a read-only kernel over a buffer of the int4 weight's bytes (codes and scales;
  ``fused_llm_dev.bench.read_floor``): the measured read-bandwidth floor, not an implementation.
Bytes: ours / tinygemm / gemlite read N K / 2 bytes of codes plus the scales; cuBLAS 2 N K.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from fused_llm_dev.bench.suite import (Case, Fn, Provider, Suite, compile_static, importable, load_sibling, package_loader,
                                       within_scale)  # fmt: skip
from fused_llm_dev.bench.read_floor import make_read_floor, no_check

ref = load_sibling(__file__)
TOKENS = (1, 4, 16, 32, 64, 128, 256, 1024, 4096)
GROUP = 128
SHAPE_IDS = {name: i for i, name in enumerate(ref.SHAPES)}  # cases carry ints: shape by index

_ours, _ours_unavailable = package_loader("machete-w4a16", "w4a16_gemm")


def _shape(case: Case) -> tuple[int, int, int]:
    N, K = list(ref.SHAPES.values())[case["shape"]]
    return case["tokens"], N, K


def _int4_bytes(case: Case) -> int:
    M, N, K = _shape(case)
    return N * K // 2 + 2 * N * (K // GROUP) + 2 * M * K + 2 * M * N


def _weight_bytes(case: Case) -> int:
    _, N, K = _shape(case)
    return N * K // 2 + 2 * N * (K // GROUP)


def _bf16_bytes(case: Case) -> int:
    M, N, K = _shape(case)
    return 2 * N * K + 2 * M * K + 2 * M * N


def _flops(case: Case) -> int:
    M, N, K = _shape(case)
    return 2 * M * N * K


def _inputs(case: Case, seed: int):
    M, N, K = _shape(case)
    kernel = _ours()
    return kernel, ref.make_x(M, K, "cuda", seed), ref.make_weight(kernel, N, K, "cuda", seed, GROUP)


def make_ours(case: Case, seed: int) -> Fn:
    kernel, x, qw = _inputs(case, seed)
    op = kernel.w4a16_gemm
    return lambda: op(x, qw)


def _make_forced(which: str):
    def make(case: Case, seed: int) -> Fn:
        kernel, x, qw = _inputs(case, seed)
        kern = kernel._triton_kernels()
        M, N, K = _shape(case)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        if which == "splitk":
            cfg = kern.w4a16_config(min(M, kern.SMALL_M_MAX), N, K, GROUP, sms)
        else:
            cfg = kern.w4a16_config(max(M, kern.SMALL_M_MAX + 1), N, K, GROUP, sms)
        out = torch.empty(M, N, dtype=x.dtype, device="cuda")

        def call() -> torch.Tensor:
            kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, None, out, GROUP, cfg=cfg)
            return out

        return call

    return make


def make_cublas(case: Case, seed: int) -> Fn:
    kernel, x, qw = _inputs(case, seed)
    w = kernel.dequantize(qw)
    del qw
    return lambda: F.linear(x, w)


def _tinygemm_unavailable() -> str | None:
    why = _ours_unavailable()
    if why is None and not all(hasattr(torch.ops.aten, n) for n in ("_weight_int4pack_mm", "_convert_weight_to_int4pack")):
        why = "this torch has no aten._weight_int4pack_mm / _convert_weight_to_int4pack"
    return why


def make_tinygemm(case: Case, seed: int) -> Fn:
    """torch's tinygemm on the same codes and scales: the weight as [N, K / 2] uint8 (two codes
    per byte, the even column in the high nibble, as torchao packs it), 8 inner K tiles, and
    scale_and_zero [K / G, N, 2] = (scale, 0): tinygemm computes (q - 8) * scale + zero."""
    kernel, x, qw = _inputs(case, seed)
    q = kernel.unpack_int4(qw.qweight)  # [N, K] int32, 0..15
    packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
    del q
    w = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    scale_zero = torch.stack([qw.scales, torch.zeros_like(qw.scales)], dim=-1).contiguous()  # [K/G, N, 2]
    return lambda: torch.ops.aten._weight_int4pack_mm(x, w, GROUP, scale_zero)


@functools.cache
def _compiled():
    return compile_static(ref.dequant_linear)


def make_compile(case: Case, seed: int) -> Fn:
    _, x, qw = _inputs(case, seed)
    fn = _compiled()
    shifts = torch.tensor(ref.COLUMN_SHIFTS, dtype=torch.int32, device=x.device)
    return lambda: fn(x, qw.qweight, qw.scales, shifts)


_gemlite_unavailable = importable("gemlite.core", "GemLiteLinearTriton")


@functools.cache
def _gemlite_configs() -> None:
    """GemLite loads the launch configurations it ships for the GPU it finds by name (``h100.json``
    on an H100) and autotunes what they lack at a shape's first call. None matches an H200, whose
    SMs are an H100's: give it the H100's file rather than autotune inside the timed setup."""
    import gemlite.core as core

    if core.get_default_cache_config() is None and torch.cuda.get_device_capability() == (9, 0):
        core.GemLiteLinearTriton.load_config(os.path.join(os.path.dirname(core.__file__), "configs", "h100.json"))


def make_gemlite(case: Case, seed: int) -> Fn:
    """GemLite's W4A16 layer on the same codes, scales and zero point 8 (it computes
    (q - zero) * scale), bf16 in and out."""
    from gemlite.core import DType, GemLiteLinearTriton

    _gemlite_configs()

    kernel, x, qw = _inputs(case, seed)
    M, N, K = _shape(case)
    q = kernel.unpack_int4(qw.qweight).to(torch.uint8)  # [N, K]
    scales = qw.scales.t().contiguous()  # [N, K / G]
    zeros = torch.full_like(scales, 8)
    layer = GemLiteLinearTriton(W_nbits=4, group_size=GROUP, in_features=K, out_features=N,
                                input_dtype=DType.BF16, output_dtype=DType.BF16)  # fmt: skip
    layer.pack(q, scales, zeros, None)
    return lambda: layer(x)


@functools.cache
def _cases() -> list[Case]:
    return [Case.of(shape=SHAPE_IDS[s], tokens=t) for s in ref.SHAPES for t in TOKENS]


def build_suite() -> Suite:
    int4_note = "reads N K / 2 bytes of codes + bf16 scales (group 128)"
    return Suite(
        name="machete-w4a16",
        description="x @ dequantize(qw)^T, bf16 x, int4 uint4b8 weights, group 128; Llama 3 8B / 70B projections "
        f"(shape index: {', '.join(f'{i} = {n} {ref.SHAPES[n]}' for n, i in SHAPE_IDS.items())})",
        cases=_cases(),
        quick_cases=[Case.of(shape=SHAPE_IDS[s], tokens=t) for s in ("8B-qkv", "8B-gate_up", "70B-down") for t in (1, 16, 64, 256, 4096)],
        providers=[
            Provider("ours", make_ours, unavailable=_ours_unavailable, note="w4a16_gemm (kernel by M)"),
            Provider("ours_splitk", _make_forced("splitk"), unavailable=_ours_unavailable, note="the split-K kernel at every M"),
            Provider("ours_tiled", _make_forced("tiled"), unavailable=_ours_unavailable, note="the tiled kernel at every M"),
            Provider("cublas_bf16", make_cublas, bytes_moved=_bf16_bytes, note="F.linear on the dequantized bf16 weight"),
            Provider("tinygemm", make_tinygemm, unavailable=_tinygemm_unavailable, note="aten._weight_int4pack_mm, " + int4_note),
            Provider("gemlite", make_gemlite, unavailable=_gemlite_unavailable, note="GemLiteLinearTriton, " + int4_note),
            Provider("torch_compile", make_compile, unavailable=_ours_unavailable,
                     note="torch.compile(dynamic=False) of unpack + (q - 8) s + F.linear, " + int4_note),  # fmt: skip
            Provider("read_floor", make_read_floor(_weight_bytes), bytes_moved=_weight_bytes, check=no_check,
                     note="a read-only kernel over the int4 weight's bytes: the read-bandwidth floor (not an implementation)"),
        ],
        bytes_moved=_int4_bytes,
        flops=_flops,
        # bf16 outputs of order one rounded at different points (cuBLAS's split-K / order): 1%.
        check=within_scale("w4a16", 1e-2),
        verify_case=Case.of(shape=SHAPE_IDS["8B-qkv"], tokens=37),
        reference="cublas_bf16",
        ours="ours",
        x_param="tokens",
        group_param="shape",
    )
