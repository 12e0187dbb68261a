"""Decode steps of ``generate`` (greedy or sampled) replayed from one CUDA graph.

Each step of transformers' ``generate`` runs on the host: inputs prepared, a causal mask built,
the compiled forward called (dynamo's guards, the AOT wrappers, cudagraph trees' input checks),
logits processors, the argmax, stopping criteria, the sequence extended. On an H200 that is 2-3
ms a step for a 32-layer Llama-3-8B-shaped model (docs/e2e.md, "Host time per step"), more than
the kernelized 4-bit model's GPU time (2.2 ms): the host, not the kernels, sets the pace.

Here the whole step (transformers' own ``prepare_inputs_for_generation`` and mask, the forward
compiled without CUDA graphs, the logits' last row in fp32, the ``min_length`` /
``min_new_tokens`` suppression of the EOS ids, the argmax, the padding of finished rows, the
EOS criterion, the positions and the sequence; when sampling, transformers' own temperature /
top-k / top-p / min-p warpers and ``torch.multinomial`` on the default generator, which a CUDA
graph advances by the captured amount each replay, as the eager steps would) works on device
buffers of fixed address and is
captured once into a CUDA graph; every later step is one ``replay``. The host reads the
finished flag after a step only where an EOS could have been chosen, and counts the steps
to ``max_length`` itself. A streamer gets each token after its step (one 8-byte copy to the
host a step, as transformers' synchronous loop hands it). The prefill and the first token are
``generate``'s own code.

It takes over ``_sample`` only where it gives the same result as transformers' loop, and hands
everything else back to it: one beam, greedy or sampled, on CUDA, a ``StaticCache``
of plain full-attention layers, no ``return_dict_in_generate``, not distributed,
no ``inputs_embeds``, logits processors only ``MinLengthLogitsProcessor`` /
``MinNewTokensLengthLogitsProcessor`` followed (when sampling) by ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``, and stopping criteria only
``MaxLengthCriteria`` / ``EosTokenCriteria`` (exact types), model inputs only ``past_key_values``, ``attention_mask``
(2D), ``position_ids``, ``logits_to_keep`` and ``use_cache``.

The captured graph is kept on the model (at most ``MAX_GRAPHS``), keyed by everything it holds
the address or the shape of: the cache's tensors, the batch, the sequence capacity, the
parameters' and buffers' storage, the EOS / padding structure, and the warpers' settings (a
temperature or a top-p is a constant of the captured kernels). A generate whose key differs
captures anew. Weights changed in place are seen by the graph (same addresses); weights
replaced by new tensors change the key.

``fused_llm.kernelize`` turns it on (``capture_decode``, default) for the calls of the model's
``generate`` (which runs inside ``fused_llm.overlapped_decode``, where this ``_sample`` is
installed).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import torch

# Device types whose decode steps are captured. The CPU runs the same step function without a
# graph when a test adds it here (the tests compare tokens against transformers' loop).
DEVICE_TYPES = ("cuda",)
# Captured graphs kept per model: each holds a private memory pool (the step's activations and
# the fp32 logits row, ~1-2 MB at batch 1 for Llama-3-8B shapes) and the cache's addresses.
MAX_GRAPHS = 4
FLAG = "_fused_llm_capture_decode"
_STATES = "_fused_llm_captured_steps"
_CALL = "_fused_llm_capture_call"
_MODEL_INPUTS = frozenset({"past_key_values", "attention_mask", "position_ids", "logits_to_keep", "use_cache"})


def enable(model) -> bool:
    """Mark ``model`` for captured decode steps (inside ``overlapped_decode``). Returns whether
    it did: only transformers generation models."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    if not isinstance(model, GenerationMixin):
        return False
    model.__dict__[FLAG] = True
    return True


def disable(model) -> None:
    """Unmark ``model`` and drop its captured graphs."""
    model.__dict__.pop(FLAG, None)
    model.__dict__.pop(_STATES, None)
    model.__dict__.pop(_CALL, None)


