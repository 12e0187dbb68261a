"""fused-llm: fused GPU kernels for LLM inference, shipped as Hugging Face kernel packages.

``fused_llm.kernelize(model)`` swaps the project's kernels into a transformers model; the
``fused-llm`` command builds, benchmarks and demonstrates the packages.
"""

from __future__ import annotations

from .integration import LAYERS, MODEL_PRESETS, KernelizeReport, build_model, kernel_mapping, kernelize, tiny_llama, tiny_model
from .packages import get_kernel, kernel_packages
from .transformers_config import kernel_config
from .w4a16 import load_w4a16, quantize_w4a16

__all__ = ["LAYERS", "MODEL_PRESETS", "KernelizeReport", "build_model", "tiny_model", "get_kernel", "kernel_config", "kernel_mapping", "kernel_packages", "kernelize", "load_w4a16", "quantize_w4a16", "tiny_llama"]
__version__ = "0.1.0"
