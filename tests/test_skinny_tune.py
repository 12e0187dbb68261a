"""skinny-gemm's benchmarks without a GPU: tune.py's options and their checks, the sweep it
plans over every shape and M bucket, how its entries merge into the table and how the lookup
reads buckets a run left absent, the table it writes (read back); the suite's cases and its
torch.compile max-autotune peer's guard."""

from __future__ import annotations

import importlib.util
import sys
from importlib import import_module

import pytest
import torch

from fused_llm import packages
from fused_llm_dev.bench import run as bench_run
from fused_llm_dev.bench.suite import autotune_unavailable

sg = packages.get_kernel("skinny-gemm")
_path = packages.package_dir("skinny-gemm") / "benchmarks" / "tune.py"
_spec = importlib.util.spec_from_file_location("skinny_gemm_tune", _path)
tune = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("skinny_gemm_tune", tune)
_spec.loader.exec_module(tune)
# The issue's shapes [N, K]: Llama-405B TP8, Llama-3 8B, Llama-3 70B TP1; and its token counts.
ISSUE_SHAPES = {(2304, 16384), (13312, 16384), (16384, 6656), (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)}  # fmt: skip
ISSUE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
# The defaults (tune.py's sweep, the suites' cases): the issue's shapes and the 8B lm_head, the
# vocabulary projection kernelize also routes through the table.
DEFAULT_SHAPES = ISSUE_SHAPES | {(128256, 4096)}


def test_defaults_are_every_shape_and_bucket():
    args = tune.parse_args([])
    assert {tune.ref.SHAPES[s] for s in args.shapes} == DEFAULT_SHAPES and len(args.shapes) == len(DEFAULT_SHAPES)
    assert tuple(args.tokens) == tune.BUCKETS == ISSUE_TOKENS and args.dtypes == ["bfloat16", "fp8", "fp8-tensor"]
    assert not (args.quick or args.dry_run or args.no_write)
    assert tune.parse_args(["--tokens", "16,1,16"]).tokens == [1, 16]


