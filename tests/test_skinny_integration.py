"""kernelize's skinny-gemm routing (fused_llm.skinny): which decode projections go through
skinny_gemm.linear, for which token counts, the logits that come out, torch.compile, and
``skinny=False``. skinny-gemm's tuning table is replaced per test by entries for the tiny
models' shapes on this device (the committed table lists none of them)."""

from __future__ import annotations

import copy
from importlib import import_module

import pytest
import torch
import torch.nn.functional as F

import fused_llm
from fused_llm import decoder, packages
from fused_llm import skinny as routing
from fused_llm_dev.models import build_model, tiny_model
from fused_llm_dev.testing import device

DEVICE = device()
# One skinny program per 128 weight rows and 64 tokens, the whole K (<= 688) in 3 steps: few
# programs, so Triton's interpreter runs a tiny model's GEMM in well under a second.
CONFIG = [64, 128, 256, 1, 4, 2]
# The tiny models' projection shapes (N, K): QKV / lm_head (vocab 512), q / o, k / v, down.
SHAPES = [(512, 256), (256, 256), (128, 256), (256, 688)]
pytestmark = pytest.mark.usefixtures("restore_hub_functions")


@pytest.fixture
def skinny_table(monkeypatch):
    """(skinny-gemm, its tuning table emptied for the test, this device's key in it) and a
    count of the skinny kernel's eager runs (``_run``: every gemm call ends there)."""
    sg = packages.get_kernel("skinny-gemm")
    table: dict = {}
    monkeypatch.setattr(import_module(sg.__name__ + "._tuning"), "TABLE", table)
    runs = []
    run = sg._run
    monkeypatch.setattr(sg, "_run", lambda *args: runs.append(args[2].shape) or run(*args))
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    return sg, table, gpu, runs


def _fill(table: dict, gpu: str, rows=((64, CONFIG),), shapes=SHAPES) -> None:
    for N, K in shapes:
        table[(gpu, "bfloat16", N, K)] = list(rows)


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens).logits.float()


def _close(got, ref, agree: float = 0.9) -> None:
    """test_kernelize's bf16 bounds: random weights give near-flat logits, a few top-1s flip."""
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > agree
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def _names(routes) -> list[str]:
    return sorted(r.name for r in routes)


def _fused_names(model) -> list[str]:
    layers = [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
    return sorted([f"{n}.{g}" for n in layers for g in ("self_attn.qkv", "self_attn.o_proj", "mlp.down_proj")] + ["lm_head"])


@pytest.mark.kernels_ci
def test_no_table_entry_keeps_f_linear(skinny_table):
    """The table lists none of the model's shapes: every projection keeps its cuBLAS call (the
    fused layer's F.linear / addmm, nn.Linear's forward), reported as such; the logits are
    those of kernelize(skinny=False), bit for bit."""
    sg, table, gpu, runs = skinny_table
    table[(gpu, "bfloat16", 999, 256)] = [(64, CONFIG)]  # another shape only
    eager = tiny_model("llama", DEVICE, torch.bfloat16)
    model, without = copy.deepcopy(eager), copy.deepcopy(eager)
    report = fused_llm.kernelize(model)
    assert not fused_llm.kernelize(without, skinny=False).skinny_kept
    assert not report.skinny and _names(report.skinny_kept) == _fused_names(model), report
    layer = model.model.layers[0]
    assert layer.fused_llm_linear_qkv is F.linear and layer.fused_llm_linear_o is F.linear and layer.fused_llm_skinny_down is None
    assert "forward" not in model.lm_head.__dict__
    assert "keeps F.linear (no skinny entry in the table)" in str(report), report
    tokens = torch.randint(0, 512, (2, 7), device=DEVICE)
    assert torch.equal(_logits(model, tokens), _logits(without, tokens))
    assert not runs


@pytest.mark.kernels_ci
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_fused_layers_route_qkv_o_down_lm_head(skinny_table, model_type):
    """Each family's fused layer (Qwen2: QKV biases; Qwen3: q / k norms; Mistral: sliding
    window) with QKV, o_proj, down_proj and lm_head on the skinny kernel: the report names them,
    a forward runs the kernel once per GEMM, the logits stay within test_kernelize's bounds of
    eager, and a greedy generate (decode steps of one token) runs."""
    sg, table, gpu, runs = skinny_table
    _fill(table, gpu)
    eager = tiny_model(model_type, DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, model.config.vocab_size, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)
    report = fused_llm.kernelize(model)
    assert len(report.fused_decoders) == model.config.num_hidden_layers, report
    assert _names(report.skinny) == _fused_names(model) and not report.skinny_kept, report
    assert {r.tokens for r in report.skinny} == {"1-64"}
    assert report.skinny_table == f"{'cpu' if DEVICE == 'cpu' else gpu}, bfloat16"
    _close(_logits(model, tokens), ref)
    assert runs == [torch.Size([512, 256]), torch.Size([256, 256]), torch.Size([256, 688])] * 2 + [torch.Size([512, 256])]
    runs.clear()
    with torch.inference_mode():
        out = model.generate(tokens[:1, :5], max_new_tokens=2, do_sample=False)
    assert out.shape == (1, 7) and len(runs) == 2 * 7, "prefill and one decode step, 7 GEMMs each"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", ["module swaps", "activation gated-mlp lacks"])
def test_module_projections_route(skinny_table, case):
    """Layers that keep transformers' forward: their q / k / v / o / down_proj modules (and
    gate / up where gated-mlp does not take the MLP: here an activation it lacks, which also
    keeps the layer unfused) and lm_head get skinny-gemm's Linear forward."""
    sg, table, gpu, runs = skinny_table
    _fill(table, gpu, shapes=[*SHAPES, (688, 256)])
    if case == "module swaps":
        eager, fuse = tiny_model("llama", DEVICE, torch.bfloat16), False
    else:
        eager = build_model("llama", 2, DEVICE, torch.bfloat16, 0, hidden_size=256, intermediate_size=688, num_attention_heads=8,
                            num_key_value_heads=4, vocab_size=512, hidden_act="relu")  # fmt: skip
        fuse = True
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, 512, (2, 19), device=DEVICE)
    ref = _logits(eager, tokens)
    report = fused_llm.kernelize(model, fuse_decoder_layers=fuse)
    assert not report.fused_decoders
    projs = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"] + (["gate_proj", "up_proj"] if fuse else [])
    expected = sorted(f"model.layers.{i}.{'mlp' if p.endswith(('down_proj', 'gate_proj', 'up_proj')) else 'self_attn'}.{p}"
                      for i in range(2) for p in projs) + ["lm_head"]  # fmt: skip
    assert _names(report.skinny) == sorted(expected) and not report.skinny_kept, report
    assert model.lm_head.forward.__func__ is sg.layers.Linear.forward
    _close(_logits(model, tokens), ref)
    assert len(runs) == len(expected)


