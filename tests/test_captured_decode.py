"""fused_llm.captured_decode: static-cache decode steps (greedy or sampled) replayed from one
CUDA graph.

What must hold on any device: the same tokens as transformers' own loop (the bench's kwargs,
an EOS that stops rows, left padding, ``min_length``, a second call reusing the captured step,
no EOS at all, a streamer handed the same tokens; sampled, the same draws for the same seed),
the static cache's length after the call as transformers leaves it, and every
call it does not support handed to transformers' ``_sample``. On the CPU the step function runs
without a graph (the tests put the CPU among its device types); on a GPU it is captured, and
``fused-llm bench e2e`` measures its speed.
"""

from __future__ import annotations

import pytest
import torch

from fused_llm import captured_decode, generation
from fused_llm_dev.models import build_model
from fused_llm_dev.testing import device

DEVICE = torch.device(device())
SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
             max_position_embeddings=128, head_dim=16, rms_norm_eps=1e-5)  # fmt: skip


@pytest.fixture(autouse=True)
def captured_here(monkeypatch):
    """The captured step on this test's device (on the CPU: the same step, run eagerly)."""
    monkeypatch.setattr(captured_decode, "DEVICE_TYPES", (*captured_decode.DEVICE_TYPES, DEVICE.type))


def _model(seed: int = 0):
    model = build_model("llama", 2, DEVICE, torch.float32, seed, **SIZES)
    model.generation_config.pad_token_id = 0
    return model


def _cache(model, length: int = 48):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def _prompt(batch: int = 1, length: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, SIZES["vocab_size"], (batch, length), generator=g).to(DEVICE)


def _both(model, ids, **kwargs):
    """(transformers' tokens, captured tokens, their caches' lengths) for one generate call."""
    outs, lengths = [], []
    for capture in (False, True):
        if capture:
            captured_decode.enable(model)
        else:
            captured_decode.disable(model)
        cache = _cache(model)
        with torch.inference_mode(), generation.overlapped_decode():
            outs.append(model.generate(ids, past_key_values=cache, do_sample=False, **kwargs))
        lengths.append(int(cache.layers[0].cumulative_length))
    return outs[0], outs[1], lengths


def _states(model) -> int:
    return len(model.__dict__.get(captured_decode._STATES, {}))


def test_bench_kwargs_same_tokens():
    model = _model()
    ids = _prompt()
    ref, ours, lengths = _both(model, ids, max_new_tokens=20, min_new_tokens=20, pad_token_id=0)
    assert ours.shape == (1, 27)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert lengths[0] == lengths[1] == 26
    assert _states(model) == 1
    if DEVICE.type == "cuda":  # the step was captured, and the later steps replayed it
        (state,) = model.__dict__[captured_decode._STATES].values()
        assert isinstance(state.graph, torch.cuda.CUDAGraph)


def _greedy_tokens(model, ids) -> list[int]:
    """The first row's 12 greedy tokens after the prompt, with no EOS (transformers' loop)."""
    captured_decode.disable(model)
    with torch.inference_mode():
        out = model.generate(ids, past_key_values=_cache(model), do_sample=False, max_new_tokens=12, eos_token_id=None,
                             pad_token_id=0)  # fmt: skip
    return out[0, ids.shape[1]:].tolist()


def _eos_at(model, ids, step: int) -> int:
    """A token the model emits at ``step`` (greedy, no EOS): made the EOS, it stops there."""
    return _greedy_tokens(model, ids)[step]


def _first_new_token(model, ids, step: int) -> int:
    """The token of the first step >= ``step`` that the model did not emit before it: made the EOS,
    generate stops at that step, not earlier (a tiny random model repeats tokens: on the H200 the
    token of step 5 was also step 0's, and the captured step never ran)."""
    out = _greedy_tokens(model, ids)
    for s in range(max(step, 1), len(out)):
        if out[s] not in out[:s]:
            return out[s]
    pytest.skip(f"the model repeats its first tokens: {out}")


