"""A user's process, for tests/test_hub.py: run as a script in a fresh interpreter whose
environment the test sets (HF_HUB_OFFLINE=1, HF_HUB_CACHE holding our Hub repositories, no
LOCAL_KERNELS), so every kernel comes through the Hub code path of ``kernels`` and
``transformers`` and nothing imported by the test process can stand in for it.

    python tests/hub_user.py load OUT.json       get_kernel, locks, kernelize, KernelConfig
    python tests/hub_user.py bench OUT.json ARG  `kernels benchmark ARG` for each ARG

Writes its findings as JSON to OUT.json; the test asserts on them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path


def _swaps(report) -> list[list[str]]:
    return sorted([name, cls, layer] for name, cls, layer in report.swapped)


def _unswap_rotary() -> None:
    """kernelize swaps transformers' apply_rotary_pos_emb process-wide (one module shared by
    every model): put the original back, so each path below must swap it itself."""
    from transformers.models.llama import modeling_llama

    modeling_llama.apply_rotary_pos_emb.__dict__.pop("forward", None)


def _max_diff(model, tokens, ref) -> float:
    import torch

    with torch.inference_mode():
        return float((model(tokens).logits.float() - ref).abs().max())


def load(out: dict) -> None:
    import kernels
    import torch
    from huggingface_hub import constants
    from kernels._rust import KernelDependency, KernelLock, KernelLocks, KernelVersion

    import fused_llm
    from fused_llm import packages
    from fused_llm.transformers_config import kernel_config, kernelized_report
    from fused_llm_dev import hub
    from fused_llm_dev.models import tiny_llama
    from fused_llm_dev.testing import device

    assert constants.HF_HUB_OFFLINE and "LOCAL_KERNELS" not in os.environ, "run by tests/test_hub.py only"
    cache = Path(constants.HF_HUB_CACHE)
    names = packages.kernel_packages()
    out["packages"] = {}
    locks = {}
    for name in names:
        repo_id = packages.hub_repo_id(name)
        by_version = kernels.get_kernel(repo_id, version=packages.HUB_VERSION)
        by_branch = kernels.get_kernel(repo_id, revision=hub.branch_name())
        commit = (cache / hub.repo_folder(repo_id) / "refs" / hub.branch_name()).read_text()
        locks[KernelDependency(repo_id, KernelVersion.Version(packages.HUB_VERSION))] = KernelLock(commit=commit)
        out["packages"][name] = {
            "module": by_version.__name__,
            "file": by_version.__file__,
            "variant": Path(by_version.__file__).parent.name,
            "same_module_by_branch": by_branch is by_version,
            "commit": commit,
        }

    # The lockfile flow. `kernels lock` asks the Hub (publisher trust, branch v1, the variant
    # listing) before it writes anything, so it cannot run offline; the lock it would write for
    # branch v1 is this one (kernels' own KernelLocks serialization).
    project = Path(tempfile.mkdtemp())
    deps = "\n".join(f'"{packages.hub_repo_id(n)}" = {packages.HUB_VERSION}' for n in names)
    (project / "pyproject.toml").write_text(f"[project]\nname = 'user-app'\nversion = '0'\n\n[tool.kernels.dependencies]\n{deps}\n")
    try:
        from kernels.cli.lock import lock_kernels

        lock_kernels(argparse.Namespace(project_dir=project))
        out["kernels_lock_offline"] = "ran"
    except Exception as err:  # the reason it cannot run offline
        out["kernels_lock_offline"] = f"{type(err).__name__}: {err}"
    lockfile = project / "kernels.lock"
    lockfile.write_text(KernelLocks(locks).to_json())
    out["locked"] = {}
    for name in names:
        repo_id = packages.hub_repo_id(name)
        locked = kernels.get_locked_kernel(repo_id, lockfile=lockfile)
        loaded = kernels.load_kernel(repo_id, lockfile=lockfile)
        out["locked"][name] = {"get_locked_kernel": locked.__file__, "load_kernel": loaded.__file__}

    # kernelize and transformers' KernelConfig, on a small Llama saved to disk.
    dev = device()
    if dev == "cpu":
        # transformers 5.22.2 accepts a KernelConfig only for GPU-like devices (see
        # fused_llm/transformers_config.py); kernels itself swaps CPU layers.
        from transformers.utils import kernel_config as hf_kernel_config

        hf_kernel_config.KERNELS_SUPPORTED_DEVICE_TYPES.append("cpu")
    from transformers import AutoModelForCausalLM

    eager = tiny_llama(dev, torch.float32)
    saved = Path(tempfile.mkdtemp()) / "tiny-llama"
    eager.save_pretrained(saved)
    tokens = torch.randint(0, eager.config.vocab_size, (2, 19), device=dev)
    with torch.inference_mode():
        ref = eager(tokens).logits.float()  # before any swap: the rotary swap is process-wide

    model = copy.deepcopy(eager)
    report = fused_llm.kernelize(model, source="hub")
    out["kernelize_hub"] = {"swaps": _swaps(report), "kept": len(report.kept), "max_diff": _max_diff(model, tokens, ref)}

    _unswap_rotary()
    config = kernel_config(saved)
    out["kernel_config_mapping"] = {k: v if isinstance(v, str) else list(v) for k, v in config.kernel_mapping.items()}
    # from_pretrained kernelizes for the device the weights load on: a GPU run loads them
    # there (device_map needs accelerate, which the GPU image has; CPU is the default).
    placement = {"device_map": dev} if dev != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(saved, use_kernels=True, kernel_config=config, **placement).eval()
    report = kernelized_report(model)
    out["from_pretrained"] = {"swaps": _swaps(report), "kept": len(report.kept), "max_diff": _max_diff(model, tokens, ref)}

    _unswap_rotary()
    model = AutoModelForCausalLM.from_pretrained(saved).to(dev).eval()
    model.set_use_kernels(True, kernel_config(model))
    report = kernelized_report(model)
    out["set_use_kernels"] = {"swaps": _swaps(report), "kept": len(report.kept), "max_diff": _max_diff(model, tokens, ref)}


def bench(out: dict, targets: list[str]) -> None:
    """`kernels benchmark TARGET --iterations 1 --warmup 0` for each target, through the CLI's
    own entry point (a target is a package directory or `org/repo@v1`)."""
    from kernels.cli import main

    out["bench"] = {}
    for target in targets:
        result = Path(tempfile.mkdtemp()) / "result.json"
        sys.argv = ["kernels", "benchmark", target, "--iterations", "1", "--warmup", "0", "--output", str(result)]
        try:
            main()
            status = "ok"
        except SystemExit as exc:
            status = f"exit {exc.code}"
        payload = json.loads(result.read_text()) if result.is_file() else None
        out["bench"][target] = {"status": status, "result": payload}


if __name__ == "__main__":
    mode, out_path, *rest = sys.argv[1:]
    found: dict = {}
    try:
        load(found) if mode == "load" else bench(found, rest)
    except Exception:
        found["error"] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(found, indent=1))
