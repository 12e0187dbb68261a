"""What a package declares in ``<pkg>/benchmarks/suite.py`` (a ``build_suite() -> Suite`` or
``build_suites()``: cases, providers, bytes moved per call), and helpers for writing one: a
peer from another library, the package's own provider, the torch.compile peer, output checks
and a size-matched copy."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

Fn = Callable[[], object]
"""One call of the op on inputs bound at creation time; returns the op's outputs."""


@dataclass(frozen=True)
class Case:
    """One problem size, e.g. ``Case.of(hidden=4096, rows=512)``."""

    name: str
    params: dict[str, int]

    @classmethod
    def of(cls, **params: int) -> Case:
        return cls("_".join(f"{k}{v}" for k, v in params.items()), dict(params))

    def __getitem__(self, key: str) -> int:
        return self.params[key]


def _available() -> str | None:
    return None


@dataclass
class Provider:
    """One implementation to time.

    ``make(case, seed)`` creates a fresh input set (deterministic in ``seed``, so two providers
    given the same seed see the same values) and returns a zero-argument function that runs one
    call on it and returns the outputs. It runs outside the timed region; the returned function
    is what gets captured, so it should not allocate what a real caller would preallocate.
    """

    name: str
    make: Callable[[Case, int], Fn]
    # Overrides the suite's count when this provider moves different bytes (e.g. a peer that
    # writes bf16 where we write fp8): its GB/s uses its own bytes, speedups compare times.
    bytes_moved: Callable[[Case], int] | None = None
    # check(out, ref_out) raises if this provider's outputs disagree with the reference
    # provider's on the verify case; None: the suite's check.
    check: Callable[[Any, Any], None] | None = None
    # Returns why the provider cannot run here (library missing, package not built), or None.
    unavailable: Callable[[], str | None] = _available
    note: str = ""


@dataclass
class Suite:
    name: str
    description: str
    cases: list[Case]
    quick_cases: list[Case]
    providers: list[Provider]
    bytes_moved: Callable[[Case], int]  # minimum HBM bytes of one call; also sizes the L2 rotation
    flops: Callable[[Case], int] | None = None  # set for compute-bound ops: adds TFLOP/s
    check: Callable[[Any, Any], None] | None = None  # default output check against the reference
    verify_case: Case | None = None  # small case checked before timing; None: first case
    reference: str = "torch_eager"  # provider whose outputs the others are checked against
    ours: str = "ours"  # provider the speedups are computed for
    x_param: str = "rows"  # plot x axis
    group_param: str | None = "hidden"  # one subplot per value


def load_sibling(suite_file: str, name: str = "benchmark.py") -> ModuleType:
    """Import ``name`` next to a suite file by path: a package's benchmarks/benchmark.py holds
    its reference (it must stay self-contained for the Hub's ``kernels benchmark`` runner) and
    benchmarks/ is not a Python package."""
    path = Path(suite_file).with_name(name)
    module_name = "fused_llm_bench_" + re.sub(r"\W", "_", f"{path.parent.parent.name}_{path.stem}")
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def importable(module: str, name: str | None = None) -> Callable[[], str | None]:
    """An ``unavailable`` for a peer from a third-party library: why ``module`` (and ``name`` in
    it) cannot be imported here, or None."""

    def unavailable() -> str | None:
        try:
            mod = importlib.import_module(module)
            if name is not None:
                getattr(mod, name)
        except Exception as exc:  # noqa: BLE001 - any import failure means the peer is not timed
            what = f"{module}.{name}" if name else module
            return f"{what} not importable: {type(exc).__name__}: {exc}"
        return None

    return unavailable


def package_loader(package: str, required: str) -> tuple[Callable[[], ModuleType], Callable[[], str | None]]:
    """``(load, unavailable)`` for a suite's own provider: ``load()`` returns the package through
    the real loader (LOCAL_KERNELS -> PKG/build), once; ``unavailable()`` says why it cannot be
    timed (not built, wrong variant, no ``required`` function), or None."""

    @functools.cache
    def load() -> ModuleType:
        from fused_llm.packages import get_kernel

        return get_kernel(package)

    def unavailable() -> str | None:
        try:
            kernel = load()
        except Exception as exc:  # noqa: BLE001 - not built, wrong variant, import error: all a skip
            return f"cannot load fused-llm/{package}: {type(exc).__name__}: {exc}"
        return None if hasattr(kernel, required) else f"the loaded package has no {required}"

    return load, unavailable


def compile_static(fn: Callable[..., Any], mode: str | None = None) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=False, fullgraph=True, mode=mode)``: the torch.compile peer of
    every suite (static shapes, the strongest setting in baseline-h200.md; the GEMM suites add
    ``mode="max-autotune-no-cudagraphs"``), one graph per shape compiled during warm-up. Raises
    dynamo's recompile limits first: a suite's 45-77 shapes would pass the default of 8, after
    which dynamo silently falls back to eager."""
    config = torch._dynamo.config
    for key, floor in (("recompile_limit", 256), ("accumulated_recompile_limit", 1024)):
        if hasattr(config, key):  # names of torch >= 2.6; the GPU machine has 2.11
            setattr(config, key, max(getattr(config, key), floor))
    return torch.compile(fn, dynamic=False, fullgraph=True, mode=mode)


def autotune_unavailable() -> str | None:
    """An ``unavailable`` for a ``mode="max-autotune*"`` peer: why Inductor cannot autotune its
    Triton GEMM templates here (no GPU, no Triton, a CUDA GPU below capability 7.0, which
    Inductor's Triton backend does not take), or None."""
    if not torch.cuda.is_available():
        return "torch.compile max-autotune: no GPU visible"
    if importlib.util.find_spec("triton") is None:
        return "torch.compile max-autotune: Triton is not installed (Inductor's GEMM templates are Triton)"
    if torch.version.hip is None and torch.cuda.get_device_capability() < (7, 0):
        return f"torch.compile max-autotune: capability {torch.cuda.get_device_capability()} < 7.0 has no Inductor Triton backend"
    return None


def within_scale(name: str, fraction: float = 2e-2) -> Callable[[Any, Any], None]:
    """An output check for a suite whose providers round at different points (a fused GEMM
    epilogue against eager's separately rounded ops): max |out - expected| within
    ``fraction`` of max |expected|."""

    def check(out: Any, expected: Any) -> None:
        err = (out.float() - expected.float()).abs().max().item()
        scale = expected.float().abs().max().item()
        if not err <= fraction * scale:
            raise AssertionError(f"{name}: max |error| {err:.3g} > {fraction:.0%} of max |ref| {scale:.3g}")

    return check


def same_bytes_copy(bytes_moved: Callable[[Case], int]) -> Provider:
    """A peer that is the size-matched bound of any memory-bound op: ``torch.mul(a, 1.0, out=b)``
    on bf16 buffers moving the case's bytes (half read, half written), timed the same way.

    The copy ceiling is measured on 2 GiB; at decode and small prefill sizes launch and DRAM
    latency keep every kernel far below it, so "% of ceiling" there says little. This copy's
    time at the same size says what was reachable. Its outputs are not checked."""

    def make(case: Case, seed: int) -> Fn:
        n = max(1, bytes_moved(case) // 4)  # 2 B read + 2 B written per bf16 element
        a = torch.full((n,), float(seed % 7 + 1), dtype=torch.bfloat16, device="cuda")
        b = torch.empty_like(a)
        return functools.partial(torch.mul, a, 1.0, out=b)

    return Provider(
        "copy_same_bytes",
        make,
        check=lambda out, ref: None,
        note="torch.mul copy kernel moving the same bytes (size-matched bound, not an implementation)",
    )
