"""``fused-llm bench e2e --w4a16`` on the CPU: the --tiny --quick run end to end through the CLI
(four models, every stage, the files it writes), its help and its message without a GPU, the
weight-bytes accounting, and the hub functions kernelize swaps process-wide given back to the
models that were not kernelized."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fused_llm import packages
from fused_llm_dev import cli
from fused_llm_dev.bench import e2e, e2e_w4a16


ROOT = packages.repo_root()


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code


def test_help(capsys):
    assert _exit_code(["bench", "e2e", "--w4a16", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fused-llm bench e2e --w4a16") and "--tiny" in out and "--group-size" in out
    assert _exit_code(["bench", "e2e", "--help"]) == 0
    assert "--w4a16" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a CUDA GPU")
def test_needs_a_gpu_without_tiny(capsys):
    assert cli.main(["bench", "e2e", "--w4a16", "--quick"]) == 2
    assert "CUDA GPU" in capsys.readouterr().out


def test_tiny_attention_and_capture_ab(tmp_path):
    """--attention-ab / --capture-ab: the kernelized models again with
    kernelize(split_kv_decode=False) / kernelize(capture_decode=False), in the same rounds, and
    the ratios that compare them; with --sample, every decode sampled (the rows say so)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "fused_llm_dev.cli", "bench", "e2e", "--w4a16", "--quick", "--tiny",
                           "--only", "decode-static", "--attention-ab", "--capture-ab", "--sample", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("e2e_w4a16_llamatiny_*_sampled_*.json")
    result = json.loads(path.read_text())
    assert {r["model"] for r in result["rows"]} == {*e2e_w4a16.MODELS, *e2e_w4a16.AB_MODELS}
    assert result["sampled"] == e2e.SAMPLED and all(r["setting"].endswith(", sampled") for r in result["rows"])
    expected = {"split-KV gain, bf16 kernelized", "split-KV gain, w4 kernelized", "w4/bf16 kernelized, SDPA attention",
                "captured-decode gain, bf16 kernelized", "captured-decode gain, w4 kernelized",
                "w4/bf16 kernelized, transformers' loop"}  # fmt: skip
    assert result["ratios"] and all(expected <= set(row) for row in result["ratios"])  # one a decode batch
    assert "split-KV gain" in proc.stdout and "captured-decode gain" in proc.stdout
    assert "replayed from one CUDA graph" in result["reports"]["w4 kernelize"]
    assert "replayed from one CUDA graph" not in result["reports"][e2e_w4a16.LOOP_MODELS[1]]


def test_tiny_quick_run(tmp_path):
    """The command as a user runs it on a CPU (a subprocess without TRITON_INTERPRET, which the
    package conftests set for this session: the 4-bit layers and the kernelized ops take their
    plain-torch paths, seconds instead of minutes): every stage for the four models, the
    ratios, the weight bytes (the quantized projections at ~0.258x: 4 bits plus a 16-bit scale
    per 128), the agreements, and JSON / CSV written."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "fused_llm_dev.cli", "bench", "e2e", "--w4a16", "--quick", "--tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "w4/bf16" in proc.stdout and "weight bytes" in proc.stdout
    (path,) = tmp_path.glob("e2e_w4a16_llamatiny_bf16_g128_quick_*.json")
    assert path.with_suffix(".csv").is_file()
    result = json.loads(path.read_text())
    rows = result["rows"]
    assert {r["model"] for r in rows} == set(e2e_w4a16.MODELS)
    settings = {(r["stage"], r["setting"], r["batch"], r["tokens"]) for r in rows}
    assert settings == {("prefill", "eager", 1, 32), ("prefill", "eager", 4, 64),
                        *(("decode", s, b, 1) for s in ("dynamic-cache generate", "static-cache generate",
                                                         "static-cache generate, overlapped") for b in (1, 8))}  # fmt: skip
    assert len(rows) == 4 * len(settings) and all(r["ms"] == r["ms"] for r in rows)
    assert all("w4/bf16 eager" in r and "w4/bf16 kernelized" in r for r in result["ratios"])
    w = result["weights"]
    assert 0.25 < w["quantized_ratio"] < 0.26 and w["meets_target_quantized"]
    assert w["quantized"] == {p: 2 for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    assert set(w["not_quantized"]) == {"lm_head", "model.embed_tokens", "norms"}
    assert w["quantized_ratio"] < w["linear_ratio"] < 1
    agree = result["top1_agreement_with_bf16_eager"]
    assert set(agree) == {"bf16 kernelized", "w4 eager", "w4 kernelized", "w4 kernelized vs w4 eager"}
    assert agree["w4 kernelized vs w4 eager"]["agreement"] > 0.9, "the same 4-bit weights, kernelized or not"


def test_every_4bit_layer_fused(restore_hub_functions):
    """The w4 kernelized model's layers all run the fused 4-bit decoder layer, which calls
    rope-triton itself: its rotary function keeps transformers' forward, also while it runs."""
    args = e2e_w4a16.build_parser().parse_args(["--tiny"])
    try:
        models, reports = e2e_w4a16.build_models(args, torch.device("cpu"), torch.bfloat16)
        assert "2 x LlamaDecoderLayer -> fused 4-bit decoder layer" in reports["w4 kernelize"], reports["w4 kernelize"]
        assert "rotary_pos_emb" not in reports["w4 kernelize"]
        (fn,) = e2e_w4a16._hub_functions(models["w4 kernelized"])
        with e2e._running("w4 kernelized"):
            assert getattr(fn.forward, "__func__", None) is type(fn).forward
    finally:
        for name in e2e_w4a16.MODELS:
            e2e._GLOBALS.pop(name, None)


