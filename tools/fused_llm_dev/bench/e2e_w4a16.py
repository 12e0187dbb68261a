"""fused-llm bench e2e --w4a16: a 4-bit model next to the bf16 model it was quantized from.

One run, one process, the methods of ``bench.e2e``: a model with random weights built in code
(the Llama-3-8B-shaped preset, fewer layers), copied four ways:

* ``bf16 eager``: not kernelized; ``bf16 kernelized``: ``fused_llm.kernelize``;
* ``w4 eager``: ``fused_llm.quantize_w4a16(group_size=128, zero_point=False)`` (machete-w4a16's
  ``W4A16Linear`` in place of q/k/v/o/gate/up/down; embeddings, norms and lm_head stay 16-bit,
  unless ``--lm-head`` quantizes lm_head too);
* ``w4 kernelized``: the same, then ``fused_llm.kernelize``: every decoder layer runs the fused
  4-bit layer (``fused_llm.decoder_w4a16``: one 4-bit GEMM for q / k / v and one for gate / up,
  rmsnorm-fp8, rope-triton, swiglu-fp8; the kernelize report in the output says step by step).
* with ``--attention-ab``, the two kernelized models once more with ``kernelize(...,
  split_kv_decode=False)``: their one-token attention left to SDPA (cuDNN) instead of
  rope-triton's split-KV ``decode_attention``, timed in the same rounds (the ``split-KV gain``
  ratios: SDPA ms / split-KV ms);
* with ``--capture-ab``, the two kernelized models once more with ``kernelize(...,
  capture_decode=False)``: their static-cache decode steps run by transformers' loop
  instead of replayed from one CUDA graph (``fused_llm.captured_decode``), in the same rounds
  (the ``captured-decode gain`` ratios: loop ms / captured ms).

Measured, the models taking turns round after round in alternating order, each figure the
median over rounds (as ``bench.e2e``):

* prefill ms at (1, 512) and (4, 2048): ``model(ids, use_cache=False, logits_to_keep=1)``, eager;
* decode ms/step at batch 1 and 8 after a 512-token prompt, ``generate`` with the dynamic cache
  and with a static cache (transformers compiles the forward on a GPU, CUDA graphs included);
  a step = (time of N2 new tokens - time of N1) / (N2 - N1); with a static cache also each
  model's GPU time per step (the time any kernel runs; the summed kernel durations, which count
  a programmatic dependent's wait inside its predecessor twice, as ``gpu_kernel_sum_ms``) and
  its costliest kernels (torch.profiler, the same graphs); and the static-cache decode again
  inside ``fused_llm.overlapped_decode()`` (``decode-overlap``: generate reads its stop flag a
  step late, so its host work per step overlaps the GPU's instead of following it). The
  kernelized models' generate is overlapped in both static stages (``kernelize``'s
  ``overlap_decode``); ``decode-overlap`` puts the eager models on the same footing; greedy,
  or with ``--sample`` sampled at Llama-3-Instruct's settings (``bench.e2e.SAMPLED``: the
  temperature / top-k / top-p warpers and ``torch.multinomial`` in every step);
* speed ratios 4-bit vs bf16 (> 1: the 4-bit model is faster), eager and kernelized;
* weight bytes: every Linear weight of the bf16 model against the 4-bit model's (the packed
  codes, scales and zeros of the quantized ones plus the Linear weights left 16-bit), the
  quantized projections alone (the issue's target: <= 0.27x), what is and is not quantized;
* top-1 agreement of each model's logits with the bf16 eager model on random tokens, with the
  binomial standard error (bf16 kernelized: the noise floor of kernel rounding).

``--tiny`` takes a 2-layer hidden-256 model and short sequences and may run on the CPU (the
4-bit layers then run machete-w4a16's plain-torch path): a smoke test of the whole command, not
a measurement. Writes JSON, CSV and a PNG with the device, date and versions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import statistics
from pathlib import Path

import torch
from torch import nn

from fused_llm import integration, packages
from fused_llm import w4a16 as fw
from fused_llm.generation import overlapped_decode

from ..models import build_model
from . import e2e

MODELS = ("bf16 eager", "bf16 kernelized", "w4 eager", "w4 kernelized")
# Same-round A/B runs of a kernelize option: the two kernelized models again with it off.
# The flag's attribute: (the copies' name suffix, kernelize's options, the gain ratio's label,
# what the copies run instead, for --help).
AB_OPTIONS = {
    "attention_ab": ("SDPA attention", dict(split_kv_decode=False), "split-KV gain", "the one-token attention left to SDPA"),
    "capture_ab": ("transformers' loop", dict(capture_decode=False), "captured-decode gain",
                   "their decode steps run by transformers' loop"),
}  # fmt: skip


def ab_models(suffix: str) -> tuple[str, str]:
    return f"bf16 kernelized, {suffix}", f"w4 kernelized, {suffix}"


SDPA_MODELS = ab_models(AB_OPTIONS["attention_ab"][0])
LOOP_MODELS = ab_models(AB_OPTIONS["capture_ab"][0])
AB_MODELS = (*SDPA_MODELS, *LOOP_MODELS)
# The shapes (a subset of bench.e2e's), and bench.e2e's prompt and agreement batch.
PREFILL = [(1, 512), (4, 2048)]
DECODE_BATCHES = [1, 8]
TARGET_BYTES_RATIO = 0.27
# --tiny: sizes that run in seconds on a CPU; every K a multiple of the group size (128).
TINY_SIZES = dict(hidden_size=256, intermediate_size=768, num_attention_heads=8, num_key_value_heads=4,
                  vocab_size=512, max_position_embeddings=512, head_dim=32, rms_norm_eps=1e-5)  # fmt: skip
TINY = dict(prefill=[(1, 32), (4, 64)], prompt=16, steps=(1, 3), agreement=(2, 64), reps=2, rounds=2)
# Decoder layers of the real models the presets are shaped like (Llama 3 8B, Mistral 7B, Qwen2
# 7B, Qwen3 8B): the weight-bytes ratio extrapolated to the full depth (the lm_head's share
# shrinks with depth).
FULL_DEPTH = {"llama": 32, "mistral": 32, "qwen2": 28, "qwen3": 36}


# ---------------------------------------------------------------------------------------------
# The four models
# ---------------------------------------------------------------------------------------------


def _hub_functions(model: nn.Module) -> list[nn.Module]:
    """The process-wide hub function modules (e.g. apply_rotary_pos_emb) the model's modules use."""
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        for fn in getattr(module, "_kernel_funcs", {}).values():
            if isinstance(fn, nn.Module):
                found[id(fn)] = fn
    return list(found.values())


