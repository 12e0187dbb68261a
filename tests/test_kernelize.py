"""End to end: kernelize a tiny random-weight Llama and compare its logits with eager."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import fused_llm
import fused_llm.decoder
from fused_llm_dev.models import tiny_llama, tiny_model
from fused_llm_dev.testing import device, op_namespaces_backend

DEVICE = device()
# Float32 logits agree to rounding; bf16 models round every layer, so compare loosely.
DTYPES = [torch.float32, torch.bfloat16]  # bf16 runs the gated-mlp kernel (fp32 keeps the expression)
# kernelize swaps transformers' rotary function process-wide; conftest.py puts it back.
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens).logits.float()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", ["local", "hub"])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused-decoder", "module-swaps"])
def test_kernelize_tiny_llama(dtype, source, fuse):
    eager = tiny_llama(DEVICE, dtype)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)  # before kernelize: its rotary swap is process-wide
    report = fused_llm.kernelize(model, source=source, fuse_decoder_layers=fuse)

    layers = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaDecoderLayer"]
    norms = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"]
    acts = [n for n, m in model.named_modules() if type(m).__name__ == "SiLUActivation"]
    mlps = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaMLP"]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    assert len(acts) == len(mlps) == len(layers) == model.config.num_hidden_layers
    rotary = [n for n, _, layer in report.swapped if layer.endswith("ApplyRotaryPosEmb.forward")]
    layer_of = {n: layer for n, _, layer in report.swapped}
    if fuse and dtype != torch.float32:
        # The decoder layers compute everything inside them (the report lists them as such);
        # only the final norm is swapped on its own; no bare SiLU or MLP swap.
        assert [n for n, _ in report.fused_decoders] == layers, report
        assert sorted(layer_of) == ["model.norm"], report
        assert all(getattr(model.get_submodule(n).forward, "__func__", None) is type(model.get_submodule(n)).forward for n in acts + mlps)
    else:
        assert rotary == ["model.layers.0.self_attn.rotary_pos_emb"], report  # one function, shared
        assert not report.fused_decoders
        if fuse:  # fp32: gated-mlp has no fp32 kernel, so the layers say why they keep their forward
            assert [n for n, _, _ in report.unfused_decoders] == layers and "dtype" in report.unfused_decoders[0][2]
        assert sorted(layer_of) == sorted(norms + acts + rotary + mlps), report
        assert all(layer_of[n].endswith("SiLU.forward") for n in acts), report
        assert all(layer_of[n].endswith("LlamaMLP.forward") for n in mlps), report
    assert not report.kept
    assert all(layer_of[n].endswith("RMSNorm.forward") for n in norms if n in layer_of), report

    got = _logits(model, tokens)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    else:
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.97
        torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


@pytest.mark.kernels_ci
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_fused_decoder_families(model_type):
    """Each family's fused layer against its eager logits (Qwen2: QKV biases; Qwen3: q / k
    norms; Mistral: sliding window), and a greedy generate with the dynamic cache."""
    eager = tiny_model(model_type, DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)
    report = fused_llm.kernelize(model)
    assert len(report.fused_decoders) == model.config.num_hidden_layers, report
    got = _logits(model, tokens)
    # bf16 with random weights: near-flat logits flip a few of 38 top-1s either way.
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())
    with torch.inference_mode():
        out = model.generate(tokens[:1, :5], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 8)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("batch, length", [(2, 11), (1, 80)], ids=["fused layers", "layer's own forward"])
def test_fused_decoder_compiles_fullgraph(batch, length):
    """torch.compile(fullgraph=True) of a kernelized model: no graph break, eager's logits. At
    >= decoder.COMPILED_ORIGINAL_MIN_TOKENS tokens the compiled layer is transformers' own."""
    assert 2 * 11 < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS <= 80
    eager = tiny_llama(DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (batch, length), device=DEVICE)
    ref = _logits(eager, tokens)
    fused_llm.kernelize(model)
    torch._dynamo.reset()
    namespaces, backend = op_namespaces_backend()

    got = _logits(torch.compile(model, fullgraph=True, dynamic=False, backend=backend), tokens)
    ours = {ns for ns in namespaces if ns not in ("aten", "prims")}
    # Large compiled forwards are transformers' own down to the norms (the layer and the
    # RMSNorm swap both hand back): no custom-op call for inductor to stop at.
    assert bool(ours) == (batch * length < fused_llm.decoder.COMPILED_ORIGINAL_MIN_TOKENS), ours
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    torch.testing.assert_close(_logits(compiled, tokens), got, rtol=0.02, atol=0.02 * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_token_gqa_is_transformers_sdpa(dtype):
    """decoder.one_token_gqa (SDPA with enable_gqa, no repeat_kv) against transformers'
    sdpa_attention_forward on the same one-token inputs: grouped heads 8 / 2, a padded batch's
    boolean mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, H_kv, L, D = 3, 8, 2, 13, 64
    attn = torch.nn.Module()
    attn.num_key_value_groups, attn.scaling, attn.is_causal = H // H_kv, D**-0.5, True
    q = torch.randn(B, H, 1, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, H_kv, L, D, device=DEVICE, dtype=dtype) for _ in range(2))
    mask = torch.rand(B, 1, 1, L, device=DEVICE) > 0.3
    mask[..., -1] = True  # every row attends to something
    ref, _ = sdpa_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
    got = fused_llm.decoder.one_token_gqa(attn, q, k, v, mask, {"position_ids": None, "output_attentions": False})
    assert got.shape == ref.shape == (B, 1, H, D) and got.is_contiguous()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


def test_one_token_gqa_hands_back():
    """Where the grouped call would not be transformers' computation, or gains nothing over it,
    one_token_gqa returns None (the caller runs transformers' function)."""
    attn = torch.nn.Module()
    attn.scaling = 0.125
    one = fused_llm.decoder.one_token_gqa
    q = torch.randn(1, 8, 1, 64, device=DEVICE)
    kv = torch.randn(1, 2, 5, 64, device=DEVICE)
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool, device=DEVICE)
    assert one(attn, q, kv, kv, mask, {}) is not None
    assert one(attn, q, kv, kv, None, {}) is None  # transformers passes enable_gqa itself
    assert one(attn, q, kv, kv, torch.zeros(1, 1, 1, 5, device=DEVICE), {}) is None  # additive: cuDNN refuses it
    full = q.expand(1, 8, 5, 64)
    assert one(attn, q, full, full, mask, {}) is None  # no grouped heads
    assert one(attn, q, kv, torch.randn(1, 2, 5, 32, device=DEVICE), mask, {}) is None  # V's head size differs
    for d in (256, 60):  # above 128; not a multiple of 8
        qd, kvd = torch.randn(1, 8, 1, d, device=DEVICE), torch.randn(1, 2, 5, d, device=DEVICE)
        assert one(attn, qd, kvd, kvd, mask, {}) is None
    for name, value in (("softcap", 30.0), ("output_attentions", True), ("is_causal", True), ("sinks", kv),
                        ("position_bias", torch.zeros(1, 8, 1, 5, device=DEVICE))):  # fmt: skip
        assert one(attn, q, kv, kv, mask, {name: value}) is None, name


@pytest.mark.kernels_ci
def test_fused_decoder_decodes_through_one_token_gqa(monkeypatch):
    """Static-cache greedy decode of a kernelized GQA model (a boolean mask on every step) with
    one_token_gqa turned on (on CPU the probe leaves it off: forced here): each one-token step of
    each layer goes through it, and each step's logits match the same model's full forward over
    the same tokens (transformers' attention: no one-token step there)."""
    model = tiny_llama(DEVICE, torch.bfloat16)
    fused_llm.kernelize(model)
    layers = [m for m in model.modules() if getattr(m, "fused_llm_decoder", False)]
    assert layers and all(m.fused_llm_gqa_decode == fused_llm.decoder.masked_gqa_sdpa(DEVICE) for m in layers)
    for m in layers:
        m.fused_llm_gqa_decode = True
    results = []
    grouped = fused_llm.decoder.one_token_gqa
    monkeypatch.setattr(fused_llm.decoder, "one_token_gqa", lambda *a: results.append(grouped(*a)) or results[-1])
    prompt = torch.randint(0, model.config.vocab_size, (2, 7), device=DEVICE)
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static",
                             output_logits=True, return_dict_in_generate=True)  # fmt: skip
        full = model(out.sequences[:, :-1]).logits.float()[:, prompt.shape[1] - 1:]
    assert len(results) == 3 * len(layers) and all(r is not None for r in results)  # 3 one-token steps after the prefill
    steps = torch.stack(out.logits, dim=1).float()
    torch.testing.assert_close(steps, full, rtol=0.05, atol=0.05 * full.abs().max().item())


