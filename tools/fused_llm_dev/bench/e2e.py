"""fused-llm bench e2e: a kernelized transformers model against the model it came from.

One run, one GPU, one process. A model with random weights built in code (a Llama-3-8B-shaped
preset by default, fewer layers), copied three ways: eager (not kernelized), kernelized
(``fused_llm.kernelize``), and the Liger-patched model (``apply_liger_kernel_to_llama``, the
peer users pick instead; Llama only). For each:

* prefill tokens/s at (1, 512), (1, 2048), (4, 2048): ``model(ids, use_cache=False,
  logits_to_keep=1)``, eager and ``torch.compile(dynamic=False)``; the models take turns,
  round after round, each round a median of CUDA-event timings; the median over rounds;
* decode ms/step at batch 1, 8, 32 after a 512-token prompt: ``generate`` with the dynamic
  cache (eager forward) and with a static cache (transformers compiles the forward, CUDA
  graphs included); a step = (time of N2 new tokens - time of N1) / (N2 - N1). The models
  take turns, round after round, and each model's figure is the median over the rounds (this
  host's host-bound timings drift by tens of percent over a minute). Static: one
  ``StaticCache`` per model and batch, sized for N2, reset before each run, so both lengths
  replay the same compiled graph (a cache sized per length recompiled for each). The
  kernelized model's ``generate`` reads its stop flag a step late (``kernelize``'s
  ``overlap_decode``, fused_llm.generation), so its host work overlaps the GPU; the others'
  ``generate`` waits for each step, as transformers' does on CUDA;
* host time of one decode step (the forward's wall time without a synchronization, the GPU
  idle before it), peak memory of the (4, 2048) prefill;
* top-1 agreement of the logits with eager on 16 x 512 random tokens next to the noise floor
  (compiled eager against eager), with its binomial standard error, and each model's
  agreement with the same model in fp32 (which of them is closer to the exact computation);
* host time per call of each op on the kernelize path at decode shapes, next to one
  ``torch.add`` of the same input (measured in the same run).

Writes JSON, CSV and a PNG with the GPU, date and versions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime
import gc
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from fused_llm import integration, packages

from ..models import MODEL_PRESETS, build_model

PREFILL = [(1, 512), (1, 2048), (4, 2048)]
DECODE_BATCHES = [1, 8, 32]
PROMPT = 512
# Top-1 agreement over 16 x 512 positions: a standard error of ~0.3 points (at 2 x 512 it was
# ~1.3, as large as the differences between the models it compares).
AGREEMENT_BATCH = 16


def _sync() -> None:
    torch.cuda.synchronize()


def _median_ms(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _prefill(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False, logits_to_keep=1)


# Module globals a model needs set while it runs (name -> {module: {attribute: value}}). Liger's
# apply_liger_kernel_to_llama(model=...) patches the instance's modules but also replaces
# modeling_llama.apply_rotary_pos_emb process-wide, which every Llama in the process then calls:
# left in place, the "not kernelized" model would run Liger's rope too. run() puts transformers'
# function back and gives Liger's to the Liger model only, through this table.
_GLOBALS: dict[str, dict] = {}


@contextlib.contextmanager
def _running(name: str):
    """Set the module globals of model ``name`` for the duration (see _GLOBALS)."""
    saved = []
    for module, attrs in _GLOBALS.get(name, {}).items():
        for attr, value in attrs.items():
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


class Clock:
    """CUDA-event timing on a GPU, the host clock on a CPU (the variant benches' --tiny runs)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, fn, warmup: int, reps: int) -> float:
        if self.cuda:
            return _median_ms(fn, warmup, reps)
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


# Sampled decode (``sample=True``): Llama-3-Instruct's generation settings (temperature 0.6,
# top-p 0.9; top-k 50 is transformers' default), what a chat model's generate runs.
SAMPLED = dict(do_sample=True, temperature=0.6, top_p=0.9)


def _generate_ms(model, prompt, new_tokens: int, cache=None, sync=_sync, sample: bool = False) -> float:
    """Wall time of one ``generate``; ``cache``: a StaticCache (reset first), else the dynamic
    cache; ``sync``: the device synchronization (a Clock's on a CPU); ``sample``: sampled
    (SAMPLED), else greedy."""
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    kwargs.update(SAMPLED if sample else dict(do_sample=False))
    if cache is not None:
        kwargs["past_key_values"] = cache
    with torch.inference_mode():
        if cache is not None:
            cache.reset()  # its tensors were made under inference mode
        sync()
        t0 = time.perf_counter()
        model.generate(prompt, **kwargs)
        sync()
    return (time.perf_counter() - t0) * 1e3


def _step_ms(model, prompt, n1: int, n2: int, cache=None, sync=_sync, sample: bool = False) -> float:
    """Decode time per token: the difference of two generate lengths, so the prefill and the
    fixed cost of generate cancel."""
    t1 = _generate_ms(model, prompt, n1, cache, sync, sample)
    t2 = _generate_ms(model, prompt, n2, cache, sync, sample)
    return (t2 - t1) / (n2 - n1)


def rounds_of(models: dict, rounds: int, measure) -> dict[str, list[float]]:
    """``measure(name, model)`` for every model, round after round, in alternating order, each
    under its module globals (_running): a drift of the GPU's clocks or of the host over the
    minute a setting takes falls on all models alike."""
    out: dict[str, list[float]] = {name: [] for name in models}
    for i in range(rounds):
        for name in list(models)[:: 1 if i % 2 == 0 else -1]:
            with _running(name):
                out[name].append(measure(name, models[name]))
    return out


def prefill_ms(runners: dict, ids, reps: int, rounds: int) -> dict[str, tuple[float, tuple[float, float], float]]:
    """Prefill time of each model: (median over ``rounds``, (min, max) over rounds, peak MiB).
    The models take turns in every round, in alternating order, so a drift of the GPU's clocks
    or of the host over the minute a shape takes falls on all of them alike (measured one model
    after the other, two identical compiled graphs read 0.985x-1.035x apart)."""
    peaks = {}
    for name, runner in runners.items():  # warm-up (the compile, for compiled runners)
        torch.cuda.reset_peak_memory_stats()
        with _running(name):
            _median_ms(lambda r=runner: _prefill(r, ids), 2, 1)
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20
    times = rounds_of(runners, rounds, lambda name, r: _median_ms(lambda: _prefill(r, ids), 1, reps))
    return {name: (statistics.median(v), (min(v), max(v)), peaks[name]) for name, v in times.items()}


def decode_times(models: dict, prompt, n1: int, n2: int, rounds: int, static: bool, clock: Clock | None = None,
                 gpu: dict | None = None, sample: bool = False) -> dict[str, list[float]]:
    """ms per decode step of each model, one figure per round (rounds_of): ``generate`` with the
    dynamic cache, or with a static cache (``static``; on a GPU transformers compiles the decode
    forward and captures it in CUDA graphs): one ``StaticCache`` per model sized for n2 serves
    both lengths (a cache sized per length recompiled for each). Warm-ups first: one, or two
    with a static cache (the first compiles). ``gpu`` (a dict, on a GPU): filled with each
    model's GPU time per step and costliest kernels after the rounds (decode_gpu_ms, the same
    caches and graphs). ``sample``: sampled decode (SAMPLED), else greedy."""
    sync = clock.sync if clock is not None else _sync
    caches = {name: None for name in models}
    if static:
        from transformers import StaticCache

        caches = {name: StaticCache(config=m.config, max_cache_len=prompt.shape[1] + n2 + 1) for name, m in models.items()}
    for name, model in models.items():
        with _running(name):
            for _ in range(2 if static else 1):
                _step_ms(model, prompt, n1, n2, caches[name], sync, sample)
    times = rounds_of(models, rounds, lambda name, m: _step_ms(m, prompt, n1, n2, caches[name], sync, sample))
    if gpu is not None and prompt.is_cuda:
        for name, model in models.items():
            with _running(name):
                gpu[name] = decode_gpu_ms(model, prompt, n1, n2, caches[name], sample=sample)
    return times


def decode_gpu_ms(model, prompt, n1: int, n2: int, cache=None, top: int = 12, sample: bool = False) -> dict:
    """GPU time per decode step: the CUDA kernels' summed durations (torch.profiler) over a
    ``generate`` of n2 tokens minus one of n1, / (n2 - n1), as ``ms``, and the ``top`` kernels'
    share of it (``kernels``: name -> ms per step). Next to the wall time per step it splits a
    step into device work and the host's share (launches, dynamo's guards, generate's Python
    and its synchronization per token), which the GPU waits on. ``busy_ms``: the same difference
    of the time any kernel runs (busy_us), which overlapping kernels do not count twice."""
    from collections import Counter

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def kernel_us(new_tokens: int) -> tuple[Counter, float]:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _generate_ms(model, prompt, new_tokens, cache, sample=sample)
        per_name: Counter = Counter()
        spans = []
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                per_name[e.name] += e.time_range.elapsed_us()
                spans.append((e.time_range.start, e.time_range.end))
        return per_name, busy_us(spans)

    (short, short_busy), (long, long_busy) = kernel_us(n1), kernel_us(n2)
    steps = n2 - n1
    per_step = {name: (long[name] - short.get(name, 0)) / steps / 1e3 for name in long}
    ranked = sorted(per_step.items(), key=lambda kv: -kv[1])[:top]
    kernels: dict[str, float] = {}
    for name, ms in ranked:
        key = short_kernel_name(name)
        while key in kernels:  # two names alike in both ends: keep both, never overwrite
            key += "'"
        kernels[key] = round(ms, 4)
    return dict(ms=(sum(long.values()) - sum(short.values())) / steps / 1e3, kernels=kernels,
                busy_ms=(long_busy - short_busy) / steps / 1e3)


def busy_us(spans) -> float:
    """The time at least one of the ``(start, end)`` spans covers: a step's GPU time where
    kernels overlap. A kernel launched as a programmatic dependent starts while its predecessor
    runs and waits inside, so the sum of durations counts that stretch twice."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def short_kernel_name(name: str, width: int = 120) -> str:
    """``name`` in at most about ``width`` characters: its start and its end (inductor's kernels
    differ only in the ``_N`` suffix when their origins name them alike: eager Llama's q-rotary,
    repeat_kv and mask kernels all start ``triton_poi_fused__scaled_dot_product_cudnn_attention__
    to_copy_...``; cutting the end merged them into one key, which showed the cheapest of them)."""
    if len(name) <= width:
        return name
    return name[: width - 24] + "..." + name[-21:]


def decode_dynamic_ms(models: dict, prompt, n1: int, n2: int, rounds: int) -> dict[str, float]:
    """ms per step of each model with the dynamic cache: the median over rounds (decode_times)."""
    return {name: statistics.median(v) for name, v in decode_times(models, prompt, n1, n2, rounds, static=False).items()}


def decode_static_ms(models: dict, prompt, n1: int, n2: int, rounds: int) -> dict[str, float]:
    """ms per step of each model with a static cache: the median over rounds (decode_times)."""
    return {name: statistics.median(v) for name, v in decode_times(models, prompt, n1, n2, rounds, static=True).items()}


def release_compiled(models) -> None:
    """Drop the forwards that static-cache ``generate`` compiled (and dynamo's caches), so the
    next stage starts without their graphs and memory."""
    for model in models:
        if hasattr(model, "_compiled_call"):
            del model._compiled_call
    torch._dynamo.reset()
    gc.collect()


def decode_host_ms(model, batch: int, vocab: int, device) -> float:
    """Host time of one decode forward with a dynamic cache: the wall time of the call with the
    GPU idle before it and no synchronization inside (the median of 10)."""
    from transformers import DynamicCache

    ids = torch.randint(0, vocab, (batch, PROMPT), device=device)
    times = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        step = ids[:, -1:]
        for i in range(12):
            _sync()
            t0 = time.perf_counter()
            model(step, past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:])


def top1(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits.argmax(-1)


def agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Share of positions whose top-1 token agrees, with its binomial standard error."""
    p = (a == b).float().mean().item()
    return dict(agreement=round(p, 4), stderr=round((p * (1 - p) / a.numel()) ** 0.5, 4), positions=a.numel())


def op_host_us(dtype: torch.dtype, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, float]:
    """Host time per call at decode shapes (1 token), each op's public function, and one
    torch.add of the same input: 300 calls without synchronizing, wall time / 300."""
    rms = packages.get_kernel("rmsnorm-fp8")
    swiglu = packages.get_kernel("swiglu-fp8")
    rope = packages.get_kernel("rope-triton")
    gmlp = packages.get_kernel("gated-mlp")
    dev = "cuda"
    x = torch.randn(1, 1, hidden, device=dev, dtype=dtype)
    w = torch.randn(hidden, device=dev, dtype=dtype)
    q = torch.randn(1, heads, 1, head_dim, device=dev, dtype=dtype)
    k = torch.randn(1, kv_heads, 1, head_dim, device=dev, dtype=dtype)
    cos = torch.randn(1, 1, head_dim, device=dev, dtype=dtype)
    gu = torch.randn(1, 2 * intermediate, device=dev, dtype=dtype)
    wg = torch.randn(intermediate, hidden, device=dev, dtype=dtype)
    wu = torch.randn(intermediate, hidden, device=dev, dtype=dtype)
    calls = {
        "torch.add": lambda: torch.add(x, x),
        "rms_norm": lambda: rms.rms_norm(x, w, 1e-5),
        "fused_add_rms_norm": lambda: rms.fused_add_rms_norm(x, x, w, 1e-5),
        "rotary (apply_rotary_transformers)": lambda: rope.apply_rotary_transformers(q, k, cos, cos),
        "silu_and_mul": lambda: swiglu.silu_and_mul(gu),
        "gated_mlp": lambda: gmlp.gated_mlp(x, wg, wu),
    }
    return {name: host_us(fn) for name, fn in calls.items()}


def host_us(fn, sync=_sync) -> float:
    """Host time of one call: 300 calls after 30 warm-ups, without synchronizing in between (the
    GPU keeps up, so the wall time is the host's), in us."""
    for _ in range(30):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(300):
        fn()
    us = (time.perf_counter() - t0) / 300 * 1e6
    sync()
    return us


def versions() -> dict[str, str | None]:
    """The versions a result depends on (triton: None where it is not installed, a CPU run)."""
    import kernels
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(torch=torch.__version__, triton=triton_version, transformers=transformers.__version__,
                kernels=kernels.__version__, python=platform.python_version())  # fmt: skip


def run(args) -> dict:
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    device = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    for name in packages.kernel_packages():
        packages.use_local_build(name)
    eager = build_model(args.model, args.layers, device, dtype)
    cfg = eager.config
    models = {"eager": eager}
    kern = copy.deepcopy(eager)
    report = integration.kernelize(kern)
    models["kernelized"] = kern
    if args.model == "llama" and not args.no_liger:
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            from transformers.models.llama import modeling_llama

            liger = copy.deepcopy(eager)
            patched = {modeling_llama: {"apply_rotary_pos_emb": modeling_llama.apply_rotary_pos_emb}}
            apply_liger_kernel_to_llama(model=liger, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                        fused_linear_cross_entropy=False)
            _GLOBALS["liger"] = {m: {a: getattr(m, a) for a in attrs} for m, attrs in patched.items()}
            for module, attrs in patched.items():  # transformers' own for every other model
                for attr, value in attrs.items():
                    setattr(module, attr, value)
            models["liger"] = liger
        except ImportError:
            console.print("liger-kernel not installed: no Liger column")
    prefill = PREFILL[:1] + PREFILL[2:] if args.quick else PREFILL
    batches = DECODE_BATCHES[:2] if args.quick else DECODE_BATCHES
    n1, n2 = (8, 24) if args.quick else (16, 64)
    reps = 5 if args.quick else 10
    rounds = 3 if args.quick else 5
    stages = [args.only] if args.only else ["prefill", "decode"]
    decode_settings = 2 if "decode" in stages else int(bool({"decode-dynamic", "decode-static"} & set(stages)))
    rows: list[dict] = []
    total = len(models) * (2 * len(prefill) * ("prefill" in stages) + decode_settings * len(batches))
    # Three models x three batch sizes of static-cache decode, and prefill shapes: more graphs
    # than dynamo's default of 8 per code object, after which it silently runs eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)
    with Progress(console=console) as progress:
        task = progress.add_task("e2e", total=total)
        if "prefill" in stages:
            for compiled in (False, True):
                runners = {name: torch.compile(m, dynamic=False) if compiled else m for name, m in models.items()}
                for batch, seq in prefill:
                    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
                    for name, (ms, spread, peak) in prefill_ms(runners, ids, reps, rounds).items():
                        rows.append(dict(stage="prefill", setting="compiled" if compiled else "eager", model=name,
                                         batch=batch, tokens=seq, ms=ms, ms_min=spread[0], ms_max=spread[1],
                                         tokens_per_s=batch * seq / ms * 1e3, peak_mib=peak))
                        progress.advance(task)
                del runners
                torch._dynamo.reset()
                gc.collect()
        if "decode" in stages or "decode-dynamic" in stages:
            for batch in batches:
                prompt = torch.randint(0, cfg.vocab_size, (batch, PROMPT), generator=gen).to(device)
                for name, ms in decode_dynamic_ms(models, prompt, n1, n2, rounds).items():
                    with _running(name):
                        host_ms = decode_host_ms(models[name], batch, cfg.vocab_size, device)
                    rows.append(dict(stage="decode", setting="dynamic-cache generate", model=name, batch=batch,
                                     tokens=1, ms=ms, tokens_per_s=batch / ms * 1e3, host_ms=host_ms))
                    progress.advance(task)
        if "decode" in stages or "decode-static" in stages:
            for batch in batches:
                prompt = torch.randint(0, cfg.vocab_size, (batch, PROMPT), generator=gen).to(device)
                for name, ms in decode_static_ms(models, prompt, n1, n2, rounds).items():
                    rows.append(dict(stage="decode", setting="static-cache generate", model=name, batch=batch,
                                     tokens=1, ms=ms, tokens_per_s=batch / ms * 1e3))
                    progress.advance(task)
            release_compiled(models.values())
    ids = torch.randint(0, cfg.vocab_size, (AGREEMENT_BATCH, 512), generator=gen).to(device)
    tops = {}
    for name, m in models.items():
        with _running(name):
            tops[name] = top1(m, ids)
    tops["compiled eager (noise floor)"] = top1(torch.compile(eager, dynamic=False), ids)
    torch._dynamo.reset()
    agree = {name: agreement(t, tops["eager"]) for name, t in tops.items() if name != "eager"}
    # Against the exact computation: the same weights in fp32 (eager, without our kernels).
    exact = copy.deepcopy(eager).float()
    exact_top = top1(exact, ids)
    del exact
    gc.collect()
    torch.cuda.empty_cache()
    agree_fp32 = {name: agreement(t, exact_top) for name, t in tops.items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ops = op_host_us(dtype, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim)
    return dict(
        gpu=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), versions=versions(),
        model=args.model, layers=args.layers, dtype=args.dtype, quick=args.quick, only=args.only,
        kernelize_report=str(report), rows=rows, top1_agreement=agree, top1_agreement_with_fp32=agree_fp32,
        op_host_us=ops,
    )


def ratios(result: dict) -> list[dict]:
    """kernelized / eager, kernelized / liger per (stage, setting, batch, tokens): speed ratios
    (> 1: the kernelized model is faster)."""
    by = {(r["stage"], r["setting"], r["batch"], r["tokens"], r["model"]): r for r in result["rows"]}
    out = []
    for (stage, setting, batch, tokens, model), r in by.items():
        if model != "kernelized":
            continue
        row = dict(stage=stage, setting=setting, batch=batch, tokens=tokens, kernelized_ms=round(r["ms"], 3))
        for peer in ("eager", "liger"):
            p = by.get((stage, setting, batch, tokens, peer))
            if p:
                row[f"{peer}_ms"] = round(p["ms"], 3)
                row[f"vs_{peer}"] = round(p["ms"] / r["ms"], 3)
        out.append(row)
    return out


def write_files(stem: Path, result: dict, bars: tuple[tuple[str, str], ...], ylabel: str,
                title: str, width_per_bar: float = 0.7) -> Path:  # fmt: skip
    """``stem``.json (the whole result), .csv (its rows) and .png: one or two bars per entry of
    ``result["ratios"]``, each ``(ratio key, legend label)`` of ``bars``, and an entry's
    ``"target"``, where it has one, as a red mark. Shared by every e2e bench (bf16, --w4a16,
    --skinny, --fp8)."""
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    with stem.with_suffix(".csv").open("w", newline="") as f:
        keys = sorted({k for r in result["rows"] for k in r})
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(result["rows"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rats = result["ratios"]
        labels = [f"{r['stage']} {r['setting']}\nB={r['batch']} T={r['tokens']}" for r in rats]
        fig, ax = plt.subplots(figsize=(max(8, len(rats) * width_per_bar), 5))
        xs = range(len(rats))
        for offset, (key, label) in zip((0.0,) if len(bars) == 1 else (-0.2, 0.2), bars):
            ax.bar([x + offset for x in xs], [r.get(key, 0) for r in rats], 0.4, label=label)
        marked = [(x, r["target"]) for x, r in zip(xs, rats) if r.get("target")]
        if marked:
            ax.scatter(*zip(*marked), marker="_", s=600, color="r", label="target", zorder=3)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs), labels, rotation=70, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem.with_suffix(".png"), dpi=110)
        plt.close(fig)
    except ImportError:
        pass
    return stem


def write(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = result["gpu"].replace(" ", "-")
    part = f"_{result['only']}" if result.get("only") else ""
    stem = out_dir / f"e2e_{result['model']}{result['layers']}L_{result['dtype']}{'_quick' if result['quick'] else ''}{part}_{gpu}"
    result["ratios"] = ratios(result)
    return write_files(stem, result, (("vs_eager", "vs not kernelized"), ("vs_liger", "vs Liger")),
                       "speed ratio (> 1: kernelized faster)",
                       f"{result['model']} {result['layers']} layers {result['dtype']}, {result['gpu']}, {result['date']}")  # fmt: skip


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(result["kernelize_report"])
    table = Table(title=f"e2e {result['model']} {result['layers']}L {result['dtype']} on {result['gpu']}")
    for col in ("stage", "setting", "B", "T", "kernelized ms", "eager ms", "vs eager", "liger ms", "vs liger"):
        table.add_column(col)
    for r in ratios(result):
        table.add_row(r["stage"], r["setting"], str(r["batch"]), str(r["tokens"]), f"{r['kernelized_ms']:.3f}",
                      f"{r.get('eager_ms', float('nan')):.3f}", f"{r.get('vs_eager', float('nan')):.3f}",
                      f"{r.get('liger_ms', float('nan')):.3f}", f"{r.get('vs_liger', float('nan')):.3f}")
    console.print(table)
    console.print("top-1 agreement with eager:", result["top1_agreement"])
    console.print("top-1 agreement with the fp32 model:", result.get("top1_agreement_with_fp32"))
    add = result["op_host_us"]["torch.add"]
    console.print("host us per call:", {k: f"{v:.1f} ({v / add:.2f}x torch.add)" for k, v in result["op_host_us"].items()})
    host = {(r["model"], r["batch"]): r["host_ms"] for r in result["rows"] if "host_ms" in r}
    if host:
        console.print("host ms per decode step (dynamic cache):", host)


def finish(result: dict, out: Path | None, write, print_summary) -> int:
    """A bench's last steps: ``write(result, folder)`` (default benchmarks/results/ at the root),
    ``print_summary(result)``, the files' stem; exit status 0."""
    stem = write(result, out or packages.repo_root() / "benchmarks" / "results")
    print_summary(result)
    print(f"wrote {stem}.json / .csv / .png")
    return 0


def variant_start():
    """How a variant bench's run starts (``--w4a16``, ``--skinny``, ``--fp8``): every package from
    its local build; returns a progress console on stderr, the device (the GPU when there is
    one) and its Clock."""
    from rich.console import Console

    for name in packages.kernel_packages():
        packages.use_local_build(name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return Console(stderr=True), device, Clock(device)


def variant_parser(flag: str, doc: str) -> argparse.ArgumentParser:
    """The parser of a variant bench (``--w4a16``, ``--skinny``) with the options they share
    before their own: the flag itself (how the CLI routes here), --model, --layers, --dtype."""
    parser = argparse.ArgumentParser(prog=f"fused-llm bench e2e --{flag}", description=doc.split("\n\n")[0])
    parser.add_argument(f"--{flag}", action="store_true", help="this comparison (how bench e2e routes here)")
    parser.add_argument("--model", default="llama", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    return parser


def add_variant_tail(parser: argparse.ArgumentParser, batches: list[int]) -> None:
    """The options a variant bench's parser ends with: --batches (default ``batches``), --tiny,
    --out."""
    parser.add_argument("--batches", default=",".join(map(str, batches)),
                        help="decode batch sizes (default: %(default)s; static-cache decode compiles per model and batch)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer hidden-256 model and short sequences; runs on a "
                        "CPU too (a smoke test of the command, not a measurement)")  # fmt: skip
    parser.add_argument("--prompt", type=int, default=PROMPT, help="decode: tokens of the prompt before the timed steps "
                        "(default: %(default)s; the attention reads that many cached positions a step; --tiny keeps its own)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ at the root")


def prompt_tag(result: dict) -> str:
    """The file-name part of a variant run's prompt length: empty at the default (PROMPT) and
    for --tiny, which keeps its own."""
    return f"_prompt{result['prompt']}" if not result["tiny"] and result["prompt"] != PROMPT else ""


def parse_variant_args(parser: argparse.ArgumentParser, argv: list[str] | None, flag: str) -> argparse.Namespace | None:
    """A variant bench's arguments, --batches as ints; None (after saying why) without a GPU
    unless --tiny."""
    args = parser.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: expected comma-separated integers, got {args.batches!r}")
    if args.prompt < 1:
        parser.error(f"--prompt: expected a positive token count, got {args.prompt}")
    if not torch.cuda.is_available() and not args.tiny:
        print(f"fused-llm bench e2e --{flag} times models on a CUDA GPU; none is visible to torch here "
              "(--tiny runs a small model on the CPU).")  # fmt: skip
        return None
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fused-llm bench e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--w4a16", action="store_true", help="a 4-bit copy next to the bf16 model instead: "
                        "bench/e2e_w4a16.py, which the fused-llm CLI runs for this flag (its --help)")  # fmt: skip
    parser.add_argument("--skinny", action="store_true", help="the kernelized model with and without skinny-gemm's "
                        "decode projections instead: bench/e2e_skinny.py, which the fused-llm CLI runs for this flag (its --help)")  # fmt: skip
    parser.add_argument("--fp8", choices=["per-token", "block"], help="an FP8 model (fused_llm.quantize_fp8) instead: "
                        "bench/e2e_fp8.py, which the fused-llm CLI runs for this flag (its --help)")  # fmt: skip
    parser.add_argument("--model", default="llama", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and steps (about 2 minutes)")
    parser.add_argument("--only", choices=["prefill", "decode", "decode-dynamic", "decode-static"],
                        help="one stage (a full run takes longer than one 10-minute GPU call: split it)")
    parser.add_argument("--no-liger", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/ at the root")
    args = parser.parse_args(argv)
    for flag in ("w4a16", "skinny", "fp8"):
        if getattr(args, flag):
            parser.error(f"--{flag}: run it through the CLI (fused-llm bench e2e --{flag}) or bench.e2e_{flag}.main")
    if not torch.cuda.is_available():
        print("fused-llm bench e2e times models on a CUDA GPU; none is visible to torch here.")
        return 2
    return finish(run(args), args.out, write, print_summary)
