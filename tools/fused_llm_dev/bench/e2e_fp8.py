"""fused-llm bench e2e --fp8 per-token|block: an FP8 model, kernelized, against what a user
would otherwise run.

One model with random weights built in code (the Llama-3-8B-shaped preset by default, fewer
layers), in five forms that take turns round after round (alternating order), each figure the
median over rounds:

* ``bf16 eager`` / ``bf16 compiled``: the model as built, and ``torch.compile(dynamic=False)``;
* ``fp8 torch eager`` / ``fp8 torch compiled``: ``fused_llm.quantize_fp8(model, scheme)`` not
  kernelized: every projection an ``FP8Linear`` whose forward quantizes its input in plain
  torch and calls ``torch._scaled_mm`` (the scheme written in plain torch, the peer);
* ``fp8 kernelized`` (and ``fp8 kernelized compiled``): the same FP8 model after
  ``fused_llm.kernelize``: the fused FP8 decoder layer (``fused_llm.decoder_fp8``).

Stages: prefill 4 x 2048 (``model(ids, use_cache=False, logits_to_keep=1)``, CUDA-event
timings), decode batch 1 with a static cache (``generate``, which compiles the forward with
CUDA graphs on a GPU; a step = (time of N2 new tokens - time of N1) / (N2 - N1); every round
kept, and each model's GPU time per step (the time any kernel runs; the kernels' summed
durations, which count a programmatic dependent's wait inside its predecessor twice, as
``gpu_kernel_sum_ms``) with its costliest kernels, torch.profiler over the same graphs: the
rest of a step is host time), then top-1
agreement with the bf16 model over 16 x 512 random tokens next to the noise floor (compiled
bf16 against eager bf16) and a numerics table (each FP8 model's logits against bf16 and fp32).
The report names the op that ran each step of the kernelized layer and the GEMM paths that
ran. Targets (issue 23, H100, Llama-3-8B shape) are printed met / missed.

On a machine without a CUDA GPU, ``--quick`` runs a tiny model (2 layers, hidden 256) with
small shapes on the CPU: a check that every stage runs (the CLI test), not a measurement.
Writes JSON, CSV and a PNG next to the other e2e results.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import platform
import statistics
from pathlib import Path

import torch

from fused_llm import fp8

from ..models import MODEL_PRESETS, build_model
from . import e2e
from .e2e import Clock, rounds_of
from .e2e_w4a16 import _kernelize_alone

# (batch, tokens) of the prefill stage, the decode batch, its prompt and the two lengths.
PREFILL = (4, 2048)
DECODE_BATCH = 1
PROMPT = 512
AGREEMENT = (16, 512)
# The tiny CPU run (--quick without a GPU): the test models' sizes.
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
            max_position_embeddings=256, head_dim=32, rms_norm_eps=1e-5)  # fmt: skip
# Issue 23's targets: kernelized FP8 time ratio against each peer (> 1: kernelized faster).
TARGETS = {
    ("prefill", "bf16 eager"): 1.6,
    ("prefill", "bf16 compiled"): 1.25,
    ("prefill", "fp8 torch compiled"): 1.15,
    ("decode-static", "bf16"): 1.5,
}
AGREEMENT_TARGET_POINTS = 0.5  # kernelized top-1 agreement at most this many points below the plain FP8 model's


def prefill_ms(runners: dict, ids, clock: Clock, reps: int, rounds: int) -> dict[str, dict]:
    """Each runner's prefill: median over ``rounds`` (the runners take turns, alternating order)
    of a median of ``reps``; (min, max) over rounds; peak MiB on a GPU."""
    peaks = {}
    for name, runner in runners.items():  # warm-up (the compile, for compiled runners)
        if clock.cuda:
            torch.cuda.reset_peak_memory_stats()
        with e2e._running(name):
            clock.median_ms(lambda r=runner: e2e._prefill(r, ids), 2, 1)
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20 if clock.cuda else None
    times = rounds_of(runners, rounds, lambda name, r: clock.median_ms(lambda: e2e._prefill(r, ids), 1, reps))
    return {name: dict(ms=statistics.median(v), ms_min=min(v), ms_max=max(v), peak_mib=peaks[name]) for name, v in times.items()}


def _logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits.float()


def numerics(logits: dict[str, torch.Tensor], reference: torch.Tensor) -> dict[str, dict]:
    """Each model's logits against ``reference``: relative error (Frobenius), max |diff| over the
    reference's max |logit|, mean |diff|, top-1 agreement."""
    out = {}
    ref_top = reference.argmax(-1)
    scale = reference.abs().max().item()
    for name, lg in logits.items():
        d = (lg - reference).abs()
        out[name] = dict(rel_err=round(((lg - reference).norm() / reference.norm()).item(), 5),
                         max_abs_over_scale=round(d.max().item() / scale, 5), mean_abs=round(d.mean().item(), 5),
                         **e2e.agreement(lg.argmax(-1), ref_top))  # fmt: skip
    return out


