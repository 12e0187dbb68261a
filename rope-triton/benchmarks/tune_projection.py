"""Sweep the fused projection's tile shapes and K splits on a GPU (the source of
`rms_matmul_rope_config`): `python rope-triton/benchmarks/tune_projection.py [--out DIR]`.

For each token count of the benchmark (Llama-3 8B [W_q; W_k], 5120 x 4096, bf16) it times every
configuration with the shared harness's timer (`fused_llm_dev.bench.timing.time_calls`: one CUDA graph of
calls on independent input sets that together exceed 4x the L2 cache; W alone is 42 MB, so
one set would be timed largely from an H100's 50 MB L2), checks its result against the unfused
torch sequence, and prints the best ones next to the unfused sequence (our RMSNorm + cuBLAS +
our RoPE) and cuBLAS alone, timed the same way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import _check_projection, make_unfused_ours, ref  # noqa: E402

from fused_llm.packages import get_kernel  # noqa: E402
from fused_llm_dev.bench.settings import Method  # noqa: E402
from fused_llm_dev.bench.timing import calls_to_flush_l2, l2_bytes, time_calls, time_us  # noqa: E402


VARIANTS = {  # how the RMSNorm weight and sum(x^2) are handled (see the kernel's HAS_G / SQUARES_MMA)
    "plain": {"FOLD": False, "SQUARES_MMA": False},  # x * g and x^2 in registers every K step
    "mma": {"FOLD": False, "SQUARES_MMA": True},  # x * g in registers, x^2 as diag(x x^T) on the MMA
    "fold": {"FOLD": True, "SQUARES_MMA": False},  # g folded into W (fold_rms_weight), x^2 in registers
    "fold_mma": {"FOLD": True, "SQUARES_MMA": True},  # g folded, x tiles feed only MMAs
}


# The second sweep's candidates (the first, docs/rope-triton-projection-prefill.md, also had
# 128 x (1 or 2 heads) in 4 or 8 warps and GROUP_M 8, all slower than 64 x 2 heads, 4 warps):
WHOLE_HEAD_TILES = ((64, 2, 4), (64, 1, 4), (64, 4, 8), (64, 2, 8))  # (BLOCK_M, HEADS, num_warps)
WHOLE_HEAD_STAGES = (4, 5)
# `_rms_matmul_rope_persistent_kernel` (--persistent): (BLOCK_M, HEADS, num_warps, num_stages)
PERSISTENT_TILES = ((64, 2, 4, 4), (64, 2, 4, 5), (128, 2, 8, 3), (128, 2, 8, 4))


def configs(m: int, variants=("plain",), splits=(1, 2, 4), warps=(4,), stages=(4,), block_m=(16, 32, 64),
            persistent=False, block_k=(64, 128)):  # fmt: skip
    if persistent:  # weight folded, TMA
        for bm, heads, w, st in PERSISTENT_TILES:
            yield {"PERSISTENT": True, "BLOCK_M": bm, "HEADS": heads, "BLOCK_K": 64, "num_warps": w,
                   "num_stages": st, "USE_TMA": True, "FOLD": True}  # fmt: skip
        return
    for cfg in _tiles(m, splits, block_m, block_k):
        for v, w, st in itertools.product(variants, warps, stages):
            yield {**cfg, **VARIANTS[v], **({"num_warps": w, "num_stages": st} if m <= 64 else {})}


def as_config(kern, cfg: dict):
    """A sweep entry (a dict; FOLD says how the weight is passed) as the launcher's configuration."""
    fields = {k: v for k, v in cfg.items() if k not in ("FOLD", "PERSISTENT")}
    if cfg.get("PERSISTENT"):
        return kern.RmsMatmulRopePersistentConfig(**fields)
    return kern.RmsMatmulRopeHeadsConfig(**fields) if "HEADS" in fields else kern.RmsMatmulRopeConfig(**fields)


