"""What the ``fused-llm`` subcommands do, with progress output (``cli`` parses the arguments)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fused_llm import packages

from . import abi, builder, sync

console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)


def build_packages(names: list[str], backend: str = "auto", *, clean: bool = False, capabilities: list[str] | None = None) -> list[builder.BuildResult]:
    """Build ``names`` (all packages when empty) with a progress bar per package."""
    names = names or packages.kernel_packages()
    results = []
    with _progress() as progress:
        for name in names:
            task = progress.add_task(f"build {name}", total=None)

            def on_progress(done: int, total: int, task=task) -> None:
                progress.update(task, completed=done, total=total)

            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", builder.BuildWarning)
                built = builder.build_package(packages.package_dir(name), backend, clean=clean, capabilities=capabilities, on_progress=on_progress)
            for w in caught:
                if issubclass(w.category, builder.BuildWarning):
                    progress.console.print(f"[yellow]warning:[/] {w.message}")
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            for result in built:
                results.append(result)
                where = result.variant_dir.relative_to(packages.repo_root())
                archs = f", archs {' '.join(result.archs)}" if result.archs else ""
                if result.up_to_date:
                    progress.console.print(f"up to date: {name} -> {where} ({result.kernel_id}{archs})")
                else:
                    progress.console.print(
                        f"[green]built[/] {name} -> {where} ({result.kernel_id}{archs}) in {time.perf_counter() - t0:.1f}s"
                    )
            progress.update(task, completed=progress.tasks[task].total or 1, total=progress.tasks[task].total or 1)
    return results


def check_cuda(names: list[str]) -> int:
    dirs = [packages.package_dir(n) for n in (names or packages.kernel_packages())]
    checks = builder.cuda_checks(dirs)
    with _progress() as progress:
        task = progress.add_task("nvcc check", total=len(checks))

        def on_done(check: builder.CudaCheck, error: str | None) -> None:
            status = "[green]ok[/]" if error is None else "[red]FAILED[/]"
            progress.console.print(f"{status} {check.package}: {check.source.name} sm_{check.capability.replace('.', '')}")
            progress.advance(task)

        failures = builder.check_cuda(dirs, on_done=on_done)
    for check, error in failures:
        console.print(f"[red]{check.source} (capability {check.capability}):[/]\n{error}")
    return 1 if failures else 0


def sync_common(check: bool, prune: bool = False) -> int:
    root = packages.repo_root()
    if check:
        problems = sync.check(root)
        for problem in problems:
            console.print(f"[red]out of sync:[/] {problem.describe(root)}", soft_wrap=True)
        if not problems:
            console.print(f"[green]in sync:[/] {len(sync.load_manifest(root))} stamped copies match common/")
        return 1 if problems else 0
    written, stale = sync.sync(root, prune=prune)
    for path in written:
        console.print(f"[green]stamped[/] {path.relative_to(root)}", soft_wrap=True)
    for path in stale:
        if prune:
            console.print(f"[yellow]removed stale[/] {path.relative_to(root)}", soft_wrap=True)
        else:
            console.print(f"[yellow]stale:[/] {path.relative_to(root)} carries the generated-file header but "
                          f"common/manifest.toml does not list it: add its entry, or rerun with --prune", soft_wrap=True)
    if not written and not stale:
        console.print("nothing to do: every stamped copy matches common/")
    return 1 if stale and not prune else 0


def check_abi(names: list[str], manylinux: str, python_abi: str) -> int:
    """Hugging Face's ABI check (kernel-abi-check) on every variant in PKG/build/."""
    failed = 0
    for name in names or packages.kernel_packages():
        for result in abi.check_package(packages.package_dir(name), manylinux, python_abi):
            color = "green" if result.ok else "red"
            console.print(f"[{color}]{'ok' if result.ok else 'FAILED'}[/] {result.summary()}", highlight=False)
            failed += not result.ok
    return 1 if failed else 0


