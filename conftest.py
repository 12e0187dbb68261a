"""Session setup for every test in the checkout: build each kernel package for the running
torch (an unchanged package rebuilds nothing) and point LOCAL_KERNELS at
the builds, so tests load packages exactly as users do, through kernels.get_kernel."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "torch-ext"))  # fused_llm, also without `pip install -e .`


def pytest_configure(config) -> None:
    os.environ.setdefault("FUSED_LLM_ROOT", str(ROOT))
    from fused_llm import packages

    if os.environ.get("FUSED_LLM_SKIP_BUILD") != "1" and not hasattr(config, "workerinput"):
        from fused_llm.builder import BuildError
        from fused_llm.cli import build_packages

        try:
            build_packages([])
        except BuildError as err:
            raise SystemExit(f"fused-llm build failed, no test can load the packages:\n{err}") from None
    for name in packages.kernel_packages():
        packages.use_local_build(name)
