"""The ``fused-llm`` command. This module only parses: each subcommand imports what it runs
(torch, rich, transformers) when it runs, so ``fused-llm --help`` and ``fused-llm COMMAND
--help`` answer at once."""

from __future__ import annotations

import argparse
import sys

from fused_llm import __version__

from . import builder, compile_targets
from .bench import settings as bench_settings

DESCRIPTION = (
    "Build, check, benchmark and demonstrate the fused-llm kernel packages of this checkout. "
    "Start with 'fused-llm info' (what is installed and built here) and 'fused-llm demo'."
)


def _add_packages(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("packages", nargs="*", metavar="PKG", help="package names (default: all)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fused-llm", description=DESCRIPTION, epilog="'fused-llm COMMAND --help' lists a command's options."
    )
    parser.add_argument("--version", action="version", version=f"fused-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser(
        "info", help="versions, the GPU, and each package's built variants",
        description="Print the versions of python, torch, triton, transformers and kernels, the GPU torch sees, "
        "nvcc, and each package of the checkout with its built variants (the one the kernels loader "
        "picks for this torch is marked).",
    )

    p_build = sub.add_parser(
        "build", help="build kernel packages into PKG/build/<variant>/",
        description="Build each package for the running torch, as kernel-builder lays out a variant: "
        "PKG/build/<variant>/ with the Python files, _ops.py, the .so and metadata.json. A package whose "
        "variant is already current is reported as up to date.",
    )
    _add_packages(p_build)
    p_build.add_argument("--backend", default="auto", choices=["auto", *builder.BACKENDS],
                         help="auto: the running torch's backend (default)")
    p_build.add_argument("--clean", action="store_true", help="remove PKG/build and PKG/.build-cache (object files) first")
    p_build.add_argument("--capabilities", help="comma-separated subset of cuda-capabilities, e.g. 8.0")
    p_build.add_argument("--check-cuda", action="store_true", help="only compile-check the framework-free .cu files with nvcc")

    p_demo = sub.add_parser(
        "demo", help="build, kernelize a small Llama, compare with eager (and time it on a GPU)",
        description="Build every package, kernelize a small random-weight Llama, and print what was swapped "
        "and the logits against eager; on a GPU also prefill and decode tokens/s.",
    )
    p_demo.add_argument("--no-build", action="store_true", help="use the existing builds")

    p_bench = sub.add_parser(
        "bench", help="time a package against its peers on a CUDA GPU (or 'bench e2e': a kernelized model)",
        description="Time PKG's benchmark suite (PKG/benchmarks/suite.py) against torch eager, torch.compile "
        "and its peers: CUDA-graph replay, inputs rotated past the L2 cache, % of a measured copy ceiling. "
        "Writes JSON, CSV and a PNG to PKG/benchmarks/results/. Needs a CUDA GPU (--list does not).",
        epilog="'fused-llm bench e2e [options]' times a kernelized transformers model against the original "
        "instead; 'fused-llm bench e2e --help' lists its options.",
    )
    p_bench.add_argument("package", metavar="PKG", help="a package name, e.g. rmsnorm-fp8")
    bench_settings.add_arguments(p_bench)

    p_sync = sub.add_parser(
        "sync", help="stamp the shared sources of common/ into the packages (common/manifest.toml)",
        description="Copy each file of common/ to where common/manifest.toml says, as a generated file.",
    )
    p_sync.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stamped copy that is out of date")
    p_sync.add_argument("--prune", action="store_true", help="also delete stale stamped copies (the header, but no manifest entry)")

    p_targets = sub.add_parser(
        "check-targets", help="compile every Triton kernel for gfx942, sm80 and sm90 (no GPU needed)",
        description="Compile every Triton entry kernel, as its launcher would launch it, for gfx942, sm80 and sm90, "
        "and check each binary (see fused_llm_dev.compile_targets).",
    )
    compile_targets.add_arguments(p_targets)

    p_abi = sub.add_parser(
        "check-abi", help="run Hugging Face's ABI check (kernel-abi-check) on every built variant",
        description="Check each built variant's .so against the Hub's rules (manylinux, abi3) with kernel-abi-check.",
    )
    _add_packages(p_abi)
    p_abi.add_argument("--manylinux", default="manylinux_2_28", help="manylinux policy (default: the Hub's, manylinux_2_28)")
    p_abi.add_argument("--python-abi", default="3.9", help="oldest CPython the abi3 .so must load in (default: 3.9)")

    p_hub = sub.add_parser(
        "hub-repo", help="write each package's Hub-shaped repository, optionally into a Hugging Face cache",
        description="Write each package's Hub repository as kernel-builder's upload would make it from "
        "PKG/build/ (bare Git, branch v1).",
    )
    _add_packages(p_hub)
    p_hub.add_argument("--out", required=True, help="directory for the repositories (OUT/PKG.git, bare Git)")
    p_hub.add_argument("--hf-cache", help="also lay branch v1 into this Hugging Face cache (HF_HUB_CACHE), as "
                       "'hf download --repo-type kernel --revision v1' would")
    return parser


def _bench_options(argv: list[str], package: str) -> list[str]:
    """The options given after ``bench`` (the package name taken out), for the result files."""
    options = argv[argv.index("bench") + 1:]
    options.remove(package)
    return options


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "e2e"] and "--w4a16" in argv[2:]:
        from .bench import e2e_w4a16  # the 4-bit comparison: its own options and report

        return e2e_w4a16.main(argv[2:])
    if argv[:2] == ["bench", "e2e"] and "--skinny" in argv[2:]:
        from .bench import e2e_skinny  # with and without skinny-gemm's projections: its own options and report

        return e2e_skinny.main(argv[2:])
    if argv[:2] == ["bench", "e2e"] and any(a == "--fp8" or a.startswith("--fp8=") for a in argv[2:]):
        from .bench import e2e_fp8  # an FP8 model against its peers: its own stages and options

        return e2e_fp8.main(argv[2:])
    if argv[:2] == ["bench", "e2e"]:  # its own options (and --help), parsed by bench.e2e
        from .bench import e2e

        return e2e.main(argv[2:])
    args = build_parser().parse_args(argv)

    from . import abi, commands, sync

    try:
        if args.command == "info":
            return commands.info()
        if args.command == "build":
            if args.check_cuda:
                return commands.check_cuda(args.packages)
            caps = [c.strip() for c in args.capabilities.split(",") if c.strip()] if args.capabilities else None
            commands.build_packages(args.packages, args.backend, clean=args.clean, capabilities=caps)
            return 0
        if args.command == "demo":
            from . import demo

            return demo.main(build=not args.no_build)
        if args.command == "bench":
            from .bench import run

            return run.bench(args.package, args, _bench_options(argv, args.package))
        if args.command == "sync":
            return commands.sync_common(check=args.check, prune=args.prune)
        if args.command == "check-targets":
            return compile_targets.command(args)
        if args.command == "check-abi":
            return commands.check_abi(args.packages, args.manylinux, args.python_abi)
        if args.command == "hub-repo":
            return commands.hub_repo(args.packages, args.out, args.hf_cache)
    except (builder.BuildError, sync.SyncError, FileNotFoundError, abi.AbiCheckUnavailable) as err:
        commands.console.print(f"[red]error:[/] {err}")
        return 2
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
