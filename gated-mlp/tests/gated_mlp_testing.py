# generated from common/python/testing.py by `fused-llm sync`, do not edit
"""Test helpers shared by every package's tests: devices, seeds, poisoning, tolerances, FP8
references and ulps, the torch.library contract, the ops a compiled graph calls.

The one source is common/python/testing.py. `fused-llm sync` stamps it into each package as
tests/<package>_testing.py (a name of its own, so that the copies of several packages never
stand in for each other in sys.modules; the package's tests/conftest.py puts tests/ on
sys.path), which lets a package's tests run with only that package on the path, and into
tools/fused_llm_dev/testing.py for the checkout's own tests.
"""

from __future__ import annotations

import zlib

import torch

# Per-dtype tolerances for outputs rounded to the dtype. The kernel and the fp64 reference
# differ only in the fp32 statistics: a sum of H = 16384 squares in fp32 is off by up to
# ~sqrt(H) * 6e-8 ~ 8e-6 relative (seen: 2.6e-6), hence fp32 rtol 1e-5. In fp16/bf16 that
# error can flip the two roundings LlamaRMSNorm prescribes by an ulp each: rtol = 2 ulps.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float16: {"rtol": 2 * 2**-10, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2 * 2**-7, "atol": 1e-5},
}

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
_FP8_MIN_EXP = {torch.float8_e4m3fn: -6, torch.float8_e4m3fnuz: -7}  # smallest normal exponent
# The dynamic-scale floor of the kernels, as a fraction of 1 / fp8_max (vLLM's: 1 / (fp8_max * 512)).
MIN_SCALE_FACTOR = 1.0 / 512.0


def device() -> str:
    """The device whose kernels the loaded variant implements: CUDA when torch has one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def seed_of(*parts) -> int:
    """A stable per-case seed: fresh inputs for every case, reproducible across runs."""
    return zlib.crc32(repr(parts).encode())


def size_id(size: tuple[int, int]) -> str:
    """A readable test id for a (rows, columns) case: ``257x4096``."""
    return f"{size[0]}x{size[1]}"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (its dtype's NaN bit pattern for FP8) so unwritten elements show."""
    if t.dtype in FP8_DTYPES:
        nan_byte = 0x7F if t.dtype == torch.float8_e4m3fn else 0x80
        t.view(torch.uint8).fill_(nan_byte)
    else:
        t.fill_(float("nan"))
    return t


def empty_poisoned(shape, dtype: torch.dtype, device: str) -> torch.Tensor:
    return poison_(torch.empty(shape, dtype=dtype, device=device))


def assert_fully_written(t: torch.Tensor, name: str) -> None:
    bad = torch.isnan(t.float()).sum().item()
    assert bad == 0, f"{name}: {bad} of {t.numel()} elements still hold the poison (not written)"


