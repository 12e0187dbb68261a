"""`fused-llm sync`: the stamped copies of common/ match their sources (CI fails on drift), and
the tool finds every kind of drift it promises to find."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fused_llm import packages
from fused_llm_dev import sync

ROOT = packages.repo_root()


@pytest.mark.kernels_ci
def test_stamped_copies_match_common():
    problems = sync.check(ROOT)
    assert not problems, "run `fused-llm sync`:\n" + "\n".join(p.describe(ROOT) for p in problems)


def test_every_package_with_compiled_code_uses_the_shared_headers():
    """The C++ packages include the stamped headers rather than carrying their own copies."""
    stamps = sync.load_manifest(ROOT)
    for pkg in ("rmsnorm-fp8", "swiglu-fp8"):
        stamped = {s.dest.name for s in stamps if (ROOT / pkg / "csrc" / "common") in s.dest.parents}
        assert {"numerics.h", "dtype.cuh", "vec.cuh", "fp8.cuh", "reduce.cuh", "launch.h"} <= stamped
        assert not (ROOT / pkg / "csrc" / "numerics.h").exists(), "the hand-kept copy is gone"
    for pkg in ("rmsnorm-fp8", "swiglu-fp8", "gated-mlp"):
        binding = (ROOT / pkg / "torch-ext" / "torch_binding.cpp").read_text()
        assert '#include "common/binding_utils.h"' in binding


# ---------------------------------------------------------------------------------------
# The tool on a small checkout of its own
# ---------------------------------------------------------------------------------------


def make_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "common" / "csrc").mkdir(parents=True)
    (root / "common" / "python").mkdir()
    (root / "common" / "csrc" / "util.h").write_text("#pragma once\ninline int one() { return 1; }\n")
    (root / "common" / "python" / "helpers.py").write_text('"""Helpers."""\n\nX = 1\n')
    (root / "common" / "manifest.toml").write_text(
        '[[stamp]]\nfiles = ["csrc/util.h"]\ninto = ["pkg-a/csrc/common", "pkg-b/csrc/common"]\n\n'
        '[[stamp]]\nfiles = ["python/helpers.py"]\nto = ["pkg-a/tests/pkg_a_helpers.py"]\n'
    )
    pkg = root / "pkg-a"
    (pkg / "csrc").mkdir(parents=True)
    (pkg / "csrc" / "kernel.cpp").write_text('#include "common/util.h"\nint two() { return one() + one(); }\n')
    (pkg / "build.toml").write_text(
        '[kernel.k]\nbackend = "cpu"\ndepends = ["torch"]\nsrc = ["csrc/kernel.cpp", "csrc/common/util.h"]\n'
    )
    return root


def described(root: Path) -> list[str]:
    return [p.describe(root) for p in sync.check(root)]


def test_sync_stamps_with_a_header_in_each_comment_syntax(tmp_path):
    root = make_checkout(tmp_path)
    written, removed = sync.sync(root)
    assert len(written) == 3 and not removed
    header_c = "// generated from common/csrc/util.h by `fused-llm sync`, do not edit\n"
    assert (root / "pkg-b/csrc/common/util.h").read_text() == header_c + "#pragma once\ninline int one() { return 1; }\n"
    py = (root / "pkg-a/tests/pkg_a_helpers.py").read_text()
    assert py.startswith("# generated from common/python/helpers.py by `fused-llm sync`, do not edit\n\"\"\"Helpers.")
    assert described(root) == []
    assert sync.sync(root) == ([], []), "a second run changes nothing"


def test_check_names_missing_changed_stale_and_unstamped_files(tmp_path):
    root = make_checkout(tmp_path)
    assert any("pkg-a/csrc/common/util.h: missing" in d for d in described(root))
    sync.sync(root)
    # A hand edit of a stamped copy.
    copy = root / "pkg-b/csrc/common/util.h"
    copy.write_text(copy.read_text() + "int hand_edit();\n")
    # A copy the manifest no longer names (stamped from a file since removed from it).
    stale = root / "pkg-b/csrc/common/old.h"
    stale.write_text("// generated from common/csrc/old.h by `fused-llm sync`, do not edit\n")
    # A shared file nobody stamps.
    (root / "common/csrc/orphan.h").write_text("#pragma once\n")
    problems = described(root)
    assert "pkg-b/csrc/common/util.h: differs from common/csrc/util.h: edit common/csrc/util.h and run `fused-llm sync`" in problems
    assert any(d.startswith("pkg-b/csrc/common/old.h: stale stamped copy") for d in problems)
    assert any(d.startswith("common/csrc/orphan.h: not stamped anywhere") for d in problems)
    assert len(problems) == 3
    written, found = sync.sync(root)
    assert written == [copy] and found == [stale] and stale.exists(), "stale copies are only named"
    assert sync.sync(root, prune=True) == ([], [stale]) and not stale.exists()
    (root / "common/csrc/orphan.h").unlink()
    assert described(root) == []


def test_check_wants_stamped_headers_in_the_sections_src(tmp_path):
    root = make_checkout(tmp_path)
    sync.sync(root)
    toml = root / "pkg-a/build.toml"
    toml.write_text(toml.read_text().replace(', "csrc/common/util.h"', ""))
    assert described(root) == ["pkg-a/build.toml: [kernel.k] compiles the stamped csrc/common/util.h but its src does not list it"]


@pytest.mark.parametrize(
    "manifest, message",
    [
        ('[[stamp]]\nfiles = ["csrc/util.h"]\n', "exactly one of `into`"),
        ('[[stamp]]\nfiles = ["csrc/nope.h"]\ninto = ["a"]\n', "common/csrc/nope.h does not exist"),
        ('[[stamp]]\nfiles = ["csrc/util.h"]\nto = ["a/util.cpp"]\n', "must keep the suffix"),
        ('[[stamp]]\nfiles = ["csrc/util.h"]\ninto = ["a"]\nwhere = 1\n', "unknown key"),
    ],
    ids=["no-destination", "missing-source", "suffix", "unknown-key"],
)
def test_manifest_errors_name_the_problem(tmp_path, manifest, message):
    root = make_checkout(tmp_path)
    (root / "common/manifest.toml").write_text(manifest)
    with pytest.raises(sync.SyncError, match=message):
        sync.load_manifest(root)


def test_cli_check_exit_status(tmp_path):
    root = make_checkout(tmp_path)
    (root / "build.toml").write_text('[general]\nname = "fused-llm"\n')  # how repo_root() finds a checkout
    env = {**os.environ, "FUSED_LLM_ROOT": str(root), "PYTHONPATH": os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools")])}
    cli = [sys.executable, "-m", "fused_llm_dev.cli", "sync"]
    proc = subprocess.run([*cli, "--check"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 1 and "pkg-a/csrc/common/util.h: missing" in proc.stderr
    assert subprocess.run(cli, capture_output=True, text=True, env=env, check=False).returncode == 0
    proc = subprocess.run([*cli, "--check"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------
# A package's tests run with only that package on the path
# ---------------------------------------------------------------------------------------


def test_package_tests_run_without_fused_llm(tmp_path):
    """Copy a built package out of the checkout, hide fused_llm and fused_llm_dev, and run its
    kernels_ci tests from its own directory the way kernel-builder's ci-test does."""
    name = "rmsnorm-fp8"
    src = packages.package_dir(name)
    if not (src / "build").is_dir():
        pytest.skip(f"{name} is not built")
    pkg = tmp_path / name
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns(".build-cache", "__pycache__", "results", "benchmarks"))
    blocker = tmp_path / "blocker"
    for hidden in ("fused_llm", "fused_llm_dev"):
        (blocker / hidden).mkdir(parents=True)
        (blocker / hidden / "__init__.py").write_text(f"raise ImportError('a package test imported {hidden}')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FUSED_LLM_ROOT")}
    # Other path entries stay (a machine may provide kernels / torch through PYTHONPATH); only
    # the checkout's package roots go.
    ours = {(ROOT / "torch-ext").resolve(), (ROOT / "tools").resolve()}
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() not in ours]
    env.update(PYTHONPATH=os.pathsep.join([str(blocker), *kept]), LOCAL_KERNELS=f"{packages.hub_repo_id(name)}={pkg}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-m", "kernels_ci", "-k", "opcheck or bad_input", "-q",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning"],
        cwd=pkg, capture_output=True, text=True, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
