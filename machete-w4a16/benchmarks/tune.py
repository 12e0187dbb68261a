"""Measure machete-w4a16's launch configurations on a GPU and write the dispatch table that
``w4a16_gemm`` consults first (``torch-ext/machete_w4a16/_tuning.py``):

    python machete-w4a16/benchmarks/tune.py [--dtypes bfloat16] [--shapes 8B-qkv,70B-down]
        [--tokens 1,16,256] [--group-size 128] [--quick] [--margin 0.98] [--no-write] [--dry-run]

For every (dtype, shape, M bucket), weights of group 128 (``--group-size``) without zero point
(uint4b8, what GPTQ checkpoints hold), it times in CUDA-graph replay with L2 rotation, the
peers and each phase's launches replayed in turns (the harness's ``time_alternated``), each call
after another kernel as in a decoder layer (``--back-to-back``: without it):

* cuBLAS bf16 / fp16: ``F.linear`` on the dequantized weight (the reference of the issue's
  targets, >= 3.3x at M <= 16 and >= 0.95x at M >= 256);
* tinygemm: ``torch.ops.aten._weight_int4pack_mm`` on the same codes and scales (bf16 only; a
  shape or torch it refuses is reported, not tuned against);
* our structural default (``_kernels.mma_config`` where the compiled kernel runs, else
  ``_kernels.w4a16_config``), then a sweep in two phases, each configuration's result checked
  against cuBLAS first (1% of the output's scale):
  1. the compiled kernel's whole launch space where it runs (M <= 32, K % 128 == 0, groups
     >= 32: K split 1 / 2 / 4, 4 / 8 warps, 1 / 2 row tiles); tiles and split: the Triton
     split-K kernel for M <= 128 elsewhere (BLOCK_N 32 / 64 / 128 rows, the K split
     from 1 / 2 / 4 / 8 / 16 that puts 2-8 programs on each SM) and the tiled kernel for
     M >= 32 (64-token tiles to M = 512, 128 from 256, 256 from 1024; BLOCK_N 64 / 128 at 16
     W rows a warp; BLOCK_K 128; within the H100's shared memory);
  2. around phase 1's fastest: BLOCK_K halved and doubled, the other warp count (4 / 8), and
     2 and 4 stages instead of 3.

The split values come from a fixed set, not from the SM count, so a configuration compiles
once for every shape (Triton compiles per constexpr set and per specialization of M: 1, a
multiple of 16, other). ``--dry-run`` prints the sweep and an estimate of phase 1's time
without a GPU (about 6.5 minutes per dtype for every shape and bucket, assuming 1.5 s per
compile and 0.25 s per timing); phase 2 runs at a point only while the projected total stays
under ``--budget-min`` (default 8) per dtype. A bucket gets the fastest configuration when it took at most ``margin`` (default 0.98) of
the default's time, else None (the default). The GPU's previous entries for the tuned keys are
replaced; other GPUs' entries are kept. The command line is added to the table's ``MADE_BY``
(``made_by_after``);
every timing goes to ``benchmarks/results/tune_<gpu>_<dtype>.json`` and ``.csv``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import pprint
import shlex
import statistics
import sys
import time
from importlib import import_module
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE_PATH = HERE.parent / "torch-ext" / "machete_w4a16" / "_tuning.py"
RESULTS = HERE / "results"
SPLITS = (1, 2, 4, 8, 16)
# What --dry-run's estimate assumes (not measured here): a Triton compile of one configuration
# on an H100 host, and one time_us point (warm-up, capture, ~0.2 s of replays) of a candidate
# and of a peer (cuBLAS / tinygemm: their inputs are built per point).
COMPILE_S, TIMING_S, PEER_S = 1.5, 0.25, 0.5
# About this much shared memory per program (bytes) is allowed to a tiled candidate: the x
# tile and the packed W tile per stage (W is dequantized in registers): the H100's 227 KiB per
# block (A100 163 KiB; a candidate that does not fit fails at launch and is skipped anyway).
# 160 KiB left out every 256-token tile (3 stages: 216 KiB), the default's from M = 1024.
SMEM_BOUND = 227 * 1024


def _ref():
    from fused_llm_dev.bench.suite import load_sibling

    return load_sibling(__file__)


def _smem(entry: list) -> int:
    _, bm, bn, bk, _, _, stages = entry
    return stages * (bm * bk * 2 + bn * bk // 2)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _spec(M: int) -> str:
    """Triton's specialization of the M argument: what makes one configuration compile again."""
    return "1" if M == 1 else "16k" if M % 16 == 0 else "other"


