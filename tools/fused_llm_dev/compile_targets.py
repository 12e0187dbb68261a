"""Compile every Triton entry kernel of the Triton packages for the GPUs they ship for, on a
machine without a GPU: gfx942 (MI300X), sm80 (A100) and sm90 (H100 / H200).

CI has no GPU, so without this the only Triton code it exercises is the interpreter's (which
has no register allocation, no shared memory, no MFMA / wgmma lowering and no libdevice).
Triton compiles ahead of time for a named ``GPUTarget`` without a driver, with nothing but its
wheel: PTX -> cubin with the ptxas it ships (Triton 3.9: CUDA 12.9's for sm80, its
``ptxas-blackwell``, CUDA 13.4's, from sm90 on; no nvcc), AMDGCN -> hsaco in process (its LLVM
and lld, and the ocml / ockl bitcode it ships for libdevice calls).

What is compiled is what the launchers would launch on each target, found by running them:

1. Every module of a package's ``torch-ext/<py>/`` that defines ``@triton.jit`` functions is
   read with ``ast``; its entry kernels are the jit functions no other jit function calls
   (the ones launched with a grid). A new kernel shows up here by itself and fails the check
   until a scenario below launches it on every target.
2. The module is imported from source (``TRITON_INTERPRET`` unset, so the decorators build
   real ``JITFunction`` objects) and each scenario calls the package's own launcher (e.g.
   ``launch_gated_mlp``) on meta tensors of Llama-3 shapes, with the configuration the
   package's config function picks for that target's SM count and TMA support. The kernels'
   ``run`` is replaced for the call, so nothing launches: the grid, arguments, constexprs,
   ``num_warps`` and ``num_stages`` are recorded.
3. Each recorded launch is matched against the kernel's own parameter list (``params``: a
   parameter the launcher does not pass, or an argument the kernel does not take, is an error
   naming both), then specialized by Triton's own binder for the target's backend (the
   signature types, e.g. ``*bf16`` / ``tensordesc<bf16[64, 64]>``, and the divisibility and
   32-bit range attributes a real launch would compute), deduplicated, and compiled with
   ``triton.compile`` in worker processes.
4. Each artifact is checked: an ELF hsaco / cubin holding the kernel's symbol, the assembly for
   the right target (``.amdgcn_target ...gfx942``, ``.target sm_80`` / ``sm_90a``), and the
   shared memory it needs within what the GPU grants one block (a kernel over it compiles but
   its launch raises OutOfResources).

``KNOWN_ISSUES`` lists the failures found so far, with their reasons: they are reported, not
fixed here (the kernels and their launchers belong to the packages). A listed failure that no
longer happens is reported too, so the list cannot go stale.

``fused-llm check-targets`` runs it; ``tests/test_compile_targets.py`` runs it in CI.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import re
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fused_llm import packages

# ---------------------------------------------------------------------------------------------
# Targets: what a launcher reads from the device, and what a launch is allowed to use
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """One GPU the packages ship for. ``sms``: what the launchers read from
    ``multi_processor_count`` (split-K and persistent grids depend on it); ``max_shared``: the
    most shared memory (LDS) one block may use, the limit Triton checks at launch; ``tma``:
    whether the launchers take the TMA path (CUDA sm90 only: ``_use_tma`` / ``_tma_capable``);
    ``fp8``: the package's FP8 format there."""

    name: str
    backend: str
    arch: int | str
    warp_size: int
    sms: int
    max_shared: int
    tma: bool
    fp8: str

    def target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


DEVICES: dict[str, Device] = {
    # MI300X: 304 CUs, 64 KiB of LDS per workgroup; FP8 is e4m3fnuz (max 240) on ROCm.
    "gfx942": Device("gfx942", "hip", "gfx942", 64, sms=304, max_shared=65536, tma=False, fp8="float8_e4m3fnuz"),
    # A100: 108 SMs, 163 KiB of shared memory per block (opt-in maximum).
    "sm80": Device("sm80", "cuda", 80, 32, sms=108, max_shared=166912, tma=False, fp8="float8_e4m3fn"),
    # H100 SXM: 132 SMs (the H200 too), 227 KiB per block.
    "sm90": Device("sm90", "cuda", 90, 32, sms=132, max_shared=232448, tma=True, fp8="float8_e4m3fn"),
}


# ---------------------------------------------------------------------------------------------
# Finding the kernels (ast only: no import of torch or triton needed)
# ---------------------------------------------------------------------------------------------


def _is_jit_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Attribute) and target.attr == "jit") or (isinstance(target, ast.Name) and target.id == "jit")


def entry_kernels(path: Path) -> list[str]:
    """The ``@triton.jit`` functions of a module that no other jit function of it calls: the
    kernels its launchers start with a grid (helpers are inlined into them)."""
    tree = ast.parse(path.read_text(), str(path))
    jitted = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and any(map(_is_jit_decorator, n.decorator_list))}
    called = set()
    for name, fn in jitted.items():
        called |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in jitted and n.id != name}
    return [name for name in jitted if name not in called]


@dataclass(frozen=True)
class KernelSource:
    package: str  # "gated-mlp"
    path: Path  # .../gated-mlp/torch-ext/gated_mlp/_kernels.py
    kernels: tuple[str, ...]  # its entry kernels

    @property
    def module(self) -> str:
        return f"{self.path.parent.name}.{self.path.stem}"


def kernel_sources(names: list[str] | None = None) -> list[KernelSource]:
    """Every module with Triton kernels in the kernel packages (``names``: only those)."""
    found = []
    for name in names or packages.kernel_packages():
        py_dir = packages.package_dir(name) / "torch-ext" / name.replace("-", "_")
        for path in sorted(py_dir.glob("*.py")):
            text = path.read_text()
            if "triton.jit" in text or "@jit" in text:
                kernels = entry_kernels(path)
                if kernels:
                    found.append(KernelSource(name, path, tuple(kernels)))
    return found


# ---------------------------------------------------------------------------------------------
# Importing a kernel module from source, with the real JIT
# ---------------------------------------------------------------------------------------------

_LOADED: dict[Path, types.ModuleType] = {}