def _kernelize_alone(name: str, model: nn.Module, **options):
    """``integration.kernelize(model)``, with the hub functions whose forward it swaps in place
    (the rotary function, where a fused layer declines a decoder layer: the report says why)
    given back and set for this model only while it runs (bench.e2e's _GLOBALS). The swap is
    process-wide for every model sharing the function object; the deep copies made here hold
    their own copy, and this keeps it so whatever order the models are built in."""
    fns = _hub_functions(model)
    before = {fn: fn.__dict__.get("forward") for fn in fns}
    report = integration.kernelize(model, **options)
    swapped = {}
    for fn, old in before.items():
        new = fn.__dict__.get("forward")
        if new is not old:
            swapped[fn] = {"forward": new}
            if old is None:
                del fn.__dict__["forward"]
            else:
                fn.__dict__["forward"] = old
    if swapped:
        e2e._GLOBALS[name] = swapped
    return report


def build_models(args, device: torch.device, dtype: torch.dtype) -> tuple[dict, dict]:
    """The four models (MODELS) and the reports of kernelize / quantize_w4a16."""
    if args.tiny:
        extra = {"sliding_window": 16} if args.model == "mistral" else {}
        eager = build_model(args.model, 2, device, dtype, 0, **TINY_SIZES, **extra)
    else:
        eager = build_model(args.model, args.layers, device, dtype)
    models = {"bf16 eager": eager}
    reports = {}
    models["bf16 kernelized"] = copy.deepcopy(eager)
    reports["bf16 kernelize"] = str(_kernelize_alone("bf16 kernelized", models["bf16 kernelized"]))
    w4 = copy.deepcopy(eager)
    reports["quantize_w4a16"] = str(fw.quantize_w4a16(w4, group_size=args.group_size, zero_point=args.zero_point))
    head = w4.get_output_embeddings()
    if args.lm_head and isinstance(head, nn.Linear) and head.weight is not w4.get_input_embeddings().weight:
        layer = packages.get_kernel("machete-w4a16").layers.W4A16Linear
        w4.lm_head = layer.from_linear(head, group_size=args.group_size, zero_point=args.zero_point)
        reports["quantize_w4a16"] += "; lm_head -> W4A16Linear (--lm-head)"
    models["w4 eager"] = w4
    models["w4 kernelized"] = copy.deepcopy(w4)
    reports["w4 kernelize"] = str(_kernelize_alone("w4 kernelized", models["w4 kernelized"]))
    for flag, (suffix, options, _, _) in AB_OPTIONS.items():
        if getattr(args, flag, False):
            for name, base in zip(ab_models(suffix), (eager, w4)):
                models[name] = copy.deepcopy(base)
                reports[name] = str(_kernelize_alone(name, models[name], **options))
    return models, reports