def run(args) -> dict:
    console, device, clock = e2e.variant_start()
    gpu = device.type == "cuda"
    tiny = not gpu
    if tiny:
        layers = 2
        bf16 = build_model(args.model, layers, device, torch.bfloat16, **TINY,
                           **({"sliding_window": 16} if args.model == "mistral" else {}))  # fmt: skip
        prefill_shape, prompt_len, (n1, n2), agree_shape, reps, rounds = (2, 32), 16, (2, 6), (2, 32), 2, 1
    else:
        layers = args.layers
        bf16 = build_model(args.model, layers, device, torch.bfloat16)
        prefill_shape, prompt_len, agree_shape = PREFILL, PROMPT, AGREEMENT
        (n1, n2), reps, rounds = ((8, 24), 5, 3) if args.quick else ((16, 64), 10, 5)
    cfg = bf16.config
    plain = copy.deepcopy(bf16)
    quant_report = fp8.quantize_fp8(plain, args.fp8)
    kern = copy.deepcopy(plain)
    # the peers keep transformers' rotary function, which kernelize swaps process-wide
    kern_report = _kernelize_alone("fp8 kernelized", kern)
    if "fp8 kernelized" in e2e._GLOBALS:
        e2e._GLOBALS["fp8 kernelized compiled"] = e2e._GLOBALS["fp8 kernelized"]
    if len(kern_report.fused_fp8_decoders) != layers:
        raise RuntimeError(f"kernelize fused {len(kern_report.fused_fp8_decoders)} of {layers} decoder layers:\n{kern_report}")
    console.print(str(quant_report))
    console.print(str(kern_report))
    compile_ = gpu or args.cpu_compile
    eager = {"bf16 eager": bf16, "fp8 torch eager": plain, "fp8 kernelized": kern}
    compiled_from = {"bf16 compiled": bf16, "fp8 torch compiled": plain, "fp8 kernelized compiled": kern} if compile_ else {}
    stages = [args.only] if args.only else ["prefill", "decode-static", "agreement"]
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows: list[dict] = []
    fp8.BACKENDS_USED.clear()
    if "prefill" in stages:
        runners = dict(eager)
        runners.update({name: torch.compile(m, dynamic=False) for name, m in compiled_from.items()})
        batch, seq = prefill_shape
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
        console.print(f"prefill {batch} x {seq}: {', '.join(runners)}")
        for name, r in prefill_ms(runners, ids, clock, reps, rounds).items():
            rows.append(dict(stage="prefill", model=name, batch=batch, tokens=seq, **r,
                             tokens_per_s=batch * seq / r["ms"] * 1e3))  # fmt: skip
        del runners
        torch._dynamo.reset()
        gc.collect()
    if "decode-static" in stages:
        prompt = torch.randint(0, cfg.vocab_size, (DECODE_BATCH, prompt_len), generator=gen).to(device)
        models = {"bf16": bf16, "fp8 torch": plain, "fp8 kernelized": kern}
        console.print(f"decode batch {DECODE_BATCH}, static cache, {prompt_len}-token prompt: {', '.join(models)}")
        gpu: dict[str, dict] = {}
        for name, v in e2e.decode_times(models, prompt, n1, n2, rounds, static=True, clock=clock, gpu=gpu).items():
            ms, split = statistics.median(v), gpu.get(name, {})
            rows.append(dict(stage="decode-static", model=name, batch=DECODE_BATCH, tokens=1, ms=ms, ms_min=min(v),
                             ms_max=max(v), rounds_ms=[round(t, 4) for t in v], gpu_ms=split.get("busy_ms"),
                             gpu_kernel_sum_ms=split.get("ms"),
                             gpu_kernels=split.get("kernels"), tokens_per_s=DECODE_BATCH / ms * 1e3))  # fmt: skip
        for model in models.values():
            if hasattr(model, "_compiled_call"):
                del model._compiled_call
        torch._dynamo.reset()
        gc.collect()
    agree = numer = None
    if "agreement" in stages:
        ids = torch.randint(0, cfg.vocab_size, agree_shape, generator=gen).to(device)
        console.print(f"agreement and numerics over {agree_shape[0]} x {agree_shape[1]} tokens")
        ref = _logits(bf16, ids)
        lg = {"fp8 torch": _logits(plain, ids)}
        with e2e._running("fp8 kernelized"):
            lg["fp8 kernelized"] = _logits(kern, ids)
        floor = {}
        if compile_:
            floor["bf16 compiled (noise floor)"] = _logits(torch.compile(bf16, dynamic=False), ids)
            torch._dynamo.reset()
        agree = {name: e2e.agreement(t.argmax(-1), ref.argmax(-1)) for name, t in {**floor, **lg}.items()}
        exact = copy.deepcopy(bf16).float()
        exact_logits = _logits(exact, ids)
        del exact
        gc.collect()
        numer = {"vs bf16": numerics({**floor, **lg}, ref), "vs fp32": numerics({"bf16": ref, **lg}, exact_logits),
                 "kernelized vs fp8 torch": numerics({"fp8 kernelized": lg["fp8 kernelized"]}, lg["fp8 torch"])}
    import kernels
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(
        gpu=torch.cuda.get_device_name() if gpu else f"CPU ({platform.processor() or platform.machine()}), tiny model",
        date=datetime.date.today().isoformat(),
        versions=dict(torch=torch.__version__, triton=triton_version, transformers=transformers.__version__,
                      kernels=kernels.__version__, python=platform.python_version(),
                      cuda=torch.version.cuda, cublas=torch.backends.cuda.preferred_blas_library().name if gpu else None),
        model=args.model, layers=layers, scheme=args.fp8, quick=args.quick, tiny=tiny, only=args.only,
        shapes=dict(prefill=list(prefill_shape), decode_batch=DECODE_BATCH, prompt=prompt_len, decode_steps=[n1, n2],
                    agreement=list(agree_shape)),
        quantize_report=str(quant_report), kernelize_report=str(kern_report),
        gemm_backends_run=sorted(fp8.BACKEND_NAMES[b] for b in fp8.BACKENDS_USED),
        rows=rows, top1_agreement_with_bf16=agree, numerics=numer,
    )  # fmt: skip


