"""rmsnorm-fp8 workloads for the Hub runner: ``kernels benchmark ./rmsnorm-fp8``.

This folder ships with the package, and Hub users have no ``fused_llm``, so the file is
self-contained. Its reference and fp8 comparison are also used by ``suite.py``, the peer
comparison run by ``fused-llm bench rmsnorm-fp8`` (CUDA graphs, L2 rotation, eager /
torch.compile / Liger). The runner here times single calls with a host clock, so its numbers
are for a quick look only.

Op: r = x + residual; y = RMSNorm(r) * weight (bf16); q = e4m3fn(clamp(y * (1 / scale))).
"""

from __future__ import annotations

import torch
from kernels.benchmark import Benchmark

EPS = 1e-6
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# Static scale of the kind a calibrated checkpoint carries (~amax / 448): with unit-normal x and
# residual and weights 1 +- 0.1, |y| stays under ~8, so q spans most of the e4m3 range (|q| up
# to ~400) and the clamp is rarely hit, as in a calibrated model.
SCALE = 0.02


def make_inputs(
    rows: int, hidden: int, device: torch.device | str, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual [rows, hidden] bf16; weight [hidden] bf16; scale [1] float32. Random, never
    zeros: zeros hide unwritten outputs and can run faster than real data."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g, device=device, dtype=torch.bfloat16)
    residual = torch.randn(rows, hidden, generator=g, device=device, dtype=torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g, device=device)).to(torch.bfloat16)
    scale = torch.tensor([SCALE], dtype=torch.float32, device=device)
    return x, residual, weight, scale


def poisoned_fp8(rows: int, hidden: int, device: torch.device | str) -> torch.Tensor:
    """An fp8 output buffer filled with NaN (0x7F in e4m3fn): an element the kernel fails to
    write shows up as NaN in the comparison."""
    return torch.full((rows, hidden), 0x7F, dtype=torch.uint8, device=device).view(FP8)


def fused_add_rms_norm_fp8_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference, with the same roundings as the kernel: the sum and the
    normalised value are rounded to bf16, the weight product is a bf16 multiply, the
    quantisation multiplies by 1/scale in fp32. Returns (q, residual_out)."""
    r = x + residual
    v = r.float()
    n = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = n * weight
    q = (y.float() * (1 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, r


def quantize_fp8(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The last step of the reference, for peers that stop at the bf16 output (Liger)."""
    return (y.float() * (1 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def fp8_ulp_error(q: torch.Tensor, q_ref: torch.Tensor) -> float:
    """Largest |q - q_ref| in e4m3 ulps (at the larger magnitude of the pair); inf on NaN.

    One ulp is the honest tolerance: a one-bf16-ulp difference in y (rsqrt approximations,
    fp32 vs bf16 weight product) can move a value across an fp8 rounding boundary.
    """
    a, b = q.float(), q_ref.float()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    magnitude = torch.maximum(a.abs(), b.abs()).clamp_min(2.0**-6)  # below 2^-6: subnormal, ulp 2^-9
    ulp = torch.exp2(torch.floor(torch.log2(magnitude)) - 3)  # 3 mantissa bits
    return float(((a - b).abs() / ulp).max())


def check_fp8(q: torch.Tensor, q_ref: torch.Tensor, what: str = "q") -> None:
    if q.shape != q_ref.shape or q.dtype != q_ref.dtype:
        raise AssertionError(f"{what}: got {q.dtype}{list(q.shape)}, expected {q_ref.dtype}{list(q_ref.shape)}")
    err = fp8_ulp_error(q, q_ref)
    if not err <= 1.0:
        raise AssertionError(f"{what}: max error {err:.3g} e4m3 ulp, expected <= 1")


def check_bf16(r: torch.Tensor, r_ref: torch.Tensor, what: str = "residual_out") -> None:
    # One bf16 add rounded once on both sides: bit-identical in practice; allow one bf16 ulp.
    torch.testing.assert_close(r, r_ref, rtol=2.0**-7, atol=1e-6, msg=lambda m: f"{what}: {m}")


class RmsnormFp8(Benchmark):
    """``self.out`` is residual_out, the bf16 output the runner's ``allclose`` can compare;
    ``verify_*`` checks q itself (within one e4m3 ulp) and raises on a mismatch. The calls are
    out of place, so every call (and the reference) sees the same inputs."""

    seed = 0

    def _setup(self, rows: int, hidden: int) -> None:
        self.x, self.residual, self.weight, self.scale = make_inputs(rows, hidden, self.device)
        self.q = poisoned_fp8(rows, hidden, self.device)

    def _run(self) -> None:
        _, self.out = self.kernel.fused_add_rms_norm_fp8(
            self.x, self.residual, self.weight, self.scale, EPS, out=self.q
        )

    def _reference(self) -> torch.Tensor:
        q_ref, r_ref = fused_add_rms_norm_fp8_ref(self.x, self.residual, self.weight, self.scale)
        # The runner times one verify call (after `warmup` untimed ones) as the reference's time
        # in its Speedup column: check q on the first call only, so that time is the reference's.
        if not getattr(self, "_q_checked", False):
            try:
                check_fp8(self.q, q_ref)
            except AssertionError as exc:  # the runner reports RuntimeError cleanly
                raise RuntimeError(f"Verification failed: {exc}") from exc
            self._q_checked = True
        return r_ref

    # decode: one token of an 8B-class model (hidden 4096)
    def setup_decode(self) -> None:
        self._setup(1, 4096)

    def benchmark_decode(self) -> None:
        self._run()

    def verify_decode(self) -> torch.Tensor:
        return self._reference()

    # batched decode: 128 sequences of a 70B-class model (hidden 8192)
    def setup_decode_batch(self) -> None:
        self._setup(128, 8192)

    def benchmark_decode_batch(self) -> None:
        self._run()

    def verify_decode_batch(self) -> torch.Tensor:
        return self._reference()

    # prefill: a 4096-token prompt of an 8B-class model
    def setup_prefill(self) -> None:
        self._setup(4096, 4096)

    def benchmark_prefill(self) -> None:
        self._run()

    def verify_prefill(self) -> torch.Tensor:
        return self._reference()