@pytest.mark.parametrize("step", [0, 1, 5])
def test_eos_stops_the_row(step):
    model = _model()
    ids = _prompt()
    eos = _eos_at(model, ids, step)
    ref, ours, lengths = _both(model, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert ours.shape[1] <= ids.shape[1] + step + 1
    assert lengths[0] == lengths[1]


def test_eos_in_one_row_pads_it_until_the_other_ends():
    model = _model()
    ids = _prompt(batch=2)
    eos = _eos_at(model, ids, 3)
    ref, ours, lengths = _both(model, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert lengths[0] == lengths[1]


def test_min_new_tokens_suppresses_eos_then_stops():
    model = _model()
    ids = _prompt()
    eos = _eos_at(model, ids, 1)
    ref, ours, _ = _both(model, ids, max_new_tokens=12, min_new_tokens=4, eos_token_id=eos, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    ref, ours, _ = _both(model, ids, max_new_tokens=12, min_length=ids.shape[1] + 3, eos_token_id=eos, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_left_padding_same_tokens():
    model = _model()
    ids = _prompt(batch=3, length=9)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    ids = ids.masked_fill(mask == 0, 0)
    ref, ours, lengths = _both(model, ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert lengths[0] == lengths[1]


def test_no_eos_and_reuse_of_the_step():
    model = _model()
    ids = _prompt()
    captured_decode.enable(model)
    cache = _cache(model)
    outs = []
    with torch.inference_mode(), generation.overlapped_decode():
        for new in (5, 17, 9):
            cache.reset()
            outs.append(model.generate(ids, past_key_values=cache, do_sample=False, max_new_tokens=new,
                                       eos_token_id=None, pad_token_id=0))  # fmt: skip
    assert _states(model) == 1  # one cache, one batch: one captured step for all three calls
    captured_decode.disable(model)
    cache = _cache(model)
    with torch.inference_mode():
        ref = model.generate(ids, past_key_values=cache, do_sample=False, max_new_tokens=17, eos_token_id=None, pad_token_id=0)
    torch.testing.assert_close(outs[1], ref, rtol=0, atol=0)
    torch.testing.assert_close(outs[0], ref[:, : ids.shape[1] + 5], rtol=0, atol=0)
    torch.testing.assert_close(outs[2], ref[:, : ids.shape[1] + 9], rtol=0, atol=0)


class _Collect:
    """A streamer that keeps what it is handed."""

    def __init__(self):
        self.items, self.ended = [], 0

    def put(self, value):
        self.items.append(value.clone())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("new_tokens", [1, 9])
def test_streamer_gets_the_same_tokens(new_tokens):
    model = _model()
    ids = _prompt()
    eos = _first_new_token(model, ids, 5)
    streams, outs = [], []
    for capture in (False, True):
        (captured_decode.enable if capture else captured_decode.disable)(model)
        streamer = _Collect()
        with torch.inference_mode(), generation.overlapped_decode():
            outs.append(model.generate(ids, past_key_values=_cache(model), do_sample=False, max_new_tokens=new_tokens,
                                       eos_token_id=eos, pad_token_id=0, streamer=streamer))  # fmt: skip
        streams.append(streamer)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    assert streams[0].ended == streams[1].ended == 1
    assert _states(model) == (new_tokens > 1)  # the captured step ran (one new token needs none)
    assert len(streams[1].items) == len(streams[0].items)
    for ours, ref in zip(streams[1].items, streams[0].items):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_one_new_token_needs_no_step():
    model = _model()
    ids = _prompt()
    ref, ours, lengths = _both(model, ids, max_new_tokens=1, pad_token_id=0)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert lengths == [ids.shape[1], ids.shape[1]]
    assert _states(model) == 0


@pytest.mark.parametrize("kwargs, reason", [
    (dict(do_sample=True, typical_p=0.9), "logits processors"),
    (dict(repetition_penalty=1.3), "logits processors"),
    (dict(return_dict_in_generate=True), "return_dict_in_generate"),
    (dict(num_beams=2), "beam search"),
])  # fmt: skip
def test_unsupported_calls_keep_transformers_loop(monkeypatch, kwargs, reason):
    model = _model()
    ids = _prompt()
    captured_decode.enable(model)
    reasons = []
    real = captured_decode.ineligible_reason

    def spy(*args, **kw):
        reasons.append(real(*args, **kw))
        return reasons[-1]

    monkeypatch.setattr(captured_decode, "ineligible_reason", spy)
    with torch.inference_mode(), generation.overlapped_decode():
        torch.manual_seed(0)
        model.generate(ids, past_key_values=_cache(model), max_new_tokens=4, pad_token_id=0, **{"do_sample": False, **kwargs})
    if kwargs.get("num_beams", 1) == 1:
        assert reasons and reasons[0] is not None and reasons[0].startswith(reason), reasons
    assert _states(model) == 0


def _both_sampled(model, ids, seed: int, **kwargs):
    """(transformers' tokens, captured tokens) of one sampled generate call, the default
    generator seeded alike before each (the draws must be the same ones)."""
    outs = []
    for capture in (False, True):
        (captured_decode.enable if capture else captured_decode.disable)(model)
        torch.manual_seed(seed)
        with torch.inference_mode(), generation.overlapped_decode():
            outs.append(model.generate(ids, past_key_values=_cache(model), do_sample=True, pad_token_id=0, **kwargs))
    return outs


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=16, min_new_tokens=16),  # the model's defaults: top-k 50
    dict(max_new_tokens=16, temperature=0.7, top_k=5),
    dict(max_new_tokens=16, temperature=1.3, top_p=0.8, top_k=0),
    dict(max_new_tokens=16, min_p=0.2, top_k=0),
    dict(max_new_tokens=12, min_new_tokens=6, top_k=3),  # an EOS suppressed, then allowed
])  # fmt: skip
def test_sampling_same_draws(kwargs):
    """Sampled decode (transformers' temperature / top-k / top-p / min-p warpers and
    torch.multinomial on the default generator inside the step): the same tokens as
    transformers' loop for the same seed, in a batch of two rows, with an EOS where one is set."""
    model = _model()
    ids = _prompt(batch=2)
    if "min_new_tokens" in kwargs and kwargs["min_new_tokens"] < kwargs["max_new_tokens"]:
        kwargs = {**kwargs, "eos_token_id": _first_new_token(model, ids, 2)}
    ref, ours = _both_sampled(model, ids, 1234, **kwargs)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert _states(model) == 1  # the step ran: the call was not handed back


def test_sampling_settings_key_the_step():
    """A temperature or a top-k is a constant of the captured step: a call with other settings
    on the same cache makes a step of its own, and each gives transformers' tokens."""
    model = _model()
    ids = _prompt()
    settings = [dict(temperature=0.5, top_k=4), dict(temperature=2.0, top_k=4), dict(temperature=0.5, top_k=4)]

    def run(i, kwargs, cache):
        torch.manual_seed(7 + i)
        with torch.inference_mode(), generation.overlapped_decode():
            cache.reset()
            return model.generate(ids, past_key_values=cache, do_sample=True, max_new_tokens=10, pad_token_id=0, **kwargs)

    captured_decode.disable(model)
    refs = [run(i, kwargs, _cache(model)) for i, kwargs in enumerate(settings)]
    captured_decode.enable(model)
    cache = _cache(model)
    for i, kwargs in enumerate(settings):
        torch.testing.assert_close(run(i, kwargs, cache), refs[i], rtol=0, atol=0)
    assert _states(model) == 2  # the third call reused the first call's step


def test_dynamic_cache_keeps_transformers_loop():
    model = _model()
    ids = _prompt()
    captured_decode.enable(model)
    with torch.inference_mode(), generation.overlapped_decode():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert _states(model) == 0
    captured_decode.disable(model)
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_transformers_sample_restored_after_the_context():
    from transformers import GenerationMixin

    before = GenerationMixin.__dict__["_sample"]
    with generation.overlapped_decode():
        assert GenerationMixin.__dict__["_sample"] is not before
        with generation.overlapped_decode():
            pass
        assert GenerationMixin.__dict__["_sample"] is not before
    assert GenerationMixin.__dict__["_sample"] is before


def test_kernelize_marks_and_unmarks(restore_hub_functions):
    import fused_llm

    model = _model()
    report = fused_llm.kernelize(model)
    assert report.overlapped_decode and report.captured_decode
    assert model.__dict__.get(captured_decode.FLAG) is True
    report = fused_llm.kernelize(model, capture_decode=False)
    assert not report.captured_decode
    assert captured_decode.FLAG not in model.__dict__


def test_kernelize_report_line():
    from fused_llm.integration import KernelizeReport

    report = KernelizeReport()
    report.captured_decode = True
    assert "replayed from one CUDA graph" in str(report)