def ratios(result: dict) -> list[dict]:
    """The kernelized FP8 model's speed against every other row of its stage (> 1: faster),
    with issue 23's target where it sets one."""
    out = []
    for stage in ("prefill", "decode-static"):
        rows = {r["model"]: r for r in result["rows"] if r["stage"] == stage}
        ours = rows.get("fp8 kernelized")
        if ours is None:
            continue
        for name, r in rows.items():
            if name == "fp8 kernelized":
                continue
            ratio = r["ms"] / ours["ms"]
            target = TARGETS.get((stage, name))
            out.append(dict(stage=stage, setting=f"vs {name}", batch=r["batch"], tokens=r["tokens"], peer=name,
                            kernelized_ms=round(ours["ms"], 4), peer_ms=round(r["ms"], 4), ratio=round(ratio, 3),
                            target=target, met=None if target is None else ratio >= target))  # fmt: skip
    return out


def agreement_check(result: dict) -> dict | None:
    agree = result.get("top1_agreement_with_bf16")
    if not agree:
        return None
    ours, peer = agree["fp8 kernelized"]["agreement"], agree["fp8 torch"]["agreement"]
    gap = round((peer - ours) * 100, 2)
    return dict(kernelized=ours, fp8_torch=peer, points_below=gap, target_points=AGREEMENT_TARGET_POINTS,
                met=gap <= AGREEMENT_TARGET_POINTS)  # fmt: skip


