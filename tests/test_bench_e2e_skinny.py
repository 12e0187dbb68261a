"""``fused-llm bench e2e --skinny`` on the CPU: the --tiny --quick run end to end through the CLI
(the three models, both cache settings, the ratios and the files it writes) with skinny-gemm's
table filled for the tiny model's QKV and o_proj shapes, its help, and its message without a
GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from fused_llm import packages
from fused_llm_dev import cli
from fused_llm_dev.bench import e2e, e2e_skinny

ROOT = packages.repo_root()
# The run, with skinny-gemm's table holding the tiny Llama's QKV (512 x 256, also lm_head's
# shape) at 1 token and 5-16, and o_proj (256 x 256) at 1-8: set before the CLI loads the
# package, which kernels caches, so the run's kernelize reads it.
RUN = """
import sys, torch
from importlib import import_module
from fused_llm import packages
packages.use_local_build("skinny-gemm")
sg = packages.get_kernel("skinny-gemm")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
cfg = [64, 128, 256, 1, 4, 2]
import_module(sg.__name__ + "._tuning").TABLE = {(gpu, "bfloat16", 512, 256): [(1, cfg), (4, None), (16, cfg)],
                                                  (gpu, "bfloat16", 256, 256): [(8, cfg)]}
from fused_llm_dev import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code


def test_help(capsys):
    assert _exit_code(["bench", "e2e", "--skinny", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fused-llm bench e2e --skinny") and "--tiny" in out and "--no-eager" in out
    assert "--rounds" in out
    assert _exit_code(["bench", "e2e", "--help"]) == 0
    assert "--skinny" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        e2e.main(["--skinny"])  # only through the CLI, which routes it


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a CUDA GPU")
def test_needs_a_gpu_without_tiny(capsys):
    assert cli.main(["bench", "e2e", "--skinny", "--quick"]) == 2
    assert "CUDA GPU" in capsys.readouterr().out


def test_tiny_quick_run(tmp_path):
    """The command as a user runs it on a CPU (a subprocess without TRITON_INTERPRET, which the
    package conftests set for this session: seconds instead of minutes): static and dynamic
    cache at batch 1 and 8 for the three models, the skinny / no-skinny and eager ratios, the
    issue's target at static batch 1, the routes, host times and agreements, JSON / CSV."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "torch-ext"), str(ROOT / "tools"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", RUN, "bench", "e2e", "--skinny", "--quick", "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skinny/no skinny" in proc.stdout and "target >= 1.05x" in proc.stdout
    (path,) = tmp_path.glob("e2e_skinny_llamatiny_bf16_quick_*.json")
    assert path.with_suffix(".csv").is_file()
    result = json.loads(path.read_text())
    rows = result["rows"]
    models = (e2e_skinny.EAGER, e2e_skinny.WITHOUT, e2e_skinny.KERNELIZED)
    assert {r["model"] for r in rows} == set(models)
    settings = {(r["setting"], r["batch"]) for r in rows}
    assert settings == {(f"{c}-cache generate", b) for c in ("static", "dynamic") for b in (1, 8)}
    # A step's ms is the difference of two generate lengths: on a busy CPU, with a tiny model, it
    # can come out <= 0 (seen under CI's load), so only finiteness is asserted.
    assert len(rows) == 3 * len(settings) and all(math.isfinite(r["ms"]) for r in rows)
    rats = result["ratios"]
    assert all(math.isfinite(r["skinny/no skinny"]) and math.isfinite(r["vs eager"]) for r in rats)
    assert [("target met" in r) for r in rats] == [r["setting"] == "static-cache generate" and r["batch"] == 1 for r in rats]
    routes = {r["projection"]: r["skinny_tokens"] for r in result["skinny_routes"]}
    assert routes == {"model.layers.*.self_attn.qkv": "1, 5-16", "model.layers.*.self_attn.o_proj": "1-8", "lm_head": "1, 5-16"}
    assert [r["projection"] for r in result["cublas_projections"]] == ["model.layers.*.mlp.down_proj"]
    assert "decode projections" not in result["reports"][e2e_skinny.WITHOUT]
    picks = {(r["N"], r["tokens"]): r["picks"] for r in result["linear_host_us"]}
    assert picks == {(512, 1): "skinny", (512, 8): "skinny", (256, 1): "skinny", (256, 8): "skinny"}
    agree = result["top1_agreement"]
    assert set(agree) == {f"{e2e_skinny.KERNELIZED} vs {e2e_skinny.WITHOUT}", f"{e2e_skinny.WITHOUT} vs eager",
                          f"{e2e_skinny.KERNELIZED} vs eager"}  # fmt: skip
    assert agree[f"{e2e_skinny.KERNELIZED} vs {e2e_skinny.WITHOUT}"]["agreement"] > 0.9


def test_ratios_with_gpu_time():
    """Static-cache rows that carry each model's GPU time per step give the GPU-time ratio next to
    the wall-time one; rows without it (dynamic cache, a CPU run) give only the wall ratio."""
    def row(setting, model, ms, gpu_ms=None):
        return dict(stage="decode", setting=setting, model=model, batch=1, tokens=1, ms=ms, gpu_ms=gpu_ms)

    static, dynamic = "static-cache generate", "dynamic-cache generate"
    result = dict(rows=[row(static, e2e_skinny.WITHOUT, 2.6, 1.10), row(static, e2e_skinny.KERNELIZED, 2.5, 1.00),
                        row(dynamic, e2e_skinny.WITHOUT, 4.0), row(dynamic, e2e_skinny.KERNELIZED, 4.2)])  # fmt: skip
    by = {r["setting"]: r for r in e2e_skinny.ratios(result)}
    assert by[static]["skinny/no skinny"] == round(2.6 / 2.5, 3) and by[static]["skinny/no skinny GPU"] == 1.1
    assert by[static][f"{e2e_skinny.KERNELIZED} GPU ms"] == 1.0 and by[static]["target met"] is False
    assert "skinny/no skinny GPU" not in by[dynamic] and "target" not in by[dynamic]


def test_busy_time_counts_overlap_once():
    """A dependent kernel that starts inside its predecessor (programmatic dependent launch) adds
    only what reaches past it; gaps add nothing; order of the spans does not matter."""
    assert e2e.busy_us([]) == 0
    assert e2e.busy_us([(0, 10), (5, 12), (20, 25)]) == 17
    assert e2e.busy_us([(20, 25), (0, 10), (2, 4), (5, 12)]) == 17