def splitk_candidates(M: int, N: int, K: int, group: int, sms: int, quick: bool) -> list[list]:
    """Phase 1 of the split-K kernel: BLOCK_M fixed by M (the GEMV at 1, else the smallest tl.dot
    tile holding M, at most 64), BLOCK_N rows, and the splits of SPLITS giving 2-8 programs per
    SM (the one nearest 4 where none does)."""
    bm = 1 if M == 1 else min(64, max(16, _pow2_at_least(M)))
    bk = min(128, group) if group >= 64 else 128  # as w4a16_config: a K step never straddles a group >= 64
    fitting = [s for s in SPLITS if s <= -(-K // bk)]
    out = []
    for bn in (64, 128) if quick else (32, 64, 128):
        tiles = -(-N // bn) * -(-M // bm)
        near = min(fitting, key=lambda s: abs(tiles * s - 4 * sms))
        splits = [near] if quick else [s for s in fitting if 2 * sms <= tiles * s <= 8 * sms] or [near]
        out += [["splitk", bm, bn, bk, s, 8 if bn == 128 else 4, 3] for s in splits]
    return out


def mma_candidates(quick: bool, registers_too: bool = False) -> list[list]:
    """Phase 1 of the compiled kernel: its whole launch space (K split 1 / 2 / 4 x 4 / 8 warps x
    1 / 2 row tiles per warp; --quick: no K split); ``registers_too`` (Hopper, M >= 2): each
    launch with the weights through the lanes' registers (RING 0) as well as through the TMA ring
    (the ring won at every M = 1 point, not at every M = 16 one: benchmarks/results/INDEX.md).
    No compile: every entry is instantiated."""
    splits = (1,) if quick else (1, 2, 4)
    rings = ((), (0,)) if registers_too else ((),)
    return [["mma", s, w, rt, *ring] for s in splits for w in (4, 8) for rt in (1, 2) for ring in rings]


def wgmma_candidates() -> list[list]:
    """Phase 1 of the Hopper kernel: its whole launch space (the four block tiles x K split 1 /
    2 / 3 / 4, --quick too: each split won somewhere in benchmarks/results/wgmma_*, and 0:
    stream-K). No compile: every entry is instantiated."""
    splits = (1, 2, 3, 4, 0)
    return [["wgmma", rows, tokens, s] for rows, tokens in ((128, 256), (128, 128), (128, 64), (64, 256)) for s in splits]


def tiled_candidates(M: int, quick: bool) -> list[list]:
    """Phase 1 of the tiled kernel, (BLOCK_M, BLOCK_N, warps) by M: 64-token tiles up to 512
    rows (at M = 512 on N = 4096, 128 x 128 tiles are under one wave of 132 SMs), 128 from 256,
    256 from 1024; 16 W rows a warp (BLOCK_N 64 on 4 warps, 128 on 8: W stays in registers,
    ``_kernels.w4a16_config``); K steps of 128, GROUP_M 8, 3 stages (4 with 64-token tiles);
    within a rough shared-memory bound."""
    out = []
    for bm in (64, 128, 256):
        if (bm == 64 and M > 512) or (bm == 128 and M < 256) or (bm == 256 and M < 1024):
            continue
        for bn in (128,) if quick else (64, 128):
            entry = ["tiled", bm, bn, 128, 8, bn // 16, 4 if bm == 64 else 3]
            if _smem(entry) <= SMEM_BOUND:
                out.append(entry)
    return out


def phase1(kern, M: int, N: int, K: int, group: int, sms: int, quick: bool, mma: bool,
           wgmma: bool = False) -> tuple[list, list[list]]:  # fmt: skip
    """(the structural default's entry, the phase-1 candidates without it). ``mma``: the
    compiled small-M kernel exists here (CUDA build, capability >= 8.0); where it can run it is
    the default and its launches replace the Triton split-K kernel's (1.7-2x slower at M <= 32 on
    the H100, benchmarks/results). ``wgmma``: the Hopper kernel exists here (capability 9.0);
    past M = 32 it is the default and its launches replace the Triton kernels' (slower at every
    point of benchmarks/results/wgmma_sweep_*; select_config takes no Triton entry there)."""
    cfg = import_module(kern.__name__.rpartition(".")[0] + "._config")
    # As select_config on a CUDA build of such a GPU: the compiled kernels' own shape rules.
    compiled = mma and kern.mma_shape_ok(M, K, group)
    if wgmma and not compiled and M > cfg.MMA_MAX_M and kern.wgmma_shape_ok(M, N, K, group):
        default = cfg.entry_of(kern.wgmma_config(M, N, K, sms))
        return default, [c for c in wgmma_candidates() if c != default]
    default = cfg.entry_of(kern.mma_config(M, N, K, sms) if compiled else kern.w4a16_config(M, N, K, group, sms))
    cands = []
    if compiled:
        cands += mma_candidates(quick, registers_too=wgmma and M > 1)
        # From 17 tokens (the bucket of 32) the Hopper kernel's 64-token tile can beat the small-M
        # kernel (M = 32: 8B gate/up 51.5 against 64.5 us, 70B QKV 49.8 against 58.2; at M = 16
        # it is slower everywhere, 8B QKV 20.3 against 13.9: benchmarks/results/wgmma_small_m_*):
        # there both are candidates, and select_config takes a Hopper entry of that bucket.
        if wgmma and M > 16 and kern.wgmma_shape_ok(M, N, K, group):
            cands += wgmma_candidates()
    elif M <= 64:
        cands += splitk_candidates(M, N, K, group, sms, quick)
    elif M == 128:  # the crossover: the split-K kernel's 64-row tiles, nearest 4 programs per SM
        cands += splitk_candidates(M, N, K, group, sms, True)
    if M >= 32:
        cands += tiled_candidates(M, quick)
    seen, out = {tuple(default)}, []
    for c in cands:
        if tuple(c) not in seen:
            seen.add(tuple(c))
            out.append(c)
    return default, out


def neighbours(entry: list, group: int) -> list[list]:
    """Phase 2 around ``entry``: BLOCK_K halved and doubled (32..256, the tiled kernel's from 128;
    dividing or divided by the group), the other warp count, 2 and 4 stages; none for the compiled kernel (phase 1 covers
    its launches)."""
    if entry[0] in ("mma", "wgmma"):
        return []
    kernel, bm, bn, bk, p4, warps, stages = entry
    out = []
    for k2 in (bk // 2, bk * 2):
        if (128 if kernel == "tiled" else 32) <= k2 <= 256 and (group == -1 or group % k2 == 0 or k2 % group == 0):
            out.append([kernel, bm, bn, k2, p4, warps, stages])
    out.append([kernel, bm, bn, bk, p4, 8 if warps == 4 else 4, stages])
    out += [[kernel, bm, bn, bk, p4, warps, s] for s in (2, 4) if s != stages]
    return [e for e in out if kernel == "splitk" or _smem(e) <= SMEM_BOUND]


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked (a SystemExit naming the bad value): shapes of benchmark.SHAPES,
    tokens of the table's buckets, dtypes bfloat16 / float16, a group size dividing every K
    (benchmark.make_weight makes grouped weights only: no per-channel -1)."""
    ref = _ref()
    buckets = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)  # _config.BUCKETS
    parser = argparse.ArgumentParser(prog="tune.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16", help="bfloat16 and / or float16 (default: %(default)s)")
    parser.add_argument("--shapes", default=",".join(ref.SHAPES), help=f"of {', '.join(ref.SHAPES)} (default: all)")
    parser.add_argument("--tokens", default=",".join(map(str, buckets)), help="M buckets to tune (default: all)")
    parser.add_argument("--group-size", type=int, default=128, help="weights' group size (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a small sweep (fewer tiles, no phase 2)")
    parser.add_argument("--budget-min", type=float, default=8.0, help="phase 2 runs at a point only while the "
                        "projected total stays under this many minutes per dtype (default: %(default)s)")  # fmt: skip
    parser.add_argument("--margin", type=float, default=0.98, help="a tuned entry must take at most this fraction of "
                        "the default's time (default: %(default)s)")  # fmt: skip
    parser.add_argument("--sms", type=int, default=None, help="SM count for --dry-run without a GPU (default: the GPU's, else 132)")
    parser.add_argument("--no-write", action="store_true", help="measure and print, do not write _tuning.py")
    parser.add_argument("--back-to-back", action="store_true", help="time each launch's calls back to back, "
                        "not each after another kernel as in a layer (the default)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the sweep and its estimated time; measure "
                        "nothing (no GPU needed)")  # fmt: skip
    args = parser.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    args.shapes = args.shapes.split(",")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
    if bad := [d for d in args.dtypes if d not in ("bfloat16", "float16")]:
        parser.error(f"--dtypes: expected bfloat16 and / or float16, got {bad}")
    if bad := [s for s in args.shapes if s not in ref.SHAPES]:
        parser.error(f"--shapes: expected names of {', '.join(ref.SHAPES)}, got {bad}")
    if bad := [t for t in args.tokens if t not in buckets]:
        parser.error(f"--tokens: expected buckets of {buckets}, got {bad}")
    G = args.group_size
    if G < 16 or G & (G - 1) or any(ref.SHAPES[s][1] % G for s in args.shapes):
        parser.error(f"--group-size: expected a power of two >= 16 dividing every K, got {G}")
    if not 0 < args.margin <= 1:
        parser.error(f"--margin: expected a fraction in (0, 1], got {args.margin}")
    args.tokens = sorted(set(args.tokens))
    return args


def dry_run(args, kern, sms: int, out=print) -> dict:
    """Print every point's phase-1 candidates and the estimated time; return the counts."""
    ref = _ref()
    compiled: set = set()
    timings = points = 0
    for dtype in args.dtypes:
        for shape in args.shapes:
            N, K = ref.SHAPES[shape]
            for M in args.tokens:
                # As on a CUDA build of an sm80+ GPU: the compiled kernel where it can run.
                default, cands = phase1(kern, M, N, K, args.group_size, sms, args.quick, mma=True)
                points += 1
                timings += 1 + len(cands)
                compiled |= {(dtype, tuple(e), _spec(M)) for e in [default, *cands] if e[0] != "mma"}
                out(f"{dtype} {shape} [N={N}, K={K}] M={M}: default {default}, {len(cands)} candidates: "
                    + " ".join(f"{e[0]}{e[1:]}" for e in cands))  # fmt: skip
    estimate = len(compiled) * COMPILE_S + timings * TIMING_S + points * 2 * PEER_S
    counts = dict(points=points, phase1_timings=timings, phase1_compiles=len(compiled), estimate_s=round(estimate))
    phase2 = "no phase 2 (--quick)" if args.quick else (
        f"phase 2 (up to 5 timings per point) only while the projected total stays under {args.budget_min:g} min per dtype")
    out(f"{points} points, {timings} phase-1 timings of {len(compiled)} distinct compiles: about "
        f"{estimate / 60:.1f} min (assuming {COMPILE_S} s per compile, {TIMING_S} s per timing, {PEER_S} s per peer "
        f"timing; not measured); {phase2}")  # fmt: skip
    return counts


# ---------------------------------------------------------------------------------------------
# Measuring (GPU)
# ---------------------------------------------------------------------------------------------


class Point:
    """One (dtype, shape, M): input sets built once and shared by every provider."""

    def __init__(self, kernel, dtype, N: int, K: int, M: int, group: int):
        self.kernel, self.dtype, self.N, self.K, self.M, self.G = kernel, dtype, N, K, M, group
        self._sets: dict[int, tuple] = {}
        self._dense: dict[int, object] = {}

    def inputs(self, seed: int):
        if seed not in self._sets:
            ref = _ref()
            qw = ref.make_weight(self.kernel, self.N, self.K, "cuda", seed, self.G, self.dtype)
            self._sets[seed] = (ref.make_x(self.M, self.K, "cuda", seed, self.dtype), qw)
        return self._sets[seed]

    def dense(self, seed: int):
        if seed not in self._dense:
            self._dense[seed] = self.kernel.dequantize(self.inputs(seed)[1])
        return self._dense[seed]

    def int4_bytes(self) -> int:
        groups = 1 if self.G == -1 else self.K // self.G
        return self.N * self.K // 2 + 2 * self.N * groups + 2 * self.M * self.K + 2 * self.M * self.N

    def bf16_bytes(self) -> int:
        return 2 * self.N * self.K + 2 * self.M * self.K + 2 * self.M * self.N


def _cublas(point: Point):
    import torch.nn.functional as F

    def make(seed):
        x, w = point.inputs(seed)[0], point.dense(seed)
        return lambda: F.linear(x, w)

    return make


def _tinygemm(point: Point):
    """aten._weight_int4pack_mm on the same codes and scales (as suite.py's tinygemm peer)."""
    import torch

    def make(seed):
        x, qw = point.inputs(seed)
        q = point.kernel.unpack_int4(qw.qweight)
        w = torch.ops.aten._convert_weight_to_int4pack(((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8), 8)
        sz = torch.stack([qw.scales, torch.zeros_like(qw.scales)], dim=-1).contiguous()
        return lambda: torch.ops.aten._weight_int4pack_mm(x, w, point.G, sz)

    return make


def _ours(point: Point, kern, cfg_mod, entry: list):
    import torch

    def make(seed):
        x, qw = point.inputs(seed)
        out = torch.empty(point.M, point.N, dtype=x.dtype, device="cuda")

        def call():
            kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, None, out, point.G, cfg=cfg_mod.config_of(entry))
            return out

        return call

    return make


def tune_point(point: Point, kern, cfg_mod, sms: int, quick: bool, margin: float, log, phase2=lambda: True,
               mma: bool = False, wgmma: bool = False, in_layer: bool = True) -> dict:  # fmt: skip
    """Time the peers, the default and the sweep at one point (phase 2 unless ``quick`` or
    ``phase2()`` says no: the time budget); the row of the results file. Each phase's launches
    are timed in turns with the peers (``time_alternated``); phase 2 times the default and phase
    1's best again with its candidates, so the choice compares times of the same rounds."""
    import torch

    from fused_llm_dev.bench.settings import IN_LAYER_BYTES, Method
    from fused_llm_dev.bench.timing import release_memory, time_alternated

    # In a layer (the default): each call after an in-place op over 1 MiB, whose own time is
    # subtracted, as a projection follows a norm, attention or activation kernel. The small-M
    # kernels launch as programmatic dependents; back to back each call overlaps its start with
    # the previous call of itself, which a layer never gives it (skinny-gemm's compiled kernel:
    # 1.05x cuBLAS at 8B QKV back to back, 0.95x after another kernel; H200, 2026-11-28).
    method = Method(replays=10, repeats=3, budget_s=0.2, predecessor_bytes=IN_LAYER_BYTES if in_layer else 0)
    expected = _cublas(point)(0)().float()
    scale = expected.abs().max().item()
    row = dict(N=point.N, K=point.K, M=point.M, group=point.G)
    peers = {"cublas": _cublas(point)}
    peer_bytes = {"cublas": point.bf16_bytes(), "tinygemm": point.int4_bytes()}
    if point.dtype == torch.bfloat16 and point.G in (32, 64, 128, 256):
        try:
            got = _tinygemm(point)(0)().float()
            if (got - expected).abs().max().item() <= 1e-2 * scale:
                peers["tinygemm"] = _tinygemm(point)
            else:
                log("  tinygemm: wrong result, not timed")
        except Exception as exc:  # noqa: BLE001 - a peer that refuses the shape is reported and skipped
            log(f"  tinygemm: {type(exc).__name__}: {str(exc)[:120]}")
    times: dict[tuple, float] = {}
    peer_times: dict[str, list[float]] = {name: [] for name in peers}

    def measure(entries: list[list], again: tuple = ()) -> None:
        """Check each new entry's result, then time the ones that pass in turns with the peers
        and the entries ``again`` (timed before: their times are replaced by this round's)."""
        makers, keys = {}, {}
        new = 0
        for key in again:
            if times.get(key, float("inf")) < float("inf"):
                name = " ".join(map(str, key))
                makers[name], keys[name] = _ours(point, kern, cfg_mod, list(key)), key
        for entry in entries:
            key = tuple(entry)
            if key in times:
                continue
            times[key] = float("inf")
            make = _ours(point, kern, cfg_mod, entry)
            try:
                got = make(0)().float()
                err = (got - expected).abs().max().item()
                if not err <= 1e-2 * scale:
                    log(f"  {entry}: wrong result (max |error| {err:.3g}), skipped")
                    continue
            except Exception as exc:  # noqa: BLE001 - a configuration that does not launch (resources) is skipped
                log(f"  {entry}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            name = " ".join(map(str, entry))
            makers[name], keys[name] = make, key
            new += 1
        if new == 0:
            return
        sizes = {**peer_bytes, **dict.fromkeys(makers, point.int4_bytes())}
        timed, failed = time_alternated({**peers, **makers}, sizes, method)
        for name, why in failed.items():
            log(f"  {name}: {why[:120]}")
        for name in peers:
            if name in timed:
                peer_times[name].append(timed[name].median_us)
        for name, key in keys.items():
            if name in timed:
                times[key] = timed[name].median_us

    default, cands = phase1(kern, point.M, point.N, point.K, point.G, sms, quick, mma, wgmma)
    measure([default, *cands])
    best = min(times, key=times.get)
    row["phase2"] = not quick and phase2()
    if row["phase2"]:
        # The neighbours in the same rounds as the default and phase 1's best, timed again.
        measure(neighbours(list(best), point.G), again=(tuple(default), best))
        best = min(times, key=times.get)
    point._dense.clear()  # the dense weights: 2 N K bytes per set
    release_memory()
    # A peer timed in both phases: the median of its phase medians (the two rounds' drift).
    for name in ("cublas", "tinygemm"):
        row[f"{name}_us"] = statistics.median(peer_times[name]) if peer_times.get(name) else None
    t_default, t_best = times[tuple(default)], times[best]
    chosen = list(best) if best != tuple(default) and t_best <= margin * t_default else None
    row.update(default=default, default_us=t_default, best=list(best), best_us=t_best, chosen=chosen,
               candidates=len(times), failed=sum(t == float("inf") for t in times.values()))  # fmt: skip
    # Every launch's time (the JSON only): what a structural default is fitted to.
    row["timings"] = {" ".join(map(str, k)): (None if t == float("inf") else round(t, 3)) for k, t in times.items()}
    return row


def made_by_after(command: str) -> str:
    """The table's MADE_BY once this run is written: the commands in the table file now (the
    buckets this run did not measure keep their entries, so the commands behind them stay), an
    identical earlier command dropped, this one last."""
    from fused_llm_dev.bench.tuning import read_table

    previous, _ = read_table(TABLE_PATH)
    commands = [c for c in previous.split(", then ") if c and c != command]
    return ", then ".join([*commands, command])


def write_table(table: dict, made_by: str) -> None:
    from fused_llm_dev.bench.tuning import write_table as write

    write(TABLE_PATH, table, made_by, "dict[tuple[str, str, int, int, int], list[tuple[int, list | None]]]")


def write_results(rows: list[dict], gpu: str, dtype: str, argv: list[str]) -> Path:
    import torch
    import triton

    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"tune_{gpu.replace(' ', '-')}_{dtype}"
    meta = dict(gpu=gpu, dtype=dtype, date=datetime.date.today().isoformat(), command=shlex.join(argv),
                versions=dict(torch=torch.__version__, triton=triton.__version__))  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))
    with stem.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "timings"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return stem


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    from fused_llm.packages import get_kernel

    kernel = get_kernel("machete-w4a16")
    kern = kernel._triton_kernels()
    cfg_mod = import_module(kernel.__name__ + "._config")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    sms = args.sms or (torch.cuda.get_device_properties(0).multi_processor_count if gpu else 132)
    if args.dry_run:
        dry_run(args, kern, sms)
        return 0
    if gpu is None:
        raise SystemExit("tune.py measures on a GPU; none is visible (--dry-run prints the sweep without one)")
    ref = _ref()
    mma = kern._mma_op() is not None and torch.cuda.get_device_capability(0)[0] >= 8
    wgmma = kern._wgmma_op() is not None and torch.cuda.get_device_capability(0) == (9, 0)
    # The table file as it stands, not the package's imported copy: a build copies the Python
    # files, so after an earlier run wrote the table that copy is stale until the next build.
    from fused_llm_dev.bench.tuning import read_table

    table = dict(read_table(TABLE_PATH)[1])
    t0 = time.time()
    points = len(args.shapes) * len(args.tokens)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        rows = []
        t_dtype, phase1_s = time.time(), []

        def within_budget() -> bool:
            """Phase 2 here (about as long again as phase 1 took) still leaves the remaining points'
            phase 1 (at the mean so far) inside --budget-min."""
            mean = sum(phase1_s) / len(phase1_s)
            left = points - len(phase1_s)
            return time.time() - t_dtype + phase1_s[-1] + left * mean <= 60 * args.budget_min

        for shape in args.shapes:
            N, K = ref.SHAPES[shape]
            key = cfg_mod.table_key(gpu, dtype_name, N, K, args.group_size)
            buckets = dict(table.get(key, []))
            for M in args.tokens:
                t_point = time.time()

                def phase2(t_point=t_point) -> bool:
                    phase1_s.append(time.time() - t_point)
                    return within_budget()

                row = tune_point(Point(kernel, dtype, N, K, M, args.group_size), kern, cfg_mod, sms, args.quick,
                                 args.margin, print, phase2, mma, wgmma, not args.back_to_back)  # fmt: skip
                rows.append(dict(shape=shape, dtype=dtype_name, **row))
                if row["best_us"] == float("inf"):  # no launch gave a right result: the bucket keeps its entry
                    print(f"{gpu} {dtype_name} {shape} M={M}: no launch timed; the table keeps {buckets.get(M)}", flush=True)
                    continue
                buckets[M] = row["chosen"]
                tg = f", tinygemm {row['tinygemm_us']:.1f} us" if row["tinygemm_us"] else ""
                vs = f"{row['cublas_us'] / row['best_us']:.2f}x cuBLAS" if row["cublas_us"] else "cuBLAS not timed"
                print(f"{gpu} {dtype_name} {shape} M={M}: cuBLAS {row['cublas_us'] or float('nan'):.1f} us{tg}, default "
                      f"{row['default_us']:.1f} us, best {row['best_us']:.1f} us {row['best']} "
                      f"({vs}{'' if row['phase2'] else ', phase 1 only'}) -> "
                      f"{'tuned' if row['chosen'] else 'default'} "
                      f"[{time.time() - t0:.0f} s]", flush=True)  # fmt: skip
            table[key] = sorted(buckets.items())
        print(f"wrote {write_results(rows, gpu, dtype_name, ['machete-w4a16/benchmarks/tune.py', *argv])}.json / .csv")
    print(f"tuned in {time.time() - t0:.0f} s")
    cfg_mod.check_table(table)
    if args.no_write:
        pprint.pprint(table, width=110)
        return 0
    write_table(table, made_by_after("python machete-w4a16/benchmarks/tune.py " + shlex.join(argv) + f"  # {gpu}"))
    print(f"wrote {TABLE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
