"""The local builder: variant naming, metadata, ids, capabilities and its error messages."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernels.variants import parse_variant, resolve_variant
from kernels_data import Digest, DigestAlgorithm, Metadata

from fused_llm import packages
from fused_llm_dev import builder

ROOT = packages.repo_root()
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").is_file()


def built_variant(name: str = "rmsnorm-fp8") -> Path:
    backend = builder.torch_backend()
    return packages.package_dir(name) / "build" / builder.arch_variant_name(backend)


def copy_package(tmp_path: Path, name: str = "rmsnorm-fp8") -> Path:
    dest = tmp_path / name
    shutil.copytree(packages.package_dir(name), dest, ignore=shutil.ignore_patterns("build", ".build-cache", "__pycache__", "results"))
    return dest


# ---------------------------------------------------------------------------------------
# Naming
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_variant_name_is_what_the_loader_selects():
    name = builder.arch_variant_name(builder.torch_backend())
    major, minor = torch.__version__.split(".")[:2]
    assert name.startswith(f"torch{major}{minor}-cxx11-")
    if builder.torch_backend() == "cpu" and platform.machine() == "x86_64" and sys.platform == "linux":
        assert name == f"torch{major}{minor}-cxx11-cpu-x86_64-linux"
    resolved, trace = resolve_variant([parse_variant(name)])
    assert resolved is not None and resolved.variant_str == name, trace


def test_cuda_variant_name_format(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    name = builder.arch_variant_name("cuda")
    assert "-cu130-" in name
    parse_variant(name)


def test_unique_id_follows_the_sources(tmp_path):
    pkg = copy_package(tmp_path)
    config = builder.load_config(pkg)
    first = builder.unique_id(config, "cpu")
    assert first.startswith("_rmsnorm_fp8_cpu_") and len(first.rsplit("_", 1)[1]) == 7
    assert builder.unique_id(config, "cpu") == first, "same sources, same id"
    assert builder.unique_id(config, "cuda") != first, "backends get their own namespace"
    assert builder.unique_id(config, "cuda", ["8.0+PTX"]) != builder.unique_id(config, "cuda", ["8.0", "9.0+PTX"])
    (pkg / "csrc" / "rmsnorm_fp8_cpu.cpp").write_text((pkg / "csrc" / "rmsnorm_fp8_cpu.cpp").read_text() + "\n// changed\n")
    assert builder.unique_id(config, "cpu") != first, "a changed source changes the id"
    cuda_before = builder.unique_id(config, "cuda")
    (pkg / "torch-ext" / "rmsnorm_fp8" / "layers.py").write_text("# changed\n")
    assert builder.unique_id(config, "cuda") != cuda_before, "a changed Python file changes the id"


def test_gencode_flags_and_archs():
    flags, archs = builder.gencode_flags(["8.0"])
    assert flags == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80"]
    assert archs == ["8.0+PTX"]
    flags, archs = builder.gencode_flags(["8.0", "9.0a"])
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags and archs == ["8.0+PTX", "9.0a"]
    flags, archs = builder.gencode_flags(["8.0", "9.0"])
    assert archs == ["8.0", "9.0+PTX"]


def test_capability_intersection():
    assert builder.select_capabilities(["8.0", "9.0a"], ["7.5", "8.0", "9.0"], "x") == ["8.0", "9.0a"]
    assert builder.select_capabilities(["7.0", "9.0"], ["7.5", "9.0"], "x") == ["9.0"]
    with pytest.raises(builder.BuildError, match=r"no CUDA capability left.*\['6\.0'\].*toolkit"):
        builder.select_capabilities(["6.0"], ["7.5", "8.0"], "pkg (cuda)")


def without_cuda_capabilities(tmp_path: Path) -> Path:
    pkg = copy_package(tmp_path)
    text = (pkg / "build.toml").read_text()
    assert 'cuda-capabilities = ["8.0", "9.0"]\n' in text
    (pkg / "build.toml").write_text(text.replace('cuda-capabilities = ["8.0", "9.0"]\n', ""))
    return pkg


TOOLKIT = ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]


def test_missing_cuda_capabilities_means_every_toolkit_capability(tmp_path):
    config = builder.load_config(without_cuda_capabilities(tmp_path))
    sections = config.kernels_for("cuda")
    assert sections and not sections[0].cuda_capabilities
    assert builder.cuda_capabilities_for(config, sections, TOOLKIT, None) == TOOLKIT
    assert builder.cuda_capabilities_for(config, sections, TOOLKIT, ["8.0"]) == ["8.0"]
    with pytest.raises(builder.BuildError, match=r"--capabilities 7\.0 selects none") as err:
        builder.cuda_capabilities_for(config, sections, TOOLKIT, ["7.0"])
    assert "cuda-capabilities [" not in str(err.value), "the CLI filter is at fault, not build.toml"


def test_capabilities_filter_blames_the_cli_not_build_toml(tmp_path):
    config = builder.load_config(copy_package(tmp_path))
    sections = config.kernels_for("cuda")
    assert builder.cuda_capabilities_for(config, sections, TOOLKIT, None) == ["8.0", "9.0"]
    with pytest.raises(builder.BuildError, match=r"--capabilities 8\.6 selects none .*\['8\.0', '9\.0'\]"):
        builder.cuda_capabilities_for(config, sections, TOOLKIT, ["8.6"])
    with pytest.raises(builder.BuildError, match=r"build\.toml \[kernel\.rmsnorm_fp8_cuda\]: no CUDA capability left: cuda-capabilities"):
        builder.cuda_capabilities_for(config, sections, ["7.5"], ["8.0"])


def fake_cuda_toolchain(monkeypatch, caps=TOOLKIT) -> list:
    """A CUDA torch with nvcc, as far as _build_arch can tell; CompileJob.run records the job."""
    jobs = []

    class Recorded(Exception):
        pass

    def record(job, on_progress=None):
        jobs.append(job)
        raise Recorded

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(builder, "torch_backend", lambda: "cuda")
    monkeypatch.setattr(builder, "find_nvcc", lambda: "/fake/bin/nvcc")
    monkeypatch.setattr(builder, "toolkit_capabilities", lambda nvcc: list(caps))
    monkeypatch.setattr(builder.CompileJob, "run", record)
    return jobs, Recorded


def test_cuda_build_without_cuda_capabilities_targets_the_toolkit(monkeypatch, tmp_path):
    pkg = without_cuda_capabilities(tmp_path)
    jobs, recorded = fake_cuda_toolchain(monkeypatch)
    with pytest.raises(recorded):
        builder.build_package(pkg, "cuda")
    (job,) = jobs
    expected, _ = builder.gencode_flags(TOOLKIT)
    assert [f for f in job.cuda_cflags if f.startswith("-gencode")] == expected
    # torch's cpp_extension passes its own -std (c++20 for torch 2.13); ours would override it.
    assert not any(f.startswith("-std") for f in job.cflags + job.cuda_cflags)
    assert Path(job.build_dir) == pkg / ".build-cache" / builder.arch_variant_name("cuda")
    with pytest.raises(builder.BuildError, match=r"--capabilities 7\.0 selects none"):
        builder.build_package(pkg, "cuda", capabilities=["7.0"])


def test_cuda_checks_without_cuda_capabilities(monkeypatch, tmp_path):
    pkg = without_cuda_capabilities(tmp_path)
    monkeypatch.setattr(builder, "find_nvcc", lambda: "/fake/bin/nvcc")
    monkeypatch.setattr(builder, "toolkit_capabilities", lambda nvcc: list(TOOLKIT))
    checks = builder.cuda_checks([pkg])
    assert sorted({c.capability for c in checks}, key=TOOLKIT.index) == TOOLKIT
    assert all("-std=c++17" in c.command for c in checks), "no torch flags here: the standard is ours to set"


def test_auto_backend_falls_back_to_cpu_without_nvcc(monkeypatch, tmp_path):
    pkg = copy_package(tmp_path)

    def no_nvcc():
        raise builder.BuildError("nvcc not found (looked in $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(builder, "torch_backend", lambda: "cuda")
    monkeypatch.setattr(builder, "find_nvcc", no_nvcc)
    with pytest.raises(builder.BuildError, match="nvcc not found"):
        builder.build_package(pkg, "cuda")  # asked for explicitly: no fallback
    built = []
    monkeypatch.setattr(builder, "_build_arch", lambda config, backend, caps, on_progress: built.append(backend) or backend)
    with pytest.warns(builder.BuildWarning, match=r"nvcc is missing.*cpu backend"):
        assert builder.build_package(pkg, "auto") == ["cpu"]
    assert built == ["cpu"]


def test_nvcc_list_gpu_arch_failure_is_a_build_error(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc fatal: broken install' >&2\nexit 3\n")
    nvcc.chmod(0o755)
    with pytest.raises(builder.BuildError, match=r"--list-gpu-arch` failed \(exit 3\):\nnvcc fatal: broken install"):
        builder.toolkit_capabilities(str(nvcc))
    with pytest.raises(builder.BuildError, match="cannot run"):
        builder.toolkit_capabilities(str(tmp_path / "missing-nvcc"))


# ---------------------------------------------------------------------------------------
# The built variant
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_metadata_parses_and_digest_matches():
    variant = built_variant()
    # build/ is uploaded as is: variant directories only (objects and staging live in .build-cache/)
    for entry in variant.parent.iterdir():
        assert entry.is_dir() and not entry.name.startswith("."), f"{entry} does not belong in build/"
        parse_variant(entry.name)
    assert variant.stat().st_mode & 0o777 == 0o755
    meta = Metadata.read_from_file(variant / "metadata.json")
    assert meta.id == (variant / "_ops.py").read_text().split("from . import ")[1].split()[0]
    assert str(meta.name) == "rmsnorm-fp8" and meta.version == 1 and meta.license == "Apache-2.0"
    assert (variant / f"{meta.id}.abi3.so").is_file()
    assert {"__init__.py", "_ops.py", "layers.py", f"{meta.id}.abi3.so"} <= set(meta.digest.files)
    meta.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, variant))
    if builder.torch_backend() == "cuda":
        assert meta.backend.archs and all(a.startswith(("8.0", "9.0")) for a in meta.backend.archs)


def test_loaded_module_is_the_build():
    mod = packages.get_kernel("rmsnorm-fp8")
    meta = Metadata.read_from_file(built_variant() / "metadata.json")
    assert mod.__name__ == meta.id
    assert hasattr(mod, "layers") and "layers" in mod.__all__


def test_noarch_build(tmp_path):
    root = tmp_path / "fused-llm"
    (root / "torch-ext").mkdir(parents=True)
    shutil.copy(ROOT / "build.toml", root / "build.toml")
    (root / "torch-ext" / "fused_llm").mkdir()
    (root / "torch-ext" / "fused_llm" / "__init__.py").write_text("from ._ops import ops, add_op_namespace_prefix\n")
    results = builder.build_package(root)
    assert sorted(r.variant_dir.name for r in results) == ["torch-cpu", "torch-cuda", "torch-rocm"]
    for r in results:
        meta = Metadata.read_from_file(r.variant_dir / "metadata.json")
        assert meta.id == r.kernel_id and meta.id.startswith(f"_fused_llm_{r.variant_dir.name[6:]}_")
    cuda = Metadata.read_from_file(root / "build" / "torch-cuda" / "metadata.json")
    assert cuda.backend.archs == ["8.0", "9.0"]


def test_binding_only_backend():
    """gated-mlp has no cpu [kernel.*] section: its cpu variant is an arch variant holding the
    torch binding's .so alone (the op namespace its Python custom ops join), and no noarch
    variant from its [torch-noarch] days is left in build/."""
    variant = built_variant("gated-mlp")
    meta = Metadata.read_from_file(variant / "metadata.json")
    assert (variant / f"{meta.id}.abi3.so").is_file() and (variant / "_kernels.py").is_file()
    if builder.torch_backend() == "cpu":
        assert not meta.backend.archs
    assert not [p.name for p in variant.parent.iterdir() if builder.NOARCH_VARIANT.fullmatch(p.name)]


def test_binding_only_backend_jobs(monkeypatch, tmp_path):
    """The cpu job of gated-mlp compiles the binding only; the cuda job adds the two CuTe
    kernels, CUTLASS's headers, sm_80 code + PTX and sm_90a code (each source for both: the
    sm90 kernel's body exists only in the sm_90a code)."""
    pkg = copy_package(tmp_path, "gated-mlp")
    jobs, recorded = fake_cuda_toolchain(monkeypatch)
    with pytest.raises(recorded):
        builder.build_package(pkg, "cpu")
    (cpu,) = jobs
    assert [Path(s).name for s in cpu.sources] == ["torch_binding.cpp", builder.GLIBCXX_COMPAT_NAME] and not cpu.with_cuda
    assert "-DCPU_KERNEL" in cpu.cflags
    if not HAS_CUTLASS:
        with pytest.raises(builder.BuildError, match="needs the nvidia-cutlass wheel"):
            builder.build_package(pkg, "cuda")
        return
    with pytest.raises(recorded):
        builder.build_package(pkg, "cuda")
    cuda = jobs[1]
    assert [Path(s).name for s in cuda.sources] == ["torch_binding.cpp", "gated_mlp_sm80.cu", "gated_mlp_sm90.cu", builder.GLIBCXX_COMPAT_NAME]
    assert cuda.with_cuda
    assert [f for f in cuda.cuda_cflags if f.startswith("-gencode")] == builder.gencode_flags(["8.0", "9.0a"])[0]
    assert "--expt-relaxed-constexpr" in cuda.cuda_cflags
    assert str(pkg / "csrc") in cuda.include_dirs and builder.cutlass_include() in cuda.include_dirs


