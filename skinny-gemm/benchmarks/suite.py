"""skinny-gemm suites for the shared harness: ``fused-llm bench skinny-gemm``.

``y = x @ w^T`` for the issue's shapes (Llama-405B TP8 QKV / gate-up / down, Llama-3 8B and
70B projections) at 1-64 tokens, in bf16 (suite ``skinny-gemm``) and FP8 with per-token /
per-channel scales and bf16 out (suite ``skinny-gemm-fp8``), and with one scale each (suite
``skinny-gemm-fp8-tensor``, against cuBLAS's per-tensor FP8 GEMM). Providers in one run:

* ``ours``: ``gemm`` / ``gemm_fp8`` (the skinny kernel, default configuration, ordered split-K
  reduction); ``ours_atomic``: the atomic reduction; ``ours_tma`` (capability 9.0 GPUs of a CUDA
  build, 1-16 tokens): ``gemm`` / ``gemm_fp8`` with the compiled Hopper kernel's default ``TmaConfig()``;
  ``ours_mma`` (capability >= 8.0 GPUs of a CUDA build, >= 8.9 for FP8, 1-16 tokens): ``gemm`` /
  ``gemm_fp8`` with the compiled tensor-core GEMV's default ``MmaConfig()``;
  ``linear``: the dispatching entry point (with the committed tuning table: cuBLAS wherever the
  table has no entry);
* ``cublas``: ``F.linear`` / ``torch._scaled_mm`` (the reference: the issue's targets are
  ratios to it);
* ``torch_compile``: ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same
  expression (Inductor's Triton templates against cuBLAS, picked per shape);
* ``read_floor``: a read-only Triton kernel over a buffer of the weight's bytes, the fastest of
  a few launches (``fused_llm_dev.bench.read_floor``): the measured read-bandwidth floor of the
  shape, not an implementation.

Bytes: the weight plus x and the output (the weight dominates: 75 MB at 2304 x 16384 bf16
against 1 MB of x at 32 tokens).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from fused_llm_dev.bench.suite import (
    Case,
    Fn,
    Provider,
    Suite,
    autotune_unavailable,
    compile_static,
    load_sibling,
    package_loader,
    within_scale,
)
from fused_llm_dev.bench.read_floor import make_read_floor, no_check

ref = load_sibling(__file__)
SHAPE_IDS = {name: i for i, name in enumerate(ref.SHAPES)}  # cases carry ints: shape by index
QUICK_SHAPES = ("405B-tp8-qkv", "8B-qkv", "70B-down")
QUICK_TOKENS = (1, 16, 64)

_ours, _ours_unavailable = package_loader("skinny-gemm", "gemm")


def _shape(case: Case) -> tuple[int, int, int]:
    N, K = list(ref.SHAPES.values())[case["shape"]]
    return case["tokens"], N, K


def _bytes(elem: int):
    def count(case: Case) -> int:
        M, N, K = _shape(case)
        return elem * N * K + elem * M * K + 2 * M * N

    return count


def _flops(case: Case) -> int:
    M, N, K = _shape(case)
    return 2 * M * N * K


# ---------------------------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------------------------


def _inputs(case: Case, seed: int):
    M, N, K = _shape(case)
    return ref.make_x(M, K, "cuda", seed), ref.make_weight(N, K, "cuda", seed)


def _make_ours(which: str):
    def make(case: Case, seed: int) -> Fn:
        kernel = _ours()
        x, w = _inputs(case, seed)
        if which == "linear":
            return lambda: kernel.linear(x, w)
        out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device="cuda")
        det = which == "ours"
        return lambda: kernel.gemm(x, w, out=out, deterministic=det)

    return make


def _tma_unavailable() -> str | None:
    reason = _ours_unavailable()
    if reason is not None:
        return reason
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        return "the compiled Hopper kernel runs on capability 9.0 GPUs"
    return None if _ours().tma_configs() else "this build of skinny-gemm has no compiled kernel (not a CUDA build)"


def _check_compiled_tokens(M: int, what: str = "the compiled Hopper kernel") -> None:
    if M > 16:
        raise ValueError(f"{what} takes 1-16 tokens, not {M}: not timed")


def make_tma(case: Case, seed: int) -> Fn:
    kernel = _ours()
    x, w = _inputs(case, seed)
    _check_compiled_tokens(x.shape[0])
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device="cuda")
    cfg = kernel.TmaConfig()
    return lambda: kernel.gemm(x, w, out=out, config=cfg)


def _mma_unavailable(fp8: bool = False) -> str | None:
    reason = _ours_unavailable()
    if reason is not None:
        return reason
    want = (8, 9) if fp8 else (8, 0)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < want:
        return f"the compiled tensor-core GEMV runs on capability >= {want[0]}.{want[1]} GPUs{' on FP8' if fp8 else ''}"
    return None if _ours().mma_configs() else "this build of skinny-gemm has no compiled GEMV (not a CUDA build)"


def make_mma(case: Case, seed: int) -> Fn:
    kernel = _ours()
    x, w = _inputs(case, seed)
    _check_compiled_tokens(x.shape[0], "the compiled tensor-core GEMV")
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device="cuda")
    cfg = kernel.MmaConfig()
    return lambda: kernel.gemm(x, w, out=out, config=cfg)


def make_cublas(case: Case, seed: int) -> Fn:
    x, w = _inputs(case, seed)
    return lambda: F.linear(x, w)


@functools.cache
def _max_autotune(fn):
    """One compiled function per expression for all 77 cases (a graph per shape inside it)."""
    return compile_static(fn, mode="max-autotune-no-cudagraphs")


def _fp8_autotune_unavailable() -> str | None:
    """The FP8 peer also needs an FP8 GPU: _scaled_mm has no kernel below CUDA capability 8.9
    (nor on ROCm outside gfx94x)."""
    reason = autotune_unavailable()
    if reason is None and torch.version.hip is None and torch.cuda.get_device_capability() < (8, 9):
        reason = f"torch.compile of _scaled_mm: FP8 needs CUDA capability >= 8.9, got {torch.cuda.get_device_capability()}"
    if reason is None and torch.version.hip is not None and ref.fp8_dtype(0) != torch.float8_e4m3fnuz:
        reason = "torch.compile of _scaled_mm: FP8 on ROCm needs a gfx94x GPU"
    return reason


def make_compile(case: Case, seed: int) -> Fn:
    fn = _max_autotune(F.linear)
    x, w = _inputs(case, seed)
    return lambda: fn(x, w)


def _make_floor(elem: int):
    return make_read_floor(lambda case: elem * _shape(case)[1] * _shape(case)[2])


# ---------------------------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------------------------


def _fp8_inputs(case: Case, seed: int, per_tensor: bool = False):
    M, N, K = _shape(case)
    return ref.make_fp8(M, N, K, "cuda", seed, per_tensor=per_tensor)


def _make_ours_fp8(which: str, per_tensor: bool = False):
    def make(case: Case, seed: int) -> Fn:
        kernel = _ours()
        xq, wq, xs, ws = _fp8_inputs(case, seed, per_tensor)
        if which == "linear":
            return lambda: kernel.linear_fp8(xq, wq, xs, ws)
        if which == "ours_tma":
            _check_compiled_tokens(xq.shape[0])
            cfg = kernel.TmaConfig()
            return lambda: kernel.gemm_fp8(xq, wq, xs, ws, config=cfg)
        if which == "ours_mma":
            _check_compiled_tokens(xq.shape[0], "the compiled tensor-core GEMV")
            cfg = kernel.MmaConfig()
            return lambda: kernel.gemm_fp8(xq, wq, xs, ws, config=cfg)
        det = which == "ours"
        return lambda: kernel.gemm_fp8(xq, wq, xs, ws, deterministic=det)

    return make


def _scaled(xq, wq, sa, sb):
    return torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def _make_scaled_mm(per_tensor: bool, compiled: bool = False):
    """cuBLAS's FP8 GEMM (rowwise or per-tensor scales), or torch.compile max-autotune of it."""

    def make(case: Case, seed: int) -> Fn:
        fn = _max_autotune(_scaled) if compiled else _scaled
        xq, wq, xs, ws = _fp8_inputs(case, seed, per_tensor)
        sa, sb = ref.scaled_mm_scales(xs, ws)
        return lambda: fn(xq, wq, sa, sb)

    return make