def weight_bytes(dense: nn.Module, quantized: nn.Module, full_depth: int | None = None) -> dict:
    """Weight bytes of the bf16 model and of its 4-bit copy: every Linear weight (a quantized
    one counts its packed codes, scales, zeros and permutation), the quantized projections
    alone, and the rest (embeddings: the same in both); what was and was not quantized.
    ``full_depth``: the Linear ratio extrapolated to that many decoder layers (the quantized
    projections scaled by full_depth / the model's layers, the rest as is)."""
    W4A16Linear = packages.get_kernel("machete-w4a16").layers.W4A16Linear

    def size(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    dense_linear = {n: size(m.weight) for n, m in dense.named_modules() if isinstance(m, nn.Linear)}
    q_packed, q_dense, kept = {}, 0, {}
    for name, m in quantized.named_modules():
        if isinstance(m, W4A16Linear):
            q_packed[name] = m.quantized_weight().nbytes()
            q_dense += dense_linear[name]
        elif isinstance(m, nn.Linear):
            kept[name] = size(m.weight)
    embeddings = {n: size(m.weight) for n, m in dense.named_modules() if isinstance(m, nn.Embedding)}
    tied = any(m.weight is e.weight for m in dense.modules() if isinstance(m, nn.Linear)
               for e in dense.modules() if isinstance(e, nn.Embedding))  # fmt: skip
    bf16_linear = sum(dense_linear.values())
    w4_linear = sum(q_packed.values()) + sum(kept.values())
    kinds: dict[str, int] = {}
    for name in q_packed:
        kinds[name.rsplit(".", 1)[-1]] = kinds.get(name.rsplit(".", 1)[-1], 0) + 1
    emb = sum(embeddings.values()) if not tied else 0  # a tied lm_head is counted once, as a Linear
    out = dict(
        bf16_linear_bytes=bf16_linear, w4_linear_bytes=w4_linear, linear_ratio=round(w4_linear / bf16_linear, 4),
        quantized_bf16_bytes=q_dense, quantized_w4_bytes=sum(q_packed.values()),
        quantized_ratio=round(sum(q_packed.values()) / q_dense, 4),
        embedding_bytes=emb, total_ratio=round((w4_linear + emb) / (bf16_linear + emb), 4),
        target=TARGET_BYTES_RATIO, quantized=kinds,
        not_quantized={**{n: f"nn.Linear, {b / 2**20:.1f} MiB, 16-bit" for n, b in kept.items()},
                       **{n: f"nn.Embedding, {b / 2**20:.1f} MiB, 16-bit" + (" (tied to lm_head)" if tied else "")
                          for n, b in embeddings.items()},
                       "norms": "16-bit"},
    )  # fmt: skip
    layers = getattr(dense.config, "num_hidden_layers", None)
    if full_depth and layers:
        f = full_depth / layers
        kept_b = sum(kept.values())
        out["full_depth_layers"] = full_depth
        out["linear_ratio_full_depth"] = round((f * out["quantized_w4_bytes"] + kept_b) / (f * q_dense + kept_b), 4)
    out["meets_target_quantized"] = out["quantized_ratio"] <= TARGET_BYTES_RATIO
    out["meets_target_all_linear"] = out["linear_ratio"] <= TARGET_BYTES_RATIO
    return out


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run(args) -> dict:
    console, device, clock = e2e.variant_start()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    models, reports = build_models(args, device, dtype)
    cfg = models["bf16 eager"].config
    if args.tiny:
        prefill, prompt_len, (n1, n2), (agree_b, agree_t) = TINY["prefill"], TINY["prompt"], TINY["steps"], TINY["agreement"]
    else:
        prefill, prompt_len, (n1, n2) = PREFILL, args.prompt, ((8, 24) if args.quick else (16, 64))
        agree_b, agree_t = e2e.AGREEMENT_BATCH, 512
    reps = TINY["reps"] if args.tiny else 5 if args.quick else 10
    rounds = TINY["rounds"] if args.tiny else 3 if args.quick else 5
    groups = {"decode": ["decode-dynamic", "decode-static", "decode-overlap"]}
    stages = [s for part in args.only.split(",") for s in groups.get(part, [part])] if args.only else STAGES
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows: list[dict] = []

    def add(stage, setting, batch, tokens, times, gpu=None):
        for name, v in times.items():
            ms, split = statistics.median(v), (gpu or {}).get(name, {})
            rows.append(dict(stage=stage, setting=setting, model=name, batch=batch, tokens=tokens, ms=ms, ms_min=min(v),
                             ms_max=max(v), gpu_ms=split.get("busy_ms"), gpu_kernel_sum_ms=split.get("ms"),
                             gpu_kernels=split.get("kernels"),
                             tokens_per_s=batch * (tokens if stage == "prefill" else 1) / ms * 1e3))  # fmt: skip

    if "prefill" in stages:
        for batch, seq in prefill:
            console.print(f"prefill {batch} x {seq}")
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
            for name, m in models.items():  # warm-up
                with e2e._running(name):
                    clock.median_ms(lambda m=m: e2e._prefill(m, ids), 2, 1)
            add("prefill", "eager", batch, seq,
                e2e.rounds_of(models, rounds, lambda name, m: clock.median_ms(lambda: e2e._prefill(m, ids), 1, reps)))
    # decode-overlap: the static-cache generate inside fused_llm.overlapped_decode() (the stop flag
    # read a step late, so generate's host work overlaps the GPU); it reuses decode-static's
    # compiled forwards, so the compiled graphs are released after both.
    settings = {"decode-dynamic": "dynamic-cache generate", "decode-static": "static-cache generate",
                "decode-overlap": "static-cache generate, overlapped"}  # fmt: skip
    for stage in ("decode-dynamic", "decode-static", "decode-overlap"):
        if stage not in stages:
            continue
        static = stage != "decode-dynamic"
        overlap = overlapped_decode if stage == "decode-overlap" else contextlib.nullcontext
        for batch in args.batches:
            console.print(f"{stage} batch {batch}")
            prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=gen).to(device)
            gpu: dict[str, dict] | None = {} if static else None
            with overlap():
                times = e2e.decode_times(models, prompt, n1, n2, rounds, static=static, clock=clock, gpu=gpu,
                                         sample=args.sample)  # fmt: skip
            add("decode", settings[stage] + (", sampled" if args.sample else ""), batch, 1, times, gpu)
    if any(stage in stages for stage in ("decode-static", "decode-overlap")):
        e2e.release_compiled(models.values())
    ids = torch.randint(0, cfg.vocab_size, (agree_b, agree_t), generator=gen).to(device)
    tops = {}
    for name, m in models.items():
        with e2e._running(name):
            tops[name] = e2e.top1(m, ids)
    agree = {name: e2e.agreement(t, tops["bf16 eager"]) for name, t in tops.items() if name != "bf16 eager"}
    agree["w4 kernelized vs w4 eager"] = e2e.agreement(tops["w4 kernelized"], tops["w4 eager"])
    weights = weight_bytes(models["bf16 eager"], models["w4 eager"], None if args.tiny else FULL_DEPTH.get(args.model))
    return dict(
        gpu=torch.cuda.get_device_name() if clock.cuda else "CPU", date=datetime.date.today().isoformat(),
        versions=e2e.versions(),
        model=args.model, layers=2 if args.tiny else args.layers, tiny=args.tiny, dtype=args.dtype, quick=args.quick,
        only=args.only, group_size=args.group_size, zero_point=args.zero_point, lm_head_quantized=args.lm_head,
        sampled=e2e.SAMPLED if args.sample else None,
        prompt=prompt_len, steps=[n1, n2],
        reports=reports, rows=rows, weights=weights, top1_agreement_with_bf16_eager=agree,
    )  # fmt: skip