@pytest.mark.kernels_ci
def test_buckets_pick_per_token_count(skinny_table):
    """A table that gives the skinny kernel to 1 and 17-64 tokens only: a 2 x 7 forward (14
    tokens) runs no skinny kernel (down_proj takes the residual addmm), a 1 x 19 forward and a
    one-token decode step run it for every routed GEMM; the report says which token counts."""
    sg, table, gpu, runs = skinny_table
    _fill(table, gpu, rows=[(1, CONFIG), (16, None), (64, CONFIG)])
    model = tiny_model("llama", DEVICE, torch.bfloat16)
    report = fused_llm.kernelize(model)
    assert {r.tokens for r in report.skinny} == {"1, 17-64"}
    assert "skinny kernel at 1, 17-64 tokens" in str(report)
    _logits(model, torch.randint(0, 512, (2, 7), device=DEVICE))
    assert not runs
    _logits(model, torch.randint(0, 512, (1, 19), device=DEVICE))
    assert len(runs) == 7
    assert routing.skinny_tokens([(1, None), (4, CONFIG), (8, CONFIG), (64, None)]) == "2-8"
    assert routing.skinny_tokens([]) == ""


@pytest.mark.kernels_ci
def test_compiles_fullgraph_with_the_skinny_op(skinny_table):
    """torch.compile(fullgraph=True) of a kernelized model whose projections skinny-gemm serves:
    no graph break, the skinny op in the graph (the table lookup traced to a constant), eager's
    logits."""
    sg, table, gpu, _ = skinny_table
    _fill(table, gpu)
    eager = tiny_model("llama", DEVICE, torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = torch.randint(0, 512, (2, 11), device=DEVICE)
    assert 2 * 11 < decoder.COMPILED_ORIGINAL_MIN_TOKENS
    ref = _logits(eager, tokens)
    fused_llm.kernelize(model)
    torch._dynamo.reset()
    ops: set[str] = set()

    def backend(gm, example_inputs):
        ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    got = _logits(torch.compile(model, fullgraph=True, dynamic=False, backend=backend), tokens)
    assert sum("skinny_gemm" in op for op in ops) >= 1, sorted(ops)
    _close(got, ref)


def test_skinny_false_and_training_route_nothing(skinny_table):
    """``skinny=False`` and training mode leave every projection alone: no routes in the report,
    no skinny run; a deep copy of a routed model keeps its routes and its logits."""
    from kernels import Mode

    sg, table, gpu, runs = skinny_table
    _fill(table, gpu)
    model = tiny_model("llama", DEVICE, torch.bfloat16)
    report = fused_llm.kernelize(model, skinny=False)
    assert not report.skinny and not report.skinny_kept and "decode projections" not in str(report)
    _logits(model, torch.randint(0, 512, (1, 5), device=DEVICE))
    assert not runs
    report = fused_llm.kernelize(tiny_model("llama", DEVICE, torch.bfloat16), mode=Mode.TRAINING)
    assert not report.skinny and not report.skinny_kept
    routed = tiny_model("llama", DEVICE, torch.bfloat16)
    fused_llm.kernelize(routed)
    clone = copy.deepcopy(routed)
    tokens = torch.randint(0, 512, (1, 5), device=DEVICE)
    assert torch.equal(_logits(clone, tokens), _logits(routed, tokens))
    assert clone.model.layers[0].fused_llm_linear_qkv is sg.linear and clone.lm_head.forward.__self__ is clone.lm_head
