"""How the harness times each point (``Method``, recorded in every result file) and the
options of ``fused-llm bench PKG`` that set it. Imports no torch: ``fused-llm bench --help``
answers without loading it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


IN_LAYER_BYTES = 1 << 20  # --in-layer's predecessor: a 1 MiB in-place op, ~2 us in a graph


@dataclass(frozen=True)
class Method:
    """How each point is timed (recorded in the JSON)."""

    replays: int = 20  # timed replays per repeat, lowered for long graphs (budget_s)
    repeats: int = 5
    budget_s: float = 1.0  # rough cap on timed seconds per point; >= 3 replays per repeat
    l2_factor: int = 4  # input sets together exceed this many L2s
    # At least this many calls a graph where the sets fit in `max_set_bytes`: the graph's start
    # falls on its first call, and that call has no predecessor to overlap (programmatic
    # dependent launch), so a graph of three 75 MB GEMMs read skinny-gemm's 2304 x 16384 bf16
    # at 29.0 us a call where 17 calls read 27.6, and cuBLAS at 32.1 against 31.4 (H100;
    # skinny-gemm's results/harness_graph_calls_*.log). A decode step is one graph of hundreds
    # of kernels, each with a predecessor: the long graph measures a kernel's time there.
    min_calls: int = 16
    max_set_bytes: int = 2 << 30  # bytes of one op's input sets that min_calls may take
    # > 0: each timed call follows another kernel (an in-place elementwise op over a scratch
    # buffer of this many bytes), as a projection in a decoder layer follows a norm, attention or
    # activation kernel, not another call of itself; that kernel's time, measured alone the same
    # way, is subtracted. Back to back, a kernel launched as a programmatic dependent overlaps its
    # start with the previous call of itself, which a layer never gives it: skinny-gemm's kernel
    # read 1.05x cuBLAS at 8B QKV back to back and 0.95x after another kernel (H200, 2026-11-28,
    # skinny-gemm's results/in_layer_probe_*.log).
    predecessor_bytes: int = 0
    # True (--alternate): a case's providers are timed in turns (timing.time_alternated: one graph
    # each, replayed one after the other, the order reversed every round), so drift over a run
    # falls on each alike. Timed one after the other, two timings of the same cuBLAS call read
    # 0.91-1.09x each other at Llama-3-70B gate/up (57344 x 8192, H200, 2026-11-28), where
    # skinny-gemm's ``linear`` is ``F.linear``: more than the 2% its dispatch promises to keep.
    alternate: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The harness's options (``fused-llm bench PKG [options]``)."""
    parser.add_argument("--quick", action="store_true", help="the suite's few smoke-test cases")
    parser.add_argument("--suite", default=None, help="only this suite of a package that has several")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default <pkg>/benchmarks/results)")
    parser.add_argument("--providers", default=None, help="comma-separated subset, e.g. ours,torch_compile")
    parser.add_argument("--list", action="store_true", help="print cases and providers, time nothing")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PARAM=V[,V]",
        help="keep cases whose PARAM is one of the values, e.g. --only hidden=16384 (repeatable; "
        "to split a long suite over several runs, each writing its own files)",
    )
    parser.add_argument("--replays", type=int, default=Method.replays, help="timed replays per repeat (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=Method.repeats, help="timed repeats per point (default: %(default)s)")
    parser.add_argument("--budget", type=float, default=Method.budget_s, help="about this many timed seconds per point (default: %(default)s)")
    parser.add_argument("--alternate", action="store_true",
                        help="time each case's providers in turns (one graph each, replayed alternately), so that "
                        "drift over the run falls on all alike; for ratios within 2%% (files get '_alternated')")  # fmt: skip
    parser.add_argument("--in-layer", action="store_true",
                        help="time each call after another kernel (an elementwise op on a 1 MiB buffer), as in a "
                        "decoder layer, and subtract that kernel's own time (files get '_in-layer')")  # fmt: skip
