"""fused-llm bench e2e --skinny: the kernelized model with its decode projections on skinny-gemm
against the same model kernelized without (``fused_llm.kernelize(model, skinny=False)``).

One run, one process, the methods of ``bench.e2e``: a model with random weights built in code
(the Llama-3-8B-shaped preset by default, fewer layers), copied three ways:

* ``eager``: not kernelized (left out with ``--no-eager``);
* ``kernelized without skinny``: ``kernelize(model, skinny=False)``, every projection GEMM on
  cuBLAS;
* ``kernelized``: ``kernelize(model)``, the projections whose shapes skinny-gemm's tuning table
  lists for this GPU through ``skinny_gemm.linear`` (``fused_llm.skinny``; the report says
  which, and at which token counts the table picks the skinny kernel).

Measured, the models taking turns round after round in alternating order, each figure the
median over rounds:

* decode ms/step after a 512-token prompt at each batch (default 1 and 8; one new token per
  sequence, so the projections see M = batch), ``generate`` with a static cache (transformers
  compiles the forward on a GPU, CUDA graphs included: the issue's setting, its target the
  kernelized model >= 1.05x the one without skinny at batch 1) and with the dynamic cache
  (eager forwards: ``linear``'s dispatch cost per call shows there);
* with the static cache, each model's GPU time per step (the time any kernel runs: the
  compiled kernel starts early as a programmatic dependent, so its duration overlaps its
  predecessor's) and its costliest kernels (``e2e.decode_gpu_ms``: torch.profiler over the same
  graphs). A step's wall time also holds ``generate``'s own host work, which the GPU waits on
  and no kernel shortens (docs/e2e.md; ~0.7 ms a step on the H200 host, 2026-11-28): the
  GPU-time ratio is what the projections' kernels changed;
* the speed ratios kernelized / kernelized without skinny (wall and, static cache, GPU time) and
  kernelized / eager (> 1: the kernelized model is faster);
* host time per call of ``F.linear`` and ``skinny_gemm.linear`` at each routed projection's
  shape and each batch, and which kernel the table picks there;
* top-1 agreement of each kernelized model with eager on random tokens.

Prefill is not timed: its M (batch x prompt tokens) is above the table's last bucket (64), where
``linear`` runs cuBLAS. ``--tiny`` takes a 2-layer hidden-256 model and short sequences and may
run on the CPU, whose shapes the table does not list (both kernelized models are then the same,
unless a test fills the table): a smoke test of the command, not a measurement. Writes JSON, CSV
and a PNG with the device, date and versions.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_llm import integration, packages
from fused_llm import skinny as routing

from ..models import build_model, tiny_model
from . import e2e

EAGER, WITHOUT, KERNELIZED = "eager", "kernelized without skinny", "kernelized"
DECODE_BATCHES = [1, 8]
TARGET = 1.05  # the issue's: decode batch 1, static cache, kernelized / kernelized without skinny
TINY = dict(prompt=16, steps=(1, 3), agreement=(2, 64), rounds=2)


def build_models(args, device: torch.device, dtype: torch.dtype) -> tuple[dict, dict]:
    """The models (EAGER unless --no-eager, WITHOUT, KERNELIZED) and their kernelize reports.
    fp16 / bf16 layers of these families are all fused, so kernelize swaps no function
    process-wide (the rotary swap is only for layers it does not fuse) and the copies do not
    share a swapped forward."""
    eager = tiny_model(args.model, device, dtype) if args.tiny else build_model(args.model, args.layers, device, dtype)
    without, kern = copy.deepcopy(eager), copy.deepcopy(eager)
    reports = {WITHOUT: integration.kernelize(without, skinny=False), KERNELIZED: integration.kernelize(kern)}
    models = {} if args.no_eager else {EAGER: eager}
    models.update({WITHOUT: without, KERNELIZED: kern})
    return models, reports


def linear_host_us(model, report, batches: list[int], clock: e2e.Clock) -> list[dict]:
    """Host time per call (e2e.host_us) of ``F.linear`` and ``skinny_gemm.linear`` at each routed
    projection shape of ``model`` with ``batch`` tokens, and what the table picks there."""
    sg = packages.get_kernel("skinny-gemm")
    out, shapes = [], set()
    for r in report.skinny:
        if r.shape in shapes:
            continue
        shapes.add(r.shape)
        w = routing.weight_of(model, r.name)
        for batch in batches:
            x = torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device)
            with torch.inference_mode():
                f_us = e2e.host_us(lambda: F.linear(x, w), clock.sync)
                s_us = e2e.host_us(lambda: sg.linear(x, w), clock.sync)
                picks = "skinny" if sg.dispatch_config(x, w) is not None else "cuBLAS"
            out.append({"projection": r.name, "N": w.shape[0], "K": w.shape[1], "tokens": batch,
                        "picks": picks, "F.linear us": round(f_us, 2), "skinny_gemm.linear us": round(s_us, 2)})  # fmt: skip
    return out


def run(args) -> dict:
    console, device, clock = e2e.variant_start()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    models, reports = build_models(args, device, dtype)
    cfg = models[KERNELIZED].config
    if args.tiny:
        prompt_len, (n1, n2), rounds, (agree_b, agree_t) = TINY["prompt"], TINY["steps"], TINY["rounds"], TINY["agreement"]
    else:
        prompt_len, (n1, n2) = args.prompt, ((8, 24) if args.quick else (16, 64))
        rounds, agree_b, agree_t = 3 if args.quick else 5, e2e.AGREEMENT_BATCH, 512
    rounds = args.rounds or rounds
    stages = {"decode": ["decode-static", "decode-dynamic"]}.get(args.only, [args.only]) if args.only \
        else ["decode-static", "decode-dynamic"]  # fmt: skip
    # Three models x the batches of static-cache decode: past dynamo's default of 8 graphs.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows: list[dict] = []
    for stage in stages:
        static = stage == "decode-static"
        for batch in args.batches:
            console.print(f"{stage} batch {batch}")
            prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=gen).to(device)
            gpu: dict[str, dict] | None = {} if static else None
            for name, v in e2e.decode_times(models, prompt, n1, n2, rounds, static=static, clock=clock, gpu=gpu).items():
                ms, split = statistics.median(v), (gpu or {}).get(name, {})
                rows.append(dict(stage="decode", setting="static-cache generate" if static else "dynamic-cache generate",
                                 model=name, batch=batch, tokens=1, ms=ms, ms_min=min(v), ms_max=max(v),
                                 rounds_ms=[round(t, 4) for t in v], gpu_ms=split.get("busy_ms"),
                                 gpu_kernel_sum_ms=split.get("ms"),
                                 gpu_kernels=split.get("kernels"), tokens_per_s=batch / ms * 1e3))  # fmt: skip
        if static:
            e2e.release_compiled(models.values())
    ids = torch.randint(0, cfg.vocab_size, (agree_b, agree_t), generator=gen).to(device)
    tops = {name: e2e.top1(m, ids) for name, m in models.items()}
    agree = {f"{KERNELIZED} vs {WITHOUT}": e2e.agreement(tops[KERNELIZED], tops[WITHOUT])}
    if EAGER in tops:
        agree.update({f"{name} vs {EAGER}": e2e.agreement(tops[name], tops[EAGER]) for name in (WITHOUT, KERNELIZED)})
    report = reports[KERNELIZED]
    return dict(
        gpu=torch.cuda.get_device_name() if clock.cuda else "CPU", date=datetime.date.today().isoformat(),
        versions=e2e.versions(), model=args.model, layers=2 if args.tiny else args.layers, tiny=args.tiny,
        dtype=args.dtype, quick=args.quick, only=args.only, batches=args.batches, prompt=prompt_len, steps=[n1, n2],
        reports={name: str(r) for name, r in reports.items()},
        skinny_routes=[dict(projection=name, count=n, N=N, K=K, skinny_tokens=tokens)
                       for n, name, (N, K), tokens in routing.summary(report.skinny)],
        cublas_projections=[dict(projection=name, count=n, N=N, K=K) for n, name, (N, K), _ in routing.summary(report.skinny_kept)],
        rows=rows, top1_agreement=agree, linear_host_us=linear_host_us(models[KERNELIZED], report, args.batches, clock),
    )  # fmt: skip


def ratios(result: dict) -> list[dict]:
    """Per (stage, setting, batch, tokens): each model's ms, ``skinny/no skinny`` (kernelized
    without skinny / kernelized) and ``vs eager`` (eager / kernelized); > 1: the kernelized model
    is faster. Where the GPU time per step was measured (static cache), each model's GPU ms and
    ``skinny/no skinny GPU``, the same ratio of GPU times. Static-cache batch 1 also carries the
    issue's target and whether the wall-time ratio meets it."""
    by: dict[tuple, dict] = {}
    gpu: dict[tuple, dict] = {}
    for r in result["rows"]:
        key = (r["stage"], r["setting"], r["batch"], r["tokens"])
        by.setdefault(key, {})[r["model"]] = r["ms"]
        if r.get("gpu_ms") is not None:
            gpu.setdefault(key, {})[r["model"]] = r["gpu_ms"]
    out = []
    for key, ms in by.items():
        stage, setting, batch, tokens = key
        row = dict(stage=stage, setting=setting, batch=batch, tokens=tokens)
        row.update({f"{name} ms": round(v, 3) for name, v in ms.items()})
        row["skinny/no skinny"] = round(ms[WITHOUT] / ms[KERNELIZED], 3)
        g = gpu.get(key, {})
        if WITHOUT in g and KERNELIZED in g and g[KERNELIZED] > 0:
            row.update({f"{name} GPU ms": round(v, 3) for name, v in g.items()})
            row["skinny/no skinny GPU"] = round(g[WITHOUT] / g[KERNELIZED], 3)
        if EAGER in ms:
            row["vs eager"] = round(ms[EAGER] / ms[KERNELIZED], 3)
        if setting == "static-cache generate" and batch == 1:
            row["target"] = TARGET
            row["target met"] = row["skinny/no skinny"] >= TARGET
        out.append(row)
    return out