def test_one_token_gqa_compiles_fullgraph():
    """one_token_gqa under torch.compile(fullgraph=True) (how static-cache generate runs it): no
    graph break, the eager result."""
    attn = torch.nn.Module()
    attn.scaling = 0.125
    q = torch.randn(2, 8, 1, 64, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 9, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    mask = torch.rand(2, 1, 1, 9, device=DEVICE) > 0.3
    mask[..., 0] = True
    torch._dynamo.reset()
    ref = fused_llm.decoder.one_token_gqa(attn, q, k, v, mask, {})
    got = torch.compile(fused_llm.decoder.one_token_gqa, fullgraph=True, dynamic=False)(attn, q, k, v, mask, {})
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


def _rope_package():
    from fused_llm import packages

    return packages.get_kernel("rope-triton")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_split_kv_attention_is_transformers_sdpa(dtype):
    """decoder.split_kv_attention (rope-triton's decode_attention) against transformers'
    sdpa_attention_forward on one-token inputs: grouped heads 8 / 2 and none, a padded batch's
    boolean mask, a shared mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rope = _rope_package()
    for B, H, H_kv, L, D in ((3, 8, 2, 13, 64), (2, 4, 4, 70, 32)):
        attn = torch.nn.Module()
        attn.num_key_value_groups, attn.scaling, attn.is_causal = H // H_kv, D**-0.5, True
        q = torch.randn(B, H, 1, D, device=DEVICE, dtype=dtype)
        k, v = (torch.randn(B, H_kv, L, D, device=DEVICE, dtype=dtype) for _ in range(2))
        for mask in (torch.rand(B, 1, 1, L, device=DEVICE) > 0.3, torch.arange(L, device=DEVICE).view(1, 1, 1, L) < L - 3):
            mask[..., 0] = True  # every row attends to something
            ref, _ = sdpa_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            got = fused_llm.decoder.split_kv_attention(rope.decode_attention, attn, q, k, v, mask, {"position_ids": None})
            assert got.shape == ref.shape == (B, 1, H, D) and got.is_contiguous()
            torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_split_kv_attention_hands_back():
    """Calls split_kv_attention does not take return None (the caller goes on to one_token_gqa
    or transformers' function), and where the layers get it at all."""
    rope = _rope_package()
    attn = torch.nn.Module()
    attn.scaling = 0.125
    split = functools.partial(fused_llm.decoder.split_kv_attention, rope.decode_attention, attn)
    q = torch.randn(1, 8, 1, 64, device=DEVICE, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 5, 64, device=DEVICE, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool, device=DEVICE)
    assert split(q, kv, kv, mask, {}) is not None
    assert split(q, kv, kv, None, {}) is None
    assert split(q, kv, kv, torch.zeros(1, 1, 1, 5, device=DEVICE), {}) is None  # additive
    assert split(q, kv, kv, mask[0], {}) is None  # not the static cache's 4-D form
    assert split(q.float(), kv.float(), kv.float(), mask, {}) is None  # fp32
    assert split(q, kv, kv[..., :32], mask, {}) is None  # V's head size differs
    for d in (512, 48):  # above 256; not a power of two
        qd, kvd = torch.randn(1, 8, 1, d, device=DEVICE).bfloat16(), torch.randn(1, 2, 5, d, device=DEVICE).bfloat16()
        assert split(qd, kvd, kvd, mask, {}) is None
    for name, value in (("softcap", 30.0), ("output_attentions", True), ("sinks", kv)):
        assert split(q, kv, kv, mask, {name: value}) is None, name
    on = fused_llm.decoder.split_kv_decode
    assert on(rope, "cuda:0", None) is rope.decode_attention
    assert on(rope, "cpu", None) is None and on(rope, "cuda:0", 4096) is None and on(None, "cuda:0", None) is None


@pytest.mark.kernels_ci
def test_fused_decoder_decodes_through_split_kv_attention(monkeypatch):
    """Static-cache greedy decode of a kernelized GQA model with rope-triton's decode_attention
    (on CPU the layers leave it off: forced here): each one-token step of each layer goes through
    it, and each step's logits match the same model's full forward over the same tokens."""
    model = tiny_llama(DEVICE, torch.bfloat16)
    fused_llm.kernelize(model)
    layers = [m for m in model.modules() if getattr(m, "fused_llm_decoder", False)]
    rope = _rope_package()
    expected = rope.decode_attention if DEVICE == "cuda" else None
    assert layers and all(m.fused_llm_decode_attention is expected for m in layers)
    calls = []
    for m in layers:
        m.fused_llm_decode_attention = lambda *a, **kw: calls.append(1) or rope.decode_attention(*a, **kw)
    prompt = torch.randint(0, model.config.vocab_size, (2, 7), device=DEVICE)
    with torch.inference_mode():
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static",
                             output_logits=True, return_dict_in_generate=True)  # fmt: skip
        full = model(out.sequences[:, :-1]).logits.float()[:, prompt.shape[1] - 1:]
    assert len(calls) == 3 * len(layers)  # 3 one-token steps after the prefill
    steps = torch.stack(out.logits, dim=1).float()
    torch.testing.assert_close(steps, full, rtol=0.05, atol=0.05 * full.abs().max().item())


def test_kernelize_split_kv_decode_option():
    """kernelize(split_kv_decode=False) leaves the one-token attention to SDPA in every fused
    layer; by default the layers take rope-triton's decode_attention on a GPU only, and the
    report counts them."""
    model = tiny_llama(DEVICE, torch.bfloat16)
    report = fused_llm.kernelize(model)
    layers = [m for m in model.modules() if getattr(m, "fused_llm_decoder", False)]
    on_gpu = DEVICE == "cuda"
    assert len(report.split_kv_decode) == (len(layers) if on_gpu else 0)
    assert ("decode_attention (split-KV)" in str(report)) == on_gpu
    other = tiny_llama(DEVICE, torch.bfloat16)
    report = fused_llm.kernelize(other, split_kv_decode=False)
    assert not report.split_kv_decode
    assert all(m.fused_llm_decode_attention is None for m in other.modules() if getattr(m, "fused_llm_decoder", False))


def test_fused_decoder_keeps_weights_shared():
    """q / k / v weights are views of the fused tensor: state_dict keeps its keys and shapes."""
    model = tiny_llama(DEVICE, torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused_llm.kernelize(model)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.fused_qkv_weight.data_ptr()


def test_training_mode_keeps_the_original_forward():
    from kernels import Mode

    model = tiny_llama(DEVICE)
    report = fused_llm.kernelize(model, mode=Mode.TRAINING)
    assert not report.swapped and report.kept, "our layers have no backward, so training keeps eager"


def test_report_text():
    model = tiny_llama(DEVICE)
    text = str(fused_llm.kernelize(model))
    assert "LlamaRMSNorm -> rmsnorm_fp8" in text or "LlamaRMSNorm -> _rmsnorm_fp8" in text, text
    assert "SiLUActivation -> swiglu_fp8" in text or "SiLUActivation -> _swiglu_fp8" in text, text
    assert "ApplyRotaryPosEmb.forward" in text, text


def test_bad_source():
    with pytest.raises(ValueError, match="source: expected 'local' or 'hub'"):
        fused_llm.kernel_mapping("nowhere")
