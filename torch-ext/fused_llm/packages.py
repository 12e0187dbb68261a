"""Where the kernel packages live and how to load a local build of one.

Every consumer inside the project (tests, benchmarks, the demo, kernelize with
``source="local"``) loads a package the way a user does, through
``kernels.get_kernel("fused-llm/<name>", version=1)``; ``LOCAL_KERNELS`` redirects that call
to the package's fresh ``build/`` directory instead of the Hub.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from types import ModuleType

HUB_ORG = "fused-llm"
HUB_VERSION = 1


@lru_cache(maxsize=1)
def repo_root() -> Path:
    """The checkout holding the packages: ``$FUSED_LLM_ROOT``, else the nearest parent of the
    working directory, else of this file, whose ``build.toml`` names the ``fused-llm`` package."""
    env = os.environ.get("FUSED_LLM_ROOT")
    if env:
        return Path(env).resolve()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for candidate in (start, *start.parents):
            toml = candidate / "build.toml"
            if toml.is_file() and 'name = "fused-llm"' in toml.read_text():
                return candidate
    raise FileNotFoundError(
        "cannot find the fused-llm checkout (a build.toml with name = \"fused-llm\"); "
        "run from inside it or set FUSED_LLM_ROOT"
    )


def kernel_packages() -> list[str]:
    """Names of the kernel packages in the checkout (directories holding a build.toml)."""
    root = repo_root()
    return sorted(p.parent.name for p in root.glob("*/build.toml"))


def package_dir(name: str) -> Path:
    path = repo_root() / name
    if not (path / "build.toml").is_file():
        raise FileNotFoundError(
            f"package {name!r}: expected {path / 'build.toml'}; packages here: {kernel_packages()}"
        )
    return path


def hub_repo_id(name: str) -> str:
    return f"{HUB_ORG}/{name}"


def use_local_build(name: str) -> Path:
    """Point ``LOCAL_KERNELS`` for ``fused-llm/<name>`` at the package directory (whose
    ``build/`` holds the variants) and return that directory. An entry for the package that is
    already there is kept and its directory returned: a build elsewhere that the caller chose
    (an A/B of two builds of one package) must not be swapped for the checkout's in silence."""
    entries = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e]
    chosen = dict(e.split("=", 1) for e in entries if "=" in e).get(hub_repo_id(name))  # the last wins, as in kernels
    path = Path(chosen) if chosen else package_dir(name)
    if not (path / "build").is_dir():
        where = f"LOCAL_KERNELS names {path} for {hub_repo_id(name)}, which" if chosen else f"package {name!r}"
        raise FileNotFoundError(f"{where} has no build/ yet: run `fused-llm build {name}`")
    if not chosen:
        entries.append(f"{hub_repo_id(name)}={path}")
        os.environ["LOCAL_KERNELS"] = ":".join(entries)
    return path


def get_kernel(name: str, *, local: bool = True) -> ModuleType:
    """Load ``fused-llm/<name>`` through the ``kernels`` loader (a local build when ``local``)."""
    import kernels

    if local:
        use_local_build(name)
    return kernels.get_kernel(hub_repo_id(name), version=HUB_VERSION)