def ineligible_reason(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                      model_kwargs) -> str | None:  # fmt: skip
    """Why this ``_sample`` call must run transformers' loop instead (None: it need not)."""
    from transformers.cache_utils import StaticCache, StaticLayer
    from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    if not model.__dict__.get(FLAG):
        return "not enabled for this model"
    if not all(hasattr(model, name) for name in ("_prefill", "_optimize_model_for_decode", "_valid_auto_compile_criteria")):
        return "a transformers without the generate internals this was written against (5.22)"
    if input_ids.device.type not in DEVICE_TYPES:
        return f"device {input_ids.device.type}"
    if model.training:
        return "training mode"
    if synced_gpus or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return "distributed"
    if (generation_config.num_beams or 1) != 1:
        return "beam search"
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate"
    if model.config.is_encoder_decoder or generation_config.is_assistant:
        return "encoder-decoder or assistant"
    if input_ids.ndim != 2:
        return "input_ids not 2D"
    extra = set(model_kwargs) - _MODEL_INPUTS
    if extra:
        return f"model inputs {sorted(extra)}"
    if not model_kwargs.get("use_cache"):
        return "use_cache off"
    cache = model_kwargs.get("past_key_values")
    if type(cache) is not StaticCache or not all(type(layer) is StaticLayer for layer in cache.layers):
        return "not a StaticCache of full-attention layers"
    mask = model_kwargs.get("attention_mask")
    if mask is not None and (mask.ndim != 2 or mask.shape != input_ids.shape):
        return "attention_mask not 2D of input_ids' shape"
    positions = model_kwargs.get("position_ids")
    if positions is not None and (positions.ndim != 2 or positions.shape != input_ids.shape):
        return "position_ids not 2D of input_ids' shape"
    min_length_types, warper_types = (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor), _warper_types()
    kinds = [0 if type(p) in min_length_types else 1 if type(p) in warper_types else 2 for p in logits_processor]
    if 2 in kinds or kinds != sorted(kinds) or (1 in kinds and not generation_config.do_sample):
        # Other processors, or a warper before a min-length processor (the step applies them in
        # that order), or a warper without sampling.
        return f"logits processors {[type(p).__name__ for p in logits_processor]}"
    if any(type(c) not in (MaxLengthCriteria, EosTokenCriteria) for c in stopping_criteria):
        return f"stopping criteria {[type(c).__name__ for c in stopping_criteria]}"
    if stopping_criteria.max_length is None:
        return "no max_length"
    suppressed = {tuple(sorted(p.eos_token_id.reshape(-1).tolist())) for p in logits_processor if type(p) in min_length_types}
    if len(suppressed) > 1:
        return "processors suppress different ids"
    eos = [c for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
    if len(eos) > 1:
        return "several EOS criteria"
    if eos and generation_config._pad_token_tensor is None:
        return "EOS without a pad token"
    if stopping_criteria.max_length > cache.layers[0].max_cache_len + 1:
        return "max_length beyond the cache"
    return None


def _warper_types() -> tuple:
    """The sampling warpers the captured step calls: transformers' own, whose ``__call__`` reads
    nothing but the scores and their settings, and runs on the device without a host sync."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    return (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)


def _split_processors(logits_processor) -> tuple[list, list]:
    """(the min-length processors, the warpers) of an eligible call's list, in its order."""
    warpers = _warper_types()
    return [p for p in logits_processor if type(p) not in warpers], [p for p in logits_processor if type(p) in warpers]


def _warpers_key(warpers: list) -> tuple:
    """What a warper bakes into the captured kernels: its type and settings."""
    return tuple((type(w).__name__, tuple(sorted((k, repr(v)) for k, v in vars(w).items()))) for w in warpers)


@dataclass
class _Step:
    """The device buffers of one captured step and its graph."""

    tok: torch.Tensor  # [B, 1] the token fed next
    seq: torch.Tensor  # [B, capacity] the sequence so far (prompt and generated tokens)
    pos: torch.Tensor  # [] its length: the column the next token goes to
    unfinished: torch.Tensor  # [B] long, as transformers keeps it
    positions: torch.Tensor | None  # [B, 1] position ids of the fed token
    mask2d: torch.Tensor | None  # [B, max_cache_len] 2D padding mask, ones past the prompt
    eos: torch.Tensor | None  # [n] ids that finish a row
    pad: torch.Tensor | None  # [] the padding token of finished rows
    suppressed: torch.Tensor | None  # [m] ids suppressed while pos < min_len
    min_len: torch.Tensor | None  # []
    vocab: torch.Tensor | None = None  # [V] arange, made at the first step
    graph: object = None  # torch.cuda.CUDAGraph once captured; False if capture failed
    run: object = field(default=None, repr=False)  # the step function


def _key(model, cache, batch: int, capacity: int, has_mask: bool, has_positions: bool, n_eos: int, n_suppressed: int,
         logits_to_keep, generation_config, sampling: tuple) -> tuple:  # fmt: skip
    layers = tuple((layer.keys.data_ptr(), layer.values.data_ptr(), layer.cumulative_length.data_ptr()) for layer in cache.layers)
    storage = tuple(t.data_ptr() for t in model.parameters()) + tuple(t.data_ptr() for t in model.buffers())
    compile_settings = (generation_config.disable_compile, repr(generation_config.compile_config))
    return (id(cache), layers, hash(storage), batch, capacity, has_mask, has_positions, n_eos, n_suppressed, logits_to_keep,
            torch.is_inference_mode_enabled(), compile_settings, sampling)  # fmt: skip


def _forward(model, model_kwargs, generation_config):
    """The forward a step calls: transformers' compile settings without CUDA graphs (the step's
    own graph holds the compiled kernels), where transformers would compile it; else the
    eager call."""
    if not model._valid_auto_compile_criteria(model_kwargs, generation_config):
        return model.__call__
    config = generation_config.compile_config or model._default_compile_config()
    kwargs = config.to_dict()
    if kwargs.get("mode") in ("reduce-overhead", "max-autotune"):
        kwargs["mode"] = "default" if kwargs["mode"] == "reduce-overhead" else "max-autotune-no-cudagraphs"
    options = dict(kwargs.get("options") or {})
    options.pop("triton.cudagraphs", None)
    kwargs["options"] = options or None
    if kwargs.get("mode") and kwargs["options"]:
        kwargs.pop("mode")  # torch.compile takes one of the two
    cached = model.__dict__.get(_CALL)
    if cached is None or cached[0] != repr(kwargs):
        cached = (repr(kwargs), torch.compile(model.__call__, **kwargs))
        model.__dict__[_CALL] = cached
    return cached[1]


def _next_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """transformers' token selection: a draw from the softmax, or the argmax."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    return torch.argmax(scores, dim=-1)


def _make_step(model, state: _Step, forward, cache, logits_to_keep, has_eos: bool, warpers: list, do_sample: bool):
    def run():
        kwargs = {"past_key_values": cache, "use_cache": True}
        if state.mask2d is not None:
            kwargs["attention_mask"] = state.mask2d
        if state.positions is not None:
            kwargs["position_ids"] = state.positions
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        model_inputs = model.prepare_inputs_for_generation(state.tok, next_sequence_length=1, **kwargs)
        outputs = forward(**model_inputs, return_dict=True)
        scores = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=state.tok.device)
        if state.suppressed is not None:
            suppress = torch.isin(state.vocab, state.suppressed) & (state.pos < state.min_len)
            scores = torch.where(suppress, -math.inf, scores)
        for warper in warpers:  # after the min-length processors, as transformers' list has them
            scores = warper(state.seq, scores)
        next_tokens = _next_tokens(scores, do_sample)
        if has_eos:
            next_tokens = next_tokens * state.unfinished + state.pad * (1 - state.unfinished)
        state.seq.index_copy_(1, state.pos.view(1), next_tokens[:, None])
        state.tok.copy_(next_tokens[:, None])
        if has_eos:
            state.unfinished.copy_(state.unfinished & ~torch.isin(next_tokens, state.eos))
        state.pos.add_(1)
        if state.positions is not None:
            state.positions.add_(1)

    return run


def _capture(state: _Step) -> None:
    """Capture ``state.run`` (after one real step ran eagerly on a side stream, which compiled
    the forward and its kernels). A capture that fails leaves the step eager."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            state.run()
        state.graph = graph
    except Exception as error:  # noqa: BLE001: any failure keeps the eager step, which is correct
        import warnings

        warnings.warn(f"fused_llm.captured_decode: capturing the decode step failed ({error}); its steps run eagerly")
        state.graph = False


def sample(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus: bool = False,
           streamer=None, **model_kwargs):  # fmt: skip
    """``GenerationMixin._sample`` with its decode steps (greedy or sampled) replayed from a CUDA graph
    (see the module docstring); any other call goes to transformers' own."""
    from transformers.generation.stopping_criteria import EosTokenCriteria

    reason = ineligible_reason(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                               model_kwargs)  # fmt: skip
    if reason is not None:
        return _ORIGINAL_SAMPLE(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                                streamer, **model_kwargs)  # fmt: skip
    device = input_ids.device
    batch = input_ids.shape[0]
    pad_token_id = generation_config._pad_token_tensor
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(device)
    eos_ids = next((c.eos_token_id for c in stopping_criteria if isinstance(c, EosTokenCriteria)), None)
    has_eos = eos_ids is not None
    max_length = stopping_criteria.max_length
    unfinished = torch.ones(batch, dtype=torch.long, device=device)

    # Prefill and the first token: transformers' own steps.
    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
    scores = logits_processor(input_ids, outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=device))
    del outputs
    next_tokens = _next_tokens(scores, generation_config.do_sample)
    if has_eos:
        next_tokens = next_tokens * unfinished + pad_token_id * (1 - unfinished)
    input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
    unfinished = unfinished & ~stopping_criteria(input_ids, None)
    if streamer is not None:
        streamer.put(next_tokens.cpu())
    length = input_ids.shape[1]
    if length >= max_length or (has_eos and unfinished.max() == 0):
        if streamer is not None:
            streamer.end()
        return input_ids

    cache = model_kwargs["past_key_values"]
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    logits_to_keep = model_kwargs.get("logits_to_keep")
    min_length, warpers = _split_processors(logits_processor)
    min_len = max((p.min_length if hasattr(p, "min_length") else p.prompt_length_to_skip + p.min_new_tokens
                   for p in min_length), default=0)  # fmt: skip
    suppressed = min_length[0].eos_token_id.reshape(-1) if min_length and min_len > length else None
    capacity = cache.layers[0].max_cache_len + 1
    sampling = (bool(generation_config.do_sample), _warpers_key(warpers))
    key = _key(model, cache, batch, capacity, mask is not None, positions is not None,
               0 if eos_ids is None else eos_ids.numel(), 0 if suppressed is None else suppressed.numel(),
               logits_to_keep, generation_config, sampling)  # fmt: skip
    states: collections.OrderedDict = model.__dict__.setdefault(_STATES, collections.OrderedDict())
    state = states.pop(key, None)
    if state is None:
        state = _Step(
            tok=torch.empty(batch, 1, dtype=torch.long, device=device),
            seq=torch.empty(batch, capacity, dtype=input_ids.dtype, device=device),
            pos=torch.empty((), dtype=torch.long, device=device),
            unfinished=torch.empty(batch, dtype=torch.long, device=device),
            positions=None if positions is None else torch.empty(batch, 1, dtype=positions.dtype, device=device),
            mask2d=None if mask is None else torch.empty(batch, cache.layers[0].max_cache_len, dtype=mask.dtype, device=device),
            eos=None if eos_ids is None else torch.empty_like(eos_ids, device=device).reshape(-1),
            pad=None if pad_token_id is None else torch.empty((), dtype=torch.long, device=device),
            suppressed=None if suppressed is None else torch.empty(suppressed.numel(), dtype=torch.long, device=device),
            min_len=None if suppressed is None else torch.empty((), dtype=torch.long, device=device),
        )
        if suppressed is not None:
            state.vocab = torch.arange(scores.shape[-1], device=device)
    states[key] = state
    while len(states) > MAX_GRAPHS:
        states.popitem(last=False)

    # This call's values into the buffers (the graph reads them by address).
    state.tok.copy_(input_ids[:, -1:])
    state.seq[:, :length].copy_(input_ids)
    state.pos.fill_(length)
    state.unfinished.copy_(unfinished)
    if state.positions is not None:
        state.positions.copy_(positions[:, -1:])
    if state.mask2d is not None:
        state.mask2d[:, : mask.shape[1]].copy_(mask)
        state.mask2d[:, mask.shape[1] :].fill_(1)
    if state.eos is not None:
        state.eos.copy_(eos_ids.reshape(-1))
    if state.pad is not None:
        state.pad.copy_(pad_token_id.reshape(()))
    if state.suppressed is not None:
        state.suppressed.copy_(suppressed)
        state.min_len.fill_(min_len)

    with model._optimize_model_for_decode():
        if state.run is None:
            state.run = _make_step(model, state, _forward(model, model_kwargs, generation_config), cache, logits_to_keep, has_eos,
                                   warpers, bool(generation_config.do_sample))  # fmt: skip
        while length < max_length:
            if state.graph:
                state.graph.replay()
            elif state.graph is None and device.type == "cuda":
                # A new state's first step runs for real on a side stream (it compiles the
                # forward and its kernels); the step is captured after it.
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    state.run()
                torch.cuda.current_stream(device).wait_stream(side)
                _capture(state)
            else:
                state.run()
            length += 1
            if streamer is not None:
                streamer.put(state.tok[:, 0].cpu())
            # The token of this step was chosen at position length - 1: an EOS only if not suppressed there.
            if has_eos and length - 1 >= min_len and not bool(state.unfinished.any()):
                break
    if streamer is not None:
        streamer.end()
    return state.seq[:, :length].clone()


_ORIGINAL_SAMPLE = None


def install() -> None:
    """Put ``sample`` in place of ``GenerationMixin._sample`` (``generation._enter``)."""
    global _ORIGINAL_SAMPLE
    from transformers import GenerationMixin

    _ORIGINAL_SAMPLE = GenerationMixin.__dict__["_sample"]
    GenerationMixin._sample = sample  # (model, input_ids, ...): _sample's signature, model as self


def uninstall() -> None:
    from transformers import GenerationMixin

    GenerationMixin._sample = _ORIGINAL_SAMPLE
