"""Measure the skinny kernel against cuBLAS on a GPU and write the dispatch table of
``linear`` / ``linear_fp8`` (``torch-ext/skinny_gemm/_tuning.py``). GPU only:

    python skinny-gemm/benchmarks/tune.py [--dtypes bfloat16,fp8] [--shapes 405B-tp8-qkv,8B-qkv]
                                          [--tokens 1,2,4] [--quick] [--dry-run] [--margin 0.98]

For every (dtype, shape, M bucket) it times cuBLAS (``F.linear`` / ``torch._scaled_mm``,
rowwise scales) and a sweep of skinny configurations in CUDA-graph replay with L2 rotation
(the harness's ``time_us``), after checking each configuration's result against cuBLAS. An
entry gets the fastest configuration when it took at most ``margin`` (default 0.98) of
cuBLAS's time, else None (cuBLAS): the 2% margin keeps a noisy win from becoming a dispatched
loss, since the issue's bar is "never more than 2% slower than cuBLAS". The GPU's previous
entries for the tuned keys are replaced; other GPUs' entries are kept. The command line goes
into the table's ``MADE_BY``.
"""

from __future__ import annotations

import argparse
import itertools
import pprint
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchmark as ref
from fused_llm.packages import get_kernel
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.timing import time_us

TABLE_PATH = HERE.parent / "torch-ext" / "skinny_gemm" / "_tuning.py"
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
METHOD = Method(replays=10, repeats=3, budget_s=0.3)


