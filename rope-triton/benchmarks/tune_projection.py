"""Sweep the fused projection's tile shapes and K splits on a GPU (the source of
`rms_matmul_rope_config`): `python rope-triton/benchmarks/tune_projection.py [--out DIR]`.

For each token count of the benchmark (Llama-3 8B [W_q; W_k], 5120 x 4096, bf16) it times every
configuration in CUDA-graph replay, checks its result against the unfused torch sequence, and
prints the best ones next to the unfused sequence (our RMSNorm + cuBLAS + our RoPE).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import _check_projection, make_unfused_ours, ref  # noqa: E402

from fused_llm.packages import get_kernel  # noqa: E402


def configs(m: int):
    if m <= 64:
        bm = 16 if m <= 16 else 64
        for bnh, bk, split, tma in itertools.product((32, 64), (64, 128), (2, 4, 8), (False, True)):
            if not tma and bnh == 32:
                continue
            yield {"BLOCK_M": bm, "BLOCK_NH": bnh, "BLOCK_K": bk, "SPLIT_K": split,
                   "num_warps": 4, "num_stages": 4, "USE_TMA": tma}  # fmt: skip
    else:
        for (bm, warps), stages, group in itertools.product(((64, 4), (128, 4), (128, 8)), (3, 4), (1, 8)):
            yield {"BLOCK_M": bm, "BLOCK_NH": 64, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": group,
                   "num_warps": warps, "num_stages": stages, "USE_TMA": True}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 64, 256, 1024, 4096])
    args = parser.parse_args()
    rt = get_kernel("rope-triton")
    kern = rt._triton_kernels()
    results = []
    for m in args.tokens:
        x, rms_w, w, cos, sin = ref.make_projection_inputs(m, "cuda", 0)
        expected = ref.projection_ref(x, rms_w, w, cos, sin)
        out = torch.empty(m, w.shape[0], dtype=x.dtype, device="cuda")
        unfused = make_unfused_ours({"tokens": m}, 0)
        t_unfused = do_bench_cudagraph(unfused) * 1e3
        t_cublas = do_bench_cudagraph(lambda: F.linear(x, w)) * 1e3
        default = kern.rms_matmul_rope_config(m, x.shape[1], ref.HEAD_DIM)
        rows = []
        for cfg in configs(m):
            try:
                def call(cfg=cfg):
                    kern.launch_rms_matmul_rope(x, rms_w, w, cos, sin, out, ref.EPS, ref.HEAD_DIM, cfg=cfg)
                out.fill_(float("nan"))
                call()
                _check_projection(out, expected)
                rows.append((do_bench_cudagraph(call) * 1e3, cfg))
            except Exception as exc:  # a shape Triton cannot compile (shared memory) is skipped
                print(f"  M={m} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        rows.sort(key=lambda r: r[0])
        t_default = do_bench_cudagraph(lambda: rt.rms_norm_matmul_rope(x, rms_w, w, ref.EPS, cos, sin)) * 1e3
        print(f"M={m}: unfused {t_unfused:.2f} us, cuBLAS alone {t_cublas:.2f} us; "
              f"default {t_default:.2f} us {default}")
        for t, cfg in rows[:5]:
            print(f"   {t:8.2f} us  {t_unfused / t:5.2f}x unfused  {cfg}")
        results.append(dict(tokens=m, unfused_us=t_unfused, cublas_us=t_cublas, default_us=t_default,
                            configs=[dict(us=t, **cfg) for t, cfg in rows]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tune_projection.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
