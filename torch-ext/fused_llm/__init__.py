"""fused-llm: fused GPU kernels for LLM inference, shipped as Hugging Face kernel packages.

``fused_llm.kernelize(model)`` swaps the project's kernels into a transformers model (and
fuses its decoder layers); ``fused_llm.kernel_config(model)`` gives transformers'
``KernelConfig`` for the same layers. The tooling (builder, ``fused-llm`` command, benchmarks)
is the development package ``fused_llm_dev``, which this package does not import.
"""

from __future__ import annotations

from .integration import LAYERS, KernelizeReport, kernel_mapping, kernelize
from .packages import get_kernel, kernel_packages
from .transformers_config import kernel_config

__all__ = ["LAYERS", "KernelizeReport", "get_kernel", "kernel_config", "kernel_mapping", "kernel_packages", "kernelize"]
__version__ = "0.1.0"