def candidates(kernel, M: int, N: int, K: int, elem: int, sms: int, quick: bool) -> list:
    """The sweep: BLOCK_M the smallest dot tile holding M (at M = 1 also the GEMV), BLOCK_N 32 /
    64 / 128 weight rows, 128 / 256 / 512 bytes of each row per K step, K slices for ~1 / 2 / 4
    / 8 programs per SM, 3 / 4 / 6 stages (quick: the default plus 12 neighbours)."""
    default = kernel.skinny_config(M, N, K, elem, sms)
    if quick:  # the neighbourhood of the winners of the H100 sweeps (2026-11-24)
        block_ns, kbytes, per_sm, stages = (32, 64), (256,), (1, 2, 4), (4,)
    else:
        block_ns, kbytes, per_sm, stages = (32, 64, 128), (128, 256, 512), (1, 2, 4, 8), (3, 4, 6)
    # At M = 1 both the FMA GEMV and a 16-row tl.dot tile (x's row repeated): the dot tile's
    # pipelined loads won at 2304 x 16384 on the H100 (bf16 30.9 vs 32.8 us, FP8 18.9 vs 21.6).
    block_ms = (1, 16) if M == 1 else (default.BLOCK_M,)
    out = {default}
    for bm, bn, kb, p, st in itertools.product(block_ms, block_ns, kbytes, per_sm, stages):
        bk = max(32, kb // elem)
        tiles = -(-N // bn) * -(-M // bm)
        split = max(1, min(-(-p * sms // tiles), -(-K // bk)))
        out.add(kernel.SkinnyConfig(bm, bn, bk, split, 8 if bn == 128 else 4, st))
    return sorted(out, key=lambda c: c.as_list())


def tune_one(kernel, dtype: str, shape: str, M: int, sms: int, quick: bool, margin: float, log):
    """(cuBLAS us, best skinny us, the entry: the best config or None, the best config)."""
    N, K = ref.SHAPES[shape]
    fp8 = dtype != "bfloat16"
    if fp8:
        def inputs(seed):
            xq, wq, xs, ws = ref.make_fp8(M, N, K, "cuda", seed)
            return xq, wq, xs, ws, ws.reshape(1, -1).contiguous()

        def cublas(seed):
            xq, wq, xs, _, wsT = inputs(seed)
            return lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=wsT, out_dtype=torch.bfloat16)

        def ours(cfg):
            def make(seed):
                xq, wq, xs, ws, _ = inputs(seed)
                return lambda: kernel.gemm_fp8(xq, wq, xs, ws, config=cfg)

            return make
        nbytes = N * K + M * K + 2 * M * N
    else:
        def cublas(seed):
            x, w = ref.make_x(M, K, "cuda", seed), ref.make_weight(N, K, "cuda", seed)
            return lambda: F.linear(x, w)

        def ours(cfg):
            def make(seed):
                x, w = ref.make_x(M, K, "cuda", seed), ref.make_weight(N, K, "cuda", seed)
                out = torch.empty(M, N, dtype=x.dtype, device="cuda")
                return lambda: kernel.gemm(x, w, out=out, config=cfg)

            return make
        nbytes = 2 * N * K + 2 * M * K + 2 * M * N
    expected = cublas(0)().float()
    t_cublas = time_us(cublas, nbytes, METHOD).median_us
    best, best_cfg = float("inf"), None
    for cfg in candidates(kernel, M, N, K, 1 if fp8 else 2, sms, quick):
        try:
            got = ours(cfg)(0)().float()
            err = (got - expected).abs().max().item()
            if not err <= 2e-2 * expected.abs().max().item():
                log(f"  {cfg.as_list()}: wrong result (max |error| {err:.3g}), skipped")
                continue
            t = time_us(ours(cfg), nbytes, METHOD).median_us
        except Exception as exc:  # noqa: BLE001 - a configuration that does not launch (resources) is skipped
            log(f"  {cfg.as_list()}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if t < best:
            best, best_cfg = t, cfg
    chosen = best_cfg.as_list() if best_cfg is not None and best <= margin * t_cublas else None
    return t_cublas, best, chosen, None if best_cfg is None else best_cfg.as_list()


def write_table(table: dict, made_by: str) -> None:
    from fused_llm_dev.bench.tuning import write_table as write

    write(TABLE_PATH, table, made_by, "dict[tuple[str, str, int, int], list[tuple[int, list[int] | None]]]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,fp8", help="bfloat16 and / or fp8 (the GPU's e4m3 format)")
    parser.add_argument("--shapes", default=",".join(ref.SHAPES), help=f"of {', '.join(ref.SHAPES)}")
    parser.add_argument("--tokens", default=",".join(map(str, BUCKETS)), help="M buckets to tune")
    parser.add_argument("--quick", action="store_true", help="a small sweep around the default configuration")
    parser.add_argument("--margin", type=float, default=0.98, help="ours must take at most this fraction of cuBLAS's time")
    parser.add_argument("--dry-run", action="store_true", help="print the entries, do not write _tuning.py")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tune.py measures on a GPU; none is visible")
    kernel = get_kernel("skinny-gemm")
    gpu = torch.cuda.get_device_name(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fp8_name = str(ref.fp8_dtype(0)).removeprefix("torch.")
    tokens = [int(t) for t in args.tokens.split(",")]
    if not set(tokens) <= set(BUCKETS):
        raise SystemExit(f"--tokens: expected buckets of {BUCKETS}, got {tokens}")
    from importlib import import_module

    table = dict(import_module(kernel.__name__ + "._tuning").TABLE)
    tuned: set = set()
    t0 = time.time()
    for dtype in args.dtypes.split(","):
        name = fp8_name if dtype == "fp8" else dtype
        for shape in args.shapes.split(","):
            N, K = ref.SHAPES[shape]
            rows = dict(table.get((gpu, name, N, K), []))
            for M in tokens:
                t_cublas, t_best, chosen, best = tune_one(kernel, dtype, shape, M, sms, args.quick, args.margin, print)
                rows[M] = chosen
                print(f"{gpu} {name} {shape} M={M}: cuBLAS {t_cublas:.1f} us, best skinny {t_best:.1f} us "
                      f"({t_cublas / t_best:.3f}x) {best} -> {'skinny' if chosen else 'cuBLAS'}", flush=True)  # fmt: skip
            table[(gpu, name, N, K)] = sorted(rows.items())
            tuned.add((gpu, name, N, K))
    print(f"tuned in {time.time() - t0:.0f} s")
    if args.dry_run:
        pprint.pprint(table, width=110)
        return
    made_by = "python skinny-gemm/benchmarks/tune.py " + shlex.join(sys.argv[1:]) + f"  # {gpu}"
    previous = import_module(kernel.__name__ + "._tuning").MADE_BY
    if previous and table.keys() - tuned:  # entries of earlier runs are kept: so are their commands
        made_by = f"{previous}; {made_by}"
    write_table(table, made_by)
    print(f"wrote {TABLE_PATH}")


if __name__ == "__main__":
    main()
