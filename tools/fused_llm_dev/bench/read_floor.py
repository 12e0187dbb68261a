"""The read-bandwidth floor of a weight: how fast this GPU reads its bytes once with nothing else to
do, timed by the harness like the GEMMs beside it (``read_floor`` providers).

A Triton kernel streams a buffer of the weight's size (int32 words, 16-byte loads, evict-first)
and folds it into one word a program: no arithmetic worth the name, so its time is the memory's
and the launch's. Which launch (words a step, warps, programs an SM) reads fastest depends on
the size and the GPU, so :func:`make_read_floor` times a few once per size, in a graph over
enough copies to leave the L2, and keeps the fastest. The floor replaced ``torch.amax`` (a
reduction slower than cuBLAS's GEMM over the same bytes: 30.5 us at 2304 x 16384 bf16 on an H200,
where cuBLAS read the weight in 22.8 us), so GEMMs read above "100% of the floor".

Triton is imported on first use: the suites that name this provider load on CPU-only machines.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .suite import Fn

# (words a step, warps, programs an SM): 16-byte loads, so a step of 8192 words at 8 warps keeps
# eight loads a thread in flight. The kernel has no loop-carried dependence but its accumulator.
_CANDIDATES = tuple((block, warps, per_sm) for block in (2048, 8192) for warps in (4, 8) for per_sm in (1, 2, 4, 8))


@dataclass(frozen=True)
class ReadLaunch:
    block: int  # int32 words a step of a program
    warps: int
    programs: int
    per_program: int  # words a program reads (a multiple of block)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read_words(src, out, n_words, per_program, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * per_program
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
        for off in range(0, per_program, BLOCK):
            idx = start + off + tl.arange(0, BLOCK)
            acc |= tl.load(src + idx, mask=idx < n_words, other=0, eviction_policy="evict_first")
        tl.store(out + pid, tl.max(acc, axis=0))

    return read_words


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _launch(n_words: int, block: int, warps: int, programs: int) -> ReadLaunch:
    per_program = _cdiv(_cdiv(n_words, programs), block) * block
    return ReadLaunch(block, warps, _cdiv(n_words, per_program), per_program)


def _call(src: torch.Tensor, launch: ReadLaunch) -> Fn:
    out = torch.empty(launch.programs, dtype=torch.int32, device=src.device)
    kernel = _kernel()
    n = src.numel()

    def read():
        kernel[(launch.programs,)](src, out, n, launch.per_program, BLOCK=launch.block, num_warps=launch.warps)
        return out

    return read


def _buffer(nbytes: int, seed: int) -> torch.Tensor:
    return torch.full((-(-nbytes // 4),), seed % 7 + 1, dtype=torch.int32, device="cuda")


@functools.cache
def best_launch(nbytes: int, device_index: int) -> ReadLaunch:
    """The fastest of the candidate launches over ``nbytes``, each timed as the harness times a
    provider (graph replay over copies that exceed the L2, back to back)."""
    from .settings import Method
    from .timing import calls_per_graph, l2_bytes, release_memory, time_calls

    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    bufs = [_buffer(nbytes, seed) for seed in range(calls_per_graph(nbytes, l2_bytes(), Method()))]
    n_words = bufs[0].numel()
    quick = Method(replays=5, repeats=2, budget_s=0.1)
    best, best_us = None, float("inf")
    try:
        for block, warps, per_sm in _CANDIDATES:
            if block > n_words:
                continue
            launch = _launch(n_words, block, warps, sms * per_sm)
            us = time_calls([_call(b, launch) for b in bufs], quick).median_us
            if us < best_us:
                best, best_us = launch, us
    finally:
        del bufs
        release_memory()
    if best is None:  # fewer words than the smallest step
        best = _launch(n_words, 2048, 4, 1)
    return best


def make_read_floor(nbytes_of):
    """A provider's ``make(case, seed)``: the read kernel over ``nbytes_of(case)`` bytes, the
    fastest launch for that size (chosen once per size on the current GPU)."""

    def make(case, seed: int) -> Fn:
        nbytes = nbytes_of(case)
        launch = best_launch(nbytes, torch.cuda.current_device())
        return _call(_buffer(nbytes, seed), launch)

    return make


def no_check(out, expected) -> None:
    """read_floor providers are not implementations: their output is not the op's."""
