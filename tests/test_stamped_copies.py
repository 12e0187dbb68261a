"""Shared Python helpers have one source in common/python/; each package ships a stamped copy
(a package builds and loads alone). A copy that differs from its source fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIES = {
    "triton_launch.py": ["rope-triton/torch-ext/rope_triton/_triton_launch.py", "gated-mlp/torch-ext/gated_mlp/_triton_launch.py",
                         "machete-w4a16/torch-ext/machete_w4a16/_triton_launch.py"],
    "light_ops.py": ["rope-triton/torch-ext/rope_triton/_light_ops.py", "gated-mlp/torch-ext/gated_mlp/_light_ops.py",
                     "machete-w4a16/torch-ext/machete_w4a16/_light_ops.py"],
}


@pytest.mark.parametrize("source, copy", [(s, c) for s, cs in COPIES.items() for c in cs])
def test_stamped_copy_matches_its_source(source, copy):
    header = f"# generated from common/python/{source} by `fused-llm sync`, do not edit\n"
    expected = header + (ROOT / "common" / "python" / source).read_text()
    assert (ROOT / copy).read_text() == expected, f"{copy} differs from common/python/{source}: re-stamp it"
