"""The read-floor providers (fused_llm_dev.bench.read_floor): every launch covers the buffer's
words exactly once, and the kernel suites that quote a floor carry the provider."""

from __future__ import annotations

import pytest
from fused_llm_dev.bench import read_floor, run


@pytest.mark.parametrize("n_words", [1, 1000, 2048, 8193, 2304 * 16384 // 2, 6144 * 4096 // 8 + 6144 * 32 // 2])
@pytest.mark.parametrize("candidate", read_floor._CANDIDATES)
def test_a_launch_covers_every_word_once(n_words, candidate):
    block, warps, per_sm = candidate
    launch = read_floor._launch(n_words, block, warps, 132 * per_sm)
    assert launch.per_program % block == 0 and launch.per_program > 0
    # every word in some program's range, and no program entirely past the end
    assert launch.programs * launch.per_program >= n_words > (launch.programs - 1) * launch.per_program
    assert launch.programs <= max(1, 132 * per_sm)


@pytest.mark.parametrize("package", ["skinny-gemm", "machete-w4a16"])
def test_the_suites_time_the_read_floor(package):
    for suite in run.load_suites(package):
        floor = {p.name: p for p in suite.providers}["read_floor"]
        assert floor.check is read_floor.no_check and floor.bytes_moved is not None