def test_backend_without_kernels_needs_a_binding(tmp_path):
    pkg = copy_package(tmp_path, "gated-mlp")
    text = (pkg / "build.toml").read_text()
    (pkg / "build.toml").write_text(text.replace('"torch-ext/torch_binding.cpp", ', "", 1))
    with pytest.raises(builder.BuildError, match="backend 'cpu' has no \\[kernel.\\*\\] section and \\[torch\\] src compiles nothing"):
        builder.build_package(pkg, "cpu")


def test_stale_variants_of_the_other_kind_are_removed(tmp_path):
    build = tmp_path / "build"
    for name in ("torch-cpu", "torch-cuda", "torch-universal", "torch213-cxx11-cpu-x86_64-linux", "torch212-cxx11-cu130-x86_64-linux"):
        (build / name).mkdir(parents=True)
    builder._remove_stale_variants(build, keep_noarch=False)
    assert sorted(p.name for p in build.iterdir()) == ["torch212-cxx11-cu130-x86_64-linux", "torch213-cxx11-cpu-x86_64-linux"]
    (build / "torch-rocm").mkdir()
    builder._remove_stale_variants(build, keep_noarch=True)
    assert [p.name for p in build.iterdir()] == ["torch-rocm"]


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_invalid_key_names_key_and_line(tmp_path):
    pkg = copy_package(tmp_path)
    text = (pkg / "build.toml").read_text().replace('include = ["csrc"]', 'includes = ["csrc"]', 1)
    (pkg / "build.toml").write_text(text)
    lineno = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("includes"))
    with pytest.raises(builder.BuildError, match=rf"build.toml:{lineno}: invalid key 'includes'"):
        builder.load_config(pkg)


