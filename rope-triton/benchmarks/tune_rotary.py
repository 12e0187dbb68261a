"""Sweep the rotary kernel's token and head blocks on a GPU (the source of `rope_config`):
`python rope-triton/benchmarks/tune_rotary.py [--out DIR] [--layout bhsd|bshd]`.

Times `apply_rotary_transformers` (the benchmark's call: Llama-3 8B, 32 q / 8 kv heads,
head_dim 128, bf16, transformers' full-width tables) in CUDA-graph replay for every
configuration, each call on a fresh copy of the inputs (enough copies to exceed the L2 cache
twice, as the shared harness does), checks the result against the eager function, and prints
the best configurations next to the default one and a same-bytes copy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import _check_rope, _rope_bytes, ref  # noqa: E402

from fused_llm.packages import get_kernel  # noqa: E402

HEAD_BLOCKS = ((1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8), (16, 4), (16, 8), (32, 8))


def configs(tokens: int):
    for (bhq, bhk), bs in itertools.product(HEAD_BLOCKS, (1, 2, 4, 8, 16, 32)):
        elements = bs * bhq * 64  # rotation pairs of a q program
        if bs > tokens or elements > 16384:
            continue
        for warps in sorted({max(1, min(8, elements // 512)), max(1, min(8, elements // 256))}):
            yield {"BLOCK_S": bs, "BLOCK_HQ": bhq, "BLOCK_HK": bhk, "num_warps": warps}


def input_sets(tokens: int, layout: str, n_bytes: int) -> list:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    count = max(1, min(64, -(-2 * l2 // n_bytes)))
    sets = []
    for seed in range(count):
        q, k, cos, sin = ref.make_rope_inputs(tokens, "cuda", seed)
        if layout == "bshd":  # same values, heads contiguous per token
            q, k = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
        sets.append((q, k, cos, sin))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--layout", default="bhsd", choices=("bhsd", "bshd"), help="memory order of q / k (the call is the same)")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 64, 128, 256, 1024, 2048, 4096])
    parser.add_argument("--top", type=int, default=4)
    args = parser.parse_args()
    rt = get_kernel("rope-triton")
    kern = rt._triton_kernels()
    default_config = kern.rope_config
    results = []
    for tokens in args.tokens:
        n_bytes = _rope_bytes({"tokens": tokens})
        sets = input_sets(tokens, args.layout, n_bytes)

        def run_all(fn):
            for q, k, cos, sin in sets:
                fn(q, k, cos, sin)

        def timed(fn) -> float:
            return do_bench_cudagraph(lambda: run_all(fn)) * 1e3 / len(sets)

        t_copy = timed(lambda q, k, cos, sin: (torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)))
        expected = ref.rope_ref(*sets[0])
        kern.rope_config = default_config
        t_default = timed(rt.apply_rotary_transformers)
        default = default_config(tokens, ref.HQ, 64)
        rows = []
        for cfg in configs(tokens):
            kern.rope_config = lambda *a, cfg=cfg, **kw: cfg
            try:
                _check_rope(rt.apply_rotary_transformers(*sets[0]), expected)
                rows.append((timed(rt.apply_rotary_transformers), cfg))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"  tokens={tokens} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        kern.rope_config = default_config
        rows.sort(key=lambda r: r[0])
        print(f"tokens={tokens} ({len(sets)} input sets): copy {t_copy:.2f} us, default {t_default:.2f} us {default}")
        for t, cfg in rows[: args.top]:
            print(f"   {t:7.2f} us  {t_copy / t:5.2f}x copy  {n_bytes / t / 1e3:7.0f} GB/s  {cfg}")
        results.append(dict(tokens=tokens, layout=args.layout, copy_us=t_copy, default_us=t_default, default=default,
                            configs=[dict(us=t, **cfg) for t, cfg in rows]))  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"tune_rotary_{args.layout}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
