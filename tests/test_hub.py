"""The path a user takes: each package's Hub-shaped repository, laid into a Hugging Face cache
as huggingface_hub does, loaded offline through ``kernels.get_kernel(..., version=1)``, a
lockfile, ``fused_llm.kernelize(source="hub")`` and transformers' ``KernelConfig``; and
``kernels info`` / ``kernels benchmark`` on every package.

The offline loads run in a fresh interpreter (tests/hub_user.py) with HF_HUB_OFFLINE=1, the
cache as HF_HUB_CACHE and no LOCAL_KERNELS: this process already imported the same kernels
from PKG/build/ (same metadata ids), which would stand in for the cache's copies.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import fused_llm
from fused_llm import integration, packages
from fused_llm.transformers_config import kernel_config, kernelized_report, registered_layer_names
from fused_llm_dev import hub
from fused_llm_dev.models import tiny_llama
from fused_llm_dev.testing import device

ROOT = packages.repo_root()
NAMES = packages.kernel_packages()
DEVICE = device()
USER = Path(__file__).with_name("hub_user.py")
# kernelize swaps transformers' rotary function process-wide; conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """Every package's repository and a cache holding branch v1 as `kernel` repos (what
    get_kernel reads) and as `model` repos (what `kernels benchmark` of kernels 0.17.2 reads)."""
    base = tmp_path_factory.mktemp("hub")
    repos = {name: hub.write_hub_repo(packages.package_dir(name), base / "repos" / f"{name}.git") for name in NAMES}
    for repo in repos.values():
        for repo_type in ("kernel", "model"):
            hub.install_in_hf_cache(repo, base / "cache", repo_type=repo_type)
    return base, repos


def run_user(base: Path, *args: str, timeout: int = 600) -> dict:
    """tests/hub_user.py in a fresh interpreter, offline, with no LOCAL_KERNELS."""
    # Nor TRITON_INTERPRET, which the Triton packages' test conftests set for this process: a
    # user's process runs without it (with it, `kernels benchmark` of the Triton packages fails).
    dropped = ("LOCAL_KERNELS", "KERNELS_CACHE", "HF_HUB_CACHE", "HF_HOME", "TRITON_INTERPRET")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(base / "cache"), HF_HOME=str(base / "hf-home"),
               HF_HUB_DISABLE_TELEMETRY="1", FUSED_LLM_ROOT=str(ROOT),
               PYTHONPATH=os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools"), env.get("PYTHONPATH", "")]))
    out = base / f"user-{args[0]}-{uuid.uuid4().hex[:8]}.json"
    proc = subprocess.run([sys.executable, str(USER), args[0], str(out), *args[1:]], env=env, cwd=base,
                          capture_output=True, text=True, timeout=timeout)
    assert out.is_file(), f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = json.loads(out.read_text())
    assert "error" not in found, found["error"] + proc.stderr[-2000:]
    return found


@pytest.fixture
def cpu_kernel_config(monkeypatch):
    """transformers 5.22.2 takes a KernelConfig only on GPU-like devices; kernels swaps CPU
    layers, so on a CPU machine widen transformers' list to run the rest of its path."""
    if DEVICE == "cpu":
        from transformers.utils import kernel_config as hf_kernel_config

        monkeypatch.setattr(hf_kernel_config, "KERNELS_SUPPORTED_DEVICE_TYPES", [*hf_kernel_config.KERNELS_SUPPORTED_DEVICE_TYPES, "cpu"])