def test_missing_required_key(tmp_path):
    pkg = copy_package(tmp_path)
    (pkg / "build.toml").write_text((pkg / "build.toml").read_text().replace('license = "Apache-2.0"\n', ""))
    with pytest.raises(builder.BuildError, match="license"):
        builder.load_config(pkg)


def test_missing_source(tmp_path):
    pkg = copy_package(tmp_path)
    (pkg / "csrc" / "common" / "numerics.h").unlink()
    with pytest.raises(builder.BuildError, match="source 'csrc/common/numerics.h' does not exist"):
        builder.load_config(pkg)


def test_missing_nvcc(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(builder.Path, "is_file", lambda self: False)
    with pytest.raises(builder.BuildError, match="nvcc not found"):
        builder.find_nvcc()


def test_cuda_backend_needs_cuda_torch():
    if builder.torch_backend() == "cuda":
        pytest.skip("torch has CUDA here")
    with pytest.raises(builder.BuildError, match="cannot build the cuda backend with a cpu build of torch"):
        builder.build_package(packages.package_dir("rmsnorm-fp8"), "cuda")


def test_compiler_error_names_the_file(tmp_path):
    pkg = copy_package(tmp_path)
    src = pkg / "csrc" / "rmsnorm_fp8_cpu.cpp"
    src.write_text(src.read_text() + "\nint broken( { return 0; }\n")
    with pytest.raises(builder.BuildError) as err:
        builder.build_package(pkg, "cpu")
    assert "rmsnorm_fp8_cpu.cpp" in str(err.value) and "error" in str(err.value)


def test_build_after_a_killed_build(tmp_path):
    """A build killed mid-way leaves cpp_extension's ``lock`` file in the object directory;
    without builder.build_dir_lock the next build of it waits on that file forever (a GPU
    session lost two calls to it, 2026-11-28)."""
    pkg = copy_package(tmp_path)
    obj_dir = pkg / builder.CACHE_DIR / builder.arch_variant_name("cpu")
    obj_dir.mkdir(parents=True)
    (obj_dir / "lock").write_text("")  # what a killed cpp_extension.load leaves
    proc = subprocess.run([sys.executable, "-c", f"from fused_llm_dev import builder; from pathlib import Path; "
                           f"builder.build_package(Path({str(pkg)!r}), 'cpu')"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (obj_dir / "lock").exists()


def test_build_dir_lock_serializes_builds(tmp_path):
    """Two builds of one directory: the second waits for the first's flock."""
    import threading

    order = []

    def second():
        with builder.build_dir_lock(tmp_path):
            order.append("second")

    with builder.build_dir_lock(tmp_path):
        worker = threading.Thread(target=second)
        worker.start()
        worker.join(0.5)
        order.append("first done")
    worker.join(5)
    assert order == ["first done", "second"]


def test_cli_reports_errors_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fused_llm_dev.cli", "build", "no-such-package"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools")])})
    assert proc.returncode == 2
    assert "no-such-package" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------
