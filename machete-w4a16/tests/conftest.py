"""Without a GPU, run the Triton kernels in Triton's interpreter, so CI (CPU only) exercises the
real kernel code through the public API. Must be set before the first op call imports the
kernels (``@triton.jit`` reads it at decoration time). Skipped when Triton is not installed:
the ops then run their plain-torch path, which the tests also cover."""

import importlib.util
import os

import torch

if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