# ---------------------------------------------------------------------------------------
# The repository and the cache
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", NAMES)
def test_hub_repo_is_what_kernel_builder_uploads(hub_cache, name, tmp_path):
    from kernels._rust import Metadata

    _, repos = hub_cache
    repo = repos[name]
    pkg = packages.package_dir(name)
    files = {e.path: e for e in repo.entries()}
    variants = sorted(d.name for d in (pkg / "build").iterdir() if (d / "metadata.json").is_file())
    expected = {".gitattributes", *(f"benchmarks/{p.name}" for p in (pkg / "benchmarks").glob("benchmark*.py"))}
    for variant in variants:
        vdir = pkg / "build" / variant
        expected |= {f"build/{variant}/{p.relative_to(vdir).as_posix()}" for p in vdir.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
        meta = Metadata.read_from_file(vdir / "metadata.json")  # metadata per variant, kernels' parser
        assert meta.version == packages.HUB_VERSION and repo.branch == f"v{meta.version}"
    assert set(files) == expected
    for path, entry in files.items():
        assert entry.data == (pkg / path).read_bytes(), path  # repo paths are the package's paths
        # Binaries go through LFS (the Hub takes them no other way): a pointer in Git.
        assert (entry.lfs_sha256 is not None) == path.endswith(".so"), path
        if entry.lfs_sha256:
            assert entry.lfs_sha256 == hashlib.sha256(entry.data).hexdigest()
            pointer = repo._git("cat-file", "-p", entry.blob_id).decode()
            assert pointer.startswith("version https://git-lfs.github.com/spec/v1\n") and f"size {entry.size}" in pointer
    main = {e.path: e for e in repo.entries(hub.MAIN)}
    assert set(main) == {".gitattributes", "README.md"} and main["README.md"].data == (pkg / "CARD.md").read_bytes()
    # Commit ids depend on the content alone.
    again = hub.write_hub_repo(pkg, tmp_path / "again.git")
    assert again.commit() == repo.commit() and again.commit(hub.MAIN) == repo.commit(hub.MAIN)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.kernels_ci
def test_hf_cache_reads_back_through_huggingface_hub(hub_cache):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    base, repos = hub_cache
    cache = base / "cache"
    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    cached = {(r.repo_id, r.repo_type): r for r in info.repos}
    assert set(cached) == {(packages.hub_repo_id(n), t) for n in NAMES for t in ("kernel", "model")}
    for name, repo in repos.items():
        entries = repo.entries()
        [revision] = cached[(repo.repo_id, "kernel")].revisions
        assert revision.commit_hash == repo.commit() and revision.refs == {"v1"}
        assert {f.file_path.relative_to(revision.snapshot_path).as_posix() for f in revision.files} == {e.path for e in entries}
        for entry in entries:
            pointer = revision.snapshot_path / entry.path
            # A relative symlink to blobs/<etag>: the LFS sha256, else the Git blob id.
            assert pointer.is_symlink() and not os.readlink(pointer).startswith("/")
            blob = pointer.resolve()
            assert blob.parent.name == "blobs" and blob.read_bytes() == entry.data
            assert blob.name == (hashlib.sha256(entry.data).hexdigest() if entry.path.endswith(".so") else _git_blob_id(entry.data))
            assert (cache / ".locks" / hub.repo_folder(repo.repo_id) / f"{blob.name}.lock").is_file()
        storage = cache / hub.repo_folder(repo.repo_id)
        assert (storage / "refs" / "v1").read_text() == repo.commit()  # no newline, as huggingface_hub
        metadata = next(e.path for e in entries if e.path.endswith("metadata.json"))
        found = try_to_load_from_cache(repo.repo_id, metadata, revision="v1", repo_type="kernel", cache_dir=cache)
        assert found == str(revision.snapshot_path / metadata)
        try:
            from huggingface_hub import get_cached_repo_tree  # huggingface_hub >= 2 keeps tree listings
        except ImportError:
            continue
        tree = {f.path: f for f in get_cached_repo_tree(repo.repo_id, repo_type="kernel", revision="v1", cache_dir=cache)}
        assert set(tree) == {e.path for e in entries} and all(tree[e.path].size == e.size for e in entries)


# ---------------------------------------------------------------------------------------
# A user's process, offline
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offline(hub_cache):
    base, _ = hub_cache
    return run_user(base, "load")


@pytest.mark.parametrize("name", NAMES)
def test_get_kernel_version_1_offline_from_the_cache(hub_cache, offline, name):
    base, repos = hub_cache
    found = offline["packages"][name]
    snapshot = base / "cache" / hub.repo_folder(packages.hub_repo_id(name)) / "snapshots" / repos[name].commit()
    assert Path(found["file"]).is_relative_to(snapshot), found
    assert found["commit"] == repos[name].commit()
    assert found["same_module_by_branch"], "revision='v1' resolves to the same variant as version=1"
    # Variant selection: the loader picked this machine's variant among those uploaded.
    variants = sorted(d.name for d in (packages.package_dir(name) / "build").iterdir() if (d / "metadata.json").is_file())
    assert found["variant"] in variants
    if DEVICE == "cpu":
        assert "cpu" in found["variant"], found
    locked = offline["locked"][name]
    assert Path(locked["get_locked_kernel"]).is_relative_to(snapshot) and locked["load_kernel"] == locked["get_locked_kernel"]


def test_kernels_lock_needs_the_hub(offline):
    # `kernels lock` checks the publisher's trust flag on the Hub first (then lists the refs
    # and the variants): offline it stops there, so the test writes the lock it would write.
    assert "could not verify publisher trust status" in offline["kernels_lock_offline"], offline["kernels_lock_offline"]


def _expected_swaps(model) -> set[str]:
    kinds = {"LlamaRMSNorm", "SiLUActivation", "LlamaMLP"}
    names = {n for n, m in model.named_modules() if type(m).__name__ in kinds}
    return names | {"model.layers.0.self_attn.rotary_pos_emb"}


@pytest.mark.parametrize("path", ["kernelize_hub", "from_pretrained", "set_use_kernels"])
def test_hub_kernels_swap_into_a_model_offline(offline, path):
    result = offline[path]
    model = tiny_llama("meta")
    assert {n for n, _, _ in result["swaps"]} == _expected_swaps(model), result["swaps"]
    assert result["kept"] == 0
    assert result["swaps"] == offline["kernelize_hub"]["swaps"], "the same layers as fused_llm.kernelize"
    assert result["max_diff"] < 1e-4, "float32 logits agree with eager to rounding"
    mapping = offline["kernel_config_mapping"]
    assert mapping == {name: f"{packages.hub_repo_id(pkg)}:{cls}" for name, (pkg, cls) in integration.LAYERS.items() if name in mapping}


def test_the_cache_an_online_get_kernel_leaves_loads_offline(hub_cache, tmp_path):
    # What get_kernel(version=1) writes online: the branch resolved through the API, the
    # variant's files downloaded at that commit (no ref), the tree listing of the commit.
    from kernels.variants import get_variants_local, resolve_variant

    _, repos = hub_cache
    name = "rmsnorm-fp8"
    repo = repos[name]
    variant, _ = resolve_variant(get_variants_local(packages.package_dir(name) / "build"))
    variant = variant.variant_str
    hub.install_in_hf_cache(repo, tmp_path / "cache", revision=repo.commit(), allow_patterns=[f"build/{variant}/*"])
    code = ("import kernels; k = kernels.get_kernel('fused-llm/rmsnorm-fp8', revision='%s'); print(k.__file__)" % repo.commit())
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        # Measured with kernels 0.17.2 + huggingface_hub 2.4.0: the tree listing names every
        # file of the commit, the snapshot holds one variant, so huggingface_hub reports it
        # incomplete and kernels raises this (and version=1 finds no refs/v1). Any other
        # failure is a real one.
        assert "Cannot find a local snapshot for fused-llm/rmsnorm-fp8" in proc.stderr, proc.stderr[-1500:]
        assert "IncompleteSnapshotError" in proc.stderr and "is incomplete" in proc.stderr, proc.stderr[-1500:]
        pytest.xfail("the cache an online get_kernel leaves does not load offline (kernels 0.17.2, "
                     "huggingface_hub 2.x): pre-download branch v1 whole (`hf download --repo-type kernel`)")
    assert variant in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------
# transformers' KernelConfig, in this process (local builds)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama") / "model"
    tiny_llama("cpu").save_pretrained(path)
    return path


def _swaps(model) -> list[tuple[str, str, str]]:
    return sorted(kernelized_report(model).swapped)


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens).logits.float()