def write(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = result["gpu"].replace(" ", "-")
    part = f"_{result['only']}" if result.get("only") else ""
    size = "tiny" if result["tiny"] else f"{result['layers']}L"
    stem = out_dir / f"e2e_skinny_{result['model']}{size}_{result['dtype']}{'_quick' if result['quick'] else ''}{e2e.prompt_tag(result)}{part}_{gpu}"
    result["ratios"] = ratios(result)
    return e2e.write_files(
        stem, result, (("skinny/no skinny", "kernelized vs kernelized without skinny"), ("vs eager", "kernelized vs not kernelized")),
        "speed ratio (> 1: kernelized with skinny faster)",
        f"{result['model']} {size} {result['dtype']}, {result['gpu']}, {result['date']}; "
        f"skinny-gemm serves {sum(r['count'] for r in result['skinny_routes'])} projection GEMMs")  # fmt: skip


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name, report in result["reports"].items():
        console.print(f"{name}:\n{report}")
    table = Table(title=f"e2e --skinny {result['model']} {'tiny' if result['tiny'] else str(result['layers']) + 'L'} "
                        f"{result['dtype']} on {result['gpu']}")  # fmt: skip
    for col in ("cache", "B", "kernelized ms", "without skinny ms", "eager ms", "skinny/no skinny", "vs eager"):
        table.add_column(col)
    for r in ratios(result):
        table.add_row(r["setting"].split("-")[0], str(r["batch"]), f"{r[f'{KERNELIZED} ms']:.3f}", f"{r[f'{WITHOUT} ms']:.3f}",
                      f"{r.get(f'{EAGER} ms', float('nan')):.3f}", f"{r['skinny/no skinny']:.3f}",
                      f"{r.get('vs eager', float('nan')):.3f}")  # fmt: skip
    console.print("skinny/no skinny: kernelized without skinny ms / kernelized ms (> 1: skinny-gemm made it faster)")
    console.print(table)
    for r in ratios(result):
        if "skinny/no skinny GPU" in r:
            console.print(f"{r['setting']}, batch {r['batch']}: GPU time per step {r[f'{KERNELIZED} GPU ms']:.3f} ms "
                          f"kernelized, {r[f'{WITHOUT} GPU ms']:.3f} without skinny: {r['skinny/no skinny GPU']:.3f}x")  # fmt: skip
        if "target" in r:
            console.print(f"static-cache decode, batch 1: {r['skinny/no skinny']:.3f}x (target >= {r['target']}x: "
                          f"{'met' if r['target met'] else 'not met'})")  # fmt: skip
    console.print("host us per call:", result["linear_host_us"] or "no projection routed to skinny-gemm")
    console.print("top-1 agreement:", result["top1_agreement"])


def build_parser() -> argparse.ArgumentParser:
    parser = e2e.variant_parser("skinny", __doc__)
    parser.add_argument("--quick", action="store_true", help="fewer decode steps and rounds")
    parser.add_argument("--only", choices=["decode", "decode-static", "decode-dynamic"],
                        help="one cache setting (split a full run over several 10-minute GPU calls)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per model (default 3 with --quick, "
                        "else 5): more rounds, a steadier median")  # fmt: skip
    parser.add_argument("--no-eager", action="store_true", help="leave out the model that is not kernelized "
                        "(one static-cache compile less per batch)")  # fmt: skip
    e2e.add_variant_tail(parser, DECODE_BATCHES)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = e2e.parse_variant_args(build_parser(), argv, "skinny")
    if args is None:
        return 2
    return e2e.finish(run(args), args.out, write, print_summary)
