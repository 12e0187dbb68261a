"""gated-mlp suite for the shared harness: ``fused-llm bench gated-mlp``.

The up half of a Llama MLP, ``silu(x W_gate^T) * (x W_up^T)``, for Llama 3 8B / 70B / 405B at
1..16384 tokens, bf16, with one fused [2U, D] weight. TFLOP/s = 2 M D 2U (both projections).
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

from fused_llm.bench import Case, Fn, Provider, Suite, compile_static, load_sibling, package_loader, within_scale

ref = load_sibling(__file__)
TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
HIDDEN = {m: d for m, (d, _) in ref.MODELS.items()}

_ours, _ours_unavailable = package_loader("gated-mlp", "gated_mlp_fused")


def _shape(case: Case) -> tuple[int, int, int]:
    return case["tokens"], case["hidden"], case["inter"]


def _bytes(case: Case) -> int:
    m, d, u = _shape(case)
    return 2 * (2 * u * d + m * d + m * u)


def _flops(case: Case) -> int:
    m, d, u = _shape(case)
    return 2 * m * d * 2 * u


_check = within_scale("gated mlp")


def make_ours(case: Case, seed: int) -> Fn:
    op = _ours().gated_mlp_fused
    x, w = ref.make_inputs(*_shape(case), "cuda", seed)
    return lambda: op(x, w, layout="concat")


def make_cublas(case: Case, seed: int) -> Fn:
    x, w = ref.make_inputs(*_shape(case), "cuda", seed)
    return lambda: F.linear(x, w)


def _liger_unavailable() -> str | None:
    try:
        import liger_kernel.ops.swiglu  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"liger-kernel not importable: {type(exc).__name__}: {exc}"
    return None


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
        )
    ]
