"""Measure the skinny kernel against cuBLAS on a GPU and write the dispatch table of
``linear`` / ``linear_fp8`` (``torch-ext/skinny_gemm/_tuning.py``). GPU only:

    python skinny-gemm/benchmarks/tune.py [--dtypes bfloat16,fp8,fp8-tensor] [--shapes 405B-tp8-qkv,8B-qkv]
                                          [--tokens 1,2,4] [--quick] [--no-write] [--dry-run] [--margin 0.98]
    python skinny-gemm/benchmarks/tune.py --from-log LOG     # the entries a run cut short printed

The defaults are every shape of ``benchmark.SHAPES`` (the issue's Llama-405B TP8, Llama-3 8B
and 70B TP1 projections, and the 8B lm_head) at every M bucket of the table (1, 2, 4, 8, 16, 32, 64), all three dtypes;
a run can take a subset, and its entries are merged into the GPU's existing ones bucket by
bucket (a bucket a run did not tune keeps its entry; a bucket no run tuned is absent, and a call
with M tokens takes the first bucket >= M that is present). For every (dtype, shape, M bucket)
it times cuBLAS (``F.linear``; ``torch._scaled_mm`` with rowwise scales for ``fp8``, per-tensor
ones for ``fp8-tensor``, whose entries go under their own key ``"<fp8 dtype>/tensor"``) and a
sweep of skinny configurations in CUDA-graph replay with L2 rotation (the harness's
``time_us``), each call after another kernel as in a decoder layer (``--back-to-back``: without
it), after checking each configuration's result against cuBLAS. An entry gets the
fastest configuration when it took at most ``margin`` (default 0.98) of cuBLAS's time, else
None (cuBLAS): the 2% margin keeps a noisy win from becoming a dispatched loss, since the
issue's bar is "never more than 2% slower than cuBLAS". The GPU's previous buckets of the
tuned keys are replaced; other GPUs' entries are kept. The command line goes into the table's
``MADE_BY``. ``--dry-run`` lists the sweep without a GPU (``--sms`` sets the SM count it plans
for); ``--no-write`` measures and prints the table instead of writing it. On an
H100 a ``--quick`` run took 35 s for 20 points of the Triton kernel alone (2026-11-24); with the
compiled kernel's launches at M <= 16, 41 points in ~330 s (2026-11-28). A run prints its
command first; ``--from-log`` writes the entries of the points such a log holds (a run that a
time limit stopped before it wrote the table).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import pprint
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_llm.packages import get_kernel
from fused_llm_dev.bench.settings import IN_LAYER_BYTES, Method
from fused_llm_dev.bench.suite import load_sibling
from fused_llm_dev.bench.timing import time_us
from fused_llm_dev.bench.tuning import read_table

HERE = Path(__file__).resolve().parent
ref = load_sibling(__file__)  # benchmark.py: the shapes and inputs (the suite's module too)

TABLE_PATH = HERE.parent / "torch-ext" / "skinny_gemm" / "_tuning.py"
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# In a layer, as the model runs the projections: each timed call after another kernel
# (Method.predecessor_bytes), whose own time is subtracted. Back to back, the compiled kernel's
# start overlaps the previous call of itself (programmatic dependent launch), which a decoder
# layer never gives it: at 8B QKV (H200) that read 1.05x cuBLAS where the layer gives 0.95x
# (results/in_layer_probe_*.log), so a back-to-back table routed the model onto losing entries.
METHOD = Method(replays=10, repeats=3, budget_s=0.3, predecessor_bytes=IN_LAYER_BYTES)
BACK_TO_BACK = replace(METHOD, predecessor_bytes=0)
# The compiled kernel's launch shapes a --quick sweep tries: the ones that run one block an SM at
# the split tma_split chooses (the fastest on an H100, 2026-11-28: docs/skinny-gemm-tma-kernel.md)
# and a few with room for two.
QUICK_TMA = {(64, 4, 4), (64, 2, 8), (64, 4, 3), (64, 2, 4), (32, 4, 6), (128, 2, 4), (128, 1, 6), (32, 8, 2)}


def candidates(kernel, M: int, N: int, K: int, elem: int, sms: int, quick: bool, tma: list | None = None,
               mma: list | None = None) -> list:
    """The sweep: BLOCK_M the smallest dot tile holding M (at M = 1 also the GEMV, at 2 the
    GEMV of ``two_token_gemv_candidates``), BLOCK_N 32 /
    64 / 128 weight rows, 128 / 256 / 512 bytes of each row per K step, K slices for ~1 / 2 / 4
    / 8 programs per SM, 3 / 4 / 6 stages (quick: the default plus 12 neighbours); with 16-bit
    at M <= 16, also every launch shape of the compiled Hopper kernel in ``tma`` (the build's
    ``tma_configs()`` on a capability 9.0 GPU, else none) where K is a multiple of 16 bytes,
    each at the K split of ``tma_split`` and its neighbours (blocks from ~0.7 to ~2.6 an SM), and
    every launch of the compiled tensor-core GEMV in ``mma`` (the build's ``mma_configs("cuda")`` on a
    capability >= 8.0 GPU; FP8 too on >= 8.9) where K is a whole number of the launch's steps and
    M at most the launch's tokens (``max_m``: 4 or 8 for the row-run loop)."""
    default = kernel.skinny_config(M, N, K, elem, sms)
    if quick:  # the neighbourhood of the winners of the H100 sweeps (2026-11-24)
        block_ns, kbytes, per_sm, stages = (32, 64), (256,), (1, 2, 4), (4,)
    else:
        block_ns, kbytes, per_sm, stages = (32, 64, 128), (128, 256, 512), (1, 2, 4, 8), (3, 4, 6)
    # At M = 1 both the FMA GEMV on 32 / 64 rows and a 16-row tl.dot tile (x's row repeated),
    # plus the few-row GEMV of gemv_candidates, which won every bf16 shape on the H100.
    block_ms = (1, 16) if M == 1 else (default.BLOCK_M,)
    out = {default}
    for bm, bn, kb, p, st in itertools.product(block_ms, block_ns, kbytes, per_sm, stages):
        bk = max(32, kb // elem)
        tiles = -(-N // bn) * -(-M // bm)
        split = max(1, min(-(-p * sms // tiles), -(-K // bk)))
        out.add(kernel.SkinnyConfig(bm, bn, bk, split, 8 if bn == 128 else 4, st))
    if M == 1:
        out |= set(gemv_candidates(kernel, K, elem, quick))
    elif M == 2:
        out |= set(two_token_gemv_candidates(kernel, K, quick))
    if tma and M <= 16 and (K * elem) % 16 == 0:
        for c in tma:
            if quick and (c.tile_n, c.boxes_k, c.stages) not in QUICK_TMA:
                continue
            base = kernel.tma_split(N, c.tile_n, sms)
            for split in {base - 1, base, base + 1}:
                blocks = -(-N // c.tile_n) * split
                if split == base or (1 <= split <= 8 and 0.7 * sms <= blocks <= 2.6 * sms):
                    out.add(kernel.TmaConfig(c.tile_n, c.boxes_k, c.stages, split))
    if mma and M <= 16:
        out |= {c for c in mma if K % c.step_k(elem) == 0 and M <= c.max_m}
    return sorted(out, key=lambda c: c.as_list())


def gemv_candidates(kernel, K: int, elem: int, quick: bool) -> list:
    """The GEMV at M = 1 with few rows and long K steps (1-16 rows x 2-8 KiB of each row a step:
    2K-16K fp32 accumulators in 16-bit, 8-64 registers a thread at 8 warps; twice the columns
    in FP8), no K split: the grid has N / BLOCK_N programs; 1-3 stages (one: plain loads, as
    Inductor's reductions run), 8 / 16 warps (quick) or 4 / 8 / 16. The shape of Inductor's M = 1
    reduction, which read 2304 x 16384 bf16 at 27.5 us where cuBLAS took 31.9 (H100,
    2026-11-24, results/INDEX.md), and on the H200 at 99% of the read floor where the table's
    launch (4 rows x 4096 columns, 8 warps) read 90% (2026-11-29): hence also one and two rows a
    program, the grid of N programs Inductor's reductions use for few outputs."""
    from importlib import import_module

    pow2_floor = import_module(kernel.__name__ + "._config")._pow2_floor  # as skinny_config's K step
    out = []
    for bn, kb in ((1, 4096), (1, 8192), (2, 4096), (2, 8192), (4, 4096), (4, 8192), (8, 2048), (8, 4096), (16, 2048)):
        bk = min(kb // elem, pow2_floor(K))
        for warps, stages in itertools.product((8, 16) if quick else (4, 8, 16), (1, 2, 3)):
            out.append(kernel.SkinnyConfig(1, bn, max(32, bk), 1, warps, stages))
    return out


def two_token_gemv_candidates(kernel, K: int, quick: bool) -> list:
    """The GEMV at 2 tokens (BLOCK_M 2): 8 or 16 consecutive columns a thread (one or two 16-byte
    loads of 16-bit W), so a K step is 32 x warps x that many columns and every warp lies along K:
    W, x and the [tokens, rows, K step] fp32 accumulator then share one layout (with warps across
    rows or tokens, Triton 3.9 converted W's layout through shared memory every step). Rows a
    program: as many as keep the accumulator at 64 registers a thread, and half that; 4 or 8
    warps; no K split, or 2 (not in quick). At 4 tokens the same kernel read 2304 x 16384 in
    33.5-67.5 us against cuBLAS's 24.1, at 2 in 24.1 against 23.0 and 8B O in 11.75 against 13.4
    (H200, in a layer, 2026-11-28, results/few_token_gemv_probe_*.log): 4-8 tokens are left to
    the tensor cores."""
    out = []
    for warps, per_thread, split in itertools.product((4, 8), (8, 16), (1,) if quick else (1, 2)):
        bk = 32 * warps * per_thread
        if bk > K:
            continue
        rows = 64 // (2 * per_thread)
        for bn in {max(1, rows), max(1, rows // 2)}:
            out.append(kernel.SkinnyConfig(2, bn, bk, split, warps, 1))
    return out


def tune_one(kernel, dtype: str, shape: str, M: int, sms: int, quick: bool, margin: float, log, tma: list | None = None,
             method: Method = METHOD, mma: list | None = None, only: list | None = None):
    """(cuBLAS us, best skinny us, the entry: the best config or None, the best config). dtype
    ``fp8``: per-token x and per-channel w scales against cuBLAS's rowwise GEMM; ``fp8-tensor``:
    both scales per tensor against its per-tensor GEMM. Timed with ``method`` (default: in a
    layer). ``only``: these candidates instead of the sweep."""
    N, K = ref.SHAPES[shape]
    fp8 = dtype != "bfloat16"
    if fp8:
        def inputs(seed):
            return ref.make_fp8(M, N, K, "cuda", seed, per_tensor=dtype == "fp8-tensor")

        def cublas(seed):
            xq, wq, xs, ws = inputs(seed)
            sa, sb = ref.scaled_mm_scales(xs, ws)
            return lambda: torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        def ours(cfg):
            def make(seed):
                xq, wq, xs, ws = inputs(seed)
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
    t_cublas = time_us(cublas, nbytes, method).median_us
    best, best_cfg = float("inf"), None
    for cfg in only if only is not None else candidates(kernel, M, N, K, 1 if fp8 else 2, sms, quick, tma, mma):
        try:
            got = ours(cfg)(0)().float()
            err = (got - expected).abs().max().item()
            if not err <= 2e-2 * expected.abs().max().item():
                log(f"  {cfg.as_list()}: wrong result (max |error| {err:.3g}), skipped")
                continue
            t = time_us(ours(cfg), nbytes, method).median_us
        except Exception as exc:  # noqa: BLE001 - a configuration that does not launch (resources) is skipped
            log(f"  {cfg.as_list()}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if t < best:
            best, best_cfg = t, cfg
    chosen = best_cfg.as_list() if best_cfg is not None and best <= margin * t_cublas else None
    return t_cublas, best, chosen, None if best_cfg is None else best_cfg.as_list()


def rows_only_candidates(kernel, mma: list, entry, M: int, K: int, elem: int, wgmma: bool = False) -> list:
    """--rows-only (--wgmma-only: ``wgmma``): the row-run (wgmma) launches that take M tokens and K,
    and the bucket's current table entry (a list, or None: cuBLAS, timed anyway)."""
    from importlib import import_module

    out = [c for c in mma if (c.wgmma if wgmma else c.segments and not c.wgmma) and M <= c.max_m and K % c.step_k(elem) == 0]
    if entry is not None:
        out.append(import_module(kernel.__name__ + "._config").config_from_list(entry))
    return out


def write_table(table: dict, made_by: str) -> None:
    from fused_llm_dev.bench.tuning import write_table as write

    write(TABLE_PATH, table, made_by, "dict[tuple[str, str, int, int], list[tuple[int, list[int] | None]]]")


def merge(rows: list, tuned: dict) -> list:
    """A key's ``[(m_max, config or None)]`` with the buckets of ``tuned`` ({M: entry}) replaced
    or added, in increasing M."""
    return sorted({**dict(rows), **tuned}.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked (a SystemExit naming the bad value)."""
    parser = argparse.ArgumentParser(prog="tune.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,fp8,fp8-tensor",
                        help="of bfloat16, fp8 (the GPU's e4m3 format, rowwise scales), fp8-tensor (per-tensor scales)")
    parser.add_argument("--shapes", default=",".join(ref.SHAPES), help=f"of {', '.join(ref.SHAPES)} (default: all)")
    parser.add_argument("--tokens", default=",".join(map(str, BUCKETS)), help="M buckets to tune (default: all)")
    parser.add_argument("--quick", action="store_true", help="a small sweep around the default configuration")
    parser.add_argument("--margin", type=float, default=0.98, help="ours must take at most this fraction of cuBLAS's time")
    parser.add_argument("--back-to-back", action="store_true",
                        help="time the calls back to back, not each after another kernel as in a layer (the default)")
    parser.add_argument("--sms", type=int, default=None, help="SM count for --dry-run without a GPU (default: the GPU's, else 132)")
    parser.add_argument("--no-write", action="store_true", help="measure and print the table, do not write _tuning.py")
    parser.add_argument("--rows-only", action="store_true",
                        help="time only the row-run launches of the compiled GEMV (MmaConfig segments) and each bucket's "
                             "current table entry (an earlier sweep's winner) against cuBLAS: a re-tune after those "
                             "launches were added, at a fraction of a sweep's time")
    parser.add_argument("--wgmma-only", action="store_true",
                        help="as --rows-only, with the wgmma launches of the compiled GEMV (MmaConfig wgmma; capability 9.0)")
    parser.add_argument("--dry-run", action="store_true", help="list the sweep; measure nothing (no GPU needed)")
    parser.add_argument("--from-log", metavar="LOG", default=None,
                        help="write the entries a run printed to LOG (one cut short by a time limit): no GPU needed")
    args = parser.parse_args(argv)
    args.dtypes, args.shapes = args.dtypes.split(","), args.shapes.split(",")
    try:
        args.tokens = sorted({int(t) for t in args.tokens.split(",")})
    except ValueError:
        parser.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
    if bad := [d for d in args.dtypes if d not in ("bfloat16", "fp8", "fp8-tensor")]:
        parser.error(f"--dtypes: expected bfloat16, fp8 and / or fp8-tensor, got {bad}")
    if bad := [s for s in args.shapes if s not in ref.SHAPES]:
        parser.error(f"--shapes: expected names of {', '.join(ref.SHAPES)}, got {bad}")
    if bad := [t for t in args.tokens if t not in BUCKETS]:
        parser.error(f"--tokens: expected buckets of {BUCKETS}, got {bad}")
    if not 0 < args.margin <= 1:
        parser.error(f"--margin: expected a fraction in (0, 1], got {args.margin}")
    return args


def dry_run(args, kernel, sms: int, out=print, tma: list | None = None, mma: list | None = None) -> int:
    """Print every point's candidates; return the number of points."""
    points = 0
    for dtype in args.dtypes:
        for shape in args.shapes:
            N, K = ref.SHAPES[shape]
            for M in args.tokens:
                cands = candidates(kernel, M, N, K, 2 if dtype == "bfloat16" else 1, sms, args.quick, tma, mma)
                points += 1
                out(f"{dtype} {shape} [N={N}, K={K}] M={M}: {len(cands)} configurations: " + " ".join(str(c.as_list()) for c in cands))
    out(f"{points} points")
    return points


# A measured point as main() prints it: "<gpu> <dtype key> <shape> M=<m>: cuBLAS .. -> skinny|cuBLAS".
LOG_LINE = re.compile(r"^(?P<gpu>.+) (?P<name>\S+) (?P<shape>\S+) M=(?P<m>\d+): cuBLAS [\d.]+ us, best skinny [\d.]+ us "
                      r"\([\d.]+x\) (?P<best>\[[-\d, ]+\]|None) -> (?P<pick>skinny|cuBLAS)$")


def from_log(path: str) -> int:
    """Writes the entries of the points a tune run printed (LOG_LINE), merged into the table as
    that run would have merged them, with the run's command from the log's first line."""
    made_by_before, table = read_table(TABLE_PATH)
    lines = Path(path).read_text().splitlines()
    command = lines[0].removeprefix("# ") if lines and lines[0].startswith("# ") else None
    if command is None:
        raise SystemExit(f"{path}: the first line must be '# <the tune.py command>' (main() prints it)")
    by_key: dict = {}
    for line in lines:
        m = LOG_LINE.match(line)
        if m:
            N, K = ref.SHAPES[m["shape"]]
            pick = ast.literal_eval(m["best"]) if m["pick"] == "skinny" else None
            by_key.setdefault((m["gpu"], m["name"], N, K), {})[int(m["m"])] = pick
    for key, chosen in by_key.items():
        table[key] = merge(table.get(key, []), chosen)
    points = sum(map(len, by_key.values()))
    made_by = f"{command} ({points} points, written from its log)"
    write_table(table, f"{made_by_before}; {made_by}" if made_by_before else made_by)
    print(f"wrote {TABLE_PATH}: {points} points of {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_log:
        return from_log(args.from_log)
    kernel = get_kernel("skinny-gemm")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    sms = args.sms or (torch.cuda.get_device_properties(0).multi_processor_count if gpu else 132)
    # The compiled kernels' launches, where this build and GPU have them: the Hopper kernel's on
    # capability 9.0, the tensor-core GEMV's from 8.0 on.
    cap = torch.cuda.get_device_capability(0) if gpu is not None else (0, 0)
    tma = kernel.tma_configs() if cap == (9, 0) else []
    mma = kernel.mma_configs("cuda") if cap >= (8, 0) else []
    if args.dry_run:
        dry_run(args, kernel, sms, tma=tma, mma=mma)
        return 0
    if gpu is None:
        raise SystemExit("tune.py measures on a GPU; none is visible (--dry-run lists the sweep without one)")
    fp8_name = str(ref.fp8_dtype(0)).removeprefix("torch.")
    command = "python skinny-gemm/benchmarks/tune.py " + shlex.join(argv) + f"  # {gpu}"
    print(f"# {command}", flush=True)  # from_log reads it back
    made_by_before, before = read_table(TABLE_PATH)
    table = dict(before)
    tuned: set = set()
    t0 = time.time()
    for dtype in args.dtypes:
        name = {"fp8": fp8_name, "fp8-tensor": f"{fp8_name}/tensor"}.get(dtype, dtype)
        for shape in args.shapes:
            N, K = ref.SHAPES[shape]
            chosen_by_m = {}
            for M in args.tokens:
                only = rows_only_candidates(kernel, mma, dict(before.get((gpu, name, N, K), [])).get(M), M, K,
                                            1 if dtype != "bfloat16" else 2, wgmma=args.wgmma_only)  \
                    if args.rows_only or args.wgmma_only else None  # fmt: skip
                t_cublas, t_best, chosen, best = tune_one(kernel, dtype, shape, M, sms, args.quick, args.margin, print, tma,
                                                          BACK_TO_BACK if args.back_to_back else METHOD, mma, only)
                chosen_by_m[M] = chosen
                print(f"{gpu} {name} {shape} M={M}: cuBLAS {t_cublas:.1f} us, best skinny {t_best:.1f} us "
                      f"({t_cublas / t_best:.3f}x) {best} -> {'skinny' if chosen else 'cuBLAS'}", flush=True)  # fmt: skip
            table[(gpu, name, N, K)] = merge(table.get((gpu, name, N, K), []), chosen_by_m)
            tuned.add((gpu, name, N, K))
    print(f"tuned in {time.time() - t0:.0f} s")
    if args.no_write:
        pprint.pprint(table, width=110)
        return 0
    made_by = command
    kept = before.keys() - tuned or any(dict(before.get(k, [])).keys() - set(args.tokens) for k in tuned)
    if made_by_before and kept:  # entries of earlier runs are kept: so are their commands
        made_by = f"{made_by_before}; {made_by}"
    write_table(table, made_by)
    print(f"wrote {TABLE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
