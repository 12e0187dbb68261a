"""rope-triton's decode_attention against an fp64 reference of SDPA with grouped heads.

Loaded the way users load it (kernels.get_kernel). On a GPU the split-KV Triton kernels run; on
CPU (CI) the same kernels run in Triton's interpreter, and the plain-torch path is checked too.

Tolerance (per element): u * |ref| + u * max |v| of the sequence's K / V head, u the dtype's
unit roundoff (2^-8 bf16, 2^-11 fp16). The first term is the output's rounding; the second
bounds the probabilities' rounding to the dtype before the P.V product on the tensor cores
(each weight off by up to u relative: at most u * sum p |v| <= u * max |v|). The softmax is in
fp32. The interpreter rounds fp32 to bf16 by truncation: bf16 there gets 3u.
"""

from __future__ import annotations

import os

import kernels
import pytest
import torch
import torch.nn.functional as F

from rope_triton_testing import device, opcheck

rt = kernels.get_kernel("fused-llm/rope-triton", version=1)

DEVICE = device()
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = (torch.bfloat16, torch.float16)


def unit(dtype: torch.dtype) -> float:
    u = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    return u * (3 if dtype == torch.bfloat16 and INTERPRETED else 1)


def reference(q, k, v, mask, scale):
    """fp64: query head h over K / V head h // (H / H_kv); a row with nothing to attend is NaN."""
    B, H, _, D = q.shape
    G = H // k.shape[1]
    kk = k.double().repeat_interleave(G, 1)
    vv = v.double().repeat_interleave(G, 1)
    m = mask.reshape(mask.shape[0], 1, 1, -1).expand(B, 1, 1, -1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale
    return (s.masked_fill(~m, float("-inf")).softmax(-1) @ vv), vv


def assert_attention_close(got, q, k, v, mask, scale, name):
    ref, vv = reference(q, k, v, mask, scale)
    assert got.shape == ref.shape and got.dtype == q.dtype, f"{name}: {got.dtype}{tuple(got.shape)}"
    u = unit(q.dtype)
    vmax = vv.abs().amax(dim=(2, 3), keepdim=True)
    bound = u * ref.abs() + u * vmax
    empty = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), empty), f"{name}: NaN where a head has no slot to attend, finite elsewhere"
    err = (got.double() - ref).abs().masked_fill(empty, 0)
    worst = (err / bound.masked_fill(empty, 1)).max().item() if got.numel() else 0.0
    assert worst <= 1.0, f"{name}: error {worst:.2f}x the tolerance"


def make(B, H, H_kv, L, D, dtype, seed, mask_kind="random", valid=None):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, 1, H, D, generator=g, device=DEVICE).to(dtype).transpose(1, 2)  # [B, H, 1, D], strided
    k = torch.randn(B, H_kv, L, D, generator=g, device=DEVICE).to(dtype)
    v = torch.randn(B, H_kv, L, D, generator=g, device=DEVICE).to(dtype)
    if mask_kind == "random":
        mask = torch.rand(B, 1, 1, L, generator=g, device=DEVICE) > 0.3
        mask[..., 0] = True
    else:  # a static cache: the first `valid` slots hold tokens, one mask for the batch
        mask = torch.zeros(1, 1, 1, L, dtype=torch.bool, device=DEVICE)
        mask[..., :valid] = True
    return q, k, v, mask


# (B, H, H_kv, L, D): grouped 4 / 1 (MQA) / none; one slot; slices ending in masked slots
SHAPES = [(1, 8, 2, 200, 64, "prefix", 150), (2, 8, 2, 37, 64, "random", None), (3, 4, 4, 1, 16, "random", None),
          (1, 16, 1, 130, 32, "prefix", 70), (2, 12, 4, 300, 64, "random", None), (1, 4, 1, 300, 128, "prefix", 70)]  # fmt: skip
if not INTERPRETED:
    SHAPES += [(1, 32, 8, 592, 128, "prefix", 540), (1, 32, 8, 4160, 128, "prefix", 4128), (8, 32, 8, 2112, 128, "random", None),
               (4, 64, 8, 1000, 128, "prefix", 999), (2, 16, 16, 513, 256, "random", None)]  # fmt: skip


