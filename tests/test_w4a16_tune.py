"""machete-w4a16/benchmarks/tune.py without a GPU: its options and their checks, the sweep it
plans (every candidate a valid table entry, the default first), ``--dry-run``'s listing and
estimate, the message without a GPU, and the table it writes (read back and checked)."""

from __future__ import annotations

import importlib.util
import sys
from importlib import import_module

import pytest
import torch

from fused_llm import packages

w4 = packages.get_kernel("machete-w4a16")
cfg_mod = import_module(w4.__name__ + "._config")
_path = packages.package_dir("machete-w4a16") / "benchmarks" / "tune.py"
_spec = importlib.util.spec_from_file_location("machete_w4a16_tune", _path)
tune = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("machete_w4a16_tune", tune)
_spec.loader.exec_module(tune)
SHAPES = tune._ref().SHAPES


def test_defaults_are_every_shape_and_bucket():
    args = tune.parse_args([])
    assert args.shapes == list(SHAPES) and args.tokens == list(cfg_mod.BUCKETS)
    assert args.dtypes == ["bfloat16"] and args.group_size == 128 and not (args.quick or args.dry_run or args.no_write)
    assert tune.parse_args(["--tokens", "16,1,16", "--shapes", "8B-o", "--dtypes", "float16,bfloat16"]).tokens == [1, 16]


@pytest.mark.parametrize(
    "argv, message",
    [(["--tokens", "3"], "--tokens: expected buckets"), (["--tokens", "1,x"], "comma-separated integers"),
     (["--shapes", "8B-nope"], "--shapes: expected names"), (["--dtypes", "float32"], "--dtypes"),
     (["--group-size", "48"], "--group-size"), (["--group-size", "8"], "--group-size"),
     (["--group-size", "-1"], "--group-size"),
     (["--margin", "1.5"], "--margin")],
)  # fmt: skip
def test_bad_options_exit_with_the_reason(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        tune.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_candidate_is_a_valid_entry(quick):
    """For every shape and bucket, with and without the compiled kernel: the default is
    mma_config's choice where that kernel runs (M <= 32) and w4a16_config's elsewhere, the
    candidates are valid table entries, distinct from it and from each other, splits within the
    K steps, tiled tiles within the shared-memory bound; phase 2's neighbours too."""
    kern = w4._triton_kernels()
    for N, K in SHAPES.values():
        for M, mma in ((M, mma) for M in cfg_mod.BUCKETS for mma in (False, True)):
            default, cands = tune.phase1(kern, M, N, K, 128, 132, quick, mma)
            expected = kern.mma_config(M, N, K, 132) if mma and M <= 32 else kern.w4a16_config(M, N, K, 128, 132)
            assert default == cfg_mod.entry_of(expected)
            if M < 32:  # the compiled kernel's launches replace the Triton split-K kernel's
                assert all(e[0] == "mma" for e in cands) == mma
            keys = [tuple(e) for e in [default, *cands]]
            assert len(set(keys)) == len(keys), (M, N, K)
            assert quick or cands, f"no candidate at M={M}, N={N}, K={K}"
            for entry in cands + [n for e in cands for n in tune.neighbours(e, 128)]:
                cfg_mod.check_entry(entry)
                if entry[0] == "splitk":
                    assert entry[4] <= -(-K // entry[3]) and (entry[1] == 1) == (M == 1)
                elif entry[0] == "mma":
                    assert entry[1] <= K // 128 and tune.neighbours(entry, 128) == []
                else:
                    assert tune._smem(entry) <= tune.SMEM_BOUND


def test_dry_run_lists_the_sweep_without_a_gpu(capsys):
    assert tune.main(["--dry-run", "--shapes", "8B-qkv,70B-down", "--tokens", "1,64,4096", "--sms", "132"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and lines[0].startswith("bfloat16 8B-qkv [N=6144, K=4096] M=1: default ['mma', 1,")
    assert lines[-1].startswith("6 points, ") and "min (assuming" in lines[-1] and "phase 2" in lines[-1]


def test_full_sweep_estimate_fits_the_budget():
    """The plan's own estimate for every shape and bucket of one dtype (pessimistic per-compile
    and per-timing costs, not measured) leaves room for phase 2 within 8 minutes."""
    args = tune.parse_args(["--dry-run"])
    counts = tune.dry_run(args, w4._triton_kernels(), 132, out=lambda *_: None)
    assert counts["points"] == len(SHAPES) * len(cfg_mod.BUCKETS)
    assert counts["estimate_s"] < 7 * 60, counts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_measuring_needs_a_gpu():
    with pytest.raises(SystemExit, match="none is visible"):
        tune.main(["--quick", "--shapes", "8B-o", "--tokens", "1"])


def test_written_table_reads_back(tmp_path, monkeypatch):
    """write_table keeps _tuning.py's docstring, records the command and writes a table that
    check_table accepts and the lookup finds."""
    target = tmp_path / "_tuning.py"
    target.write_text(tune.TABLE_PATH.read_text())
    monkeypatch.setattr(tune, "TABLE_PATH", target)
    entry = ["splitk", 16, 64, 128, 4, 4, 3]
    table = {("NVIDIA H100 80GB HBM3", "bfloat16", 6144, 4096, 128): [(1, None), (16, entry)]}
    tune.write_table(table, "python machete-w4a16/benchmarks/tune.py --quick  # NVIDIA H100 80GB HBM3")
    spec = importlib.util.spec_from_file_location("written_tuning", target)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    assert written.TABLE == table and written.MADE_BY.endswith("# NVIDIA H100 80GB HBM3")
    assert written.__doc__ == import_module(w4.__name__ + "._tuning").__doc__
    cfg_mod.check_table(written.TABLE)
    assert cfg_mod.tuned_config(written.TABLE, "NVIDIA H100 80GB HBM3", "bfloat16", 6144, 4096, 128, 9) == cfg_mod.config_of(entry)