@contextlib.contextmanager
def no_interpreter() -> Iterator[None]:
    """TRITON_INTERPRET unset for the block: ``@triton.jit`` reads it when a module is imported
    (the package tests set it to 1 on machines without a GPU), and processes started inside
    inherit the environment without it."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def load_module(path: Path) -> types.ModuleType:
    """``path`` imported as ``_fused_llm_compile_targets.<py package>_<hash>.<module>``: a namespace of
    its own, so the package's ``__init__`` (which needs a build's ``_ops.py``) is not run, the
    module's relative imports still resolve to its siblings, and a copy that the package tests
    imported under the interpreter is not reused."""
    path = path.resolve()
    if path in _LOADED:
        return _LOADED[path]
    root = "_fused_llm_compile_targets"
    if root not in sys.modules:
        top = types.ModuleType(root)
        top.__path__ = []
        sys.modules[root] = top
    # the directory's hash in the name: two checkouts' (or a test's) packages of one name stay apart
    pkg_name = f"{root}.{path.parent.name}_{hashlib.sha1(str(path.parent).encode()).hexdigest()[:8]}"
    if pkg_name not in sys.modules:
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(path.parent)]
        sys.modules[pkg_name] = pkg
    with no_interpreter():
        module = importlib.import_module(f"{pkg_name}.{path.stem}")
    _LOADED[path] = module
    return module


def _jit_function(module: types.ModuleType, name: str):
    from triton.runtime.jit import JITFunction

    fn = getattr(module, name, None)
    if not isinstance(fn, JITFunction):
        raise CheckError(
            f"{module.__name__}.{name}: expected a triton.runtime.jit.JITFunction, got {type(fn).__name__} "
            "(an autotuner / heuristics wrapper, or the interpreter's InterpretedFunction: TRITON_INTERPRET=1 "
            "was set when the module was imported)"
        )
    return fn


class CheckError(RuntimeError):
    """The check itself cannot run as set up: a kernel with no scenario, a launch that does not
    match its kernel's parameters, a launcher that launched nothing."""


# ---------------------------------------------------------------------------------------------
# Recording what a launcher launches
# ---------------------------------------------------------------------------------------------


@dataclass
class Launch:
    kernel: str
    args: tuple
    kwargs: dict
    grid: Any


