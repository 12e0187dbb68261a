"""``fused-llm demo``: build what this machine supports, kernelize a small random-weight
Llama, and show what was swapped, the numerics against eager and, on a GPU, the timing."""

from __future__ import annotations

import copy

import torch
from rich.console import Console
from rich.table import Table

from .integration import kernelize, tiny_llama

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
    from .cli import build_packages

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
        with torch.inference_mode():
            t_eager = _time_ms(lambda: eager(tokens))
            t_fused = _time_ms(lambda: fused(tokens))
        console.print(f"forward of 4x64 tokens on {torch.cuda.get_device_name()}: eager {t_eager:.3f} ms, "
                      f"kernelized {t_fused:.3f} ms ({t_eager / t_fused:.2f}x)")
    ok = agree > 0.99 and (out - ref).abs().max().item() <= 1e-3 * max(1.0, ref.abs().max().item()) * (64 if on_gpu else 1)
    return 0 if ok else 1
