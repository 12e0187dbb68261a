"""fused-llm: fused GPU kernels for LLM inference, shipped as Hugging Face kernel packages.

``fused_llm.kernelize(model)`` swaps the project's kernels into a transformers model (and
fuses its decoder layers); ``fused_llm.kernel_config(model)`` gives transformers'
``KernelConfig`` for the same layers. The tooling (builder, ``fused-llm`` command, benchmarks)
is the development package ``fused_llm_dev``, which this package does not import.

The names below are imported on first use (``import fused_llm`` alone does not import torch),
so that the ``fused-llm`` command, which reads ``fused_llm.packages``, starts at once.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module of this package that defines it
_EXPORTS = {
    "LAYERS": "integration",
    "KernelizeReport": "integration",
    "kernel_mapping": "integration",
    "kernelize": "integration",
    "get_kernel": "packages",
    "kernel_packages": "packages",
    "kernel_config": "transformers_config",
    "load_w4a16": "w4a16",
    "quantize_w4a16": "w4a16",
    "FP8Linear": "fp8",
    "load_fp8": "fp8",
    "quantize_fp8": "fp8",
    "overlapped_decode": "generation",
}
_SUBMODULES = ("captured_decode", "decoder", "decoder_fp8", "decoder_w4a16", "fp8", "generation", "integration", "packages",
               "skinny", "transformers_config", "w4a16")

__all__ = [
    "LAYERS", "KernelizeReport", "get_kernel", "kernel_config", "kernel_mapping", "kernel_packages", "kernelize",
    "load_w4a16", "quantize_w4a16", "FP8Linear", "load_fp8", "quantize_fp8", "overlapped_decode",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})
