"""Running a suite: each provider checked against the reference on a small case, then every
case x provider timed; and the ``fused-llm bench PKG`` entry point (``main``)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType

import torch

from .report import Result, Run, collect_metadata, render_table, write_outputs
from .settings import IN_LAYER_BYTES, Method, add_arguments
from .suite import Case, Provider, Suite
from .timing import measure_copy_ceiling, measure_launch_floor, release_memory, time_alternated, time_us


def _one_line(exc: BaseException | str) -> str:
    # Multi-line messages (assert_close, CUDA errors) collapse into one line for tables/JSON.
    text = " ".join((exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}").split())
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
        release_memory()
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
    release_memory()
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


def _point(suite: Suite, case: Case, p: Provider) -> Result:
    return Result(case.name, dict(case.params), p.name, bytes=(p.bytes_moved or suite.bytes_moved)(case),
                  flops=suite.flops(case) if suite.flops else None)  # fmt: skip


def _timed(result: Result, t, ceiling_gbps: float) -> None:
    result.median_us, result.p20_us, result.p80_us = t.median_us, t.p20_us, t.p80_us
    result.calls_per_graph, result.samples = t.calls_per_graph, t.samples
    derive(result, ceiling_gbps)


def time_case(suite: Suite, case: Case, providers: list[Provider], ceiling_gbps: float, method: Method,
              log: Callable[[str], None]) -> list[Result]:  # fmt: skip
    """One case's results, a provider at a time (``time_us``) or, with ``method.alternate``, all
    of them in turns (``time_alternated``). A provider that fails is reported and gets an error
    row; a broken CUDA context stops the run."""
    results = [_point(suite, case, p) for p in providers]
    if method.alternate:
        makers = {p.name: functools.partial(p.make, case) for p in providers}
        try:
            timed, failed = time_alternated(makers, {r.provider: r.bytes for r in results}, method)
        except Exception as exc:  # noqa: BLE001 - report, skip this case, keep going
            timed, failed = {}, dict.fromkeys(makers, _one_line(exc))
            release_memory()
        for result in results:
            if result.provider in timed:
                _timed(result, timed[result.provider], ceiling_gbps)
            else:
                result.error = _one_line(failed.get(result.provider, "not timed"))
                log(f"[red]{case.name} {result.provider}[/]: {result.error}")
        if failed and not _device_ok():
            raise RuntimeError(f"CUDA context broken during {case.name}: {failed}")
        return results
    for p, result in zip(providers, results):
        try:
            _timed(result, time_us(functools.partial(p.make, case), result.bytes, method), ceiling_gbps)
        except Exception as exc:  # noqa: BLE001 - report, skip this point, keep going
            result.error = _one_line(exc)
            log(f"[red]{case.name} {p.name}[/]: {result.error}")
            release_memory()
            if not _device_ok():
                raise RuntimeError(f"CUDA context broken during {case.name} {p.name}") from exc
    return results


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
            progress.update(task, description=f"{suite.name} {case.name}")
            results += time_case(suite, case, active, ceiling_gbps, method, log)
            progress.advance(task, len(active))
    add_speedups(results, suite.ours)
    return Run(suite, [p.name for p in active], results, skipped)


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
        raise AttributeError(f"{path} defines neither build_suites() nor build_suite() -> fused_llm_dev.bench.suite.Suite")
    return [build()]


def parse_args(package: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"fused-llm bench {package}",
        description=f"Time {package} against its peers (CUDA-graph replay, L2-rotated inputs).",
    )
    add_arguments(parser)
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
    """``python -m fused_llm_dev.bench PKG [options]``: parse the options, then ``bench``."""
    return bench(package, parse_args(package, argv), argv)


def bench(package: str, args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Time ``package``'s suites with the options in ``args`` (settings.add_arguments);
    ``argv``, the options as given, is recorded in the result files."""
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
    method = Method(replays=args.replays, repeats=args.repeats, budget_s=args.budget,
                    predecessor_bytes=IN_LAYER_BYTES if args.in_layer else 0, alternate=args.alternate)  # fmt: skip
    tail = ("_in-layer" if args.in_layer else "") + ("_alternated" if args.alternate else "")
    plans = [(suite, providers, cases, suffix + tail) for suite, providers, cases, suffix in plans]

    if args.list:
        for suite, providers, cases, _ in plans:
            console.print(f"{suite.name}: {suite.description}")
            console.print(f"cases ({len(cases)}): " + ", ".join(c.name for c in cases))
            for p in providers:
                console.print(f"  {p.name}{': ' + p.note if p.note else ''}")
        return 0
    if not torch.cuda.is_available():
        err.print(
            f"[red]error:[/] fused-llm bench times kernels on a CUDA GPU, and torch {torch.__version__} sees "
            "none here; run it on a machine with an NVIDIA GPU and a CUDA build of torch (fused-llm bench "
            f"{package} --list shows what it would time)"
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