def ratios(result: dict) -> list[dict]:
    """Per (stage, setting, batch, tokens): each model's ms and the speed ratios of the 4-bit
    models against the bf16 ones (> 1: 4-bit faster), eager against eager and kernelized
    against kernelized, and the 4-bit kernelized model against the bf16 kernelized one."""
    by: dict[tuple, dict] = {}
    for r in result["rows"]:
        by.setdefault((r["stage"], r["setting"], r["batch"], r["tokens"]), {})[r["model"]] = r["ms"]
    out = []
    for (stage, setting, batch, tokens), ms in by.items():
        row = dict(stage=stage, setting=setting, batch=batch, tokens=tokens)
        row.update({f"{name} ms": round(v, 3) for name, v in ms.items()})
        pairs = [("w4/bf16 eager", "bf16 eager", "w4 eager"), ("w4/bf16 kernelized", "bf16 kernelized", "w4 kernelized")]
        pairs += [(f"w4/bf16 kernelized, {suffix}", *ab_models(suffix)) for suffix, *_ in AB_OPTIONS.values()]
        for label, bf16, w4 in pairs:
            if bf16 in ms and w4 in ms:
                row[label] = round(ms[bf16] / ms[w4], 3)
        for suffix, _, gain, _ in AB_OPTIONS.values():  # option off ms / on ms
            for off, on in zip(ab_models(suffix), ("bf16 kernelized", "w4 kernelized")):
                if off in ms and on in ms:
                    row[f"{gain}, {on}"] = round(ms[off] / ms[on], 3)
        out.append(row)
    return out


