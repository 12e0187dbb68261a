"""``fused-llm demo``: build what this machine supports, kernelize a small random-weight
Llama, and show what was swapped, the numerics against eager and, on a GPU, the timing."""

from __future__ import annotations

import copy

import torch
from rich.console import Console
from rich.table import Table

from fused_llm import kernelize

from .commands import build_packages
from .models import build_model, tiny_llama

console = Console()


def _time_ms(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(build: bool = True) -> int:
    if build:
        build_packages([])
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    eager = tiny_llama(device, dtype)
    fused = copy.deepcopy(eager)
    report = kernelize(fused)
    console.print(report)

    torch.manual_seed(1)
    tokens = torch.randint(0, eager.config.vocab_size, (4, 64), device=device)
    with torch.inference_mode():
        ref = eager(tokens).logits.float()
        out = fused(tokens).logits.float()
    table = Table(title=f"logits, kernelized vs eager ({device}, {str(dtype).removeprefix('torch.')})")
    for col in ("max |diff|", "mean |diff|", "max |ref|", "argmax agreement"):
        table.add_column(col)
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    table.add_row(f"{(out - ref).abs().max().item():.3g}", f"{(out - ref).abs().mean().item():.3g}",
                  f"{ref.abs().max().item():.3g}", f"{agree:.1%}")
    console.print(table)
    if on_gpu:
        _end_to_end(dtype)
    else:
        console.print("timing needs a GPU: on one, `fused-llm demo` adds prefill and decode tokens/s, and "
                      "`fused-llm bench e2e` the full comparison (committed results: benchmarks/results/e2e_*)")
    ok = agree > 0.99 and (out - ref).abs().max().item() <= 1e-3 * max(1.0, ref.abs().max().item()) * (64 if on_gpu else 1)
    return 0 if ok else 1


def _end_to_end(dtype: torch.dtype, layers: int = 2) -> None:
    """Prefill and decode tokens/s of a Llama-3-8B-shaped model (``layers`` layers, random
    weights), eager vs kernelized, and their top-1 agreement: a short `fused-llm bench e2e`."""
    from .bench.e2e import PROMPT, _step_ms, agreement, top1

    eager = build_model("llama", layers, "cuda", dtype)
    fused = copy.deepcopy(eager)
    kernelize(fused)
    ids = torch.randint(0, eager.config.vocab_size, (1, PROMPT), device="cuda")
    table = Table(title=f"Llama-3-8B shape, {layers} layers, {str(dtype).removeprefix('torch.')}, "
                        f"{torch.cuda.get_device_name()}")
    for col in ("", "eager", "kernelized", "speed-up"):
        table.add_column(col)
    with torch.inference_mode():
        pre = [_time_ms(lambda m=m: m(ids, use_cache=False, logits_to_keep=1), iters=20) for m in (eager, fused)]
    table.add_row(f"prefill 1 x {PROMPT}, tokens/s", *(f"{PROMPT / t * 1e3:,.0f}" for t in pre), f"{pre[0] / pre[1]:.2f}x")
    for m in (eager, fused):  # warm-up
        _step_ms(m, ids, 4, 12)
    dec = [min(_step_ms(m, ids, 8, 40) for _ in range(2)) for m in (eager, fused)]
    table.add_row("decode batch 1 (generate), tokens/s", *(f"{1e3 / t:,.0f}" for t in dec), f"{dec[0] / dec[1]:.2f}x")
    tokens = torch.randint(0, eager.config.vocab_size, (2, 256), device="cuda")
    agree = agreement(top1(fused, tokens), top1(eager, tokens))
    table.add_row("top-1 agreement with eager", "", f"{agree['agreement']:.1%}", "")
    console.print(table)
    console.print("full comparison (8 layers, batches 1-32, compiled, static cache, Liger): `fused-llm bench e2e`; "
                  "committed results in benchmarks/results/e2e_*")
