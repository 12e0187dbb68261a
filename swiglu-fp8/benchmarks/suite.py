"""swiglu-fp8 suite for the shared harness: ``fused-llm bench swiglu-fp8 [--quick]``.

Op: x = [gate | up] [rows, 2d] -> silu(gate) * up -> static-scale e4m3fn, bf16 in.
Bytes per call: read x (2 x 2 B per output element), write q (1 B) = 5 B per output element.
Liger stops at a bf16 output (6 B per element): its GB/s uses its own bytes, the speedup
column compares times.

Peers (issue 3): torch eager, torch.compile with static shapes, Liger's SwiGLU forward (the
kernel behind ``LigerSiLUMulFunction``, on separate gate and up tensors, as ``LigerSwiGLUMLP``
feeds it), and, where the installed Liger has it, its fused gate-up forward, which reads our
[gate | up] layout directly.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fused_llm_dev.bench.suite import Case, Fn, Provider, Suite, compile_static, importable, load_sibling, package_loader, same_bytes_copy

D = (4096, 8192, 14336, 28672)  # output widths d (inputs 2d): 8B-class up to 70B-class MLPs
ROWS = tuple(2**i for i in range(15))  # 1 .. 16384 tokens: decode through prefill


ref = load_sibling(__file__)


def _inputs(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return ref.make_inputs(case["rows"], case["d"], "cuda", seed)


# --- ours: the package through the real loader (LOCAL_KERNELS -> swiglu-fp8/build) ------------


_ours, _ours_unavailable = package_loader("swiglu-fp8", "silu_and_mul_fp8")


def make_ours(case: Case, seed: int) -> Fn:
    op = _ours().silu_and_mul_fp8
    x, scale = _inputs(case, seed)
    # The functional form, like every peer: a new q on every call (from the graph's pool).
    return lambda: op(x, scale, fp8_dtype=ref.FP8)


def make_ours_preallocated(case: Case, seed: int) -> Fn:
    op = _ours().silu_and_mul_fp8
    x, scale = _inputs(case, seed)
    q = ref.poisoned_fp8(case["rows"], case["d"], "cuda")
    # As an inference engine calls it: q into a preallocated buffer, so the call allocates nothing.
    return lambda: op(x, scale, fp8_dtype=ref.FP8, out=q)


# --- torch eager and torch.compile --------------------------------------------------------------


def make_eager(case: Case, seed: int) -> Fn:
    x, scale = _inputs(case, seed)
    return lambda: ref.silu_and_mul_fp8_ref(x, scale)


@functools.cache
def _compiled() -> Any:
    return compile_static(ref.silu_and_mul_fp8_ref)


def make_compile(case: Case, seed: int) -> Fn:
    fn = _compiled()
    x, scale = _inputs(case, seed)
    return lambda: fn(x, scale)


# --- Liger-Kernel: SwiGLU forward, bf16 out (no quantisation) ------------------------------------


_liger_unavailable = importable("liger_kernel.ops.swiglu", "swiglu_forward")


def make_liger(case: Case, seed: int) -> Fn:
    # The forward launcher itself (no autograd.Function, no grad): what LigerSiLUMulFunction's
    # forward calls. Signature (0.8.5): swiglu_forward(a, b, gate_multiplier=1.0) -> (a, b, c);
    # it indexes a, b and c with one row stride, so gate and up are separate contiguous tensors
    # (as LigerSwiGLUMLP's gate_proj / up_proj produce them; made here, outside the timing).
    # Rounding: silu in fp32, cast to bf16, bf16 multiply = ours.
    from liger_kernel.ops.swiglu import swiglu_forward

    x, _ = _inputs(case, seed)
    d = case["d"]
    gate, up = x[:, :d].contiguous(), x[:, d:].contiguous()

    def call() -> torch.Tensor:
        return swiglu_forward(gate, up)[2]

    return call


_liger_fused_unavailable = importable("liger_kernel.ops.swiglu", "swiglu_fused_gate_up_forward")


def make_liger_fused(case: Case, seed: int) -> Fn:
    # Liger's forward for one [rows, 2d] gate-up tensor (LigerFusedGateUpSiLUMulFunction):
    # the same input layout as ours. Returns (y, c); c is [rows, d] bf16.
    from liger_kernel.ops.swiglu import swiglu_fused_gate_up_forward

    x, _ = _inputs(case, seed)
    return lambda: swiglu_fused_gate_up_forward(x)[1]


# --- checks (outputs on the verify case against torch eager) -------------------------------------


def check_q(out: torch.Tensor, expected: torch.Tensor) -> None:
    ref.check_fp8(out, expected)


def check_liger(out: torch.Tensor, expected: torch.Tensor) -> None:
    # Quantise Liger's bf16 output the reference's way; then the same one-ulp rule applies.
    ref.check_fp8(ref.quantize_fp8(out, torch.tensor([ref.SCALE], device=out.device)), expected, "y (quantised)")


def _bytes_moved(case: Case) -> int:
    return 5 * case["rows"] * case["d"]


def build_suite() -> Suite:
    return Suite(
        name="swiglu-fp8",
        description="silu(x[:, :d]) * x[:, d:] -> static-scale e4m3fn; bf16 in; 5 B per output element",
        cases=[Case.of(d=d, rows=r) for d in D for r in ROWS],
        quick_cases=[Case.of(d=14336, rows=r) for r in (1, 512, 8192)],
        providers=[
            Provider(
                "ours",
                make_ours,
                unavailable=_ours_unavailable,
                note="silu_and_mul_fp8 returning a new q (as the peers do)",
            ),
            Provider(
                "ours_preallocated",
                make_ours_preallocated,
                unavailable=_ours_unavailable,
                note="silu_and_mul_fp8, out= preallocated (no allocation)",
            ),
            Provider("torch_eager", make_eager, note="plain torch, same roundings"),
            Provider("torch_compile", make_compile, note="torch.compile(dynamic=False, fullgraph=True)"),
            Provider(
                "liger",
                make_liger,
                bytes_moved=lambda c: 6 * c["rows"] * c["d"],
                check=check_liger,
                unavailable=_liger_unavailable,
                note="liger_kernel swiglu_forward (LigerSiLUMulFunction), separate gate/up, bf16 out (6 B/element)",
            ),
            Provider(
                "liger_fused_gate_up",
                make_liger_fused,
                bytes_moved=lambda c: 6 * c["rows"] * c["d"],
                check=check_liger,
                unavailable=_liger_fused_unavailable,
                note="liger_kernel swiglu_fused_gate_up_forward, one rows x 2d gate-up tensor in, bf16 out (6 B/element)",
            ),
            same_bytes_copy(_bytes_moved),
        ],
        bytes_moved=_bytes_moved,
        check=check_q,
        # Odd row count, mid width: catches tail handling a power of two would hide.
        verify_case=Case.of(d=14336, rows=37),
        reference="torch_eager",
        ours="ours",
        x_param="rows",
        group_param="d",
    )
