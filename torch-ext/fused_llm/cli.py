"""The ``fused-llm`` command: build, check, benchmark and demonstrate the kernel packages."""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import abi, builder, packages, sync

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
                progress.console.print(
                    f"[green]built[/] {name} -> {result.variant_dir.relative_to(packages.repo_root())} "
                    f"({result.kernel_id}{', archs ' + ' '.join(result.archs) if result.archs else ''}) "
                    f"in {time.perf_counter() - t0:.1f}s"
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
    from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fused-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_build = sub.add_parser("build", help="build kernel packages into PKG/build/<variant>/")
    p_build.add_argument("packages", nargs="*", metavar="PKG", help="package names (default: all)")
    p_build.add_argument("--backend", default="auto", choices=["auto", *builder.BACKENDS])
    p_build.add_argument("--clean", action="store_true", help="remove PKG/build and PKG/.build-cache (object files) first")
    p_build.add_argument("--capabilities", help="comma-separated subset of cuda-capabilities, e.g. 8.0")
    p_build.add_argument("--check-cuda", action="store_true", help="only compile-check the framework-free .cu files with nvcc")

    p_abi = sub.add_parser("check-abi", help="run Hugging Face's ABI check (kernel-abi-check) on every built variant")
    p_abi.add_argument("packages", nargs="*", metavar="PKG", help="package names (default: all)")
    p_abi.add_argument("--manylinux", default="manylinux_2_28", help="manylinux policy (default: the Hub's, manylinux_2_28)")
    p_abi.add_argument("--python-abi", default="3.9", help="oldest CPython the abi3 .so must load in (default: 3.9)")

    p_hub = sub.add_parser("hub-repo", help="write each package's Hub-shaped repository (branch v1 from build/), optionally into a Hugging Face cache")
    p_hub.add_argument("packages", nargs="*", metavar="PKG", help="package names (default: all)")
    p_hub.add_argument("--out", required=True, help="directory for the repositories (OUT/PKG.git, bare Git)")
    p_hub.add_argument("--hf-cache", help="also lay branch v1 into this Hugging Face cache (HF_HUB_CACHE), as `hf download --repo-type kernel --revision v1` would")

    p_bench = sub.add_parser("bench", help="benchmark a package against its peers, or `e2e`: a kernelized model (GPU)")
    p_bench.add_argument("package", metavar="PKG")
    p_bench.add_argument("rest", nargs=argparse.REMAINDER, help="options for the harness (--quick, --out DIR, --providers a,b)")

    p_sync = sub.add_parser("sync", help="stamp the shared sources of common/ into the packages (common/manifest.toml)")
    p_sync.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stamped copy that is out of date")
    p_sync.add_argument("--prune", action="store_true", help="also delete stale stamped copies (the header, but no manifest entry)")

    p_targets = sub.add_parser(
        "check-targets", help="compile every Triton kernel for gfx942, sm80 and sm90 (no GPU needed)",
        description="Compile every Triton entry kernel, as its launcher would launch it, for gfx942, sm80 and sm90, "
        "and check each binary (see fused_llm.compile_targets).",
    )
    from . import compile_targets

    compile_targets.add_arguments(p_targets)

    p_demo = sub.add_parser("demo", help="build, kernelize a small Llama, compare with eager (and time it on a GPU)")
    p_demo.add_argument("--no-build", action="store_true", help="use the existing builds")

    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if args.check_cuda:
                return check_cuda(args.packages)
            caps = [c.strip() for c in args.capabilities.split(",") if c.strip()] if args.capabilities else None
            build_packages(args.packages, args.backend, clean=args.clean, capabilities=caps)
            return 0
        if args.command == "hub-repo":
            return hub_repo(args.packages, args.out, args.hf_cache)
        if args.command == "check-abi":
            return check_abi(args.packages, args.manylinux, args.python_abi)
        if args.command == "bench":
            if args.package == "e2e":
                from . import bench_e2e

                return bench_e2e.main(args.rest)
            from . import bench

            return bench.main(args.package, args.rest)
        if args.command == "sync":
            return sync_common(check=args.check, prune=args.prune)
        if args.command == "check-targets":
            return compile_targets.command(args)
        if args.command == "demo":
            from . import demo

            return demo.main(build=not args.no_build)
    except (builder.BuildError, sync.SyncError, FileNotFoundError, abi.AbiCheckUnavailable) as err:
        console.print(f"[red]error:[/] {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
