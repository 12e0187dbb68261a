"""The checkout's two Python packages keep to their jobs: ``fused_llm`` (torch-ext/fused_llm/,
the Hub integration package) holds what a user imports and loads as a noarch kernel through
``kernels``; ``fused_llm_dev`` (tools/fused_llm_dev/) holds the tooling; no module imports
itself back through another (an import cycle), and no kernel package imports either of them."""

from __future__ import annotations

import ast
import copy
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from fused_llm import packages
from fused_llm_dev import builder
from fused_llm_dev.models import tiny_llama
from fused_llm_dev.testing import device

ROOT = packages.repo_root()
PACKAGES = {"fused_llm": ROOT / "torch-ext" / "fused_llm", "fused_llm_dev": ROOT / "tools" / "fused_llm_dev"}
# What the integration package may import: the standard library, torch, the Hub's loader,
# transformers (the models it kernelizes) and safetensors (4-bit checkpoints; a transformers
# dependency), and its own modules.
INTEGRATION_IMPORTS = {"torch", "kernels", "transformers", "safetensors"}
# The integration package's modules: kernelize and the layer mapping, the fused decoder layer,
# transformers' KernelConfig, where the kernel packages are, the 4-bit model paths and the fused
# 4-bit decoder layer, the FP8 model paths and the fused FP8 decoder layer.
INTEGRATION_MODULES = {"__init__", "integration", "decoder", "skinny", "transformers_config", "packages", "w4a16",
                       "decoder_w4a16", "fp8", "decoder_fp8", "generation", "captured_decode"}
# kernelize swaps transformers' rotary function process-wide; conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


def _module_name(package: str, path: Path) -> str:
    rel = path.relative_to(PACKAGES[package]).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(pkg, p): p for pkg, d in PACKAGES.items() for p in sorted(d.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """Every import of ``path`` (module level or inside functions) as (module, names imported
    from it), relative imports resolved against ``name``."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, [alias.name for alias in node.names]))
    return found


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which of ``modules`` each one imports. ``from pkg import mod`` counts as importing
    pkg.mod; the implicit import of a module's parent package does not count (every submodule
    would otherwise form a cycle with an __init__ that imports it)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imports(name, path):
            if module in modules and module != name.rsplit(".", 1)[0]:
                targets.add(module)
            targets.update(f"{module}.{n}" for n in names if f"{module}.{n}" in modules)
        edges[name] = targets - {name}
    return edges


def test_integration_package_holds_only_what_users_import():
    files = {p.stem for p in PACKAGES["fused_llm"].glob("*.py")}
    assert files == INTEGRATION_MODULES, "tooling belongs in tools/fused_llm_dev/"
    assert not [p for p in PACKAGES["fused_llm"].iterdir() if p.is_dir() and p.name != "__pycache__"]
    for path in PACKAGES["fused_llm"].glob("*.py"):
        name = _module_name("fused_llm", path)
        for module, _ in _imports(name, path):
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top in INTEGRATION_IMPORTS or top == "fused_llm", (
                f"{path.relative_to(ROOT)} imports {module}: the integration package ships to the Hub, "
                f"where only the standard library, {sorted(INTEGRATION_IMPORTS)} and itself exist"
            )


def test_no_import_cycle():
    edges = _edges(_modules())
    assert edges["fused_llm_dev.demo"] and edges["fused_llm_dev.cli"], "the scan sees imports"
    done: set[str] = set()
    cycles = []

    def visit(path: list[str]) -> None:  # depth first; path[-1] is the module visited
        for nxt in sorted(edges[path[-1]]):
            if nxt in path:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in done:
                visit([*path, nxt])
        done.add(path[-1])

    for node in sorted(edges):
        if node not in done:
            visit([node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert not any(t.startswith("fused_llm_dev") for n, ts in edges.items() if n.startswith("fused_llm.") for t in ts)


def test_kernel_packages_import_neither_python_package():
    """What ships with a kernel package (its Python package, tests and Hub benchmarks) runs
    with that package alone; only the checkout's benchmark suites and tuning scripts use the
    harness in fused_llm_dev."""
    for name in packages.kernel_packages():
        pkg = packages.package_dir(name)
        shipped = [*(pkg / "torch-ext").rglob("*.py"), *(pkg / "tests").rglob("*.py"), *(pkg / "benchmarks").glob("benchmark*.py")]
        assert shipped
        for path in shipped:
            if "build" in path.relative_to(pkg).parts:
                continue
            for module, _ in _imports("x", path):
                assert module.split(".")[0] not in PACKAGES, f"{path.relative_to(ROOT)} imports {module}"


def test_pyproject_installs_both_packages():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {k: ROOT / v for k, v in setuptools["package-dir"].items()} == PACKAGES
    found = {_module_name(pkg, p) for pkg, d in PACKAGES.items() for p in d.rglob("__init__.py")}
    assert set(setuptools["packages"]) == found, "list every (sub)package: a wheel holds only those"


@pytest.mark.kernels_ci
def test_integration_package_loads_as_a_noarch_kernel(tmp_path, monkeypatch):
    """The root build.toml's [torch-noarch] package, built as kernel-builder would and loaded
    through kernels.get_kernel (LOCAL_KERNELS), holds the integration modules alone and
    kernelizes a model as fused_llm does."""
    import kernels

    import fused_llm

    root = tmp_path / "fused-llm"
    root.mkdir()
    shutil.copy(ROOT / "build.toml", root / "build.toml")
    shutil.copytree(PACKAGES["fused_llm"], root / "torch-ext" / "fused_llm", ignore=shutil.ignore_patterns("__pycache__"))
    results = builder.build_package(root)
    assert sorted(r.variant_dir.name for r in results) == ["torch-cpu", "torch-cuda", "torch-rocm"]
    for r in results:
        assert {p.stem for p in r.variant_dir.glob("*.py")} == INTEGRATION_MODULES | {"_ops"}
    repo_id = packages.hub_repo_id("fused-llm")
    monkeypatch.setenv("LOCAL_KERNELS", f"{repo_id}={root}:" + os.environ.get("LOCAL_KERNELS", ""))
    hub = kernels.get_kernel(repo_id, version=packages.HUB_VERSION)
    assert hub.__name__.startswith("_fused_llm_") and Path(hub.__file__).parent.parent == root / "build"
    assert set(hub.__all__) == set(fused_llm.__all__)
    assert not [m for m in sys.modules if m.startswith(f"{hub.__name__}.") and m.rsplit(".", 1)[1] not in INTEGRATION_MODULES]

    dev = device()
    eager = tiny_llama(dev)
    tokens = torch.randint(0, eager.config.vocab_size, (2, 11), device=dev)
    with torch.inference_mode():
        ref = eager(tokens).logits
    model = copy.deepcopy(eager)
    report = hub.kernelize(model)
    assert type(report).__module__.startswith(hub.__name__)
    assert [s[:2] for s in report.swapped] == [s[:2] for s in fused_llm.kernelize(copy.deepcopy(eager)).swapped]
    with torch.inference_mode():
        torch.testing.assert_close(model(tokens).logits, ref, rtol=1e-4, atol=1e-4)
