# generated from common/python/light_ops.py by `fused-llm sync`, do not edit
"""Ops defined in Python with the dispatch cost of a C++ op.

Why: ``torch.library.custom_op`` wraps its function in Python autograd, ADInplaceOrView and
aliasing checks; on the H100 host one call of rope-triton's rotary op cost ~100 us of host
time around a 10 us launch, and on a CPU box 55 us for an op that does nothing (torch.add
5.6 us). The same schema defined with ``torch.library.Library.define`` and one
CompositeExplicitAutograd kernel dispatches in ~5 us. torch.compile sees both the same way
(the schema's ``(a!)`` annotations declare the mutated outputs; the fake implementation gives
shapes). Inference only: no autograd formula is registered.
"""

from __future__ import annotations

from typing import Callable

import torch

_LIBRARIES: dict[str, torch.library.Library] = {}  # kept alive: an op lives as long as its Library


def define_op(qualname: str, schema: str, impl: Callable, fake: Callable) -> None:
    """Define ``namespace::name`` with ``schema`` (the part after the name, e.g.
    ``"(Tensor(a!) out, Tensor x) -> ()"``), ``impl`` for every device and ``fake`` for
    torch.compile's shape propagation."""
    namespace, name = qualname.split("::")
    library = _LIBRARIES.get(namespace)
    if library is None:
        library = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library.define(name + schema)
    library.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, lib=library)(fake)


__all__ = ["define_op"]