# CUDA sources compile without torch or a GPU
# ---------------------------------------------------------------------------------------


def needs_cutlass(pkg_dir: Path) -> bool:
    return any(d.startswith("cutlass_") for k in builder.load_config(pkg_dir).kernels_for("cuda") for d in k.depends)


HAS_CUTLASS = importlib.util.find_spec("cutlass_library") is not None


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not installed")
def test_check_cuda_compiles_every_cuda_source():
    dirs = [packages.package_dir(n) for n in packages.kernel_packages()]
    dirs = [d for d in dirs if HAS_CUTLASS or not needs_cutlass(d)]  # those: test_check_cuda_cutlass_packages
    checks = builder.cuda_checks(dirs)
    assert {c.capability for c in checks} >= {"8.0", "9.0"}
    failures = builder.check_cuda(dirs)
    assert not failures, "\n".join(f"{c.source} sm_{c.capability}: {e}" for c, e in failures)


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not installed")
@pytest.mark.skipif(not HAS_CUTLASS, reason="the nvidia-cutlass wheel (CuTe headers) is not installed")
def test_check_cuda_cutlass_packages():
    """gated-mlp's CuTe kernels are among the checked sources, each for its own capability
    (sm80: 8.0; sm90: 9.0a, the wgmma target), with CUTLASS headers on the include path."""
    checks = builder.cuda_checks([packages.package_dir("gated-mlp")])
    assert [(c.source.name, c.capability) for c in checks] == [("gated_mlp_sm80.cu", "8.0"), ("gated_mlp_sm90.cu", "9.0a")]
    assert all(f"-I{builder.cutlass_include()}" in c.command for c in checks)
    assert "-gencode=arch=compute_90a,code=sm_90a" in checks[1].command