def _cases(shapes, tokens) -> list[Case]:
    return [Case.of(shape=SHAPE_IDS[s], tokens=t) for s in shapes for t in tokens]


def _fp8_suite(per_tensor: bool, shape_note: str, floor: str, common: dict) -> Suite:
    """``skinny-gemm-fp8`` (per-token x, per-channel w, against cuBLAS's rowwise FP8 GEMM) or
    ``skinny-gemm-fp8-tensor`` (one scale each, against its per-tensor GEMM, 2.2x faster than
    the rowwise one)."""
    scales = "per-tensor" if per_tensor else "rowwise"
    providers = [Provider("ours", _make_ours_fp8("ours", per_tensor), unavailable=_ours_unavailable,
                          note="gemm_fp8, ordered reduction")]  # fmt: skip
    if not per_tensor:
        providers.append(Provider("ours_atomic", _make_ours_fp8("ours_atomic"), unavailable=_ours_unavailable,
                                  note="gemm_fp8(deterministic=False)"))  # fmt: skip
    providers += [
        Provider("ours_tma", _make_ours_fp8("ours_tma", per_tensor), unavailable=_tma_unavailable,
                 note="gemm_fp8(config=TmaConfig()): the compiled Hopper kernel, <= 16 tokens"),
        Provider("ours_mma", _make_ours_fp8("ours_mma", per_tensor), unavailable=lambda: _mma_unavailable(fp8=True),
                 note="gemm_fp8(config=MmaConfig()): the compiled tensor-core GEMV, <= 16 tokens"),
        Provider("linear", _make_ours_fp8("linear", per_tensor), unavailable=_ours_unavailable,
                 note=f"linear_fp8: the table's {scales} choice"),
        Provider("cublas", _make_scaled_mm(per_tensor), note=f"torch._scaled_mm, {scales} scales"),
        Provider("torch_compile", _make_scaled_mm(per_tensor, compiled=True), unavailable=_fp8_autotune_unavailable,
                 note="torch.compile(_scaled_mm, mode='max-autotune-no-cudagraphs')"),
        Provider("read_floor", _make_floor(1), bytes_moved=lambda c: _shape(c)[1] * _shape(c)[2], check=no_check,
                 note=floor),
    ]
    what = ("e4m3, one scale each (cuBLAS's per-tensor FP8 GEMM, 2.2x faster than its rowwise one)" if per_tensor
            else "e4m3 per token / per channel")  # fmt: skip
    return Suite(
        name="skinny-gemm-fp8-tensor" if per_tensor else "skinny-gemm-fp8",
        description=f"(xq @ wq^T) * x_scale * w_scale, {what}, bf16 out; shape index: {shape_note}",
        cases=_cases(ref.SHAPES, ref.TOKENS),
        quick_cases=_cases(QUICK_SHAPES, QUICK_TOKENS),
        providers=providers,
        bytes_moved=_bytes(1),
        check=within_scale("skinny-gemm fp8 per tensor" if per_tensor else "skinny-gemm fp8", 2e-2),
        **common,
    )


