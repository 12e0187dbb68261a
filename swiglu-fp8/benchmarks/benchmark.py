"""swiglu-fp8 workloads for the Hub runner: ``kernels benchmark ./swiglu-fp8``.

This folder ships with the package, and Hub users have no ``fused_llm``, so the file is
self-contained. Its reference and fp8 comparison are also used by ``suite.py``, the peer
comparison run by ``fused-llm bench swiglu-fp8`` (CUDA graphs, L2 rotation, eager /
torch.compile / Liger). The runner here times single calls with a host clock, so its numbers
are for a quick look only.

Op: x = [gate | up] of shape [rows, 2d], bf16; y = silu(gate) * up (bf16);
q = e4m3fn(clamp(y / scale)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# Static scale of the kind a calibrated checkpoint carries (~amax / 448): with unit-normal
# gate and up, |silu(gate) * up| stays under ~9 but for a handful of elements, so q spans most
# of the e4m3 range and the clamp is rarely hit, as in a calibrated model.
SCALE = 0.02


def make_inputs(rows: int, d: int, device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, 2d] bf16 (gate, up); scale [1] float32. Random, never zeros: zeros hide
    unwritten outputs and can run faster than real data."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, 2 * d, generator=g, device=device, dtype=torch.bfloat16)
    scale = torch.tensor([SCALE], dtype=torch.float32, device=device)
    return x, scale


def poisoned_fp8(rows: int, d: int, device: torch.device | str) -> torch.Tensor:
    """An fp8 output buffer filled with NaN (0x7F in e4m3fn): an element the kernel fails to
    write shows up as NaN in the comparison."""
    return torch.full((rows, d), 0x7F, dtype=torch.uint8, device=device).view(FP8)


def quantize_fp8(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The last step of the reference, for peers that stop at the bf16 output (Liger)."""
    return (y.float() * (1 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def silu_and_mul_fp8_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference with the same roundings as the kernel: silu in fp32 rounded to
    bf16 (what F.silu does on bf16), a bf16 multiply, the quantisation multiplies by 1/scale
    in fp32. Returns q [rows, d]."""
    d = x.shape[-1] // 2
    y = F.silu(x[..., :d]) * x[..., d:]
    return quantize_fp8(y, scale)


def fp8_ulp_error(q: torch.Tensor, q_ref: torch.Tensor) -> float:
    """Largest |q - q_ref| in e4m3 ulps (at the larger magnitude of the pair); inf on NaN.

    One ulp is the honest tolerance: a one-bf16-ulp difference in y (the kernel's exp
    approximation against torch's) can move a value across an fp8 rounding boundary.
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


# On a CPU a 4096-row prefill took 1.0 s and its reference 9.5 s (2-core CI machine, 1
# iteration): CPU runs take at most 64 rows.
CPU_MAX_ROWS = 64


class SwigluFp8(Benchmark):
    """The only output is q (fp8), which the runner's ``torch.allclose`` cannot compare
    (float8 has no arithmetic). ``verify_*`` therefore checks q itself (within one e4m3 ulp,
    raising on a mismatch) and hands the runner q and the reference as float32, with the
    one-ulp rounding flips the check allowed mapped onto the reference's values."""

    seed = 0

    def _setup(self, rows: int, d: int) -> None:
        if self.device == "cpu":
            rows = min(rows, CPU_MAX_ROWS)
        self.x, self.scale = make_inputs(rows, d, self.device)
        self.q = poisoned_fp8(rows, d, self.device)

    def _run(self) -> None:
        self.kernel.silu_and_mul_fp8(self.x, self.scale, fp8_dtype=FP8, out=self.q)

    def _reference(self) -> torch.Tensor:
        q_ref = silu_and_mul_fp8_ref(self.x, self.scale)
        # The runner times one verify call (after `warmup` untimed ones) as the reference's time
        # in its Speedup column: check q on the first call only, so that time is the reference's.
        if not getattr(self, "_q_checked", False):
            try:
                check_fp8(self.q, q_ref)
            except AssertionError as exc:  # the runner reports RuntimeError cleanly
                raise RuntimeError(f"Verification failed: {exc}") from exc
            got, want = self.q.float(), q_ref.float()
            self.out = torch.where((got - want).abs() <= 1e-2 + 2.0**-3 * want.abs(), want, got)
            self._q_checked = True
        return q_ref.float()

    # decode: one token of an 8B-class model (intermediate size 14336)
    def setup_decode(self) -> None:
        self._setup(1, 14336)

    def benchmark_decode(self) -> None:
        self._run()

    def verify_decode(self) -> torch.Tensor:
        return self._reference()

    # batched decode: 128 sequences of a 70B-class model (intermediate size 28672)
    def setup_decode_batch(self) -> None:
        self._setup(128, 28672)

    def benchmark_decode_batch(self) -> None:
        self._run()

    def verify_decode_batch(self) -> torch.Tensor:
        return self._reference()

    # prefill: a 4096-token prompt of an 8B-class model
    def setup_prefill(self) -> None:
        self._setup(4096, 14336)

    def benchmark_prefill(self) -> None:
        self._run()

    def verify_prefill(self) -> torch.Tensor:
        return self._reference()
