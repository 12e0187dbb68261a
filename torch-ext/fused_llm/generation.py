"""Decoding that does not stall the host: transformers' deferred stop check on CUDA.

Each step of transformers' ``generate`` ends with ``StopCheck``, which reads
``unfinished_sequences.max() == 0`` on the host: the host waits there for the step's GPU work,
so the next step's host work (logits processors, stopping criteria, cache bookkeeping, dynamo's
guards, the CUDA-graph launch: 1-2.6 ms a step in the runs on H100 and H200 hosts, whatever the
model; docs/e2e.md) never overlaps the GPU. transformers has the remedy, ``DeferredStopCheck``
(the flag copied asynchronously and read one step late; when a sequence ends on EOS or a
stopping criterion, one extra forward runs and ``generate`` undoes it: its token is dropped and
the cache cropped), and enables it only on MPS. ``overlapped_decode()`` enables it on CUDA for
the calls inside it.

A cache that ``generate`` hands back (one the caller passed, or ``return_dict_in_generate``) must
be able to undo that step. transformers' dynamic layers can; its static full-attention layer
(``StaticLayer``) cannot, so inside the context it gets a ``crop`` that steps its length back
(the entries past it are masked and overwritten like any unused slot of a static cache). Other
layers (sliding-window, indexed, quantized static ones) keep their own rule: a returned cache
with such a layer decodes without the deferral, as before.

Usage::

    with fused_llm.overlapped_decode():
        out = model.generate(ids, past_key_values=StaticCache(...), max_new_tokens=256)

``fused_llm.kernelize`` makes a model's ``generate`` run inside it (``overlap_generate``; its
option ``overlap_decode``, on by default). Inside it, too, ``GenerationMixin._sample`` is
``fused_llm.captured_decode``'s for the models marked for it (kernelize's ``capture_decode``):
their decode steps (greedy or sampled) replayed from one CUDA graph; every other model and call keeps
transformers' ``_sample``.

The tokens are the same as without it (tests/test_generation.py); a generate that stops on
``max_new_tokens`` runs no extra step. A streamer receives each token one step later (the host
reads the tokens when it reads the flag).
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator

from . import captured_decode

# Device types whose generate defers the stop check inside the context: transformers' own (MPS)
# and CUDA. CPU stays synchronous (its "device" work runs on the host thread anyway).
DEVICE_TYPES = ("mps", "cuda")

_lock = threading.Lock()
_depth = 0
_saved: dict = {}


def _static_layer_crop(self, tokens_to_remove: int) -> None:
    """``StaticLayer.crop`` inside ``overlapped_decode``: removes the last ``-tokens_to_remove``
    positions by stepping the layer's length back (in place: dynamo marked its address static).
    Only negative counts (transformers' rollback convention); 0 is a no-op."""
    if tokens_to_remove > 0:
        raise ValueError(
            f"StaticLayer.crop: tokens_to_remove must be <= 0 (the number of positions to remove, negated), got {tokens_to_remove}"
        )
    if tokens_to_remove == 0 or not self.is_initialized:
        return
    self.cumulative_length.sub_(-tokens_to_remove)


def _is_supported(device, cache, cache_is_returned: bool, is_assistant: bool) -> bool:
    """``DeferredStopCheck.is_supported`` inside the context: transformers' own rule (its
    cache and assistant conditions), asked as for MPS, on every device type of DEVICE_TYPES."""
    import torch

    if getattr(device, "type", str(device)) not in DEVICE_TYPES:
        return False
    return _saved["is_supported"].__func__(torch.device("mps"), cache, cache_is_returned, is_assistant)


def _enter() -> None:
    from transformers.cache_utils import StaticLayer
    from transformers.generation import utils as gen_utils

    check = gen_utils.DeferredStopCheck
    _saved.update(
        is_supported=check.__dict__["is_supported"],
        crop=StaticLayer.__dict__.get("crop"),
        is_croppable=StaticLayer.__dict__.get("is_croppable"),
    )
    check.is_supported = staticmethod(_is_supported)
    captured_decode.install()
    StaticLayer.crop = _static_layer_crop
    # Only the plain full-attention layer: its subclasses (sliding window, indexed) keep more
    # state than a length, which _static_layer_crop does not step back.
    StaticLayer.is_croppable = property(lambda layer: type(layer) is StaticLayer)


def _exit() -> None:
    from transformers.cache_utils import StaticLayer
    from transformers.generation import utils as gen_utils

    gen_utils.DeferredStopCheck.is_supported = _saved.pop("is_supported")
    captured_decode.uninstall()
    for name in ("crop", "is_croppable"):
        value = _saved.pop(name)
        if value is None:
            delattr(StaticLayer, name)
        else:
            setattr(StaticLayer, name, value)


@contextlib.contextmanager
def overlapped_decode() -> Iterator[None]:
    """Inside it, ``generate`` on CUDA reads its stop flag a step late (transformers'
    ``DeferredStopCheck``), so the host queues step i + 1 while the GPU runs step i. Re-entrant
    and process-wide (it patches transformers' classes while any such context is open)."""
    global _depth
    with _lock:
        if _depth == 0:
            _enter()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _exit()


def _overlapped_generate(self, *args, **kwargs):
    """``generate`` of the model's class, inside ``overlapped_decode()``."""
    with overlapped_decode():
        return type(self).generate(self, *args, **kwargs)


def overlap_generate(model) -> bool:
    """From now on ``model.generate`` runs inside ``overlapped_decode()``: an instance attribute
    bound to ``model`` (``copy.deepcopy`` rebinds it to the copy), over the class's ``generate``.
    Returns whether it did (False for a module that is not a transformers generation model);
    calling it again changes nothing. ``del model.generate`` undoes it."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    if not isinstance(model, GenerationMixin):
        return False
    current = model.__dict__.get("generate")
    if not (isinstance(current, types.MethodType) and current.__func__ is _overlapped_generate):
        model.generate = types.MethodType(_overlapped_generate, model)
    return True
