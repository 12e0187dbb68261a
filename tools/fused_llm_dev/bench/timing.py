"""Timing: a list of calls captured into one CUDA graph and replayed (``time_calls``), one op
over enough input sets to exceed the L2 (``time_us``), several such ops replayed in turns
(``time_alternated``), the copy ceiling and the launch floor."""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from .settings import Method
from .suite import Fn

METHOD = (
    "Per provider and case: N independent input sets with N * bytes_per_call > 4 x L2 "
    f"and N >= {Method.min_calls} where {Method.min_calls} sets fit in {Method.max_set_bytes >> 30} GiB "
    "(N >= 1), one warm-up call per set on a side stream (torch.compile compiles, Triton "
    "autotunes there), then all N calls captured into one CUDA graph; the graph is replayed "
    "`repeats` x `replays` times (replays lowered for long graphs to keep about `budget_s` "
    "per point, never under 3 per repeat), each replay timed with CUDA events; us per call = "
    "replay time / N; "
    "median and p20/p80 over replays. With `predecessor_bytes` (--in-layer), each call is captured "
    "after an in-place elementwise op over a scratch buffer of that size (a layer's previous kernel), "
    "and that op's own time per call, timed alone the same way, is subtracted. GB/s counts the provider's own minimum bytes "
    "(each input read once, each output written once). Copy ceiling: torch.mul(a, 1.0, out=b) "
    "on 2 GiB bf16 measured the same way, counting read + write bytes."
)



@dataclass(frozen=True)
class Timing:
    median_us: float  # per call
    p20_us: float
    p80_us: float
    calls_per_graph: int
    samples: int  # timed replays


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, like numpy's default."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def l2_bytes(device: torch.device | None = None) -> int:
    index = torch.cuda.current_device() if device is None else device.index
    return int(torch.cuda.get_device_properties(index or 0).L2_cache_size)