@pytest.mark.kernels_ci
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"-{s[5]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_attention(shape, dtype):
    B, H, H_kv, L, D, kind, valid = shape
    q, k, v, mask = make(B, H, H_kv, L, D, dtype, seed=B * 131 + L, mask_kind=kind, valid=valid)
    assert_attention_close(rt.decode_attention(q, k, v, mask), q, k, v, mask, D**-0.5, f"{shape} {dtype}")


@pytest.mark.kernels_ci
def test_matches_sdpa_and_mask_forms():
    """Against SDPA itself (its math in fp32); the 2-D mask, a shared mask and a scale give the
    same as the 4-D per-sequence form."""
    q, k, v, mask = make(2, 8, 2, 90, 64, torch.float16, seed=5)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.2, enable_gqa=True)
    got = rt.decode_attention(q, k, v, mask, scale=0.2)
    torch.testing.assert_close(got.float(), want, rtol=2**-10, atol=2**-10 * v.abs().max().item())
    torch.testing.assert_close(rt.decode_attention(q, k, v, mask[:, 0, 0, :], scale=0.2), got, rtol=0, atol=0)
    shared = mask[:1]
    torch.testing.assert_close(rt.decode_attention(q, k, v, shared), rt.decode_attention(q, k, v, shared.expand(2, 1, 1, 90)),
                               rtol=0, atol=0)  # fmt: skip


@pytest.mark.kernels_ci
def test_strided_cache_views_and_empty_rows():
    """K / V as views of a longer cache with a gap between heads; a sequence with no slot to
    attend gets NaN and leaves the other sequence's result as alone; B = 0."""
    big = torch.randn(2, 2, 160, 64, device=DEVICE).half()
    k, v = big[:, :, :120], big.flip(2)[:, :, 10:130]
    q = torch.randn(2, 8, 1, 64, device=DEVICE).half()
    mask = torch.zeros(2, 1, 1, 120, dtype=torch.bool, device=DEVICE)
    mask[1, ..., :77] = True
    got = rt.decode_attention(q, k, v, mask)
    assert torch.isnan(got[0]).all() and not torch.isnan(got[1]).any()
    assert_attention_close(got[1:], q[1:], k[1:], v[1:], mask[1:], 0.125, "sequence 1")
    empty = rt.decode_attention(q[:0], k[:0], v[:0], mask[:0])
    assert empty.shape == (0, 8, 1, 64)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_path_matches_reference(dtype):
    """The plain-torch implementation (what the CPU variant runs without the interpreter)."""
    q, k, v, mask = make(2, 8, 2, 90, 64, dtype, seed=11)
    out = torch.empty(2, 8, 1, 64, dtype=dtype, device=DEVICE)
    rt._reference.decode_attention(q, k, v, mask[:, 0, 0, :], out, 0.125)
    assert_attention_close(out, q, k, v, mask, 0.125, "torch path")


@pytest.mark.kernels_ci
@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRETED, reason="the Triton kernels (a GPU or the interpreter)")
def test_slices():
    """The cache is cut into slices of whole 64-slot blocks, about two programs an SM in all;
    one sequence and K / V head of a long cache gets several, a large batch one."""
    kern = rt._triton_kernels()
    slices, chunk = kern.decode_attention_slices(4160, 8, 132)  # Llama-3 8B, one sequence, an H100 / H200
    assert chunk % kern.DECODE_BLOCK_L == 0 and slices * chunk >= 4160 > (slices - 1) * chunk and slices == 33
    assert kern.decode_attention_slices(592, 8, 132) == (10, 64)  # the probe's best at 540 of 592 slots
    assert kern.decode_attention_slices(100, 1024, 132) == (1, 128)
    assert kern.decode_attention_slices(1, 1, 132) == (1, 64)