@contextlib.contextmanager
def record_launches(module: types.ModuleType) -> Iterator[list[Launch]]:
    """While open, ``kernel[grid](...)`` of any jit function of ``module`` records the call
    instead of compiling and launching it (``__getitem__`` calls ``self.run``, which an
    instance attribute shadows)."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    jitted = {name: fn for name, fn in vars(module).items() if isinstance(fn, JITFunction)}
    for name, fn in jitted.items():

        def run(*args, grid, warmup, _name=name, **kwargs):
            launches.append(Launch(_name, args, kwargs, grid))

        fn.run = run
    try:
        yield launches
    finally:
        for fn in jitted.values():
            del fn.run


# ---------------------------------------------------------------------------------------------
# Scenarios: the launchers called as the packages' public functions call them, at Llama shapes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    label: str
    launch: Callable[[], None]


def _tokens(m: int) -> str:
    return "1 token" if m == 1 else f"{m} tokens"


def _empty(shape, dtype, device="meta"):
    import torch

    return torch.empty(shape, dtype=getattr(torch, dtype) if isinstance(dtype, str) else dtype, device=device)


# Llama-3 8B attention: 32 query / 8 key-value heads of 128 on a hidden size of 4096; its MLP
# 14336 wide. 70B: hidden 8192, MLP 28672.
_HIDDEN, _HQ, _HK, _HEAD_DIM, _MLP = 4096, 32, 8, 128, 14336
_HIDDEN_70B, _MLP_70B = 8192, 28672
# (batch, sequence) of the rotary scenarios. One token: one head and one warp per program, cos /
# sin read after q / k (COS_FIRST off), and T = S = 1 specialized as constants; a batch of 32
# decode tokens: S = 1 with 32-token programs (8 warps, COS_FIRST on); a 4096-token prefill:
# the same programs over a long sequence.
_DECODE, _DECODE_BATCH, _PREFILL = (1, 1, "decode, 1 token"), (32, 1, "decode, 32 sequences"), (1, 4096, "prefill, 4096 tokens")

# Which variants are compiled, and why not every combination: a variant is compiled where its
# code differs (each constexpr branch of the kernel, each dtype's conversions and MMA operand
# type, each configuration the config function picks), not at every shape that leads to the
# same code. Every token count below picks a different configuration on some target. The full
# cross product first tried (3 rotary shapes x 6 variants, 7 projection token counts x 2 weight
# forms x 2 dtypes, ...: 148 specializations) took 413 s on this 2-core machine shared with other
# jobs; this set, 100 specializations from 115 launches, 163 s of CPU time (160-210 s there).


def _rope_triton_scenarios(module, dev: Device) -> list[Scenario]:
    """rope-triton: the rotary kernel as each public function calls it, and the projection
    (RMSNorm -> x W^T -> RoPE) kernels as ``rms_norm_matmul_rope`` runs them."""
    m = module
    out: list[Scenario] = []
    D, half = _HEAD_DIM, _HEAD_DIM // 2

    def qk(B, S, dtype, device="meta"):
        # [B, H, S, D] tensors (layout "bhsd", the default) as the [B, S, H, D] views the launcher takes
        q = _empty((B, _HQ, S, D), dtype, device).transpose(1, 2)
        k = _empty((B, _HK, S, D), dtype, device).transpose(1, 2)
        return q, k, _empty((B, _HQ, S, D), dtype, device).transpose(1, 2), _empty((B, _HK, S, D), dtype, device).transpose(1, 2)

    def transformers(shape, dtype):  # apply_rotary_transformers: tables [B, S, D], each op rounded (HF_ROUNDING)
        def launch():
            B, S, _ = shape
            q, k, qo, ko = qk(B, S, dtype)
            cos = _empty((B, S, D), dtype)
            m.launch_rope(q, k, qo, ko, cos, cos, None, None, D, False, True, "bs")

        return Scenario(f"rotary, transformers drop-in, {dtype}, {shape[2]}", launch)

    def by_position(shape):  # apply_rotary(position_ids=...): half tables [max_position, D / 2] (HAS_POS)
        def launch():
            B, S, _ = shape
            q, k, qo, ko = qk(B, S, "bfloat16")
            cos = _empty((8192, half), "bfloat16")
            m.launch_rope(q, k, qo, ko, cos, cos, _empty((B, S), "int64"), None, D, False, False, "pos")

        return Scenario(f"rotary, tables at position_ids, bfloat16, {shape[2]}", launch)

    def from_positions(shape):  # apply_rotary_from_positions: cos / sin from libdevice / ocml (FROM_POSITIONS)
        def launch():
            B, S, _ = shape
            q, k, qo, ko = qk(B, S, "bfloat16")
            m.launch_rope(q, k, qo, ko, None, None, _empty((B, S), "int64"), _empty((half,), "float32"), D, False, False,
                          "positions")  # fmt: skip

        return Scenario(f"rotary, from positions, bfloat16, {shape[2]}", launch)

    def partial_interleaved(shape):
        # apply_rotary(rotary_dim=64, interleaved=True), out of place, so the unrotated tail is
        # copied (COPY_TAIL). CPU tensors (torch.empty: pages never touched): the launcher
        # decides the copy by comparing data pointers, and every meta tensor's is 0.
        def launch():
            B, S, _ = shape
            q, k, qo, ko = qk(B, S, "bfloat16", "cpu")
            cos = _empty((1, S, 32), "bfloat16", "cpu")
            m.launch_rope(q, k, qo, ko, cos, cos, None, None, 64, True, False, "bs")

        return Scenario(f"rotary, rotary_dim 64 interleaved, bfloat16, {shape[2]}", launch)

    out += [transformers(shape, "bfloat16") for shape in (_DECODE, _DECODE_BATCH, _PREFILL)]
    out += [transformers(_PREFILL, dtype) for dtype in ("float16", "float32")]  # fp32: 32-bit rounding bits
    out += [by_position(_DECODE_BATCH), from_positions(_DECODE), from_positions(_PREFILL), partial_interleaved(_PREFILL)]

    # The projection: x [M, 4096] -> [W_q; W_k] (5120 x 4096). The launcher picks the
    # configuration (`rms_matmul_rope_config`) from M and from whether TMA is used, which its own
    # test would always deny on a meta tensor: it gets the configuration picked for the target
    # instead, and the persistent kernel's (whose grid takes the SM count from the device) with
    # PROGRAMS set.
    # Token counts: each is a branch of the config function (1: M specialized as 1 too; 32 and
    # 64: the split-K / TMA decode tiles; 128: sm90's folded 64 x (64 + 64) tiles; 1024 and 4096:
    # sm90's whole-head and persistent kernels, the pointer-load tiles elsewhere).
    N = (_HQ + _HK) * D

    def projection(M, folded, dtype):
        def launch():
            x, w, y = _empty((M, _HIDDEN), dtype), _empty((N, _HIDDEN), dtype), _empty((M, N), dtype)
            g = None if folded else _empty((_HIDDEN,), dtype)
            cfg = m.rms_matmul_rope_config(M, _HIDDEN, D, folded=folded, tma=dev.tma)
            if isinstance(cfg, m.RmsMatmulRopePersistentConfig):
                cfg = replace(cfg, PROGRAMS=dev.sms)
            cos = _empty((M, D), dtype)
            m.launch_rms_matmul_rope(x, g, w, cos, cos, y, 1e-6, D, cfg=cfg)

        weight = "folded into W" if folded else "passed"
        return Scenario(f"projection, fused, RMSNorm weight {weight}, {dtype}, {_tokens(M)}", launch)

    out += [projection(M, folded, "bfloat16") for M in (1, 32, 64, 128, 1024, 4096) for folded in (False, True)]
    out.append(projection(1, True, "float16"))

    def unfused(folded):  # impl="unfused" (what impl="auto" runs at 129-4095 tokens): RMSNorm, cuBLAS, RoPE in place
        def launch():
            M = 1024
            x, w, y = _empty((M, _HIDDEN), "bfloat16"), _empty((N, _HIDDEN), "bfloat16"), _empty((M, N), "bfloat16")
            g = None if folded else _empty((_HIDDEN,), "bfloat16")
            cos = _empty((M, D), "bfloat16")
            m.launch_unfused_projection(x, g, w, cos, cos, y, 1e-6, D)

        return Scenario(f"projection, unfused, RMSNorm weight {'folded' if folded else 'passed'}, bfloat16, 1024 tokens", launch)

    out += [unfused(False), unfused(True)]

    if not dev.tma:
        # The whole-head and persistent kernels: the config function picks them only with TMA
        # (sm90). Elsewhere they run with an explicit configuration (the package tests, the
        # tuning scripts), on their pointer-load path: compiled here with sm90's choice.
        def sm90_choice(M, extra):
            def launch():
                x, w, y = _empty((M, _HIDDEN), "bfloat16"), _empty((N, _HIDDEN), "bfloat16"), _empty((M, N), "bfloat16")
                cfg = m.rms_matmul_rope_config(M, _HIDDEN, D, folded=True, tma=True)
                cos = _empty((M, D), "bfloat16")
                m.launch_rms_matmul_rope(x, None, w, cos, cos, y, 1e-6, D, cfg=replace(cfg, USE_TMA=False, **extra))

            return launch

        out += [
            Scenario("projection, sm90's configuration with pointer loads (whole-head tiles), bfloat16, 1024 tokens",
                     sm90_choice(1024, {})),
            Scenario("projection, sm90's configuration with pointer loads (persistent), bfloat16, 4096 tokens",
                     sm90_choice(4096, {"PROGRAMS": dev.sms})),
        ]  # fmt: skip

    def decode_attention(B, H, H_kv, L, head_dim, dtype):  # decode_attention: q a transposed [B, 1, H, D] view, a shared mask
        def launch():
            q = _empty((B, 1, H, head_dim), dtype).transpose(1, 2)
            k, v = _empty((B, H_kv, L, head_dim), dtype), _empty((B, H_kv, L, head_dim), dtype)
            mask = _empty((1, L), "bool").expand(B, L)
            m.launch_decode_attention(q, k, v, mask, _empty((B, H, 1, head_dim), dtype), head_dim**-0.5, sms=dev.sms)

        return launch

    # The split kernel's code differs by dtype, query heads a K / V head (the tile's live rows)
    # and head size; the combine kernel's by the slices' power of two.
    out += [
        Scenario("decode attention, Llama-3 8B heads (32 / 8 of 128), bfloat16, 4160 slots",
                 decode_attention(1, _HQ, _HK, 4160, D, "bfloat16")),
        Scenario("decode attention, Llama-3 8B heads (32 / 8 of 128), float16, 592 slots",
                 decode_attention(1, _HQ, _HK, 592, D, "float16")),
        Scenario("decode attention, 16 heads of 64 without grouping, bfloat16, 8 sequences of 592 slots",
                 decode_attention(8, 16, 16, 592, 64, "bfloat16")),
    ]  # fmt: skip
    return out


def _gated_mlp_scenarios(module, dev: Device) -> list[Scenario]:
    """gated-mlp: ``gated_mlp`` / ``gated_mlp_fp8`` through ``launch_gated_mlp``, with
    ``gated_mlp_config``'s choice for the target's SM count and TMA support."""
    m = module
    out: list[Scenario] = []

    def case(label, M, N, K, dtype, out_dtype=None, activation="silu", bias=False, scales=None):
        def launch():
            x, w = _empty((M, K), dtype), _empty((N, K), dtype)
            y = _empty((M, N), out_dtype or dtype)
            b = _empty((N,), dtype) if bias else None
            fp8 = x.element_size() == 1
            sc = None
            if fp8:  # "token": x_scale [M], weight scales [N] (strides 1); "tensor": [1] each (strides 0)
                rows, cols = (M, N) if scales == "token" else (1, 1)
                sc = (_empty((rows,), "float32"), _empty((cols,), "float32"), _empty((cols,), "float32"))
            out_scale = _empty((1,), "float32") if y.element_size() == 1 else None
            cfg = m.gated_mlp_config(M, N, K, dev.sms, dev.tma, fp8)
            m.launch_gated_mlp(x, w, w, b, b, y, activation, cfg, sc, out_scale)

        out.append(Scenario(label, launch))

    # 1: decode (M specialized as 1; split over K on every target); 64: the largest decode
    # tile; 1024 and 4096: prefill (4 and 3 stages); 70B at 256: sm90's split last wave.
    for M in (1, 64, 1024, 4096):
        case(f"Llama-3 8B MLP, bfloat16, {_tokens(M)}", M, _MLP, _HIDDEN, "bfloat16")
    case("Llama-3 70B MLP, bfloat16, 256 tokens (a split last wave on sm90)", 256, _MLP_70B, _HIDDEN_70B, "bfloat16")
    case("Llama-3 8B MLP, float16, 1 token", 1, _MLP, _HIDDEN, "float16")
    case("Llama-3 8B MLP, bfloat16, GeGLU with biases, 1024 tokens", 1024, _MLP, _HIDDEN, "bfloat16", activation="gelu_tanh",
         bias=True)  # fmt: skip
    for M in (1, 1024):
        case(f"Llama-3 8B MLP, {dev.fp8} per-token / per-channel scales, bfloat16 out, {_tokens(M)}", M, _MLP, _HIDDEN, dev.fp8,
             "bfloat16", scales="token")  # fmt: skip
        case(f"Llama-3 8B MLP, {dev.fp8} per-tensor scales, {dev.fp8} out, {_tokens(M)}", M, _MLP, _HIDDEN, dev.fp8, dev.fp8,
             scales="tensor")  # fmt: skip
    return out


def _machete_w4a16_scenarios(module, dev: Device) -> list[Scenario]:
    """machete-w4a16: ``w4a16_gemm`` through ``launch_w4a16`` with ``w4a16_config``'s choice for
    the target's SM count, on Llama-3 8B projections: the split-K kernel at 1 (FMA GEMV), 16
    and 64 tokens (tl.dot tiles), the tiled kernel at 256 and 4096; group 128 symmetric (the
    common checkpoint), group 32 with zeros (K steps spanning groups), per-channel with zeros,
    act-order and bias, in bf16 and fp16."""
    m = module
    out: list[Scenario] = []

    def case(label, M, N, K, dtype="bfloat16", group=128, zeros=False, perm=False, bias=False):
        def launch():
            groups = 1 if group == -1 else K // group
            x, y = _empty((M, K), dtype), _empty((M, N), dtype)
            qweight, scales = _empty((N, K // 8), "int32"), _empty((groups, N), dtype)
            z = _empty((groups, N), "uint8") if zeros else None
            p = _empty((K,), "int32") if perm else None
            b = _empty((N,), dtype) if bias else None
            m.launch_w4a16(x, qweight, scales, z, p, b, y, group, cfg=m.w4a16_config(M, N, K, group, dev.sms, hip=dev.backend == "hip"))

        out.append(Scenario(label, launch))

    for M in (1, 16, 64, 256):
        case(f"Llama-3 8B QKV, bfloat16, group 128 uint4b8, {_tokens(M)}", M, 6144, _HIDDEN)
    case("Llama-3 8B down, float16, group 128 uint4b8, 1 token", 1, _HIDDEN, _MLP, "float16")
    case("Llama-3 8B down, float16, group 32 with zeros, 16 tokens", 16, _HIDDEN, _MLP, "float16", 32, zeros=True)
    case("Llama-3 8B O, bfloat16, per channel with zeros, act-order, bias, 1 token", 1, _HIDDEN, _HIDDEN, group=-1, zeros=True,
         perm=True, bias=True)  # fmt: skip
    case("Llama-3 8B gate/up, float16, group 32 with zeros, act-order, bias, 4096 tokens", 4096, 2 * _MLP, _HIDDEN, "float16", 32,
         zeros=True, perm=True, bias=True)  # fmt: skip
    return out


def _skinny_gemm_scenarios(module, dev: Device) -> list[Scenario]:
    """skinny-gemm: ``gemm`` / ``gemm_fp8`` through ``launch_skinny`` with ``skinny_config``'s
    choice for the target's SM count (and gfx942's K steps): the issue's Llama-405B TP8 QKV
    (2304 x 16384) at 1 token (dot tile, and the FMA GEMV), 2 (the two-token GEMV), 8 (atomic reduction) and 16 (dot
    tile, ordered reduction), Llama-3-8B QKV with a bias at 4, 8B down in fp16 at 64, 70B gate/up at 64 (no
    split: one slice) and at 128 (two M tiles); FP8 (the target's format) per token / per
    channel at 1 token, per tensor with an fp32 bias at 16, atomic with fp16 out at 64. No FP8
    on sm80: Triton has no e4m3 below sm89 and the package refuses FP8 there up front."""
    m = module
    out: list[Scenario] = []
    hip = dev.backend == "hip"

    def case(label, M, N, K, dtype="bfloat16", deterministic=True, bias=False, scales=None, out_dtype=None, cfg=None):
        def launch():
            x, w = _empty((M, K), dtype), _empty((N, K), dtype)
            y = _empty((M, N), out_dtype or dtype)
            xs = ws = None
            if scales is not None:
                xs = _empty((M if scales == "token" else 1,), "float32")
                ws = _empty((N if scales == "token" else 1,), "float32")
            b = _empty((N,), "float32" if scales is not None else dtype) if bias else None
            config = m.SkinnyConfig(*cfg) if cfg is not None else m.skinny_config(M, N, K, x.element_size(), dev.sms, hip=hip)
            m.launch_skinny(x, w, b, y, xs, ws, deterministic, config)

        out.append(Scenario(label, launch))

    # Explicit configurations where skinny_config's choice at M = 1 (the few-row GEMV without a
    # K split on CUDA) would leave a path uncompiled: the 16-row dot tile at one token, and the
    # GEMV with each split-K reduction.
    case("Llama-405B TP8 QKV, bfloat16, ordered split K, 1 token (16-row dot tile)", 1, 2304, 16384,
         cfg=(16, 64, 128, 4, 4, 2 if hip else 4))  # fmt: skip
    for M, det in ((8, False), (16, True)):
        case(f"Llama-405B TP8 QKV, bfloat16, {'ordered' if det else 'atomic'} split K, {_tokens(M)}", M, 2304, 16384,
             deterministic=det)  # fmt: skip
    case("Llama-405B TP8 QKV, bfloat16, FMA GEMV, 1 token", 1, 2304, 16384)
    for det in (True, False):
        case(f"Llama-3 8B O, bfloat16, FMA GEMV on 4 rows, {'ordered' if det else 'atomic'} split K, 1 token", 1, 4096,
             _HIDDEN, deterministic=det, cfg=(1, 4, 1024, 2, 8, 2))  # fmt: skip
    case("Llama-3 8B QKV, bfloat16, bias, 4 tokens", 4, 6144, _HIDDEN, bias=True)
    # The two-token GEMV (BLOCK_M 2: a [tokens, rows, K step] FMA accumulator), as the tuning
    # table may pick it at 2 tokens, with and without a K split.
    for cfg in ((2, 4, 1024, 1, 4, 1), (2, 2, 4096, 2, 8, 1)):
        case(f"Llama-405B TP8 QKV, bfloat16, FMA GEMV on {cfg[1]} rows, 2 tokens", 2, 2304, 16384, cfg=cfg)
    case("Llama-3 8B down, float16, 64 tokens", 64, _HIDDEN, _MLP, "float16")
    case("Llama-3 70B gate/up, bfloat16, 64 tokens (one K slice)", 64, 2 * _MLP_70B, _HIDDEN_70B)
    case("Llama-3 70B O, bfloat16, 128 tokens (two M tiles)", 128, _HIDDEN_70B, _HIDDEN_70B)
    if dev.arch != 80:
        case(f"Llama-405B TP8 QKV, {dev.fp8} per token / channel, 1 token", 1, 2304, 16384, dev.fp8, scales="token",
             out_dtype="bfloat16")  # fmt: skip
        case(f"Llama-3 8B QKV, {dev.fp8} per tensor, fp32 bias, 16 tokens", 16, 6144, _HIDDEN, dev.fp8, bias=True,
             scales="tensor", out_dtype="bfloat16")  # fmt: skip
        case(f"Llama-3 8B down, {dev.fp8} per token / channel, atomic, float16 out, 64 tokens", 64, _HIDDEN, _MLP, dev.fp8,
             deterministic=False, scales="token", out_dtype="float16")  # fmt: skip
    return out


SCENARIOS: dict[str, Callable[[types.ModuleType, Device], list[Scenario]]] = {
    "rope-triton": _rope_triton_scenarios,
    "gated-mlp": _gated_mlp_scenarios,
    "machete-w4a16": _machete_w4a16_scenarios,
    "skinny-gemm": _skinny_gemm_scenarios,
}


# ---------------------------------------------------------------------------------------------
# Launches -> compile jobs
# ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One specialization of one kernel for one target: what ``triton.compile`` gets."""

    package: str
    path: str
    kernel: str
    target: str
    labels: list[str]
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict

    def constexpr(self, name: str) -> Any:
        """The value a constexpr parameter was given (None if the kernel has no such one)."""
        names = list(self.signature)
        return self.constexprs.get((names.index(name),)) if name in names else None

    @property
    def config(self) -> str:
        """The launch's constexpr values and options, short (for reports)."""
        names = list(self.signature)
        text = ", ".join(f"{names[k[0]]}={v}" for k, v in self.constexprs.items()
                         if len(k) == 1 and self.signature[names[k[0]]] == "constexpr")  # fmt: skip
        return f"{text}, num_warps={self.options.get('num_warps')}, num_stages={self.options.get('num_stages')}"


def _check_params(kernel, launch: Launch, backend, where: str) -> None:
    """The recorded call against the kernel's parameter list, with a message naming both sides
    (Triton's own binder would fail too, but with "dynamic_func() missing 1 required
    positional argument")."""
    params = [p.name for p in kernel.params]
    constexprs = {p.name for p in kernel.params if p.is_constexpr}
    if len(launch.args) > len(params):
        raise CheckError(f"{where}: {len(launch.args)} positional arguments for the {len(params)} parameters {params}")
    given = set(params[: len(launch.args)])
    with warnings.catch_warnings():
        _worker_init()
        options = set(backend.parse_options({}).__dict__)
    unknown = [k for k in launch.kwargs if k not in params and k not in options]
    doubled = [k for k in launch.kwargs if k in given]
    missing = [p.name for p in kernel.params if p.name not in given and p.name not in launch.kwargs and not p.has_default]
    if unknown or doubled or missing:
        parts = []
        if missing:
            parts.append(f"parameters not passed: {missing} ({[n for n in missing if n in constexprs]} of them constexpr)")
        if unknown:
            parts.append(f"arguments the kernel does not take (nor the backend as options): {unknown}")
        if doubled:
            parts.append(f"passed both by position and by name: {doubled}")
        raise CheckError(f"{where}: the launch does not match the kernel's parameters {params}: " + "; ".join(parts))


def _specialize(kernel, launch: Launch, backend) -> tuple[dict, dict, dict, dict]:
    """Triton's own binder for ``backend`` (what ``JITFunction.run`` computes before compiling):
    signature, constexprs, attributes and options. Uses Triton 3.9's internals
    (``create_function_from_signature``, ``JITFunction._pack_args``)."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    with warnings.catch_warnings():
        _worker_init()
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, dict(options.__dict__)


def build_jobs(sources: list[KernelSource], targets: list[str]) -> list[Job]:
    """Every scenario of every package on every target, recorded, checked and specialized;
    identical specializations merged (their labels listed together). TRITON_INTERPRET is unset
    meanwhile: the launchers read it at each call (COMPILED=False under it takes the
    interpreter's branches, e.g. tl.cos for libdevice's cos)."""
    with no_interpreter():
        return _build_jobs(sources, targets)


def _build_jobs(sources: list[KernelSource], targets: list[str]) -> list[Job]:
    from triton.compiler.compiler import make_backend

    jobs: dict[str, Job] = {}
    for source in sources:
        if source.package not in SCENARIOS:
            raise CheckError(f"{source.package}: {source.path.name} has Triton kernels {list(source.kernels)} but "
                             f"{__name__} has no scenarios for the package (add them to SCENARIOS)")  # fmt: skip
        module = load_module(source.path)
        for target in targets:
            dev = DEVICES[target]
            backend = make_backend(dev.target())
            launched: set[str] = set()
            for scenario in SCENARIOS[source.package](module, dev):
                where = f"{source.package} {target} '{scenario.label}'"
                with record_launches(module) as launches:
                    try:
                        scenario.launch()
                    except Exception as err:  # noqa: BLE001 - re-raised with the scenario named
                        raise CheckError(
                            f"{where}: the launcher raised {type(err).__name__}: {err} (while recorded, `kernel[grid](...)` "
                            "launches nothing and returns None; a launcher that reads the device, e.g. torch.cuda "
                            "properties of a meta tensor, needs that value passed in its cfg)"
                        ) from err
                if not launches:
                    raise CheckError(f"{where}: the launcher launched no kernel")
                for launch in launches:
                    kernel = _jit_function(module, launch.kernel)
                    _check_params(kernel, launch, backend, f"{where}, {source.module}.{launch.kernel}")
                    try:
                        signature, constexprs, attrs, options = _specialize(kernel, launch, backend)
                    except (TypeError, KeyError, AttributeError) as err:
                        import triton

                        raise CheckError(f"{where}, {source.module}.{launch.kernel}: Triton {triton.__version__}'s binder "
                                         f"rejected the launch: {type(err).__name__}: {err}") from err  # fmt: skip
                    if "COMPILED" in signature and constexprs.get((list(signature).index("COMPILED"),)) is not True:
                        raise CheckError(f"{where}, {source.module}.{launch.kernel}: launched with COMPILED != True (the "
                                         "interpreter's branches), which no GPU runs")  # fmt: skip
                    key = repr((source.package, launch.kernel, target, signature, sorted(constexprs.items()),
                                sorted(attrs.items()), sorted(options.items())))  # fmt: skip
                    if key in jobs:
                        jobs[key].labels.append(scenario.label)
                    else:
                        jobs[key] = Job(source.package, str(source.path), launch.kernel, target, [scenario.label], signature,
                                        constexprs, attrs, options)  # fmt: skip
                    launched.add(launch.kernel)
            never = [k for k in source.kernels if k not in launched]
            if never:
                raise CheckError(f"{source.package} {target}: entry kernels {never} of {source.module} are launched by no "
                                 f"scenario in {__name__} (add one that reaches them on this target)")  # fmt: skip
    return list(jobs.values())


# ---------------------------------------------------------------------------------------------
# Compiling (worker processes) and checking the artifact
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    package: str
    kernel: str
    target: str
    labels: list[str]
    config: str
    status: str  # "ok", "compile-error", "artifact", "shared-memory"
    seconds: float = 0.0
    binary_bytes: int = 0
    shared: int = 0
    error: str = ""
    known: str = ""  # the KNOWN_ISSUES reason where one matches
    signature: dict = field(default_factory=dict)


def _check_artifact(compiled, job: Job, dev: Device) -> tuple[str, str]:
    """(status, message) of a compiled kernel: the binary, its symbol, its target, its shared
    memory."""
    name = compiled.metadata.name
    if name != job.kernel:
        return "artifact", f"the compiled kernel is named {name!r}, expected {job.kernel!r}"
    if dev.backend == "hip":
        binary, asm = compiled.asm.get("hsaco", b""), compiled.asm.get("amdgcn", "")
        # e.g. `.amdgcn_target "amdgpu9.42-amd-amdhsa-unknown-gfx942"` (Triton 3.9's LLVM)
        target_ok = re.search(rf'^\s*\.amdgcn_target "[^"]*-{dev.arch}(:[^"]*)?"', asm, re.M) is not None
    else:
        binary, asm = compiled.asm.get("cubin", b""), compiled.asm.get("ptx", "")
        target_ok = re.search(rf"^\.target sm_{dev.arch}a?\b", asm, re.M) is not None  # sm_90a: wgmma / TMA
    if not binary.startswith(b"\x7fELF"):
        return "artifact", f"no ELF {'hsaco' if dev.backend == 'hip' else 'cubin'} ({len(binary)} bytes)"
    if name.encode() not in binary:
        return "artifact", f"the binary ({len(binary)} bytes) has no symbol {name!r}"
    if not target_ok:
        return "artifact", f"the assembly is not for {dev.arch}"
    if compiled.metadata.shared > dev.max_shared:
        return "shared-memory", (
            f"needs {compiled.metadata.shared} bytes of shared memory per block, {dev.name} allows {dev.max_shared}: "
            "it compiles, but its launch raises OutOfResources"
        )
    return "ok", ""


def _compile(job: Job) -> Result:
    import triton
    from triton.compiler import ASTSource

    dev = DEVICES[job.target]
    result = Result(job.package, job.kernel, job.target, job.labels, job.config, "ok", signature=job.signature)
    kernel = _jit_function(load_module(Path(job.path)), job.kernel)
    t0 = time.perf_counter()
    try:
        src = ASTSource(kernel, job.signature, job.constexprs, job.attrs)
        compiled = triton.compile(src, target=dev.target(), options=job.options)
    except Exception as err:  # noqa: BLE001 - a compile error of any kind is the result
        result.status, result.error = "compile-error", f"{type(err).__name__}: {err}".strip()
        result.seconds = time.perf_counter() - t0
        return result
    result.seconds = time.perf_counter() - t0
    result.binary_bytes = len(compiled.asm.get("hsaco" if dev.backend == "hip" else "cubin", b""))
    result.shared = compiled.metadata.shared
    result.status, result.error = _check_artifact(compiled, job, dev)
    return result


def _worker_init() -> None:
    # Triton 3.9 warns once per process that its default for FP fusion changes in 3.10; the
    # launchers run with the default (fusion on, in 3.9 and in the GPU machine's 3.6), so do we.
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


# ---------------------------------------------------------------------------------------------
# Known issues: found by this check, reported to the packages, not fixed here
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownIssue:
    package: str
    kernel: str
    target: str
    status: str
    applies: Callable[[Job], bool]
    reason: str


def _fp8_input(job: Job) -> bool:
    return job.signature.get("x", "").startswith("*fp8")


# Measured with this check (Triton 3.9): every listed gfx942 launch fits the 64 KiB of LDS with
# num_stages=2, Triton's default on AMD (24-48 KiB; the persistent tile exactly 64 KiB), and
# with 3 only gated-mlp's 64- and 128-row tiles do (48 / 64 KiB). None of this ran on an
# MI300X: what to change there is for the packages to measure.
_GFX942_LDS = "over the 64 KiB of LDS a gfx942 workgroup gets, so the launch raises OutOfResources on an MI300X"

KNOWN_ISSUES: list[KnownIssue] = [
    KnownIssue(
        "gated-mlp", "_gated_mlp_kernel", "sm80", "compile-error", _fp8_input,
        "Triton has no e4m3fn below sm89 (\"type fp8e4nv not supported in this architecture\"): the pointer "
        "path loads FP8 before it widens it (UPCAST), so gated_mlp_fp8 cannot compile on an A100, and the "
        "package does not refuse it there up front",
    ),  # fmt: skip
    KnownIssue(
        "gated-mlp", "_gated_mlp_kernel", "gfx942", "shared-memory",
        lambda job: not _fp8_input(job) and job.options.get("num_stages", 0) >= 4,
        "gated_mlp_config keeps 4 stages for the pointer-load tiles (tuned on H100 / H200): 16-bit x, W_gate "
        f"and W_up tiles in 3 buffers need 72-102 KiB at 1-2048 tokens, {_GFX942_LDS}; FP8 tiles (half the "
        "bytes) and 3 stages at 4096 tokens fit",
    ),  # fmt: skip
    KnownIssue(
        "rope-triton", "_rms_matmul_rope_kernel", "gfx942", "shared-memory",
        lambda job: (job.constexpr("HAS_G"), job.constexpr("SPLIT_K"), job.constexpr("BLOCK_K"), job.constexpr("BLOCK_NH"))
        == (False, 2, 128, 64),
        "rms_matmul_rope_config's folded-weight split-K decode tiles 16 x (64 + 64) (<= 16 tokens) and "
        f"64 x (64 + 64) (33-64 tokens), K steps of 128, 4 stages, need 100-112 KiB, {_GFX942_LDS} "
        "(impl='auto' runs them there with rms_weight=None)",
    ),  # fmt: skip
    KnownIssue(
        "rope-triton", "_rms_matmul_rope_heads_kernel", "gfx942", "shared-memory", lambda job: True,
        "sm90's whole-head tile (64 x 256, 5 stages; 136 KiB) with pointer loads: the config function picks this "
        "kernel only with TMA, so on gfx942 it runs only with an explicit cfg, and that tile is "
        f"{_GFX942_LDS}",
    ),  # fmt: skip
    KnownIssue(
        "rope-triton", "_rms_matmul_rope_persistent_kernel", "gfx942", "shared-memory", lambda job: True,
        "sm90's persistent tile (128 x 256, 3 stages; 112 KiB) with pointer loads: picked only with TMA, so "
        f"on gfx942 it runs only with an explicit cfg, and that tile is {_GFX942_LDS}",
    ),  # fmt: skip
]


def _issues_of(job: Job) -> list[KnownIssue]:
    return [i for i in KNOWN_ISSUES if (i.package, i.kernel, i.target) == (job.package, job.kernel, job.target) and i.applies(job)]


def known_issue(job: Job, status: str) -> KnownIssue | None:
    """The KNOWN_ISSUES entry that explains ``status`` for ``job``, if any."""
    return next((i for i in _issues_of(job) if i.status == status), None)


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    results: list[Result]
    seconds: float
    jobs: int
    workers: int

    @property
    def unexpected(self) -> list[Result]:
        """Failures no known issue explains, and known issues that did not happen."""
        return [r for r in self.results if (r.status != "ok") != bool(r.known)]

    def to_json(self) -> dict:
        return {"seconds": round(self.seconds, 1), "jobs": self.jobs, "workers": self.workers,
                "results": [asdict(r) for r in self.results]}  # fmt: skip


def run_check(
    packages_: list[str] | None = None,
    targets: list[str] | None = None,
    workers: int | None = None,
    cache_dir: str | None = None,
    on_result: Callable[[Result, int, int], None] | None = None,
) -> Report:
    """Build the jobs here, compile them in ``workers`` processes (default: one per CPU). Each
    run compiles from scratch in a temporary Triton cache unless ``cache_dir`` is given (Triton's
    cache key covers the kernel's source and every jit function it calls, the constexprs, the
    options, the target and the Triton / ptxas builds, so a kept cache stays correct)."""
    import multiprocessing

    targets = targets or list(DEVICES)
    unknown = [t for t in targets if t not in DEVICES]
    if unknown:
        raise CheckError(f"targets: unknown {unknown}; known: {list(DEVICES)}")
    t0 = time.perf_counter()
    jobs = build_jobs(kernel_sources(packages_), targets)
    # Longest first (gfx942, then the most warps x stages): the pool ends together.
    jobs.sort(key=lambda j: (j.target != "gfx942", -j.options.get("num_warps", 4) * j.options.get("num_stages", 1)))
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        cache = cache_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="fused-llm-triton-cache-"))
        saved_cache = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = str(cache)
        try:
            with no_interpreter():
                ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch's threads
                with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init) as pool:
                    futures = {pool.submit(_compile, job): job for job in jobs}
                    for future in as_completed(futures):
                        job = futures[future]
                        result = future.result()
                        issue = known_issue(job, result.status)
                        if issue is None and result.status == "ok":
                            # a known issue that did not happen: reported as unexpected (stale entry)
                            stale = _issues_of(job)
                            if stale:
                                result.known = f"listed in KNOWN_ISSUES ({stale[0].status}) but compiled fine: remove the entry"
                        elif issue is not None:
                            result.known = issue.reason
                        results.append(result)
                        if on_result:
                            on_result(result, len(results), len(jobs))
        finally:
            if saved_cache is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved_cache
    results.sort(key=lambda r: (r.package, r.kernel, r.target, r.config))
    return Report(results, time.perf_counter() - t0, len(jobs), workers)


def summary_rows(report: Report) -> list[tuple[str, str, str, int, int, int, float]]:
    """(package, kernel, target, compiled, ok, failed, seconds) per kernel and target."""
    rows: dict[tuple[str, str, str], list] = {}
    for r in report.results:
        row = rows.setdefault((r.package, r.kernel, r.target), [0, 0, 0, 0.0])
        row[0] += 1
        row[1] += r.status == "ok"
        row[2] += r.status != "ok"
        row[3] += r.seconds
    return [(*key, *vals) for key, vals in sorted(rows.items())]


def add_arguments(parser) -> None:
    """The options of ``fused-llm check-targets`` (also ``python -m fused_llm_dev.compile_targets``)."""
    parser.add_argument("packages", nargs="*", metavar="PKG", help="packages (default: every one with Triton kernels)")
    parser.add_argument("--targets", default=",".join(DEVICES), help=f"comma-separated, of {', '.join(DEVICES)}")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="compile processes (default: one per CPU)")
    parser.add_argument("--cache-dir", help="a Triton cache to reuse (default: a fresh temporary one)")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--verbose", "-v", action="store_true", help="a line per compiled specialization")


def command(args) -> int:
    """Run the check as parsed by `add_arguments`; 0 when every result is ok or a known issue,
    1 otherwise, 2 when the check cannot run."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    if not console.is_terminal:  # CI logs: whole kernel names in the table, not 80 columns
        console = Console(stderr=True, width=150)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]

    def on_result(r: Result, done: int, total: int) -> None:
        if args.verbose or (r.status != "ok") != bool(r.known):
            colour = "green" if r.status == "ok" and not r.known else "yellow" if r.known and r.status != "ok" else "red"
            console.print(f"[{done}/{total}] [{colour}]{r.status}[/] {r.package} {r.kernel} {r.target} {r.seconds:.1f}s "
                          f"({r.config}) <- {'; '.join(r.labels)}" + (f"\n    {r.error}" if r.error else "")
                          + (f"\n    known: {r.known}" if r.known else ""))  # fmt: skip

    try:
        report = run_check(args.packages or None, targets, args.jobs, args.cache_dir, on_result)
    except CheckError as err:
        console.print(f"[red]error:[/] {err}")
        return 2
    table = Table(title=f"Triton kernels compiled for {', '.join(targets)} in {report.seconds:.0f} s "
                        f"({report.jobs} specializations, {report.workers} processes)")  # fmt: skip
    for col in ("package", "kernel", "target", "compiled", "ok", "failed", "known", "compile s"):
        table.add_column(col)
    known_by_row = {}
    for r in report.results:
        if r.known and r.status != "ok":
            known_by_row[(r.package, r.kernel, r.target)] = known_by_row.get((r.package, r.kernel, r.target), 0) + 1
    for pkg, kernel, target, n, ok, failed, secs in summary_rows(report):
        known = known_by_row.get((pkg, kernel, target), 0)
        shown = f"[red]{failed}[/]" if failed > known else str(failed)
        table.add_row(pkg, kernel, target, str(n), str(ok), shown, str(known), f"{secs:.0f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1, default=str))
    known = sum(1 for r in report.results if r.known and r.status != "ok")
    if known:
        console.print(f"[yellow]{known} known issue(s)[/] (KNOWN_ISSUES in {__name__}; -v prints them)")
    if report.unexpected:
        console.print(f"[red]{len(report.unexpected)} unexpected result(s)[/]: failures not in KNOWN_ISSUES, or known "
                      "issues that no longer happen")  # fmt: skip
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fused_llm_dev.compile_targets", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
