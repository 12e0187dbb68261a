"""fused_llm.overlapped_decode: transformers' deferred stop check outside MPS.

On CUDA it lets ``generate`` queue step i + 1 while the GPU runs step i; the speed is measured
by ``fused-llm bench e2e --w4a16 --only decode-overlap``. Here, on any device, what must hold:
the same tokens as without it, the extra forward of a stop on EOS undone (the sequence and a
returned static cache's length as without the context), no extra forward when ``generate``
stops on its length, transformers' classes as they were after the context, and the layers whose
state a length does not describe (sliding window) left uncroppable.

The CPU has no events (``torch.Event`` refuses the CPU backend), so the tests put CPU among the
context's device types and stand in a no-op event: on the CPU every "device" operation has
completed when it returns, which is what a synchronized event would say.
"""

from __future__ import annotations

import pytest
import torch

from fused_llm import generation
from fused_llm_dev.models import build_model
from fused_llm_dev.testing import device

DEVICE = torch.device(device())
SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
             max_position_embeddings=128, head_dim=16, rms_norm_eps=1e-5)  # fmt: skip


class _DoneEvent:
    """A CPU stand-in for torch.Event: the host's work is complete when it returns."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass


@pytest.fixture
def deferral_here(monkeypatch):
    """The context's deferral on this test's device (CPU included, with a no-op event)."""
    monkeypatch.setattr(generation, "DEVICE_TYPES", (*generation.DEVICE_TYPES, DEVICE.type))
    if DEVICE.type == "cpu":
        monkeypatch.setattr(torch, "Event", _DoneEvent)


def _model(model_type: str = "llama", **extra):
    model = build_model(model_type, 2, DEVICE, torch.float32, 0, **SIZES, **extra)
    model.generation_config.pad_token_id = 0
    return model


def _static_cache(model, length: int = 64):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def _prompt(seq: int = 7):
    return torch.randint(1, SIZES["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(3)).to(DEVICE)


def _generate(model, ids, cache=None, **kwargs):
    with torch.inference_mode():
        if cache is not None:
            cache.reset()
        return model.generate(ids, past_key_values=cache, do_sample=False, **kwargs)


class _Spy:
    """Counts the forwards of ``model`` and records which stop check ``generate`` built."""

    def __init__(self, model, monkeypatch):
        from transformers.generation import utils as gen_utils

        self.forwards = 0
        self.deferred = False
        model.register_forward_pre_hook(self._count)
        original = gen_utils.DeferredStopCheck.__init__

        def init(check, *args, **kwargs):
            self.deferred = True
            original(check, *args, **kwargs)

        monkeypatch.setattr(gen_utils.DeferredStopCheck, "__init__", init)

    def _count(self, *args):
        self.forwards += 1


def test_length_stop_runs_no_extra_step(deferral_here, monkeypatch):
    model = _model()
    ids = _prompt()
    base_cache, cache = _static_cache(model), _static_cache(model)
    expected = _generate(model, ids, base_cache, max_new_tokens=9, min_new_tokens=9)
    spy = _Spy(model, monkeypatch)
    with generation.overlapped_decode():
        got = _generate(model, ids, cache, max_new_tokens=9, min_new_tokens=9)
    assert spy.deferred, "generate did not take transformers' deferred stop check inside overlapped_decode"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert spy.forwards == 9  # the prefill and 8 decode steps: none undone
    assert int(cache.get_seq_length()) == int(base_cache.get_seq_length()) == ids.shape[1] + 8


@pytest.mark.parametrize("cached", ["static", "dynamic", "none returned"])
def test_eos_stop_undoes_the_extra_step(deferral_here, monkeypatch, cached):
    model = _model()
    ids = _prompt()
    free = _generate(model, ids, max_new_tokens=12)
    eos = int(free[0, ids.shape[1] + 4])  # the 5th new token: a stop on it ends the sequence there
    first = (free[0, ids.shape[1]:] == eos).nonzero()[0].item()  # it may come earlier
    kwargs = dict(max_new_tokens=12, eos_token_id=eos)
    if cached == "static":
        base_cache, cache = _static_cache(model), _static_cache(model)
    elif cached == "dynamic":
        from transformers import DynamicCache

        base_cache, cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    else:
        base_cache = cache = None
    expected = _generate(model, ids, base_cache, **kwargs)
    assert expected.shape[1] == ids.shape[1] + first + 1  # the stop happened where it was asked for
    spy = _Spy(model, monkeypatch)
    with generation.overlapped_decode():
        got = _generate(model, ids, cache, **kwargs)
    assert spy.deferred
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert spy.forwards == first + 2  # one forward more than the steps kept: the undone one
    if cache is not None:
        assert int(cache.get_seq_length()) == int(base_cache.get_seq_length())


def test_static_cache_continues_after_a_rollback(deferral_here):
    """After the undone step a static cache's next forward writes where the synchronous one's
    does: the logits of one more token agree."""
    model = _model()
    ids = _prompt()
    free = _generate(model, ids, max_new_tokens=8)
    eos = int(free[0, ids.shape[1] + 3])
    base_cache, cache = _static_cache(model), _static_cache(model)
    expected = _generate(model, ids, base_cache, max_new_tokens=8, eos_token_id=eos)
    with generation.overlapped_decode():
        got = _generate(model, ids, cache, max_new_tokens=8, eos_token_id=eos)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    step = expected[:, -1:]
    with torch.inference_mode():
        want = model(step, past_key_values=base_cache, use_cache=True).logits
        have = model(step, past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(have, want, rtol=0, atol=0)


def test_patches_are_undone_and_reentrant(deferral_here):
    from transformers.cache_utils import StaticLayer
    from transformers.generation import utils as gen_utils

    before = gen_utils.DeferredStopCheck.__dict__["is_supported"]
    assert "crop" not in StaticLayer.__dict__ and StaticLayer.is_croppable is False
    with generation.overlapped_decode():
        with generation.overlapped_decode():
            assert StaticLayer(max_cache_len=4).is_croppable
        assert StaticLayer(max_cache_len=4).is_croppable  # the outer context still holds
        assert gen_utils.DeferredStopCheck.is_supported(torch.device("cuda"), None, False, False)
        assert not gen_utils.DeferredStopCheck.is_supported(torch.device("cuda"), None, False, True)  # an assistant
    assert gen_utils.DeferredStopCheck.__dict__["is_supported"] is before
    assert "crop" not in StaticLayer.__dict__ and StaticLayer.is_croppable is False
    assert not gen_utils.DeferredStopCheck.is_supported(torch.device("cuda"), None, False, False)


def test_sliding_window_static_cache_is_not_deferred(deferral_here, monkeypatch):
    """A returned cache with sliding-window layers cannot undo a step by its length: generate
    keeps the synchronous check for it, with the same tokens."""
    model = _model("mistral", sliding_window=4)
    ids = _prompt()
    cache = _static_cache(model)
    with generation.overlapped_decode():
        assert not cache.is_croppable
        spy = _Spy(model, monkeypatch)
        got = _generate(model, ids, cache, max_new_tokens=6, min_new_tokens=6)
    assert not spy.deferred
    torch.testing.assert_close(got, _generate(model, ids, _static_cache(model), max_new_tokens=6, min_new_tokens=6),
                               rtol=0, atol=0)  # fmt: skip


def test_static_crop_refuses_positive_counts():
    from transformers.cache_utils import StaticLayer

    with generation.overlapped_decode():
        layer = StaticLayer(max_cache_len=4)
        with pytest.raises(ValueError, match="tokens_to_remove must be <= 0"):
            layer.crop(2)
        layer.crop(-1)  # not initialized: nothing to step back


def test_overlap_generate_binds_to_the_model_and_its_copies(deferral_here, monkeypatch):
    import copy

    model = _model()
    ids = _prompt()
    # From a second model of the same seed: on CUDA `generate` compiles the static-cache forward
    # and caches it on the model (`_compiled_call`), and a deep copy keeps calling the
    # original's, so the copy's forwards would not be counted.
    plain = _model()
    expected = _generate(plain, ids, _static_cache(plain), max_new_tokens=5, min_new_tokens=5)
    assert generation.overlap_generate(model) and generation.overlap_generate(model)  # twice: one wrapper
    twin = copy.deepcopy(model)
    assert twin.generate.__self__ is twin, "a deep copy's generate must run the copy, not the original"
    spy = _Spy(twin, monkeypatch)
    torch.testing.assert_close(_generate(twin, ids, _static_cache(twin), max_new_tokens=5, min_new_tokens=5), expected,
                               rtol=0, atol=0)  # fmt: skip
    assert spy.deferred and spy.forwards == 5
    del model.generate  # back to the class's
    assert "generate" not in model.__dict__
    assert not generation.overlap_generate(torch.nn.Linear(2, 2))


def test_kernelize_overlaps_generate(restore_hub_functions):
    import fused_llm

    model = _model()
    report = fused_llm.kernelize(model, fuse_decoder_layers=False, skinny=False)
    assert report.overlapped_decode and "stop check deferred" in str(report)
    assert model.generate.__func__ is generation._overlapped_generate
    other = _model()
    report = fused_llm.kernelize(other, fuse_decoder_layers=False, skinny=False, overlap_decode=False)
    assert not report.overlapped_decode and "generate" not in other.__dict__