def write(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = result["gpu"].replace(" ", "-")
    part = "_" + result["only"].replace(",", "+") if result.get("only") else ""
    size = "tiny" if result["tiny"] else f"{result['layers']}L"
    quant = f"g{result['group_size']}{'z' if result['zero_point'] else ''}{'-head' if result['lm_head_quantized'] else ''}"
    sampled = "_sampled" if result.get("sampled") else ""
    stem = out_dir / f"e2e_w4a16_{result['model']}{size}_{result['dtype']}_{quant}{'_quick' if result['quick'] else ''}{e2e.prompt_tag(result)}{part}{sampled}_{gpu}"
    result["ratios"] = ratios(result)
    wt = result["weights"]
    return e2e.write_files(
        stem, result, (("w4/bf16 eager", "4-bit vs bf16, eager"), ("w4/bf16 kernelized", "4-bit vs bf16, kernelized")),
        "speed ratio (> 1: 4-bit faster)",
        f"{result['model']} {size} {result['dtype']} {quant}, {result['gpu']}, {result['date']}; weight bytes "
        f"{wt['linear_ratio']:.3f}x (Linear), {wt['quantized_ratio']:.3f}x (quantized)", width_per_bar=0.8)  # fmt: skip


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name, report in result["reports"].items():
        console.print(f"{name}: {report}" if "\n" not in report else f"{name}:\n{report}")
    table = Table(title=f"e2e --w4a16 {result['model']} {'tiny' if result['tiny'] else str(result['layers']) + 'L'} "
                        f"{result['dtype']} g{result['group_size']} on {result['gpu']}")  # fmt: skip
    cols = (*(f"{m} ms" for m in MODELS), "w4/bf16 eager", "w4/bf16 kernelized")
    heads = ("stage", "cache", "B", "T", "bf16 ms", "bf16 kern. ms", "w4 ms", "w4 kern. ms", "w4/bf16", "w4/bf16 kern.")
    for col in heads:
        table.add_column(col)
    for r in ratios(result):
        setting = r["setting"].split("-")[0] if r["stage"] == "decode" else r["setting"]
        table.add_row(r["stage"], setting, str(r["batch"]), str(r["tokens"]), *(f"{r.get(c, float('nan')):.3f}" for c in cols))
    console.print("w4/bf16: speed ratio, bf16 ms / 4-bit ms (> 1: the 4-bit model is faster)")
    console.print(table)
    for r in ratios(result):  # --attention-ab, --capture-ab
        extra = {k: v for k, v in r.items()
                 if any(suffix in k or k.startswith(gain) for suffix, _, gain, _ in AB_OPTIONS.values())}  # fmt: skip
        if extra:
            console.print(f"{r['stage']} {r['setting']} batch {r['batch']}: " + ", ".join(f"{k} {v}" for k, v in extra.items()))
    for r in result["rows"]:
        if r.get("gpu_ms") is not None:
            console.print(f"{r['stage']} batch {r['batch']} {r['model']}: {r['ms']:.3f} ms a step, {r['gpu_ms']:.3f} ms of it "
                          f"GPU kernels, {r['ms'] - r['gpu_ms']:.3f} ms host / launch gaps")  # fmt: skip
    w = result["weights"]
    console.print(f"weight bytes: all Linear weights {w['bf16_linear_bytes'] / 2**20:.1f} -> {w['w4_linear_bytes'] / 2**20:.1f} "
                  f"MiB ({w['linear_ratio']:.3f}x; target <= {w['target']}x: {'met' if w['meets_target_all_linear'] else 'not met'}), "
                  f"the quantized projections {w['quantized_ratio']:.3f}x ({'met' if w['meets_target_quantized'] else 'not met'}); "
                  f"with embeddings {w['total_ratio']:.3f}x")  # fmt: skip
    if "linear_ratio_full_depth" in w:
        console.print(f"all Linear weights at the full depth ({w['full_depth_layers']} layers): {w['linear_ratio_full_depth']:.3f}x")
    console.print("quantized:", w["quantized"], "not quantized:", w["not_quantized"])
    console.print("top-1 agreement with bf16 eager:", result["top1_agreement_with_bf16_eager"])


STAGES = ["prefill", "decode-dynamic", "decode-static", "decode-overlap"]


def _stages(text: str) -> str:
    """--only: one stage or several, comma-separated (``decode``: the three decode stages)."""
    for part in text.split(","):
        if part not in (*STAGES, "decode"):
            raise argparse.ArgumentTypeError(f"expected stages of {', '.join((*STAGES, 'decode'))}, comma-separated, got {part!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = e2e.variant_parser("w4a16", __doc__)
    parser.add_argument("--group-size", type=int, default=128, choices=[32, 64, 128, -1], help="default: %(default)s")
    parser.add_argument("--zero-point", action="store_true", help="asymmetric 4-bit (default: symmetric, uint4b8)")
    parser.add_argument("--lm-head", action="store_true", help="quantize lm_head too (quantize_w4a16 leaves it 16-bit; "
                        "the weight-bytes target counts it)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="fewer decode steps, repetitions and rounds")
    for flag, (_, options, _, instead) in AB_OPTIONS.items():
        (option,) = options
        parser.add_argument("--" + flag.replace("_", "-"), action="store_true",
                            help=f"also the two kernelized models with {instead} (kernelize({option}=False)), in the same rounds")  # fmt: skip
    settings = ", ".join(f"{k} {v}" for k, v in e2e.SAMPLED.items() if k != "do_sample")
    parser.add_argument("--sample", action="store_true",
                        help=f"sampled decode ({settings}, transformers' default top_k 50: Llama-3-Instruct's settings) "
                        "instead of greedy; the prefill stage is the same either way")  # fmt: skip
    parser.add_argument("--only", type=_stages,
                        help="stages, comma-separated: prefill, decode-dynamic, decode-static, decode-overlap, decode (the three "
                        "decode stages); default: all (split a full run over several 10-minute GPU calls)")
    e2e.add_variant_tail(parser, DECODE_BATCHES)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = e2e.parse_variant_args(build_parser(), argv, "w4a16")
    if args is None:
        return 2
    try:
        result = run(args)
    finally:
        for name in (*MODELS, *AB_MODELS):  # the swapped hub functions of this run's models
            e2e._GLOBALS.pop(name, None)
    return e2e.finish(result, args.out, write, print_summary)