def build_suites() -> list[Suite]:
    shape_note = ", ".join(f"{i} = {n} {ref.SHAPES[n]}" for n, i in SHAPE_IDS.items())
    common = dict(flops=_flops, verify_case=Case.of(shape=SHAPE_IDS["8B-qkv"], tokens=13), reference="cublas", ours="ours",
                  x_param="tokens", group_param="shape")  # fmt: skip
    floor = "a read-only kernel over the weight's bytes: the read-bandwidth floor (not an implementation)"
    return [
        Suite(
            name="skinny-gemm",
            description=f"x @ w^T, bf16, decode-sized M; shape index: {shape_note}",
            cases=_cases(ref.SHAPES, ref.TOKENS),
            quick_cases=_cases(QUICK_SHAPES, QUICK_TOKENS),
            providers=[
                Provider("ours", _make_ours("ours"), unavailable=_ours_unavailable, note="gemm, ordered split-K reduction"),
                Provider("ours_atomic", _make_ours("ours_atomic"), unavailable=_ours_unavailable, note="gemm(deterministic=False)"),
                Provider("ours_tma", make_tma, unavailable=_tma_unavailable,
                         note="gemm(config=TmaConfig()): the compiled Hopper kernel, <= 16 tokens"),
                Provider("ours_mma", make_mma, unavailable=_mma_unavailable,
                         note="gemm(config=MmaConfig()): the compiled tensor-core GEMV, <= 16 tokens"),
                Provider("linear", _make_ours("linear"), unavailable=_ours_unavailable, note="linear: the tuning table's choice"),
                Provider("cublas", make_cublas, note="F.linear"),
                Provider("torch_compile", make_compile, unavailable=autotune_unavailable,
                         note="torch.compile(F.linear, mode='max-autotune-no-cudagraphs')"),
                Provider("read_floor", _make_floor(2), bytes_moved=lambda c: 2 * _shape(c)[1] * _shape(c)[2], check=no_check,
                         note=floor),
            ],
            bytes_moved=_bytes(2),
            # bf16 outputs of order one, cuBLAS's own summation order / split: 1% of the scale.
            check=within_scale("skinny-gemm", 1e-2),
            **common,
        ),
        _fp8_suite(per_tensor=False, shape_note=shape_note, floor=floor, common=common),
        _fp8_suite(per_tensor=True, shape_note=shape_note, floor=floor, common=common),
    ]