@pytest.mark.kernels_ci
def test_kernel_config_names_only_the_models_layers(saved_llama):
    config = kernel_config(saved_llama)
    # Llama registers RMSNorm, SiLU, rotary_pos_emb and (tagged by us) LlamaMLP, not the GELUs,
    # which transformers would reject as unregistered.
    assert set(config.kernel_mapping) == {"RMSNorm", "SiLU", "rotary_pos_emb", "LlamaMLP"}
    assert config.kernel_mapping["RMSNorm"] == "fused-llm/rmsnorm-fp8:RMSNorm"
    assert not config.use_local_kernel and not config.inherit_mapping
    assert set(kernel_config().kernel_mapping) == set(integration.LAYERS)
    pinned = kernel_config(saved_llama, revision="v1")
    assert pinned.kernel_mapping["SiLU"] == ("fused-llm/swiglu-fp8:SiLU", {"revision": "v1"})
    local = kernel_config(tiny_llama("meta"), source="local")
    assert local.use_local_kernel and local.kernel_mapping["RMSNorm"] == f"{packages.package_dir('rmsnorm-fp8')}:RMSNorm"
    assert registered_layer_names(tiny_llama("meta")) >= set(config.kernel_mapping)
    with pytest.raises(ValueError, match="source: expected 'hub' or 'local'"):
        kernel_config(source="nowhere")


@pytest.mark.kernels_ci
@pytest.mark.usefixtures("cpu_kernel_config")
def test_kernel_config_swaps_what_kernelize_swaps(saved_llama):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(saved_llama).to(DEVICE).eval()
    tokens = torch.randint(0, eager.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)  # before any swap: the rotary swap is process-wide
    model = copy.deepcopy(eager)
    fused_llm.kernelize(model)
    expected = _swaps(model)
    assert len(expected) == len(_expected_swaps(model))

    # Hub names, pinned to branch v1 (LOCAL_KERNELS points them at the builds, see conftest.py).
    _unswap_rotary()
    # from_pretrained kernelizes for the device the weights load on (device_map needs accelerate:
    # the GPU image has it, CPU is the default).
    placement = {"device_map": DEVICE} if DEVICE != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(saved_llama, use_kernels=True, kernel_config=kernel_config(saved_llama, revision="v1"), **placement)
    model = model.eval()
    assert _swaps(model) == expected
    torch.testing.assert_close(_logits(model, tokens), ref, rtol=1e-4, atol=1e-4)

    # Local paths through set_use_kernels.
    _unswap_rotary()
    model = AutoModelForCausalLM.from_pretrained(saved_llama).to(DEVICE).eval()
    model.set_use_kernels(True, kernel_config(model, source="local"))
    assert _swaps(model) == expected
    torch.testing.assert_close(_logits(model, tokens), ref, rtol=1e-4, atol=1e-4)