def hub_repo(names: list[str], out: str, hf_cache: str | None) -> int:
    """Write each package's Hub-shaped repository (what kernel-builder upload would make of
    PKG/build/) under OUT, and optionally lay its version branch into a Hugging Face cache."""
    from . import hub

    for name in names or packages.kernel_packages():
        repo = hub.write_hub_repo(packages.package_dir(name), Path(out) / f"{name}.git")
        plan = hub.upload_plan(packages.package_dir(name))
        console.print(f"[green]wrote[/] {repo.git_dir} ({repo.repo_id}): branch {repo.branch} {repo.commit()[:12]}, "
                      f"main {repo.commit(hub.MAIN)[:12]}; variants {', '.join(plan.variants)}", highlight=False)
        if plan.missing_backends:
            console.print(f"  [yellow]not a complete upload:[/] build.toml claims {', '.join(plan.missing_backends)} "
                          f"but build/ has no variant for it (build those on a machine that can, into {name}/build/)", highlight=False)
        if hf_cache:
            snapshot = hub.install_in_hf_cache(repo, Path(hf_cache), repo_type="kernel")
            # `kernels benchmark` (kernels 0.17.2) downloads the repo as a model repo.
            hub.install_in_hf_cache(repo, Path(hf_cache), repo_type="model")
            console.print(f"  in the cache: {snapshot}", highlight=False)
    return 0


def _dist_version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gpu_lines() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        build = "CPU" if torch.version.cuda is None and torch.version.hip is None else "GPU"
        return [f"GPU: none visible to torch ({build} build of torch)"]
    lines = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        arch = getattr(props, "gcnArchName", "") if torch.version.hip else f"sm_{props.major}{props.minor}"
        lines.append(f"GPU {i}: {props.name} ({arch}, {props.multi_processor_count} SMs / CUs, "
                     f"{props.total_memory / 2**30:.1f} GiB)")
    return lines


def _loads_here(build_dir: Path) -> str | None:
    """The variant of ``build_dir`` that kernels' loader picks for the running torch, if any."""
    from kernels.variants import get_variants_local, resolve_variant

    try:
        variant, _ = resolve_variant(get_variants_local(build_dir))
    except Exception:  # noqa: BLE001 - an unreadable build/ is reported as loading nothing
        return None
    return variant.variant_str if variant is not None else None


def info() -> int:
    """What this checkout and machine hold: versions, the GPU, and each package's built variants
    (marking the one ``kernels.get_kernel`` loads here)."""
    import platform

    import torch

    from fused_llm import __version__

    toolkit = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {torch.version.hip}" if torch.version.hip else "CPU"
    print(f"fused-llm {__version__}")
    print(f"python {platform.python_version()} ({platform.machine()}, {platform.system()})")
    print(f"torch {torch.__version__} ({toolkit}), triton {_dist_version('triton')}, "
          f"transformers {_dist_version('transformers')}, kernels {_dist_version('kernels')}")
    for line in _gpu_lines():
        print(line)
    try:
        nvcc = builder.find_nvcc()
    except builder.BuildError:
        nvcc = "not found (CUDA builds and build --check-cuda need it)"
    print(f"nvcc: {nvcc}")
    backend = builder.torch_backend()
    print(f"a build here writes: {builder.arch_variant_name(backend)} (arch packages), torch-<backend> (noarch)")
    try:
        root = packages.repo_root()
    except FileNotFoundError as err:
        print(f"packages: none ({err})")
        return 0
    print(f"packages in {root}:")
    names = packages.kernel_packages()
    width = max(map(len, names), default=0)
    for name in names:
        config = builder.load_config(packages.package_dir(name))
        build_dir = packages.package_dir(name) / "build"
        built = sorted(d.name for d in build_dir.iterdir() if (d / "metadata.json").is_file()) if build_dir.is_dir() else []
        here = _loads_here(build_dir) if built else None
        variants = ", ".join(f"{v} (loads here)" if v == here else v for v in built) or "none yet (fused-llm build)"
        kind = "noarch" if config.noarch else "arch"
        print(f"  {name:<{width}}  v{config.version} {kind}, backends {' '.join(config.backends)}; built: {variants}")
        if built and here is None:
            print(f"  {'':<{width}}  no built variant loads with this torch: fused-llm build {name}")
    return 0