def write(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = result["gpu"].split(" (")[0].replace(" ", "-") if not result["tiny"] else "CPU-tiny"
    part = f"_{result['only']}" if result.get("only") else ""
    quick = "_quick" if result["quick"] else ""
    stem = out_dir / f"e2e_fp8-{result['scheme']}_{result['model']}{result['layers']}L{quick}{part}_{gpu}"
    result["ratios"] = ratios(result)
    result["agreement_target"] = agreement_check(result)
    return e2e.write_files(stem, result, (("ratio", "kernelized FP8 speed ratio"),), "peer time / kernelized time",
                           f"FP8 {result['scheme']}, {result['model']} {result['layers']} layers, {result['gpu']}, "
                           f"{result['date']}", width_per_bar=0.9)  # fmt: skip


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(result["kernelize_report"])
    console.print("GEMM paths that ran:", result["gemm_backends_run"])
    table = Table(title=f"e2e FP8 {result['scheme']} {result['model']} {result['layers']}L on {result['gpu']}")
    for col in ("stage", "model", "B", "T", "ms", "min", "max", "GPU ms"):
        table.add_column(col)
    for r in result["rows"]:
        table.add_row(r["stage"], r["model"], str(r["batch"]), str(r["tokens"]), f"{r['ms']:.3f}",
                      f"{r.get('ms_min', float('nan')):.3f}", f"{r.get('ms_max', float('nan')):.3f}",
                      "" if r.get("gpu_ms") is None else f"{r['gpu_ms']:.3f}")  # fmt: skip
    console.print(table)
    for r in ratios(result):
        target = "" if r["target"] is None else f" (target {r['target']}x: {'met' if r['met'] else 'MISSED'})"
        console.print(f"{r['stage']}: kernelized FP8 {r['ratio']:.3f}x {r['peer']}{target}")
    check = agreement_check(result)
    if check:
        console.print(f"agreement: kernelized {check['points_below']} points below the plain-torch FP8 model "
                      f"(target <= {check['target_points']}: {'met' if check['met'] else 'MISSED'})")  # fmt: skip
    if result["numerics"]:
        table = Table(title=f"numerics, FP8 {result['scheme']}: logits over {result['shapes']['agreement']} tokens")
        for col in ("against", "model", "rel. error", "max |diff| / max |ref|", "mean |diff|", "top-1 agreement"):
            table.add_column(col)
        for against, by_model in result["numerics"].items():
            for name, n in by_model.items():
                table.add_row(against, name, f"{n['rel_err']:.4f}", f"{n['max_abs_over_scale']:.4f}", f"{n['mean_abs']:.4f}",
                              f"{n['agreement']:.4f} ± {n['stderr']:.4f}")  # fmt: skip
        console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fused-llm bench e2e --fp8", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fp8", required=True, choices=list(fp8.SCHEMES), help="the FP8 scheme (fused_llm.quantize_fp8)")
    parser.add_argument("--model", default="llama", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and steps; without a CUDA GPU: the tiny CPU run (a check, not a measurement)")
    parser.add_argument("--only", choices=["prefill", "decode-static", "agreement"],
                        help="one stage (a full run may exceed one 10-minute GPU call: split it)")
    parser.add_argument("--cpu-compile", action="store_true", help="tiny CPU run: include the torch.compile'd models too")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ at the root")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.quick:
        print("fused-llm bench e2e --fp8 times models on a CUDA GPU; none is visible to torch here "
              "(--quick runs a tiny model on the CPU, a check that every stage runs).")
        return 2
    return e2e.finish(run(args), args.out, write, print_summary)
