# generated from common/python/conftest.py by `fused-llm sync`, do not edit
"""Test-session setup of a kernel package (stamped into each package's tests/ from
common/python/conftest.py).

* This directory goes on sys.path, so the tests import the package's test helpers
  (``<package>_testing.py``, stamped beside this file) however pytest runs them: kernel-builder's
  ``nix run .#ci-test`` runs ``pytest tests`` inside the package directory alone, the checkout
  runs every package's tests in one session with ``--import-mode=importlib``, which adds no test
  directory to sys.path.
* Without a GPU, Triton kernels run in Triton's interpreter, so CI (CPU only) exercises the real
  kernel code of the Triton packages through their public API. It must be set before the first
  op call imports the kernels (``@triton.jit`` reads it at decoration time); it is skipped when
  Triton is not installed (the ops then run their plain-torch path, which the tests also cover)
  and changes nothing for packages without Triton kernels.
"""

import importlib.util
import os
import sys
from pathlib import Path

import torch

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