def test_hub_function_swaps_stay_with_their_model(restore_hub_functions, monkeypatch):
    """Where the fused 4-bit layer declines a layer (forced here), kernelize swaps the rotary
    function's forward in place (process-wide for every model sharing that function object):
    build_models gives transformers' forward back and keeps the swap for the kernelized model
    only, set while it runs (bench.e2e's _GLOBALS)."""
    from fused_llm import decoder_w4a16

    monkeypatch.setattr(decoder_w4a16, "unsupported_reason", lambda layer: "declined by the test")
    args = e2e_w4a16.build_parser().parse_args(["--tiny"])
    try:
        models, reports = e2e_w4a16.build_models(args, torch.device("cpu"), torch.bfloat16)
        assert "keeps its forward: declined by the test" in reports["w4 kernelize"]
        (fn,) = e2e_w4a16._hub_functions(models["w4 kernelized"])  # its rotary function (deepcopy made it its own)
        before = None  # transformers' own forward (the class's)
        assert "rotary_pos_emb" in reports["w4 kernelize"]
        assert fn.__dict__.get("forward") is before
        swapped = e2e._GLOBALS["w4 kernelized"][fn]["forward"]
        with e2e._running("w4 kernelized"):
            assert fn.__dict__.get("forward") is swapped
        assert getattr(fn.forward, "__func__", None) is type(fn).forward, "given back"
    finally:
        for name in e2e_w4a16.MODELS:
            e2e._GLOBALS.pop(name, None)


def test_weight_bytes_with_lm_head_quantized():
    """lm_head quantized too (--lm-head): every Linear weight at ~0.258x, under the 0.27x target."""
    from fused_llm import packages
    from fused_llm import w4a16 as fw
    from fused_llm_dev.models import build_model

    dense = build_model("llama", 1, "cpu", torch.bfloat16, 0, **e2e_w4a16.TINY_SIZES)
    q = build_model("llama", 1, "cpu", torch.bfloat16, 0, **e2e_w4a16.TINY_SIZES)
    fw.quantize_w4a16(q)
    q.lm_head = packages.get_kernel("machete-w4a16").layers.W4A16Linear.from_linear(q.lm_head)
    w = e2e_w4a16.weight_bytes(dense, q, full_depth=4)
    assert w["quantized"]["lm_head"] == 1 and "lm_head" not in w["not_quantized"]
    assert w["linear_ratio"] == w["quantized_ratio"] and w["meets_target_all_linear"]
    assert w["linear_ratio_full_depth"] == w["linear_ratio"]
