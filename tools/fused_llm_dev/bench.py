"""The one GPU benchmark harness for every fused-llm package.

A package describes *what* to measure in ``<pkg>/benchmarks/suite.py`` (a ``build_suite() ->
Suite``: cases, providers, bytes moved per call); this module decides *how* to measure, so
every package is timed the same way as the peers in ``shared/reference/baseline-h200.md``:

* each provider runs on enough independent input sets that the working set exceeds 4x the L2
  (one call alone often fits in the 50-60 MB L2, and re-reading a cached buffer measures the
  cache, not HBM);
* all calls are captured into ONE CUDA graph after a warm-up (torch.compile compilation, Triton
  autotuning and handle creation happen there, never in the numbers), and the graph is
  replayed: this removes the host launch gaps that otherwise dominate decode-size calls;
* each replay is timed with CUDA events; we report the median and p20/p80 per call;
* bandwidth is compared with a copy ceiling measured in the same process
  (``torch.mul(a, 1.0, out=b)`` on 2 GiB bf16, read + write bytes), not the datasheet.

Entry point: ``fused-llm bench <pkg> [--quick] [--out DIR] [--providers a,b]``, which calls
``main(pkg, argv)``. Results go to ``<pkg>/benchmarks/results/<suite>_<GPU>.{json,csv,png}``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

Fn = Callable[[], object]
"""One call of the op on inputs bound at creation time; returns the op's outputs."""

METHOD = (
    "Per provider and case: N independent input sets with N * bytes_per_call > 4 x L2 "
    "(N >= 1), one warm-up call per set on a side stream (torch.compile compiles, Triton "
    "autotunes there), then all N calls captured into one CUDA graph; the graph is replayed "
    "`repeats` x `replays` times (replays lowered for long graphs to keep about `budget_s` "
    "per point, never under 3 per repeat), each replay timed with CUDA events; us per call = "
    "replay time / N; "
    "median and p20/p80 over replays. GB/s counts the provider's own minimum bytes "
    "(each input read once, each output written once). Copy ceiling: torch.mul(a, 1.0, out=b) "
    "on 2 GiB bf16 measured the same way, counting read + write bytes."
)


# ---------------------------------------------------------------------------------------------
# What a package declares (in <pkg>/benchmarks/suite.py)


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


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass(frozen=True)
class Method:
    """How each point is timed (recorded in the JSON)."""

    replays: int = 20  # timed replays per repeat, lowered for long graphs (budget_s)
    repeats: int = 5
    budget_s: float = 1.0  # rough cap on timed seconds per point; >= 3 replays per repeat
    l2_factor: int = 4  # input sets together exceed this many L2s


@dataclass(frozen=True)
class Timing:
    median_us: float  # per call
    p20_us: float
    p80_us: float
    calls_per_graph: int
    samples: int  # timed replays


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, like numpy's default."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def l2_bytes(device: torch.device | None = None) -> int:
    index = torch.cuda.current_device() if device is None else device.index
    return int(torch.cuda.get_device_properties(index or 0).L2_cache_size)


