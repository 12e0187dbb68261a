"""Session setup for every test in the checkout: build each kernel package for the running
torch (an unchanged package rebuilds nothing) and point LOCAL_KERNELS at
the builds, so tests load packages exactly as users do, through kernels.get_kernel."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
# fused_llm (the integration package) and fused_llm_dev (the tooling), also without `pip install -e .`
sys.path[:0] = [str(ROOT / "torch-ext"), str(ROOT / "tools")]


def pytest_configure(config) -> None:
    os.environ.setdefault("FUSED_LLM_ROOT", str(ROOT))
    from fused_llm import packages

    if os.environ.get("FUSED_LLM_SKIP_BUILD") != "1" and not hasattr(config, "workerinput"):
        from fused_llm_dev.builder import BuildError
        from fused_llm_dev.commands import build_packages

        try:
            build_packages([])
        except BuildError as err:
            raise SystemExit(f"fused-llm build failed, no test can load the packages:\n{err}") from None
    for name in packages.kernel_packages():
        packages.use_local_build(name)


@pytest.fixture
def restore_hub_functions():
    """kernelize swaps transformers' hub functions (apply_rotary_pos_emb) process-wide: put the
    original forward back, so later tests compare against the real eager function."""
    from transformers.models.llama import modeling_llama

    fn = modeling_llama.apply_rotary_pos_emb
    saved = fn.__dict__.get("forward")
    yield
    fn.__dict__.pop("forward", None)
    if saved is not None:
        fn.forward = saved
