"""The numerics table of the README: how far gated-mlp's bf16 output is from an fp32 reference.

``python gated-mlp/benchmarks/numerics.py [--draws 100] [--out DIR]`` on a GPU. For square
M = D = U in 1024..8192 and ``draws`` fresh draws (x ~ N(0, 1), W_gate and W_up
Kaiming-normal, bf16), it compares with ``silu(x Wg^T) * (x Wu^T)`` computed in fp32 from the
same bf16 inputs (TF32 off): the fused kernel, and the unfused eager bf16 path (cuBLAS GEMMs,
then silu and the product, each rounded to bf16) for context. Reported: max |diff|, mean
|diff|, and mean |diff| / mean |ref|, each the worst / the mean over the draws.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_llm.packages import get_kernel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gm = get_kernel("gated-mlp")
    gen = torch.Generator(device="cuda").manual_seed(0)
    lines = [
        f"| M = D = U | path | max abs diff (worst of {args.draws}) | mean abs diff | mean rel diff |",
        "|---|---|---|---|---|",
    ]
    for n in args.sizes:
        stats: dict[str, list[tuple[float, float, float]]] = {"gated-mlp (fused)": [], "eager bf16 (unfused)": []}
        for _ in range(args.draws):
            x = torch.randn(n, n, generator=gen, device="cuda").bfloat16()
            wg = (torch.randn(n, n, generator=gen, device="cuda") * (2 / n) ** 0.5).bfloat16()
            wu = (torch.randn(n, n, generator=gen, device="cuda") * (2 / n) ** 0.5).bfloat16()
            xf = x.float()
            ref = F.silu(xf @ wg.float().T) * (xf @ wu.float().T)
            for name, got in (("gated-mlp (fused)", gm.gated_mlp(x, wg, wu)), ("eager bf16 (unfused)", F.silu(x @ wg.T) * (x @ wu.T))):
                d = (got.float() - ref).abs()
                stats[name].append((d.max().item(), d.mean().item(), (d.mean() / ref.abs().mean()).item()))
        for name, s in stats.items():
            worst = max(v[0] for v in s)
            mean_abs = sum(v[1] for v in s) / len(s)
            mean_rel = sum(v[2] for v in s) / len(s)
            lines.append(f"| {n} | {name} | {worst:.3e} | {mean_abs:.3e} | {mean_rel:.3e} |")
        print(lines[-2], lines[-1], sep="\n", flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "numerics.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