@pytest.mark.kernels_ci
def test_op_writes_every_element():
    q, k, v, mask = make(2, 8, 2, 150, 64, torch.bfloat16, seed=9)
    out = torch.full((2, 8, 1, 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    rt.ops.decode_attention(out, q, k, v, mask[:, 0, 0, :], 0.125)
    assert not torch.isnan(out).any()
    assert_attention_close(out, q, k, v, mask, 0.125, "op")


BAD = {
    "q dtype": (lambda q, k, v, m: (q.float(), k, v, m), TypeError, "q: expected dtype float16, bfloat16, got torch.float32"),
    "k dtype": (lambda q, k, v, m: (q, k.half(), v, m), TypeError, "k: expected dtype torch.bfloat16 (q's), got torch.float16"),
    "q rank": (lambda q, k, v, m: (q[0], k, v, m), ValueError, "q: expected a 4-D [B, H, 1, D] tensor"),
    "two queries": (lambda q, k, v, m: (q.expand(2, 8, 2, 64), k, v, m), ValueError, "q: expected one query token"),
    "head size": (lambda q, k, v, m: (q[..., :48], k[..., :48], v[..., :48], m), ValueError, "power of two in [16, 256], got 48"),
    "head stride": (lambda q, k, v, m: (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, m), ValueError, "k: the head dimension must be contiguous"),
    "groups": (lambda q, k, v, m: (q[:, :6], k[:, :1].expand(2, 4, 40, 64), v[:, :1].expand(2, 4, 40, 64), m), ValueError, "H_kv dividing q's 6 heads"),
    "v shape": (lambda q, k, v, m: (q, k, v[:, :, :39], m), ValueError, "v: expected k's shape"),
    "mask dtype": (lambda q, k, v, m: (q, k, v, m.float()), TypeError, "mask: expected dtype bool"),
    "mask shape": (lambda q, k, v, m: (q, k, v, m[..., :39]), ValueError, "mask: expected [B or 1, 1, 1, 40]"),
    "mask batch": (lambda q, k, v, m: (q, k, v, m.expand(2, 2, 1, 40)), ValueError, "mask: expected [B or 1, 1, 1, 40]"),
    "mask type": (lambda q, k, v, m: (q, k, v, [True] * 40), TypeError, "mask: expected a torch.Tensor, got list"),
    "no slots": (lambda q, k, v, m: (q, k[:, :, :0], v[:, :, :0], m[..., :0]), ValueError, "at least one cache slot"),
}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    q, k, v, mask = make(2, 8, 2, 40, 64, torch.bfloat16, seed=3)
    change, error, message = BAD[case]
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        rt.decode_attention(*change(q, k, v, mask))


@pytest.mark.kernels_ci
def test_bad_scale():
    q, k, v, mask = make(1, 4, 2, 8, 16, torch.float16, seed=4)
    with pytest.raises(ValueError, match="scale: expected a finite float or None, got inf"):
        rt.decode_attention(q, k, v, mask, scale=float("inf"))


@pytest.mark.kernels_ci
def test_opcheck():
    q, k, v, mask = make(2, 8, 2, 70, 64, torch.bfloat16, seed=6)
    out = torch.empty(2, 8, 1, 64, dtype=torch.bfloat16, device=DEVICE)
    opcheck(rt.ops.decode_attention, (out, q, k, v, mask[:, 0, 0, :], 0.125))


@pytest.mark.kernels_ci
def test_torch_compile_fullgraph():
    q, k, v, mask = make(2, 8, 2, 70, 64, torch.bfloat16, seed=7)

    def block(q, k, v, mask):
        return rt.decode_attention(q * 1, k, v, mask).transpose(1, 2) + 1

    compiled = torch.compile(block, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(q, k, v, mask), block(q, k, v, mask), rtol=0, atol=0)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs")
def test_cuda_graph_capture():
    q, k, v, mask = make(1, 32, 8, 592, 128, torch.bfloat16, seed=8, mask_kind="prefix", valid=300)
    rt.decode_attention(q, k, v, mask)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rt.decode_attention(q, k, v, mask)
    mask[..., 300:400] = True  # the static cache grows: the graph reads the new mask
    k.normal_()
    graph.replay()
    assert_attention_close(out, q, k, v, mask, 128**-0.5, "replayed")
