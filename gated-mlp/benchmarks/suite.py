"""gated-mlp suite for the shared harness: ``fused-llm bench gated-mlp``.

The up half of a Llama MLP, ``silu(x W_gate^T) * (x W_up^T)``, for Llama 3 8B / 70B / 405B at
1..16384 tokens, bf16, with one fused [2U, D] weight. TFLOP/s = 2 M D 2U (both projections).
``ours`` is impl="auto" (what users get); ``ours_triton`` / ``ours_sm90`` force one kernel.
Peers in the same run:
* ``cublas_gemm``: the GEMM alone, ``F.linear(x, W)`` -> [M, 2U] (no activation at all);
* ``cublas_liger``: the unfused path of Liger's SwiGLU MLP: cuBLAS (one strided-batched GEMM
  writing gate and up as two contiguous [M, U] planes) + Liger's SwiGLU kernel;
* ``torch_compile``: ``torch.compile(dynamic=False)`` of ``silu(x @ Wg.T) * (x @ Wu.T)``;
* ``torch_eager``: the same in eager mode (the reference the outputs are checked against).
Extra activation memory (beyond x, W and the [M, U] result): ours none; the unfused paths hold
[M, 2U] (cuBLAS + Liger: gate and up planes before the product).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from fused_llm_dev.bench.suite import Case, Fn, Provider, Suite, compile_static, importable, load_sibling, package_loader, within_scale

ref = load_sibling(__file__)
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
HIDDEN = {m: d for m, (d, _) in ref.MODELS.items()}

_ours, _ours_unavailable = package_loader("gated-mlp", "gated_mlp_fused")
_swiglu, _swiglu_unavailable = package_loader("swiglu-fp8", "silu_and_mul_fp8")
FP8_TOKENS = (1, 64, 1024, 4096, 16384)


def _shape(case: Case) -> tuple[int, int, int]:
    return case["tokens"], case["hidden"], case["inter"]


def _bytes(case: Case) -> int:
    m, d, u = _shape(case)
    return 2 * (2 * u * d + m * d + m * u)


def _flops(case: Case) -> int:
    m, d, u = _shape(case)
    return 2 * m * d * 2 * u


_check = within_scale("gated mlp")


def _make_ours_impl(impl: str):
    def make(case: Case, seed: int) -> Fn:
        op = _ours().gated_mlp_fused
        x, w = ref.make_inputs(*_shape(case), "cuda", seed)
        return lambda: op(x, w, layout="concat", impl=impl)

    return make


make_ours = _make_ours_impl("auto")


def _sm90_unavailable() -> str | None:
    why = _ours_unavailable()
    if why is None and not _ours().sm90_available():
        why = "this build of gated-mlp has no CuTe sm90 kernel"
    if why is None and torch.cuda.get_device_capability() != (9, 0):
        why = "the CuTe sm90 kernel runs on capability 9.0 GPUs only"
    return why


def make_cublas(case: Case, seed: int) -> Fn:
    x, w = ref.make_inputs(*_shape(case), "cuda", seed)
    return lambda: F.linear(x, w)


_liger_unavailable = importable("liger_kernel.ops.swiglu", "swiglu_forward")


def make_cublas_liger(case: Case, seed: int) -> Fn:
    # Liger's kernel indexes gate, up and its output with one row stride, so gate and up must be
    # contiguous [M, U] tensors: one strided-batched cuBLAS GEMM writes them as two planes.
    from liger_kernel.ops.swiglu import swiglu_forward

    m, d, u = _shape(case)
    x, w = ref.make_inputs(m, d, u, "cuda", seed)
    w3 = w.view(2, u, d).transpose(1, 2)  # [2, D, U]
    x3 = x.expand(2, m, d)

    def call() -> torch.Tensor:
        gate_up = torch.bmm(x3, w3)
        return swiglu_forward(gate_up[0], gate_up[1])[2]

    return call


def make_eager(case: Case, seed: int) -> Fn:
    x, w = ref.make_inputs(*_shape(case), "cuda", seed)
    return lambda: ref.gated_ref(x, w)


@functools.cache
def _compiled() -> Any:
    return compile_static(ref.gated_ref)


def make_compile(case: Case, seed: int) -> Fn:
    fn = _compiled()
    x, w = ref.make_inputs(*_shape(case), "cuda", seed)
    return lambda: fn(x, w)


# --- FP8 (phase 2): e4m3 x and W, per-tensor scales, FP8 out with a static scale -----------


def _fp8_bytes(case: Case) -> int:
    m, d, u = _shape(case)
    return 2 * u * d + m * d + m * u


def make_ours_fp8(case: Case, seed: int) -> Fn:
    op = _ours().gated_mlp_fp8
    m, d, u = _shape(case)
    xq, wq, xs, ws, out_scale = ref.make_fp8_inputs(m, d, u, "cuda", seed)
    return lambda: op(xq, wq[:u], wq[u:], xs, ws, ws, out_dtype=ref.FP8, out_scale=out_scale)


def make_ours_fp8_bf16_out(case: Case, seed: int) -> Fn:
    op = _ours().gated_mlp_fp8
    m, d, u = _shape(case)
    xq, wq, xs, ws, _ = ref.make_fp8_inputs(m, d, u, "cuda", seed)
    return lambda: op(xq, wq[:u], wq[u:], xs, ws, ws)


def make_scaled_mm_swiglu_fp8(case: Case, seed: int) -> Fn:
    act_quant = _swiglu().silu_and_mul_fp8
    xq, wq, xs, ws, out_scale = ref.make_fp8_inputs(*_shape(case), "cuda", seed)

    def call() -> torch.Tensor:
        gu = torch._scaled_mm(xq, wq.T, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        return act_quant(gu, out_scale)

    return call


def make_scaled_mm_fast_swiglu_fp8(case: Case, seed: int) -> Fn:
    act_quant = _swiglu().silu_and_mul_fp8
    xq, wq, xs, ws, out_scale = ref.make_fp8_inputs(*_shape(case), "cuda", seed)

    def call() -> torch.Tensor:
        gu = torch._scaled_mm(xq, wq.T, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16, use_fast_accum=True)
        return act_quant(gu, out_scale)

    return call


def make_scaled_mm(case: Case, seed: int) -> Fn:
    xq, wq, xs, ws, _ = ref.make_fp8_inputs(*_shape(case), "cuda", seed)
    return lambda: torch._scaled_mm(xq, wq.T, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)


def make_fp8_eager(case: Case, seed: int) -> Fn:
    xq, wq, xs, ws, out_scale = ref.make_fp8_inputs(*_shape(case), "cuda", seed)
    return lambda: ref.gated_fp8_ref(xq, wq, xs, ws, out_scale)


@functools.cache
def _compiled_fp8() -> Any:
    return compile_static(ref.gated_fp8_ref)


def make_fp8_compile(case: Case, seed: int) -> Fn:
    fn = _compiled_fp8()
    xq, wq, xs, ws, out_scale = ref.make_fp8_inputs(*_shape(case), "cuda", seed)
    return lambda: fn(xq, wq, xs, ws, out_scale)


def _no_check(out: Any, expected: Any) -> None:
    """bf16-out providers: a different output than the FP8 reference (timed for context)."""


def build_suites() -> list[Suite]:
    cases = [Case.of(hidden=d, inter=u, tokens=t) for d, u in ref.MODELS.values() for t in TOKENS]
    return [
        Suite(
            name="gated-mlp",
            description="silu(x W_gate^T) * (x W_up^T), Llama 3 8B / 70B / 405B MLP shapes, bf16, fused [2U, D] weight",
            cases=cases,
            quick_cases=[Case.of(hidden=4096, inter=14336, tokens=t) for t in (16, 4096)],
            providers=[
                Provider("ours", make_ours, unavailable=_ours_unavailable, note="gated_mlp_fused, one kernel, [M, U] out"),
                Provider("ours_triton", _make_ours_impl("triton"), unavailable=_ours_unavailable, note="impl='triton'"),
                Provider("ours_sm90", _make_ours_impl("sm90"), unavailable=_sm90_unavailable, note="impl='sm90' (CuTe TMA + wgmma)"),
                Provider("cublas_gemm", make_cublas, check=lambda out, expected: None, note="F.linear -> [M, 2U], no activation"),
                Provider("cublas_liger", make_cublas_liger, unavailable=_liger_unavailable, note="cuBLAS bmm + Liger swiglu_forward"),
                Provider("torch_compile", make_compile, note="torch.compile(dynamic=False) of silu(x Wg^T) * (x Wu^T)"),
                Provider("torch_eager", make_eager, note="transformers' expression"),
            ],
            bytes_moved=_bytes,
            flops=_flops,
            check=_check,
            verify_case=Case.of(hidden=4096, inter=14336, tokens=37),
            reference="torch_eager",
            ours="ours",
            x_param="tokens",
            group_param="hidden",
        ),
        Suite(
            name="gated-mlp-fp8",
            description="FP8 (e4m3, per-tensor scales) silu(x W_gate^T) * (x W_up^T) -> e4m3 with a static scale, Llama 3 MLP shapes",
            cases=[Case.of(hidden=d, inter=u, tokens=t) for d, u in ref.MODELS.values() for t in FP8_TOKENS],
            quick_cases=[Case.of(hidden=4096, inter=14336, tokens=t) for t in (16, 4096)],
            providers=[
                Provider("ours", make_ours_fp8, unavailable=_ours_unavailable, note="gated_mlp_fp8, e4m3 out, one kernel"),
                Provider("ours_bf16_out", make_ours_fp8_bf16_out, unavailable=_ours_unavailable, check=_no_check, note="gated_mlp_fp8, bf16 out"),
                Provider("scaled_mm_swiglu_fp8", make_scaled_mm_swiglu_fp8, unavailable=_swiglu_unavailable,
                         note="torch._scaled_mm (bf16 [M, 2U]) + swiglu-fp8 silu_and_mul_fp8"),  # fmt: skip
                Provider("scaled_mm_fast_swiglu_fp8", make_scaled_mm_fast_swiglu_fp8, unavailable=_swiglu_unavailable,
                         note="the same with use_fast_accum=True (Hopper's fast FP8 accumulation, as ours)"),  # fmt: skip
                Provider("scaled_mm", make_scaled_mm, check=_no_check, note="torch._scaled_mm alone, bf16 [M, 2U]"),
                Provider("torch_compile", make_fp8_compile, note="torch.compile(dynamic=False) of _scaled_mm + silu * up + quant"),
                Provider("torch_eager", make_fp8_eager, note="_scaled_mm + silu * up + quant, eager"),
            ],
            bytes_moved=_fp8_bytes,
            flops=_flops,
            check=within_scale("gated mlp fp8", 0.1),
            verify_case=Case.of(hidden=4096, inter=14336, tokens=37),
            reference="torch_eager",
            ours="ours",
            x_param="tokens",
            group_param="hidden",
        ),
    ]
