"""rope-triton suites for the shared harness: ``fused-llm bench rope-triton``.

1. ``rope-triton``: transformers' rotary on a Llama-3 8B layer (32 q / 8 kv heads, head_dim
   128, bf16) at 1..4096 tokens. Bytes per call: q and k read and written, cos and sin read.
   Peers: torch eager (transformers' expression), torch.compile (static shapes), Liger's
   ``LigerRopeFunction``, and a copy kernel moving the same bytes.
2. ``rope-triton-projection``: RMSNorm -> [W_q; W_k] projection (5120 x 4096) -> rotary, fused
   in one kernel, against the unfused sequence made of our RMSNorm (rmsnorm-fp8), cuBLAS
   (``F.linear``) and our in-place RoPE, and against eager / torch.compile of transformers'
   sequence. TFLOP/s = 2 M N K.
3. ``rope-triton-decode-attention``: one decode token per sequence over a static cache (Llama-3
   8B heads, bf16, a boolean mask over 64 spare slots), ``decode_attention`` against SDPA as
   the fused layers called it (grouped heads, cuDNN where SDPA picks it), SDPA's flash kernel on
   the valid slots only (no mask: a bound for a masked kernel), torch.compile of the
   grouped-head math, and a copy of the valid K / V bytes.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from fused_llm_dev.bench.suite import (
    Case,
    Fn,
    Provider,
    Suite,
    compile_static,
    importable,
    load_sibling,
    package_loader,
    same_bytes_copy,
    within_scale,
)

ref = load_sibling(__file__)
TOKENS = tuple(2**i for i in range(13))  # 1 .. 4096
PROJECTION_TOKENS = (1, 4, 16, 32, 64, 128, 256, 1024, 4096)

_ours, _ours_unavailable = package_loader("rope-triton", "apply_rotary_transformers")
_rms, _rms_unavailable = package_loader("rmsnorm-fp8", "rms_norm")


def _rope_bytes(case: Case) -> int:
    t = case["tokens"]
    return 2 * (ref.HQ + ref.HK) * t * ref.HEAD_DIM * 2 + 2 * t * ref.HEAD_DIM * 2


def _check_rope(out: Any, expected: Any) -> None:
    for got, want, name in zip(out, expected, ("q", "k")):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=name)


# --- rotary --------------------------------------------------------------------------------------


def make_ours(case: Case, seed: int) -> Fn:
    op = _ours().apply_rotary_transformers
    q, k, cos, sin = ref.make_rope_inputs(case["tokens"], "cuda", seed)
    return lambda: op(q, k, cos, sin)


def make_ours_inplace(case: Case, seed: int) -> Fn:
    # What an inference engine would call: fp32 rotation, half tables, in place.
    op = _ours().apply_rotary
    q, k, cos, sin = ref.make_rope_inputs(case["tokens"], "cuda", seed)
    half = ref.HEAD_DIM // 2
    c, s = cos[..., :half].contiguous(), sin[..., :half].contiguous()
    return lambda: op(q, k, c, s, inplace=True)


def make_eager(case: Case, seed: int) -> Fn:
    q, k, cos, sin = ref.make_rope_inputs(case["tokens"], "cuda", seed)
    return lambda: ref.rope_ref(q, k, cos, sin)


@functools.cache
def _compiled_rope() -> Any:
    return compile_static(ref.rope_ref)


def make_compile(case: Case, seed: int) -> Fn:
    fn = _compiled_rope()
    q, k, cos, sin = ref.make_rope_inputs(case["tokens"], "cuda", seed)
    return lambda: fn(q, k, cos, sin)


_liger_unavailable = importable("liger_kernel.ops.rope", "LigerRopeFunction")


def make_liger(case: Case, seed: int) -> Fn:
    from liger_kernel.ops.rope import LigerRopeFunction

    q, k, cos, sin = ref.make_rope_inputs(case["tokens"], "cuda", seed)
    return lambda: LigerRopeFunction.apply(q, k, cos, sin)


# --- fused projection ---------------------------------------------------------------------------


def _projection_bytes(case: Case) -> int:
    m = case["tokens"]
    n = (ref.HQ + ref.HK) * ref.HEAD_DIM
    return 2 * (n * ref.HIDDEN + m * ref.HIDDEN + m * n + 2 * m * ref.HEAD_DIM)


def _projection_flops(case: Case) -> int:
    return 2 * case["tokens"] * (ref.HQ + ref.HK) * ref.HEAD_DIM * ref.HIDDEN


_check_projection = within_scale("projection")


def make_fused(case: Case, seed: int) -> Fn:
    op = _ours().rms_norm_matmul_rope
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    return lambda: op(x, rms_w, w, ref.EPS, cos, sin, impl="fused")


def make_auto(case: Case, seed: int) -> Fn:
    op = _ours().rms_norm_matmul_rope
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    return lambda: op(x, rms_w, w, ref.EPS, cos, sin)


def _folded_inputs(case: Case, seed: int):
    """The inputs with the RMSNorm weight folded into W once, at setup (as a model would at
    load): the timed call passes rms_weight=None."""
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    return x, _ours().fold_rms_weight(w, rms_w), cos, sin


def make_fused_folded(case: Case, seed: int) -> Fn:
    op = _ours().rms_norm_matmul_rope
    x, w_folded, cos, sin = _folded_inputs(case, seed)
    return lambda: op(x, None, w_folded, ref.EPS, cos, sin, impl="fused")


def make_auto_folded(case: Case, seed: int) -> Fn:
    op = _ours().rms_norm_matmul_rope
    x, w_folded, cos, sin = _folded_inputs(case, seed)
    return lambda: op(x, None, w_folded, ref.EPS, cos, sin)


def make_unfused_ours(case: Case, seed: int) -> Fn:
    rms_norm = _rms().rms_norm
    apply_rotary = _ours().apply_rotary
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    m = case["tokens"]
    half = ref.HEAD_DIM // 2
    c, s = cos[:, :half].contiguous(), sin[:, :half].contiguous()

    def call() -> torch.Tensor:
        y = F.linear(rms_norm(x, rms_w, ref.EPS), w)  # cuBLAS
        y4 = y.view(1, m, ref.HQ + ref.HK, ref.HEAD_DIM)  # bshd: q heads, then k heads
        apply_rotary(y4[:, :, : ref.HQ], y4[:, :, ref.HQ :], c, s, layout="bshd", inplace=True)
        return y

    return call


def make_projection_eager(case: Case, seed: int) -> Fn:
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    return lambda: ref.projection_ref(x, rms_w, w, cos, sin)


@functools.cache
def _compiled_projection() -> Any:
    return compile_static(ref.projection_ref)


def make_projection_compile(case: Case, seed: int) -> Fn:
    fn = _compiled_projection()
    x, rms_w, w, cos, sin = ref.make_projection_inputs(case["tokens"], "cuda", seed)
    return lambda: fn(x, rms_w, w, cos, sin)


def _unfused_unavailable() -> str | None:
    return _ours_unavailable() or _rms_unavailable()


# --- decode attention ---------------------------------------------------------------------------

DECODE_POSITIONS = (128, 540, 2070, 4128, 8192)
DECODE_BATCHES = (1, 8)
_decode_op, _decode_unavailable = package_loader("rope-triton", "decode_attention")


def _decode_bytes(case: Case) -> int:
    """The valid K / V slots read (masked slots are not loaded), q and the output."""
    B, n = case["batch"], case["positions"]
    return 2 * B * ref.HK * n * ref.HEAD_DIM * 2 + 2 * B * ref.HQ * ref.HEAD_DIM * 2


def make_decode_ours(case: Case, seed: int) -> Fn:
    op = _decode_op().decode_attention
    q, k, v, mask = ref.make_decode_inputs(case["positions"], case["batch"], "cuda", seed)
    return lambda: op(q, k, v, mask)


def make_decode_sdpa(case: Case, seed: int) -> Fn:
    q, k, v, mask = ref.make_decode_inputs(case["positions"], case["batch"], "cuda", seed)
    return lambda: ref.decode_ref(q, k, v, mask)


def make_decode_flash_valid(case: Case, seed: int) -> Fn:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n = case["positions"]
    q, k, v, _ = ref.make_decode_inputs(n, case["batch"], "cuda", seed)
    kv, vv = k[:, :, :n], v[:, :, :n]

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, kv, vv, enable_gqa=True)

    return run


def _grouped_math(q, k, v, mask):
    B, H, _, D = q.shape
    qg = q.reshape(B, k.shape[1], H // k.shape[1], D)  # query head h = K / V head h // G, row h % G
    s = torch.einsum("bkgd,bkld->bkgl", qg.float(), k.float()) * D**-0.5
    p = s.masked_fill(~mask.view(1, 1, 1, -1), float("-inf")).softmax(-1)
    return torch.einsum("bkgl,bkld->bkgd", p, v.float()).to(q.dtype).reshape(B, H, 1, D)


@functools.cache
def _compiled_decode() -> Any:
    return compile_static(_grouped_math)


def make_decode_compile(case: Case, seed: int) -> Fn:
    fn = _compiled_decode()
    q, k, v, mask = ref.make_decode_inputs(case["positions"], case["batch"], "cuda", seed)
    return lambda: fn(q, k, v, mask)


def build_suites() -> list[Suite]:
    rope = Suite(
        name="rope-triton",
        description="transformers' apply_rotary_pos_emb, 32 q / 8 kv heads, head_dim 128, bf16, batch 1",
        cases=[Case.of(tokens=t) for t in TOKENS],
        quick_cases=[Case.of(tokens=t) for t in (1, 1024)],
        providers=[
            Provider("ours", make_ours, unavailable=_ours_unavailable, note="apply_rotary_transformers (bit-exact drop-in)"),
            Provider("ours_inplace", make_ours_inplace, unavailable=_ours_unavailable, note="apply_rotary, half tables, in place"),
            Provider("torch_eager", make_eager, note="transformers' expression"),
            Provider("torch_compile", make_compile, note="torch.compile(dynamic=False, fullgraph=True)"),
            Provider("liger", make_liger, unavailable=_liger_unavailable, note="LigerRopeFunction"),
            same_bytes_copy(_rope_bytes),
        ],
        bytes_moved=_rope_bytes,
        check=_check_rope,
        verify_case=Case.of(tokens=37),
        reference="torch_eager",
        ours="ours",
        x_param="tokens",
        group_param=None,
    )
    projection = Suite(
        name="rope-triton-projection",
        description="RMSNorm -> [W_q; W_k] (5120 x 4096) -> rotary, bf16",
        cases=[Case.of(tokens=t) for t in PROJECTION_TOKENS],
        quick_cases=[Case.of(tokens=t) for t in (1, 4096)],
        providers=[
            Provider("ours_fused", make_fused, unavailable=_ours_unavailable, note="rms_norm_matmul_rope(impl='fused'), one kernel"),
            Provider(
                "ours_auto",
                make_auto,
                unavailable=_ours_unavailable,
                note="rms_norm_matmul_rope default: fused up to 32 tokens, else rope-triton RMSNorm + cuBLAS + RoPE",
            ),
            Provider(
                "ours_fused_folded",
                make_fused_folded,
                unavailable=_ours_unavailable,
                note="impl='fused' with rms_weight=None and fold_rms_weight(w, rms_weight) as w (folded at setup)",
            ),
            Provider(
                "ours_auto_folded",
                make_auto_folded,
                unavailable=_ours_unavailable,
                note="default impl with the folded weight: fused up to 128 tokens and (Hopper) from 4096, else unfused",
            ),
            Provider(
                "unfused_ours_cublas",
                make_unfused_ours,
                unavailable=_unfused_unavailable,
                note="rmsnorm-fp8 rms_norm + F.linear (cuBLAS) + apply_rotary in place",
            ),
            Provider("torch_eager", make_projection_eager, note="transformers' sequence"),
            Provider("torch_compile", make_projection_compile, note="torch.compile(dynamic=False) of it"),
        ],
        bytes_moved=_projection_bytes,
        flops=_projection_flops,
        check=_check_projection,
        verify_case=Case.of(tokens=37),
        reference="torch_eager",
        ours="ours_fused",
        x_param="tokens",
        group_param=None,
    )
    decode = Suite(
        name="rope-triton-decode-attention",
        description="one decode token over a static cache: 32 q / 8 kv heads, head_dim 128, bf16, a boolean mask",
        cases=[Case.of(positions=n, batch=b) for b in DECODE_BATCHES for n in DECODE_POSITIONS],
        quick_cases=[Case.of(positions=n, batch=1) for n in (540, 4128)],
        providers=[
            Provider("ours", make_decode_ours, unavailable=_decode_unavailable, note="decode_attention (split-KV + combine)"),
            Provider("torch_eager", make_decode_sdpa, note="SDPA, grouped heads and the mask (cuDNN where SDPA picks it)"),
            Provider("sdpa_flash_valid", make_decode_flash_valid, note="SDPA's flash kernel on the valid slots, no mask"),
            Provider("torch_compile", make_decode_compile, note="torch.compile(dynamic=False) of the grouped-head math"),
            same_bytes_copy(_decode_bytes),
        ],
        bytes_moved=_decode_bytes,
        check=within_scale("decode attention"),
        verify_case=Case.of(positions=300, batch=2),
        reference="torch_eager",
        ours="ours",
        x_param="positions",
        group_param="batch",
    )
    return [rope, projection, decode]
