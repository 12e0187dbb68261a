"""fused-llm: fused GPU kernels for LLM inference, shipped as Hugging Face kernel packages.

``fused_llm.kernelize(model)`` swaps the project's kernels into a transformers model; the
``fused-llm`` command builds, benchmarks and demonstrates the packages.
"""

from __future__ import annotations

from .integration import LAYERS, KernelizeReport, kernel_mapping, kernelize, tiny_llama
from .transformers_config import kernel_config
from .packages import get_kernel, kernel_packages

__all__ = ["LAYERS", "KernelizeReport", "get_kernel", "kernel_config", "kernel_mapping", "kernel_packages", "kernelize", "tiny_llama"]
__version__ = "0.1.0"