def calls_to_flush_l2(bytes_per_call: int, l2: int, factor: int = 4, max_calls: int = 16384) -> int:
    """Independent input sets needed so that the sets together exceed ``factor`` x L2."""
    return max(1, min(max_calls, factor * l2 // max(bytes_per_call, 1) + 1))


def time_calls(fns: Sequence[Fn], method: Method = Method()) -> Timing:
    """Capture ``fns`` (called in order) into one CUDA graph and time its replays.

    Raises whatever warm-up or capture raises (e.g. a provider that synchronizes or allocates
    through a non-capturable path); the caller reports it and moves on.
    """
    # Warm up on a side stream, as torch.cuda.graphs recommends: lazy initialisation
    # (compilation, autotuning, cuBLAS workspaces) must not happen during capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            # Keep every call's outputs alive through capture: a dropped output returns its
            # block to the graph's pool and the next call gets the same addresses, so every
            # call would write one L2-resident buffer and never pay its writes to memory.
            outputs = [fn() for fn in fns]
        graph.replay()  # the first replay uploads the graph; keep it out of the samples
        torch.cuda.synchronize()

        # Long graphs (e.g. eager at 16K rows, or thousands of decode-size calls) would take
        # minutes at 100 replays; keep ~budget_s per point but never < 3 per repeat.
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        per_repeat = max(3, min(method.replays, int(method.budget_s / (method.repeats * one))))

        samples: list[float] = []
        for _ in range(method.repeats):
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(per_repeat)
            ]
            for start, end in events:
                start.record()
                graph.replay()
                end.record()
            torch.cuda.synchronize()
            samples += [start.elapsed_time(end) * 1e3 / len(fns) for start, end in events]
    finally:
        outputs = None  # noqa: F841 - released with the graph
        # If capture_end raises, torch.cuda.graph leaves its capture stream current: restore ours.
        torch.cuda.set_stream(stream)
        with contextlib.suppress(RuntimeError):  # never mask the error that got us here
            graph.reset()
    samples.sort()
    return Timing(
        median_us=_percentile(samples, 0.5),
        p20_us=_percentile(samples, 0.2),
        p80_us=_percentile(samples, 0.8),
        calls_per_graph=len(fns),
        samples=len(samples),
    )


def time_us(make: Callable[[int], Fn], bytes_per_call: int, method: Method = Method()) -> Timing:
    """Time one op: ``make(seed)`` builds one independent input set and returns its call."""
    n = calls_to_flush_l2(bytes_per_call, l2_bytes(), method.l2_factor)
    fns = [make(seed) for seed in range(n)]
    try:
        return time_calls(fns, method)
    finally:
        del fns
        _release_memory()


def _release_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def measure_copy_ceiling(device: torch.device | str = "cuda", nbytes: int = 2 << 30) -> float:
    """GB/s (read + write bytes, 1e9) of ``torch.mul(a, 1.0, out=b)`` on ``nbytes`` of bf16.

    A kernel copy, not ``copy_``: the cudaMemcpy path is ~35% slower on an H200 and would
    flatter every kernel measured against it.
    """
    a = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    copy = functools.partial(torch.mul, a, 1.0, out=b)
    try:
        timing = time_calls([copy], Method())
    finally:
        del copy, a, b
        _release_memory()
    return 2 * nbytes / (timing.median_us * 1e-6) / 1e9


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


def compile_static(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=False, fullgraph=True)``: the torch.compile peer of every suite
    (static shapes, the strongest setting in baseline-h200.md), one graph per shape compiled
    during warm-up. Raises dynamo's recompile limits first: a suite's 45-60 shapes would pass
    the default of 8, after which dynamo silently falls back to eager."""
    config = torch._dynamo.config
    for key, floor in (("recompile_limit", 256), ("accumulated_recompile_limit", 1024)):
        if hasattr(config, key):  # names of torch >= 2.6; the GPU machine has 2.11
            setattr(config, key, max(getattr(config, key), floor))
    return torch.compile(fn, dynamic=False, fullgraph=True)


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


def measure_launch_floor(device: torch.device | str = "cuda") -> float:
    """us per call of a one-element ``torch.add`` timed the same way: what one kernel costs in
    graph replay before it moves any data (the floor under every decode-size number)."""
    a = torch.ones(1, device=device)
    b = torch.empty_like(a)
    # 256 calls per graph, like the decode-size points, so the graph launch itself amortizes.
    return time_calls([functools.partial(torch.add, a, 1.0, out=b)] * 256, Method()).median_us


# ---------------------------------------------------------------------------------------------
# Running a suite


@dataclass
class Result:
    case: str
    params: dict[str, int]
    provider: str
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    calls_per_graph: int = 0
    samples: int = 0
    bytes: int | None = None
    gbps: float | None = None
    pct_of_ceiling: float | None = None
    flops: int | None = None
    tflops: float | None = None
    ours_speedup: float | None = None  # this provider's time / ours (ours on its own row: 1.0)
    error: str | None = None


@dataclass
class Run:
    suite: Suite
    providers: list[str]  # timed, in order
    results: list[Result]
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> why
    metadata: dict[str, Any] = field(default_factory=dict)


def _one_line(exc: BaseException) -> str:
    # Multi-line messages (assert_close, CUDA errors) collapse into one line for tables/JSON.
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 400 else text[:397] + "..."


def _device_ok() -> bool:
    """After a failure: is the context still usable? A sticky error (illegal address) poisons
    every later call, and then timing the rest would only produce noise."""
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def verify_providers(suite: Suite, providers: list[Provider], log: Callable[[str], None]) -> dict[str, str]:
    """Run each provider once on the verify case and check it against the reference provider.
    Returns {provider: why it failed}; a broken peer is not worth timing."""
    case = suite.verify_case or suite.cases[0]
    by_name = {p.name: p for p in suite.providers}
    ref_provider = by_name.get(suite.reference)
    if ref_provider is None or ref_provider.unavailable() is not None:
        log(f"[yellow]no reference provider {suite.reference!r}: outputs not verified[/]")
        return {}
    try:
        ref = ref_provider.make(case, 0)()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        log(f"[yellow]reference {suite.reference!r} failed ({_one_line(exc)}): outputs not verified[/]")
        _release_memory()
        return {}
    failed: dict[str, str] = {}
    for p in providers:
        if p.name == suite.reference:
            continue
        check = p.check or suite.check
        if check is None:
            continue
        try:
            check(p.make(case, 0)(), ref)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure disqualifies the provider
            failed[p.name] = f"verification on {case.name} failed: {_one_line(exc)}"
            if not _device_ok():
                raise RuntimeError(f"CUDA context broken by {p.name}: {failed[p.name]}") from exc
    del ref
    _release_memory()
    return failed


def derive(result: Result, ceiling_gbps: float) -> None:
    """Fill in bandwidth / throughput from the time and the byte and flop counts."""
    if result.median_us is None:
        return
    seconds = result.median_us * 1e-6
    if result.bytes is not None:
        result.gbps = result.bytes / seconds / 1e9
        result.pct_of_ceiling = 100.0 * result.gbps / ceiling_gbps
    if result.flops is not None:
        result.tflops = result.flops / seconds / 1e12


def add_speedups(results: list[Result], ours: str) -> None:
    ours_us = {r.case: r.median_us for r in results if r.provider == ours and r.median_us}
    for r in results:
        base = ours_us.get(r.case)
        if base and r.median_us:
            r.ours_speedup = r.median_us / base


def run_suite(
    suite: Suite,
    cases: list[Case],
    providers: list[Provider],
    ceiling_gbps: float,
    method: Method = Method(),
) -> Run:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    skipped: dict[str, str] = {}
    for p in providers:
        reason = p.unavailable()
        if reason is not None:
            skipped[p.name] = reason
    active = [p for p in providers if p.name not in skipped]

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    ) as progress:
        log = progress.console.print
        for name, reason in skipped.items():
            log(f"[yellow]skip {name}[/]: {reason}")
        for name, reason in verify_providers(suite, active, log).items():
            log(f"[red]skip {name}[/]: {reason}")
            skipped[name] = reason
        active = [p for p in active if p.name not in skipped]

        results: list[Result] = []
        task = progress.add_task(suite.name, total=len(cases) * len(active))
        for case in cases:
            for p in active:
                progress.update(task, description=f"{suite.name} {case.name} {p.name}")
                nbytes = (p.bytes_moved or suite.bytes_moved)(case)
                result = Result(
                    case.name,
                    dict(case.params),
                    p.name,
                    bytes=nbytes,
                    flops=suite.flops(case) if suite.flops else None,
                )
                try:
                    t = time_us(functools.partial(p.make, case), nbytes, method)
                    result.median_us, result.p20_us, result.p80_us = t.median_us, t.p20_us, t.p80_us
                    result.calls_per_graph, result.samples = t.calls_per_graph, t.samples
                    derive(result, ceiling_gbps)
                except Exception as exc:  # noqa: BLE001 - report, skip this point, keep going
                    result.error = _one_line(exc)
                    log(f"[red]{case.name} {p.name}[/]: {result.error}")
                    _release_memory()
                    if not _device_ok():
                        raise RuntimeError(f"CUDA context broken during {case.name} {p.name}") from exc
                results.append(result)
                progress.advance(task)
    add_speedups(results, suite.ours)
    return Run(suite, [p.name for p in active], results, skipped)


# ---------------------------------------------------------------------------------------------
# Reporting


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def collect_metadata(suite: Suite, ceiling_gbps: float, root: Path | None, extra: dict[str, Any]) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    dirty = _command(["git", "status", "--porcelain"], root) if root else None
    commit = _command(["git", "rev-parse", "--short", "HEAD"], root) if root else None
    return {
        "suite": suite.name,
        "description": suite.description,
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "memory_bytes": props.total_memory,
        "driver": _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton_version,
            "liger_kernel": _version("liger-kernel"),
            "kernels": _version("kernels"),
            "transformers": _version("transformers"),
        },
        # The GPU machine gets a copy of the working tree whose .git (if any) may be stale: the
        # caller's FUSED_LLM_GIT_COMMIT wins.
        "git": os.environ.get("FUSED_LLM_GIT_COMMIT") or ((commit + ("-dirty" if dirty else "")) if commit else None),
        "copy_ceiling_gbps": ceiling_gbps,
        "method": METHOD,
        **extra,
    }


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'NVIDIA-H200' (safe in file names)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "unknown-GPU"


def output_stem(run: Run) -> str:
    quick = "_quick" if run.metadata.get("quick") else ""
    subset = run.metadata.get("file_suffix", "")
    return f"{run.suite.name}{quick}{subset}_{gpu_slug(str(run.metadata.get('gpu', '')))}"


def write_json(run: Run, path: Path) -> None:
    payload = {
        "metadata": run.metadata,
        "providers": run.providers,
        "skipped": run.skipped,
        "results": [asdict(r) for r in run.results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


CSV_FIELDS = [
    "provider", "median_us", "p20_us", "p80_us", "calls_per_graph", "samples", "bytes", "gbps",
    "pct_of_ceiling", "flops", "tflops", "ours_speedup", "error",
]  # fmt: skip


def write_csv(run: Run, path: Path) -> None:
    params = list(run.results[0].params) if run.results else []
    gpu, date = run.metadata.get("gpu"), run.metadata.get("date")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["suite", "case", *params, *CSV_FIELDS, "gpu", "date"])
        for r in run.results:
            row = asdict(r)
            writer.writerow(
                [run.suite.name, r.case, *(r.params.get(k) for k in params), *(row[k] for k in CSV_FIELDS), gpu, date]
            )


def write_plot(run: Run, path: Path) -> None:
    """Top row: % of the copy ceiling (TFLOP/s when the suite counts flops); bottom row: us per
    call, which is what matters at decode sizes. x = ``x_param``, one column per
    ``group_param`` value, one line per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suite = run.suite
    top, top_label = ("tflops", "TFLOP/s") if suite.flops else ("pct_of_ceiling", "% of copy ceiling")
    gp = suite.group_param
    groups = sorted({r.params.get(gp) for r in run.results} if gp else {None}, key=lambda g: (g is None, g or 0))
    fig, axes = plt.subplots(2, len(groups), figsize=(5.5 * len(groups), 7.5), squeeze=False, sharex="col")
    for col, group in enumerate(groups):
        for metric, ax in ((top, axes[0][col]), ("median_us", axes[1][col])):
            for provider in run.providers:
                points = sorted(
                    (r.params[suite.x_param], getattr(r, metric))
                    for r in run.results
                    if r.provider == provider
                    and getattr(r, metric) is not None
                    and (gp is None or r.params.get(gp) == group)
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    width = 2.5 if provider == suite.ours else 1.3
                    ax.plot(xs, ys, marker="o", markersize=3, linewidth=width, label=provider)
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        if top == "pct_of_ceiling":
            axes[0][col].axhline(100.0, color="gray", linestyle="--", linewidth=0.8)
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel(suite.x_param)
        axes[0][col].set_title(f"{gp} = {group}" if gp else suite.name)
    axes[0][0].set_ylabel(top_label)
    axes[1][0].set_ylabel("us per call (median)")
    axes[0][0].legend(loc="best", fontsize=8)
    md = run.metadata
    fig.suptitle(
        f"{suite.name} on {md.get('gpu')} (copy ceiling {md.get('copy_ceiling_gbps', 0):.0f} GB/s, "
        f"torch {md.get('versions', {}).get('torch')}, {str(md.get('date', ''))[:10]})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(run: Run, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(run)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv", out_dir / f"{stem}.png"]
    write_json(run, paths[0])
    write_csv(run, paths[1])
    write_plot(run, paths[2])
    return paths


def _cell(r: Result | None) -> str:
    if r is None:
        return ""
    if r.error is not None or r.median_us is None:
        return "[red]error[/]"
    if r.tflops is not None:
        return f"{r.median_us:.2f} ({r.tflops:.0f} TF)"
    if r.pct_of_ceiling is not None:
        pct = r.pct_of_ceiling
        return f"{r.median_us:.2f} ({pct:.0f}%)" if pct >= 10 else f"{r.median_us:.2f} ({pct:.1f}%)"
    return f"{r.median_us:.2f}"


def render_table(run: Run) -> Any:
    """One row per case: us per call and % of ceiling per provider, then ours' speedups."""
    from rich import box
    from rich.table import Table

    suite, md = run.suite, run.metadata
    index = {(r.case, r.provider): r for r in run.results}
    cases = list(dict.fromkeys(r.case for r in run.results))
    params = list(run.results[0].params) if run.results else []
    peers = [p for p in run.providers if p != suite.ours] if suite.ours in run.providers else []
    unit = "TFLOP/s" if suite.flops else f"% of the {md.get('copy_ceiling_gbps', 0):.0f} GB/s copy ceiling"
    table = Table(
        title=f"{suite.name} on {md.get('gpu')}: median us per call ({unit})",
        caption=f"vs X = X's time / {suite.ours}' time (>1: {suite.ours} faster)" if peers else None,
        box=box.SIMPLE_HEAD,
    )
    for p in params:
        table.add_column(p, justify="right")
    for p in run.providers:
        table.add_column(p, justify="right", style="bold" if p == suite.ours else None)
    for p in peers:
        table.add_column(f"vs {p}", justify="right")
    for case in cases:
        first = next(r for r in run.results if r.case == case)
        speedups = []
        for p in peers:
            r = index.get((case, p))
            speedups.append(f"{r.ours_speedup:.2f}x" if r and r.ours_speedup else "")
        table.add_row(
            *(str(first.params[k]) for k in params),
            *(_cell(index.get((case, p))) for p in run.providers),
            *speedups,
        )
    return table


# ---------------------------------------------------------------------------------------------
# CLI


def load_suites(package: str) -> list[Suite]:
    """Import ``<pkg>/benchmarks/suite.py`` by path (benchmarks/ is not a Python package) and
    call its ``build_suites()`` (several suites, each with its own result files) or
    ``build_suite()``."""
    from fused_llm.packages import package_dir

    path = package_dir(package) / "benchmarks" / "suite.py"
    if not path.is_file():
        raise FileNotFoundError(f"package {package!r} has no benchmark suite: expected {path}")
    module_name = "fused_llm_suite_" + re.sub(r"\W", "_", package)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in the suite look their module up here
    spec.loader.exec_module(module)
    if hasattr(module, "build_suites"):
        return list(module.build_suites())
    build = getattr(module, "build_suite", None)
    if build is None:
        raise AttributeError(f"{path} defines neither build_suites() nor build_suite() -> fused_llm_dev.bench.Suite")
    return [build()]


def parse_args(package: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"fused-llm bench {package}",
        description=f"Time {package} against its peers (CUDA-graph replay, L2-rotated inputs).",
    )
    parser.add_argument("--quick", action="store_true", help="the suite's few smoke-test cases")
    parser.add_argument("--suite", default=None, help="only this suite of a package that has several")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default <pkg>/benchmarks/results)")
    parser.add_argument("--providers", default=None, help="comma-separated subset, e.g. ours,torch_compile")
    parser.add_argument("--list", action="store_true", help="print cases and providers, time nothing")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PARAM=V[,V]",
        help="keep cases whose PARAM is one of the values, e.g. --only hidden=16384 (repeatable; "
        "to split a long suite over several runs, each writing its own files)",
    )
    parser.add_argument("--replays", type=int, default=Method.replays, help="timed replays per repeat")
    parser.add_argument("--repeats", type=int, default=Method.repeats, help="repeats")
    parser.add_argument("--budget", type=float, default=Method.budget_s, help="~timed seconds per point")
    return parser.parse_args(argv)


