"""Sweep the rotary kernel's token and head blocks on a GPU (the source of `rope_config`):
`python rope-triton/benchmarks/tune_rotary.py [--out DIR] [--layout bhsd|bshd]`.

Times `apply_rotary_transformers` (the benchmark's call: Llama-3 8B, 32 q / 8 kv heads,
head_dim 128, bf16, transformers' full-width tables) for every configuration with the shared
harness's timer (`fused_llm_dev.bench.timing.time_calls`: one CUDA graph of calls, each on its own input
set, as many sets as exceed 4x the L2 cache, so every call reads from DRAM as in
`fused-llm bench`), checks the result against the eager function, and prints the best
configurations next to the default one and two same-bytes copies: the harness's `torch.mul`
copy and the best of a Triton copy kernel over block sizes, the fastest one-kernel copy of
those bytes found (what "% of the copy ceiling" can reach at that size).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import _check_rope, _rope_bytes, ref  # noqa: E402

from fused_llm.packages import get_kernel  # noqa: E402
from fused_llm_dev.bench.settings import Method  # noqa: E402
from fused_llm_dev.bench.timing import calls_to_flush_l2, l2_bytes, time_calls  # noqa: E402

HEAD_BLOCKS = ((1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8), (16, 4), (16, 8), (32, 8))


def configs(tokens: int):
    for (bhq, bhk), bs in itertools.product(HEAD_BLOCKS, (1, 2, 4, 8, 16, 32)):
        elements = bs * bhq * 64  # rotation pairs of a q program
        if bs > tokens or elements > 16384:
            continue
        for warps in sorted({max(1, min(8, elements // 512)), max(1, min(8, elements // 256))}):
            yield {"BLOCK_S": bs, "BLOCK_HQ": bhq, "BLOCK_HK": bhk, "num_warps": warps}


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask, eviction_policy="evict_first"), mask=mask)


COPY_BLOCKS = ((1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 8))


def best_triton_copy(n_bytes: int, method: Method) -> tuple[float, tuple[int, int]]:
    """Fastest Triton copy of n_bytes (half read, half written, bf16) over COPY_BLOCKS."""
    n = max(1, n_bytes // 4)
    count = calls_to_flush_l2(n_bytes, l2_bytes(), method.l2_factor)
    bufs = [(torch.ones(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16, device="cuda"))
            for _ in range(count)]  # fmt: skip
    best = (float("inf"), (0, 0))
    for block, warps in COPY_BLOCKS:
        fns = [lambda a=a, b=b, block=block, warps=warps: _copy_kernel[(triton.cdiv(n, block),)](a, b, n, BLOCK=block, num_warps=warps)
               for a, b in bufs]  # fmt: skip
        best = min(best, (time_calls(fns, method).median_us, (block, warps)))
    return best


def input_sets(tokens: int, layout: str, n_bytes: int) -> list:
    count = calls_to_flush_l2(n_bytes, l2_bytes(), Method().l2_factor)
    sets = []
    for seed in range(count):
        q, k, cos, sin = ref.make_rope_inputs(tokens, "cuda", seed)
        if layout == "bshd":  # same values, heads contiguous per token
            q, k = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
        sets.append((q, k, cos, sin))
    return sets


def _forget_plans(rt, kern) -> None:
    """Launch plans and the rotary fast path are kept by call signature and hold the config
    they were built with: drop them when the config function changes, so the next call picks
    (and plans) the candidate."""
    kern._ROPE_PLANS.entries.clear()
    rt._FAST_ROTARY.entries.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--layout", default="bhsd", choices=("bhsd", "bshd"), help="memory order of q / k (the call is the same)")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 64, 128, 256, 1024, 2048, 4096])
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-sweep: time only the default configuration and the copies")
    parser.add_argument("--cos-first", action="store_true",
                        help="instead of the sweep: the default configuration with cos / sin read before or after q / k")
    args = parser.parse_args()
    rt = get_kernel("rope-triton")
    kern = rt._triton_kernels()
    default_config = kern.rope_config
    results = []
    for tokens in args.tokens:
        n_bytes = _rope_bytes({"tokens": tokens})
        sets = input_sets(tokens, args.layout, n_bytes)

        method = Method()

        def timed(fn) -> float:
            return time_calls([lambda s=s: fn(*s) for s in sets], method).median_us

        t_copy = timed(lambda q, k, cos, sin: (torch.mul(q, 1.0), torch.mul(k, 1.0)))
        t_triton_copy, copy_shape = best_triton_copy(n_bytes, method)
        expected = ref.rope_ref(*sets[0])
        kern.rope_config = default_config
        t_default = timed(rt.apply_rotary_transformers)
        default = default_config(tokens, ref.HQ, 64)
        rows = []
        if args.cos_first:
            candidates = [dataclasses.replace(default, COS_FIRST=first) for first in (False, True)]
        else:
            candidates = [kern.RopeConfig(**cfg) for cfg in configs(tokens)] if args.sweep else ()
        for cfg in candidates:
            kern.rope_config = lambda *a, cfg=cfg, **kw: cfg
            _forget_plans(rt, kern)
            try:
                _check_rope(rt.apply_rotary_transformers(*sets[0]), expected)
                rows.append((timed(rt.apply_rotary_transformers), cfg))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"  tokens={tokens} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        kern.rope_config = default_config
        _forget_plans(rt, kern)
        rows.sort(key=lambda r: r[0])
        print(f"tokens={tokens} ({len(sets)} input sets): torch.mul copy of q and k {t_copy:.2f} us, best Triton copy "
              f"of the same bytes {t_triton_copy:.2f} us (block, warps = {copy_shape}), default {t_default:.2f} us {default}")
        for t, cfg in rows[: args.top]:
            print(f"   {t:7.2f} us  {t_copy / t:5.2f}x copy  {n_bytes / t / 1e3:7.0f} GB/s  {cfg}")
        results.append(dict(tokens=tokens, layout=args.layout, copy_us=t_copy, triton_copy_us=t_triton_copy,
                            triton_copy_shape=copy_shape, default_us=t_default, default=dataclasses.asdict(default),
                            configs=[dict(us=t, **dataclasses.asdict(cfg)) for t, cfg in rows]))  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"tune_rotary_{args.layout}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
