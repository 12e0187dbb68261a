"""The results of a run (``Result``, ``Run``), the metadata recorded with them (GPU, date,
versions, commit, method) and what is written of them: JSON, CSV, a PNG and a table."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .suite import Suite
from .timing import METHOD


@dataclass
class Result:
    case: str
    params: dict[str, int]
    provider: str
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    calls_per_graph: int = 0
    samples: int = 0
    bytes: int | None = None
    gbps: float | None = None
    pct_of_ceiling: float | None = None
    flops: int | None = None
    tflops: float | None = None
    ours_speedup: float | None = None  # this provider's time / ours (ours on its own row: 1.0)
    error: str | None = None


@dataclass
class Run:
    suite: Suite
    providers: list[str]  # timed, in order
    results: list[Result]
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> why
    metadata: dict[str, Any] = field(default_factory=dict)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def collect_metadata(suite: Suite, ceiling_gbps: float, root: Path | None, extra: dict[str, Any]) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    dirty = _command(["git", "status", "--porcelain"], root) if root else None
    commit = _command(["git", "rev-parse", "--short", "HEAD"], root) if root else None
    return {
        "suite": suite.name,
        "description": suite.description,
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "memory_bytes": props.total_memory,
        "driver": _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton_version,
            "liger_kernel": _version("liger-kernel"),
            "kernels": _version("kernels"),
            "transformers": _version("transformers"),
        },
        # The GPU machine gets a copy of the working tree whose .git (if any) may be stale: the
        # caller's FUSED_LLM_GIT_COMMIT wins.
        "git": os.environ.get("FUSED_LLM_GIT_COMMIT") or ((commit + ("-dirty" if dirty else "")) if commit else None),
        "copy_ceiling_gbps": ceiling_gbps,
        "method": METHOD,
        **extra,
    }


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'NVIDIA-H200' (safe in file names)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "unknown-GPU"


def output_stem(run: Run) -> str:
    quick = "_quick" if run.metadata.get("quick") else ""
    subset = run.metadata.get("file_suffix", "")
    return f"{run.suite.name}{quick}{subset}_{gpu_slug(str(run.metadata.get('gpu', '')))}"


def write_json(run: Run, path: Path) -> None:
    payload = {
        "metadata": run.metadata,
        "providers": run.providers,
        "skipped": run.skipped,
        "results": [asdict(r) for r in run.results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


CSV_FIELDS = [
    "provider", "median_us", "p20_us", "p80_us", "calls_per_graph", "samples", "bytes", "gbps",
    "pct_of_ceiling", "flops", "tflops", "ours_speedup", "error",
]  # fmt: skip


def write_csv(run: Run, path: Path) -> None:
    params = list(run.results[0].params) if run.results else []
    gpu, date = run.metadata.get("gpu"), run.metadata.get("date")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["suite", "case", *params, *CSV_FIELDS, "gpu", "date"])
        for r in run.results:
            row = asdict(r)
            writer.writerow(
                [run.suite.name, r.case, *(r.params.get(k) for k in params), *(row[k] for k in CSV_FIELDS), gpu, date]
            )


def write_plot(run: Run, path: Path) -> None:
    """Top row: % of the copy ceiling (TFLOP/s when the suite counts flops); bottom row: us per
    call, which is what matters at decode sizes. x = ``x_param``, one column per
    ``group_param`` value, one line per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suite = run.suite
    top, top_label = ("tflops", "TFLOP/s") if suite.flops else ("pct_of_ceiling", "% of copy ceiling")
    gp = suite.group_param
    groups = sorted({r.params.get(gp) for r in run.results} if gp else {None}, key=lambda g: (g is None, g or 0))
    fig, axes = plt.subplots(2, len(groups), figsize=(5.5 * len(groups), 7.5), squeeze=False, sharex="col")
    for col, group in enumerate(groups):
        for metric, ax in ((top, axes[0][col]), ("median_us", axes[1][col])):
            for provider in run.providers:
                points = sorted(
                    (r.params[suite.x_param], getattr(r, metric))
                    for r in run.results
                    if r.provider == provider
                    and getattr(r, metric) is not None
                    and (gp is None or r.params.get(gp) == group)
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    width = 2.5 if provider == suite.ours else 1.3
                    ax.plot(xs, ys, marker="o", markersize=3, linewidth=width, label=provider)
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        if top == "pct_of_ceiling":
            axes[0][col].axhline(100.0, color="gray", linestyle="--", linewidth=0.8)
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel(suite.x_param)
        axes[0][col].set_title(f"{gp} = {group}" if gp else suite.name)
    axes[0][0].set_ylabel(top_label)
    axes[1][0].set_ylabel("us per call (median)")
    axes[0][0].legend(loc="best", fontsize=8)
    md = run.metadata
    fig.suptitle(
        f"{suite.name} on {md.get('gpu')} (copy ceiling {md.get('copy_ceiling_gbps', 0):.0f} GB/s, "
        f"torch {md.get('versions', {}).get('torch')}, {str(md.get('date', ''))[:10]})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(run: Run, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(run)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv", out_dir / f"{stem}.png"]
    write_json(run, paths[0])
    write_csv(run, paths[1])
    write_plot(run, paths[2])
    return paths


def _cell(r: Result | None) -> str:
    if r is None:
        return ""
    if r.error is not None or r.median_us is None:
        return "[red]error[/]"
    if r.tflops is not None:
        return f"{r.median_us:.2f} ({r.tflops:.0f} TF)"
    if r.pct_of_ceiling is not None:
        pct = r.pct_of_ceiling
        return f"{r.median_us:.2f} ({pct:.0f}%)" if pct >= 10 else f"{r.median_us:.2f} ({pct:.1f}%)"
    return f"{r.median_us:.2f}"


def render_table(run: Run) -> Any:
    """One row per case: us per call and % of ceiling per provider, then ours' speedups."""
    from rich import box
    from rich.table import Table

    suite, md = run.suite, run.metadata
    index = {(r.case, r.provider): r for r in run.results}
    cases = list(dict.fromkeys(r.case for r in run.results))
    params = list(run.results[0].params) if run.results else []
    peers = [p for p in run.providers if p != suite.ours] if suite.ours in run.providers else []
    unit = "TFLOP/s" if suite.flops else f"% of the {md.get('copy_ceiling_gbps', 0):.0f} GB/s copy ceiling"
    table = Table(
        title=f"{suite.name} on {md.get('gpu')}: median us per call ({unit})",
        caption=f"vs X = X's time / {suite.ours}' time (>1: {suite.ours} faster)" if peers else None,
        box=box.SIMPLE_HEAD,
    )
    for p in params:
        table.add_column(p, justify="right")
    for p in run.providers:
        table.add_column(p, justify="right", style="bold" if p == suite.ours else None)
    for p in peers:
        table.add_column(f"vs {p}", justify="right")
    for case in cases:
        first = next(r for r in run.results if r.case == case)
        speedups = []
        for p in peers:
            r = index.get((case, p))
            speedups.append(f"{r.ours_speedup:.2f}x" if r and r.ours_speedup else "")
        table.add_row(
            *(str(first.params[k]) for k in params),
            *(_cell(index.get((case, p))) for p in run.providers),
            *speedups,
        )
    return table