def select_cases(cases: list[Case], only: list[str]) -> tuple[list[Case], str]:
    """Apply ``--only`` filters; also return a file-name suffix naming them."""
    suffix = ""
    for spec in only:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ValueError(f"--only {spec!r}: expected PARAM=V[,V...]")
        if cases and key not in cases[0].params:
            raise ValueError(f"--only {spec!r}: cases have parameters {list(cases[0].params)}")
        try:
            wanted = {int(v) for v in values.split(",")}
        except ValueError:
            raise ValueError(f"--only {spec!r}: values must be integers") from None
        cases = [c for c in cases if c[key] in wanted]
        suffix += f"_{key}{'-'.join(str(v) for v in sorted(wanted))}"
    if not cases:
        raise ValueError(f"no case left after --only {' '.join(only)}")
    return cases, suffix


def select_providers(suite: Suite, spec: str | None) -> list[Provider]:
    if not spec:
        return list(suite.providers)
    by_name = {p.name: p for p in suite.providers}
    wanted = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}; {suite.name} has {list(by_name)}")
    return [by_name[name] for name in wanted]


def main(package: str, argv: list[str] | None = None) -> int:
    args = parse_args(package, argv)
    from rich.console import Console

    # Captured output (the device runner) would otherwise wrap the wide table at 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    try:
        suites = load_suites(package)
        if args.suite:
            names = [s.name for s in suites]
            suites = [s for s in suites if s.name == args.suite]
            if not suites:
                raise ValueError(f"--suite {args.suite!r}: {package} has {names}")
        plans = []
        for suite in suites:
            providers = select_providers(suite, args.providers)
            cases, suffix = select_cases(suite.quick_cases if args.quick else suite.cases, args.only)
            if args.providers:  # a subset must not overwrite the full run's files
                suffix += "_" + "-".join(p.name for p in providers)
            plans.append((suite, providers, cases, suffix))
    except (FileNotFoundError, ImportError, AttributeError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    method = Method(replays=args.replays, repeats=args.repeats, budget_s=args.budget)

    if args.list:
        for suite, providers, cases, _ in plans:
            console.print(f"{suite.name}: {suite.description}")
            console.print(f"cases ({len(cases)}): " + ", ".join(c.name for c in cases))
            for p in providers:
                console.print(f"  {p.name}{': ' + p.note if p.note else ''}")
        return 0
    if not torch.cuda.is_available():
        err.print(
            f"[red]error:[/] fused-llm bench needs a CUDA GPU (torch {torch.__version__} sees none); "
            "run it on the device machine"
        )
        return 2

    from fused_llm.packages import package_dir, repo_root

    ceiling = measure_copy_ceiling()
    console.print(f"copy ceiling (torch.mul, 2 GiB bf16, read+write): {ceiling:.0f} GB/s")
    floor_us = measure_launch_floor()
    console.print(f"launch floor (one-element torch.add, graph replay): {floor_us:.2f} us")
    status = 0
    for suite, providers, cases, suffix in plans:
        console.print(f"{suite.name}: {len(cases)} cases x {len(providers)} providers on {torch.cuda.get_device_name()}")
        try:
            run = run_suite(suite, cases, providers, ceiling, method)
        except RuntimeError as exc:  # a sticky CUDA error: nothing after it can be trusted
            err.print(f"[red]error:[/] {exc}")
            return 1
        run.metadata = collect_metadata(
            suite,
            ceiling,
            repo_root(),
            {"quick": args.quick, "file_suffix": suffix, "argv": list(argv or []), "timing": asdict(method),
             "launch_floor_us": floor_us},
        )
        console.print(render_table(run))
        for name, reason in run.skipped.items():
            console.print(f"[yellow]skipped {name}[/]: {reason}")
        out_dir = args.out or package_dir(package) / "benchmarks" / "results"
        for path in write_outputs(run, out_dir):
            console.print(f"wrote {path}")
        errors = [r for r in run.results if r.error is not None]
        if errors:
            console.print(f"[red]{len(errors)} measurement(s) failed[/] (see 'error' in the JSON)")
        # Peers failing is information; our own kernel failing (or missing) fails the command.
        if suite.ours in run.skipped or any(r.provider == suite.ours for r in errors):
            status = 1
    return status


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python -m fused_llm_dev.bench <package> [options]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