def _tiles(m: int, splits, block_m=(16, 32, 64), block_k=(64, 128)):
    if m <= 64:
        # Row tiles of 16 / 32 at 32 - 64 tokens too: the row blocks of one column tile run
        # side by side (program_id 0 is the row block), so W is read from DRAM about once.
        # TMA operands only: the pointer-load variants were never the best in the earlier sweep.
        for bm, bnh, bk, split in itertools.product(block_m, (32, 64), block_k, splits):
            if bm > max(16, triton.next_power_of_2(m)):
                continue
            yield {"BLOCK_M": bm, "BLOCK_NH": bnh, "BLOCK_K": bk, "SPLIT_K": split,
                   "num_warps": 4, "num_stages": 4, "USE_TMA": True}  # fmt: skip
    else:
        # Whole-head tiles first (`_rms_matmul_rope_heads_kernel`): BLOCK_M tokens x HEADS heads.
        for (bm, heads, warps), stages, group in itertools.product(WHOLE_HEAD_TILES, WHOLE_HEAD_STAGES, (16,)):
            yield {"BLOCK_M": bm, "HEADS": heads, "BLOCK_K": 64, "GROUP_M": group,
                   "num_warps": warps, "num_stages": stages, "USE_TMA": True}  # fmt: skip
        # Half-head tiles (`_rms_matmul_rope_kernel`, two dots per K step).
        # (BLOCK_NH, BLOCK_K) 32, 128 at 6 stages: the shape that won unsplit at 64 tokens.
        for (bm, warps), (bnh, bk), stages, group in itertools.product(
            ((64, 4), (128, 4), (128, 8)), ((64, 64), (32, 128)), (3, 4, 6), (1, 8)
        ):
            yield {"BLOCK_M": bm, "BLOCK_NH": bnh, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": group,
                   "num_warps": warps, "num_stages": stages, "USE_TMA": True}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 32, 64, 256, 1024, 4096])
    parser.add_argument("--variants", nargs="*", default=["plain"], choices=sorted(VARIANTS))
    parser.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4],
                        help="decode tiles' K splits (8 never won; 1 won folded: results/tune_projection_decode_*)")
    parser.add_argument("--warps", type=int, nargs="*", default=[4], help="decode tiles")
    parser.add_argument("--stages", type=int, nargs="*", default=[4], help="decode tiles")
    parser.add_argument("--block-m", type=int, nargs="*", default=[16, 32, 64], help="decode tiles")
    parser.add_argument("--block-k", type=int, nargs="*", default=[64, 128], help="decode tiles")
    parser.add_argument("--prefill-tiles", type=int, default=28, help="the first N prefill tile shapes only")
    parser.add_argument("--persistent", action="store_true", help="the persistent kernel's tiles")
    args = parser.parse_args()
    rt = get_kernel("rope-triton")
    kern = rt._triton_kernels()
    results = []
    method = Method()
    for m in args.tokens:
        x, rms_w, w, cos, sin = ref.make_projection_inputs(m, "cuda", 0)
        n_bytes = (x.numel() + w.numel() + cos.numel() + sin.numel() + m * w.shape[0]) * x.element_size()
        sets = [ref.make_projection_inputs(m, "cuda", seed) for seed in range(calls_to_flush_l2(n_bytes, l2_bytes(), method.l2_factor))]
        outs = [torch.empty(m, w.shape[0], dtype=x.dtype, device="cuda") for _ in sets]
        expected = ref.projection_ref(x, rms_w, w, cos, sin)

        def timed(fn) -> float:  # fn(set index)
            return time_calls([lambda i=i: fn(i) for i in range(len(sets))], method).median_us

        t_unfused = time_us(lambda seed: make_unfused_ours({"tokens": m}, seed), n_bytes, method).median_us
        t_cublas = timed(lambda i: F.linear(sets[i][0], sets[i][2]))
        default = kern.rms_matmul_rope_config(m, x.shape[1], ref.HEAD_DIM)
        rows = []
        folded = [rt.fold_rms_weight(ws, gs) for _, gs, ws, _, _ in sets] \
            if args.persistent or any(VARIANTS[v]["FOLD"] for v in args.variants) else []  # fmt: skip
        for n, cfg in enumerate(configs(m, args.variants, args.splits, args.warps, args.stages, args.block_m,
                                        args.persistent, args.block_k)):  # fmt: skip
            if m > 64 and not args.persistent and n >= args.prefill_tiles * len(args.variants):
                break
            try:
                launch_cfg = as_config(kern, cfg)

                def call(i, cfg=cfg, launch_cfg=launch_cfg):
                    xs, gs, ws, cs, ss = sets[i]
                    if cfg["FOLD"]:
                        gs, ws = None, folded[i]
                    kern.launch_rms_matmul_rope(xs, gs, ws, cs, ss, outs[i], ref.EPS, ref.HEAD_DIM, cfg=launch_cfg)
                outs[0].fill_(float("nan"))
                call(0)
                _check_projection(outs[0], expected)
                rows.append((timed(call), cfg))
            except Exception as exc:  # a shape Triton cannot compile (shared memory) is skipped
                print(f"  M={m} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        rows.sort(key=lambda r: r[0])
        if args.persistent:  # against the folded kernel the configuration picks now
            default = kern.rms_matmul_rope_config(m, x.shape[1], ref.HEAD_DIM, folded=True)
            t_default = timed(lambda i: rt.rms_norm_matmul_rope(sets[i][0], None, folded[i], ref.EPS, *sets[i][3:],
                                                                impl="fused"))  # fmt: skip
        else:
            t_default = timed(lambda i: rt.rms_norm_matmul_rope(*sets[i][:3], ref.EPS, *sets[i][3:]))
        print(f"M={m} ({len(sets)} input sets): unfused {t_unfused:.2f} us, cuBLAS alone {t_cublas:.2f} us; "
              f"default {t_default:.2f} us {default}")
        for t, cfg in rows if args.persistent else rows[:5]:
            print(f"   {t:8.2f} us  {t_unfused / t:5.2f}x unfused  {cfg}")
        results.append(dict(tokens=m, unfused_us=t_unfused, cublas_us=t_cublas, default_us=t_default,
                            configs=[dict(us=t, **cfg) for t, cfg in rows]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tune_projection.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