@pytest.mark.parametrize(
    "argv, message",
    [(["--tokens", "3"], "--tokens: expected buckets"), (["--tokens", "1,x"], "comma-separated integers"),
     (["--shapes", "8B-nope"], "--shapes: expected names"), (["--dtypes", "float32"], "--dtypes"),
     (["--margin", "1.5"], "--margin")],
)  # fmt: skip
def test_bad_options_exit_with_the_reason(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        tune.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_dry_run_plans_every_point_without_a_gpu(quick):
    """Every shape x bucket x dtype is planned; each candidate list holds the default and only
    valid configurations (SkinnyConfig checks them), the GEMV at M = 1 only."""
    lines = []
    argv = ["--dry-run", "--sms", "132"] + (["--quick"] if quick else [])
    assert tune.dry_run(tune.parse_args(argv), sg, 132, lines.append) == 3 * len(DEFAULT_SHAPES) * len(ISSUE_TOKENS)
    assert lines[-1] == "252 points"
    for N, K in DEFAULT_SHAPES:
        for M in ISSUE_TOKENS:
            for elem in (1, 2):
                cands = tune.candidates(sg, M, N, K, elem, 132, quick)
                assert sg.skinny_config(M, N, K, elem, 132) in cands
                assert any(c.BLOCK_M == 1 for c in cands) == (M == 1)
                assert all(c.BLOCK_M == 1 or c.BLOCK_M >= M or c.BLOCK_M == 64 for c in cands)


def test_the_compiled_kernel_joins_the_sweep_at_16_tokens():
    """The compiled Hopper kernel's launch shapes (the build's tma_configs() on a capability 9.0
    GPU; --quick: those of QUICK_TMA) are candidates for 16-bit and FP8 inputs at M <= 16 where
    K is a multiple of 16 bytes, nowhere else, each at tma_split's K split and its neighbours
    that keep ~0.7-2.6 blocks an SM."""
    tma = [sg.TmaConfig(64, 2, 8), sg.TmaConfig(128, 2, 4), sg.TmaConfig(64, 2, 6)]
    # 2304 rows: 36 tiles of 64 (split 3: 2, 3, 4 -> 72 (too few), 108, 144 blocks), 18 of 128
    # (split 7: 6, 7, 8 -> 108-144); (64, 2, 6) is not a --quick shape
    quick = {sg.TmaConfig(64, 2, 8, s) for s in (3, 4)} | {sg.TmaConfig(128, 2, 4, s) for s in (6, 7, 8)}
    full = quick | {sg.TmaConfig(64, 2, 6, s) for s in (3, 4)}
    for M in ISSUE_TOKENS:
        for elem in (1, 2):
            for is_quick, expected in ((True, quick), (False, full)):
                cands = {c for c in tune.candidates(sg, M, 2304, 16384, elem, 132, is_quick, tma) if isinstance(c, sg.TmaConfig)}
                assert cands == (expected if M <= 16 else set()), (M, elem, is_quick)
    assert not any(isinstance(c, sg.TmaConfig) for c in tune.candidates(sg, 4, 100, 100, 2, 132, True, tma)), "K % 8"
    assert not any(isinstance(c, sg.TmaConfig) for c in tune.candidates(sg, 4, 100, 24, 1, 132, True, tma)), "FP8 K % 16"
    assert not any(isinstance(c, sg.TmaConfig) for c in tune.candidates(sg, 4, 2304, 16384, 2, 132, True))


def test_the_gemv_joins_the_sweep_where_k_is_whole_steps():
    """The compiled tensor-core GEMV's launches (the build's mma_configs()) are candidates at M <=
    16 for 16-bit and FP8 inputs, each where K is a whole number of its steps (64 bytes x unroll:
    32 / 64 columns a chunk), nowhere else."""
    mma = [sg.MmaConfig(1, 1, 8), sg.MmaConfig(1, 2, 8), sg.MmaConfig(2, 4, 4), sg.MmaConfig(1, 4, 4, stages=2, split=2)]
    for M in ISSUE_TOKENS:
        for elem in (1, 2):
            cands = {c for c in tune.candidates(sg, M, 2304, 16384, elem, 132, True, mma=mma) if isinstance(c, sg.MmaConfig)}
            assert cands == (set(mma) if M <= 16 else set()), (M, elem)
    # K = 192: 6 chunks of 16-bit (steps of 1 and 2 divide it, not 4); 3 of e4m3 (only 1)
    got = {c for c in tune.candidates(sg, 4, 100, 192, 2, 132, True, mma=mma) if isinstance(c, sg.MmaConfig)}
    assert got == {sg.MmaConfig(1, 1, 8), sg.MmaConfig(1, 2, 8)}
    got = {c for c in tune.candidates(sg, 4, 100, 192, 1, 132, True, mma=mma) if isinstance(c, sg.MmaConfig)}
    assert got == {sg.MmaConfig(1, 1, 8)}


def test_row_run_launches_join_the_sweep_up_to_their_tokens():
    """A row-run launch (MmaConfig segments) is a candidate only where M fits its two token tiles
    (32 / segments tokens) and K is a whole number of its steps (segments x 64 bytes x unroll);
    --rows-only plans those launches and the bucket's current table entry, nothing else."""
    rows = [sg.MmaConfig(4, 2, 8, segments=8), sg.MmaConfig(1, 2, 8, segments=4), sg.MmaConfig(1, 2, 8, segments=2)]
    for M, want in ((1, rows), (4, rows), (5, rows[1:]), (8, rows[1:]), (9, rows[2:]), (16, rows[2:]), (32, [])):
        cands = {c for c in tune.candidates(sg, M, 2304, 16384, 2, 132, True, mma=rows) if isinstance(c, sg.MmaConfig)}
        assert cands == set(want), M
    # K = 768: 24 chunks of 16-bit: steps of 8 x 2 (16 chunks) do not divide it, 4 x 2 and 2 x 2 do
    got = {c for c in tune.candidates(sg, 2, 100, 768, 2, 132, True, mma=rows) if isinstance(c, sg.MmaConfig)}
    assert got == set(rows[1:])
    entry = [-1, 1, 4, 4, 2, 1]
    assert tune.rows_only_candidates(sg, rows + [sg.MmaConfig()], entry, 8, 16384, 2) == [*rows[1:], sg.MmaConfig(1, 4, 4, 2)]
    assert tune.rows_only_candidates(sg, rows, None, 2, 16384, 1) == rows
    assert tune.parse_args(["--rows-only"]).rows_only and not tune.parse_args([]).rows_only


def test_wgmma_launches_and_wgmma_only():
    """A wgmma launch (MmaConfig wgmma) takes 1-16 tokens and K in whole steps of segments x unroll
    128-byte chunks; --rows-only leaves it out, --wgmma-only plans it and the bucket's entry."""
    wg = [sg.MmaConfig(1, 1, 8, 4, 3, segments=2, wgmma=True), sg.MmaConfig(1, 2, 4, 3, 2, segments=2, wgmma=True)]
    rows = [sg.MmaConfig(1, 2, 8, segments=2)]
    for M in (1, 9, 16):
        cands = {c for c in tune.candidates(sg, M, 2304, 16384, 2, 132, True, mma=wg) if isinstance(c, sg.MmaConfig)}
        assert cands == set(wg), M
    # K = 384 16-bit columns: 768 bytes, 3 steps of the first (256 bytes), not whole steps of the second (512)
    got = {c for c in tune.candidates(sg, 16, 100, 384, 2, 132, True, mma=wg) if isinstance(c, sg.MmaConfig)}
    assert got == {wg[0]}
    assert tune.rows_only_candidates(sg, wg + rows, None, 16, 16384, 2) == rows
    assert tune.rows_only_candidates(sg, wg + rows, [-1, 1, 2, 8], 16, 16384, 2, wgmma=True) == [*wg, sg.MmaConfig()]
    assert tune.parse_args(["--wgmma-only"]).wgmma_only and not tune.parse_args([]).wgmma_only


def test_a_table_from_a_run_cut_short(tmp_path, monkeypatch):
    """--from-log writes the points a run printed (its first line the command), merged into the
    table as the run would have: a skinny pick as its configuration, a cuBLAS one as None."""
    target = tmp_path / "_tuning.py"
    target.write_text(tune.TABLE_PATH.read_text())
    monkeypatch.setattr(tune, "TABLE_PATH", target)
    log = tmp_path / "tune.log"
    log.write_text("\n".join([
        "# python skinny-gemm/benchmarks/tune.py --quick --tokens 1,4  # GPU X",
        "GPU X float8_e4m3fn/tensor 8B-o M=1: cuBLAS 9.0 us, best skinny 8.1 us (1.111x) [0, 64, 4, 3, 2] -> skinny",
        "  [16, 32, 256, 2, 4, 4]: wrong result (max |error| 1), skipped",
        "GPU X float8_e4m3fn/tensor 8B-o M=4: cuBLAS 8.9 us, best skinny 9.5 us (0.941x) [0, 64, 4, 3, 2] -> cuBLAS",
    ]))  # fmt: skip
    assert tune.main(["--from-log", str(log)]) == 0
    spec = importlib.util.spec_from_file_location("from_log_skinny_tuning", target)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    assert written.TABLE[("GPU X", "float8_e4m3fn/tensor", 4096, 4096)] == [(1, [0, 64, 4, 3, 2]), (4, None)]
    assert written.MADE_BY.endswith("--quick --tokens 1,4  # GPU X (2 points, written from its log)")


def test_merged_buckets_and_the_lookup_of_absent_ones(monkeypatch):
    """A run's buckets replace or join the key's earlier ones; dispatch takes the first bucket >=
    M that is present (an absent bucket falls to the next larger one), cuBLAS above the last."""
    a, b, c = [16, 64, 256, 4, 4, 4], [64, 32, 256, 8, 4, 4], [16, 32, 256, 2, 4, 4]
    rows = tune.merge([(1, None), (4, a), (16, None), (64, b)], {2: c, 16: a, 32: None})
    assert rows == [(1, None), (2, c), (4, a), (16, a), (32, None), (64, b)]
    key = ("cpu", "bfloat16", 64, 32)
    monkeypatch.setattr(import_module(sg.__name__ + "._tuning"), "TABLE", {key: rows})
    w = torch.zeros(64, 32, dtype=torch.bfloat16)
    expected = {1: None, 2: c, 3: a, 4: a, 5: a, 16: a, 17: None, 32: None, 33: b, 64: b, 65: None}
    for M, cfg in expected.items():
        got = sg.dispatch_config(torch.zeros(M, 32, dtype=torch.bfloat16), w)
        assert got == (sg.SkinnyConfig(*cfg) if cfg else None), M


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_measuring_needs_a_gpu():
    with pytest.raises(SystemExit, match="none is visible"):
        tune.main(["--quick", "--shapes", "8B-o", "--tokens", "1"])


def test_written_table_reads_back(tmp_path, monkeypatch):
    """write_table keeps _tuning.py's docstring and writes the table and command back."""
    target = tmp_path / "_tuning.py"
    target.write_text(tune.TABLE_PATH.read_text())
    monkeypatch.setattr(tune, "TABLE_PATH", target)
    table = {("NVIDIA H100 80GB HBM3", "bfloat16", 6144, 4096): [(1, None), (2, [16, 32, 128, 2, 4, 4])]}
    tune.write_table(table, "python skinny-gemm/benchmarks/tune.py --tokens 2  # NVIDIA H100 80GB HBM3")
    spec = importlib.util.spec_from_file_location("written_skinny_tuning", target)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    assert written.TABLE == table and written.MADE_BY.endswith("# NVIDIA H100 80GB HBM3")
    assert written.__doc__ == import_module(sg.__name__ + "._tuning").__doc__


def test_suite_cases_and_the_autotune_peer():
    """Every suite times the issue's 11 shapes and the 8B lm_head at its 7 token counts against cuBLAS, torch.compile
    max-autotune and the read floor; the compile peer says why it cannot run here (no GPU)."""
    for suite in bench_run.load_suites("skinny-gemm"):
        shapes = {tune.ref.SHAPES[name] for name in tune.ref.SHAPES}
        assert {c["tokens"] for c in suite.cases} == set(ISSUE_TOKENS) and len(suite.cases) == len(shapes) * 7
        assert shapes == DEFAULT_SHAPES
        providers = {p.name: p for p in suite.providers}
        assert {"ours", "cublas", "torch_compile", "read_floor"} <= set(providers)
        if not torch.cuda.is_available():
            assert providers["torch_compile"].unavailable() == autotune_unavailable() == "torch.compile max-autotune: no GPU visible"


def test_a_run_reads_the_table_file_not_the_imported_copy(tmp_path, monkeypatch):
    """tune.py merges into the table file on disk (fused_llm_dev.bench.tuning.read_table): a
    second run before a rebuild, whose imported module still held the old table, dropped the
    first run's entries (H200, 2026-11-28)."""
    from fused_llm_dev.bench.tuning import read_table

    target = tmp_path / "_tuning.py"
    target.write_text(tune.TABLE_PATH.read_text())
    monkeypatch.setattr(tune, "TABLE_PATH", target)
    tune.write_table({("GPU Y", "bfloat16", 8, 16): [(1, None)]}, "first run")
    assert read_table(target) == ("first run", {("GPU Y", "bfloat16", 8, 16): [(1, None)]})
    log = tmp_path / "run.log"
    log.write_text("# python skinny-gemm/benchmarks/tune.py --tokens 4  # GPU Y\n"
                   "GPU Y bfloat16 8B-o M=4: cuBLAS 2.0 us, best skinny 1.0 us (2.000x) [0, 64, 4, 4, 2] -> skinny\n")  # fmt: skip
    tune.from_log(str(log))
    made_by, table = read_table(target)
    assert table == {("GPU Y", "bfloat16", 8, 16): [(1, None)], ("GPU Y", "bfloat16", 4096, 4096): [(4, [0, 64, 4, 4, 2])]}
    assert made_by.startswith("first run; python skinny-gemm/benchmarks/tune.py --tokens 4")
