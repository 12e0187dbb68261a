"""fused_llm.packages: which build a project-side ``get_kernel`` loads (CPU only, no build run)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fused_llm import packages


def test_the_checkout_build_is_added_when_no_entry_names_the_package(monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", "fused-llm/other=/somewhere")
    path = packages.use_local_build("skinny-gemm")
    assert path == packages.package_dir("skinny-gemm")
    assert f"fused-llm/skinny-gemm={path}" in os.environ["LOCAL_KERNELS"].split(":")
    assert "fused-llm/other=/somewhere" in os.environ["LOCAL_KERNELS"].split(":")


def test_an_entry_the_caller_set_is_kept(monkeypatch, tmp_path: Path):
    """An A/B of two builds points LOCAL_KERNELS at one of them; the benches must load that one."""
    (tmp_path / "build").mkdir()
    monkeypatch.setenv("LOCAL_KERNELS", f"fused-llm/skinny-gemm={tmp_path}")
    assert packages.use_local_build("skinny-gemm") == tmp_path
    assert os.environ["LOCAL_KERNELS"] == f"fused-llm/skinny-gemm={tmp_path}"


def test_an_entry_without_a_build_is_named(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("LOCAL_KERNELS", f"fused-llm/skinny-gemm={tmp_path}")
    expected = f"LOCAL_KERNELS names {tmp_path} for fused-llm/skinny-gemm, which has no build/"
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        packages.use_local_build("skinny-gemm")
