"""w4a16_gemm against an fp64 reference: ``x @ dequantize(qw).T (+ bias)`` on the same fp16 /
bf16 inputs.

On CUDA the Triton kernels run compiled; on CPU they run in Triton's interpreter (conftest sets
TRITON_INTERPRET=1), or the plain-torch path when Triton is missing.

Tolerance, per output element: one ulp of the output dtype at the reference's magnitude (the
kernel rounds once, to nearest on a GPU; Triton's interpreter truncates, still within one ulp)
plus 1e-4 of the output's scale for the fp32 summation order over K (K <= 16384 products of
fp16 / bf16 values, each exact in fp32: the order changes the sum by a few fp32 ulps of the
partial sums, ~1e-6 relative; 1e-4 leaves room for the split-K partials). The weights
themselves are bit-identical to dequantize()'s (test_format.py checks dequantize; the
kernels dequantize to the same bits, which a mismatch of one code or scale would break by
far more than this tolerance).
"""

from __future__ import annotations

import os

import kernels
import pytest
import torch
from machete_w4a16_testing import (
    assert_fully_written,
    assert_only_declared_outputs_mutate,
    device,
    opcheck,
    poison_,
)

w4 = kernels.get_kernel("fused-llm/machete-w4a16", version=1)

DEVICE = device()
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
TRITON = DEVICE == "cuda" or INTERPRETED
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
DTYPES = [torch.bfloat16, torch.float16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def make(M, N, K, dtype, group_size=128, zero_point=False, seed=0, act_order=False, bias=False):
    """x [M, K] unit variance, W [N, K] with std 1/sqrt(K) quantized (outputs of order one);
    act_order: the columns permuted as a GPTQ act-order checkpoint would store them."""
    g = gen(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype)
    qw = w4.quantize(w, group_size, zero_point)
    if act_order:
        perm = torch.randperm(K, generator=g).to(torch.int32)
        # The same codes / scales with packed column k' standing for original column perm[k'].
        qw = w4.QuantizedWeight(qw.qweight, qw.scales, qw.zeros, perm, qw.group_size)
    b = (0.1 * torch.randn(N, generator=g)).to(dtype) if bias else None
    return x.to(DEVICE), qw.to(DEVICE), None if b is None else b.to(DEVICE)


def reference(x, qw, bias=None) -> torch.Tensor:
    y = x.double() @ w4.dequantize(qw).double().T
    if bias is not None:
        y = y + bias.double()
    return y


def assert_gemm_close(got: torch.Tensor, ref: torch.Tensor, name: str, atol_frac: float = 1e-4) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert_fully_written(got, name)
    if not got.numel():
        return
    scale = ref.abs().max().item()
    tol = ULP[got.dtype] * ref.abs() + atol_frac * scale + 1e-6
    err = (got.double() - ref).abs()
    worst = (err / tol).max().item()
    if worst > 1:
        i = int((err / tol).flatten().argmax())
        raise AssertionError(f"{name}: error {err.flatten()[i].item():.3g} at flat index {i} ({got.flatten()[i].item():g} vs "
                             f"{ref.flatten()[i].item():g}) is {worst:.2f}x the tolerance")  # fmt: skip


def run_op(x, qw, bias=None) -> torch.Tensor:
    """The registered op on a poisoned output."""
    out = poison_(torch.empty(x.shape[0], qw.N, dtype=x.dtype, device=DEVICE))
    w4.ops.w4a16_gemm(out, x, qw.qweight, qw.scales, qw.zeros, qw.perm, bias, qw.group_size)
    return out


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

if DEVICE == "cuda":  # Llama-3 8B projections (QKV, O, gate/up, down) and off-tile sizes
    SIZES = [(1, 6144, 4096), (7, 4096, 4096), (16, 28672, 4096), (33, 4096, 14336), (64, 1000, 4096),
             (65, 6144, 4096), (300, 4096, 4096), (1024, 14336, 4096), (129, 1000, 2048)]  # fmt: skip
else:  # the interpreter runs numpy per program: small shapes, the same branches (M = 1 FMA, dot M tiles, tiled)
    SIZES = [(1, 72, 256), (5, 40, 384), (33, 64, 256), (70, 48, 256)]
QUANT = [(128, False), (32, True), (-1, False), (64, True)]


@pytest.mark.parametrize("M, N, K", SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("group_size, zero_point", QUANT, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_w4a16_gemm(M, N, K, group_size, zero_point, dtype):
    x, qw, _ = make(M, N, K, dtype, group_size, zero_point, seed=M + N + K)
    out = run_op(x, qw)
    assert_gemm_close(out, reference(x, qw), f"{dtype} G{group_size} zp={zero_point}")
    assert torch.equal(w4.w4a16_gemm(x, qw), out), "the public function and the op differ"


@pytest.mark.kernels_ci
def test_w4a16_gemm_ci():
    test_w4a16_gemm(*SIZES[1], 128, False, torch.bfloat16)


@pytest.mark.parametrize("M", [1, 9, 80])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_and_act_order(M, dtype):
    """A bias in x's dtype or fp32, and an act-order permutation of the input columns."""
    N, K = (4096, 4096) if DEVICE == "cuda" else (48, 256)
    x, qw, b = make(M, N, K, dtype, 64, True, seed=3, act_order=True, bias=True)
    assert_gemm_close(w4.w4a16_gemm(x, qw, b), reference(x, qw, b), "bias + act order")
    b32 = b.float() * 3
    assert_gemm_close(w4.w4a16_gemm(x, qw, b32), reference(x, qw, b32), "fp32 bias")


def test_k_off_the_tile():
    """K = 200 with one group per channel (K % 8 == 0, not a multiple of the 64 / 128 K steps):
    the masked K tail in both kernels."""
    for M in (1, 4, 100):
        x, qw, _ = make(M, 24, 200, torch.float16, -1, True, seed=M)
        assert_gemm_close(w4.w4a16_gemm(x, qw), reference(x, qw), f"K 200, M {M}")


def test_leading_dims_non_contiguous_x_and_empty():
    N, K = (1000, 4096) if DEVICE == "cuda" else (40, 256)
    _, qw, _ = make(1, N, K, torch.bfloat16, 128, False, seed=4)
    x = torch.randn(K, 2, 3, device=DEVICE).bfloat16().permute(1, 2, 0)  # [2, 3, K], K strided
    got = w4.w4a16_gemm(x, qw)
    assert got.shape == (2, 3, N)
    assert_gemm_close(got.reshape(6, N), reference(x.reshape(6, K), qw), "non-contiguous x")
    x_strided = torch.randn(5, 2 * K, device=DEVICE).bfloat16()[:, ::2]  # unit-free last stride, no copy
    assert_gemm_close(w4.w4a16_gemm(x_strided, qw), reference(x_strided, qw), "strided x")
    assert w4.w4a16_gemm(x[:, :0], qw).shape == (2, 0, N)
    empty_n = w4.QuantizedWeight(qw.qweight[:0], qw.scales[:, :0].contiguous(), None, None, qw.group_size)
    assert w4.w4a16_gemm(x, empty_n).shape == (2, 3, 0)


@pytest.mark.skipif(not TRITON, reason="the Triton kernels' tile configurations")
@pytest.mark.parametrize(
    "cfg, group_size",
    [({"kernel": "splitk", "BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "USE_DOT": False}, 128),
     ({"kernel": "splitk", "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 3, "USE_DOT": False}, 32),
     ({"kernel": "splitk", "BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_K": 3, "USE_DOT": False}, 64),
     ({"kernel": "splitk", "BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 2, "USE_DOT": False}, -1),
     ({"kernel": "splitk", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 5}, 64),
     ({"kernel": "splitk", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2}, -1),
     ({"kernel": "splitk", "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 4}, 32),
     ({"kernel": "tiled", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 2}, 128),
     ({"kernel": "tiled", "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 4}, 32),
     ({"kernel": "tiled", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 2}, 64),
     ({"kernel": "tiled", "BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 256, "GROUP_M": 1}, -1)],
    ids=lambda v: "-".join(f"{k.removeprefix('BLOCK_')}{v}" for k, v in v.items()) if isinstance(v, dict) else f"G{v}",
)  # fmt: skip
@pytest.mark.parametrize("zero_point", [False, True])
def test_tile_configs(cfg, group_size, zero_point):
    """Every kernel, K split and group / K-step relation the launcher can pick (steps inside a
    group, steps spanning several groups, per-channel; uneven splits; tiles past M and N; M = 1
    FMA and tl.dot tiles), each called twice: the split-K counters must be left reset."""
    kern = w4._triton_kernels()
    M, N, K = (37, 300, 1024) if DEVICE == "cuda" else (19, 72, 384)
    if cfg.get("BLOCK_M") == 1:
        M = 1
    x, qw, b = make(M, N, K, torch.bfloat16, group_size, zero_point, seed=5, act_order=group_size == 64, bias=True)
    ref = reference(x, qw, b)
    for _ in range(2):
        out = poison_(torch.empty(M, N, dtype=x.dtype, device=DEVICE))
        kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size,
                          cfg={**cfg, "num_warps": 4, "num_stages": 2})  # fmt: skip
        assert_gemm_close(out, ref, str(cfg))


MMA = DEVICE == "cuda" and hasattr(w4.ops, "w4a16_mma")


def launched_kernels(fn) -> list[str]:
    """Names of the CUDA kernels `fn` launches (torch.profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("warps", [4, 8])
def test_mma_kernel_x_ahead_and_not(warps):
    """At M <= 8 with one row tile the launcher fetches x a window ahead when the grid fits at
    16 warps an SM, else not (w4a16_mma.cu launch_shape): both sides of that line, one block
    either side of it, against the reference. The register kernel's rule: RING off (on sm90 the
    ring would take these N)."""
    kern = w4._triton_kernels()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    resident = sms * (16 // warps)  # blocks of 16 rows at 16 warps an SM
    cfg = {"kernel": "mma", "SPLIT_K": 1, "num_warps": warps, "ROW_TILES": 1, "RING": False}
    for N in (16 * resident, 16 * resident + 16):
        for M in (1, 8):
            x, qw, b = make(M, N, 256, torch.bfloat16, 128, M == 8, seed=N + M, bias=True)
            out = poison_(torch.empty(M, N, dtype=x.dtype, device=DEVICE))
            kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=cfg)
            assert_gemm_close(out, reference(x, qw, b), f"mma M={M} N={N} warps={warps}")


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("split, warps, row_tiles", [(1, 4, 1), (3, 4, 2), (2, 8, 1), (5, 8, 2), (8, 4, 2), (1, 8, 2)])
@pytest.mark.parametrize("group_size, zero_point", [(128, False), (32, True), (-1, True), (64, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_kernel(split, warps, row_tiles, group_size, zero_point, dtype):
    """The compiled small-M kernel at every instantiated launch shape: M across its n8 tiles
    (1, 8 | 9, 16 | 17, 32), N off the 16- and 32-row blocks, uneven and windows-per-warp-short
    K splits,
    every group size it takes; each launch twice (the split-K counters must be left reset) on a
    poisoned output, with a bias."""
    kern = w4._triton_kernels()
    N, K = 300, 1024
    cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": warps, "ROW_TILES": row_tiles}
    for M in (1, 8, 9, 16, 17, 32):
        x, qw, b = make(M, N, K, dtype, group_size, zero_point, seed=M + split, bias=M % 2 == 1)
        ref = reference(x, qw, b)
        for _ in range(2):
            out = poison_(torch.empty(M, N, dtype=dtype, device=DEVICE))
            kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=cfg)
            assert_gemm_close(out, ref, f"mma M={M} {cfg}")


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("split, warps, row_tiles", [(1, 4, 1), (1, 8, 2), (2, 4, 2), (3, 8, 1), (5, 4, 2)])
@pytest.mark.parametrize("group_size, zero_point", [(128, False), (32, True), (-1, True), (64, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_ring_matches_register_kernel(split, warps, row_tiles, group_size, zero_point, dtype):
    """On sm90 code the weights stream through a per-warp ring of TMA boxes where the copy engine
    can address the tensors (N % 8 == 0, with zeros N % 16 == 0), at every M (x's window in the
    ring at M = 1, from L1 above: one, two and four token tiles): the same work split and
    summation order as the register kernel, so the same bits, and both against the reference.
    A K split of 2 sums its slices in a thread-block cluster on the ring (global partials in the
    register kernel), in the same order. N = 304 ends in half a 32-row tile (boxes past N read
    zeros); 296 with zeros (not a multiple of 16) and 300 take the register kernel either way,
    as does sm80 (the profiler checks which kernel ran). K = 4096: 32 windows, so the warps of the unsplit launches refill their two
    stages several times."""
    kern = w4._triton_kernels()
    K = 4096
    hopper = torch.cuda.get_device_capability(0) >= (9, 0)
    for N in (304, 296, 300):
        for M in (1, 2, 8, 9, 16, 17, 32):
            x, qw, b = make(M, N, K, dtype, group_size, zero_point, seed=N + M + split, bias=M % 2 == 1)
            ref = reference(x, qw, b)
            outs = {}
            for ring in (True, False):
                cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": warps, "ROW_TILES": row_tiles, "RING": ring}
                for _ in range(2):  # the split-K counters must be left reset
                    out = poison_(torch.empty(M, N, dtype=dtype, device=DEVICE))
                    kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=cfg)
                    assert_gemm_close(out, ref, f"mma M={M} N={N} {cfg}")
                outs[ring] = out
            assert torch.equal(outs[True], outs[False]), f"ring and register kernel differ: M={M} N={N} {cfg}"
            if M in (1, 16):
                cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": warps, "ROW_TILES": row_tiles}
                ran = launched_kernels(lambda: kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out,
                                                                 qw.group_size, cfg=cfg))  # fmt: skip
                ring_expected = hopper and N % (16 if zero_point else 8) == 0
                assert any("w4a16_ring_kernel" in k for k in ran) == ring_expected, (M, N, zero_point, ran)


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("zero_point", [False, True])
def test_early_weights_same_bits(zero_point):
    """w4a16_gemm(..., early_weights=True) (the first weights read before the wait on the
    previous kernel) gives the bits of the default at every M the small-M kernel takes (the ring
    on sm90 ignores it; the register kernel where the ring cannot run), and past it (the flag is
    ignored there), and
    a cached launch plan of one setting never serves the other."""
    kern = w4._triton_kernels()
    for M in (1, 3, 16, 32, 40):
        x, qw, b = make(M, 4096, 2048, torch.bfloat16, 128, zero_point, seed=70 + M, bias=True)
        for _ in range(2):  # the second call of each runs from its cached plan
            plain = w4.w4a16_gemm(x, qw, b)
            early = w4.w4a16_gemm(x, qw, b, early_weights=True)
            assert torch.equal(plain, early), f"M={M}"
        assert_gemm_close(early, reference(x, qw, b), f"early weights M={M}")
        if M <= 32:  # the small-M kernel's plans: one per setting, each passing its own flag
            plans = {k[-1]: p for k, p in kern._COMPILED_PLANS.items()
                     if (k[1], k[2], k[3], k[7]) == (x.shape, x.stride(), 4096, zero_point)}  # fmt: skip
            assert set(plans) == {False, True} and all(p.args[-1] is flag for flag, p in plans.items()), plans


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_residual_same_bits_as_torch_add(dtype):
    """w4a16_gemm(x, qw, b, residual=r) is ``r + w4a16_gemm(x, qw, b)`` bit for bit at every M
    (on CUDA the small-M kernel adds r in its epilogue up to 32 tokens, the Hopper / Triton
    kernels leave it to a torch add past that; on CPU the reference path), with leading
    dimensions, a non-contiguous residual, rows of a stride-0 (expanded) one, and M = 0; the
    second call of each runs from the cached launch plan."""
    N, K = (4096, 2048) if DEVICE == "cuda" else (48, 256)
    for M in ((0, 1, 3, 16, 17, 32, 40, 300) if DEVICE == "cuda" else (0, 1, 5, 33)):
        x, qw, b = make(M, N, K, dtype, 128, M % 2 == 1, seed=90 + M, bias=M % 3 == 1)
        g = gen(M)
        r = torch.randn(M, N, generator=g).to(dtype).to(DEVICE)
        residuals = {"contiguous": r, "transposed": r.t().contiguous().t(),
                     "expanded": r[:1].expand(M, N) if M else r}  # fmt: skip
        for name, res in residuals.items():
            for _ in range(2):
                got = w4.w4a16_gemm(x, qw, b, residual=res)
                assert_fully_written(got, f"residual M={M} {name}")
                assert torch.equal(got, res + w4.w4a16_gemm(x, qw, b)), f"M={M} {name}"
        x3, r3 = x.view(1, M, K), r.view(1, M, N)
        assert torch.equal(w4.w4a16_gemm(x3, qw, b, residual=r3), r3 + w4.w4a16_gemm(x3, qw, b)), f"M={M} 3-D"


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("split, warps, row_tiles, ring", [(1, 8, 1, True), (1, 4, 2, False), (2, 4, 2, True),
                                                           (2, 8, 1, False), (3, 8, 2, True), (5, 4, 1, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_residual_epilogue(split, warps, row_tiles, ring, dtype):
    """The small-M kernel's residual epilogue on every reduction path (no split, the ring's
    cluster split of 2, global partials at 2 on the register kernel and at 3 and 5), M across its
    token tiles, N off the row blocks (304: the ring; 300: the register kernel), on poisoned
    outputs: the bits of the plain launch plus a torch add."""
    kern = w4._triton_kernels()
    K = 2048
    cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": warps, "ROW_TILES": row_tiles, "RING": ring}
    for N in (304, 300):
        for M in (1, 8, 9, 16, 17, 32):
            x, qw, b = make(M, N, K, dtype, 128, M % 2 == 0, seed=N + M + split, bias=M % 3 == 0)
            r = (4 * torch.randn(M, N, generator=gen(M + N))).to(dtype).to(DEVICE)
            plain = poison_(torch.empty(M, N, dtype=dtype, device=DEVICE))
            kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, plain, qw.group_size, cfg=cfg)
            for _ in range(2):  # the split-K counters must be left reset
                out = poison_(torch.empty(M, N, dtype=dtype, device=DEVICE))
                kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=cfg,
                                  residual=r)  # fmt: skip
                assert_fully_written(out, f"residual M={M} N={N}")
                assert torch.equal(out, plain + r), f"M={M} N={N} {cfg}"


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("ring", [True, False])
def test_mma_residual_is_one_kernel(ring):
    """With a residual the small-M kernel is the only kernel launched (the profiler; a separate
    test because the profiler does not run under compute-sanitizer)."""
    kern = w4._triton_kernels()
    for M, split in ((1, 1), (16, 2), (16, 3)):
        cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": 4, "ROW_TILES": 2, "RING": ring}
        x, qw, b = make(M, 304, 2048, torch.bfloat16, 128, False, seed=M + split, bias=True)
        r = torch.randn(M, 304, generator=gen(M)).bfloat16().to(DEVICE)
        out = torch.empty(M, 304, dtype=torch.bfloat16, device=DEVICE)
        ran = launched_kernels(lambda: kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out,
                                                         qw.group_size, cfg=cfg, residual=r))  # fmt: skip
        assert len(ran) == 1 and "w4a16" in ran[0], (M, split, ran)


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
def test_mma_inputs_it_copies_or_gathers():
    """Act order (x gathered by perm), a strided x, an x not 16-byte aligned, an fp32 bias, a
    single window (K = 128) and an output with a row stride > N, through the default dispatch."""
    kern = w4._triton_kernels()
    x, qw, b = make(5, 4096, 4096, torch.bfloat16, 128, True, seed=40, act_order=True, bias=True)
    assert kern.select_config(5, 4096, 4096, 128, x)["kernel"] == "mma"
    assert_gemm_close(w4.w4a16_gemm(x, qw, b.float()), reference(x, qw, b.float()), "act order, fp32 bias")
    _, qw, _ = make(1, 4096, 4096, torch.bfloat16, 128, False, seed=41)
    wide = torch.randn(6, 4096 + 3, device=DEVICE).bfloat16()
    for name, xs in (("strided rows", wide[:, :4096]), ("unaligned", wide[:, 1:4097]), ("column view", wide.t().contiguous().t()[:, :4096])):
        assert_gemm_close(w4.w4a16_gemm(xs, qw), reference(xs, qw), name)
    x1, qw1, _ = make(3, 40, 128, torch.float16, 32, True, seed=42)
    out = poison_(torch.empty(3, 64, dtype=torch.float16, device=DEVICE))[:, :40]
    kern.launch_w4a16(x1, qw1.qweight, qw1.scales, qw1.zeros, None, None, out, 32,
                      cfg={"kernel": "mma", "SPLIT_K": 1, "num_warps": 4, "ROW_TILES": 2})  # fmt: skip
    assert_gemm_close(out, reference(x1, qw1), "K = 128, out row stride 64")


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
def test_mma_refuses_what_it_cannot_run():
    """A forced 'mma' launch outside its range raises naming the limits; the compiled op's own
    checks name the argument (direct torch.ops callers)."""
    kern = w4._triton_kernels()
    cfg = {"kernel": "mma", "SPLIT_K": 1, "num_warps": 4, "ROW_TILES": 1}
    for M, K, G in ((33, 256, 128), (4, 200, -1), (4, 256, 16)):
        x, qw, _ = make(M, 32, K, torch.bfloat16, G, False, seed=43) if G != 16 else (None, None, None)
        if G == 16:
            x = torch.randn(M, K, device=DEVICE).bfloat16()
            qw = w4.QuantizedWeight(torch.zeros(32, K // 8, dtype=torch.int32, device=DEVICE),
                                    torch.ones(K // 16, 32, dtype=torch.bfloat16, device=DEVICE), None, None, 16)  # fmt: skip
        out = torch.empty(M, 32, dtype=torch.bfloat16, device=DEVICE)
        with pytest.raises(ValueError, match="the compiled 'mma' kernel cannot run"):
            kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, None, out, qw.group_size, cfg=dict(cfg))
        assert kern.select_config(M, 32, K, qw.group_size, x)["kernel"] != "mma"
    x, qw, _ = make(4, 32, 256, torch.bfloat16, 128, False, seed=44)
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE)
    counters = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    op = w4.ops.w4a16_mma
    with pytest.raises(RuntimeError, match="scales: expected a contiguous BFloat16 .2, 32. tensor, got Half"):
        op(out, x, qw.qweight, qw.scales.half(), None, None, 128, 1, 4, 1, counters)
    with pytest.raises(RuntimeError, match="group_size: expected -1 or a power of two >= 32 dividing K = 256, got 16"):
        op(out, x, qw.qweight, qw.scales, None, None, 16, 1, 4, 1, counters)
    with pytest.raises(RuntimeError, match="w4a16_mma: warps must be 4 or 8, row_tiles 1 or 2"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 1, 4, 3, counters)
    with pytest.raises(RuntimeError, match="w4a16_mma: split_k must be in 1 .. k / 128"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 3, 4, 1, counters)
    with pytest.raises(RuntimeError, match="w4a16_mma: split_k > 1 needs partials and counters"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 2, 4, 1, None)


WGMMA = MMA and hasattr(w4.ops, "w4a16_wgmma") and torch.cuda.get_device_capability(0) == (9, 0)


@pytest.mark.skipif(not WGMMA, reason="the compiled Hopper kernel (CUDA build, capability 9.0)")
@pytest.mark.parametrize("tile, split", [((128, 256), 1), ((128, 128), 3), ((128, 64), 1), ((128, 64), 4), ((128, 256), 2),
                                         ((128, 64), 8), ((128, 256), 3), ((128, 256), 8), ((128, 256), 0),
                                         ((128, 128), 0), ((128, 64), 0), ((64, 256), 1), ((64, 256), 2),
                                         ((64, 256), 3), ((64, 256), 0)])  # fmt: skip
@pytest.mark.parametrize("group_size, zero_point", [(128, False), (32, True), (-1, True), (64, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgmma_kernel(tile, split, group_size, zero_point, dtype):
    """The compiled Hopper kernel at each block tile (the 64-row one: one warpgroup a block): M
    off and on the token tiles (33, 64, 300), N a multiple of 16 off the 128- and 64-row tiles, K splits (2-8 blocks: a cluster at the 256-token
    tile, global partials at the others; 3 uneven; 0 stream-K, where at these sizes a tile's 16
    steps are shared by up to 16 blocks of one or two steps), every group size it takes; each
    launch twice on a poisoned output, with a bias; a split's result the same bits both times
    (its slices summed in a fixed order)."""
    kern = w4._triton_kernels()
    N, K = 1040, 1024
    cfg = {"kernel": "wgmma", "BLOCK_N": tile[0], "BLOCK_M": tile[1], "SPLIT_K": split}
    for M in (33, 64, 300):
        x, qw, b = make(M, N, K, dtype, group_size, zero_point, seed=M + split, bias=M % 2 == 1)
        ref = reference(x, qw, b)
        outs = []
        for _ in range(2):
            out = poison_(torch.empty(M, N, dtype=dtype, device=DEVICE))
            kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=cfg)
            assert_gemm_close(out, ref, f"wgmma M={M} {cfg}")
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), f"wgmma M={M} {cfg}: two runs differ"


@pytest.mark.skipif(not WGMMA, reason="the compiled Hopper kernel (CUDA build, capability 9.0)")
def test_wgmma_inputs_it_copies_or_gathers():
    """Through the default dispatch (the Hopper kernel past M = 32): act order with an fp32 bias,
    strided / unaligned x, a single K step (K = 64) and an output with a row stride > N."""
    kern = w4._triton_kernels()
    x, qw, b = make(100, 4096, 4096, torch.bfloat16, 128, True, seed=50, act_order=True, bias=True)
    assert kern.select_config(100, 4096, 4096, 128, x)["kernel"] == "wgmma"
    assert_gemm_close(w4.w4a16_gemm(x, qw, b.float()), reference(x, qw, b.float()), "act order, fp32 bias")
    _, qw, _ = make(1, 256, 1024, torch.bfloat16, 128, False, seed=51)
    wide = torch.randn(70, 1024 + 3, device=DEVICE).bfloat16()
    for name, xs in (("strided rows", wide[:, :1024]), ("unaligned", wide[:, 1:1025])):
        assert_gemm_close(w4.w4a16_gemm(xs, qw), reference(xs, qw), name)
    x1, qw1, _ = make(40, 48, 64, torch.float16, 32, True, seed=52)
    out = poison_(torch.empty(40, 64, dtype=torch.float16, device=DEVICE))[:, :48]
    kern.launch_w4a16(x1, qw1.qweight, qw1.scales, qw1.zeros, None, None, out, 32,
                      cfg={"kernel": "wgmma", "BLOCK_N": 128, "BLOCK_M": 64, "SPLIT_K": 1})  # fmt: skip
    assert_gemm_close(out, reference(x1, qw1), "K = 64, out row stride 64")
    x1, qw1, _ = make(1, 256, 1024, torch.bfloat16, 128, True, seed=53)  # M = 1, forced: the binding's one-row stride
    out = poison_(torch.empty(1, 256, dtype=torch.bfloat16, device=DEVICE))
    kern.launch_w4a16(x1, qw1.qweight, qw1.scales, qw1.zeros, None, None, out, 128,
                      cfg={"kernel": "wgmma", "BLOCK_N": 128, "BLOCK_M": 64, "SPLIT_K": 2})  # fmt: skip
    assert_gemm_close(out, reference(x1, qw1), "M = 1, split 2")
    xb = x1.expand(70, 1024)  # row stride 0: copied first
    assert_gemm_close(w4.w4a16_gemm(xb, qw1), reference(xb, qw1), "an expanded x")
    xs = wide[:, :1024]
    odd = poison_(torch.empty(70, 264, dtype=torch.bfloat16, device=DEVICE))[:, 3:259]  # 6 bytes off 16
    w4.ops.w4a16_gemm(odd, xs, qw.qweight, qw.scales, qw.zeros, qw.perm, None, qw.group_size)
    assert_gemm_close(odd, reference(xs, qw), "an unaligned output view (a Triton kernel takes it)")


@pytest.mark.skipif(not WGMMA, reason="the compiled Hopper kernel (CUDA build, capability 9.0)")
@pytest.mark.parametrize("M, N, K, tokens, rows", [(1024, 4096, 256, 64, 128), (600, 2048, 512, 256, 128),
                                                   (40, 48, 64, 64, 128), (256, 6144, 4096, 256, 128),
                                                   (256, 10240, 1024, 128, 128), (600, 2000, 512, 256, 64)])  # fmt: skip
def test_wgmma_stream_k(M, N, K, tokens, rows):
    """Stream-K (SPLIT_K 0) where a block's run spans several whole tiles (4 steps a tile: 2048
    steps on 264 blocks), whole tiles and partials mixed (M = 600 on the 256-token tile), fewer
    steps than blocks (one tile of one step: one block), and the wave-quantized shapes it is for
    (8B QKV at M = 256: 48 tiles of 64 steps on 132 blocks), and the one-warpgroup 64-row tile
    with N off its rows (2000); on a poisoned output, twice, the same bits both times, the
    counters left zero."""
    kern = w4._triton_kernels()
    x, qw, b = make(M, N, K, torch.bfloat16, 64 if K < 128 else 128, True, seed=M + K, bias=True)
    ref = reference(x, qw, b)
    cfg = {"kernel": "wgmma", "BLOCK_N": rows, "BLOCK_M": tokens, "SPLIT_K": 0}
    outs = []
    for _ in range(2):
        out = poison_(torch.empty(M, N, dtype=torch.bfloat16, device=DEVICE))
        kern.launch_w4a16(x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, out, qw.group_size, cfg=dict(cfg))
        assert_gemm_close(out, ref, f"stream-K M={M} N={N} K={K} tokens={tokens} rows={rows}")
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "stream-K: two runs differ"
    assert not kern._COUNTERS[x.device].any(), "stream-K left a counter non-zero"


@pytest.mark.skipif(not WGMMA, reason="the compiled Hopper kernel (CUDA build, capability 9.0)")
def test_wgmma_refuses_what_it_cannot_run():
    """A forced 'wgmma' launch outside its range raises naming the limits (N % 16, K % 64), and
    the default dispatch takes a Triton kernel there; the op's own checks name the argument."""
    kern = w4._triton_kernels()
    cfg = {"kernel": "wgmma", "BLOCK_N": 128, "BLOCK_M": 64, "SPLIT_K": 1}
    for M, N, K in ((40, 40, 256), (40, 32, 96)):
        x, qw, _ = make(M, N, K, torch.bfloat16, 32, False, seed=53)
        out = torch.empty(M, N, dtype=torch.bfloat16, device=DEVICE)
        with pytest.raises(ValueError, match="the compiled 'wgmma' kernel cannot run"):
            kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, None, out, 32, cfg=dict(cfg))
        assert kern.select_config(M, N, K, 32, x)["kernel"] not in ("mma", "wgmma")
    x, qw, _ = make(40, 32, 256, torch.bfloat16, 128, False, seed=54)
    out = torch.empty(40, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="must be one of"):
        kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, None, out, 128, cfg={**cfg, "BLOCK_M": 32})
    op = w4.ops.w4a16_wgmma
    counters = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"tile: expected 0 \(128 x 256\), 1 \(128 x 128\), 2 \(128 x 64\) or 3 \(64 x 256\), got 4"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 4, 1, None)
    with pytest.raises(RuntimeError, match=r"w4a16_wgmma: split_k must be 0 \(stream-K\) or in 1 .. min\(k / 64, 8\)"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 0, 5, None)  # K = 256: 4 steps
    with pytest.raises(RuntimeError, match=r"w4a16_wgmma: split_k must be 0 \(stream-K\) or in 1 .. min\(k / 64, 8\)"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 0, -1, None)
    with pytest.raises(RuntimeError, match=r"w4a16_wgmma: stream-K \(split_k 0\) needs partials and counters"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 0, 0, None)
    x9, qw9, _ = make(40, 32, 1024, torch.bfloat16, 128, False, seed=55)
    with pytest.raises(RuntimeError, match=r"w4a16_wgmma: split_k must be 0 \(stream-K\) or in 1 .. min\(k / 64, 8\)"):
        op(out, x9, qw9.qweight, qw9.scales, None, None, 128, 0, 9, None)  # past a portable cluster
    with pytest.raises(RuntimeError, match="w4a16_wgmma: split_k > 1 with the 128- / 64-token tile needs partials and counters"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 2, 2, None)
    with pytest.raises(RuntimeError, match="counters: expected a contiguous int32 tensor of >= 1 zeros"):
        op(out, x, qw.qweight, qw.scales, None, None, 128, 2, 2, counters[:0])
    op(out, x, qw.qweight, qw.scales, None, None, 128, 0, 2, None)  # the 256-token tile's split: a cluster, no counters
    assert_gemm_close(out, reference(x, qw), "128 x 256, split 2 (a cluster)")


@pytest.mark.skipif(not TRITON, reason="the Triton launcher's configuration")
def test_wgmma_config():
    """The Hopper kernel's default launch (wgmma_config): from M = 256 the 256-token tile,
    unsplit where its tiles fill their waves, split into clusters of 2-3 blocks that fill one
    wave, stream-K (0) where that is out of reach and each SM's run is >= 32 steps, else the
    best-filling split; below, 128 / 64 tokens with K splits of 4 or 2 within the SMs' blocks
    (plain Python: runs anywhere)."""
    kern = w4._triton_kernels()
    pick = lambda M, N, K: tuple(kern.wgmma_config(M, N, K, 132)[k] for k in ("BLOCK_M", "SPLIT_K"))  # noqa: E731
    assert pick(64, 4096, 4096) == (64, 4)       # 32 tiles
    assert pick(64, 28672, 4096) == (64, 1)      # 224 tiles
    assert pick(128, 6144, 4096) == (128, 4)
    assert pick(128, 4096, 1024) == (128, 1)     # 16 steps of 64: no slices shorter than 16
    assert pick(256, 6144, 4096) == (256, 2)     # 48 tiles: 96 blocks (stream-K: 23 steps an SM)
    assert pick(256, 4096, 4096) == (256, 3)     # 32 tiles: 96 blocks
    assert pick(256, 8192, 8192) == (256, 2)     # 64 tiles: 128 blocks fill the wave
    assert pick(256, 10240, 8192) == (256, 0)    # 80 tiles: no split fills the wave; stream-K, 78 steps an SM
    assert pick(256, 28672, 4096) == (256, 0)    # 224 tiles: 1.7 waves
    assert pick(256, 4096, 14336) == (256, 0)    # 32 tiles of 224 steps
    assert pick(1024, 6144, 4096) == (256, 0)    # 192 tiles: 1.45 waves
    assert pick(1024, 4096, 4096) == (256, 1)    # 128 tiles: one wave
    assert pick(256, 4096, 2048) == (256, 2)     # 32 steps: slices of >= 16
    assert pick(256, 1024, 1024) == (256, 1)     # 8 tiles of 16 steps: no slice < 16, stream-K's runs of 1 step
    assert pick(4096, 8192, 28672) == (256, 1)
    assert all(kern.wgmma_config(M, 4096, 4096)["BLOCK_N"] == 128 for M in (33, 300, 5000))


@pytest.mark.skipif(not TRITON, reason="the Triton launcher's configuration")
def test_config_dispatch():
    """The kernel by M (the split-K kernel up to SMALL_M_MAX rows, FMA at M = 1), BLOCK_K never
    straddling a group of >= 64, and the K split bounded by the K steps."""
    kern = w4._triton_kernels()
    assert kern.w4a16_config(1, 4096, 4096, 128)["USE_DOT"] is False
    assert kern.w4a16_config(kern.SMALL_M_MAX, 4096, 4096, 128)["kernel"] == "splitk"
    assert kern.w4a16_config(kern.SMALL_M_MAX + 1, 4096, 4096, 128)["kernel"] == "tiled"
    for G in (32, 64, 128, -1):
        cfg = kern.w4a16_config(16, 4096, 4096, G)
        Ge = 4096 if G == -1 else G
        assert Ge % cfg["BLOCK_K"] == 0 or cfg["BLOCK_K"] % Ge == 0
        assert 1 <= cfg["SPLIT_K"] <= 4096 // cfg["BLOCK_K"]


# ---------------------------------------------------------------------------------------------
# The tuning table (_tuning.py, written by benchmarks/tune.py on a GPU) and its lookup
# ---------------------------------------------------------------------------------------------


def _submodule(name: str):
    from importlib import import_module

    return import_module(f"{w4.__name__}.{name}")


def test_tuning_table_is_well_formed():
    """Every committed entry: a (gpu, dtype, N, K, group_size) key, increasing M buckets of the
    tuned set, each entry a valid launch or None."""
    cfg_mod, tuning = _submodule("_config"), _submodule("_tuning")
    cfg_mod.check_table(tuning.TABLE)
    assert (tuning.MADE_BY is None) == (not tuning.TABLE), "MADE_BY records the command that wrote the table"


def test_tuning_entries_round_trip_and_bad_entries():
    c = _submodule("_config")
    for entry in (["splitk", 1, 64, 128, 6, 4, 3], ["splitk", 16, 32, 256, 1, 4, 2], ["tiled", 128, 128, 128, 8, 8, 3],
                  ["mma", 3, 8, 2], ["mma", 3, 8, 2, 0], ["mma", 1, 4, 1, 1], ["wgmma", 128, 256, 1],
                  ["wgmma", 128, 64, 4], ["wgmma", 128, 256, 0], ["wgmma", 64, 256, 2]):  # fmt: skip
        cfg = c.config_of(entry)
        assert c.entry_of(cfg) == entry
        assert cfg.get("USE_DOT", True) is (entry[0] != "splitk" or entry[1] > 1)
    bad = [["splitk", 8, 64, 128, 2, 4, 3], ["tiled", 1, 64, 128, 8, 4, 3], ["tiled", 64, 48, 128, 8, 4, 3],
           ["tiled", 64, 64, 64, 8, 4, 3],
           ["splitk", 1, 64, 128, 0, 4, 3], ["gemv", 1, 64, 128, 2, 4, 3], ["splitk", 1, 64, 128, 2, 4],
           ["splitk", 1, 64, 128.0, 2, 4, 3], ["mma", 2, 3, 1], ["mma", 2, 4, 4], ["mma", 0, 4, 1], ["mma", 2, 4],
           ["mma", 2, 4, 1, 2], ["mma", 2, 4, 1, True], ["mma", 2, 4, 1, 0, 1],
           ["wgmma", 256, 128, 1], ["wgmma", 64, 128, 1], ["wgmma", 128, 64, -1], ["wgmma", 128, 64, 9], ["wgmma", 128, 64], None]  # fmt: skip
    for entry in bad:
        with pytest.raises((ValueError, TypeError), match="tuning entry"):
            c.config_of(entry)
    with pytest.raises(ValueError, match="buckets"):
        c.check_table({("X", "bfloat16", 64, 256, 128): [(8, None), (4, None)]})
    with pytest.raises(ValueError, match="tuning key"):
        c.check_table({("X", "float32", 64, 256, 128): []})


def test_tuned_config_lookup():
    """The first bucket with M <= m_max; None (the structural default) past the last bucket, for
    a None entry, and for any other GPU, dtype, shape or group size."""
    c = _submodule("_config")
    gemv, dot, tiled = ["splitk", 1, 32, 128, 8, 4, 3], ["splitk", 16, 64, 128, 4, 4, 3], ["tiled", 64, 128, 128, 8, 4, 3]
    table = {("GPU X", "bfloat16", 6144, 4096, 128): [(1, gemv), (8, dot), (16, None), (128, tiled)]}
    look = lambda M, **kw: c.tuned_config(table, *{"gpu": "GPU X", "dtype": "bfloat16", "N": 6144, "K": 4096,  # noqa: E731
                                                    "group_size": 128, **kw}.values(), M)  # fmt: skip
    assert look(1) == c.config_of(gemv)
    assert look(2) == look(8) == c.config_of(dot)
    assert look(9) is None and look(16) is None
    assert look(17) == look(128) == c.config_of(tiled)
    assert look(129) is None and look(4096) is None
    assert look(1, gpu="GPU Y") is None and look(1, dtype="float16") is None
    assert look(1, N=4096) is None and look(1, group_size=32) is None
    assert c.tuned_config({}, "GPU X", "bfloat16", 6144, 4096, 128, 1) is None


@pytest.mark.skipif(not TRITON, reason="the Triton launcher's configuration")
def test_gemm_takes_the_table_entry(monkeypatch):
    """w4a16_gemm launches the table's entry for its key and M bucket (keyed by the GPU's name,
    "cpu" in the interpreter), the structural default elsewhere; the result is the same GEMM.
    Where the compiled small-M kernel runs (CUDA), only an "mma" entry replaces its default."""
    kern = w4._triton_kernels()
    tuning = _submodule("_tuning")
    M, N, K = 5, 88, 512  # a shape no other test launches (CUDA caches a launch plan per shape)
    key = (torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "bfloat16", N, K, 128)
    x, qw, b = make(M, N, K, torch.bfloat16, 128, False, seed=30, bias=True)
    triton_entry = ["splitk", 16, 32, 64, 3, 4, 2]
    mma = kern.mma_supported(x, M, K, 128)
    entry = ["mma", 2, 4, 2] if mma else triton_entry
    monkeypatch.setattr(tuning, "TABLE", {key: [(1, None), (8, entry)]})
    chosen = []
    select = kern.select_config

    def spy(*args):
        cfg = select(*args)
        chosen.append(dict(cfg))  # the launcher pops from the dict it gets
        return cfg

    monkeypatch.setattr(kern, "select_config", spy)
    assert_gemm_close(w4.w4a16_gemm(x, qw, b), reference(x, qw, b), "tuned entry")
    assert chosen == [_submodule("_config").config_of(entry)]
    if mma:  # a Triton entry in a bucket the compiled kernel serves: measured past its range
        monkeypatch.setattr(tuning, "TABLE", {key: [(8, triton_entry)]})
        assert select(M, N, K, 128, x) == default_config(M, N, K, 128, x), "a Triton entry where the mma kernel runs"
    assert select(1, N, K, 128, x[:1]) == default_config(1, N, K, 128, x), "a None entry: the default"
    assert select(9, N, K, 128, x) == default_config(9, N, K, 128, x), "past the last bucket: the default"
    assert select(M, N, K, 128, x.half()) == default_config(M, N, K, 128, x.half()), "another dtype: the default"


@pytest.mark.skipif(not WGMMA, reason="the Hopper kernel (capability 9.0, CUDA build)")
def test_hopper_entry_in_the_32_token_bucket(monkeypatch):
    """In the bucket of 32 tokens a Hopper ("wgmma") entry replaces the small-M kernel, which
    could also run there (tune.py measures both; M = 17 .. 32 take it); in the bucket of 16, or
    in a larger one that M = 17 falls into, it does not. A call whose output the Hopper kernel cannot store
    (a row stride not a multiple of 8) falls back to the small-M kernel, not to Triton."""
    kern = w4._triton_kernels()
    tuning = _submodule("_tuning")
    N, K = 176, 1024  # shapes no other test launches (a launch plan is cached per shape)
    key = (torch.cuda.get_device_name(0), "bfloat16", N, K, 128)
    entry = ["wgmma", 128, 64, 2]
    monkeypatch.setattr(tuning, "TABLE", {key: [(16, entry), (32, entry)]})
    for M in (17, 32):
        x, qw, b = make(M, N, K, torch.bfloat16, 128, False, seed=80 + M, bias=True)
        assert kern.select_config(M, N, K, 128, x) == _submodule("_config").config_of(entry)
        ran = launched_kernels(lambda: w4.w4a16_gemm(x, qw, b))
        assert any("wgmma" in k for k in ran), ran
        assert_gemm_close(w4.w4a16_gemm(x, qw, b), reference(x, qw, b), f"Hopper entry M={M}")
        out = poison_(torch.empty(M, N + 4, dtype=torch.bfloat16, device=DEVICE))[:, :N]
        ran = launched_kernels(lambda: kern.launch_w4a16(x, qw.qweight, qw.scales, None, None, b, out, 128))
        assert any("w4a16_mma" in k or "ring" in k for k in ran) and not any("wgmma" in k for k in ran), ran
        assert_gemm_close(out, reference(x, qw, b), f"small-M fallback M={M}")
    x16 = make(16, N, K, torch.bfloat16, 128, False, seed=79)[0]
    assert kern.select_config(16, N, K, 128, x16) == default_config(16, N, K, 128, x16), "bucket 16: the small-M kernel"
    # A key without a bucket of 32: M = 17 falls into the bucket of 64, measured where the
    # small-M kernel cannot run, so its Hopper entry does not replace it.
    monkeypatch.setattr(tuning, "TABLE", {key: [(16, None), (64, entry)]})
    x17 = make(17, N, K, torch.bfloat16, 128, False, seed=78)[0]
    assert kern.select_config(17, N, K, 128, x17) == default_config(17, N, K, 128, x17), "bucket 64: the small-M kernel"


def default_config(M, N, K, group_size, x) -> dict:
    """The structural default: the compiled small-M kernel where it can run, the Hopper kernel
    past its M where that can run, else Triton's."""
    kern = w4._triton_kernels()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 132
    if kern.mma_supported(x, M, K, group_size):
        return kern.mma_config(M, N, K, sms)
    if M > 32 and kern.wgmma_supported(x, M, N, K, group_size):
        return kern.wgmma_config(M, N, K, sms)
    return kern.w4a16_config(M, N, K, group_size, sms)


# ---------------------------------------------------------------------------------------------
# Bad input: every error names the argument, what was expected and what came, before writing
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    x, qw, _ = make(4, 32, 64, torch.bfloat16, 32, True, seed=6)
    return [
        ("x dtype", lambda: w4.w4a16_gemm(x.float(), qw), TypeError, "x: expected dtype float16 or bfloat16, got torch.float32"),
        ("x type", lambda: w4.w4a16_gemm(x.tolist(), qw), TypeError, "x: expected a torch.Tensor"),
        ("x K", lambda: w4.w4a16_gemm(x[:, :32], qw), ValueError, r"x: expected shape \[..., 64\] \(K = qw.K\), got \(4, 32\)"),
        ("x 0-d", lambda: w4.w4a16_gemm(x[0, 0], qw), ValueError, r"x: expected shape \[..., K\]"),
        ("qw type", lambda: w4.w4a16_gemm(x, qw.qweight), TypeError, "qw: expected a QuantizedWeight"),
        ("scales dtype", lambda: w4.w4a16_gemm(x.half(), qw), TypeError, r"qw.scales: expected dtype torch.float16 \(x's; convert with qw.to\(dtype=...\)\), got torch.bfloat16"),
        ("bias shape", lambda: w4.w4a16_gemm(x, qw, torch.zeros(31, device=DEVICE).bfloat16()), ValueError, r"bias: expected shape \(32,\), got \(31,\)"),
        ("bias dtype", lambda: w4.w4a16_gemm(x, qw, torch.zeros(32, device=DEVICE).half()), TypeError, "bias: expected dtype torch.bfloat16 .x's. or float32, got torch.float16"),
        ("residual dtype", lambda: w4.w4a16_gemm(x, qw, residual=torch.zeros(4, 32, device=DEVICE)), TypeError, r"residual: expected dtype torch.bfloat16 \(x's\), got torch.float32"),
        ("residual shape", lambda: w4.w4a16_gemm(x, qw, residual=torch.zeros(32, device=DEVICE).bfloat16()), ValueError, r"residual: expected shape \(4, 32\) \(the output's\), got \(32,\)"),
        ("residual type", lambda: w4.w4a16_gemm(x, qw, residual=1.0), TypeError, "residual: expected a torch.Tensor or None, got float"),
        ("raw qweight", lambda: w4.w4a16_gemm_raw(x, qw.qweight.float(), qw.scales, None, None, None, 32), ValueError, r"qw.qweight: expected an int32 tensor \[N, K / 8\]"),
        ("raw group", lambda: w4.w4a16_gemm_raw(x, qw.qweight, qw.scales, None, None, None, 48), ValueError, "qw.group_size: expected -1 or a power of two >= 16 dividing K = 64, got 48"),
        ("raw scales", lambda: w4.w4a16_gemm_raw(x, qw.qweight, qw.scales[:1], None, None, None, 32), ValueError, r"qw.scales: expected a contiguous \[2, 32\] tensor"),
        ("raw zeros", lambda: w4.w4a16_gemm_raw(x, qw.qweight, qw.scales, qw.zeros.int(), None, None, 32), ValueError, r"qw.zeros: expected a contiguous uint8 \[2, 32\] tensor"),
        ("raw perm", lambda: w4.w4a16_gemm_raw(x, qw.qweight, qw.scales, None, qw.qweight[0], None, 32), ValueError, r"qw.perm: expected a contiguous int32 \[64\] tensor"),
        ("layer K", lambda: w4.layers.W4A16Linear(60, 8), ValueError, "in_features: expected a positive multiple of 8, got 60"),
        ("layer linear", lambda: w4.layers.W4A16Linear.from_linear(qw), TypeError, "linear: expected an nn.Linear"),
    ]  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input(case):
    _, call, exc, match = case
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a second device type")
def test_bad_device():
    x, qw, _ = make(4, 32, 64, torch.bfloat16, 32, False, seed=7)
    with pytest.raises(ValueError, match=r"qw.qweight: expected device cuda:0 \(x's\), got cpu"):
        w4.w4a16_gemm(x, qw.to("cpu"))


# ---------------------------------------------------------------------------------------------
# torch.library contract, torch.compile, the layer, CUDA graphs and streams
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("zero_point, act_order, bias, early, residual",
                         [(False, False, False, False, False), (True, True, True, True, True)])
def test_opcheck(zero_point, act_order, bias, early, residual):
    x, qw, b = make(5, 48, 128, torch.bfloat16, 32, zero_point, seed=8, act_order=act_order, bias=bias)
    out = torch.empty(5, 48, dtype=torch.bfloat16, device=DEVICE)
    r = torch.randn(5, 48, generator=gen(8)).bfloat16().to(DEVICE) if residual else None
    args = (out, x, qw.qweight, qw.scales, qw.zeros, qw.perm, b, qw.group_size, early, r)
    opcheck(w4.ops.w4a16_gemm, args)
    poison_(out)
    assert_only_declared_outputs_mutate(w4.ops.w4a16_gemm, args)
    ref = reference(x, qw, b).to(out.dtype) + r if residual else reference(x, qw, b)
    if residual:  # the product rounded, then the add rounded: within an ulp of that
        torch.testing.assert_close(out, ref, rtol=2 * ULP[out.dtype], atol=1e-2)
    else:
        assert_gemm_close(out, ref, "after opcheck")


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph():
    x, qw, b = make(6, 48, 128, torch.float16, 64, True, seed=9, bias=True)
    layer = w4.layers.W4A16Linear.from_quantized(qw, b)

    def block(x):
        return w4.w4a16_gemm(x, qw) + 1, layer(x * 2), w4.w4a16_gemm(x, qw, b, residual=x[:, :48] * 3)

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    for got, expected in zip(compiled(x), block(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("zero_point", [False, True])
def test_layer_from_linear(bias, zero_point):
    """W4A16Linear.from_linear: the quantized nn.Linear; state_dict round trip into a layer built
    by the constructor; extra_repr."""
    N, K = (1024, 2048) if DEVICE == "cuda" else (40, 128)
    torch.manual_seed(10)
    lin = torch.nn.Linear(K, N, bias=bias).to(device=DEVICE, dtype=torch.bfloat16)
    layer = w4.layers.W4A16Linear.from_linear(lin, group_size=64, zero_point=zero_point)
    qw = layer.quantized_weight()
    x = torch.randn(3, 5, K, device=DEVICE).bfloat16()
    with torch.no_grad():
        got = layer(x)
    assert_gemm_close(got.reshape(15, N), reference(x.reshape(15, K), qw, lin.bias), "layer")
    sd = layer.state_dict()
    assert set(sd) == {"qweight", "scales"} | ({"zeros"} if zero_point else set()) | ({"bias"} if bias else set())
    fresh = w4.layers.W4A16Linear(K, N, bias=bias, group_size=64, zero_point=zero_point, dtype=torch.bfloat16, device=DEVICE)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(x), got)
    assert "group_size=64" in repr(layer) and ("uint4+zeros" if zero_point else "uint4b8") in repr(layer)
    assert layer.quantized_weight().nbytes() < 0.3 * lin.weight.numel() * 2


# CUDA graphs and a side stream: only on a GPU (the interpreter has neither).


@pytest.mark.skipif(not MMA, reason="the compiled small-M kernel (CUDA build)")
@pytest.mark.parametrize("split, warps, row_tiles", [(1, 8, 1), (1, 4, 2), (2, 4, 2), (3, 4, 1)])
@pytest.mark.parametrize("ring, early", [(True, False), (False, False), (False, True)],
                         ids=["ring", "registers", "registers-early-weights"])  # the ring ignores early_weights
@pytest.mark.parametrize("M", [1, 4])
def test_mma_after_the_kernel_that_writes_x(split, warps, row_tiles, ring, early, M):
    """On sm90 the kernel is a programmatic dependent launch: it starts while the previous kernel
    runs and must read x (and the split-K counters) only after that kernel completed. x comes
    from the kernel right before (a matmul, whose output it is), and a chain of four GEMMs feeds
    each one's output to the next (the previous kernel is then the kernel itself), eager and
    replayed from a CUDA graph; against the reference of each step. On sm90 with `ring` the TMA
    ring runs (x's window in its copies at M = 1, loads from global memory at M = 4; both follow
    the wait), else the register kernel.
    With early_weights the register kernel loads its first weights before the wait; x still
    after it (the weights here were written long before, as the flag promises)."""
    kern = w4._triton_kernels()
    cfg = {"kernel": "mma", "SPLIT_K": split, "num_warps": warps, "ROW_TILES": row_tiles, "RING": ring,
           "EARLY_WEIGHTS": early}  # fmt: skip
    N = K = 2048
    g = gen(31)
    a = torch.randn(M, 4096, generator=g).bfloat16().to(DEVICE)
    b = (torch.randn(4096, K, generator=g) / 64).bfloat16().to(DEVICE)
    qws = [w4.quantize((torch.randn(N, K, generator=g) / K**0.5).bfloat16().to(DEVICE), 128, False) for _ in range(4)]

    def chain():
        outs = [poison_(torch.empty(M, N, dtype=torch.bfloat16, device=DEVICE)) for _ in qws]
        xs = [torch.matmul(a, b)]  # written by the kernel right before the first GEMM
        for qw, out in zip(qws, outs):  # back to back: each GEMM's previous kernel wrote its x
            kern.launch_w4a16(xs[-1], qw.qweight, qw.scales, None, None, None, out, 128, cfg=cfg)
            xs.append(out)
        return xs

    def check(xs, name):
        for i, qw in enumerate(qws):
            assert_gemm_close(xs[i + 1], reference(xs[i], qw), f"{name} step {i} {cfg}")

    check(chain(), "eager")
    chain()  # warm-up: cuBLAS's workspace and the split-K counters exist before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xs = chain()
    for seed in (32, 33):
        a.copy_(torch.randn(M, 4096, generator=gen(seed)).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        check(xs, f"graph replay {seed}")


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("M", [1, 16, 200])
def test_cuda_graph_capture(M):
    """Captured once, replayed on new inputs: the split-K partials / counters and launch plans
    must be graph-safe (replays equal eager calls), with and without a residual."""
    x, qw, b = make(M, 4096, 4096, torch.bfloat16, 128, True, seed=11, bias=True)
    static_x, static_r = x.clone(), torch.zeros(M, 4096, dtype=torch.bfloat16, device=DEVICE)
    w4.w4a16_gemm(static_x, qw, b)  # warm-up: compiles, makes the plans
    w4.w4a16_gemm(static_x, qw, b, residual=static_r)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = w4.w4a16_gemm(static_x, qw, b)
        static_sum = w4.w4a16_gemm(static_x, qw, b, residual=static_r)
    for seed in (12, 13):
        new_x = torch.randn(M, 4096, generator=gen(seed)).bfloat16().to(DEVICE)
        new_r = torch.randn(M, 4096, generator=gen(seed + 10)).bfloat16().to(DEVICE)
        static_x.copy_(new_x)
        static_r.copy_(new_r)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, w4.w4a16_gemm(new_x, qw, b))
        assert torch.equal(static_sum, w4.w4a16_gemm(new_x, qw, b, residual=new_r))


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
def test_side_stream():
    """The op runs on the current stream: on a side stream, ordered after the producer of x."""
    x, qw, _ = make(8, 4096, 4096, torch.float16, 128, False, seed=14)
    expected = w4.w4a16_gemm(x, qw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = w4.w4a16_gemm(x, qw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, expected)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
def test_deterministic_split_k():
    """The split-K reduction adds the partials in slice order: repeated calls are bitwise equal."""
    x, qw, _ = make(4, 14336, 4096, torch.bfloat16, 128, False, seed=15)
    first = w4.w4a16_gemm(x, qw)
    for _ in range(5):
        assert torch.equal(w4.w4a16_gemm(x, qw), first)


def test_reserve_workspaces():
    """The split-K arrival counters exist, zeroed, at the reserved size before any call (what
    the fused 4-bit layer's install does so that no first call inside a compiled CUDA graph
    allocates them); a no-op off CUDA."""
    w4.reserve_workspaces("cpu")
    if DEVICE != "cuda":
        return
    kern = w4._triton_kernels()
    w4.reserve_workspaces("cuda")
    dev = torch.device("cuda", torch.cuda.current_device())
    assert kern._COUNTERS[dev].numel() >= 1 << 14
    assert not kern._COUNTERS[dev].any()