def _unswap_rotary() -> None:
    """Undo the process-wide rotary swap, so the next path must swap it itself to report it."""
    from transformers.models.llama import modeling_llama

    modeling_llama.apply_rotary_pos_emb.__dict__.pop("forward", None)


@pytest.mark.usefixtures("cpu_kernel_config")
@pytest.mark.xfail(raises=AttributeError, strict=True,
                   reason="transformers 5.22.2: from_pretrained turns each mapping entry into a (name, metadata) "
                          "tuple, which the use_local_kernel branch then calls .split on; local builds go through "
                          "hub names + LOCAL_KERNELS, or set_use_kernels")
def test_kernel_config_local_paths_in_from_pretrained(saved_llama):
    from transformers import AutoModelForCausalLM

    placement = {"device_map": DEVICE} if DEVICE != "cpu" else {}
    AutoModelForCausalLM.from_pretrained(saved_llama, use_kernels=True, kernel_config=kernel_config(saved_llama, source="local"), **placement)


# ---------------------------------------------------------------------------------------
# kernels info / kernels benchmark
# ---------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", NAMES)
def test_kernels_info(hub_cache, name, capsys):
    import tomllib

    from kernels.cli.info import print_kernel_info

    base, repos = hub_cache
    general = tomllib.loads((packages.package_dir(name) / "build.toml").read_text())["general"]
    snapshot = base / "cache" / hub.repo_folder(packages.hub_repo_id(name)) / "snapshots" / repos[name].commit()
    for path in (packages.package_dir(name), snapshot):  # `kernels info ./PKG`, and on the download
        print_kernel_info(str(path), json_output=True)
        info = json.loads(capsys.readouterr().out)
        assert info["name"] == name and info["version"] == general["version"] and info["license"] == general["license"]
        # Only the backends built on this machine have variants (rope-triton, noarch: all three).
        assert set(info["backends"]) <= set(general["backends"]) and DEVICE in info["backends"], info


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", NAMES)
def test_every_package_has_a_hub_benchmark(name):
    from kernels.benchmark import Benchmark
    from kernels.cli.benchmark import discover_benchmark_classes

    pkg = packages.package_dir(name)
    scripts = sorted((pkg / "benchmarks").glob("benchmark*.py"))
    assert scripts, f"{name}: `kernels benchmark` runs benchmarks/benchmark*.py; add one"
    classes = [c for s in scripts for c in discover_benchmark_classes(s, pkg)]
    assert classes and all(issubclass(c, Benchmark) for c in classes)
    assert all(any(m.startswith("benchmark_") for m in dir(c)) for c in classes)


@pytest.mark.parametrize("where", ["local", "hub"])
def test_kernels_benchmark_runs_and_verifies_every_package(hub_cache, where):
    base, _ = hub_cache
    # `kernels benchmark ./PKG` (the package's build/) and `kernels benchmark fused-llm/PKG@v1`
    # (the Hub repository, here from the offline cache), 1 iteration each.
    targets = [str(packages.package_dir(n)) if where == "local" else f"{packages.hub_repo_id(n)}@v1" for n in NAMES]
    found = run_user(base, "bench", *targets)["bench"]
    for target in targets:
        assert found[target]["status"] == "ok", found[target]
        results = found[target]["result"]["results"]
        assert results and all(r.get("verified") is not False for r in results), results
        assert any(r.get("verified") for r in results), "every package's workloads check their output"


@pytest.mark.kernels_ci
def test_cli_hub_repo(tmp_path, capsys):
    from fused_llm_dev import cli

    assert cli.main(["hub-repo", *NAMES, "--out", str(tmp_path / "repos"), "--hf-cache", str(tmp_path / "cache")]) == 0
    err = capsys.readouterr().err
    for name in NAMES:
        assert (tmp_path / "repos" / f"{name}.git").is_dir() and name in err
        for repo_type in ("kernels", "models"):
            assert (tmp_path / "cache" / f"{repo_type}--fused-llm--{name}" / "refs" / "v1").is_file()
    # An arch package built on one machine has one backend's variant: the report says which are missing.
    if any(not packages.package_dir(n).joinpath("build", "torch-cpu").is_dir() for n in NAMES):
        assert "not a complete upload" in err