def calls_to_flush_l2(bytes_per_call: int, l2: int, factor: int = 4, max_calls: int = 16384) -> int:
    """Independent input sets needed so that the sets together exceed ``factor`` x L2."""
    return max(1, min(max_calls, factor * l2 // max(bytes_per_call, 1) + 1))


def calls_per_graph(bytes_per_call: int, l2: int, method: Method) -> int:
    """Input sets (calls a graph) for one op: enough to exceed ``method.l2_factor`` x L2, and at
    least ``method.min_calls`` where those sets fit in ``method.max_set_bytes``."""
    floor = min(method.min_calls, method.max_set_bytes // max(bytes_per_call, 1))
    return max(calls_to_flush_l2(bytes_per_call, l2, method.l2_factor), floor)


def _capture(graph: torch.cuda.CUDAGraph, fns: Sequence[Fn]) -> list:
    """Warm ``fns`` up, capture them (called in order) into ``graph`` and replay it once; returns
    the calls' outputs, which must outlive the graph's replays. Raises whatever warm-up or
    capture raises (e.g. a provider that synchronizes or allocates through a non-capturable
    path); the caller resets the graph and restores its stream."""
    # Warm up on a side stream, as torch.cuda.graphs recommends: lazy initialisation
    # (compilation, autotuning, cuBLAS workspaces) must not happen during capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        # Keep every call's outputs alive through capture: a dropped output returns its
        # block to the graph's pool and the next call gets the same addresses, so every
        # call would write one L2-resident buffer and never pay its writes to memory.
        outputs = [fn() for fn in fns]
    graph.replay()  # the first replay uploads the graph; keep it out of the samples
    torch.cuda.synchronize()
    return outputs


def _predecessor(method: Method) -> Fn | None:
    """The kernel each timed call follows under ``method.predecessor_bytes`` (None without): an
    in-place no-op (``| 0``) over its own scratch buffer, so it reads and writes memory as a
    layer's norm or activation kernel does and changes no input of the timed op."""
    if method.predecessor_bytes <= 0:
        return None
    scratch = torch.zeros(method.predecessor_bytes, dtype=torch.uint8, device="cuda")
    return lambda: scratch.bitwise_or_(0)


def _after(pre: Fn | None, fn: Fn) -> Fn:
    if pre is None:
        return fn

    def call():
        pre()
        return fn()

    return call


def _minus(t: Timing, us: float) -> Timing:
    """``t`` less ``us`` per call (the predecessor's own time)."""
    return replace(t, median_us=t.median_us - us, p20_us=t.p20_us - us, p80_us=t.p80_us - us)


def _replay_s(graph: torch.cuda.CUDAGraph) -> float:
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    return max(time.perf_counter() - t0, 1e-6)


def _timing(samples: list[float], calls: int) -> Timing:
    samples = sorted(samples)
    return Timing(
        median_us=_percentile(samples, 0.5),
        p20_us=_percentile(samples, 0.2),
        p80_us=_percentile(samples, 0.8),
        calls_per_graph=calls,
        samples=len(samples),
    )


def time_calls(fns: Sequence[Fn], method: Method = Method()) -> Timing:
    """Capture ``fns`` (called in order) into one CUDA graph and time its replays.

    Raises whatever warm-up or capture raises; the caller reports it and moves on.
    """
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    outputs = None
    try:
        outputs = _capture(graph, fns)  # alive through the replays
        # Long graphs (e.g. eager at 16K rows, or thousands of decode-size calls) would take
        # minutes at 100 replays; keep ~budget_s per point but never < 3 per repeat.
        one = _replay_s(graph)
        per_repeat = max(3, min(method.replays, int(method.budget_s / (method.repeats * one))))

        samples: list[float] = []
        for _ in range(method.repeats):
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(per_repeat)
            ]
            for start, end in events:
                start.record()
                graph.replay()
                end.record()
            torch.cuda.synchronize()
            samples += [start.elapsed_time(end) * 1e3 / len(fns) for start, end in events]
    finally:
        del outputs  # released with the graph
        # If capture_end raises, torch.cuda.graph leaves its capture stream current: restore ours.
        torch.cuda.set_stream(stream)
        with contextlib.suppress(RuntimeError):  # never mask the error that got us here
            graph.reset()
    return _timing(samples, len(fns))


def time_alternated(
    makers: dict[str, Callable[[int], Fn]], bytes_per_call: dict[str, int], method: Method = Method()
) -> tuple[dict[str, Timing], dict[str, str]]:
    """Time several ops against each other: each gets its input sets (as :func:`time_us`) and
    its own CUDA graph, and the graphs are replayed in turn, one replay each per round, the order
    reversed every other round, ``repeats x replays`` rounds (fewer for long graphs: about
    ``budget_s`` per op). Timed one after the other in one process, the same graph read up to
    20% apart early and late (an H100, 2026-11-25, machete-w4a16's small-M kernel); in turns,
    such drifts fall on every op alike. All rounds are enqueued before one synchronize, so each
    replay's events bracket GPU work only (a replay started on an idle GPU would count the host's
    graph launch, divided by a different number of calls per op). Returns ({name: Timing},
    {name: why it was not timed}) for the ops whose input sets, warm-up or capture raised. With
    ``method.predecessor_bytes`` every op's calls follow the predecessor kernel, which is timed
    alone in the same rounds and subtracted (as :func:`time_us` does; first run on a GPU by
    machete-w4a16's tune.py on an H200, 2026-11-28)."""
    pre = _predecessor(method)
    if pre is not None:
        pre_name = "(the predecessor kernel alone)"
        makers = {name: (lambda seed, make=make: _after(pre, make(seed))) for name, make in makers.items()}
        makers[pre_name] = lambda seed: pre
        bytes_per_call = {**bytes_per_call, pre_name: min(bytes_per_call.values())}
    stream = torch.cuda.current_stream()
    # name -> (graph, its calls, their outputs): the calls hold what the graph reads (a peer's
    # per-set weights), the outputs what it writes; both live as long as the graph.
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, list, list]] = {}
    failed: dict[str, str] = {}
    try:
        l2 = l2_bytes()
        for name, make in makers.items():
            graph = torch.cuda.CUDAGraph()
            try:
                fns = [make(seed) for seed in range(calls_per_graph(bytes_per_call[name], l2, method))]
                graphs[name] = (graph, fns, _capture(graph, fns))
            except Exception as exc:  # noqa: BLE001 - an op that cannot be captured is reported, not timed
                failed[name] = f"{type(exc).__name__}: {exc}"
                torch.cuda.set_stream(stream)
                with contextlib.suppress(RuntimeError):
                    graph.reset()
            fns = graph = None  # a failed op's inputs go now; a captured one's live on in graphs
        if not graphs:
            return {}, failed
        one = max(_replay_s(g) for g, _, _ in graphs.values())
        rounds = max(3, min(method.repeats * method.replays, int(method.budget_s / one)))
        events: dict[str, list] = {name: [] for name in graphs}
        order = list(graphs)
        for r in range(rounds):
            for name in order if r % 2 == 0 else reversed(order):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[name][0].replay()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize()
        timings = {}
        for name, pairs in events.items():
            calls = len(graphs[name][1])
            timings[name] = _timing([start.elapsed_time(end) * 1e3 / calls for start, end in pairs], calls)
        if pre is not None:
            if pre_name not in timings:
                raise RuntimeError(f"the predecessor kernel could not be timed: {failed.get(pre_name)}")
            pre_us = timings.pop(pre_name).median_us
            timings = {name: _minus(t, pre_us) for name, t in timings.items()}
        return timings, failed
    finally:
        torch.cuda.set_stream(stream)
        for graph, _, _ in graphs.values():
            with contextlib.suppress(RuntimeError):
                graph.reset()
        graphs.clear()
        release_memory()


def time_us(make: Callable[[int], Fn], bytes_per_call: int, method: Method = Method()) -> Timing:
    """Time one op: ``make(seed)`` builds one independent input set and returns its call."""
    n = calls_per_graph(bytes_per_call, l2_bytes(), method)
    pre = _predecessor(method)
    fns = [_after(pre, make(seed)) for seed in range(n)]
    try:
        t = time_calls(fns, method)
        return t if pre is None else _minus(t, time_calls([pre] * n, method).median_us)
    finally:
        del fns
        release_memory()


def release_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def measure_copy_ceiling(device: torch.device | str = "cuda", nbytes: int = 2 << 30) -> float:
    """GB/s (read + write bytes, 1e9) of ``torch.mul(a, 1.0, out=b)`` on ``nbytes`` of bf16.

    A kernel copy, not ``copy_``: the cudaMemcpy path is ~35% slower on an H200 and would
    flatter every kernel measured against it.
    """
    a = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    copy = functools.partial(torch.mul, a, 1.0, out=b)
    try:
        timing = time_calls([copy], Method())
    finally:
        del copy, a, b
        release_memory()
    return 2 * nbytes / (timing.median_us * 1e-6) / 1e9


def measure_launch_floor(device: torch.device | str = "cuda") -> float:
    """us per call of a one-element ``torch.add`` timed the same way: what one kernel costs in
    graph replay before it moves any data (the floor under every decode-size number)."""
    a = torch.ones(1, device=device)
    b = torch.empty_like(a)
    # 256 calls per graph, like the decode-size points, so the graph launch itself amortizes.
    return time_calls([functools.partial(torch.add, a, 1.0, out=b)] * 256, Method()).median_us
