"""Sweep gated-mlp's tile shapes, K splits and operand paths on a GPU (the source of
`gated_mlp_config`): ``python gated-mlp/benchmarks/tune.py [--out DIR]``.

For each token count (Llama 3 8B MLP: D 4096, U 14336, bf16) it times every configuration in
CUDA-graph replay after checking its result, and prints the best next to cuBLAS alone and
cuBLAS + Liger. It also records the peak extra memory of each path at one prefill size.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import (
    _check,
    make_compile,
    make_cublas,
    make_cublas_liger,
    make_ours,
    make_ours_fp8,
    make_scaled_mm,
    make_scaled_mm_swiglu_fp8,
    ref,
    within_scale,
)

from fused_llm.packages import get_kernel
from fused_llm_dev.bench.suite import Case


def decode_configs(m: int, fp8: bool = False):
    """The decode sweep (--decode): x @ W^T 64-row tiles against W @ x^T tiles (SWAP_AB: W's
    rows on the MMA's 64-row side, 16 or 64 tokens on its narrow side, so a stage is mostly W and
    longer K steps fit), K splits, and stages up to ~200 KiB of shared memory."""
    esize = 1 if fp8 else 2
    bk0 = 128 if fp8 else 64
    for bn, split in itertools.product((64, 128), (1, 2)):
        yield {"BLOCK_M": 64, "BLOCK_N": bn, "BLOCK_K": bk0, "GROUP_M": 1, "SPLIT_K": split, "num_warps": 4,
               "num_stages": 4, "USE_TMA": True}  # fmt: skip
    for bm, bn, bk, split in itertools.product((16, 64), (64, 128), (bk0, 2 * bk0, 4 * bk0), (1, 2)):
        if bm > max(16, m) or bk > 256:  # a TMA box spans at most 256 elements
            continue
        stage = (bm + 2 * bn) * bk * esize
        for stages in sorted({max(2, min(6, 204 * 1024 // stage)), max(2, min(4, 100 * 1024 // stage))}):
            yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": split, "num_warps": 4,
                   "num_stages": stages, "USE_TMA": True, "SWAP_AB": True}  # fmt: skip


def configs(m: int, fp8: bool = False):
    if fp8:  # TMA only (native FP8 wgmma); K steps of 64 or 128 one-byte elements
        if m <= 64:
            for bn, split in itertools.product((64, 128), (1, 2)):
                yield {"BLOCK_M": 64, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 1, "SPLIT_K": split, "num_warps": 4,
                       "num_stages": 4, "USE_TMA": True}  # fmt: skip
        else:
            for (bm, bn, warps), stages in itertools.product(((128, 128, 8), (128, 64, 4), (128, 64, 8)), (3, 4)):
                yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 16, "SPLIT_K": 1, "num_warps": warps,
                       "num_stages": stages, "USE_TMA": True}  # fmt: skip
        return
    if m <= 64:
        for tma, bn, bk, split in itertools.product((True, False), (64, 128), (64,), (1, 2)):
            bm = 64 if tma or m > 16 else 16
            yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": split,
                   "num_warps": 4, "num_stages": 4, "USE_TMA": tma}  # fmt: skip
    else:
        for (bm, bn, warps), stages, group in itertools.product(((128, 128, 8), (64, 128, 4), (128, 64, 4)), (3, 4), (8, 16)):
            yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": group, "SPLIT_K": 1, "num_warps": warps,
                   "num_stages": stages, "USE_TMA": True}  # fmt: skip


_check_fp8 = within_scale("gated mlp fp8", 0.1)


def peak_extra_mib(make, case: Case) -> float:
    fn = make(case, 0)
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 64, 256, 1024, 4096])
    parser.add_argument("--model", default="8B", choices=list(ref.MODELS))
    parser.add_argument("--fp8", action="store_true", help="FP8 in, FP8 out (peers: _scaled_mm alone, + swiglu-fp8)")
    parser.add_argument("--decode", action="store_true", help="the decode sweep (decode_configs) at M <= 64")
    parser.add_argument("--tail-ab", action="store_true",
                        help="instead of the sweep: the default configuration with and without its split last wave")
    args = parser.parse_args()
    gm = get_kernel("gated-mlp")
    kern = gm._triton_kernels()
    d, u = ref.MODELS[args.model]
    results = []
    for m in args.tokens:
        case = Case.of(hidden=d, inter=u, tokens=m)
        if args.fp8:
            x, w, xs, ws, out_scale = ref.make_fp8_inputs(m, d, u, "cuda", 0)
            expected = ref.gated_fp8_ref(x, w, xs, ws, out_scale)
            out = torch.empty(m, u, dtype=ref.FP8, device="cuda")
            extra = ((xs, ws, ws), out_scale)
            gu64 = (x.double() @ w.double().T) * (xs.double() * ws.double())
            y64 = torch.nn.functional.silu(gu64[:, :u]) * gu64[:, u:]
            del gu64
            peer_makers = (("cublas_gemm", make_scaled_mm), ("cublas_liger", make_scaled_mm_swiglu_fp8))
            ours_maker = make_ours_fp8
        else:
            x, w = ref.make_inputs(m, d, u, "cuda", 0)
            expected = ref.gated_ref(x, w)
            out = torch.empty(m, u, dtype=x.dtype, device="cuda")
            extra = (None, None)
            peer_makers = (("cublas_gemm", make_cublas), ("cublas_liger", make_cublas_liger))
            ours_maker = make_ours
        wg, wu = w[:u], w[u:]
        peers = {name: do_bench_cudagraph(make(case, 0)) * 1e3 for name, make in peer_makers}
        t_default = do_bench_cudagraph(ours_maker(case, 0)) * 1e3
        flops = 2 * m * d * 2 * u
        rows = []
        if args.tail_ab:
            default = kern.gated_mlp_config(m, u, d, torch.cuda.get_device_properties(0).multi_processor_count, fp8=args.fp8)
            candidates = [dataclasses.asdict(default), {**dataclasses.asdict(default), "SPLIT_K": 1, "N_FULL": 0}]
        elif args.decode and m <= 64:
            candidates = decode_configs(m, args.fp8)
        else:
            candidates = configs(m, args.fp8)
        for cfg in candidates:
            try:
                launch_cfg = kern.GatedMlpConfig(**cfg)

                def call(launch_cfg=launch_cfg, x=x, wg=wg, wu=wu, out=out, extra=extra):
                    kern.launch_gated_mlp(x, wg, wu, None, None, out, "silu", launch_cfg, *extra)
                out.view(torch.uint8).fill_(0x7F) if args.fp8 else out.fill_(float("nan"))  # 0x7F: e4m3fn NaN
                call()
                (_check_fp8 if args.fp8 else _check)(out, expected)
                if args.fp8:  # accuracy: max |dequantized - fp64| as a fraction of max |fp64|
                    cfg = {**cfg, "err": ((out.double() * out_scale.double() - y64).abs().max() / y64.abs().max()).item()}
                rows.append((do_bench_cudagraph(call) * 1e3, cfg))
            except Exception as exc:  # noqa: BLE001 - a shape Triton cannot compile is skipped
                print(f"  M={m} {cfg}: {type(exc).__name__}: {str(exc)[:160]}")
        rows.sort(key=lambda r: r[0])
        print(f"M={m}: cuBLAS (fp8: _scaled_mm) {peers['cublas_gemm']:.2f} us, cuBLAS+Liger (fp8: + swiglu-fp8) "
              f"{peers['cublas_liger']:.2f} us, "
              f"ours (default config) {t_default:.2f} us ({flops / t_default / 1e6:.0f} TFLOP/s)")  # fmt: skip
        for t, cfg in rows[:6]:
            print(f"   {t:9.2f} us {flops / t / 1e6:5.0f} TF  {peers['cublas_liger'] / t:5.2f}x cuBLAS+Liger  "
                  f"{peers['cublas_gemm'] / t:5.2f}x cuBLAS  {cfg}")  # fmt: skip
        results.append({"tokens": m, "hidden": d, "inter": u, "default_us": t_default, **{f"{k}_us": v for k, v in peers.items()},
                        "configs": [{"us": t, **cfg} for t, cfg in rows]})  # fmt: skip
    if args.fp8:
        memory = {}
    else:
        memory = _memory(d, u)
    print("peak memory allocated during one call (MiB, output included), 4096 tokens:", memory)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = ("tune-fp8" if args.fp8 else "tune") + ("-decode" if args.decode else "") + ".json"
        (args.out / name).write_text(json.dumps({"configs": results, "peak_extra_mib": memory}, indent=1))


def _memory(d: int, u: int) -> dict:
    mem_case = Case.of(hidden=d, inter=u, tokens=4096)
    return {name: peak_extra_mib(make, mem_case)
            for name, make in (("ours", make_ours), ("cublas_liger", make_cublas_liger), ("torch_compile", make_compile))}  # fmt: skip


if __name__ == "__main__":
    main()