def fp8_ulp(values: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Spacing of the FP8 grid at ``values`` (in the FP8 domain): 2^(e-3), subnormals included."""
    v = values.float().abs()
    exp = torch.floor(torch.log2(torch.where(v > 0, v, torch.ones_like(v))))
    exp = torch.clamp(exp, min=_FP8_MIN_EXP[fp8_dtype])
    return torch.exp2(exp - 3)


def assert_fp8_close(q: torch.Tensor, q_ref: torch.Tensor, scale: torch.Tensor, scale_ref: torch.Tensor,
                     *, max_mismatch: float = 0.01, name: str = "q") -> None:
    """Dequantized values within one FP8 ulp of the reference's (each with its own scale), and
    at most ``max_mismatch`` of the elements that share the reference's scale not bit-identical
    (rounding-boundary flips). Where a dynamic scale differs from the reference's (its amax
    element was off by an ulp of the input dtype), every element of the row or group moves by
    that ratio and flips legitimately: those are held to the dequantized bound only."""
    assert q.dtype == q_ref.dtype, f"{name}: dtype {q.dtype} != {q_ref.dtype}"
    qf, rf = q.float(), q_ref.float()
    assert_fully_written(qf, name)
    deq, deq_ref = qf * scale.float(), rf * scale_ref.float()
    tol = fp8_ulp(rf, q.dtype) * scale_ref.float() * 1.001 + 1e-12
    err = (deq - deq_ref).abs()
    worst = (err / tol).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{name}: dequantized error up to {worst:.2f} FP8 ulps"
    same_scale = (scale.float() == scale_ref.float()).expand(q.shape)
    if same_scale.any():
        differ = q.view(torch.uint8) != q_ref.view(torch.uint8)
        mismatch = differ[same_scale].float().mean().item()
        if mismatch > max_mismatch:
            where = (differ & same_scale).flatten().nonzero().flatten()[:4].tolist()
            detail = ", ".join(
                f"[{i}] {qf.flatten()[i].item():g} vs {rf.flatten()[i].item():g} (scale {scale.expand(q.shape).flatten()[i].item():g})"
                for i in where
            )
            raise AssertionError(f"{name}: {mismatch:.2%} of the bytes differ from the reference; first: {detail}")


def quantize_fp8_ref(y: torch.Tensor, inv_scale: torch.Tensor | float, fp8_dtype: torch.dtype) -> torch.Tensor:
    """e4m3(clamp(y * inv_scale, +-fp8_max)) in fp32, torch's order (the kernels' too)."""
    m = FP8_MAX[fp8_dtype]
    return (y.float() * inv_scale).clamp(-m, m).to(fp8_dtype)


def dynamic_fp8_ref(y: torch.Tensor, fp8_dtype: torch.dtype, group: int | None, scale_ub: float | None):
    """Dynamic FP8 of the rows of ``y`` (any leading dims): one scale per row (``group`` None)
    or per ``group`` columns, scale = max(min(amax, scale_ub) / fp8_max, floor). Returns the
    quantized tensor (``y``'s shape) and the scales [rows, columns / group]."""
    m = FP8_MAX[fp8_dtype]
    rows, cols = y.reshape(-1, y.shape[-1]).shape
    g = group or cols
    yg = y.float().reshape(rows, cols // g, g)
    amax = yg.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub)
    scale = torch.maximum(amax / m, torch.tensor(MIN_SCALE_FACTOR / m, device=y.device))
    q = quantize_fp8_ref(yg, 1.0 / scale, fp8_dtype).reshape(y.shape)
    return q, scale.reshape(rows, cols // g)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    assert_fully_written(actual, name)
    torch.testing.assert_close(actual, expected.to(actual.dtype), **TOLERANCES[actual.dtype], msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------------------------------
# The torch.library contract of an op that mutates only its declared outputs
# ---------------------------------------------------------------------------------------

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck(op, args: tuple) -> None:
    """``torch.library.opcheck``; for ops with float8 tensors without ``test_schema``, whose
    SchemaCheckMode compares tensors with a multiply float8 lacks ("mul_cpu_reduced_float" not
    implemented for 'Float8_e4m3fn'). Pair it with :func:`assert_only_declared_outputs_mutate`,
    which checks that contract bitwise."""
    has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES for a in args)
    torch.library.opcheck(op, args, test_utils=OPCHECK_UTILS[1:] if has_fp8 else OPCHECK_UTILS)


def assert_only_declared_outputs_mutate(op, args: tuple) -> None:
    """Run ``op(*args)``: every ``Tensor!`` argument must be written, every other one untouched
    (compared bitwise, so float8 works)."""
    schema = op.default._schema
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    op(*args)
    for arg, old, spec in zip(args, before, schema.arguments):
        if not isinstance(arg, torch.Tensor):
            continue
        mutable = spec.alias_info is not None and spec.alias_info.is_write
        same = torch.equal(arg.view(torch.uint8), old.view(torch.uint8)) if arg.numel() else True
        if not mutable:
            assert same, f"{schema.name}: input {spec.name} was modified but is not declared mutable"
        else:
            assert not same or arg.numel() == 0, f"{schema.name}: output {spec.name} was not written"


def op_namespaces_backend():
    """``(namespaces, backend)``: a torch.compile backend that runs the graph as traced and adds
    to the set ``namespaces`` the namespace of every op the graph calls (``aten``, ``prims``, a
    package's ``_<pkg>_<id>``): what a compiled model runs of ours."""
    namespaces: set[str] = set()

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if isinstance(node.target, torch._ops.OpOverload):
                namespaces.add(node.target.namespace)
            elif isinstance(node.target, torch._ops.OpOverloadPacket):
                namespaces.add(node.target._qualified_op_name.split("::")[0])
        return gm.forward

    return namespaces, backend
