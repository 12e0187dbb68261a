"""CI's compile check of the Triton kernels for gfx942, sm80 and sm90 (`fused_llm_dev.compile_targets`,
``fused-llm check-targets``): one run in a child process, then a test per kernel and target.

A child process because the package conftests set TRITON_INTERPRET=1 in this one on a machine
without a GPU, and every compile needs Triton's real JIT; the check compiles in a fresh Triton
cache, so each run really compiles: 165 specializations (2026-11-24), ~150-210 s of CPU time (machete-w4a16's 24
added 26 s, skinny-gemm's 27 19 s, its 35 of 2026-11-24 16 s alone; 180-270 s on a 2-core
machine shared with other jobs)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from fused_llm import packages
from fused_llm_dev import compile_targets as ct

def _triton_version() -> tuple[int, ...]:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2])


# The check drives Triton 3.9's binder and packer (CI's pin); the GPU image's Triton 3.6 lacks
# knobs it reads (compilation.fpsan_homomorphic_casts).
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is not None and _triton_version() < (3, 9),
                       reason="the check uses Triton >= 3.9's compiler internals (CI's pin)"),
]

ROOT = packages.repo_root()
KERNELS = [(s.package, k) for s in ct.kernel_sources() for k in s.kernels]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("check-targets") / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "torch-ext"), str(ROOT / "tools"), env.get("PYTHONPATH")]))
    env["FUSED_LLM_ROOT"] = str(ROOT)
    cmd = [sys.executable, "-m", "fused_llm_dev.compile_targets", "--json", str(out), "--verbose"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    if proc.returncode == 2 or not out.is_file():
        pytest.fail(f"`{' '.join(cmd)}` could not run the check (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    data = json.loads(out.read_text())
    data["returncode"], data["log"] = proc.returncode, proc.stderr
    return data


def test_entry_kernels_found():
    """The kernels this checkout has (a new one shows up here by itself, and its check fails
    until compile_targets has a scenario that launches it on every target)."""
    names = {f"{p}:{k}" for p, k in KERNELS}
    assert {"rope-triton:_rope_kernel", "gated-mlp:_gated_mlp_kernel", "machete-w4a16:_w4a16_splitk_kernel",
            "machete-w4a16:_w4a16_tiled_kernel", "skinny-gemm:_skinny_gemm_kernel"} <= names, names
    assert not any(k in ("_rope_heads", "_cos_sin", "_epilogue", "_dot", "_dequant", "_load_step") for _, k in KERNELS), "a helper taken for a kernel"


@pytest.mark.parametrize("target", list(ct.DEVICES))
@pytest.mark.parametrize(("package", "kernel"), KERNELS, ids=[f"{p}:{k}" for p, k in KERNELS])
def test_kernel_compiles_for_target(report, package, kernel, target):
    """Every specialization the launchers launch on ``target`` compiled to an ELF hsaco / cubin
    holding the kernel's symbol, for that target, within its shared memory; or fails exactly as
    a KNOWN_ISSUES entry says (and a listed issue that no longer happens fails the test)."""
    mine = [r for r in report["results"] if (r["package"], r["kernel"], r["target"]) == (package, kernel, target)]
    assert mine, f"{package} {kernel}: nothing compiled for {target}"
    bad = [r for r in mine if (r["status"] != "ok") != bool(r["known"])]
    assert not bad, "\n\n".join(
        f"{r['status']} ({r['config']})\n  launched by: {'; '.join(r['labels'])}\n  {r['error'] or r['known']}" for r in bad
    )
    for r in mine:
        if r["status"] == "ok":
            assert r["binary_bytes"] > 0 and r["shared"] <= ct.DEVICES[target].max_shared, r


def test_the_check_passes(report):
    assert report["returncode"] == 0, report["log"][-6000:]
    assert report["jobs"] == len(report["results"])


# ---------------------------------------------------------------------------------------------
# The check's own machinery, on a small module of its own (no compile: milliseconds)
# ---------------------------------------------------------------------------------------------

_MODULE = '''
import triton
import triton.language as tl


@triton.jit
def _helper(x):
    return x * 2


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, DOUBLE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if DOUBLE:
        x = _helper(x)
    tl.store(out_ptr + offs, x, mask=offs < n)


def launch(x, out, double, extra=None):
    kwargs = dict(BLOCK=128, DOUBLE=double, num_warps=4)
    if extra:
        kwargs.update(extra)
    _scale_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), **kwargs)
'''


@pytest.fixture
def small_module(tmp_path):
    path = tmp_path / "smallpkg" / "_kernels.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(_MODULE))
    return path, ct.load_module(path)


def test_entry_kernels_skip_helpers(small_module):
    path, _ = small_module
    assert ct.entry_kernels(path) == ["_scale_kernel"]


def test_launch_recorded_and_specialized(small_module):
    import torch
    from triton.compiler.compiler import make_backend

    _, mod = small_module
    x = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    with ct.record_launches(mod) as launches:
        mod.launch(x, x, True)
    assert "run" not in vars(mod._scale_kernel)  # the class's run is back
    (launch,) = launches
    backend = make_backend(ct.DEVICES["gfx942"].target())
    ct._check_params(mod._scale_kernel, launch, backend, "test")
    signature, constexprs, attrs, options = ct._specialize(mod._scale_kernel, launch, backend)
    assert signature == {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr", "DOUBLE": "constexpr"}
    assert constexprs[(3,)] == 128 and constexprs[(4,)] is True and options["num_warps"] == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"BLOCK": None, "DOUBLE": None}, "parameters not passed: ['BLOCK', 'DOUBLE']"),
     ({"HALVE": True}, "arguments the kernel does not take (nor the backend as options): ['HALVE']")],
    ids=["missing", "unknown"],
)  # fmt: skip
def test_a_launch_that_does_not_match_the_kernel_names_both(small_module, extra, message):
    import torch
    from triton.compiler.compiler import make_backend

    _, mod = small_module
    x = torch.empty(1024, dtype=torch.float16, device="meta")
    with ct.record_launches(mod) as launches:
        mod.launch(x, x, False, extra)
    launch = launches[0]
    launch.kwargs = {k: v for k, v in launch.kwargs.items() if v is not None}  # None: drop the argument
    with pytest.raises(ct.CheckError, match="does not match the kernel's parameters") as err:
        ct._check_params(mod._scale_kernel, launch, make_backend(ct.DEVICES["sm90"].target()), "small _scale_kernel")
    assert message in str(err.value) and "['x_ptr', 'out_ptr', 'n', 'BLOCK', 'DOUBLE']" in str(err.value)
