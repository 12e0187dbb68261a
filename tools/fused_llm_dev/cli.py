"""The ``fused-llm`` command: build, check, benchmark and demonstrate the kernel packages."""

from __future__ import annotations

import argparse
import sys

from . import abi, builder, commands, sync


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
        "and check each binary (see fused_llm_dev.compile_targets).",
    )
    from . import compile_targets

    compile_targets.add_arguments(p_targets)

    p_demo = sub.add_parser("demo", help="build, kernelize a small Llama, compare with eager (and time it on a GPU)")
    p_demo.add_argument("--no-build", action="store_true", help="use the existing builds")

    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if args.check_cuda:
                return commands.check_cuda(args.packages)
            caps = [c.strip() for c in args.capabilities.split(",") if c.strip()] if args.capabilities else None
            commands.build_packages(args.packages, args.backend, clean=args.clean, capabilities=caps)
            return 0
        if args.command == "hub-repo":
            return commands.hub_repo(args.packages, args.out, args.hf_cache)
        if args.command == "check-abi":
            return commands.check_abi(args.packages, args.manylinux, args.python_abi)
        if args.command == "bench":
            if args.package == "e2e":
                from .bench import e2e

                return e2e.main(args.rest)
            from .bench import run

            return run.main(args.package, args.rest)
        if args.command == "sync":
            return commands.sync_common(check=args.check, prune=args.prune)
        if args.command == "check-targets":
            return compile_targets.command(args)
        if args.command == "demo":
            from . import demo

            return demo.main(build=not args.no_build)
    except (builder.BuildError, sync.SyncError, FileNotFoundError, abi.AbiCheckUnavailable) as err:
        commands.console.print(f"[red]error:[/] {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
